//! Webhooks: audit events delivered to other services, signed per the
//! Standard Webhooks specification so that its verifier libraries work.
//!
//! ```text
//!  change + event + one delivery row per webhook that asks  (one transaction)
//!        |
//!  DeliveryWorker: claim due rows with a lease (a batch of 20)
//!        each in turn: read it (webhook, event, signed request), then
//!        take it if the claim is still ours (the lease restarts, the
//!        attempt is counted) --> POST url, signed
//!        2xx: delivered (kept as history)
//!        else: attempts < max ? retry at base * 2^(attempts-1) (at most 1 h)
//!                             : dead (kept, counted)
//!        (recorded only if the claim is still ours)
//! ```
//!
//! At-least-once: a crash between the POST and the bookkeeping sends the
//! event again after the lease (30 s). An instance whose claim on a
//! delivery ran out, and that another instance took, neither sends nor
//! records it. A delivery is read before it is taken, so only its POST
//! (cut at 10 s) and the write of its outcome run on its lease: it goes out
//! twice only if that write, or the take itself, is held up by the database
//! for about 20 s, or if the instances' clocks are that far apart.
//! `webhook-id` (`msg_<event id>`) is the same on every attempt, for the
//! receiver to drop duplicates. Headers:
//! `webhook-id`, `webhook-timestamp` (Unix seconds of the attempt),
//! `webhook-signature` (`v1,` and the base64 HMAC-SHA256, under the secret's
//! bytes, of `id.timestamp.body`). The body is
//! `{"type": kind, "timestamp": RFC 3339, "data": {the event}}`.
//!
//! A client's back-channel logout URI is a webhook of its own
//! (`client_id` set), queued when a session of that client ends: its
//! delivery is OpenID Connect Back-Channel Logout 1.0's request instead, a
//! form post of `logout_token`, a JWT signed by the token issuer
//! ([`LogoutTokens`]) and made at each attempt, with the same queue,
//! retries, address rule and history.

use std::sync::Arc;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::clock::{now_ms, rfc3339};
use crate::crypto::{random_bytes, Sealer};
use crate::lifecycle::Shutdown;
use crate::settings::{millis, number, ConfigError, Source};
use crate::store::{Attempted, ClientRecord, DeliveryRow, EventRecord, Store, StoreResult};

/// How long a claim on a delivery lasts once the delivery is taken for its
/// attempt: the POST (`TIMEOUT`) and the write of its outcome, with 20 s to
/// spare. A delivery claimed by an instance that died goes out from
/// another once it runs out.
const LEASE_MS: i64 = 30_000;
const BATCH: i64 = 20;
const POLL: Duration = Duration::from_secs(1);
const TIMEOUT: Duration = Duration::from_secs(10);
const MAX_BACKOFF_MS: i64 = 3_600_000;
/// The associated data of a sealed webhook secret.
pub const AAD: &[u8] = b"latchkey/webhook";

/// Retries of webhook deliveries, and where they may go.
#[derive(Clone, Debug)]
pub struct WebhookSettings {
    /// The wait before the first retry; each next one doubles (to an hour).
    pub retry_base: Duration,
    /// Attempts before a delivery is given up (dead).
    pub max_attempts: i32,
    /// Whether receivers may be at loopback, private, link-local and other
    /// non-public addresses (off by default: see [`is_public`]).
    pub allow_private: bool,
}

impl WebhookSettings {
    pub fn read(src: &impl Source) -> Result<WebhookSettings, ConfigError> {
        Ok(WebhookSettings {
            retry_base: src.get(
                "webhook_retry_base_ms",
                Duration::from_secs(5),
                millis(100, 600_000),
            )?,
            max_attempts: src.get("webhook_max_attempts", 12, number(1, 30))?,
            allow_private: src.get("webhook_allow_private_addresses", false, crate::settings::switch)?,
        })
    }
}

mod addresses;

/// Whether `ip` is an address of the public internet. Webhook receivers
/// must be (unless `webhook_allow_private_addresses` is set): otherwise
/// whoever may register one could make the service call its own loopback
/// listeners, the cloud's metadata address or the private network, and
/// read the status each answered in the delivery history. Decided from
/// IANA's special-purpose registries as a whole (`webhooks/addresses.rs`).
pub use addresses::is_public;

