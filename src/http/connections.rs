//! Client connections: how every listener of the service and the gateway
//! accepts them, how long a client may take, and how many may be open.
//!
//! ```text
//!   accept ◄── a permit: at most `max_connections` open per listen address
//!     │        (at the cap, new connections wait in the kernel's backlog)
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
//! reads the answer (HTTP/2: a zero flow-control window) is cut off after
//! about `header_timeout`, and an idle kept-alive connection is closed
//! after the same time. A download the client keeps taking, or an answer
//! whose source (the gateway's upstream) is still producing it, is
//! activity. The watch costs each request a few uncontended atomic updates
//! and clock reads, and each connection one timer (hyper's own head timer
//! would allocate and register a timer per request, and does not see
//! HTTP/2 or answers at all).
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
//! [`serve`] returns when the last one has (a connection with nothing in
//! flight is dropped within a second).

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
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
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
    let activity = Arc::new(Activity::new(Instant::now()));
    let watched = activity.clone();
    let svc = service_fn(move |mut req: axum::http::Request<Incoming>| {
        let handling = Handling::begin(&watched);
        req.extensions_mut().insert(ConnectInfo(peer));
        let answer = router.clone().oneshot(req.map(Body::new));
        async move {
            let r: Result<_, Infallible> = answer.await;
            r.map(|res| res.map(|body| handling.answered(body)))
        }
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http2().max_concurrent_streams(H2_STREAMS);
    let conn = builder.serve_connection(TokioIo::new(tcp), svc);
    drive(conn, |c| c.graceful_shutdown(), &activity, timeout, stop).await;
}

/// Concurrent requests on one HTTP/2 connection (hyper's default is 200):
/// each may hold an answer in memory while the client does not read it.
const H2_STREAMS: u32 = 100;

/// Runs a connection to its end (`close` asks it to close after its
/// current requests), watching [`Activity`] every so often:
///
/// - stalled (an answer the client has not read for `timeout`): dropped;
/// - idle (no request for `timeout`): asked to close, and dropped one
///   [`GRACE`] later if nothing is in flight by then;
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
                    Verdict::Idle if !closing => {
                        closing = true;
                        close(conn.as_mut());
                        check = now + GRACE;
                    }
                    Verdict::Idle => check = now + GRACE,
                    Verdict::Active(next) if closing => check = now + next.min(GRACE),
                    Verdict::Active(next) => check = now + next,
                }
            }
        }
    }
}

/// How long a connection asked to close may take, with nothing in flight,
/// before it is dropped.
const GRACE: Duration = Duration::from_secs(1);

/// What a connection is doing, as the watch in [`drive`] sees it.
///
/// ```text
///   head received ──► handling ──► answered: body being sent ──► body ended
///   (Handling::begin)  (active;     (active while the client       (progress)
///                       bounded by   takes it or its source is
///                       the request  producing; "stalled" once
///                       deadline)    neither for the timeout)
/// ```
///
/// Progress is the end of a handler, each frame of an answer's body taken
/// by the connection, and a body's end; a connection with nothing handling
/// and nothing waiting on a body's source is idle (no body open) or
/// stalled (a body open) once it has made no progress for the timeout.
struct Activity {
    start: Instant,
    /// Requests whose answer's head is not ready yet.
    handling: AtomicUsize,
    /// Answers' bodies not yet ended.
    bodies: AtomicUsize,
    /// Bodies whose last poll waited for their source (an upstream), not
    /// for the client.
    waiting: AtomicUsize,
    /// Milliseconds from `start` to the last progress.
    last: AtomicU64,
}

#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Look again in this long.
    Active(Duration),
    Idle,
    Stalled,
}

impl Activity {
    fn new(start: Instant) -> Activity {
        Activity {
            start,
            handling: AtomicUsize::new(0),
            bodies: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            last: AtomicU64::new(0),
        }
    }

    fn progress(&self, at: Instant) {
        let ms = at.saturating_duration_since(self.start).as_millis() as u64;
        self.last.fetch_max(ms, Ordering::AcqRel);
    }

    fn in_flight(&self) -> bool {
        self.handling.load(Ordering::Acquire) + self.bodies.load(Ordering::Acquire) > 0
    }

    fn verdict(&self, now: Instant, timeout: Duration) -> Verdict {
        if self.handling.load(Ordering::Acquire) + self.waiting.load(Ordering::Acquire) > 0 {
            return Verdict::Active(timeout);
        }
        let last = self.start + Duration::from_millis(self.last.load(Ordering::Acquire));
        let quiet = now.saturating_duration_since(last);
        if quiet < timeout {
            Verdict::Active(timeout - quiet)
        } else if self.bodies.load(Ordering::Acquire) > 0 {
            Verdict::Stalled
        } else {
            Verdict::Idle
        }
    }
}

/// A request being handled; dropped unanswered (the client went away), it
/// counts as progress.
struct Handling(Option<Arc<Activity>>);

