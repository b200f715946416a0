-- An administrator may change an account's email: the account is unverified
-- until the new address proves itself with a code, and is never purged as a
-- sign-up nobody finished. Queued mail names its recipient by digest, so that
-- erasing an account also erases the mail still waiting for it.
-- migrations/sqlite/0006_email_change.sql is the same in the other dialect.

ALTER TABLE users ADD COLUMN email_changed_at BIGINT;
ALTER TABLE outbox ADD COLUMN recipient BYTEA;   -- SHA-256 of the normalised address
CREATE INDEX outbox_recipient ON outbox (recipient);
