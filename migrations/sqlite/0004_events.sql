-- The audit trail (docs/events.md): one row per security-relevant event,
-- written in the transaction of the change it records. Accounts are named by
-- id only: no email, name, token or code is ever stored here.
-- migrations/postgres/0004_events.sql is the same in the other dialect.

CREATE TABLE events (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    at         INTEGER NOT NULL,           -- Unix milliseconds
    kind       TEXT NOT NULL,             -- dotted: session.created, login.failed, ...
    user_id    TEXT,
    session_id TEXT,
    actor      TEXT,                      -- an admin client, when not the user
    ip         TEXT,                      -- the client address of the request
    reason     TEXT                       -- a reason code or a client id
);
CREATE INDEX events_at ON events (at);
CREATE INDEX events_user_id ON events (user_id, id);
