//! Slow and idle clients (slowloris): a client that opens connections and
//! never finishes a request must not hold them, or enough of them shut
//! everyone else out. The same checks run against the service's listener
//! and the gateway's (`gateway.rs` calls [`slow_clients_are_cut_off`]).
//!
//! Every instance here allows 300 ms for a request head and 3 open
//! connections.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::TestApp;

/// Settings of an instance under these checks (the service's names; the
/// gateway's file uses the same keys).
pub const SETTINGS: &[(&str, &str)] = &[("header_timeout_ms", "300"), ("max_connections", "3")];
const TIMEOUT: Duration = Duration::from_millis(300);
const CAP: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_are_cut_off_at_the_service() {
    let app = TestApp::embedded(SETTINGS).await;
    let addr = app.base.trim_start_matches("http://").parse().unwrap();
    slow_clients_are_cut_off(addr, "/health/live").await;
    app.stop().await;
}

/// Asking and never reading the answers: the answers stall and the
/// connection is dropped, over HTTP/1.1 (pipelined requests) and HTTP/2
/// (a flow-control window of zero, with other requests on the same
/// connection all along), and the service goes on answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_a_client_never_reads_do_not_hold_its_connection() {
    let app = TestApp::embedded(SETTINGS).await;
    let addr: SocketAddr = app.base.trim_start_matches("http://").parse().unwrap();
    let size = app.get("/openapi.json").await.bytes().await.unwrap().len();

    // HTTP/1.1: 300 requests for a large answer at once, none read.
    let asked = 300;
    let mut s = TcpStream::connect(addr).await.unwrap();
    let one = format!("GET /openapi.json HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    s.write_all(one.repeat(asked).as_bytes()).await.unwrap();
    tokio::time::sleep(TIMEOUT * 3 + Duration::from_secs(2)).await;
    let mut got = 0usize;
    let mut buf = vec![0u8; 64 * 1024];
    let drained = tokio::time::timeout(Duration::from_secs(5), async {
        while let Ok(n) = s.read(&mut buf).await {
            if n == 0 {
                break;
            }
            got += n;
        }
    })
    .await;
    assert!(drained.is_ok(), "the connection was still open");
    assert!(
        got < asked * size / 2,
        "{got} bytes came of {} asked: the stalled connection was kept",
        asked * size
    );

    // HTTP/2: a window of zero, so that no answer's body can be sent.
    let (mut send, conn) = h2_client(addr, Some(0)).await;
    let req = axum::http::Request::get(format!("http://{addr}/openapi.json"))
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let answer = send.send_request(req).await.unwrap();
    assert_eq!(answer.status(), 200);
    // Beside it, a request every 100 ms whose answer is dropped (its stream
    // reset): activity on other streams does not cover the stalled one.
    let busy = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let req = axum::http::Request::get(format!("http://{addr}/health/live"))
                .body(http_body_util::Empty::<bytes::Bytes>::new())
                .unwrap();
            match send.send_request(req).await {
                Ok(a) => drop(a),
                Err(_) => return,
            }
        }
    });
    let ended = tokio::time::timeout(Duration::from_secs(5), conn).await;
    assert!(ended.is_ok(), "an HTTP/2 answer never read held its connection");
    busy.abort();
    drop(answer);

    assert_eq!(app.get("/health/live").await.status(), 200);
    app.stop().await;
}

/// HTTP/2 with a stream window of one byte: each answer's first byte goes
/// out and the rest waits for a window the client never grants, while a
/// `HEAD` every half timeout (an answer without a body) keeps the
/// connection busy. The answers held for the window stall the connection,
/// at the service and at the gateway (`gateway.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_held_back_by_a_one_byte_window_do_not_hold_their_connection_at_the_service() {
    let app = TestApp::embedded(SETTINGS).await;
    let addr = app.base.trim_start_matches("http://").parse().unwrap();
    answers_held_back_by_a_one_byte_window_do_not_hold_their_connection(addr, "/health/live").await;
    assert_eq!(app.get("/health/live").await.status(), 200);
    app.stop().await;
}

