//! Integration tests: the real service over HTTP, on SQLite and on
//! PostgreSQL + Redis. Run with `./scripts/test`, which provides the servers.

mod accounts;
mod common;
mod dump;
mod oauth;
mod ops;
mod tokens;
