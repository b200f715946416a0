//! What one serving thread's handlers see ([`Worker`]): the shared state,
//! the thread's own pool of upstream connections and its share of the cap
//! on upstream requests open ([`UpstreamSlots`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::body::Body;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;

use super::state::GatewayState;
use crate::limits::Limiter;

pub(super) type UpstreamClient = Client<HttpConnector, Body>;

/// What one serving thread's handlers see: the shared state and this
/// thread's own upstream pool (connections stay on the thread that made them).
pub(crate) struct Worker {
    pub gw: Arc<GatewayState>,
    pub client: UpstreamClient,
    /// With Redis buckets: the shared limiter over this thread's own Redis connection.
    pub limiter: Option<Limiter>,
    /// This thread's upstream requests open, and its share of the cap.
    pub upstream: UpstreamSlots,
}

impl Worker {
    pub fn limiter(&self) -> &Limiter {
        self.limiter.as_ref().unwrap_or(&self.gw.limiter)
    }
}

/// One serving thread's upstream requests open (from sending until the
/// answer's body ends or is dropped) and its share of
/// `upstream.max_requests`. Without a cap each client connection could
/// hold up to 100 upstream requests (its HTTP/2 streams, each sending a
/// body slowly or leaving an answer unread), and `max_connections` of them
/// a million upstream sockets: past the process's file limit, and likely
/// past what the upstreams accept.
pub(crate) struct UpstreamSlots {
    open: Arc<AtomicUsize>,
    cap: usize,
}

impl UpstreamSlots {
    /// This thread's share when `threads` serving threads split `max_requests`.
    pub fn share(max_requests: usize, threads: usize) -> UpstreamSlots {
        UpstreamSlots {
            open: Arc::new(AtomicUsize::new(0)),
            cap: max_requests.div_ceil(threads.max(1)).max(1),
        }
    }

    pub(super) fn take(&self) -> Option<Arc<UpstreamSlot>> {
        if self.open.fetch_add(1, Ordering::AcqRel) >= self.cap {
            self.open.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Arc::new(UpstreamSlot(self.open.clone())))
    }
}

/// An open upstream request, shared by its request body (while one is
/// being sent) and its answer's body; when both are dropped, its slot is
/// free again.
pub(super) struct UpstreamSlot(Arc<AtomicUsize>);

impl Drop for UpstreamSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}
