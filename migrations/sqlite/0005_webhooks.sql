-- Webhooks (docs/events.md): endpoints that receive the audit events they ask
-- for, and one delivery row per event and endpoint, written in the
-- transaction of the event (an outbox: at-least-once, retried with backoff,
-- dead after the last attempt, kept as the delivery history).
-- migrations/postgres/0005_webhooks.sql is the same in the other dialect.

CREATE TABLE webhooks (
    id         TEXT PRIMARY KEY,
    url        TEXT NOT NULL,
    secret     BLOB NOT NULL,               -- the signing secret, sealed under a key from the master secret
    kinds      TEXT NOT NULL DEFAULT '',    -- space-separated kinds or families (session.); '' = every event
    created_at INTEGER NOT NULL
);

CREATE TABLE webhook_deliveries (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    webhook_id      TEXT NOT NULL REFERENCES webhooks (id) ON DELETE CASCADE,
    event_id        INTEGER NOT NULL,
    created_at      INTEGER NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER NOT NULL,
    claimed_until   INTEGER,
    delivered_at    INTEGER,
    dead_at         INTEGER,
    last_status     INTEGER,                -- the receiver's HTTP status, if it answered
    last_error      TEXT
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE delivered_at IS NULL AND dead_at IS NULL;
CREATE INDEX webhook_deliveries_webhook ON webhook_deliveries (webhook_id, id);
