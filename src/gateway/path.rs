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
//!                           route prefixes per route ([`PrefixRule`]): protected
//!                           ones in any case (`case_key`) and with format suffixes
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
    Ok(Normal {
        path: Cow::Owned(path),
        key,
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

/// How a route's prefix is compared with a path's match key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefixRule {
    /// Only in the prefix's own case; otherwise in any ASCII case, and
    /// with [`CASE_TO_ASCII`]'s characters read as their ASCII letters (the
    /// key must then be [`case_key`]'s).
    pub case_sensitive: bool,
    /// Every spelling an upstream may serve as the prefix matches too (a
    /// protected route's default): a format suffix on its last segment
    /// (`/admin.json` for `/admin`: Rails routes `(.:format)` and Spring's
    /// suffix pattern matching serve it as `/admin`), and the prefix
    /// without its trailing slash (`/admin` for `/admin/`: routers mount
    /// `/admin/` at `/admin`).
    pub fail_closed: bool,
}

/// Whether route prefix `prefix` serves the match key `key`: `/api` serves
/// `/api` and `/api/...` but not `/apiary` (nor `/api.json` unless the rule
/// fails closed); `/api/` serves `/api/...` (and `/api`, failing closed).
pub fn prefix_matches(prefix: &str, key: &str, rule: PrefixRule) -> bool {
    if rule.fail_closed && prefix.len() > 1 {
        if let Some(bare) = prefix.strip_suffix('/') {
            return prefix_matches(bare, key, rule);
        }
    }
    if key.len() < prefix.len() || !key.is_char_boundary(prefix.len()) {
        return false;
    }
    let (head, rest) = key.split_at(prefix.len());
    let same = if rule.case_sensitive {
        head == prefix
    } else {
        head.eq_ignore_ascii_case(prefix)
    };
    same && (prefix.ends_with('/')
        || rest.is_empty()
        || rest.starts_with('/')
        || (rule.fail_closed && rest.starts_with('.') && prefix != "/"))
}

/// The characters beyond ASCII that some case mapping turns into ASCII
/// letters, with those letters: every code point whose lower, upper, title
/// or case-folded form (simple or full, Unicode 14: Python 3.11's
/// `str.lower`, `upper`, `title` and `casefold` over all code points) holds
/// ASCII letters. An upstream that compares paths without regard to case
/// (Java's `equalsIgnoreCase` takes `admın`, with a dotless ı, for `admin`;
/// .NET and ICU fold `ſ` to `s` and the Kelvin sign to `k`; full case
/// folding turns `ß` into `ss` and `ﬁ` into `fi`) may read them as those
/// letters, so a route that ignores case reads them so too.
pub const CASE_TO_ASCII: [(char, &str); 20] = [
    ('\u{df}', "ss"),
    ('\u{130}', "i"),
    ('\u{131}', "i"),
    ('\u{149}', "n"),
    ('\u{17f}', "s"),
    ('\u{1f0}', "j"),
    ('\u{1e96}', "h"),
    ('\u{1e97}', "t"),
    ('\u{1e98}', "w"),
    ('\u{1e99}', "y"),
    ('\u{1e9a}', "a"),
    ('\u{1e9e}', "ss"),
    ('\u{212a}', "k"),
    ('\u{fb00}', "ff"),
    ('\u{fb01}', "fi"),
    ('\u{fb02}', "fl"),
    ('\u{fb03}', "ffi"),
    ('\u{fb04}', "ffl"),
    ('\u{fb05}', "st"),
    ('\u{fb06}', "st"),
];

/// The match key as routes that ignore case compare it: escaped
/// characters of [`CASE_TO_ASCII`] replaced by their ASCII letters (other
/// escapes kept; they cannot match an ASCII prefix). Borrowed when the key
/// holds no escape beyond ASCII.
pub fn case_key(key: &str) -> Cow<'_, str> {
    if !key.as_bytes().windows(2).any(|w| w[0] == b'%' && w[1] >= b'8') {
        return Cow::Borrowed(key);
    }
    let b = key.as_bytes();
    let mut out = String::with_capacity(key.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'%' {
            out.push(char::from(b[i]));
            i += 1;
            continue;
        }
        // A run of escapes: decode one UTF-8 character at a time (the
        // normal form guarantees valid hex and valid UTF-8).
        let start = i;
        let mut bytes = Vec::with_capacity(4);
        while i + 2 < b.len() && b[i] == b'%' {
            bytes.push(hex(b[i + 1]).unwrap_or(0) * 16 + hex(b[i + 2]).unwrap_or(0));
            i += 3;
            if std::str::from_utf8(&bytes).is_ok() {
                break;
            }
        }
        match std::str::from_utf8(&bytes).ok().and_then(|s| s.chars().next()) {
            Some(c) => match CASE_TO_ASCII.iter().find(|(k, _)| *k == c) {
                Some((_, ascii)) => out.push_str(ascii),
                None => out.push_str(&key[start..i]),
            },
            None => out.push_str(&key[start..i]),
        }
    }
    Cow::Owned(out)
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
    fn beyond_ascii_there_is_one_spelling() {
        assert_eq!(norm("/caf\u{e9}").unwrap(), "/caf%C3%A9");
        assert_eq!(norm("/caf%c3%a9").unwrap(), "/caf%C3%A9");
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

    const EXACT: PrefixRule = PrefixRule {
        case_sensitive: true,
        fail_closed: false,
    };
    const PROTECTED: PrefixRule = PrefixRule {
        case_sensitive: false,
        fail_closed: true,
    };

    #[test]
    fn prefixes_match_whole_segments_with_the_routes_case_rule() {
        assert!(prefix_matches("/api", "/api", EXACT));
        assert!(prefix_matches("/api", "/api/x", EXACT));
        assert!(!prefix_matches("/api", "/apiary", EXACT));
        assert!(prefix_matches("/api/", "/api/x", EXACT));
        assert!(!prefix_matches("/api/", "/api", EXACT));
        assert!(!prefix_matches("/admin", "/ADMIN/users", EXACT));
        assert!(prefix_matches("/admin", "/ADMIN/users", PROTECTED));
        assert!(prefix_matches("/", "/anything", EXACT));
        assert!(!prefix_matches("/é", "/e", PROTECTED));
    }

    #[test]
    fn a_format_suffix_matches_only_where_the_rule_takes_it() {
        assert!(!prefix_matches("/admin", "/admin.json", EXACT));
        assert!(prefix_matches("/admin", "/admin.json", PROTECTED));
        assert!(prefix_matches("/admin", "/Admin.XML", PROTECTED));
        assert!(prefix_matches("/api/users", "/api/users.json", PROTECTED));
        assert!(!prefix_matches("/admin", "/adminx.json", PROTECTED));
    }

    #[test]
    fn a_protected_prefix_with_a_trailing_slash_also_serves_its_bare_spellings() {
        for key in [
            "/api/admin",
            "/API/ADMIN",
            "/api/admin.json",
            "/api/admin/",
            "/api/admin/users",
        ] {
            assert!(prefix_matches("/api/admin/", key, PROTECTED), "{key}");
        }
        assert!(!prefix_matches("/api/admin/", "/api/administrator", PROTECTED));
        assert!(!prefix_matches("/api/admin/", "/api/admin", EXACT));
        assert!(prefix_matches("/", "/anything", PROTECTED));
    }

    #[test]
    fn characters_that_case_into_ascii_letters_match_those_letters() {
        let admin = |p: &str| prefix_matches("/admin", &case_key(&key(p)), PROTECTED);
        assert!(admin("/adm%C4%B1n/users"), "dotless i");
        assert!(admin("/adm\u{131}n"), "dotless i, raw");
        assert!(admin("/ADM%C4%B0N"), "capital I with a dot");
        assert!(!prefix_matches("/admin", &key("/adm%C4%B1n"), EXACT));
        assert!(prefix_matches(
            "/keys",
            &case_key(&key("/%E2%84%AAeys")),
            PROTECTED
        ));
        assert!(prefix_matches("/class", &case_key(&key("/cla%C3%9F")), PROTECTED));
        assert!(prefix_matches(
            "/profile",
            &case_key(&key("/pro%EF%AC%81le")),
            PROTECTED
        ));
        // Other characters keep their escapes, and a plain key is borrowed.
        assert_eq!(case_key(&key("/caf%C3%A9/%C4%B1")), "/caf%C3%A9/i");
        assert!(matches!(case_key("/admin/x"), Cow::Borrowed(_)));
        assert!(!prefix_matches(
            "/admin",
            &case_key(&key("/adm%C3%AFn")),
            PROTECTED
        ));
    }

    #[test]
    fn the_case_table_is_every_character_that_cases_into_ascii() {
        // The table against the standard library's own case mappings (Rust's
        // char::to_lowercase/to_uppercase, full mappings), applied once or
        // one after the other (Rust has no case folding; `ẞ` folds to `ss`
        // through `ß`): each entry maps so, and no other character beyond
        // ASCII in the planes that hold letters does.
        let ascii_letters = |s: String| -> String {
            s.chars()
                .filter(|c| c.is_ascii_alphabetic())
                .collect::<String>()
                .to_ascii_lowercase()
        };
        let lower = |s: &str| s.chars().flat_map(char::to_lowercase).collect::<String>();
        let upper = |s: &str| s.chars().flat_map(char::to_uppercase).collect::<String>();
        for c in (0x80u32..0x3_0000).filter_map(char::from_u32) {
            let c1 = c.to_string();
            let images: Vec<String> = [lower(&c1), upper(&c1), upper(&lower(&c1)), lower(&upper(&c1))]
                .into_iter()
                .map(ascii_letters)
                .filter(|a| !a.is_empty())
                .collect();
            let listed = CASE_TO_ASCII.iter().find(|(k, _)| *k == c);
            match listed {
                None => assert!(
                    images.is_empty(),
                    "{c:?} ({:04X}) cases into {images:?}",
                    c as u32
                ),
                Some((_, ascii)) => {
                    assert!(images.iter().any(|i| i == ascii), "{c:?}: {ascii} vs {images:?}")
                }
            }
        }
    }
}
