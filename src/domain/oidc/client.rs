//! A client of the authorization code flow: its kind, where it may be sent
//! back to, what it may ask for and how its users consent. Stored as JSON
//! beside the client (`clients.oidc`), registered with `latchkey clients
//! add` or `POST /admin/clients`.

use serde::{Deserialize, Serialize};

use super::redirect;
use crate::domain::tokens::SigningAlgorithm;

/// Whether a client can keep a secret (OAuth 2.0, RFC 6749 §2.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ClientKind {
    /// A server-side application: authenticates at the token endpoint with
    /// its secret.
    Confidential,
    /// A single-page or native application: no secret, PKCE always.
    Public,
}

/// How the users of a client consent to what it asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase", tag = "mode")]
pub enum ConsentMode {
    /// Asked every time.
    Explicit,
    /// Asked once, then remembered for `days` (or until revoked at
    /// `DELETE /auth/consents/{client}`), for the scopes granted.
    Remembered { days: u32 },
    /// Never asked: a first-party application of the same operator.
    Skip,
}

/// The scopes of OpenID Connect this provider knows (Core §5.4, §11).
pub const OIDC_SCOPES: [&str; 4] = ["openid", "profile", "email", "offline_access"];

/// A client's settings for the authorization code flow.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ClientSettings {
    pub kind: ClientKind,
    /// Matched exactly (RFC 9700 §4.1.3), but for loopback ones, whose
    /// port is free (RFC 8252 §7.3).
    pub redirect_uris: Vec<String>,
    #[serde(default)]
    pub post_logout_redirect_uris: Vec<String>,
    /// `authorization_code`, `refresh_token` (and the older grants the
    /// client's scopes already allow: `client_credentials`, `password`).
    #[serde(default = "default_grants")]
    pub grant_types: Vec<String>,
    #[serde(default = "default_consent")]
    pub consent: ConsentMode,
    /// A refresh token with every code exchange, without `offline_access`
    /// (a first-party app that keeps its users signed in).
    #[serde(default)]
    pub refresh_without_offline_access: bool,
    /// The origins of browser applications that may call the token,
    /// userinfo, revocation and introspection endpoints (CORS).
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    /// Where a logout token is posted when a session of this client ends
    /// (OpenID Connect Back-Channel Logout 1.0): `http` or `https`, no
    /// fragment. Every logout token carries `sid`
    /// (`backchannel_logout_session_required` is always met).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backchannel_logout_uri: Option<String>,
    /// The algorithm of this client's id_tokens (OpenID Connect Dynamic
    /// Client Registration's name for it): `EdDSA`, `ES256` or `RS256`,
    /// one the provider signs with (`signing_algorithm` or
    /// `id_token_signing_algorithms`); unset: `signing_algorithm`'s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id_token_signed_response_alg: Option<String>,
    /// The lifetime of this client's access tokens and id_tokens, in
    /// seconds: 30 to `access_token_ttl_secs` (shorter only: keys retire
    /// by that setting); unset: that setting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_token_ttl_secs: Option<u64>,
    /// How long a session of this client lasts at most, in seconds (its
    /// refresh tokens stop working then), 60 to 31,536,000; it never
    /// outlives the browser session it came from. Unset: the browser
    /// session's end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_ttl_secs: Option<u64>,
}

fn default_grants() -> Vec<String> {
    vec!["authorization_code".into(), "refresh_token".into()]
}

fn default_consent() -> ConsentMode {
    ConsentMode::Explicit
}

impl ClientSettings {
    /// The defaults of `latchkey clients add --redirect-uri ...`.
    pub fn new(kind: ClientKind, redirect_uris: Vec<String>) -> ClientSettings {
        ClientSettings {
            kind,
            redirect_uris,
            post_logout_redirect_uris: Vec::new(),
            grant_types: default_grants(),
            consent: default_consent(),
            refresh_without_offline_access: false,
            allowed_origins: Vec::new(),
            backchannel_logout_uri: None,
            id_token_signed_response_alg: None,
            access_token_ttl_secs: None,
            session_ttl_secs: None,
        }
    }