/// The refusal of a receiver's host that is a non-public address, or a
/// name that can only be one (`localhost`): checked when a webhook is
/// registered, and again before each delivery (names are checked on every
/// resolution, by the worker's resolver, so DNS cannot swap in an address
/// after registration).
pub fn refuse_private_host(url: &url::Url, allow_private: bool) -> Result<(), String> {
    if allow_private {
        return Ok(());
    }
    let private = match url.host() {
        Some(url::Host::Ipv4(ip)) => !is_public(ip.into()),
        Some(url::Host::Ipv6(ip)) => !is_public(ip.into()),
        Some(url::Host::Domain(d)) => {
            let d = d.trim_end_matches('.').to_ascii_lowercase();
            d == "localhost" || d.ends_with(".localhost")
        }
        None => true,
    };
    if private {
        Err(
            "the receiver's address is not a public one (set webhook_allow_private_addresses to allow it)"
                .into(),
        )
    } else {
        Ok(())
    }
}

/// Resolves receivers' names to their public addresses only (all of them,
/// when private ones are allowed); a name with none fails to connect.
#[derive(Clone)]
struct PublicResolver {
    inner: hyper_util::client::legacy::connect::dns::GaiResolver,
    allow_private: bool,
}

impl tower::Service<hyper_util::client::legacy::connect::dns::Name> for PublicResolver {
    type Response = std::vec::IntoIter<std::net::SocketAddr>;
    type Error = std::io::Error;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, name: hyper_util::client::legacy::connect::dns::Name) -> Self::Future {
        let allow_private = self.allow_private;
        let resolving = self.inner.call(name.clone());
        Box::pin(async move {
            let addrs: Vec<std::net::SocketAddr> = resolving
                .await?
                .filter(|a| allow_private || is_public(a.ip()))
                .collect();
            if addrs.is_empty() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    format!("{} has no public address", name.as_str()),
                ));
            }
            Ok(addrs.into_iter())
        })
    }
}

/// A new signing secret, as Standard Webhooks writes it: `whsec_` and the
/// base64 of 32 random bytes.
pub fn new_secret() -> String {
    format!("whsec_{}", STANDARD.encode(random_bytes::<32>()))
}

pub fn seal_secret(secret: &str, sealer: &Sealer) -> Vec<u8> {
    sealer.seal(secret.as_bytes(), AAD)
}

pub fn open_secret(sealed: &[u8], sealer: &Sealer) -> Option<String> {
    String::from_utf8(sealer.open(sealed, AAD)?).ok()
}

/// Whether a sealed webhook secret opens under `sealer` (an import's
/// check that it comes from a deployment with the same master secret).
pub fn secret_opens(sealed: &[u8], sealer: &Sealer) -> bool {
    open_secret(sealed, sealer).is_some()
}

/// `v1,` and the base64 HMAC-SHA256 of `id.timestamp.body` under the
/// secret's bytes (the base64 after `whsec_`).
pub fn signature(secret: &str, id: &str, timestamp: i64, body: &[u8]) -> Option<String> {
    let key = STANDARD
        .decode(secret.strip_prefix("whsec_").unwrap_or(secret))
        .ok()?;
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &key);
    let mut ctx = ring::hmac::Context::with_key(&key);
    ctx.update(id.as_bytes());
    ctx.update(b".");
    ctx.update(timestamp.to_string().as_bytes());
    ctx.update(b".");
    ctx.update(body);
    Some(format!("v1,{}", STANDARD.encode(ctx.sign().as_ref())))
}

/// The body of an event's delivery.
pub fn payload(e: &EventRecord) -> Vec<u8> {
    let body = serde_json::json!({
        "type": e.kind,
        "timestamp": rfc3339(e.at),
        "data": {
            "id": e.id,
            "kind": e.kind,
            "at_ms": e.at,
            "user_id": e.user_id,
            "session_id": e.session_id,
            "actor": e.actor,
            "ip": e.ip,
            "reason": e.reason,
        },
    });
    serde_json::to_vec(&body).expect("an event serialises")
}

type HttpsClient = Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector<PublicResolver>>,
    Full<Bytes>,
>;

type Request = hyper::Request<Full<Bytes>>;

/// Signs the logout tokens of back-channel logout: what the domain (the
/// clients, whose settings say which algorithm their tokens are in) gives
/// the delivery worker, which cannot sign itself.
pub trait LogoutTokens: Send + Sync {
    /// A logout token for `client`: session `sid` of user `sub` ended.
    fn logout_token(&self, client: &ClientRecord, sub: &str, sid: &str) -> anyhow::Result<String>;
}

pub struct DeliveryWorker {
    store: Store,
    sealer: Arc<Sealer>,
    settings: WebhookSettings,
    client: HttpsClient,
    logout: Arc<dyn LogoutTokens>,
}

/// What one attempt came to.
enum Attempt {
    Delivered(u16),
    Failed { status: Option<u16>, error: String },
}

