//! Client connections: how every listener of the service and the gateway
//! accepts them, how long a client may take, and how many may be open.
//!
//! ```text
//!   accept ◄── a permit: at most `max_connections` open per listen address
//!     │        (at the cap, new connections wait in the kernel's backlog)
//!     ▼
//!   first bytes within `header_timeout` ──────────────► closed
//!     │ HTTP/1.1, or HTTP/2 by prior knowledge
//!     ▼
//!   serving ──► no request open for `header_timeout` ──► asked to close
//!     ▲   │     (counted from the start or from the      (HTTP/1.1: at once
//!     │   │      last answer's end; a head still being    if idle; HTTP/2:
//!     │   │      received is not a request yet)           GOAWAY), dropped
//!     │   ▼                                               1 s later if still
//!   a request is open from its head to its body's end     no request is open
//! ```
//!
//! So a client that sends nothing, sends a head a line at a time, or never
//! finishes HTTP/2's preface or a `HEADERS` frame is cut off after about
//! `header_timeout`, and an idle kept-alive connection is closed after the
//! same time. The watch costs each request a few uncontended atomic
//! updates and a clock read, and each connection one timer (hyper's own head timer
//! would allocate and register a timer per request).
//!
//! Without these a client that opens connections and never finishes a
//! request (slowloris) holds each one, and its task and buffers, for as
//! long as it likes, until the process runs out of file descriptors and
//! nobody can log in. Once a request is open, its time is bounded
//! elsewhere: the service's request deadline (`middleware`), the gateway's
//! route timeout.
//!
//! On shutdown, accepting stops and each open connection is asked to close
//! after its current request (HTTP/1.1: no keep-alive; HTTP/2: GOAWAY);
//! [`serve`] returns when the last one has.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::Interest;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tower::ServiceExt;

use crate::lifecycle::Shutdown;
use crate::settings::{millis, number, ConfigError, Source};

/// How long a client may take and how many may be connected; read the same
/// way by the service (`LATCHKEY_HEADER_TIMEOUT_MS`, ...) and the gateway
/// (`header_timeout_ms`, ... at the top of its file).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionSettings {
    /// Time to send a whole request head, from connecting or from the
    /// previous answer; also how long an idle connection is kept.
    pub header_timeout: Duration,
    /// Open client connections per listen address.
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
}

impl ConnectionSettings {
    /// Raises the process's open-file limit to its hard limit (as nginx's
    /// `worker_rlimit_nofile` or Go's runtime do: the usual soft limit,
    /// 1,024, is far below `max_connections`), and warns if the limit
    /// still cannot hold this many connections besides the process's own
    /// files and pools. Past the limit, accepting pauses (logged) and new
    /// connections wait in the backlog.
    pub fn prepare_file_limit(&self) {
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
        if soft < self.max_connections as u64 + OWN_FILES {
            tracing::warn!(
                open_files = soft,
                max_connections = self.max_connections,
                "the open-file limit (ulimit -n) is below max_connections plus the process's own files; \
                 past it new connections wait until others close (raise the limit or lower max_connections)"
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
        let permit = tokio::select! {
            biased;
            _ = stop.wait() => break,
            p = connections.open.clone().acquire_owned() => p.expect("the semaphore is never closed"),
        };
        let (tcp, peer) = tokio::select! {
            biased;
            _ = stop.wait() => break,
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    refused(e).await;
                    continue;
                }
            },
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

/// An error from `accept`: one connection's (aborted before it was taken)
/// is skipped; anything else (out of file descriptors) is logged and the
/// loop pauses a second rather than spin.
async fn refused(e: io::Error) {
    use io::ErrorKind::*;
    if matches!(e.kind(), ConnectionAborted | ConnectionRefused | ConnectionReset) {
        return;
    }
    tracing::warn!(error = %e, "accepting a connection failed; pausing for a second");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

async fn connection(tcp: TcpStream, peer: SocketAddr, router: Router, timeout: Duration, stop: Shutdown) {
    let Some(h2) = prior_knowledge_h2(&tcp, Instant::now() + timeout).await else {
        return;
    };
    let idle = Arc::new(Idle::new());
    let watched = idle.clone();
    // Each request counts as activity from its head to its body's end.
    let svc = service_fn(move |mut req: axum::http::Request<Incoming>| {
        let open = watched.begin();
        req.extensions_mut().insert(ConnectInfo(peer));
        let answer = router.clone().oneshot(req.map(Body::new));
        async move {
            let r: Result<_, Infallible> = answer.await;
            r.map(|res| res.map(|body| Counted { body, _open: open }))
        }
    });
    let io = TokioIo::new(tcp);
    if h2 {
        let conn = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .serve_connection(io, svc);
        drive(conn, |c| c.graceful_shutdown(), stop, &idle, timeout).await;
    } else {
        let conn = http1::Builder::new().serve_connection(io, svc);
        drive(conn, |c| c.graceful_shutdown(), stop, &idle, timeout).await;
    }
}

/// Runs a connection to its end. On `stop` it is asked to close after its
/// current requests. Once no request has been open for `timeout` (a head
/// being received is not a request yet) it is asked to close and, if
/// that does not end it within [`GRACE`] with still no request open,
/// dropped.
async fn drive<C, E>(conn: C, close: fn(Pin<&mut C>), mut stop: Shutdown, idle: &Idle, timeout: Duration)
where
    C: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let mut conn = pin!(conn);
    let mut stopping = false;
    let mut closing = false;
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
                close(conn.as_mut());
            }
            _ = tokio::time::sleep_until(check) => {
                match idle.idle_for(Instant::now(), timeout) {
                    Some(remaining) => check = Instant::now() + remaining,
                    None if closing => return,
                    None => {
                        closing = true;
                        close(conn.as_mut());
                        check = Instant::now() + GRACE;
                    }
                }
            }
        }
    }
}

