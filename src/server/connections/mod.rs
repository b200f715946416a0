//! Client connections: how every listener of the service and the gateway
//! accepts them, how long a client may take, and how many may be open.
//!
//! ```text
//!   accept ──► a permit: at most `max_connections` served per listen
//!     │        address (at the cap, one accepted connection per serving
//!     │        thread waits for a permit, the next ones in the backlog)
//!     ▼
//!   serving (HTTP/1.1, or HTTP/2 by prior knowledge), watched (`Activity`):
//!     idle     no request for `header_timeout`     ──► asked to close, and
//!              (from the start or the last             dropped a second later
//!              progress; a head still arriving         if nothing is in flight
//!              is not a request)
//!     stalled  an answer the client has not taken  ──► dropped
//!              for `header_timeout`
//!     stop     (shutdown)                          ──► asked to close, and
//!                                                      dropped once nothing
//!                                                      is in flight
//! ```
//!
//! So a client that sends nothing, sends a head a line at a time, never
//! finishes HTTP/2's preface or a `HEADERS` frame, or asks and then never
//! reads the answer (HTTP/2: a zero flow-control window; HTTP/1.1: writes
//! that wait on the socket, and stay waiting until a buffer's worth is
//! taken) is cut off after about `header_timeout`, and an
//! idle kept-alive connection is closed after the same time. A download
//! the client keeps taking, a stream HTTP/2 holds back while the client
//! takes the data of others (for up to four timeouts), or an answer whose
//! source (the gateway's upstream) is still producing it, is activity. On
//! HTTP/2 an answer's last byte is handed over only once the client's
//! window covers the rest ([`Counted`]), so no answer ends here while h2
//! still holds its data for a window that never comes. The watch costs an
//! HTTP/1.1 request two atomic counts and a clock read (its answer is one
//! at a time, and one the client does not take shows as writes that
//! wait), an HTTP/2 answer a lock of its connection's table of answers and
//! a clock read per frame, each write an atomic load, and each connection
//! one timer (hyper's own head timer would allocate and register a timer
//! per request, and does not see HTTP/2 or answers at all).
//!
//! Without these a client that opens connections and never finishes a
//! request (slowloris) holds each one, and its task and buffers, for as
//! long as it likes, until the process runs out of file descriptors and
//! nobody can log in. Once a request is open, its time is bounded
//! elsewhere: the service's request deadline (`middleware`), the gateway's
//! route timeout (to the answer's head only: an upstream that sends a head
//! and then nothing holds the client's connection, docs/security.md).
//!
//! On shutdown, accepting stops and each open connection is asked to close
//! after its current request (HTTP/1.1: no keep-alive; HTTP/2: GOAWAY);
//! [`serve`] returns when the last one has (a connection with nothing in
//! flight is dropped within a second).

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tower::ServiceExt;

use crate::lifecycle::Shutdown;

mod watch;
use crate::settings::{millis, number, ConfigError, Source};
use watch::*;

/// How long a client may take and how many may be connected; read the same
/// way by the service (`LATCHKEY_HEADER_TIMEOUT_MS`, ...) and the gateway
/// (`header_timeout_ms`, ... at the top of its file).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionSettings {
    /// How long a connection may make no progress (a head still arriving
    /// is none; docs above).
    pub header_timeout: Duration,
    /// Client connections served per listen address.
    pub max_connections: usize,
}

impl ConnectionSettings {
    pub fn read(src: &impl Source) -> Result<ConnectionSettings, ConfigError> {
        Ok(ConnectionSettings {
            header_timeout: src.get(
                "header_timeout_ms",
                Duration::from_secs(30),
                millis(100, 3_600_000),
            )?,
            max_connections: src.get("max_connections", 10_000, number(1, 1_000_000))?,
        })
    }

