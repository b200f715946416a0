//! The hosted sign-in pages' rendering: HTML templates (`src/http/pages/`,
//! or an operator's own copies in `pages_dir`), their security headers and
//! the two cookies they set. The handlers are `oidc.rs`.
//!
//! A template fills `{{name}}` with an HTML-escaped value and `{{{name}}}`
//! with HTML the handler built from other templates; `{{t.name}}` is the
//! text `name` of the catalogue in the page's language (`i18n.rs`,
//! `catalogue.rs`), escaped, and `{{{t.name}}}` one of its texts that
//! carry markup; nothing else is interpreted. An operator overrides a page
//! by putting a file of the same name in `pages_dir` (read at start; a
//! missing file keeps the built-in one), e.g. to change the wording, the
//! layout or the style sheet.

mod catalogue;
pub mod i18n;

use std::collections::HashMap;
use std::path::Path;

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use self::i18n::{Key, Lang};

/// The built-in templates and assets, by file name.
const BUILT_IN: &[(&str, &str)] = &[
    ("layout.html", include_str!("pages/layout.html")),
    ("login.html", include_str!("pages/login.html")),
    ("mfa.html", include_str!("pages/mfa.html")),
    ("mfa_totp.html", include_str!("pages/mfa_totp.html")),
    ("mfa_passkey.html", include_str!("pages/mfa_passkey.html")),
    ("mfa_recovery.html", include_str!("pages/mfa_recovery.html")),
    ("consent.html", include_str!("pages/consent.html")),
    ("link.html", include_str!("pages/link.html")),
    ("signup.html", include_str!("pages/signup.html")),
    ("verify.html", include_str!("pages/verify.html")),
    ("reset.html", include_str!("pages/reset.html")),
    ("reset_confirm.html", include_str!("pages/reset_confirm.html")),
    ("logout.html", include_str!("pages/logout.html")),
    ("signed_out.html", include_str!("pages/signed_out.html")),
    ("error.html", include_str!("pages/error.html")),
    ("pages.css", include_str!("pages/pages.css")),
    ("pages.js", include_str!("pages/pages.js")),
];

/// The templates in use: the built-in ones, each replaced by a file of
/// the same name in the operator's folder if there is one.
#[derive(Clone, Debug)]
pub struct Pages {
    files: HashMap<&'static str, String>,
    /// Whether the cookies are `Secure` with the `__Host-` prefix (the
    /// issuer is `https://`); plain HTTP is for loopback development only.
    secure: bool,
}

impl Pages {
    pub fn load(dir: Option<&Path>, secure: bool) -> anyhow::Result<Pages> {
        let mut files = HashMap::new();
        for (name, text) in BUILT_IN {
            let own = match dir {
                Some(d) => match std::fs::read_to_string(d.join(name)) {
                    Ok(t) => Some(t),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                    Err(e) => anyhow::bail!("pages_dir: reading {}: {e}", d.join(name).display()),
                },
                None => None,
            };
            files.insert(*name, own.unwrap_or_else(|| text.to_string()));
        }
        Ok(Pages { files, secure })
    }

    fn file(&self, name: &str) -> &str {
        self.files.get(name).map(String::as_str).unwrap_or("")
    }

    /// A template with its values: `{{key}}` escaped, `{{{key}}}` as is,
    /// `{{t.key}}` in `lang`.
    pub fn fill(&self, name: &str, lang: Lang, values: &[(&str, &str)]) -> String {
        fill(self.file(name), lang, values)
    }

