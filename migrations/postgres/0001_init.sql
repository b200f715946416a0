-- latchkey schema, PostgreSQL dialect. migrations/sqlite/0001_init.sql holds the
-- same tables and columns in SQLite's dialect. Times are Unix milliseconds.

CREATE TABLE users (
    id                TEXT PRIMARY KEY,
    email             TEXT NOT NULL,          -- normalised: trimmed, lower-cased
    name              TEXT,
    password_hash     TEXT NOT NULL,          -- argon2id PHC string
    email_verified_at BIGINT,
    created_at        BIGINT NOT NULL,
    updated_at        BIGINT NOT NULL
);
CREATE UNIQUE INDEX users_email_key ON users (email);

-- One live code per user and purpose; a new code replaces the old one.
CREATE TABLE one_time_codes (
    user_id         TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    purpose         TEXT NOT NULL,            -- 'verify_email' | 'reset_password'
    code_hash       BYTEA NOT NULL,           -- HMAC-SHA256 under a server key
    created_at      BIGINT NOT NULL,
    expires_at      BIGINT NOT NULL,
    failed_attempts INTEGER NOT NULL DEFAULT 0,
    consumed_at     BIGINT,
    PRIMARY KEY (user_id, purpose)
);

-- A session is a refresh-token family.
CREATE TABLE sessions (
    id             TEXT PRIMARY KEY,
    user_id        TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    client_id      TEXT,
    created_at     BIGINT NOT NULL,
    expires_at     BIGINT NOT NULL,
    revoked_at     BIGINT,
    revoked_reason TEXT
);
CREATE INDEX sessions_user_id ON sessions (user_id);
CREATE INDEX sessions_revoked_at ON sessions (revoked_at) WHERE revoked_at IS NOT NULL;

CREATE TABLE refresh_tokens (
    token_hash BYTEA PRIMARY KEY,             -- SHA-256 of the token
    session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    created_at BIGINT NOT NULL,
    rotated_at BIGINT,                        -- set once, when it is exchanged
    successor  BYTEA                          -- next token, sealed under a key derived from this one
);
CREATE INDEX refresh_tokens_session_id ON refresh_tokens (session_id);

-- Transactional outbox: written in the transaction that causes the mail.
CREATE TABLE outbox (
    id              BIGSERIAL PRIMARY KEY,
    payload         BYTEA NOT NULL,           -- sealed message (it may carry a code)
    created_at      BIGINT NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at BIGINT NOT NULL,
    claimed_until   BIGINT,
    last_error      TEXT
);
CREATE INDEX outbox_due ON outbox (next_attempt_at);

CREATE TABLE signing_keys (
    kid          TEXT PRIMARY KEY,
    alg          TEXT NOT NULL,
    private_key  BYTEA NOT NULL,              -- PKCS#8, sealed under a key from the master secret
    public_jwk   TEXT NOT NULL,
    created_at   BIGINT NOT NULL,
    activated_at BIGINT NOT NULL,             -- the newest activated key signs
    retired_at   BIGINT
);

CREATE TABLE clients (
    id          TEXT PRIMARY KEY,
    secret_hash BYTEA NOT NULL,               -- SHA-256 of a 256-bit generated secret
    name        TEXT,
    created_at  BIGINT NOT NULL
);
