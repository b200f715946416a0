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

/// A normalised (trimmed, lower-cased) email address: a plain RFC 5321
/// addr-spec of 3..=254 characters, as lettre's `Address` parses it, with no
/// display name (`Ceo <someone@else>` would send the code elsewhere than the
/// text shows), no quoted local part, no address literal, and no control,
/// white-space or invisible characters (a zero-width space would make one
/// mailbox into any number of accounts).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Email(String);

impl Email {
    pub fn parse(field: &'static str, raw: &str) -> Result<Email, FieldError> {
        let s = raw.trim().to_lowercase();
        let n = s.chars().count();
        if !(3..=254).contains(&n) {
            return Err(FieldError::new(
                field,
                "must be an email address of 3 to 254 characters",
            ));
        }
        if s.chars()
            .any(|c| c.is_whitespace() || c.is_control() || is_invisible(c))
        {
            return Err(FieldError::new(
                field,
                "must not contain spaces, control or invisible characters",
            ));
        }
        let mut parts = s.split('@');
        let (local, domain) = match (parts.next(), parts.next(), parts.next()) {
            (Some(l), Some(d), None) => (l, d),
            _ => return Err(FieldError::new(field, "must contain exactly one @")),
        };
        if local.is_empty() || domain.is_empty() {
            return Err(FieldError::new(field, "must have text before and after the @"));
        }
        if local.len() > 64 {
            return Err(FieldError::new(
                field,
                "the part before the @ must be at most 64 bytes",
            ));
        }
        if s.contains(['"', '[', ']', '<', '>', '(', ')', ',', ';', ':', '\\'])
            || s.parse::<lettre::Address>().is_err()
        {
            return Err(FieldError::new(
                field,
                "must be a plain address such as name@example.com",
            ));
        }
        Ok(Email(s))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Characters that render as nothing (Unicode's default-ignorable code
/// points: zero-width spaces and joiners, bidirectional controls, the soft
/// hyphen, variation selectors, tags, fillers).
fn is_invisible(c: char) -> bool {
    matches!(c,
        '\u{00AD}' | '\u{034F}' | '\u{061C}' | '\u{115F}' | '\u{1160}' | '\u{17B4}' | '\u{17B5}'
        | '\u{180B}'..='\u{180F}' | '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}'
        | '\u{2060}'..='\u{206F}' | '\u{3164}' | '\u{FE00}'..='\u{FE0F}' | '\u{FEFF}' | '\u{FFA0}'
        | '\u{FFF0}'..='\u{FFF8}' | '\u{1BCA0}'..='\u{1BCA3}' | '\u{1D173}'..='\u{1D17A}'
        | '\u{E0000}'..='\u{E0FFF}')
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

/// A 6-digit one-time code. Never printed.
#[derive(Clone)]
pub struct Code(String);

impl Code {
    pub fn parse(field: &'static str, raw: &str) -> Result<Code, FieldError> {
        let s = raw.trim();
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

/// An optional display name: at most 200 characters, no control characters.
pub fn parse_name(field: &'static str, raw: Option<&str>) -> Result<Option<String>, FieldError> {
    match raw.map(str::trim) {
        None | Some("") => Ok(None),
        Some(s) if s.chars().count() > 200 => Err(FieldError::new(field, "must be at most 200 characters")),
        Some(s) if s.chars().any(char::is_control) => {
            Err(FieldError::new(field, "must not contain control characters"))
        }
        Some(s) => Ok(Some(s.to_string())),
    }
}

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
            &format!("{}@b.c", "x".repeat(65)),
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
}
