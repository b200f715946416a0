//! The watch over one connection (see the module notes of
//! `server::connections`): what a connection is doing (`Activity`), the
//! requests it handles (`Handling`), the socket's reads and writes it sees
//! (`Watched`), and the answer bodies handed to the client a chunk at a
//! time (`Counted`).

use super::*;

/// How many timeouts an answer may go untaken while its connection takes
/// data for other answers.
pub(super) const STALL_CAP: u64 = 4;

/// What a connection is doing, as the watch in [`drive`] sees it.
///
/// ```text
///   head received ──► handling ──► answered: body being sent ──► body ended
///   (Handling::begin)  (active;     HTTP/1.1: still handling;      (progress)
///                       bounded by  HTTP/2: on the body's own
///                       the request clock (a frame taken by the
///                       deadline)   client, or waiting on its
///                                   source, is activity; neither
///                                   for the timeout: stalled)
/// ```
///
/// On HTTP/1.1 a request is handled until its answer's body ends
/// ([`Handling::answered`]): a client that does not take it stalls the
/// socket's writes (`blocked`). On HTTP/2 each open body has its own
/// clock, so that progress on one stream does not cover another stream
/// whose answer the client never takes. A body's data frames are handed
/// over at most [`CHUNK`] at a time, so that a large answer stays visible
/// here while the client takes it instead of vanishing whole into hyper's
/// buffers. A connection with nothing handled and no body open is idle
/// once it has made no progress (a handler's end, a body's frame or end)
/// for the timeout.
pub(super) struct Activity {
    start: Instant,
    /// Requests whose answer's head is not ready yet.
    handling: AtomicUsize,
    /// Milliseconds from `start` to the connection's last progress.
    last: AtomicU64,
    /// Milliseconds from `start` to the last data frame of any answer
    /// handed over (not a reset, a new request or a body's end).
    last_data: AtomicU64,
    /// 1 + milliseconds from `start` to when the socket stopped taking
    /// writes (the client does not read what hyper has buffered); 0 while
    /// writes go through. Set at a write that waits, cleared only once the
    /// client has taken [`TAKEN_BYTES`] since or hyper's buffer is empty
    /// (flushed): a client that reads a trickle, each read letting one
    /// small write through, is still blocked.
    blocked: AtomicU64,
    /// Bytes the socket took since `blocked` was set.
    taken: AtomicU64,
    /// The open bodies' clocks.
    bodies: Mutex<Bodies>,
}

#[derive(Default)]
pub(super) struct Bodies {
    slots: Vec<Option<Clock>>,
    free: Vec<usize>,
    open: usize,
}

/// One open body: its last progress (ms from the connection's start), and
/// whether its last poll waited for its source (an upstream), not for the
/// client.
#[derive(Clone, Copy)]
pub(super) struct Clock {
    last: u64,
    waiting: bool,
}

#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Look again in this long.
    Active(Duration),
    Idle,
    Stalled,
}

impl Activity {
    pub(super) fn new(start: Instant) -> Activity {
        Activity {
            start,
            handling: AtomicUsize::new(0),
            last: AtomicU64::new(0),
            last_data: AtomicU64::new(0),
            blocked: AtomicU64::new(0),
            taken: AtomicU64::new(0),
            bodies: Mutex::new(Bodies::default()),
        }
    }