/// How long an idle connection asked to close may take before it is dropped.
const GRACE: Duration = Duration::from_secs(1);

/// A connection's open requests and when the last one ended.
struct Idle {
    start: Instant,
    open: AtomicUsize,
    /// Milliseconds from `start` to the end of the last request.
    last: AtomicU64,
}

/// One request of an [`Idle`] connection, open until dropped.
struct Open(Arc<Idle>);

impl Idle {
    fn new() -> Idle {
        Idle {
            start: Instant::now(),
            open: AtomicUsize::new(0),
            last: AtomicU64::new(0),
        }
    }

    fn begin(self: &Arc<Self>) -> Open {
        self.open.fetch_add(1, Ordering::AcqRel);
        Open(self.clone())
    }

    /// A request ended at `at`.
    fn end(&self, at: Instant) {
        let ms = at.saturating_duration_since(self.start).as_millis() as u64;
        self.last.fetch_max(ms, Ordering::AcqRel);
        self.open.fetch_sub(1, Ordering::AcqRel);
    }

    /// At `now`: `None` if no request is open and none has ended within
    /// `timeout`; otherwise how long until that could be so.
    fn idle_for(&self, now: Instant, timeout: Duration) -> Option<Duration> {
        if self.open.load(Ordering::Acquire) > 0 {
            return Some(timeout);
        }
        let last = self.start + Duration::from_millis(self.last.load(Ordering::Acquire));
        let quiet = now.saturating_duration_since(last);
        (quiet < timeout).then(|| timeout - quiet)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.end(Instant::now());
    }
}

pin_project_lite::pin_project! {
    /// An answer's body that keeps its request open until it ends (or is
    /// dropped), so that a long download is activity.
    struct Counted {
        #[pin]
        body: Body,
        _open: Open,
    }
}

impl hyper::body::Body for Counted {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        self.project().body.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Whether the client opened with HTTP/2's preface (`Some(true)`) or with
/// anything else (`Some(false)`), from its first bytes, read without taking
/// them; `None` if it closed, or sent nothing decisive before `deadline`
/// (nothing at all, or a preface it never finishes).
async fn prior_knowledge_h2(tcp: &TcpStream, deadline: Instant) -> Option<bool> {
    let mut buf = [0u8; 24];
    let decided = async {
        loop {
            tcp.readable().await.ok()?;
            // Undecided (a part of the preface) counts as "would block", so
            // that the readiness seen is cleared and the wait is for more
            // bytes, not a spin on the ones already here.
            let peeked = tcp.try_io(Interest::READABLE, || {
                let n = peek(tcp, &mut buf)?;
                if n > 0 && n < buf.len() && buf[..n] == H2_PREFACE[..n] {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                Ok(n)
            });
            match peeked {
                Ok(0) => return None,
                Ok(n) => return Some(n == H2_PREFACE.len() && buf == *H2_PREFACE),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(_) => return None,
            }
        }
    };
    tokio::time::timeout_at(deadline, decided).await.ok().flatten()
}

/// The bytes waiting on `tcp`, left for the next read (`MSG_PEEK`).
fn peek(tcp: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    // SAFETY: `buf` is valid for `buf.len()` bytes and the descriptor is
    // open for as long as `tcp` is borrowed.
    let n = unsafe {
        libc::recv(
            tcp.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_PEEK,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_is_idle_only_with_no_request_open_for_the_timeout() {
        let (t, s) = (Duration::from_secs(10), Duration::from_secs);
        let idle = Arc::new(Idle::new());
        let t0 = idle.start;
        assert_eq!(idle.idle_for(t0 + s(4), t), Some(s(6)), "counted from the start");
        assert_eq!(idle.idle_for(t0 + s(10), t), None);

        let open = idle.begin();
        assert_eq!(
            idle.idle_for(t0 + s(30), t),
            Some(t),
            "a request still open is activity"
        );
        let other = idle.begin();
        std::mem::forget((open, other));
        idle.end(t0 + s(31));
        assert_eq!(idle.idle_for(t0 + s(60), t), Some(t), "one of two still open");
        idle.end(t0 + s(32));
        assert_eq!(idle.idle_for(t0 + s(41), t), Some(s(1)), "from the last end");
        assert_eq!(idle.idle_for(t0 + s(42), t), None);
    }
}