    /// A whole page in `lang`: `body_template` inside the layout, as
    /// `status`, with the pages' security headers; `form_targets`: the
    /// origins a form of the page may end up at (a client's redirect URI,
    /// after a 303).
    pub fn page(
        &self,
        status: StatusCode,
        lang: Lang,
        title: Key,
        body_template: &str,
        values: &[(&str, &str)],
        form_targets: &[&str],
    ) -> Response {
        let body = self.fill(body_template, lang, values);
        let html = self.fill(
            "layout.html",
            lang,
            &[("lang", lang.tag()), ("title", lang.text(title)), ("body", &body)],
        );
        let mut r = (status, html).into_response();
        let h = r.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        );
        h.insert(header::CONTENT_LANGUAGE, HeaderValue::from_static(lang.tag()));
        secure_headers(h, form_targets);
        r
    }

    /// An asset of the pages (`pages.css`, `pages.js`).
    pub fn asset(&self, name: &str, content_type: &'static str) -> Response {
        let mut r = self.file(name).to_string().into_response();
        let h = r.headers_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        h.insert(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        );
        r
    }

    /// The name of a cookie: `__Host-` prefixed when secure (RFC 6265bis
    /// §4.1.3.2: Secure, no Domain, Path=/, so no subdomain can set it).
    pub fn cookie_name(&self, base: &str) -> String {
        if self.secure {
            format!("__Host-{base}")
        } else {
            base.to_string()
        }
    }

    /// A `Set-Cookie` value: HttpOnly, SameSite=Lax, Path=/, Secure when
    /// the issuer is https; `max_age` 0 deletes it.
    pub fn set_cookie(&self, base: &str, value: &str, max_age: u64) -> HeaderValue {
        let secure = if self.secure { "; Secure" } else { "" };
        HeaderValue::from_str(&format!(
            "{}={value}; Max-Age={max_age}; Path=/; HttpOnly; SameSite=Lax{secure}",
            self.cookie_name(base)
        ))
        .expect("cookie values are base64url")
    }

    /// The value of cookie `base` in the request, if any.
    pub fn cookie(&self, headers: &HeaderMap, base: &str) -> Option<String> {
        let name = self.cookie_name(base);
        headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|kv| kv.trim().split_once('='))
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.trim().to_string())
    }
}

/// What every page says of itself: no framing (clickjacking), scripts and
/// styles of this origin only, forms to this origin (and where their
/// answer redirects to), no caching, no referrer (the pages' URLs carry the
/// pending request).
pub fn secure_headers(h: &mut HeaderMap, form_targets: &[&str]) {
    let mut form_action = String::from("'self'");
    for t in form_targets.iter().filter(|t| is_source(t)) {
        form_action.push(' ');
        form_action.push_str(t);
    }
    let csp = format!(
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; \
         form-action {form_action}; frame-ancestors 'none'; base-uri 'none'"
    );
    if let Ok(v) = HeaderValue::from_str(&csp) {
        h.insert(header::CONTENT_SECURITY_POLICY, v);
    }
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
}

/// Whether `s` can stand in a CSP source list as an origin or a scheme
/// (`https://app.example`, `com.example.app:`): nothing that could end the
/// directive or add another.
fn is_source(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b":/.-[]".contains(&b))
}

fn fill(template: &str, lang: Lang, values: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(template.len() + 256);
    let mut rest = template;
    while let Some(at) = rest.find("{{") {
        out.push_str(&rest[..at]);
        let after = &rest[at..];
        let (raw, open, close) = if after.starts_with("{{{") {
            (true, 3, "}}}")
        } else {
            (false, 2, "}}")
        };
        let Some(end) = after[open..].find(close) else {
            out.push_str(after);
            return out;
        };
        let key = after[open..open + end].trim();
        rest = &after[open + end + close.len()..];
        if let Some(name) = key.strip_prefix("t.") {
            // A text of the catalogue, its values always escaped.
            if let Some(k) = Key::named(name) {
                let text_part = |out: &mut String, s: &str| {
                    if raw {
                        out.push_str(s)
                    } else {
                        escape_into(out, s)
                    }
                };
                i18n::interpolate(&mut out, lang.text(k), values, text_part, escape_into);
            }
            continue;
        }
        let value = values.iter().find(|(k, _)| *k == key).map_or("", |(_, v)| *v);
        if raw {
            out.push_str(value);
        } else {
            escape_into(&mut out, value);
        }
    }
    out.push_str(rest);
    out
}

/// HTML escaping for text and quoted attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    escape_into(&mut out, s);
    out
}

