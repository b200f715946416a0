-- Second factors (docs/mfa.md): TOTP authenticators and passkeys, recovery
-- codes, and the short-lived challenges of a login that steps up or of a
-- WebAuthn ceremony. migrations/postgres/0007_factors.sql is the same in
-- PostgreSQL's dialect.

CREATE TABLE factors (
    id            TEXT PRIMARY KEY,
    user_id       TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    kind          TEXT NOT NULL,             -- totp | passkey
    name          TEXT NOT NULL,
    secret        BLOB,                      -- totp: the shared secret, sealed under a key from the master secret
    last_step     INTEGER,                   -- totp: the newest time step accepted (a code is never accepted twice)
    credential    TEXT,                      -- passkey: the credential (public key, counter, backup state) as JSON
    credential_id TEXT UNIQUE,               -- passkey: its id, base64url
    passwordless  INTEGER NOT NULL DEFAULT 0, -- passkey: may log in without the password
    created_at    INTEGER NOT NULL,
    confirmed_at  INTEGER,                   -- totp: NULL until a first code was entered; a passkey is born confirmed
    last_used_at  INTEGER
);
CREATE INDEX factors_user_id ON factors (user_id);

-- Single-use recovery codes, under a keyed hash; a new set replaces the old.
CREATE TABLE recovery_codes (
    user_id    TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    code_hash  BLOB NOT NULL,
    created_at INTEGER NOT NULL,
    used_at    INTEGER,
    PRIMARY KEY (user_id, code_hash)
);

-- A login waiting for its second factor (`mfa_token`), or a WebAuthn
-- ceremony between its two calls, under the hash of its token.
CREATE TABLE mfa_challenges (
    token_hash BLOB PRIMARY KEY,
    purpose    TEXT NOT NULL,                -- login | passkey_register | passkey_login
    user_id    TEXT REFERENCES users (id) ON DELETE CASCADE, -- NULL for a passwordless login until it names its credential
    amr        TEXT NOT NULL DEFAULT '',     -- login: the methods already passed (pwd)
    client_id  TEXT,                         -- login: the OAuth client (NULL: first-party)
    user_agent TEXT,
    ip         TEXT,
    state      TEXT,                         -- the WebAuthn ceremony's state, JSON
    detail     TEXT,                         -- passkey_register: the name and passwordless choice, JSON
    failures   INTEGER NOT NULL DEFAULT 0,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
);
CREATE INDEX mfa_challenges_expires_at ON mfa_challenges (expires_at);

-- How each session was authenticated (RFC 8176 methods, space-separated)
-- and when: carried into every access token of the session as `amr`,
-- `acr` and `auth_time`.
ALTER TABLE sessions ADD COLUMN amr TEXT NOT NULL DEFAULT '';
ALTER TABLE sessions ADD COLUMN auth_time INTEGER;
