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

/// A normalised (trimmed, lower-cased) email address: 3..=254 characters,
/// exactly one `@`, non-empty on both sides, no whitespace or control characters.
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
        let mut parts = s.split('@');
        let (local, domain) = match (parts.next(), parts.next(), parts.next()) {
            (Some(l), Some(d), None) => (l, d),
            _ => return Err(FieldError::new(field, "must contain exactly one @")),
        };
        if local.is_empty() || domain.is_empty() {
            return Err(FieldError::new(field, "must have text before and after the @"));
        }
        if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(FieldError::new(
                field,
                "must not contain spaces or control characters",
            ));
        }
        Ok(Email(s))
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
        ] {
            let e = Email::parse("email", bad).unwrap_err();
            assert_eq!(e.field, "email", "{bad}");
        }
        assert!(Email::parse("email", "a@b").is_ok());
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