pub async fn answers_held_back_by_a_one_byte_window_do_not_hold_their_connection(
    addr: SocketAddr,
    path: &'static str,
) {
    let (mut send, conn) = h2_client(addr, Some(1)).await;
    let request = move |method: axum::http::Method| {
        axum::http::Request::builder()
            .method(method)
            .uri(format!("http://{addr}{path}"))
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap()
    };
    let mut held = Vec::new();
    for _ in 0..10 {
        let answer = send.send_request(request(axum::http::Method::GET)).await.unwrap();
        assert_eq!(answer.status(), 200);
        held.push(answer);
    }
    let busy = tokio::spawn(async move {
        loop {
            tokio::time::sleep(TIMEOUT / 2).await;
            match send.send_request(request(axum::http::Method::HEAD)).await {
                Ok(a) => drop(a),
                Err(_) => return,
            }
        }
    });
    let ended = tokio::time::timeout(Duration::from_secs(5), conn).await;
    busy.abort();
    assert!(
        ended.is_ok(),
        "answers waiting for a window held their connection"
    );
    drop(held);
}

/// HTTP/2: window granted, then taken back. While the client does not read
/// (its socket full), it asks for 99 answers under a large window, lowers
/// its initial window to zero, then reads again and sends a `HEAD` every
/// half timeout. What the server had handed to h2 under the old window
/// cannot be sent; the answers holding it stall their connection. (With
/// hyper's defaults h2 took whole answers while the socket was full, the
/// answers ended on our side, and the data stayed in h2 for good.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_stranded_by_a_window_taken_back_do_not_hold_their_connection() {
    let timeout = Duration::from_secs(2);
    let app = TestApp::embedded(&[("header_timeout_ms", "2000")]).await;
    let addr: SocketAddr = app.base.trim_start_matches("http://").parse().unwrap();

    // A proxy whose server-to-client direction can be paused.
    let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_addr = proxy.local_addr().unwrap();
    let (pause, paused) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let (client, _) = proxy.accept().await.unwrap();
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let server = socket.connect(addr).await.unwrap();
        let (mut from_client, mut to_client) = client.into_split();
        let (mut from_server, mut to_server) = server.into_split();
        tokio::spawn(async move { tokio::io::copy(&mut from_client, &mut to_server).await });
        let mut paused = paused;
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            while *paused.borrow() {
                if paused.changed().await.is_err() {
                    return;
                }
            }
            match from_server.read(&mut buf).await {
                Ok(n) if n > 0 => {
                    if to_client.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
                _ => {
                    let _ = to_client.shutdown().await;
                    return;
                }
            }
        }
    });

    let tcp = TcpStream::connect(proxy_addr).await.unwrap();
    let (mut send, mut conn) = h2::client::Builder::new()
        .initial_window_size(1 << 20)
        .initial_connection_window_size(1 << 30)
        .handshake::<_, bytes::Bytes>(tcp)
        .await
        .unwrap();
    let (shrink, shrink_asked) = tokio::sync::oneshot::channel::<()>();
    let driver = tokio::spawn(async move {
        let mut shrink_asked = Some(shrink_asked);
        loop {
            tokio::select! {
                r = &mut conn => return r.map_err(|e| e.to_string()),
                _ = async { shrink_asked.as_mut().unwrap().await }, if shrink_asked.is_some() => {
                    shrink_asked = None;
                    conn.set_initial_window_size(0).unwrap();
                }
            }
        }
    });
    let request = move |method: &str, path: &str| {
        axum::http::Request::builder()
            .method(method)
            .uri(format!("http://{addr}{path}"))
            .body(())
            .unwrap()
    };
    // One exchange first, so that the settings are acknowledged.
    send = send.ready().await.unwrap();
    let (first, _) = send.send_request(request("GET", "/health/live"), true).unwrap();
    assert_eq!(first.await.unwrap().status(), 200);
    send = send.ready().await.unwrap();
    pause.send(true).unwrap();
    let mut answers = Vec::new();
    for _ in 0..99 {
        send = send.ready().await.unwrap();
        answers.push(
            send.send_request(request("GET", "/openapi.json"), true)
                .unwrap()
                .0,
        );
    }
    // The server takes the requests and fills its socket; then the window
    // is taken back, and the client reads again.
    tokio::time::sleep(timeout / 4).await;
    shrink.send(()).unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    pause.send(false).unwrap();
    let busy = tokio::spawn(async move {
        loop {
            tokio::time::sleep(timeout / 2).await;
            let Ok(ready) = send.clone().ready().await else {
                return;
            };
            send = ready;
            match send.send_request(request("HEAD", "/health/live"), true) {
                Ok((answer, _)) => drop(answer.await),
                Err(_) => return,
            }
        }
    });
    let ended = tokio::time::timeout(timeout * 4, driver).await;
    busy.abort();
    let ended = ended.expect("answers stranded in h2 held their connection");
    let _ = ended.expect("the client runs");
    drop(answers);
    app.stop().await;
}