    /// Checks what registration was given: a message naming the field.
    pub fn check(&self) -> Result<(), String> {
        if self.redirect_uris.is_empty() {
            return Err("redirect_uris: at least one".into());
        }
        for (i, u) in self.redirect_uris.iter().enumerate() {
            redirect::check_registered(u).map_err(|why| format!("redirect_uris[{i}]: {why}"))?;
        }
        for (i, u) in self.post_logout_redirect_uris.iter().enumerate() {
            redirect::check_registered(u).map_err(|why| format!("post_logout_redirect_uris[{i}]: {why}"))?;
        }
        for g in &self.grant_types {
            if !["authorization_code", "refresh_token"].contains(&g.as_str()) {
                return Err(format!(
                    "grant_types: {g:?} is not one of authorization_code, refresh_token"
                ));
            }
        }
        if !self.grant_types.iter().any(|g| g == "authorization_code") {
            return Err("grant_types: authorization_code is what these settings are for".into());
        }
        if let ConsentMode::Remembered { days } = self.consent {
            if !(1..=3650).contains(&days) {
                return Err("consent: remembered for 1 to 3650 days".into());
            }
        }
        for (i, o) in self.allowed_origins.iter().enumerate() {
            let u = url::Url::parse(o).map_err(|e| format!("allowed_origins[{i}]: not a URL: {e}"))?;
            if u.origin().ascii_serialization() != o.trim_end_matches('/') {
                return Err(format!(
                    "allowed_origins[{i}]: an origin (scheme, host and port), such as https://app.example.com"
                ));
            }
        }
        if self.access_token_ttl_secs.is_some_and(|t| t < 30) {
            return Err("access_token_ttl_secs: at least 30".into());
        }
        if self
            .session_ttl_secs
            .is_some_and(|t| !(60..=31_536_000).contains(&t))
        {
            return Err("session_ttl_secs: 60 to 31536000".into());
        }
        if let Some(alg) = &self.id_token_signed_response_alg {
            alg.parse::<SigningAlgorithm>()
                .map_err(|why| format!("id_token_signed_response_alg: {why}"))?;
        }
        if let Some(uri) = &self.backchannel_logout_uri {
            let bad = |why: &str| Err(format!("backchannel_logout_uri: {why}"));
            if uri.len() > 2048 {
                return bad("at most 2048 characters");
            }
            let u = url::Url::parse(uri).map_err(|e| format!("backchannel_logout_uri: not a URL: {e}"))?;
            match u.scheme() {
                "https" => {}
                // Back-Channel Logout 1.0 §2.2: http only for a client
                // that authenticates (a confidential one).
                "http" if self.kind == ClientKind::Confidential => {}
                "http" => return bad("https:// for a public client"),
                _ => return bad("an http:// or https:// URL"),
            }
            if u.host_str().is_none_or(str::is_empty) || !u.username().is_empty() || u.password().is_some() {
                return bad("needs a host, and no credentials");
            }
            // §2.2: no fragment.
            if u.fragment().is_some() {
                return bad("no fragment");
            }
        }
        Ok(())
    }

    /// The lifetime of this client's access tokens, if it has its own.
    pub fn access_ttl(&self) -> Option<std::time::Duration> {
        self.access_token_ttl_secs.map(std::time::Duration::from_secs)
    }

    /// The longest a session of this client lasts, if it has its own.
    pub fn session_ttl(&self) -> Option<std::time::Duration> {
        self.session_ttl_secs.map(std::time::Duration::from_secs)
    }

    /// The algorithm this client's id_tokens are signed with (`None`: the
    /// provider's main one).
    pub fn id_token_algorithm(&self) -> Option<SigningAlgorithm> {
        self.id_token_signed_response_alg
            .as_deref()
            .and_then(|a| a.parse().ok())
    }

    pub fn allows(&self, grant: &str) -> bool {
        self.grant_types.iter().any(|g| g == grant)
    }

    pub fn from_json(text: &str) -> Option<ClientSettings> {
        serde_json::from_str(text).ok()
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("settings serialize")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_round_trip_through_their_json() {
        let mut s = ClientSettings::new(ClientKind::Public, vec!["http://127.0.0.1/cb".into()]);
        s.consent = ConsentMode::Remembered { days: 30 };
        let back = ClientSettings::from_json(&s.to_json()).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn registration_names_the_field_it_refuses() {
        let ok = ClientSettings::new(
            ClientKind::Confidential,
            vec!["https://app.example.com/cb".into()],
        );
        assert_eq!(ok.check(), Ok(()));
        let mut s = ok.clone();
        s.redirect_uris = vec![];
        assert!(s.check().unwrap_err().starts_with("redirect_uris"));
        let mut s = ok.clone();
        s.redirect_uris.push("https://app.example.com/cb#x".into());
        assert!(s.check().unwrap_err().starts_with("redirect_uris[1]"));
        let mut s = ok.clone();
        s.grant_types.push("implicit".into());
        assert!(s.check().unwrap_err().contains("implicit"));
        let mut s = ok.clone();
        s.consent = ConsentMode::Remembered { days: 0 };
        assert!(s.check().unwrap_err().starts_with("consent"));
        let mut s = ok.clone();
        s.allowed_origins = vec!["https://app.example.com/path".into()];
        assert!(s.check().unwrap_err().starts_with("allowed_origins[0]"));
        let mut s = ok.clone();
        s.backchannel_logout_uri = Some("https://app.example.com/logout#x".into());
        assert!(s.check().unwrap_err().starts_with("backchannel_logout_uri"));
        let mut s = ok.clone();
        s.backchannel_logout_uri = Some("mailto:ops@example.com".into());
        assert!(s.check().unwrap_err().starts_with("backchannel_logout_uri"));
        let mut s = ok.clone();
        s.backchannel_logout_uri = Some("https://user:pw@app.example.com/logout".into());
        assert!(s.check().unwrap_err().starts_with("backchannel_logout_uri"));
        let mut s = ok.clone();
        s.kind = ClientKind::Public;
        s.backchannel_logout_uri = Some("http://app.example.com/logout".into());
        assert!(s.check().unwrap_err().contains("public"));
        let mut s = ok.clone();
        s.access_token_ttl_secs = Some(5);
        assert!(s.check().unwrap_err().starts_with("access_token_ttl_secs"));
        let mut s = ok.clone();
        s.session_ttl_secs = Some(10);
        assert!(s.check().unwrap_err().starts_with("session_ttl_secs"));
        let mut s = ok;
        s.access_token_ttl_secs = Some(60);
        s.session_ttl_secs = Some(3600);
        s.allowed_origins = vec!["https://app.example.com".into()];
        s.backchannel_logout_uri = Some("https://app.example.com/backchannel-logout".into());
        assert_eq!(s.check(), Ok(()));
    }
}
