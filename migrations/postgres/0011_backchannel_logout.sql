-- Back-channel logout (OpenID Connect Back-Channel Logout 1.0, docs/oidc.md):
-- a client's back_channel_logout_uri is a webhook of its own, tied to the
-- client, that receives, for each session of the client that ends, a signed
-- logout token instead of the event (the same outbox, retries and history
-- as the audit webhooks). Written and removed with the client's settings;
-- the admin API's webhook list does not show it.
-- migrations/sqlite/0011_backchannel_logout.sql is the same in the other dialect.

ALTER TABLE webhooks ADD COLUMN client_id TEXT;
CREATE UNIQUE INDEX webhooks_client_id ON webhooks (client_id) WHERE client_id IS NOT NULL;
-- A logout's `sid` (the browser session the client's id_token named),
-- kept with its delivery when it is queued: the session may be erased with
-- its account, or purged, before the last retry.
ALTER TABLE webhook_deliveries ADD COLUMN sid TEXT;
