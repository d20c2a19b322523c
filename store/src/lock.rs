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
            match file.try_lock() {
                Ok(()) => {}
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(Error::Busy("an import or another gc is running".into()));
                }
                Err(std::fs::TryLockError::Error(e)) => {
                    return Err(Error::io("lock store", store.layout().lock())(e));
                }
            }
        }
        Ok(StoreLock { _file: file })
    }
}
