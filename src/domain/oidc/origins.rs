//! The origins browser applications registered for CORS (docs/oidc.md,
//! `--allowed-origin`), kept in memory: a request with an `Origin` header
//! costs a set lookup, not a read of every client (which a flood of such
//! requests would turn into load on the database). The set is read again
//! at most once a second per instance, by one request while the others
//! wait for it; a change of this instance's clients forgets it at once,
//! another instance's is seen within the second.

use std::collections::HashSet;
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
}

impl ClientOrigins {
    pub fn new(store: Store) -> ClientOrigins {
        ClientOrigins {
            store,
            cached: Mutex::new(None),
            reading: tokio::sync::Mutex::new(()),
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
        let Ok(clients) = self.store.clients().await else {
            return false;
        };
        let set: HashSet<String> = clients
            .iter()
            .filter_map(|c| c.oidc.as_deref().and_then(ClientSettings::from_json))
            .flat_map(|s| s.allowed_origins)
            .map(|o| o.trim_end_matches('/').to_string())
            .collect();
        let set = Arc::new(set);
        *self.cached.lock().expect("origins") = Some((Instant::now(), set.clone()));
        set.contains(origin)
    }

    /// This instance's clients changed: the next request reads them again.
    pub fn forget(&self) {
        *self.cached.lock().expect("origins") = None;
    }

    fn fresh(&self) -> Option<Arc<HashSet<String>>> {
        match &*self.cached.lock().expect("origins") {
            Some((at, set)) if at.elapsed() < FRESH_FOR => Some(set.clone()),
            _ => None,
        }
    }
}
