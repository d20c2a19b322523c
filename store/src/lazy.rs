//! What the store holds of its network side: the [`RemoteFetch`] a caller registers and
//! the lazy fetches under way. A leaf: the store keeps a [`LazyState`] and the remote
//! module (`remote/`) does the fetching.

use std::collections::HashSet;
use std::ops::Range;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar, Mutex, RwLock};

/// Reads byte ranges of objects on remotes (the network side, outside the store).
pub trait RemoteFetch: Send + Sync {
    /// The bytes of `ranges` of object `key` on remote `remote`, in the order asked.
    /// An error says why in words (the store names the remote and the object).
    fn get_ranges(
        &self,
        remote: &str,
        key: &str,
        ranges: &[Range<u64>],
    ) -> std::result::Result<Vec<Vec<u8>>, String>;
}

/// The fetcher and the fetches under way, per open store.
#[derive(Default)]
pub(crate) struct LazyState {
    pub(crate) fetcher: RwLock<Option<Arc<dyn RemoteFetch>>>,
    /// Whether the index has any remote object rows (no lookup on reads otherwise).
    pub(crate) any: AtomicBool,
    pub(crate) checked_at: Mutex<Option<std::time::Instant>>,
    pub(crate) inflight: Mutex<HashSet<[u8; 32]>>,
    pub(crate) done: Condvar,
}
