//! Integration tests: the real service over HTTP, on SQLite and on
//! PostgreSQL + Redis. Run with `./scripts/test`, which provides the servers.

mod accounts;
mod admin;
mod attacks;
mod backup;
mod cli;
mod common;
mod conformance;
mod connections;
mod dump;
mod events;
mod full_disk;
mod gateway;
mod gateway_attacks;
mod grant_properties;
mod import;
mod layers;
mod limits;
mod litestream;
mod mail;
mod mfa;
mod oauth;
mod oauth2_proxy;
mod observability;
mod oidc;
mod oidc_attacks;
mod oidc_languages;
mod oidc_logout;
mod oidc_spa;
mod ops;
mod pg_restore;
mod registration_properties;
mod sessions;
mod timing;
mod tokens;
mod webhooks;
