//! Request paths as the gateway matches and forwards them: one normal form,
//! so that the path a route was chosen by is the path the upstream serves.
//!
//! ```text
//! raw path ──► percent-escapes checked ──refused──► 400 (encoded / \ % ; NUL or
//!                  │                                     controls, bad hex, invalid UTF-8)
//!                  ▼
//!              unreserved escapes decoded (%61 -> a, %2E -> .), others kept, hex upper-cased,
//!              raw non-ASCII escaped (one spelling for every character)
//!                  │
//!              raw `\` or NUL? ──────────────refused──► 400
//!              a segment `;x`, `.;x` or `..;x`? ─refused──► 400 (Tomcat reads it as an
//!                                                    empty or a dot segment)
//!                  │
//!              `//` collapsed, `.` and `..` resolved (RFC 3986 §5.2.4, never above `/`)
//!                  ▼
//!              normal path: forwarded upstream as it is
//!              match key:   the same without `;parameters` of each segment (what
//!                           Tomcat, Spring and Jetty route by), compared to the
//!                           route prefixes case-sensitively or not, per route
//! ```
//!
//! Encoded `%`, `;`, `/` and `\` are refused rather than kept: an upstream
//! that decodes twice, or decodes before splitting on `/` or `;`, would
//! otherwise route by a path the gateway never saw.

use std::borrow::Cow;

/// Why a path was refused (the `400` answer's message).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// `%2F`, `%5C`, `%25` or `%3B`: a separator or an escape in disguise.
    EncodedDelimiter,
    /// A `%` not followed by two hex digits.
    BadEscape,
    /// Escapes that decode to invalid UTF-8 (overlong forms such as `%C0%AE`).
    InvalidUtf8,
    /// A raw `\`, or a NUL or control character (raw or encoded).
    Forbidden,
    /// A segment of parameters only (`;x`) or a dot segment with
    /// parameters (`..;x`): Tomcat and Spring drop the parameters and read
    /// an empty or a dot segment, which would move the route.
    BareParameters,
    /// Not an origin-form path (does not start with `/`).
    NotAbsolute,
}

impl Refusal {
    pub fn message(self) -> &'static str {
        match self {
            Refusal::EncodedDelimiter => "path: encoded /, \\, % or ; is not allowed",
            Refusal::BadEscape => "path: a % must be followed by two hex digits",
            Refusal::InvalidUtf8 => "path: escapes must encode valid UTF-8",
            Refusal::Forbidden => "path: backslashes and control characters are not allowed",
            Refusal::BareParameters => {
                "path: a segment of parameters only (;x) or a dot segment with parameters (..;x) is not allowed"
            }
            Refusal::NotAbsolute => "path: must start with /",
        }
    }
}

/// A path in normal form, and the key routes are matched against.
#[derive(Debug, PartialEq, Eq)]
pub struct Normal<'a> {
    pub path: Cow<'a, str>,
    /// `path` without the `;parameters` of its segments (borrowed when it has none).
    key: Option<String>,
    /// Whether the path holds characters beyond ASCII (escaped): their case
    /// has more than one spelling (`ı`, the Kelvin sign), so routes that
    /// ignore case cannot judge it.
    pub non_ascii: bool,
}

impl Normal<'_> {
    pub fn key(&self) -> &str {
        self.key.as_deref().unwrap_or(&self.path)
    }
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// The normal form of `raw` (a request target's path, not decoded), or why not.
pub fn normalise(raw: &str) -> Result<Normal<'_>, Refusal> {
    let b = raw.as_bytes();
    if b.first() != Some(&b'/') {
        return Err(Refusal::NotAbsolute);
    }
    // The common case, a plain path, costs one scan and no allocation.
    let plain = !b
        .iter()
        .any(|&c| matches!(c, b'%' | b'\\' | b';' | b'.') || !(0x20..0x7f).contains(&c))
        && !raw.contains("//");
    if plain {
        return Ok(Normal {
            path: Cow::Borrowed(raw),
            key: None,
            non_ascii: false,
        });
    }
    let decoded = decode_unreserved(b)?;
    if decoded.iter().any(|&c| c == b'\\' || c < 0x20 || c == 0x7f) {
        return Err(Refusal::Forbidden);
    }
    let text = String::from_utf8(decoded).map_err(|_| Refusal::InvalidUtf8)?;
    let mut out: Vec<&str> = Vec::new();
    let segments: Vec<&str> = text.split('/').skip(1).collect();
    let last = segments.len().saturating_sub(1);
    let mut trailing_slash = false;
    for (i, seg) in segments.iter().enumerate() {
        let name = seg.split(';').next().unwrap_or("");
        if seg.contains(';') && matches!(name, "" | "." | "..") {
            return Err(Refusal::BareParameters);
        }
        match *seg {
            "" | "." => trailing_slash = i == last,
            ".." => {
                out.pop();
                trailing_slash = i == last;
            }
            s => {
                out.push(s);
                trailing_slash = false;
            }
        }
    }
    let mut path = String::with_capacity(raw.len());
    for s in &out {
        path.push('/');
        path.push_str(s);
    }
    if out.is_empty() || trailing_slash {
        path.push('/');
    }
    let key = path.contains(';').then(|| {
        let mut k = String::with_capacity(path.len());
        for seg in path.split('/').skip(1) {
            k.push('/');
            k.push_str(seg.split(';').next().unwrap_or(""));
        }
        k
    });
    // Escapes of bytes 0x80 and above (the only ones left above ASCII).
    let non_ascii = path.as_bytes().windows(2).any(|w| w[0] == b'%' && w[1] >= b'8');
    Ok(Normal {
        path: Cow::Owned(path),
        key,
        non_ascii,
    })
}

