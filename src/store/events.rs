//! The audit trail: one row per security-relevant event, written in the
//! transaction of the change it records (docs/events.md lists the kinds).

use super::{db_op, Store, StoreResult};

/// An event to record. No field ever holds a secret, an email address or a
/// name: accounts are named by id only, so that erasing one leaves nothing
/// personal behind but its id.
#[derive(Clone, Copy, Debug)]
pub struct Event<'a> {
    /// A dotted kind such as `session.created`.
    pub kind: &'static str,
    pub user_id: Option<&'a str>,
    pub session_id: Option<&'a str>,
    /// Who acted when it was not the user: an admin client's id.
    pub actor: Option<&'a str>,
    /// The client address of the request.
    pub ip: Option<&'a str>,
    /// A reason code or a client id (`reason`), never free text from a client.
    pub reason: Option<&'a str>,
    pub at: i64,
}

impl<'a> Event<'a> {
    pub fn new(kind: &'static str, at: i64) -> Event<'a> {
        Event {
            kind,
            user_id: None,
            session_id: None,
            actor: None,
            ip: None,
            reason: None,
            at,
        }
    }
    pub fn user(self, id: &'a str) -> Self {
        Event {
            user_id: Some(id),
            ..self
        }
    }
    pub fn session(self, id: &'a str) -> Self {
        Event {
            session_id: Some(id),
            ..self
        }
    }
    pub fn actor(self, id: &'a str) -> Self {
        Event {
            actor: Some(id),
            ..self
        }
    }
    pub fn ip(self, ip: Option<&'a str>) -> Self {
        Event { ip, ..self }
    }
    pub fn reason(self, reason: &'a str) -> Self {
        Event {
            reason: Some(reason),
            ..self
        }
    }
}

/// Queues a delivery of event `$1` (at `$2`, of kind `$3` in family `$4`,
/// of session `$5`) to every webhook that asks for it: all events (`kinds`
/// empty), its kind, or its family (`session.`); and, when a session ends,
/// to the back-channel logout webhook of the client that held it, if that
/// client has one (`client_id`: docs/oidc.md), with the `sid` its logout
/// token names (the browser session the client signed in from).
pub(super) const ENQUEUE_DELIVERIES: &str =
    "INSERT INTO webhook_deliveries (webhook_id, event_id, created_at, next_attempt_at, sid) \
     SELECT w.id, $1, $2, $2, s.sid FROM webhooks w \
     LEFT JOIN (SELECT client_id, COALESCE(parent_id, id) AS sid FROM sessions WHERE id = $5 \
                AND $3 IN ('session.ended', 'session.reuse_detected')) s ON s.client_id = w.client_id \
     WHERE (w.client_id IS NULL AND (w.kinds = '' \
     OR (' ' || w.kinds || ' ') LIKE ('% ' || $3 || ' %') OR (' ' || w.kinds || ' ') LIKE ('% ' || $4 || ' %'))) \
     OR s.sid IS NOT NULL";

/// PostgreSQL: the CTEs `e` and `d` of a statement that records an event
/// for each row of CTE `$from` (at `$at`, of kind `$kind` in family
/// `$family`, user `$user`, session `$session`, address `$ip`, reason
/// `$reason`: SQL expressions) and queues its deliveries to the webhooks
/// that ask for it, as [`ENQUEUE_DELIVERIES`] does for an event that ends
/// no session (no back-channel logout). For statements that write a row
/// and its event in one round trip.
macro_rules! event_ctes {
    ($from:literal, $at:literal, $kind:literal, $family:literal, $user:literal, $session:literal, $ip:literal, $reason:literal) => {
        concat!(
            "e AS (INSERT INTO events (at, kind, user_id, session_id, ip, reason) SELECT ",
            $at, ", ", $kind, ", ", $user, ", ", $session, ", ", $ip, ", ", $reason, " FROM ", $from,
            " RETURNING id), d AS (INSERT INTO webhook_deliveries (webhook_id, event_id, created_at, next_attempt_at) \
             SELECT w.id, e.id, ", $at, ", ", $at, " FROM webhooks w, e WHERE w.client_id IS NULL AND (w.kinds = '' \
             OR (' ' || w.kinds || ' ') LIKE ('% ' || ", $kind, " || ' %') \
             OR (' ' || w.kinds || ' ') LIKE ('% ' || ", $family, " || ' %')))"
        )
    };
}
pub(super) use event_ctes;

/// Every kind recorded (docs/events.md has what each means).
pub const KINDS: &[&str] = &[
    "user.registered",
    "user.verified",
    "user.imported",
    "user.updated",
    "user.disabled",
    "user.enabled",
    "user.deleted",
    "user.sessions_ended",
    "user.locked",
    "user.unlocked",
    "session.created",
    "session.ended",
    "session.reuse_detected",
    "login.failed",
    "password.changed",
    "password.reset",
    "password.reset_requested",
    "key.activated",
    "master_secret.rotated",
    "master_secret.retired",
    "webhook.added",
    "webhook.removed",
    "factor.added",
    "factor.renamed",
    "factor.removed",
    "factors.reset",
    "recovery_codes.generated",
    "recovery_code.used",
    "mfa.failed",
    "oauth.authorized",
    "oauth.code_reused",
    "oauth.consent_granted",
    "oauth.consent_revoked",
    "identity.linked",
    "identity.unlinked",
];

/// The family of a kind: up to its first dot, the dot included (`session.`).
pub fn family(kind: &str) -> &str {
    kind.find('.').map_or(kind, |i| &kind[..=i])
}

/// Records `$event` (an [`Event`]) on `$conn`, a connection or an open
/// transaction of either backend, with a delivery for every webhook that
/// asks for it.
macro_rules! record_event {
    ($conn:expr, $event:expr) => {{
        let e: &$crate::store::Event<'_> = $event;
        let (id,): (i64,) = sqlx::query_as(
            "INSERT INTO events (at, kind, user_id, session_id, actor, ip, reason) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id",
        )
        .bind(e.at)
        .bind(e.kind)
        .bind(e.user_id)
        .bind(e.session_id)
        .bind(e.actor)
        .bind(e.ip)
        .bind(e.reason)
        .fetch_one(&mut *$conn)
        .await?;
        sqlx::query($crate::store::events::ENQUEUE_DELIVERIES)
            .bind(id)
            .bind(e.at)
            .bind(e.kind)
            .bind($crate::store::events::family(e.kind))
            .bind(e.session_id)
            .execute(&mut *$conn)
            .await?;
    }};
}
pub(super) use record_event;

/// A recorded event.
#[derive(Clone, Debug)]
pub struct EventRecord {
    pub id: i64,
    pub at: i64,
    pub kind: String,
    pub user_id: Option<String>,
    pub session_id: Option<String>,
    pub actor: Option<String>,
    pub ip: Option<String>,
    pub reason: Option<String>,
}

/// Which events to list (every field narrows the list).
#[derive(Clone, Debug, Default)]
pub struct EventFilter {
    /// A kind (`session.created`) or a family (`session.`: every kind that
    /// starts with it).
    pub kind: Option<String>,
    pub user_id: Option<String>,
    /// At or after / before (Unix milliseconds).
    pub from: Option<i64>,
    pub before: Option<i64>,
    /// Ids after this one (the previous page's last).
    pub after: Option<i64>,
}

impl Store {
    /// Records one event on its own (a change without a transaction of its
    /// own, such as a failed login).
    pub async fn record_event(&self, e: &Event<'_>) -> StoreResult<()> {
        db_op!(self, "record_event", conn => {
            record_event!(conn, e);
            Ok(())
        })
    }

