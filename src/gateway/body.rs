//! Request bodies through the gateway: their framing is checked before
//! anything goes upstream, and a body without a length is read ahead.
//!
//! ```text
//! Transfer-Encoding other than exactly `chunked`? ──► 400 (an unknown coding
//!                                                      the upstream would get
//!                                                      still encoded, unlabelled)
//! body with a length (Content-Length), or none ──► streamed as it is
//! body without one (chunked, or HTTP/2 without content-length):
//!     read ahead up to `request_read_ahead_bytes`, copied into one buffer,
//!     within the route's timeout (holding an upstream slot meanwhile)
//!       not all there in time ──► 408, nothing sent
//!       malformed framing (garbage after a chunk size, ...) ──► 400, nothing sent
//!       ended within it ──► sent with its Content-Length, whatever the method
//!       longer ──► streamed, chunked (`Transfer-Encoding: chunked` set even on
//!                  GET and HEAD, whose unlabelled bodies hyper would drop); a
//!                  framing error later ends the upstream request unfinished
//!                  (no last chunk: the upstream never has a complete request)
//!                  and answers 400
//! trailers ──► dropped (no client-sent field reaches the upstream unchecked)
//! ```
//!
//! Reading ahead is what turns a client's framing mistake into a `400`
//! before the upstream saw a byte. The data is copied into one buffer as it
//! arrives, so a request holds at most the read-ahead bytes (plus one
//! frame) however finely the client splits its body; frames are not kept.
//! It costs that only for bodies that did not say their length, and only
//! while they arrive within the route's `timeout_ms`, during which the
//! request holds its upstream slot as a request being sent does. A client
//! that streams small messages and waits for answers needs
//! `request_read_ahead_bytes = 0`: then the first frame goes upstream at
//! once (and a framing error is always one past the start).

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::http::header::{self, HeaderMap, HeaderValue};
use bytes::BytesMut;
use http_body_util::BodyExt;
use hyper::body::Frame;

/// Why a request body is refused (the `400` answer's message).
pub const MALFORMED: &str = "request body: malformed framing, or the client stopped sending it";
/// The `408` answer's message.
pub const TOO_SLOW: &str = "request body: not received within the route's timeout";

/// The request's transfer coding, checked: `Ok(())` for none or exactly
/// `chunked` (RFC 9112 §6.1: `chunked` must be last; any coding before it
/// is one the gateway would have to decode, or forward still encoded
/// without its label, so it is refused).
pub fn check_transfer_coding(headers: &HeaderMap) -> Result<(), &'static str> {
    let mut codings = headers
        .get_all(header::TRANSFER_ENCODING)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .map(|c| c.trim_ascii())
        .filter(|c| !c.is_empty());
    match (codings.next(), codings.next()) {
        (None, _) => Ok(()),
        (Some(c), None) if c.eq_ignore_ascii_case(b"chunked") => Ok(()),
        _ => Err("Transfer-Encoding: only chunked is accepted"),
    }
}

/// Whether `body` has no length of its own (chunked, or HTTP/2 without
/// `content-length`).
fn unframed(body: &Body) -> bool {
    !hyper::body::Body::is_end_stream(body) && hyper::body::Body::size_hint(body).exact().is_none()
}

/// The body as it goes upstream, and a flag that tells afterwards whether
/// the client's side of it failed (so that the answer is the client's
/// `400`, not the upstream's `502`). `headers` are the upstream request's.
/// The caller bounds the time it takes (the route's timeout).
pub async fn prepare(
    body: Body,
    headers: &mut HeaderMap,
    read_ahead: usize,
) -> Result<(Body, ClientFault), &'static str> {
    let fault = ClientFault::default();
    if !unframed(&body) {
        return Ok((Body::new(Watched::new(body, &fault)), fault));
    }
    let mut body = body;
    let mut ahead = BytesMut::with_capacity(read_ahead.min(16 * 1024));
    loop {
        match body.frame().await {
            // Ended within the read-ahead: sent with its length.
            None => {
                headers.remove(header::TRANSFER_ENCODING);
                headers.insert(header::CONTENT_LENGTH, HeaderValue::from(ahead.len()));
                return Ok((Body::from(ahead.freeze()), fault));
            }
            Some(Err(_)) => return Err(MALFORMED),
            Some(Ok(frame)) => {
                // Trailers are dropped: the body ends with the data.
                if let Ok(data) = frame.into_data() {
                    ahead.extend_from_slice(&data);
                    if ahead.len() > read_ahead {
                        break;
                    }
                }
            }
        }
    }
    Ok((chunked(ahead.freeze(), body, headers, &fault), fault))
}

