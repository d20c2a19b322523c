//! Lock files (`flock`): the one way this crate takes them. A lock is held while its file
//! stays open and released when it is closed, also when the holder dies.

use std::fs;
use std::path::Path;

use crate::error::{Error, Result};

fn open(path: &Path) -> Result<fs::File> {
    fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(Error::io("open", path))
}

/// Opens (making it if needed) the lock file `path` and takes its lock, exclusive or
/// shared, waiting for it.
pub fn lock(path: &Path, exclusive: bool) -> Result<fs::File> {
    let f = open(path)?;
    if exclusive { f.lock() } else { f.lock_shared() }.map_err(Error::io("lock", path))?;
    Ok(f)
}

/// [`lock`] without waiting: `None` while another holds a lock that conflicts.
pub fn try_lock(path: &Path, exclusive: bool) -> Result<Option<fs::File>> {
    let f = open(path)?;
    let taken = if exclusive {
        f.try_lock()
    } else {
        f.try_lock_shared()
    };
    match taken {
        Ok(()) => Ok(Some(f)),
        Err(fs::TryLockError::WouldBlock) => Ok(None),
        Err(fs::TryLockError::Error(e)) => Err(Error::io("lock", path)(e)),
    }
}

/// Whether another process holds the lock of the existing file `path` exclusively (no
/// file: nobody does). Creates nothing.
pub fn held_exclusively(path: &Path) -> bool {
    match fs::File::open(path) {
        // A shared lock that cannot be taken means an exclusive one is there; ours is
        // released when `f` is dropped.
        Ok(f) => f.try_lock_shared().is_err(),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exclusive_lock_excludes_and_is_released_on_close() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("l");
        let held = lock(&p, true).unwrap();
        // flock locks belong to the open file: a second open conflicts, as another
        // process's would.
        assert!(try_lock(&p, false).unwrap().is_none());
        assert!(held_exclusively(&p));
        drop(held);
        assert!(!held_exclusively(&p));
        let a = try_lock(&p, false).unwrap().unwrap();
        let b = try_lock(&p, false).unwrap();
        assert!(b.is_some(), "shared locks share");
        assert!(try_lock(&p, true).unwrap().is_none());
        drop((a, b));
        assert!(!held_exclusively(&dir.path().join("missing")));
    }
}
