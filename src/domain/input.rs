//! Domain newtypes parsed at the edge: a value of these types is valid.

use std::fmt;

/// Why a field was refused; the HTTP layer answers `400 INVALID_REQUEST`
/// with `message` naming `field`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct FieldError {
    pub field: &'static str,
    pub reason: &'static str,
}

impl FieldError {
    pub fn new(field: &'static str, reason: &'static str) -> Self {
        FieldError { field, reason }
    }
}

/// The white space trimmed around emails and codes (ASCII only, so that
/// the OpenAPI patterns below say exactly what is accepted).
const TRIMMED: [char; 4] = [' ', '\t', '\r', '\n'];

/// Characters of an RFC 5322 `atext` (the dot-atom's letters).
fn is_atext(c: char) -> bool {
    c.is_ascii_alphanumeric() || "!#$%&'*+/=?^_`{|}~-".contains(c)
}

/// What [`Email::parse`] accepts, as a pattern for the OpenAPI document
/// (together with a length of 3..=254 characters). Keep the two in step.
pub const EMAIL_PATTERN: &str = r"^[ \t\r\n]*[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*[ \t\r\n]*$";

/// A normalised (trimmed, lower-cased) email address: a plain ASCII
/// addr-spec of 3..=254 characters, a dot-atom before the `@` and a host
/// name (labels of at most 63) after it ([`EMAIL_PATTERN`]). The 64-byte
/// limit of RFC 5321 on the local part is not checked, because no pattern
/// without look-ahead can state it: such an address is accepted and its
/// mail becomes a dead letter. That leaves out display names (`Ceo
/// <someone@else>` would send the code elsewhere than the text shows),
/// quoted local parts, address literals, and every control, white-space or
/// invisible character (a zero-width space would make one mailbox into any
/// number of accounts).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Email(String);