fn escape_into(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_escaped_unless_the_template_says_otherwise() {
        let t = "<p title=\"{{a}}\">{{a}}</p>{{{b}}}{{ missing }}";
        assert_eq!(
            fill(t, Lang::En, &[("a", "<x onclick=\"y\">&'"), ("b", "<em>ok</em>")]),
            "<p title=\"&lt;x onclick=&quot;y&quot;&gt;&amp;&#39;\">&lt;x onclick=&quot;y&quot;&gt;&amp;&#39;</p><em>ok</em>"
        );
        assert_eq!(fill("{{unclosed", Lang::En, &[]), "{{unclosed");
    }

    #[test]
    fn texts_are_in_the_pages_language_and_their_values_always_escaped() {
        let t = "<p>{{{t.asks_to}}}</p><p>{{t.signed_in_as}}</p>{{t.nothing_of_that_name}}";
        let values = [("client", "<b>App</b>"), ("email", "a<b>@example.com")];
        assert_eq!(
            fill(t, Lang::De, &values),
            "<p><strong>&lt;b&gt;App&lt;/b&gt;</strong> möchte:</p><p>Sie sind als a&lt;b&gt;@example.com angemeldet.</p>"
        );
        assert_eq!(
            fill("{{t.asks_to}}", Lang::En, &values),
            "&lt;strong&gt;&lt;b&gt;App&lt;/b&gt;&lt;/strong&gt; asks to:",
            "escaped whole unless the template says otherwise"
        );
    }

    #[test]
    fn every_text_a_built_in_page_names_is_in_the_catalogue() {
        for (name, text) in BUILT_IN {
            let mut rest = *text;
            while let Some(at) = rest.find("t.") {
                let after = &rest[at + 2..];
                let end = after.find('}').unwrap_or(after.len());
                if rest[..at].ends_with("{{") || rest[..at].ends_with("{{{") {
                    assert!(Key::named(&after[..end]).is_some(), "{name}: t.{}", &after[..end]);
                }
                rest = after;
            }
        }
        let pages = Pages::load(None, false).unwrap();
        let login = pages.fill("login.html", Lang::Fr, &[("client", "App")]);
        assert!(login.contains("Mot de passe oublié ?"), "{login}");
    }

    #[test]
    fn an_operators_file_replaces_a_built_in_page() {
        let dir = std::env::temp_dir().join(format!("latchkey-pages-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("error.html"), "<p>Ours: {{message}}</p>").unwrap();
        let pages = Pages::load(Some(&dir), false).unwrap();
        assert_eq!(
            pages.fill("error.html", Lang::En, &[("message", "<b>")]),
            "<p>Ours: &lt;b&gt;</p>"
        );
        assert!(
            pages.fill("login.html", Lang::En, &[]).contains("/oauth/login"),
            "the others stay built in"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn cookies_are_host_only_and_secure_over_https() {
        let secure = Pages::load(None, true).unwrap();
        let v = secure.set_cookie("latchkey_session", "abc", 60);
        assert_eq!(
            v.to_str().unwrap(),
            "__Host-latchkey_session=abc; Max-Age=60; Path=/; HttpOnly; SameSite=Lax; Secure"
        );
        let plain = Pages::load(None, false).unwrap();
        assert_eq!(
            plain.set_cookie("latchkey_session", "abc", 0).to_str().unwrap(),
            "latchkey_session=abc; Max-Age=0; Path=/; HttpOnly; SameSite=Lax"
        );
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; __Host-latchkey_session=xyz"),
        );
        assert_eq!(secure.cookie(&h, "latchkey_session").as_deref(), Some("xyz"));
        assert_eq!(
            plain.cookie(&h, "latchkey_session"),
            None,
            "another cookie's name"
        );
    }

    #[test]
    fn a_form_target_cannot_add_to_the_policy() {
        let mut h = HeaderMap::new();
        secure_headers(
            &mut h,
            &["https://app.example", "com.example.app:", "x; script-src *"],
        );
        let csp = h[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
        assert!(
            csp.contains("form-action 'self' https://app.example com.example.app:;"),
            "{csp}"
        );
        assert!(!csp.contains("script-src *"));
        assert_eq!(h[header::X_FRAME_OPTIONS], "DENY");
    }
}