/// `first`, then the rest of `body` (its data: trailers are dropped), sent
/// chunked.
fn chunked(first: Bytes, body: Body, headers: &mut HeaderMap, fault: &ClientFault) -> Body {
    headers.remove(header::CONTENT_LENGTH);
    headers.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
    let head = futures_util::stream::once(std::future::ready(Ok::<_, axum::Error>(first)));
    let rest = http_body_util::BodyDataStream::new(Body::new(Watched::new(body, fault)));
    let data = futures_util::StreamExt::chain(head, rest);
    Body::from_stream(data)
}

/// Set when the client's body failed while it was being sent upstream.
#[derive(Clone, Default)]
pub struct ClientFault(Arc<AtomicBool>);

impl ClientFault {
    pub fn happened(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

pin_project_lite::pin_project! {
    /// The client's body, noting in its [`ClientFault`] when it fails.
    struct Watched {
        #[pin]
        body: Body,
        fault: ClientFault,
    }
}

impl Watched {
    fn new(body: Body, fault: &ClientFault) -> Watched {
        Watched {
            body,
            fault: fault.clone(),
        }
    }
}

impl hyper::body::Body for Watched {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.project();
        let polled = this.body.poll_frame(cx);
        if let Poll::Ready(Some(Err(_))) = &polled {
            this.fault.0.store(true, Ordering::Relaxed);
        }
        polled
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
    use axum::http::HeaderName;

    fn te(values: &[&'static str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(header::TRANSFER_ENCODING, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn only_a_lone_chunked_coding_is_accepted() {
        assert!(check_transfer_coding(&HeaderMap::new()).is_ok());
        assert!(check_transfer_coding(&te(&["chunked"])).is_ok());
        assert!(check_transfer_coding(&te(&["Chunked "])).is_ok());
        for bad in [
            &["gzip, chunked"][..],
            &["gzip", "chunked"],
            &["chunked, chunked"],
            &["identity"],
            &["chunked, identity"],
            &["xchunked"],
        ] {
            assert!(check_transfer_coding(&te(bad)).is_err(), "{bad:?}");
        }
    }

    fn stream_of(parts: Vec<Result<&'static str, &'static str>>) -> Body {
        let frames = parts.into_iter().map(|p| {
            p.map(|s| Frame::data(Bytes::from_static(s.as_bytes())))
                .map_err(std::io::Error::other)
        });
        Body::new(http_body_util::StreamBody::new(futures_util::stream::iter(
            frames,
        )))
    }

    #[tokio::test]
    async fn a_short_unframed_body_gets_its_length() {
        let mut h = te(&["chunked"]);
        let (body, fault) = prepare(stream_of(vec![Ok("ab"), Ok("cd")]), &mut h, 16)
            .await
            .unwrap();
        assert_eq!(h[header::CONTENT_LENGTH], "4");
        assert!(!h.contains_key(header::TRANSFER_ENCODING));
        assert_eq!(body.collect().await.unwrap().to_bytes(), "abcd");
        assert!(!fault.happened());
    }

    #[tokio::test]
    async fn a_malformed_body_within_the_read_ahead_is_refused() {
        let mut h = te(&["chunked"]);
        let got = prepare(stream_of(vec![Ok("ab"), Err("bad chunk size")]), &mut h, 16).await;
        assert_eq!(got.err(), Some(MALFORMED));
    }

    #[tokio::test]
    async fn tiny_frames_are_held_as_their_bytes_and_trailers_dropped() {
        let mut h = te(&["chunked"]);
        let frames = (0..10_000)
            .map(|_| Ok::<_, std::io::Error>(Frame::data(Bytes::from_static(b"A"))))
            .chain(std::iter::once(Ok(Frame::trailers(HeaderMap::from_iter([(
                HeaderName::from_static("x-auth-subject"),
                HeaderValue::from_static("victim"),
            )])))));
        let body = Body::new(http_body_util::StreamBody::new(futures_util::stream::iter(
            frames,
        )));
        let (body, _) = prepare(body, &mut h, 65_536).await.unwrap();
        assert_eq!(h[header::CONTENT_LENGTH], "10000");
        let collected = body.collect().await.unwrap();
        assert!(collected.trailers().is_none());
        assert_eq!(collected.to_bytes().len(), 10_000);
    }

    #[tokio::test]
    async fn a_long_body_is_streamed_chunked_and_a_later_fault_is_the_clients() {
        let mut h = HeaderMap::new();
        let (body, fault) = prepare(stream_of(vec![Ok("abc"), Ok("def"), Err("bad")]), &mut h, 4)
            .await
            .unwrap();
        assert_eq!(h[header::TRANSFER_ENCODING], "chunked");
        assert!(body.collect().await.is_err());
        assert!(fault.happened());
    }

    #[tokio::test]
    async fn a_body_with_a_length_streams_as_it_is() {
        let mut h = HeaderMap::new();
        let (body, fault) = prepare(Body::from("hello"), &mut h, 0).await.unwrap();
        assert!(h.is_empty());
        assert_eq!(body.collect().await.unwrap().to_bytes(), "hello");
        assert!(!fault.happened());
    }
}
