-- The OpenID Provider (docs/oidc.md): the authorization code flow's
-- clients, codes and consents, and the sessions of its clients.
-- migrations/sqlite/0010_openid_provider.sql is the same in the other dialect.

-- A client's settings for the authorization code flow, as JSON (its kind,
-- redirect URIs, grant types, consent, ...: domain/oidc/client.rs); NULL for
-- a client of the client_credentials grant only.
ALTER TABLE clients ADD COLUMN oidc TEXT;

-- A session an OAuth client holds: the scope it was granted (its access
-- tokens carry it), and the browser session it was started from, which
-- takes it along when it ends (single sign-on, docs/oidc.md).
ALTER TABLE sessions ADD COLUMN scope TEXT;
ALTER TABLE sessions ADD COLUMN parent_id TEXT;
CREATE INDEX sessions_parent_id ON sessions (parent_id) WHERE parent_id IS NOT NULL;

-- Authorization codes, stored as their SHA-256, single use, bound to the
-- client, the redirect URI and the PKCE challenge of their request.
CREATE TABLE authorization_codes (
    code_hash      BYTEA PRIMARY KEY,
    client_id      TEXT NOT NULL,
    user_id        TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    session_id     TEXT NOT NULL,             -- the browser session that authorized
    redirect_uri   TEXT NOT NULL,
    code_challenge TEXT,                      -- PKCE S256, base64url
    scope          TEXT NOT NULL,
    nonce          TEXT,
    amr            TEXT NOT NULL,
    auth_time      BIGINT NOT NULL,
    created_at     BIGINT NOT NULL,
    expires_at     BIGINT NOT NULL,
    used_at        BIGINT,
    issued_session TEXT                       -- the session its exchange started
);
CREATE INDEX authorization_codes_expires_at ON authorization_codes (expires_at);

-- What a user let a client have, and until when (NULL: until revoked).
CREATE TABLE consents (
    user_id    TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    client_id  TEXT NOT NULL,
    scope      TEXT NOT NULL,
    granted_at BIGINT NOT NULL,
    expires_at BIGINT,
    PRIMARY KEY (user_id, client_id)
);
