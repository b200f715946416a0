-- Revocations that are not sessions: the `sid` of a removed client's own
-- tokens (`client:<id>`, the client_credentials grant). Every instance
-- refills its revocation set from here as from `sessions.revoked_at`, so
-- that a client removed by another process (the command line) is refused
-- by every instance's validation within its resync interval; rows older
-- than the access tokens' lifetime are purged.
-- migrations/postgres/0009_revoked_sids.sql is the same in the other dialect.

CREATE TABLE revoked_sids (
    sid        TEXT PRIMARY KEY,
    revoked_at INTEGER NOT NULL
);
CREATE INDEX revoked_sids_at ON revoked_sids (revoked_at);