/// Decodes the escapes of unreserved characters; checks the others (valid
/// hex, not a delimiter in disguise, valid UTF-8 as a whole) and keeps them
/// encoded with upper-case hex.
fn decode_unreserved(b: &[u8]) -> Result<Vec<u8>, Refusal> {
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    while i < b.len() {
        if b[i] >= 0x80 {
            // Raw UTF-8 (valid: the path is a str) takes its escaped spelling.
            out.extend_from_slice(&[b'%', HEX[usize::from(b[i] >> 4)], HEX[usize::from(b[i] & 15)]]);
            i += 1;
            continue;
        }
        if b[i] != b'%' {
            out.push(b[i]);
            i += 1;
            continue;
        }
        let (Some(h), Some(l)) = (
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) else {
            return Err(Refusal::BadEscape);
        };
        let v = h * 16 + l;
        match v {
            b'/' | b'\\' | b'%' | b';' => return Err(Refusal::EncodedDelimiter),
            0..=0x1f | 0x7f => return Err(Refusal::Forbidden),
            v if unreserved(v) => out.push(v),
            v => out.extend_from_slice(&[b'%', HEX[usize::from(v >> 4)], HEX[usize::from(v & 15)]]),
        }
        i += 3;
    }
    // Escaped runs must be valid UTF-8 on their own: the upstream decodes them.
    let mut run: Vec<u8> = Vec::new();
    let mut j = 0;
    while j < out.len() {
        if out[j] == b'%' {
            run.push(hex(out[j + 1]).unwrap_or(0) * 16 + hex(out[j + 2]).unwrap_or(0));
            j += 3;
            continue;
        }
        if !run.is_empty() {
            std::str::from_utf8(&run).map_err(|_| Refusal::InvalidUtf8)?;
            run.clear();
        }
        j += 1;
    }
    if !run.is_empty() {
        std::str::from_utf8(&run).map_err(|_| Refusal::InvalidUtf8)?;
    }
    Ok(out)
}

/// Whether route prefix `prefix` serves the match key `key`: `/api` serves
/// `/api` and `/api/...` but not `/apiary`; `/api/` serves `/api/...`.
pub fn prefix_matches(prefix: &str, key: &str, case_sensitive: bool) -> bool {
    if key.len() < prefix.len() || !key.is_char_boundary(prefix.len()) {
        return false;
    }
    let (head, rest) = key.split_at(prefix.len());
    let same = if case_sensitive {
        head == prefix
    } else {
        head.eq_ignore_ascii_case(prefix)
    };
    same && (prefix.ends_with('/') || rest.is_empty() || rest.starts_with('/'))
}

