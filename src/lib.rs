//! latchkey: an authentication service and API gateway.
//!
//! Layers, top to bottom: `http` (routes, extractors, errors) over the domain
//! (`domain`: accounts, sessions, tokens; `limits`: rate limits and
//! brute-force protection; `mail`: the outbox) over `store` (SQLite,
//! PostgreSQL) and `cache` (in-process, Redis). `app` builds it all; `cli` is
//! the command line.

pub mod app;
pub mod cache;
pub mod cli;
pub mod config;
pub mod crypto;
pub mod domain;
pub mod gateway;
pub mod http;
pub mod limits;
pub mod mail;
pub mod store;
pub mod telemetry;
