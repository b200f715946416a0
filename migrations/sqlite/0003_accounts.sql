-- Account management: sessions a user can see, accounts an administrator
-- can disable, OAuth clients with scopes (`latchkey:admin` for the admin API).
-- migrations/postgres/0003_accounts.sql is the same in PostgreSQL's dialect.

-- Where each session started. Its last use is its newest refresh token's
-- creation time, so refreshing writes nothing more.
ALTER TABLE sessions ADD COLUMN user_agent TEXT;  -- at creation, at most 256 characters
ALTER TABLE sessions ADD COLUMN ip TEXT;          -- the client address at creation

-- Set while an administrator has disabled the account: no login, no session.
ALTER TABLE users ADD COLUMN disabled_at INTEGER;

-- The scopes a client may ask for in the client_credentials grant, space-separated.
ALTER TABLE clients ADD COLUMN scopes TEXT NOT NULL DEFAULT '';