/// `path` without its first `segments` segments (a route's prefix, however
/// it was spelled: case and parameters), always starting with `/`.
pub fn drop_segments(path: &str, segments: usize) -> &str {
    let mut rest = path;
    for _ in 0..segments {
        match rest[1..].find('/') {
            Some(i) => rest = &rest[i + 1..],
            None => return "/",
        }
    }
    rest
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(p: &str) -> Result<String, Refusal> {
        normalise(p).map(|n| n.path.into_owned())
    }

    fn key(p: &str) -> String {
        normalise(p).unwrap().key().to_string()
    }

    #[test]
    fn plain_paths_stay_as_they_are() {
        for p in ["/", "/api/v1/users", "/a-b_c~d/E", "/x%20y"] {
            assert_eq!(norm(p).unwrap(), p, "{p}");
        }
        assert!(matches!(normalise("/api/users").unwrap().path, Cow::Borrowed(_)));
    }

    #[test]
    fn unreserved_escapes_are_decoded_and_others_kept_upper_case() {
        assert_eq!(norm("/%61dmin/users").unwrap(), "/admin/users");
        assert_eq!(norm("/adm%69n").unwrap(), "/admin");
        assert_eq!(norm("/%7euser").unwrap(), "/~user");
        assert_eq!(norm("/a%20b%3a%40").unwrap(), "/a%20b%3A%40");
        assert_eq!(norm("/caf%c3%a9").unwrap(), "/caf%C3%A9");
    }

    #[test]
    fn slashes_collapse_and_dot_segments_resolve() {
        for (raw, want) in [
            ("//admin/users", "/admin/users"),
            ("///admin//users//", "/admin/users/"),
            ("/./admin", "/admin"),
            ("/x/../admin/users", "/admin/users"),
            ("/x/%2e%2e/admin", "/admin"),
            ("/x/.%2E/admin", "/admin"),
            ("/x/..", "/"),
            ("/x/.", "/x/"),
            ("/../../admin", "/admin"),
            ("/a/b/../../..", "/"),
            ("/.", "/"),
            ("/a/b/..", "/a/"),
            ("/a..b/c.d", "/a..b/c.d"),
        ] {
            assert_eq!(norm(raw).unwrap(), want, "{raw}");
        }
    }

    #[test]
    fn disguised_delimiters_and_odd_encodings_are_refused() {
        for (raw, why) in [
            ("/x/..%2fadmin", Refusal::EncodedDelimiter),
            ("/x%2F..%2Fadmin", Refusal::EncodedDelimiter),
            ("/x/..%5cadmin", Refusal::EncodedDelimiter),
            ("/%2561dmin", Refusal::EncodedDelimiter),
            ("/admin%3bx/users", Refusal::EncodedDelimiter),
            ("/x\\..\\admin", Refusal::Forbidden),
            ("/admin%00", Refusal::Forbidden),
            ("/admin%09", Refusal::Forbidden),
            ("/admin%7F", Refusal::Forbidden),
            ("/x/%c0%ae%c0%ae/admin", Refusal::InvalidUtf8),
            ("/%c0%afadmin", Refusal::InvalidUtf8),
            ("/%e0%80%ae", Refusal::InvalidUtf8),
            ("/%zzadmin", Refusal::BadEscape),
            ("/admin%4", Refusal::BadEscape),
            ("/x/..;/admin", Refusal::BareParameters),
            ("/x/.;a=b/admin", Refusal::BareParameters),
            ("/;/admin/users", Refusal::BareParameters),
            ("/;x/admin", Refusal::BareParameters),
            ("/a/;x", Refusal::BareParameters),
            ("admin", Refusal::NotAbsolute),
            ("", Refusal::NotAbsolute),
        ] {
            assert_eq!(norm(raw), Err(why), "{raw}");
        }
    }

    #[test]
    fn beyond_ascii_there_is_one_spelling_and_a_flag() {
        let n = normalise("/caf\u{e9}").unwrap();
        assert_eq!(n.path, "/caf%C3%A9");
        assert!(n.non_ascii);
        assert!(normalise("/adm%C4%B1n").unwrap().non_ascii);
        assert!(!normalise("/a%20b").unwrap().non_ascii);
        assert!(!normalise("/admin/users").unwrap().non_ascii);
        // No match key ever holds an empty segment in the middle.
        for p in ["/a;x/b", "//a;y//b", "/a/b;c/"] {
            assert!(!normalise(p).unwrap().key().contains("//"), "{p}");
        }
    }

    #[test]
    fn parameters_stay_in_the_path_and_leave_the_key() {
        let n = normalise("/admin;jsessionid=1/users").unwrap();
        assert_eq!(n.path, "/admin;jsessionid=1/users");
        assert_eq!(n.key(), "/admin/users");
        assert_eq!(key("/a;x/b;y/"), "/a/b/");
        assert_eq!(key("/plain"), "/plain");
    }

    #[test]
    fn prefixes_match_whole_segments_with_the_routes_case_rule() {
        assert!(prefix_matches("/api", "/api", true));
        assert!(prefix_matches("/api", "/api/x", true));
        assert!(!prefix_matches("/api", "/apiary", true));
        assert!(prefix_matches("/api/", "/api/x", true));
        assert!(!prefix_matches("/api/", "/api", true));
        assert!(!prefix_matches("/admin", "/ADMIN/users", true));
        assert!(prefix_matches("/admin", "/ADMIN/users", false));
        assert!(prefix_matches("/", "/anything", true));
        assert!(!prefix_matches("/é", "/e", false));
    }

    #[test]
    fn prefixes_are_dropped_by_segments() {
        assert_eq!(drop_segments("/API;v=1/users?", 1), "/users?");
        assert_eq!(drop_segments("/api", 1), "/");
        assert_eq!(drop_segments("/a/b/c", 2), "/c");
        assert_eq!(drop_segments("/a/b/c", 0), "/a/b/c");
    }
}
