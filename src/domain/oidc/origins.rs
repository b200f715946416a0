//! The origins browser applications registered for CORS (docs/oidc.md,
//! `--allowed-origin`), kept in memory: a request with an `Origin` header
//! costs a set lookup, not a read of every client (which a flood of such
//! requests would turn into load on the database). The set is read again
//! at most once a second per instance, by one request while the others
//! wait for it; a change of this instance's clients forgets it at once,
//! another instance's is seen within the second. A read that fails keeps
//! the last set (or none) for the second, so a database in trouble is
//! asked once a second, not once per waiting request.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::client::ClientSettings;
use crate::store::Store;

/// How long a read of the clients' origins answers.
const FRESH_FOR: Duration = Duration::from_secs(1);

pub struct ClientOrigins {
    store: Store,
    cached: Mutex<Option<(Instant, Arc<HashSet<String>>)>>,
    /// Held by the one request that reads the clients again.
    reading: tokio::sync::Mutex<()>,
    /// Moves at each [`ClientOrigins::forget`]: a read that began before
    /// a change does not store what it read.
    generation: AtomicU64,
    /// Reads of the clients so far (for tests).
    reads: AtomicU64,
}

impl ClientOrigins {
    pub fn new(store: Store) -> ClientOrigins {
        ClientOrigins {
            store,
            cached: Mutex::new(None),
            reading: tokio::sync::Mutex::new(()),
            generation: AtomicU64::new(0),
            reads: AtomicU64::new(0),
        }
    }

    /// Whether some client registered `origin`. A database that cannot be
    /// read allows nothing (the browser then refuses the call).
    pub async fn allows(&self, origin: &str) -> bool {
        if let Some(set) = self.fresh() {
            return set.contains(origin);
        }
        let _reading = self.reading.lock().await;
        if let Some(set) = self.fresh() {
            return set.contains(origin);
        }
        let (started, generation) = (Instant::now(), self.generation.load(Ordering::SeqCst));
        self.reads.fetch_add(1, Ordering::Relaxed);
        let set = match self.store.clients().await {
            Ok(clients) => Arc::new(
                clients
                    .iter()
                    .filter_map(|c| c.oidc.as_deref().and_then(ClientSettings::from_json))
                    .flat_map(|s| s.allowed_origins)
                    .map(|o| o.trim_end_matches('/').to_string())
                    .collect::<HashSet<String>>(),
            ),
            // The last set read, or none: for a second, not per request.
            Err(_) => match &*self.cached.lock().expect("origins") {
                Some((_, last)) => last.clone(),
                None => Arc::new(HashSet::new()),
            },
        };
        let mut cached = self.cached.lock().expect("origins");
        if self.generation.load(Ordering::SeqCst) == generation {
            // Stamped with the read's start: never fresher than what it saw.
            *cached = Some((started, set.clone()));
        }
        set.contains(origin)
    }

    /// This instance's clients changed: the next request reads them again.
    pub fn forget(&self) {
        let mut cached = self.cached.lock().expect("origins");
        self.generation.fetch_add(1, Ordering::SeqCst);
        *cached = None;
    }

    /// How many times the clients were read (for tests).
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    fn fresh(&self) -> Option<Arc<HashSet<String>>> {
        match &*self.cached.lock().expect("origins") {
            Some((at, set)) if at.elapsed() < FRESH_FOR => Some(set.clone()),
            _ => None,
        }
    }
}