impl Email {
    pub fn parse(field: &'static str, raw: &str) -> Result<Email, FieldError> {
        if !(3..=254).contains(&raw.chars().count()) {
            return Err(FieldError::new(
                field,
                "must be an email address of 3 to 254 characters",
            ));
        }
        let s = raw.trim_matches(TRIMMED);
        let Some((local, domain)) = s.split_once('@') else {
            return Err(FieldError::new(field, "must contain exactly one @"));
        };
        let dot_atom = |part: &str| {
            !part.is_empty() && part.split('.').all(|a| !a.is_empty() && a.chars().all(is_atext))
        };
        let host = |part: &str| {
            part.split('.').all(|label| {
                let b = label.as_bytes();
                (1..=63).contains(&b.len())
                    && b[0].is_ascii_alphanumeric()
                    && b[b.len() - 1].is_ascii_alphanumeric()
                    && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
            })
        };
        if !dot_atom(local) || !host(domain) {
            return Err(FieldError::new(
                field,
                "must be a plain address such as name@example.com (no display name, quotes, spaces or invisible characters)",
            ));
        }
        Ok(Email(s.to_ascii_lowercase()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Email {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Email({})", self.0)
    }
}

/// A password of 8..=128 Unicode scalar values. Never printed.
#[derive(Clone)]
pub struct Password(String);

impl Password {
    pub fn parse(field: &'static str, raw: &str) -> Result<Password, FieldError> {
        let n = raw.chars().count();
        if !(8..=128).contains(&n) {
            return Err(FieldError::new(field, "must be 8 to 128 characters"));
        }
        Ok(Password(raw.to_string()))
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Password(***)")
    }
}

/// What [`Code::parse`] accepts, as a pattern for the OpenAPI document.
pub const CODE_PATTERN: &str = r"^[ \t\r\n]*[0-9]{6}[ \t\r\n]*$";

/// A 6-digit one-time code ([`CODE_PATTERN`]). Never printed.
#[derive(Clone)]
pub struct Code(String);

impl Code {
    pub fn parse(field: &'static str, raw: &str) -> Result<Code, FieldError> {
        let s = raw.trim_matches(TRIMMED);
        if s.len() != 6 || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(FieldError::new(field, "must be 6 digits"));
        }
        Ok(Code(s.to_string()))
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Code(***)")
    }
}

/// What [`parse_name`] accepts, as a pattern for the OpenAPI document
/// (with at most 200 characters): none of [`refused_in_name`]'s characters.
pub const NAME_PATTERN: &str = concat!(
    r"^[^\x00-\x1f\x7f-\x9f\xad\u034f\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2",
    r"\u115f\u1160\u17b4\u17b5\u180e\u200b\u200e\u200f\u2028-\u202e\u2060-\u206f\u3164",
    r"\ufeff\uffa0\ufff0-\ufffb]*$"
);

/// Invisible characters beyond the controls: every format character (Cf)
/// and line or paragraph separator (Zl, Zp) of the Basic Multilingual
/// Plane, and its other default-ignorable code points (fillers such as
/// U+3164, U+115F and U+034F), per Unicode 14's UnicodeData.txt and
/// DerivedCoreProperties.txt. The zero-width joiner and non-joiner
/// (U+200C, U+200D) are left out: Persian and the Indic scripts, and emoji
/// sequences, need them.
const INVISIBLE: [(char, char); 19] = [
    ('\u{00AD}', '\u{00AD}'),
    ('\u{034F}', '\u{034F}'),
    ('\u{0600}', '\u{0605}'),
    ('\u{061C}', '\u{061C}'),
    ('\u{06DD}', '\u{06DD}'),
    ('\u{070F}', '\u{070F}'),
    ('\u{0890}', '\u{0891}'),
    ('\u{08E2}', '\u{08E2}'),
    ('\u{115F}', '\u{1160}'),
    ('\u{17B4}', '\u{17B5}'),
    ('\u{180E}', '\u{180E}'),
    ('\u{200B}', '\u{200B}'),
    ('\u{200E}', '\u{200F}'),
    ('\u{2028}', '\u{202E}'),
    ('\u{2060}', '\u{206F}'),
    ('\u{3164}', '\u{3164}'),
    ('\u{FEFF}', '\u{FEFF}'),
    ('\u{FFA0}', '\u{FFA0}'),
    ('\u{FFF0}', '\u{FFFB}'),
];

/// The characters no name may hold, display names and factor names alike:
/// control characters, and the invisible ones ([`INVISIBLE`]: format
/// characters such as the bidirectional marks, embeddings, overrides and
/// isolates, the zero-width space, the soft hyphen and the word joiner;
/// line and paragraph separators; fillers), with which a name could pass
/// for another or reorder the text shown around it. The OpenAPI document's
/// pattern states the same rule ([`NAME_PATTERN`]). Not beyond the Basic
/// Multilingual Plane: the tag characters (U+E0000 to U+E007F) pass, since
/// a JSON Schema pattern cannot name them portably and the document must
/// say what the service does (docs/security.md, 3.16).
pub fn refused_in_name(c: char) -> bool {
    c.is_control() || INVISIBLE.iter().any(|&(a, b)| (a..=b).contains(&c))
}

/// An optional display name: at most 200 characters, none that
/// [`refused_in_name`] refuses; trimmed, and empty means none.
pub fn parse_name(field: &'static str, raw: Option<&str>) -> Result<Option<String>, FieldError> {
    let Some(raw) = raw else { return Ok(None) };
    if raw.chars().count() > 200 {
        return Err(FieldError::new(field, "must be at most 200 characters"));
    }
    if raw.chars().any(refused_in_name) {
        return Err(FieldError::new(
            field,
            "must not contain control, invisible or direction-changing characters",
        ));
    }
    let s = raw.trim();
    Ok((!s.is_empty()).then(|| s.to_string()))
}

/// What [`parse_opaque`] accepts, as a pattern for the OpenAPI document.
pub const OPAQUE_PATTERN: &str = r"^[!-~]{1,512}$";

/// An opaque token as sent by a client (refresh token): non-empty, bounded, printable.
pub fn parse_opaque(field: &'static str, raw: &str) -> Result<String, FieldError> {
    if raw.is_empty() || raw.len() > 512 || !raw.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(FieldError::new(
            field,
            "must be a token as issued by this service",
        ));
    }
    Ok(raw.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emails_are_normalised() {
        assert_eq!(
            Email::parse("email", "  Alice@Example.COM ").unwrap().as_str(),
            "alice@example.com"
        );
    }

    #[test]
    fn bad_emails_are_refused() {
        for bad in [
            "",
            "ab",
            "a@",
            "@b",
            "a@b@c",
            "no-at-sign",
            "a b@c.d",
            &format!("{}@b.c", "x".repeat(260)),
            "a..b@c.d",
            ".a@b.c",
            "a.@b.c",
            "a@-b.c",
            "a@b-.c",
            "a@b..c",
            "a@b.c.",
            &format!("a@{}.c", "x".repeat(64)),
            "ü@b.c",
            "a@bücher.de",
            // A mailbox with a display name: the code would go to the attacker.
            "ceo<attacker@evil.example>",
            "CEO <attacker@evil.example>",
            "\"ceo\"@evil.example",
            "a@[127.0.0.1]",
            "a,b@c.d",
            // Invisible characters: one mailbox, many accounts.
            "vic\u{200B}tim@example.com",
            "victim@exa\u{200D}mple.com",
            "\u{FEFF}victim@example.com",
            "victim\u{202E}@example.com",
            "vic\u{00AD}tim@example.com",
            "a\u{7}b@c.d",
        ] {
            let e = Email::parse("email", bad).unwrap_err();
            assert_eq!(e.field, "email", "{bad}");
        }
        assert!(Email::parse("email", "a@b").is_ok());
        assert_eq!(Email::parse("email", " \tA@B.C\n").unwrap().as_str(), "a@b.c");
        for good in [
            "first.last+tag@example.co.uk",
            "o'brien@example.ie",
            "x_y-z@sub.example.com",
        ] {
            assert!(Email::parse("email", good).is_ok(), "{good}");
        }
    }

    #[test]
    fn password_length_counts_scalar_values() {
        assert!(Password::parse("password", "1234567").is_err());
        assert!(Password::parse("password", "12345678").is_ok());
        assert!(Password::parse("password", &"é".repeat(128)).is_ok());
        assert!(Password::parse("password", &"é".repeat(129)).is_err());
        assert_eq!(
            format!("{:?}", Password::parse("p", "hunter22").unwrap()),
            "Password(***)"
        );
    }

    #[test]
    fn codes_are_six_digits() {
        assert!(Code::parse("code", "123456").is_ok());
        for bad in ["12345", "1234567", "12345a", "", "１２３４５６"] {
            assert!(Code::parse("code", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn names_are_bounded() {
        assert_eq!(parse_name("name", Some("  ")).unwrap(), None);
        assert!(parse_name("name", Some(&"x".repeat(201))).is_err());
        assert!(parse_name("name", Some("a\u{0}b")).is_err());
    }

    #[test]
    fn names_refuse_invisible_and_direction_changing_characters() {
        for bad in [
            "admin\u{202E}nimda",
            "a\u{200B}b",
            "\u{FEFF}Ada",
            "x\u{2066}y\u{2069}",
            "a\u{200F}",
            "\u{061C}z",
            "ad\u{00AD}min",
            "a\u{2028}b",
            "\u{3164}",
            "x\u{FFF9}",
        ] {
            assert!(parse_name("name", Some(bad)).is_err(), "{bad:?}");
        }
        // Joiners that scripts and emoji need stay.
        for good in [
            "\u{0645}\u{06CC}\u{200C}\u{062E}\u{0648}\u{0627}\u{0647}\u{0645}",
            "\u{1F469}\u{200D}\u{1F4BB} Ada",
            "Zo\u{00EB}",
        ] {
            assert!(parse_name("name", Some(good)).unwrap().is_some(), "{good:?}");
        }
    }
}
