-- Upstreams that are not OpenID Providers (GitHub: OAuth 2.0 and its REST
-- API), upstreams whose multi-factor sign-in is trusted as the second
-- factor, and the claims that carry an upstream's address and name
-- (docs/federation.md). Added columns with defaults only, so that
-- the previous version reads and writes the table unchanged (rolling
-- upgrades). migrations/sqlite/0013_upstream_protocols.sql is the same
-- in the other dialect.

ALTER TABLE upstreams ADD COLUMN protocol TEXT NOT NULL DEFAULT 'oidc';   -- 'oidc' or 'github'
ALTER TABLE upstreams ADD COLUMN trusts_mfa BOOLEAN NOT NULL DEFAULT FALSE; -- its amr "mfa" counts as the second factor
ALTER TABLE upstreams ADD COLUMN email_claim TEXT NOT NULL DEFAULT 'email';
ALTER TABLE upstreams ADD COLUMN name_claim TEXT NOT NULL DEFAULT 'name';