    /// A page of events, oldest first.
    pub async fn events_page(&self, f: &EventFilter, limit: i64) -> StoreResult<Vec<EventRecord>> {
        type Row = (
            i64,
            i64,
            String,
            Option<String>,
            Option<String>,
            Option<String>,
            Option<String>,
            Option<String>,
        );
        let (kind, family) = match f.kind.as_deref() {
            Some(k) if k.ends_with('.') => (None, Some(k)),
            other => (other, None),
        };
        let family_len = family.map_or(0, |p| p.len() as i64);
        let rows: Vec<Row> = db_op!(self, "events_page", conn => Ok(sqlx::query_as(
            "SELECT id, at, kind, user_id, session_id, actor, ip, reason FROM events \
             WHERE ($1 IS NULL OR kind = $1) AND ($2 IS NULL OR substr(kind, 1, CAST($3 AS INTEGER)) = $2) \
             AND ($4 IS NULL OR user_id = $4) AND ($5 IS NULL OR at >= $5) AND ($6 IS NULL OR at < $6) \
             AND ($7 IS NULL OR id > $7) ORDER BY id LIMIT $8",
        )
        .bind(kind)
        .bind(family)
        .bind(family_len)
        .bind(f.user_id.as_deref())
        .bind(f.from)
        .bind(f.before)
        .bind(f.after)
        .bind(limit)
        .fetch_all(&mut *conn)
        .await?))?;
        Ok(rows
            .into_iter()
            .map(|r| EventRecord {
                id: r.0,
                at: r.1,
                kind: r.2,
                user_id: r.3,
                session_id: r.4,
                actor: r.5,
                ip: r.6,
                reason: r.7,
            })
            .collect())
    }

    /// One event by id.
    pub async fn event(&self, id: i64) -> StoreResult<Option<EventRecord>> {
        let f = EventFilter {
            after: Some(id - 1),
            ..EventFilter::default()
        };
        Ok(self.events_page(&f, 1).await?.into_iter().find(|e| e.id == id))
    }

    /// Deletes events recorded before `before` (the retention setting),
    /// but not one a webhook has still to receive: retries may outlast
    /// the retention, and an event is delivered or dead before it goes.
    pub async fn purge_events(&self, before: i64) -> StoreResult<u64> {
        db_op!(self, "purge_events", conn => Ok(sqlx::query(
            "DELETE FROM events WHERE at < $1 AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d \
             WHERE d.event_id = events.id AND d.delivered_at IS NULL AND d.dead_at IS NULL)",
        )
            .bind(before)
            .execute(&mut *conn)
            .await?
            .rows_affected()))
    }
}