/// An answer the client never grants a window, beside requests on other
/// streams every 100 ms whose answers are not read either: their answers
/// being asked for is not the client taking data, so the unread answer
/// stalls its connection after one timeout (here 1 s), not four.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_asked_for_but_not_read_do_not_extend_an_unread_answers_time() {
    let app = TestApp::embedded(&[("header_timeout_ms", "1000")]).await;
    let addr: SocketAddr = app.base.trim_start_matches("http://").parse().unwrap();
    let (mut send, conn) = h2_client(addr, Some(0)).await;
    let get = move |path: &str| {
        axum::http::Request::get(format!("http://{addr}{path}"))
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap()
    };
    let answer = send.send_request(get("/openapi.json")).await.unwrap();
    let asked = Instant::now();
    let busy = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            match send.send_request(get("/health/live")).await {
                Ok(a) => drop(a),
                Err(_) => return,
            }
        }
    });
    let ended = tokio::time::timeout(Duration::from_secs(8), conn).await;
    busy.abort();
    assert!(ended.is_ok(), "an HTTP/2 answer never read held its connection");
    assert!(
        asked.elapsed() < Duration::from_millis(2500),
        "the unread answer was kept {:?} (four timeouts are 4 s)",
        asked.elapsed()
    );
    drop(answer);
    app.stop().await;
}

/// A client that takes its answers steadily keeps its connection however
/// long the download lasts: the rule against a trickle of reads (the
/// socket's writes count as going through again only once a buffer's
/// worth is taken) does not cut off a reader that keeps up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_taken_steadily_keeps_its_connection_past_the_timeout() {
    let app = TestApp::embedded(SETTINGS).await;
    let addr: SocketAddr = app.base.trim_start_matches("http://").parse().unwrap();
    let size = app.get("/openapi.json").await.bytes().await.unwrap().len();

    // A small receive buffer, so that the server's writes wait on this
    // client's reads from the start.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(64 * 1024).unwrap();
    let mut s = socket.connect(addr).await.unwrap();
    let asked = 300;
    let one = format!("GET /openapi.json HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    s.write_all(one.repeat(asked).as_bytes()).await.unwrap();

    // 64 KiB every 100 ms (three buffers' worth per timeout) for eight
    // timeouts: about 1.5 MB of the 4 MB asked for.
    let start = Instant::now();
    let mut got = 0usize;
    let mut buf = vec![0u8; 64 * 1024];
    while start.elapsed() < TIMEOUT * 8 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut want = 64 * 1024;
        while want > 0 {
            let n = tokio::time::timeout(TIMEOUT, s.read(&mut buf[..want.min(64 * 1024)]))
                .await
                .expect("the answers kept coming")
                .unwrap();
            assert!(
                n > 0,
                "the connection was closed after {got} bytes in {:?}",
                start.elapsed()
            );
            got += n;
            want -= n;
        }
    }
    assert!(got < asked * size, "the download ended before the test did");
    app.stop().await;
}

