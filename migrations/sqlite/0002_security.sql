-- Security round: codes keyed by email (unknown emails get shadow codes that
-- never match, so the code endpoints answer alike for every email), the
-- credentials of the registration a verification code belongs to, a
-- dead-letter state for mail, and a check value of the master secret.
-- migrations/postgres/0002_security.sql is the same in PostgreSQL's dialect.

CREATE TABLE codes (
    email                 TEXT NOT NULL,      -- normalised, as users.email
    purpose               TEXT NOT NULL,      -- 'verify_email' | 'reset_password'
    code_hash             BLOB NOT NULL,      -- HMAC-SHA256 under a server key; random for a shadow code
    created_at            INTEGER NOT NULL,
    expires_at            INTEGER NOT NULL,
    failed_attempts       INTEGER NOT NULL DEFAULT 0,
    consumed_at           INTEGER,
    pending_password_hash TEXT,               -- verify_email: the registration's argon2id hash
    pending_name          TEXT,               -- verify_email: the registration's name
    contested             INTEGER NOT NULL DEFAULT 0, -- verify_email: another registration's code was still live
    PRIMARY KEY (email, purpose)
);
CREATE INDEX codes_expires_at ON codes (expires_at);

INSERT INTO codes (email, purpose, code_hash, created_at, expires_at, failed_attempts, consumed_at)
    SELECT u.email, c.purpose, c.code_hash, c.created_at, c.expires_at, c.failed_attempts, c.consumed_at
    FROM one_time_codes c JOIN users u ON u.id = c.user_id;
DROP TABLE one_time_codes;

CREATE INDEX users_unverified ON users (updated_at) WHERE email_verified_at IS NULL;
CREATE INDEX users_updated_at ON users (updated_at);

ALTER TABLE outbox ADD COLUMN dead_at INTEGER;   -- set when delivery gave up
CREATE INDEX outbox_dead_at ON outbox (dead_at) WHERE dead_at IS NOT NULL;

-- Facts about the installation; 'secret_check' holds an HMAC of a fixed label
-- under the master secret, so that an instance started with another secret
-- refuses to run instead of splitting the deployment.
CREATE TABLE installation (
    name  TEXT PRIMARY KEY,
    value BLOB NOT NULL
);
