//! Logs (tracing: human or JSON), metrics (Prometheus text format) and
//! trace export (OTLP, [`otlp`]).

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;

use crate::settings::{optional, ConfigError, Source};

pub mod otlp;
pub mod striped;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Human,
    Json,
}

/// Log lines: their format and filter (the service and the gateway alike).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogSettings {
    pub format: LogFormat,
    /// An `EnvFilter` directive such as `info` or `latchkey=debug,warn`.
    pub filter: String,
}

impl LogSettings {
    /// `log` (a filter) and `log_format` (`human` or `json`).
    pub fn read(src: &impl Source) -> Result<LogSettings, ConfigError> {
        Ok(LogSettings {
            format: src.get("log_format", LogFormat::Human, |s| match s {
                "human" | "text" => Ok(LogFormat::Human),
                "json" => Ok(LogFormat::Json),
                _ => Err("expected human or json".into()),
            })?,
            filter: src.get("log", "info".to_string(), |s| {
                EnvFilter::try_new(s)
                    .map(|_| s.to_string())
                    .map_err(|e| format!("not a log filter: {e}"))
            })?,
        })
    }
}

/// The service's telemetry: log lines and, optionally, trace export.
#[derive(Clone, Debug)]
pub struct TelemetrySettings {
    pub log: LogSettings,
    /// Where to export spans over OTLP/HTTP (the full `.../v1/traces` URL);
    /// `None`: no export.
    pub otlp_traces_url: Option<String>,
}

impl TelemetrySettings {
    pub fn read(src: &impl Source) -> Result<TelemetrySettings, ConfigError> {
        Ok(TelemetrySettings {
            log: LogSettings::read(src)?,
            otlp_traces_url: src.get("otlp_endpoint", None, optional(otlp::traces_url))?,
        })
    }
}

/// Installs the global tracing subscriber (once per process) without trace
/// export.
pub fn init_logging(log: &LogSettings) {
    install(log, None);
}

/// Installs the global tracing subscriber (once per process): log lines
/// filtered by `filter`, and, with `otlp_traces_url`, this crate's spans
/// exported over OTLP whatever the log filter (see [`otlp`]).
pub fn init(settings: &TelemetrySettings) {
    install(&settings.log, settings.otlp_traces_url.as_deref());
}

fn install(log: &LogSettings, otlp_traces_url: Option<&str>) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;

    let (format, filter) = (log.format, log.filter.as_str());

    let filter = EnvFilter::try_new(filter).unwrap_or_else(|_| EnvFilter::new("info"));
    let Some(url) = otlp_traces_url else {
        // No export: the filter applies to everything, as it always did, so
        // spans and events below it are off at their call sites.
        let _ = tracing_subscriber::registry()
            .with(filter)
            .with(log_lines(format))
            .try_init();
        return;
    };
    // Export: the filter is the log lines' alone; the exporter has its own.
    let export = match otlp::layer(url) {
        Ok(layer) => Some(layer),
        Err(e) => {
            eprintln!("latchkey: OTLP trace export is off: cannot start its thread: {e}");
            None
        }
    };
    let _ = tracing_subscriber::registry()
        .with(log_lines(format).with_filter(filter))
        .with(export)
        .try_init();
}

/// The layer that writes log lines to stderr.
fn log_lines<S>(format: LogFormat) -> Box<dyn tracing_subscriber::Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use tracing_subscriber::Layer;
    match format {
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_writer(std::io::stderr)
            .boxed(),
        LogFormat::Human => {
            use std::io::IsTerminal;
            tracing_subscriber::fmt::layer()
                .with_target(true)
                .with_ansi(std::io::stderr().is_terminal())
                .with_writer(std::io::stderr)
                .boxed()
        }
    }
}

/// The process-wide Prometheus recorder (installed on first use).
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &striped::LATENCY_BUCKETS)
                .expect("buckets are not empty")
                .build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("a metrics recorder was already installed");
            }
            describe();
            metrics::gauge!("latchkey_build_info", "version" => env!("CARGO_PKG_VERSION"),
                "revision" => option_env!("LATCHKEY_GIT_REVISION").unwrap_or("unknown"))
            .set(1.0);
            handle
        })
        .clone()
}

