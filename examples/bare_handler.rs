//! The baseline of the per-request overhead benchmark (`scripts/loadtest
//! overhead`): a bare axum server answering every request with
//! `{"status":"ok"}`, served by stock `axum::serve` on a multi-threaded
//! Tokio runtime, and nothing else: no request id, no deadline, no
//! metrics, no tracing, and none of latchkey's connection limits (its own
//! accept loop, `src/http/connections.rs`, is part of what is measured). latchkey's `/health/live` and a cached
//! `/auth/validate` are measured as a share of its throughput, in the same
//! run on the same cores.
//!
//! ```sh
//! cargo build --release --example bare_handler
//! target/release/examples/bare_handler 127.0.0.1:9001
//! ```

use axum::{Json, Router};

fn main() -> std::io::Result<()> {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:9001".into());
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(async {
            let listener = tokio::net::TcpListener::bind(&addr).await?;
            let app = Router::new().fallback(|| async { Json(serde_json::json!({"status": "ok"})) });
            axum::serve(listener, app).await
        })
}