    pub(super) fn ms(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.start).as_millis() as u64
    }

    /// Progress at `at`; the milliseconds recorded.
    pub(super) fn progress(&self, at: Instant) -> u64 {
        let ms = self.ms(at);
        self.last.fetch_max(ms, Ordering::AcqRel);
        ms
    }

    pub(super) fn bodies(&self) -> std::sync::MutexGuard<'_, Bodies> {
        self.bodies.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// After each write to the socket: `None` if it had to wait (the
    /// client is not reading), else the bytes it took. Only a change of
    /// state reads the clock; while writes go through, this is one load.
    pub(super) fn wrote(&self, took: Option<usize>) {
        let since = self.blocked.load(Ordering::Acquire);
        match took {
            None if since == 0 => {
                self.taken.store(0, Ordering::Release);
                self.blocked.store(self.ms(Instant::now()) + 1, Ordering::Release);
            }
            Some(n) if since != 0 => {
                let taken = self.taken.fetch_add(n as u64, Ordering::AcqRel) + n as u64;
                if taken >= TAKEN_BYTES {
                    self.unblocked();
                }
            }
            _ => {}
        }
    }

    /// hyper flushed the socket: everything it buffered has been written.
    pub(super) fn flushed(&self) {
        if self.blocked.load(Ordering::Acquire) != 0 {
            self.unblocked();
        }
    }

    pub(super) fn unblocked(&self) {
        self.blocked.store(0, Ordering::Release);
        self.progress(Instant::now());
    }

    pub(super) fn in_flight(&self) -> bool {
        self.handling.load(Ordering::Acquire) > 0
            || self.blocked.load(Ordering::Acquire) != 0
            || self.bodies().open > 0
    }

    pub(super) fn verdict(&self, now: Instant, timeout: Duration) -> Verdict {
        let now_ms = self.ms(now);
        let limit = timeout.as_millis() as u64;
        let mut next = limit;
        let blocked = self.blocked.load(Ordering::Acquire);
        if blocked != 0 {
            let quiet = now_ms.saturating_sub(blocked - 1);
            if quiet >= limit {
                return Verdict::Stalled;
            }
            next = limit - quiet;
        }
        // A body quiet for the timeout is stalled unless the connection is
        // taking data for others (HTTP/2 flow control may hold a stream
        // back while the client reads the rest), and in any case after
        // STALL_CAP timeouts: reading one stream slowly does not keep
        // unread ones alive for long.
        let data_quiet = now_ms.saturating_sub(self.last_data.load(Ordering::Acquire));
        let bodies = self.bodies();
        for clock in bodies.slots.iter().flatten().filter(|c| !c.waiting) {
            let quiet = now_ms.saturating_sub(clock.last);
            if quiet >= STALL_CAP * limit || (quiet >= limit && data_quiet >= limit) {
                return Verdict::Stalled;
            }
            next = next.min(if quiet >= limit {
                (limit - data_quiet).min(STALL_CAP * limit - quiet)
            } else {
                limit - quiet
            });
        }
        if blocked != 0 || self.handling.load(Ordering::Acquire) > 0 || bodies.open > 0 {
            return Verdict::Active(Duration::from_millis(next.max(1)));
        }
        let quiet = now_ms.saturating_sub(self.last.load(Ordering::Acquire));
        if quiet < limit {
            Verdict::Active(Duration::from_millis(limit - quiet))
        } else {
            Verdict::Idle
        }
    }
}

/// A request being handled; dropped unanswered (the client went away), it
/// counts as progress.
pub(super) struct Handling(Option<Arc<Activity>>);

impl Handling {
    pub(super) fn begin(activity: &Arc<Activity>) -> Handling {
        activity.handling.fetch_add(1, Ordering::AcqRel);
        Handling(Some(activity.clone()))
    }

    /// The answer's head is ready: its body is watched from now on (`h2`:
    /// the answer goes out on an HTTP/2 stream, see [`Counted`]).
    ///
    /// On HTTP/1.1 the request stays handled until its body ends: the
    /// connection sends one answer at a time, and an answer the client
    /// does not take fills hyper's buffer until the socket's writes wait
    /// (`blocked`), so the body needs no clock of its own and its frames
    /// cost nothing to watch. On HTTP/2 each body has its clock, because
    /// flow control can hold one stream back while others move.
    pub(super) fn answered(self, body: Body, h2: bool) -> Counted {
        let watch = if h2 {
            Watch::Body(self.clocked())
        } else {
            Watch::Request { _handling: self }
        };
        Counted {
            body,
            rest: None,
            watch,
        }
    }

