//! The upstream of the gateway benchmark (`loadtest/gateway/`): answers
//! every request with `200 ok` and a 3-byte body, on keep-alive connections.
//!
//! ```sh
//! cargo build --release --example bench_upstream
//! target/release/examples/bench_upstream 127.0.0.1:9000
//! ```

use axum::serve::ListenerExt;
use axum::Router;

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:9000".into());
    let listener = tokio::net::TcpListener::bind(&addr).await?.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let app = Router::new().fallback(|| async { "ok\n" });
    axum::serve(listener, app).await
}