    /// Raises the process's open-file limit to its hard limit (as nginx's
    /// `worker_rlimit_nofile` or Go's runtime do: the usual soft limit,
    /// 1,024, is far below `max_connections`), and warns if the limit
    /// still cannot hold this many connections besides the process's own
    /// files and pools and `outgoing` sockets it may open on their behalf
    /// (the gateway's upstream requests). Past the limit, accepting pauses
    /// (logged) and new connections wait in the backlog.
    pub fn prepare_file_limit(&self, outgoing: usize) {
        const OWN_FILES: u64 = 256;
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `lim` is a valid rlimit for the call to fill and read.
        let soft: u64 = unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
                return;
            }
            if lim.rlim_cur < lim.rlim_max {
                let raised = libc::rlimit {
                    rlim_cur: lim.rlim_max,
                    rlim_max: lim.rlim_max,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                    lim.rlim_cur = lim.rlim_max;
                }
            }
            lim.rlim_cur
        };
        if soft < (self.max_connections + outgoing) as u64 + OWN_FILES {
            tracing::warn!(
                open_files = soft,
                max_connections = self.max_connections,
                outgoing,
                "the open-file limit (ulimit -n) is below max_connections plus the sockets opened for them \
                 and the process's own files; past it new connections wait until others close \
                 (raise the limit or lower max_connections)"
            );
        }
    }
}

/// One listen address's connections: its settings and the permits of its
/// open connections (shared by the gateway's serving threads, which each
/// accept on their own socket for the same address).
#[derive(Clone)]
pub struct Connections {
    settings: ConnectionSettings,
    open: Arc<Semaphore>,
}

impl Connections {
    pub fn new(settings: ConnectionSettings) -> Connections {
        Connections {
            open: Arc::new(Semaphore::new(settings.max_connections)),
            settings,
        }
    }
}

/// Serves `router` on `listener` until `stop`, then lets each open
/// connection finish its current request and returns when all have closed
/// (this listener's and, when several listeners share `connections`, theirs).
/// Each request carries its peer's address (`ConnectInfo<SocketAddr>`).
pub async fn serve(listener: TcpListener, router: Router, connections: Connections, mut stop: Shutdown) {
    loop {
        let (tcp, peer) = tokio::select! {
            biased;
            _ = stop.wait() => break,
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) if out_of_resources(&e) => {
                    tracing::warn!(error = %e, "accepting a connection failed; pausing for a second");
                    tokio::select! {
                        _ = stop.wait() => break,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "a connection failed before it was accepted");
                    continue;
                }
            },
        };
        // Taken after accepting, so that a thread waiting for a connection
        // holds no permit that another thread's connection could use; at
        // the cap, this connection waits here, the next ones in the backlog.
        let permit = tokio::select! {
            biased;
            _ = stop.wait() => break,
            p = connections.open.clone().acquire_owned() => p.expect("the semaphore is never closed"),
        };
        let _ = tcp.set_nodelay(true);
        let (router, stop) = (router.clone(), stop.clone());
        let timeout = connections.settings.header_timeout;
        tokio::spawn(async move {
            connection(tcp, peer, router, timeout, stop).await;
            drop(permit);
        });
    }
    drop(listener);
    // Every permit back: every connection of this address has closed.
    let all = connections.settings.max_connections as u32;
    let _ = connections.open.acquire_many(all).await;
}