    /// The request's handling ends, and its answer's body gets a clock of
    /// its own in the connection's table.
    pub(super) fn clocked(mut self) -> BodyOpen {
        let activity = self.0.take().expect("answered once");
        let last = activity.progress(Instant::now());
        let slot = {
            let mut b = activity.bodies();
            let clock = Some(Clock { last, waiting: false });
            b.open += 1;
            match b.free.pop() {
                Some(i) => {
                    b.slots[i] = clock;
                    i
                }
                None => {
                    b.slots.push(clock);
                    b.slots.len() - 1
                }
            }
        };
        activity.handling.fetch_sub(1, Ordering::AcqRel);
        BodyOpen {
            activity,
            slot,
            frames: 0,
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

/// How an answer's body is watched while it is sent.
pub(super) enum Watch {
    /// HTTP/1.1: as the request it answers, until it ends (dropped with
    /// the body).
    Request { _handling: Handling },
    /// HTTP/2: by its own clock.
    Body(BodyOpen),
}

impl Watch {
    pub(super) fn polled(&mut self, pending: bool, data: bool) {
        if let Watch::Body(open) = self {
            open.polled(pending, data);
        }
    }
}

/// An answer's HTTP/2 body being sent: its slot among the connection's
/// clocks.
pub(super) struct BodyOpen {
    activity: Arc<Activity>,
    slot: usize,
    /// Data frames handed over so far.
    frames: u32,
}

/// The data frame of an answer from which on handing one over shows that
/// the client takes data. hyper asks an HTTP/2 body for its next frame as
/// soon as it has passed the previous one to h2 (which takes it once the
/// stream's window has room for a single byte), and passes a frame on only
/// when everything before it fits the client's window: so the first two
/// frames of every answer are asked for whether or not the client reads
/// anything, and the third only once the first was granted in full.
pub(super) const TAKEN_FROM_FRAME: u32 = 3;

impl BodyOpen {
    /// After each poll of the body: a frame (or its end) is progress for
    /// the body, a data frame past the first two also for the
    /// connection's data, a wait is a wait for its source.
    pub(super) fn polled(&mut self, pending: bool, data: bool) {
        let a = &self.activity;
        let ms = (!pending).then(|| a.progress(Instant::now()));
        if let Some(clock) = a.bodies().slots[self.slot].as_mut() {
            clock.waiting = pending;
            if let Some(ms) = ms {
                clock.last = ms;
            }
        }
        if let (Some(ms), true) = (ms, data) {
            self.frames = self.frames.saturating_add(1);
            if self.frames >= TAKEN_FROM_FRAME {
                a.last_data.fetch_max(ms, Ordering::AcqRel);
            }
        }
    }
}

impl Drop for BodyOpen {
    fn drop(&mut self) {
        let a = &self.activity;
        {
            let mut b = a.bodies();
            b.slots[self.slot] = None;
            b.free.push(self.slot);
            b.open -= 1;
        }
        a.progress(Instant::now());
    }
}

pin_project_lite::pin_project! {
    /// The client's socket, telling [`Activity`] when its writes wait: what
    /// hyper has buffered is still in flight until written.
    pub(super) struct Watched {
        #[pin]
        pub(super) io: TokioIo<TcpStream>,
        pub(super) activity: Arc<Activity>,
    }
}

impl hyper::rt::Read for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        self.project().io.poll_read(cx, buf)
    }
}

impl hyper::rt::Write for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        let this = self.project();
        let poll = this.io.poll_write(cx, buf);
        this.activity.wrote(took(&poll));
        poll
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> std::task::Poll<io::Result<usize>> {
        let this = self.project();
        let poll = this.io.poll_write_vectored(cx, bufs);
        this.activity.wrote(took(&poll));
        poll
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<io::Result<()>> {
        let this = self.project();
        // hyper (h1's buffer, h2's codec) flushes the socket only once
        // its own buffer is empty.
        let poll = this.io.poll_flush(cx);
        if poll.is_ready() {
            this.activity.flushed();
        }
        poll
    }

    fn poll_shutdown(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        self.project().io.poll_shutdown(cx)
    }
}

/// What a write to the socket says for [`Activity::wrote`]: `None` if it
/// waits, else the bytes taken (none for an error: the connection ends).
pub(super) fn took(poll: &std::task::Poll<io::Result<usize>>) -> Option<usize> {
    match poll {
        std::task::Poll::Pending => None,
        std::task::Poll::Ready(r) => Some(*r.as_ref().unwrap_or(&0)),
    }
}

/// What the client must take, once the socket's writes waited, to count as
/// reading again (unless hyper's buffer empties first): the HTTP/1.1
/// buffer's worth, about what it had to take before each new frame of an
/// answer (hyper polls the body again only once its buffer is flushed).
/// At the default timeout of 30 s, a client that reads less than about
/// 2 KiB a second is cut off.
pub(super) const TAKEN_BYTES: u64 = H1_BUFFER as u64;

/// The most of an answer's data handed to hyper at once.
pub(super) const CHUNK: usize = 16 * 1024;

pin_project_lite::pin_project! {
    /// An answer's body, watched (see [`Activity`]), its data frames cut
    /// to [`CHUNK`].
    ///
    /// On HTTP/2 (a body with its own clock) the last byte of each frame from the source
    /// is handed over as a frame of its own, after the rest. hyper passes a
    /// frame to h2 once the stream's window has room for one byte, and h2
    /// keeps what the window does not cover; were the body's last frame
    /// handed over whole, the body would end here with its data still held
    /// in h2, unwatched, for as long as the client grants no window (and
    /// the stream would count against the connection's streams). Held
    /// back, the last byte is passed on only once the window covers
    /// everything before it, so until then the body is open and its clock
    /// runs. The cost is one more `DATA` frame of one byte per frame from
    /// the source.
    pub(super) struct Counted {
        #[pin]
        body: Body,
        rest: Option<bytes::Bytes>,
        watch: Watch,
    }
}

impl hyper::body::Body for Counted {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        use std::task::Poll;
        let this = self.project();
        let mut data = match this.rest.take() {
            Some(rest) => rest,
            None => match this.body.poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => data,
                    Err(frame) => {
                        this.watch.polled(false, false);
                        return Poll::Ready(Some(Ok(frame)));
                    }
                },
                other => {
                    this.watch.polled(other.is_pending(), false);
                    return other;
                }
            },
        };
        if data.len() > CHUNK {
            *this.rest = Some(data.split_off(CHUNK));
        } else if matches!(this.watch, Watch::Body(_)) && data.len() > 1 {
            *this.rest = Some(data.split_off(data.len() - 1));
        }
        this.watch.polled(false, true);
        Poll::Ready(Some(Ok(hyper::body::Frame::data(data))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_none() && self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        let inner = self.body.size_hint();
        let held = self.rest.as_ref().map_or(0, |r| r.len() as u64);
        let mut hint = hyper::body::SizeHint::new();
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + held);
        }
        hint.set_lower(inner.lower() + held);
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::{Context, Poll};

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
        let mut body = Handling::begin(&a).answered(Body::empty(), true);
        let answered = Instant::now();
        assert!(a.in_flight());
        assert_eq!(
            a.verdict(answered + T + s(1), T),
            Verdict::Stalled,
            "never polled"
        );

        // Each frame taken is progress...
        body.watch.polled(false, true);
        let later = Instant::now();
        assert!(matches!(a.verdict(later, T), Verdict::Active(_)));
        // ...and waiting for the source (an upstream) is activity.
        body.watch.polled(true, false);
        assert!(matches!(a.verdict(later + s(300), T), Verdict::Active(_)));
        body.watch.polled(false, true);
        assert_eq!(a.verdict(Instant::now() + T, T), Verdict::Stalled);

        drop(body);
        assert!(!a.in_flight());
        assert_eq!(a.verdict(Instant::now() + T, T), Verdict::Idle);
    }

    #[test]
    fn an_http1_answer_is_handled_until_its_body_ends_and_stalls_only_by_its_writes() {
        let a = Arc::new(Activity::new(Instant::now()));
        let mut body = Handling::begin(&a).answered(Body::empty(), false);
        assert_eq!(a.handling.load(Ordering::Acquire), 1);
        assert!(a.bodies().slots.is_empty(), "no clock of its own");
        body.watch.polled(false, true);
        assert_eq!(
            a.verdict(Instant::now() + s(300), T),
            Verdict::Active(T),
            "not taken yet is not stalled"
        );
        // A client that does not read: hyper's writes wait on the socket.
        a.wrote(None);
        assert_eq!(a.verdict(Instant::now() + T + s(1), T), Verdict::Stalled);
        a.flushed();
        drop(body);
        assert!(!a.in_flight());
        assert!(matches!(a.verdict(Instant::now(), T), Verdict::Active(_)));
        assert_eq!(a.verdict(Instant::now() + T, T), Verdict::Idle);
    }

    #[test]
    fn progress_on_one_stream_does_not_cover_another_that_stalls() {
        let a = Arc::new(Activity::new(Instant::now()));
        let stalled = Handling::begin(&a).answered(Body::empty(), true);
        let _kept = stalled;
        // Another stream answered and taken again and again, and requests
        // handled beside it: the first is still stalled after the timeout.
        let mut busy = Handling::begin(&a).answered(Body::empty(), true);
        let _handling = Handling::begin(&a);
        busy.watch.polled(false, true);
        assert_eq!(a.verdict(Instant::now() + T + s(1), T), Verdict::Stalled);
    }

    #[test]
    fn a_stream_held_back_while_the_connection_takes_data_stalls_only_at_the_cap() {
        let a = Arc::new(Activity::new(Instant::now()));
        let t0 = a.start;
        let _held = Handling::begin(&a).answered(Body::empty(), true);
        // Data handed over on other streams all along.
        a.last_data.store(a.ms(t0 + 3 * T), Ordering::Release);
        assert!(matches!(a.verdict(t0 + 3 * T + s(1), T), Verdict::Active(_)));
        a.last_data.store(a.ms(t0 + 4 * T - s(1)), Ordering::Release);
        assert_eq!(a.verdict(t0 + 4 * T, T), Verdict::Stalled, "the cap");
    }

    #[test]
    fn writes_the_client_does_not_take_are_in_flight_and_stall_after_the_timeout() {
        let a = Activity::new(Instant::now());
        a.wrote(Some(100));
        assert!(!a.in_flight());
        a.wrote(None);
        let blocked = Instant::now();
        assert!(a.in_flight(), "what hyper buffered is not delivered yet");
        assert!(matches!(a.verdict(blocked, T), Verdict::Active(_)));
        assert_eq!(a.verdict(blocked + T + s(1), T), Verdict::Stalled);
        a.flushed();
        assert!(!a.in_flight());
        assert!(matches!(a.verdict(Instant::now(), T), Verdict::Active(_)));
    }

    #[test]
    fn a_trickle_of_reads_does_not_unblock_writes_that_waited() {
        let a = Activity::new(Instant::now());
        a.wrote(None);
        let blocked = Instant::now();
        // Each small read lets one small write through, then it waits again.
        let since = a.blocked.load(Ordering::Acquire);
        for _ in 0..10 {
            a.wrote(Some(1024));
            assert!(a.in_flight(), "still blocked after a small write");
            a.wrote(None);
        }
        assert_eq!(a.blocked.load(Ordering::Acquire), since, "its clock kept");
        assert!(a.in_flight());
        assert_eq!(
            a.verdict(blocked + T + s(1), T),
            Verdict::Stalled,
            "10 KiB taken is not a client reading"
        );
        // A buffer's worth taken is.
        a.wrote(Some(TAKEN_BYTES as usize - 10 * 1024));
        assert!(!a.in_flight());
        a.wrote(None);
        let again = Instant::now();
        a.wrote(Some(1024));
        assert_eq!(
            a.verdict(again + T + s(1), T),
            Verdict::Stalled,
            "counted afresh from the next wait"
        );
    }

    #[test]
    fn the_first_two_frames_of_an_answer_do_not_count_as_the_client_taking_data() {
        let a = Arc::new(Activity::new(Instant::now() - s(5)));
        let mut body = Handling::begin(&a).answered(Body::empty(), true);
        body.watch.polled(false, true);
        body.watch.polled(false, true);
        assert_eq!(
            a.last_data.load(Ordering::Acquire),
            0,
            "asked for whatever the window"
        );
        body.watch.polled(false, true);
        assert!(
            a.last_data.load(Ordering::Acquire) >= 5_000,
            "the first frame was granted"
        );
    }

    /// Polls `body` to its end: the sizes of its data frames, checking that
    /// the size hint stays exact and the body stays open until the last.
    fn frames(a: &Activity, body: Counted, whole: &[u8]) -> Vec<usize> {
        let mut body = std::pin::pin!(body);
        assert_eq!(
            hyper::body::Body::size_hint(&*body).exact(),
            Some(whole.len() as u64)
        );
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let mut got = Vec::new();
        let mut sizes = Vec::new();
        loop {
            match hyper::body::Body::poll_frame(body.as_mut(), &mut cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    let data = frame.into_data().unwrap();
                    sizes.push(data.len());
                    got.extend_from_slice(&data);
                    let left = hyper::body::Body::size_hint(&*body).exact();
                    assert_eq!(left, Some((whole.len() - got.len()) as u64));
                    assert!(a.in_flight(), "open until the last chunk is taken");
                }
                Poll::Ready(None) => break,
                other => panic!("{:?}", other.map(|_| ())),
            }
        }
        assert_eq!(got, whole);
        assert!(hyper::body::Body::is_end_stream(&*body));
        sizes
    }

    #[test]
    fn a_large_answer_is_handed_over_in_chunks_and_keeps_its_length() {
        let a = Arc::new(Activity::new(Instant::now()));
        let big = bytes::Bytes::from(vec![7u8; 2 * CHUNK + 5]);
        let body = Handling::begin(&a).answered(Body::from(big.clone()), false);
        assert_eq!(frames(&a, body, &big), vec![CHUNK, CHUNK, 5]);
    }

    #[test]
    fn on_http2_the_last_byte_of_each_frame_is_handed_over_on_its_own() {
        let a = Arc::new(Activity::new(Instant::now()));
        let big = bytes::Bytes::from(vec![7u8; 2 * CHUNK + 5]);
        let body = Handling::begin(&a).answered(Body::from(big.clone()), true);
        assert_eq!(frames(&a, body, &big), vec![CHUNK, CHUNK, 4, 1]);
        let small = bytes::Bytes::from_static(b"{\"status\":\"ok\"}");
        let body = Handling::begin(&a).answered(Body::from(small.clone()), true);
        assert_eq!(frames(&a, body, &small), vec![small.len() - 1, 1]);
        let one = bytes::Bytes::from_static(b"x");
        let body = Handling::begin(&a).answered(Body::from(one.clone()), true);
        assert_eq!(frames(&a, body, &one), vec![1]);
    }

    #[test]
    fn closed_bodies_free_their_slots_for_the_next() {
        let a = Arc::new(Activity::new(Instant::now()));
        for _ in 0..3 {
            let bodies: Vec<_> = (0..4)
                .map(|_| Handling::begin(&a).answered(Body::empty(), true))
                .collect();
            assert_eq!(a.bodies().open, 4);
            drop(bodies);
        }
        let b = a.bodies();
        assert_eq!((b.open, b.slots.len()), (0, 4));
        assert!(b.slots.iter().all(Option::is_none));
    }
}