impl DeliveryWorker {
    pub fn new(
        store: Store,
        sealer: Arc<Sealer>,
        settings: WebhookSettings,
        logout: Arc<dyn LogoutTokens>,
    ) -> DeliveryWorker {
        let mut http =
            hyper_util::client::legacy::connect::HttpConnector::new_with_resolver(PublicResolver {
                inner: hyper_util::client::legacy::connect::dns::GaiResolver::new(),
                allow_private: settings.allow_private,
            });
        http.enforce_http(false);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        DeliveryWorker {
            store,
            sealer,
            settings,
            client: Client::builder(TokioExecutor::new()).build(https),
            logout,
        }
    }

    pub async fn run(self, mut shutdown: Shutdown) {
        metrics::counter!("latchkey_webhook_deliveries_total", "result" => "delivered").increment(0);
        metrics::counter!("latchkey_webhook_deliveries_total", "result" => "failed").increment(0);
        metrics::counter!("latchkey_webhook_deliveries_total", "result" => "dead").increment(0);
        loop {
            let claimed = match self.deliver_batch().await {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(error = %e, "webhooks: claiming deliveries failed");
                    0
                }
            };
            if claimed as i64 == BATCH {
                continue; // more may be waiting
            }
            tokio::select! {
                _ = tokio::time::sleep(POLL) => {}
                _ = shutdown.wait() => return,
            }
        }
    }

    /// Delivers one batch; returns how many were claimed.
    ///
    /// Each row is read first (its webhook and event, the signed request),
    /// then taken for its attempt only while the batch's claim on it is
    /// still held; its claim then runs a lease from that moment, and only
    /// the POST, bounded by `TIMEOUT`, runs on it, however long the rows
    /// before it took. A row whose claim ran out while it waited its turn,
    /// and that another instance took, is left to that instance; one that
    /// could not be read is left to its claim's end, and tried again then.
    pub async fn deliver_batch(&self) -> anyhow::Result<usize> {
        let now = now_ms();
        let held = now + LEASE_MS;
        let rows = self.store.claim_deliveries(now, LEASE_MS, BATCH).await?;
        let n = rows.len();
        for row in rows {
            let request = match self.prepare(&row).await {
                Ok(request) => request,
                Err(e) => {
                    tracing::warn!(delivery = row.id, error = %e,
                        "webhooks: reading a delivery failed; it is tried again when its claim runs out");
                    continue;
                }
            };
            let until = now_ms() + LEASE_MS;
            let Some(attempts) = self.store.take_delivery(row.id, held, until).await? else {
                continue;
            };
            let outcome = match request {
                Ok(request) => self.send(request).await,
                Err(error) => Attempt::Failed { status: None, error },
            };
            let at = now_ms();
            let (attempted, result) = match &outcome {
                Attempt::Delivered(status) => (
                    Attempted {
                        at,
                        status: Some((*status).into()),
                        error: None,
                        next: None,
                        dead: false,
                    },
                    "delivered",
                ),
                Attempt::Failed { status, error } => {
                    let dead = attempts >= self.settings.max_attempts;
                    let base = self.settings.retry_base.as_millis() as i64;
                    let backoff = (base << (attempts - 1).clamp(0, 30)).min(MAX_BACKOFF_MS);
                    let attempted = Attempted {
                        at,
                        status: status.map(i32::from),
                        error: Some(error),
                        next: (!dead).then_some(at + backoff),
                        dead,
                    };
                    (attempted, if dead { "dead" } else { "failed" })
                }
            };
            if !self.store.delivery_attempted(row.id, until, &attempted).await? {
                // The claim ran out during the attempt and another instance
                // took the delivery: its outcome is that instance's to record.
                tracing::warn!(
                    delivery = row.id,
                    "webhooks: the claim ran out during the attempt"
                );
                continue;
            }
            metrics::counter!("latchkey_webhook_deliveries_total", "result" => result).increment(1);
            if let Some(error) = attempted.error {
                tracing::warn!(
                    delivery = row.id,
                    webhook = %row.webhook_id,
                    attempts,
                    error = %error,
                    dead = attempted.dead,
                    "webhook delivery failed"
                );
            }
        }
        Ok(n)
    }

    /// The signed request of a delivery, or why it cannot be sent (a
    /// failed attempt); a database error is the caller's to retry.
    async fn prepare(&self, row: &DeliveryRow) -> StoreResult<Result<Request, String>> {
        let Some(webhook) = self.store.webhook(&row.webhook_id).await? else {
            return Ok(Err("the webhook was removed".into()));
        };
        let Some(event) = self.store.event(row.event_id).await? else {
            return Ok(Err("the event is gone (retention)".into()));
        };
        // An address literal never reaches the resolver: checked here.
        match url::Url::parse(&webhook.url) {
            Ok(u) => {
                if let Err(why) = refuse_private_host(&u, self.settings.allow_private) {
                    return Ok(Err(why));
                }
            }
            Err(e) => return Ok(Err(format!("url: {e}"))),
        }
        if let Some(client_id) = &webhook.client_id {
            let Some(client) = self.store.client(client_id).await? else {
                return Ok(Err("the client was removed".into()));
            };
            return Ok(self.logout_request(&webhook.url, &client, &event, row.sid.as_deref()));
        }
        let Some(secret) = open_secret(&webhook.secret, &self.sealer) else {
            return Ok(Err("the secret cannot be unsealed (secret key changed?)".into()));
        };
        let body = payload(&event);
        let id = format!("msg_{}", event.id);
        let timestamp = now_ms() / 1000;
        let Some(sig) = signature(&secret, &id, timestamp, &body) else {
            return Ok(Err("the secret is not base64".into()));
        };
        let request = hyper::Request::post(webhook.url.as_str())
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .header(
                hyper::header::USER_AGENT,
                concat!("latchkey/", env!("CARGO_PKG_VERSION")),
            )
            .header("webhook-id", &id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", sig)
            .body(Full::new(Bytes::from(body)));
        Ok(request.map_err(|e| format!("request: {e}")))
    }

    /// Back-Channel Logout 1.0 §2.5: `logout_token=<JWT>` posted as a form
    /// to `client`'s `url`, for the session that `event` ended, which the
    /// client knew as `sid`.
    fn logout_request(
        &self,
        url: &str,
        client: &ClientRecord,
        event: &EventRecord,
        sid: Option<&str>,
    ) -> Result<Request, String> {
        let (Some(sub), Some(sid)) = (event.user_id.as_deref(), sid) else {
            return Err("the logout names no user or session".into());
        };
        let token = self
            .logout
            .logout_token(client, sub, sid)
            .map_err(|e| format!("signing the logout token: {e}"))?;
        let body = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("logout_token", &token)
            .finish();
        hyper::Request::post(url)
            .header(hyper::header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(
                hyper::header::USER_AGENT,
                concat!("latchkey/", env!("CARGO_PKG_VERSION")),
            )
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| format!("request: {e}"))
    }

    /// The POST, within `TIMEOUT` (name resolution, connect, TLS and the
    /// answer's body included).
    async fn send(&self, request: Request) -> Attempt {
        let failed = |error: String| Attempt::Failed { status: None, error };
        let exchange = async {
            let response = self.client.request(request).await.map_err(|e| error_chain(&e))?;
            let status = response.status().as_u16();
            // Read (a bounded part of) the answer, so that the connection is reused.
            let _ = http_body_util::Limited::new(response.into_body(), 64 * 1024)
                .collect()
                .await;
            Ok::<u16, String>(status)
        };
        match tokio::time::timeout(TIMEOUT, exchange).await {
            Ok(Ok(status)) if (200..300).contains(&status) => Attempt::Delivered(status),
            Ok(Ok(status)) => Attempt::Failed {
                status: Some(status),
                error: format!("the receiver answered {status}"),
            },
            Ok(Err(e)) => failed(e),
            Err(_) => failed("timed out".into()),
        }
    }
}

