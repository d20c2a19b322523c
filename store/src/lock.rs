//! The store lock: imports and other writers hold it shared, `gc` exclusive, so gc never
//! deletes an object that a running import has just found stored and is relying on.

use std::fs::{File, OpenOptions};

use crate::error::{Error, Result};
use crate::store::Store;

/// A held store lock; released on drop.
#[derive(Debug)]
pub struct StoreLock {
    _file: File,
}

impl StoreLock {
    fn open(store: &Store) -> Result<File> {
        let path = store.layout().lock();
        OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(Error::io("open store lock", path))
    }

    /// Shared: many writers at once, no gc.
    pub fn shared(store: &Store) -> Result<StoreLock> {
        let file = StoreLock::open(store)?;
        file.lock_shared()
            .map_err(Error::io("lock store", store.layout().lock()))?;
        Ok(StoreLock { _file: file })
    }

    /// Exclusive: for gc. Fails with `Busy` instead of waiting when `wait` is false.
    pub fn exclusive(store: &Store, wait: bool) -> Result<StoreLock> {
        let file = StoreLock::open(store)?;
        if wait {
            file.lock()
                .map_err(Error::io("lock store", store.layout().lock()))?;
        } else {
            let mut tries = 0;
            loop {
                match file.try_lock() {
                    Ok(()) => break,
                    Err(std::fs::TryLockError::WouldBlock) if tries < RELEASE_RETRIES => {
                        tries += 1;
                        std::thread::sleep(RELEASE_PAUSE);
                    }
                    Err(std::fs::TryLockError::WouldBlock) => {
                        return Err(Error::Busy("an import or another gc is running".into()));
                    }
                    Err(std::fs::TryLockError::Error(e)) => {
                        return Err(Error::io("lock store", store.layout().lock())(e));
                    }
                }
            }
        }
        Ok(StoreLock { _file: file })
    }
}

/// How long a non-waiting exclusive lock keeps trying before it says `Busy`: 40 × 5 ms.
///
/// A `flock` belongs to the open file description, and `fork` copies the descriptor into
/// the child, where it lives until the child's `exec` closes it (`O_CLOEXEC`). So a lock
/// this process has just released can still be held, for the moment between a fork and
/// an exec, by a child another thread is starting (`git`, `tar`, a helper). A real holder,
/// an import, holds it far longer than this, and still gets `Busy`.
const RELEASE_RETRIES: u32 = 40;
const RELEASE_PAUSE: std::time::Duration = std::time::Duration::from_millis(5);