/// Whether an error from `accept` is the process's or the system's lack of
/// resources (file descriptors, memory), after which the loop pauses a
/// second rather than spin; any other error is one connection's (Linux
/// reports a new connection's pending network errors, `ECONNABORTED`,
/// `EPROTO`, `ENETDOWN`, `EHOSTUNREACH` and the like, from `accept`), and
/// only that connection is skipped.
fn out_of_resources(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

async fn connection(tcp: TcpStream, peer: SocketAddr, router: Router, timeout: Duration, stop: Shutdown) {
    let activity = Arc::new(Activity::new(Instant::now()));
    let watched = activity.clone();
    let svc = service_fn(move |mut req: axum::http::Request<Incoming>| {
        let handling = Handling::begin(&watched);
        let h2 = req.version() == axum::http::Version::HTTP_2;
        req.extensions_mut().insert(ConnectInfo(peer));
        let answer = router.clone().oneshot(req.map(Body::new));
        async move {
            let r: Result<_, Infallible> = answer.await;
            r.map(|res| res.map(|body| handling.answered(body, h2)))
        }
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().max_buf_size(H1_BUFFER);
    builder
        .http2()
        .max_concurrent_streams(H2_STREAMS)
        .max_send_buf_size(H2_STREAM_BUFFER);
    let io = Watched {
        io: TokioIo::new(tcp),
        activity: activity.clone(),
    };
    let conn = builder.serve_connection(io, svc);
    drive(conn, |c| c.graceful_shutdown(), &activity, timeout, stop).await;
}

/// Concurrent requests on one HTTP/2 connection (hyper's default is 200):
/// each may hold an answer in memory while the client does not read it.
const H2_STREAMS: u32 = 100;

/// What h2 may hold of a stream's answer before hyper hands it the next
/// frame: one byte, i.e. a frame is handed over only once everything
/// before it has left h2 for the socket (hyper's default lets h2 take up to
/// 400 KiB per stream as soon as the window allows). A client can take
/// window back after it was granted (by lowering its initial window size),
/// and what h2 then holds waits, unwatched once its body has ended; with
/// this, that is at most the answer's last byte ([`Counted`]), and an
/// answer's body stays open while any of the rest is still in h2.
const H2_STREAM_BUFFER: usize = 1;

/// The most an HTTP/1.1 connection's read and write buffers may hold
/// (hyper's default is about 400 KiB): a request head larger than this is
/// refused (`431`), and a client that pipelines requests while reading
/// slowly cannot make the buffer grow past it.
const H1_BUFFER: usize = 64 * 1024;

/// Runs a connection to its end (`close` asks it to close after its
/// current requests), watching [`Activity`] every so often:
///
/// - stalled (an answer the client has not read for `timeout`): dropped;
/// - idle (no request for `timeout`), or open for [`MAX_AGE`]: asked to
///   close, and dropped one [`GRACE`] later if nothing is in flight by then;
/// - on `stop`: asked to close, and dropped once nothing is in flight.
async fn drive<C, E>(
    conn: C,
    close: fn(Pin<&mut C>),
    activity: &Activity,
    timeout: Duration,
    mut stop: Shutdown,
) where
    C: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let mut conn = pin!(conn);
    let mut stopping = false;
    let mut closing = false;
    let retire = Instant::now() + MAX_AGE;
    let mut check = Instant::now() + timeout;
    loop {
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "a client connection ended with an error");
                }
                return;
            }
            _ = stop.wait(), if !stopping => {
                stopping = true;
                closing = true;
                close(conn.as_mut());
                check = Instant::now() + GRACE;
            }
            _ = tokio::time::sleep_until(check) => {
                let now = Instant::now();
                if closing && !activity.in_flight() {
                    return;
                }
                match activity.verdict(now, timeout) {
                    Verdict::Stalled => return,
                    Verdict::Active(_) if !closing && now >= retire => {
                        closing = true;
                        close(conn.as_mut());
                        check = now + GRACE;
                    }
                    Verdict::Idle if !closing => {
                        closing = true;
                        close(conn.as_mut());
                        check = now + GRACE;
                    }
                    Verdict::Idle => check = now + GRACE,
                    Verdict::Active(next) if closing => check = now + next.min(GRACE),
                    Verdict::Active(next) => check = (now + next).min(retire),
                }
            }
        }
    }
}

/// How long a connection asked to close may take, with nothing in flight,
/// before it is dropped.
const GRACE: Duration = Duration::from_secs(1);

/// How long a connection may stay open however busy (nginx's
/// `keepalive_time` default): then it is asked to close like an idle one.
/// This bounds whatever a client can hold that the watch does not see
/// (an answer's last byte left in h2 for a window taken back, above).
const MAX_AGE: Duration = Duration::from_secs(3600);
