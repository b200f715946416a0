//! Extractors: the JSON body (errors name the field), the client IP (proxy
//! headers only from trusted proxies) and the bearer token (the
//! authentication boundary: a handler taking `Bearer` cannot run without a
//! valid token).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{ConnectInfo, FromRequest, FromRequestParts, Request};
use axum::http::{header, request::Parts};
use serde::de::DeserializeOwned;

use super::error::ApiError;
use super::AppState;
use crate::domain::input::FieldError;
use crate::domain::tokens::{bearer_token, Verified};
use crate::domain::AuthError;

/// A JSON body deserialised into `T`; any failure is `400 INVALID_REQUEST`
/// naming the field, or `413` past the body limit.
pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::TooLarge
            } else {
                FieldError::new("body", "could not be read").into()
            }
        })?;
        parse_json(&bytes).map(JsonBody)
    }
}

pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(invalid("body", "a JSON object is required".into()));
    }
    // serde would also accept a struct written as an array: only objects are bodies.
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        if serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_err() {
            return Err(invalid("body", "malformed JSON".into()));
        }
        return Err(invalid("body", "must be a JSON object".into()));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            return invalid("body", format!("malformed JSON ({inner})"));
        }
        let text = inner.to_string();
        let text = text.split(" at line ").next().unwrap_or(&text).to_string();
        if let Some(field) = text
            .strip_prefix("missing field `")
            .and_then(|r| r.split('`').next())
        {
            return invalid_owned(field.to_string(), "is required".into());
        }
        if path == "." || path.is_empty() {
            invalid("body", format!("must be a JSON object ({text})"))
        } else {
            invalid_owned(path, text)
        }
    })?;
    de.end()
        .map_err(|_| invalid("body", "trailing characters after the JSON value".into()))?;
    Ok(value)
}

fn invalid(field: &'static str, reason: String) -> ApiError {
    invalid_owned(field.to_string(), reason)
}

/// A `400` whose message is `<field>: <reason>`.
fn invalid_owned(field: String, reason: String) -> ApiError {
    ApiError::Auth(AuthError::BadRequest(format!("{field}: {reason}")))
}

/// The client's address: the socket peer, or, when the peer is a trusted
/// proxy, the right-most address in `X-Forwarded-For` / `Forwarded` that is
/// not itself a trusted proxy.
pub struct ClientIp(pub IpAddr);

impl FromRequestParts<AppState> for ClientIp {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let peer = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| c.0.ip())
            .unwrap_or(IpAddr::from([127, 0, 0, 1]));
        Ok(ClientIp(client_ip(
            peer,
            &parts.headers,
            &state.config.trusted_proxies,
        )))
    }
}

pub fn client_ip(peer: IpAddr, headers: &axum::http::HeaderMap, trusted: &[IpAddr]) -> IpAddr {
    if !trusted.contains(&peer) {
        return peer;
    }
    let mut hops: Vec<IpAddr> = Vec::new();
    for v in headers.get_all("forwarded") {
        for part in v.to_str().unwrap_or("").split([',', ';']) {
            let part = part.trim();
            if let Some(f) = part.strip_prefix("for=").or_else(|| part.strip_prefix("For=")) {
                let f = f.trim_matches('"');
                let f = f
                    .strip_prefix('[')
                    .map(|r| r.split(']').next().unwrap_or(r))
                    .unwrap_or(f);
                let f = if f.matches(':').count() == 1 {
                    f.split(':').next().unwrap_or(f)
                } else {
                    f
                };
                if let Ok(ip) = f.parse() {
                    hops.push(ip);
                }
            }
        }
    }
    if hops.is_empty() {
        for v in headers.get_all("x-forwarded-for") {
            for f in v.to_str().unwrap_or("").split(',') {
                if let Ok(ip) = f.trim().parse() {
                    hops.push(ip);
                }
            }
        }
    }
    hops.into_iter()
        .rev()
        .find(|ip| !trusted.contains(ip))
        .unwrap_or(peer)
}

/// A verified access token from `Authorization`.
pub struct Bearer(pub Arc<Verified>);

impl FromRequestParts<AppState> for Bearer {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let token = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token)
            .ok_or(ApiError::Auth(AuthError::InvalidToken))?;
        state
            .tokens
            .validate(token)
            .await
            .map(Bearer)
            .map_err(|_| ApiError::Auth(AuthError::InvalidToken))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderMap;

    #[test]
    fn proxy_headers_only_from_trusted_peers() {
        let proxy: IpAddr = "10.0.0.1".parse().unwrap();
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", "203.0.113.9, 10.0.0.1".parse().unwrap());
        let stranger: IpAddr = "198.51.100.7".parse().unwrap();
        assert_eq!(client_ip(stranger, &h, &[proxy]), stranger);
        assert_eq!(
            client_ip(proxy, &h, &[proxy]),
            "203.0.113.9".parse::<IpAddr>().unwrap()
        );
        let mut f = HeaderMap::new();
        f.insert(
            "forwarded",
            "for=\"[2001:db8::1]:4711\";proto=https".parse().unwrap(),
        );
        assert_eq!(
            client_ip(proxy, &f, &[proxy]),
            "2001:db8::1".parse::<IpAddr>().unwrap()
        );
        f.insert("forwarded", "for=192.0.2.60:8080".parse().unwrap());
        assert_eq!(
            client_ip(proxy, &f, &[proxy]),
            "192.0.2.60".parse::<IpAddr>().unwrap()
        );
    }

    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct Login {
        email: String,
        password: String,
    }

    fn message(r: Result<Login, ApiError>) -> String {
        match r {
            Err(ApiError::Auth(AuthError::BadRequest(m))) => m,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn json_errors_name_the_field() {
        assert!(message(parse_json(br#"{"email":"a@b"}"#)).starts_with("password: "));
        assert!(message(parse_json(br#"{"email":5,"password":"x"}"#)).starts_with("email: "));
        assert!(message(parse_json(br#"{"email":"#)).starts_with("body: malformed"));
        assert!(message(parse_json(b"[1]")).starts_with("body: "));
        assert!(message(parse_json(b"")).starts_with("body: "));
        assert!(parse_json::<Login>(br#"{"email":"a","password":"b","extra":1}"#).is_ok());
    }
}