/// The recorder's metrics in the Prometheus text format, after the striped
/// counters of the request path are added to it ([`striped`]). Every
/// `/metrics` renders through here.
pub fn render(handle: &PrometheusHandle) -> String {
    striped::publish_counters();
    handle.render()
}

/// Describes every metric and registers the unlabelled ones, so that they
/// appear in `/metrics` (and on dashboards) from the first scrape. The HTTP
/// request family is not here: the request layer keeps and renders it
/// (`http::middleware::render_metrics`, in stripes, see [`striped`]).
fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    let counters: &[(&'static str, &'static str)] = &[
        ("latchkey_http_shed_total", "Requests answered 503 OVERLOADED"),
        (
            "latchkey_http_deadline_exceeded_total",
            "Requests that hit the request deadline",
        ),
        (
            "latchkey_hash_shed_total",
            "Password hashes refused by admission control, by reason",
        ),
        (
            "latchkey_credential_cache_hits_total",
            "Logins that skipped argon2 thanks to the verified-credential cache",
        ),
        (
            "latchkey_credential_cache_misses_total",
            "Logins that paid a full argon2 verification",
        ),
        (
            "latchkey_token_cache_hits_total",
            "Validations answered from the verified-token cache",
        ),
        (
            "latchkey_token_cache_misses_total",
            "Validations that verified a signature",
        ),
        (
            "latchkey_user_cache_hits_total",
            "User lookups answered from memory",
        ),
        (
            "latchkey_user_cache_misses_total",
            "User lookups that went to the database",
        ),
        (
            "latchkey_cache_evictions_total",
            "Entries evicted from a bounded cache, by cache",
        ),
        (
            "latchkey_db_acquire_timeouts_total",
            "Requests refused because no database connection was free in time",
        ),
        (
            "latchkey_redis_errors_total",
            "Redis commands that failed or timed out, by operation",
        ),
        (
            "latchkey_redis_resubscribes_total",
            "Times the Redis event subscription was re-established",
        ),
        (
            "latchkey_ratelimit_allowed_total",
            "Requests a rate-limit policy let through",
        ),
        (
            "latchkey_ratelimit_limited_total",
            "Requests a rate-limit policy refused",
        ),
        (
            "latchkey_ratelimit_leased_total",
            "Rate-limit checks answered from a lease of Redis tokens (no round trip)",
        ),
        (
            "latchkey_ratelimit_fallback_total",
            "Rate-limit checks that could not ask Redis, by policy and fallback",
        ),
        (
            "latchkey_bruteforce_locks_total",
            "Accounts locked after repeated failed logins",
        ),
        ("latchkey_outbox_deliveries_total", "Mail delivered, by sink"),
        (
            "latchkey_outbox_failures_total",
            "Mail delivery attempts that failed, by sink",
        ),
        ("latchkey_tokens_issued_total", "Access tokens signed"),
        (
            "latchkey_tokens_validated_total",
            "Access-token validations, by result (ok or the reason for refusal)",
        ),
        ("latchkey_revocations_total", "Sessions revoked"),
        (
            "latchkey_refresh_reuse_total",
            "Refresh tokens re-presented after the grace window (session revoked)",
        ),
        (
            "latchkey_otlp_dropped_spans_total",
            "Spans not exported: queue_full (the export queue was full) or export_failed",
        ),
        (
            "latchkey_housekeeping_failures_total",
            "Runs of a periodic chore (purges, resyncs, key reloads) that failed, by chore",
        ),
    ];
    for (name, help) in counters {
        describe_counter!(*name, *help);
    }
    for name in [
        "latchkey_http_shed_total",
        "latchkey_http_deadline_exceeded_total",
        "latchkey_credential_cache_hits_total",
        "latchkey_credential_cache_misses_total",
        "latchkey_token_cache_hits_total",
        "latchkey_token_cache_misses_total",
        "latchkey_user_cache_hits_total",
        "latchkey_user_cache_misses_total",
        "latchkey_db_acquire_timeouts_total",
        "latchkey_redis_resubscribes_total",
        "latchkey_bruteforce_locks_total",
        "latchkey_tokens_issued_total",
        "latchkey_revocations_total",
        "latchkey_refresh_reuse_total",
    ] {
        metrics::counter!(name).increment(0);
    }
    for cache in ["tokens", "users", "credentials"] {
        metrics::counter!("latchkey_cache_evictions_total", "cache" => cache).increment(0);
    }
    for reason in ["queue_full", "budget"] {
        metrics::counter!("latchkey_hash_shed_total", "reason" => reason).increment(0);
    }
    for reason in ["queue_full", "export_failed"] {
        metrics::counter!("latchkey_otlp_dropped_spans_total", "reason" => reason).increment(0);
    }
    let gauges: &[(&'static str, &'static str)] = &[
        ("latchkey_http_requests_in_flight", "Requests being served"),
        (
            "latchkey_hash_queue_depth",
            "Password hashes waiting for a hashing thread",
        ),
        (
            "latchkey_credential_cache_size",
            "Entries in the verified-credential cache",
        ),
        ("latchkey_token_cache_size", "Entries in the verified-token cache"),
        ("latchkey_user_cache_size", "Entries in the user cache"),
        (
            "latchkey_revocations_size",
            "Revoked sessions whose tokens may still be presented",
        ),
        ("latchkey_db_pool_connections", "Open database connections"),
        ("latchkey_db_pool_idle", "Idle database connections"),
        (
            "latchkey_db_pool_max",
            "Configured maximum of database connections",
        ),
        ("latchkey_outbox_backlog", "Mail waiting in the outbox"),
        (
            "latchkey_outbox_oldest_age_seconds",
            "Age of the oldest mail in the outbox",
        ),
        (
            "latchkey_outbox_dead_letters",
            "Mail given up on, kept until mail_dead_letter_ttl_secs",
        ),
        (
            "latchkey_signing_key_age_seconds",
            "Age of the active signing key",
        ),
        ("process_resident_memory_bytes", "Resident memory"),
        ("process_cpu_seconds_total", "CPU time used by the process"),
        ("process_open_fds", "Open file descriptors"),
        ("process_threads", "OS threads"),
    ];
    for (name, help) in gauges {
        describe_gauge!(*name, *help);
        metrics::gauge!(*name).increment(0.0);
    }
    describe_gauge!("latchkey_build_info", "Version and git revision of this binary");
    // Only once a scheduled backup succeeded: absent, not 0, without them.
    describe_gauge!(
        "latchkey_backup_last_success_timestamp_seconds",
        "When the last scheduled backup of the embedded database succeeded (Unix seconds; backup_dir)"
    );
    let histograms: &[(&'static str, &'static str)] = &[
        (
            "latchkey_hash_wait_seconds",
            "Time a password hash waited for a hashing thread",
        ),
        ("latchkey_hash_seconds", "Time of one argon2 hash or verification"),
        (
            "latchkey_db_query_seconds",
            "Database operation latency (connection wait included), by operation",
        ),
        (
            "latchkey_db_acquire_seconds",
            "Time a database operation waited for a pool connection",
        ),
        (
            "latchkey_db_group_commit_wait_seconds",
            "Time a refresh exchange waited in the embedded backend's group-commit queue",
        ),
        (
            "latchkey_redis_command_seconds",
            "Redis command latency, by operation",
        ),
    ];
    for (name, help) in histograms {
        describe_histogram!(*name, Unit::Seconds, *help);
    }
    let _ = metrics::histogram!("latchkey_hash_wait_seconds");
    let _ = metrics::histogram!("latchkey_hash_seconds");
    let _ = metrics::histogram!("latchkey_db_acquire_seconds");
}

/// The process's gauges, read at scrape time from /proc.
pub fn record_process_gauges() {
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