impl Handling {
    fn begin(activity: &Arc<Activity>) -> Handling {
        activity.handling.fetch_add(1, Ordering::AcqRel);
        Handling(Some(activity.clone()))
    }

    /// The answer's head is ready: its body is watched from now on.
    fn answered(mut self, body: Body) -> Counted {
        let activity = self.0.take().expect("answered once");
        activity.bodies.fetch_add(1, Ordering::AcqRel);
        activity.handling.fetch_sub(1, Ordering::AcqRel);
        activity.progress(Instant::now());
        Counted {
            body,
            open: BodyOpen {
                activity,
                waiting: false,
            },
        }
    }
}

impl Drop for Handling {
    fn drop(&mut self) {
        if let Some(a) = self.0.take() {
            a.handling.fetch_sub(1, Ordering::AcqRel);
            a.progress(Instant::now());
        }
    }
}

/// An answer's body being sent, and whether its last poll waited for its source.
struct BodyOpen {
    activity: Arc<Activity>,
    waiting: bool,
}

impl BodyOpen {
    fn polled<T>(&mut self, poll: &std::task::Poll<T>) {
        let a = &self.activity;
        match (poll.is_pending(), self.waiting) {
            (true, false) => {
                a.waiting.fetch_add(1, Ordering::AcqRel);
            }
            (false, true) => {
                a.waiting.fetch_sub(1, Ordering::AcqRel);
            }
            _ => {}
        }
        self.waiting = poll.is_pending();
        if !self.waiting {
            a.progress(Instant::now());
        }
    }
}

impl Drop for BodyOpen {
    fn drop(&mut self) {
        if self.waiting {
            self.activity.waiting.fetch_sub(1, Ordering::AcqRel);
        }
        self.activity.bodies.fetch_sub(1, Ordering::AcqRel);
        self.activity.progress(Instant::now());
    }
}

pin_project_lite::pin_project! {
    /// An answer's body, watched (see [`Activity`]).
    struct Counted {
        #[pin]
        body: Body,
        open: BodyOpen,
    }
}

impl hyper::body::Body for Counted {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let poll = this.body.poll_frame(cx);
        this.open.polled(&poll);
        poll
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(10);
    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn a_connection_without_requests_is_idle_after_the_timeout_from_its_start() {
        let a = Activity::new(Instant::now());
        let t0 = a.start;
        assert_eq!(a.verdict(t0 + s(4), T), Verdict::Active(s(6)));
        assert_eq!(a.verdict(t0 + s(10), T), Verdict::Idle);
        assert!(!a.in_flight());
    }

    #[test]
    fn a_request_being_handled_is_activity_however_long_it_takes() {
        let a = Arc::new(Activity::new(Instant::now()));
        let t0 = a.start;
        let h = Handling::begin(&a);
        assert!(a.in_flight());
        assert_eq!(a.verdict(t0 + s(300), T), Verdict::Active(T));
        drop(h); // the client went away: progress now
        assert!(!a.in_flight());
        assert!(matches!(a.verdict(Instant::now(), T), Verdict::Active(_)));
        assert_eq!(a.verdict(Instant::now() + T, T), Verdict::Idle);
    }

    #[test]
    fn an_answer_the_client_does_not_take_is_stalled_and_one_it_takes_is_not() {
        let a = Arc::new(Activity::new(Instant::now()));
        let mut body = Handling::begin(&a).answered(Body::empty());
        let answered = Instant::now();
        assert!(a.in_flight());
        assert_eq!(
            a.verdict(answered + T + s(1), T),
            Verdict::Stalled,
            "never polled"
        );

        // Each frame taken is progress...
        body.open.polled(&std::task::Poll::Ready(()));
        let later = Instant::now();
        assert!(matches!(a.verdict(later, T), Verdict::Active(_)));
        // ...and waiting for the source (an upstream) is activity.
        body.open.polled(&std::task::Poll::<()>::Pending);
        assert_eq!(a.verdict(later + s(300), T), Verdict::Active(T));
        body.open.polled(&std::task::Poll::Ready(()));
        assert_eq!(a.verdict(Instant::now() + T, T), Verdict::Stalled);

        drop(body);
        assert!(!a.in_flight());
        assert_eq!(a.waiting.load(Ordering::Acquire), 0);
        assert_eq!(a.verdict(Instant::now() + T, T), Verdict::Idle);
    }

    #[test]
    fn a_body_dropped_while_waiting_for_its_source_leaves_no_count_behind() {
        let a = Arc::new(Activity::new(Instant::now()));
        let mut body = Handling::begin(&a).answered(Body::empty());
        body.open.polled(&std::task::Poll::<()>::Pending);
        body.open.polled(&std::task::Poll::<()>::Pending);
        assert_eq!(a.waiting.load(Ordering::Acquire), 1);
        drop(body);
        assert_eq!(a.waiting.load(Ordering::Acquire), 0);
        assert_eq!(a.bodies.load(Ordering::Acquire), 0);
        assert_eq!(a.handling.load(Ordering::Acquire), 0);
    }
}
