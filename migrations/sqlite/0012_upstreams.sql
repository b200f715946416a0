-- Signing in with other providers (docs/federation.md): the upstream
-- OpenID Providers an operator configured, and the upstream identities
-- linked to local accounts, keyed by (issuer, subject), never by email.
-- migrations/postgres/0012_upstreams.sql is the same in the other dialect.

CREATE TABLE upstreams (
    name                  TEXT PRIMARY KEY,     -- in URLs: /oauth/upstream/{name}
    display_name          TEXT NOT NULL,        -- "Continue with ..."
    issuer                TEXT NOT NULL,
    client_id             TEXT NOT NULL,
    client_secret         BLOB NOT NULL,       -- sealed under the master secret
    scopes                TEXT NOT NULL,
    may_create            INTEGER NOT NULL,       -- a new verified address creates an account
    trusts_email_verified INTEGER NOT NULL,       -- its email_verified claim is believed
    created_at            INTEGER NOT NULL
);

CREATE TABLE upstream_identities (
    issuer     TEXT NOT NULL,
    subject    TEXT NOT NULL,
    user_id    TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    upstream   TEXT NOT NULL,                   -- the upstream it was linked through
    email      TEXT,                            -- the address it asserted then
    created_at INTEGER NOT NULL,
    PRIMARY KEY (issuer, subject)
);
CREATE INDEX upstream_identities_user_id ON upstream_identities (user_id);
