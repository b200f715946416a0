//! latchkey: an authentication service and API gateway.
//!
//! The modules are layers; each imports only from layers below it (the
//! test `tests/it/layers.rs` checks this against docs/design.md):
//!
//! 1. ground floor, importing nothing from the crate: `settings` (where
//!    values come from, shared parsers), `clock`, `crypto`, `lifecycle`
//!    (signals, shutdown, tasks, readiness);
//! 2. `telemetry` (logs, metrics, trace export);
//! 3. `store` (SQLite, PostgreSQL);
//! 4. `cache` (in-process, Redis: revocations, users);
//! 5. `limits` (rate limits, brute force) and `mail` (the outbox);
//! 6. `domain` (accounts, sessions, tokens, operations);
//! 7. `http` (routes, extractors, errors);
//! 8. `app` (the service: settings aggregate, wiring, background work) and
//!    `gateway` (the reverse proxy);
//! 9. `cli` (the command line).

pub mod app;
pub mod cache;
pub mod cli;
pub mod clock;
pub mod crypto;
pub mod domain;
pub mod gateway;
pub mod http;
pub mod lifecycle;
pub mod limits;
pub mod mail;
pub mod server;
pub mod settings;
pub mod store;
pub mod telemetry;
pub mod webhooks;