/// An error and its causes, `: `-separated (the client's own message is
/// only "client error (Connect)").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_follow_the_standard_webhooks_example() {
        // The example of the Standard Webhooks specification
        // (spec/standard-webhooks.md, "Signature scheme").
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let body = br#"{"test": 2432232314}"#;
        let sig = signature(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body).unwrap();
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn only_public_addresses_receive_webhooks() {
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "255.255.255.255",
            "224.0.0.1",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
            "2001:db8::1",
            "198.18.0.1",
            "2002:a00:1::1",
        ] {
            assert!(!is_public(private.parse().unwrap()), "{private}");
        }
        for public in ["1.1.1.1", "93.184.215.14", "2606:4700:4700::1111"] {
            assert!(is_public(public.parse().unwrap()), "{public}");
        }
        let url = |s: &str| url::Url::parse(s).unwrap();
        for refused in [
            "http://127.0.0.1:8080/x",
            "http://[::1]/x",
            "https://localhost/x",
            "http://LOCALHOST./x",
            "http://a.localhost/x",
            "http://2130706433/x",
            "http://0x7f000001/x",
            "http://[::ffff:10.0.0.1]/",
        ] {
            assert!(refuse_private_host(&url(refused), false).is_err(), "{refused}");
            assert!(refuse_private_host(&url(refused), true).is_ok(), "{refused}");
        }
        assert!(refuse_private_host(&url("https://hooks.example.com/in"), false).is_ok());
    }

    #[test]
    fn new_secrets_are_distinct_whsec_strings() {
        let (a, b) = (new_secret(), new_secret());
        assert!(a.starts_with("whsec_") && a != b);
        assert_eq!(STANDARD.decode(&a[6..]).unwrap().len(), 32);
    }
}
