//! The ground both programs serve HTTP on, the service's HTTP edge (`http`)
//! and the gateway alike: how connections are accepted and held
//! (`connections`), the answers they give themselves (`answers`), the
//! client's address behind trusted proxies (`client_address`), and the
//! liveness endpoint (`health`). It knows nothing of accounts or routes.

pub mod answers;
pub mod client_address;
pub mod connections;
pub mod health;
