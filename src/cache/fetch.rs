//! Reading what another process publishes over HTTP: the service's JWKS
//! and its revocations, for the gateway (and a second instance's keys).

use std::time::Duration;

use bytes::Bytes;

/// GET over plain HTTP with a timeout (a JWKS from a service on the same network).
pub async fn http_get(url: &str) -> anyhow::Result<Bytes> {
    use http_body_util::{BodyExt, Empty};
    let uri: hyper::Uri = url.parse()?;
    if uri.scheme_str() != Some("http") {
        anyhow::bail!("{url}: only http:// JWKS URLs are supported");
    }
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Empty<Bytes>>();
    let fetch = async {
        let resp = client.get(uri).await?;
        if !resp.status().is_success() {
            anyhow::bail!("{url}: HTTP {}", resp.status());
        }
        Ok(resp.into_body().collect().await?.to_bytes())
    };
    tokio::time::timeout(Duration::from_secs(5), fetch)
        .await
        .map_err(|_| anyhow::anyhow!("{url}: timed out"))?
}
