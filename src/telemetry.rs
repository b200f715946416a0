//! Logs (tracing: human or JSON) and metrics (Prometheus text format).

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;
use crate::http::AppState;

/// Installs the global tracing subscriber (once per process).
pub fn init_logging(format: LogFormat, filter: &str) {
    let filter = EnvFilter::try_new(filter).unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init(),
        LogFormat::Human => {
            use std::io::IsTerminal;
            builder
                .with_target(true)
                .with_ansi(std::io::stderr().is_terminal())
                .try_init()
        }
    };
}

/// Buckets from 100 us to 5 s, dense enough to read P50/P95/P99.
const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03,
    0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0,
];

/// The process-wide Prometheus recorder (installed on first use).
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
                .expect("buckets are not empty")
                .build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("a metrics recorder was already installed");
            }
            metrics::gauge!("latchkey_build_info", "version" => env!("CARGO_PKG_VERSION"),
                "revision" => option_env!("LATCHKEY_GIT_REVISION").unwrap_or("unknown"))
            .set(1.0);
            handle
        })
        .clone()
}

/// Gauges read at scrape time: pools, caches, process.
pub fn record_gauges(st: &AppState) {
    let (size, idle) = st.store.pool_stats();
    metrics::gauge!("latchkey_db_pool_connections").set(size as f64);
    metrics::gauge!("latchkey_db_pool_idle").set(idle as f64);
    metrics::gauge!("latchkey_db_pool_max").set(st.config.database.max_connections as f64);
    metrics::gauge!("latchkey_token_cache_size").set(st.tokens.cache_len() as f64);
    metrics::gauge!("latchkey_user_cache_size").set(st.users.len() as f64);
    metrics::gauge!("latchkey_revocations_size").set(st.revocations.len() as f64);
    if let Some(c) = &st.accounts.credentials {
        metrics::gauge!("latchkey_credential_cache_size").set(c.len() as f64);
    }
    if let Some(p) = process_stats() {
        metrics::gauge!("process_resident_memory_bytes").set(p.rss_bytes as f64);
        metrics::gauge!("process_cpu_seconds_total").set(p.cpu_seconds);
        metrics::gauge!("process_open_fds").set(p.open_fds as f64);
        metrics::gauge!("process_threads").set(p.threads as f64);
    }
}

struct ProcessStats {
    rss_bytes: u64,
    cpu_seconds: f64,
    open_fds: usize,
    threads: u64,
}

/// From /proc (Linux); `None` elsewhere.
fn process_stats() -> Option<ProcessStats> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = 100.0; // USER_HZ on Linux
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    let threads: u64 = f.get(17)?.parse().ok()?;
    let rss_pages: u64 = f.get(21)?.parse().ok()?;
    let open_fds = std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0);
    Some(ProcessStats {
        rss_bytes: rss_pages * 4096,
        cpu_seconds: (utime + stime) / ticks,
        open_fds,
        threads,
    })
}