/// A request head is read into a buffer of at most 64 KiB (hyper's default
/// lets it grow to about 400 KiB per connection): a larger head is refused
/// with `431`, and an ordinary one with a large header still passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_heads_over_64_kib_are_refused() {
    let app = TestApp::embedded(&[]).await;
    let addr: SocketAddr = app.base.trim_start_matches("http://").parse().unwrap();
    for (filler, status) in [(32 * 1024, "200"), (100 * 1024, "431")] {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "GET /health/live HTTP/1.1\r\nHost: {addr}\r\nX-Filler: {}\r\nConnection: close\r\n\r\n",
            "a".repeat(filler)
        );
        // The server may answer and close before it has read everything.
        let _ = s.write_all(head.as_bytes()).await;
        let answer = read_head(&mut s).await;
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status}")),
            "a {filler}-byte header: {answer:?}"
        );
    }
    app.stop().await;
}

/// On shutdown a connection with nothing in flight (silent, or half a
/// head) is dropped within about a second, not kept until the shutdown
/// timeout (10 s) or its own timeout (here 20 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_does_not_wait_for_clients_that_send_nothing() {
    let app = TestApp::embedded(&[("header_timeout_ms", "20000")]).await;
    let addr: SocketAddr = app.base.trim_start_matches("http://").parse().unwrap();
    let _silent = TcpStream::connect(addr).await.unwrap();
    let mut half = TcpStream::connect(addr).await.unwrap();
    half.write_all(b"GET /health/live HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let mut h2 = TcpStream::connect(addr).await.unwrap();
    h2.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    app.stop().await;
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "shutdown took {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_with_prior_knowledge_is_served_and_its_idle_connections_end() {
    let app = TestApp::embedded(SETTINGS).await;
    let addr: SocketAddr = app.base.trim_start_matches("http://").parse().unwrap();

    // A real HTTP/2 client is answered, twice on one connection.
    let (mut send, conn) = h2_client(addr, None).await;
    for _ in 0..2 {
        let req = axum::http::Request::get(format!("http://{addr}/health/live"))
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap();
        let answer = send.send_request(req).await.unwrap();
        assert_eq!(answer.status(), 200);
        tokio::time::sleep(TIMEOUT / 3).await;
    }
    // Then idle: the server sends GOAWAY and the connection ends.
    let ended = tokio::time::timeout(Duration::from_secs(5), conn).await;
    assert!(
        ended.is_ok(),
        "an idle HTTP/2 connection was kept past its timeout"
    );

    // A client that sends the preface and SETTINGS, then never a request.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    assert_closed_within(&mut s, Duration::from_secs(5), "HTTP/2 preface, then nothing").await;
    app.stop().await;
}

/// An HTTP/2 client (prior knowledge) on a new connection to `addr`, its
/// streams' initial window `window` (`None`: hyper's default); the
/// connection runs in the returned task, which ends when it closes.
async fn h2_client(
    addr: SocketAddr,
    window: Option<u32>,
) -> (
    hyper::client::conn::http2::SendRequest<http_body_util::Empty<bytes::Bytes>>,
    tokio::task::JoinHandle<Result<(), hyper::Error>>,
) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let mut builder = hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
    if let Some(w) = window {
        builder.initial_stream_window_size(w);
    }
    let (send, conn) = builder
        .handshake(hyper_util::rt::TokioIo::new(tcp))
        .await
        .unwrap();
    (send, tokio::spawn(conn))
}

