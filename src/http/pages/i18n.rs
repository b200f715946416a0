//! The languages of the hosted pages, and which one a page speaks:
//!
//! ```text
//!  the authorization request's ui_locales (kept in the sealed request
//!  through every page of its sign-in; RP-Initiated Logout's on logout)
//!      └─ none supported ──> the browser's Accept-Language (q-values)
//!                                └─ none supported ──> English
//! ```
//!
//! Both lists are untrusted: only the first [`MAX_TAGS`] entries of the
//! first [`MAX_LIST`] bytes are read, a tag longer than [`MAX_TAG`] or not
//! well formed is skipped, and nothing in them is ever an error (Core
//! §3.1.2.1: a language the provider lacks is no reason to refuse). A tag
//! matches by its primary language, case-insensitively (`de-CH` is `de`,
//! RFC 4647 §3.4 lookup). The texts are in `catalogue.rs`.

use axum::http::{header, HeaderMap};

pub use super::catalogue::Key;

/// A language of the pages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Lang {
    #[default]
    En,
    De,
    Fr,
    Es,
}

/// The most entries of a list read.
pub const MAX_TAGS: usize = 16;
/// The longest tag read (RFC 5646 §4.4.1's recommended buffer).
pub const MAX_TAG: usize = 35;
/// The most bytes of a list read.
pub const MAX_LIST: usize = 512;

impl Lang {
    /// Every language, English (the default) first.
    pub const ALL: [Lang; 4] = [Lang::En, Lang::De, Lang::Fr, Lang::Es];

    /// Its BCP 47 tag (`<html lang>`, `ui_locales_supported`).
    pub fn tag(self) -> &'static str {
        match self {
            Lang::En => "en",
            Lang::De => "de",
            Lang::Fr => "fr",
            Lang::Es => "es",
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    /// The language of a well-formed tag whose primary language is one
    /// of the pages' (any case, any subtags after it).
    pub fn of_tag(tag: &str) -> Option<Lang> {
        if tag.is_empty() || tag.len() > MAX_TAG {
            return None;
        }
        let well_formed = tag
            .split('-')
            .all(|s| (1..=8).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric()));
        if !well_formed {
            return None;
        }
        let primary = tag.split('-').next().unwrap_or("");
        Lang::ALL
            .into_iter()
            .find(|l| primary.eq_ignore_ascii_case(l.tag()))
    }

    /// The first language of `ui_locales` (space-separated tags, best
    /// first) the pages speak.
    pub fn of_ui_locales(ui_locales: &str) -> Option<Lang> {
        head(ui_locales)
            .split_ascii_whitespace()
            .take(MAX_TAGS)
            .find_map(Lang::of_tag)
    }

    /// The language of an `Accept-Language` value (RFC 9110 §12.5.4) the
    /// pages speak with the highest weight (the first of equal ones); `*`
    /// stands for English. A weight of 0 refuses a language.
    pub fn of_accept_language(value: &str) -> Option<Lang> {
        let mut best: Option<(u16, Lang)> = None;
        for item in head(value).split(',').take(MAX_TAGS) {
            let mut parts = item.split(';');
            let tag = parts.next().unwrap_or("").trim();
            let mut weight = Some(1000);
            for p in parts {
                let p = p.trim();
                if let Some(q) = p.strip_prefix("q=").or_else(|| p.strip_prefix("Q=")) {
                    weight = qvalue(q);
                }
            }
            let lang = if tag == "*" {
                Some(Lang::En)
            } else {
                Lang::of_tag(tag)
            };
            if let (Some(q), Some(l)) = (weight.filter(|q| *q > 0), lang) {
                if best.is_none_or(|(b, _)| q > b) {
                    best = Some((q, l));
                }
            }
        }
        best.map(|(_, l)| l)
    }

    /// The language the browser asks for (`Accept-Language`), else English.
    pub fn of_browser(headers: &HeaderMap) -> Lang {
        headers
            .get(header::ACCEPT_LANGUAGE)
            .and_then(|v| v.to_str().ok())
            .and_then(Lang::of_accept_language)
            .unwrap_or_default()
    }

    /// `ui_locales`' choice if it has one, else this (the browser's).
    pub fn or_asked(self, ui_locales: Option<&str>) -> Lang {
        ui_locales.and_then(Lang::of_ui_locales).unwrap_or(self)
    }