/// The checks, against a listener that allows [`TIMEOUT`] for a head and
/// [`CAP`] connections; `path` answers 200 to a GET.
pub async fn slow_clients_are_cut_off(addr: SocketAddr, path: &'static str) {
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    let within = Duration::from_secs(5);

    // The start of HTTP/2's preface, then a close or a reset: the server
    // goes on answering (a peek-based version check once spun on these).
    for (start, reset) in [
        (&b"P"[..], false),
        (&b"PRI"[..], true),
        (&b"PRI * HTTP/2.0\r\n"[..], false),
    ] {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(start).await.unwrap();
        if reset {
            // A linger of zero: the close is a reset, at once (the
            // deprecation is about the blocking close of a non-zero one).
            #[allow(deprecated)]
            s.set_linger(Some(Duration::ZERO)).unwrap();
        } else {
            s.shutdown().await.unwrap();
        }
        drop(s);
        let mut fresh = TcpStream::connect(addr).await.unwrap();
        fresh.write_all(request.as_bytes()).await.unwrap();
        let head = tokio::time::timeout(within, read_head(&mut fresh))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "no answer after {start:?} and a {}",
                    if reset { "reset" } else { "close" }
                )
            });
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    }

    // A client that connects and sends nothing.
    let mut silent = TcpStream::connect(addr).await.unwrap();
    assert_closed_within(&mut silent, within, "nothing sent").await;

    // A request head that never ends, sent a line at a time.
    let (mut reader, mut writer) = TcpStream::connect(addr).await.unwrap().into_split();
    let dribbling = tokio::spawn(async move {
        writer
            .write_all(format!("GET {path} HTTP/1.1\r\n").as_bytes())
            .await?;
        for i in 0.. {
            tokio::time::sleep(TIMEOUT / 6).await;
            writer.write_all(format!("X-Slow-{i}: a\r\n").as_bytes()).await?;
        }
        Ok::<(), std::io::Error>(())
    });
    let mut buf = [0u8; 256];
    let closed = tokio::time::timeout(within, async {
        while let Ok(n) = reader.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
    dribbling.abort();
    assert!(
        closed.is_ok(),
        "a head that never ends was still being read after {within:?}"
    );

    // Half of HTTP/2's preface, then nothing.
    let mut preface = TcpStream::connect(addr).await.unwrap();
    preface.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    assert_closed_within(&mut preface, within, "half a preface").await;

    // A kept-alive client that asks more often than the timeout keeps its
    // connection: the time counts from each answer, not from the start.
    let mut steady = TcpStream::connect(addr).await.unwrap();
    for _ in 0..5 {
        steady.write_all(request.as_bytes()).await.unwrap();
        let head = read_head(&mut steady).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        tokio::time::sleep(TIMEOUT / 2).await;
    }
    // ...and once it stops asking, it is closed.
    assert_closed_within(&mut steady, within, "an idle kept-alive connection").await;

    // At the cap, a new connection waits for a free one; it is not lost.
    let mut idle = Vec::new();
    for _ in 0..CAP {
        idle.push(TcpStream::connect(addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let asked = Instant::now();
    let mut waiting = TcpStream::connect(addr).await.unwrap();
    waiting.write_all(request.as_bytes()).await.unwrap();
    let head = tokio::time::timeout(within, read_head(&mut waiting))
        .await
        .expect("the waiting connection is served once the idle ones are closed");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        asked.elapsed() >= TIMEOUT / 2,
        "answered after {:?}, beside {CAP} open connections (the cap)",
        asked.elapsed()
    );
    for mut s in idle {
        assert_closed_within(&mut s, within, "an idle connection at the cap").await;
    }
}

/// The answer's head (up to the blank line), read from a kept-alive connection.
pub async fn read_head(s: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut byte).await.unwrap(), 1, "closed before the answer");
        head.push(byte[0]);
    }
    // The body: these answers are short and carry a Content-Length.
    let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
    let len: usize = text
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).await.unwrap();
    String::from_utf8_lossy(&head).into_owned()
}

/// Reads until the server closes (or resets) the connection, which must
/// happen within `within`; nothing but an HTTP/2 server's frames may come.
async fn assert_closed_within(s: &mut TcpStream, within: Duration, what: &str) {
    let mut buf = [0u8; 1024];
    let closed = tokio::time::timeout(within, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "{what}: the connection was still open after {within:?}"
    );
}