    /// The text of `key` in this language.
    pub fn text(self, key: Key) -> &'static str {
        key.texts()[self.index()]
    }

    /// The text of `key` with its `{name}`s filled from `values` (plain
    /// text: the page escapes it).
    pub fn format(self, key: Key, values: &[(&str, &str)]) -> String {
        let mut out = String::new();
        let push = |out: &mut String, s: &str| out.push_str(s);
        interpolate(&mut out, self.text(key), values, push, push);
        out
    }
}

/// At most [`MAX_LIST`] bytes of `s`, cut at a character boundary.
fn head(s: &str) -> &str {
    let mut end = s.len().min(MAX_LIST);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A qvalue (`0`, `0.5`, `1.000`) in thousandths; `None` if malformed.
fn qvalue(s: &str) -> Option<u16> {
    let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
    if !matches!(whole, "0" | "1") || frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let thousandths = format!("{frac:0<3}").parse::<u16>().ok()?;
    let q = if whole == "1" {
        1000 + thousandths
    } else {
        thousandths
    };
    (q <= 1000).then_some(q)
}

/// Writes `text` to `out`: its own parts through `text_part`, each
/// `{name}` of `values` through `value_part` (either may escape); a brace
/// that names no value is text.
pub fn interpolate(
    out: &mut String,
    text: &str,
    values: &[(&str, &str)],
    text_part: impl Fn(&mut String, &str),
    value_part: impl Fn(&mut String, &str),
) {
    let mut rest = text;
    while let Some(open) = rest.find('{') {
        let after = &rest[open + 1..];
        let value = after.find('}').and_then(|close| {
            let name = &after[..close];
            values.iter().find(|(k, _)| *k == name).map(|(_, v)| (close, *v))
        });
        match value {
            Some((close, v)) => {
                text_part(out, &rest[..open]);
                value_part(out, v);
                rest = &after[close + 1..];
            }
            None => {
                text_part(out, &rest[..=open]);
                rest = after;
            }
        }
    }
    text_part(out, rest);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_has_a_text_in_every_language() {
        for key in Key::ALL {
            for lang in Lang::ALL {
                assert!(
                    !lang.text(*key).trim().is_empty(),
                    "{} has no {} text",
                    key.name(),
                    lang.tag()
                );
            }
            assert_eq!(Key::named(key.name()), Some(*key), "{key:?}: names are unique");
        }
    }

    #[test]
    fn a_text_names_the_same_values_in_every_language() {
        let names = |t: &str| {
            let mut v: Vec<String> = t
                .split('{')
                .skip(1)
                .filter_map(|s| s.split_once('}').map(|(n, _)| n.to_string()))
                .collect();
            v.sort();
            v
        };
        for key in Key::ALL {
            let english = names(Lang::En.text(*key));
            for lang in Lang::ALL {
                assert_eq!(
                    names(lang.text(*key)),
                    english,
                    "{} in {}",
                    key.name(),
                    lang.tag()
                );
            }
            // Markup in every language or in none (the template decides
            // whether the text is escaped).
            let markup = Lang::ALL.map(|l| l.text(*key).contains('<'));
            assert!(markup.iter().all(|m| *m == markup[0]), "{}", key.name());
        }
    }

    #[test]
    fn a_tag_matches_by_its_primary_language_in_any_case() {
        for (tag, lang) in [
            ("de", Some(Lang::De)),
            ("de-CH", Some(Lang::De)),
            ("DE-ch", Some(Lang::De)),
            ("fr-CA", Some(Lang::Fr)),
            ("es-419", Some(Lang::Es)),
            ("en-GB-oxendict", Some(Lang::En)),
            ("zh-Hant-TW", None),
            ("deu", None),
            ("d", None),
            ("", None),
            ("de_CH", None),
            ("de-", None),
            ("-de", None),
            ("de--CH", None),
            ("de-toolongsubtag", None),
            ("dé", None),
            ("de;q=1", None),
            ("*", None),
        ] {
            assert_eq!(Lang::of_tag(tag), lang, "{tag:?}");
        }
        let long = format!("de-{}", "a1234567-".repeat(5));
        assert_eq!(Lang::of_tag(long.trim_end_matches('-')), None, "longer than 35");
    }

    #[test]
    fn ui_locales_takes_the_first_language_the_pages_speak() {
        for (asked, lang) in [
            ("de", Some(Lang::De)),
            ("xx-YY fr", Some(Lang::Fr)),
            ("se  es-MX de", Some(Lang::Es)),
            ("de-CH", Some(Lang::De)),
            ("se sv-SE", None),
            ("", None),
            ("<script> ; fr", Some(Lang::Fr)),
            ("\u{0}\u{202e} en", Some(Lang::En)),
        ] {
            assert_eq!(Lang::of_ui_locales(asked), lang, "{asked:?}");
        }
    }

    #[test]
    fn only_the_head_of_a_long_list_is_read() {
        let after_many = format!("{}de", "xx ".repeat(MAX_TAGS));
        assert_eq!(Lang::of_ui_locales(&after_many), None, "past the tags read");
        let within = format!("{}de", "xx ".repeat(MAX_TAGS - 1));
        assert_eq!(Lang::of_ui_locales(&within), Some(Lang::De));
        let far = format!("{}de", " ".repeat(MAX_LIST));
        assert_eq!(Lang::of_ui_locales(&far), None, "past the bytes read");
        let header = format!("{}fr", "x,".repeat(MAX_TAGS));
        assert_eq!(Lang::of_accept_language(&header), None);
        // A cut inside a character does not panic.
        let cut = format!("{}é", "a".repeat(MAX_LIST - 1));
        assert_eq!(Lang::of_ui_locales(&cut), None);
        assert_eq!(Lang::of_accept_language(&cut), None);
    }

    #[test]
    fn accept_language_is_read_by_weight() {
        for (value, lang) in [
            ("de-CH,de;q=0.9,en;q=0.8", Some(Lang::De)),
            ("en;q=0.5, fr;q=0.8", Some(Lang::Fr)),
            ("es , de", Some(Lang::Es)),
            ("ja, fr;q=0.1", Some(Lang::Fr)),
            ("fr;q=0, de;q=0.001", Some(Lang::De)),
            ("fr;q=0", None),
            ("fr;q=1.5, de;q=0.2", Some(Lang::De)),
            ("fr;q=abc, es;q=0.3", Some(Lang::Es)),
            ("fr;q=0.3333, es;q=0.1", Some(Lang::Es)),
            ("FR;Q=0.7, de;q=0.6", Some(Lang::Fr)),
            ("fr;q=1.000", Some(Lang::Fr)),
            ("ja, *;q=0.5, de;q=0.4", Some(Lang::En)),
            ("ja, zh", None),
            ("", None),
            (";;;,,,", None),
        ] {
            assert_eq!(Lang::of_accept_language(value), lang, "{value:?}");
        }
    }

    #[test]
    fn ui_locales_comes_before_the_browser_and_english_last() {
        let mut h = HeaderMap::new();
        assert_eq!(Lang::of_browser(&h), Lang::En);
        h.insert(header::ACCEPT_LANGUAGE, "es-ES,es;q=0.9".parse().unwrap());
        let browser = Lang::of_browser(&h);
        assert_eq!(browser, Lang::Es);
        assert_eq!(browser.or_asked(Some("de")), Lang::De);
        assert_eq!(browser.or_asked(Some("xx")), Lang::Es);
        assert_eq!(browser.or_asked(None), Lang::Es);
    }

    #[test]
    fn values_fill_their_names_and_nothing_else() {
        assert_eq!(
            Lang::De.format(Key::TooManyAttempts, &[("n", "30")]),
            "Zu viele Versuche: Versuchen Sie es in 30 Sekunden erneut."
        );
        let mut out = String::new();
        interpolate(
            &mut out,
            "{a} {b} {a}{ {c",
            &[("a", "<1>"), ("b", "2")],
            |o, s| o.push_str(s),
            |o, s| o.push_str(&s.replace('<', "&lt;")),
        );
        assert_eq!(out, "&lt;1> 2 &lt;1>{ {c");
        assert_eq!(qvalue("0.5"), Some(500));
        assert_eq!(qvalue("1"), Some(1000));
        assert_eq!(qvalue("1.001"), None);
        assert_eq!(qvalue("0.1234"), None);
        assert_eq!(qvalue(""), None);
        assert_eq!(qvalue("."), None);
    }
}
