//! Open files of a workspace's session: file handles, and the files kept open for I/O by
//! inode in the cached open mode.

use std::collections::HashMap;
use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::filesystem::Errno;

use super::lazy::Pending;
use crate::filesystem::lock;

/// A file's copy-up while still in progress (`lazy/`).
pub(super) type Copying = Option<Arc<Pending>>;

pub(super) struct Handle {
    file: Arc<File>,
    /// The file's copy-up, still in progress when opened: reads and writes go through it.
    pending: Option<Arc<Pending>>,
    /// Opened with `O_APPEND` (writes land at the end whatever the offset).
    append: bool,
}

/// The file I/O of one inode goes to in the cached open mode, and which it is.
pub(super) struct InodeFile {
    /// The upper file (opened read-write when possible), else the blob.
    pub(super) upper: bool,
    pub(super) file: Arc<File>,
}

#[derive(Default)]
pub(super) struct Handles {
    next: AtomicU64,
    files: Mutex<HashMap<u64, Handle>>,
    /// Files kept open for I/O by inode (the cached open mode, `cached.rs`).
    pub(super) by_inode: Mutex<HashMap<u64, InodeFile>>,
    /// Serialises copies of deleted files (`cached.rs`).
    pub(super) orphans: Mutex<()>,
}

impl Handles {
    /// A new handle of `file` (opened with `flags`), going through `pending` while that
    /// copy-up is in progress.
    pub(super) fn add(&self, file: Arc<File>, pending: Option<Arc<Pending>>, flags: i32) -> u64 {
        let fh = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        lock(&self.files).insert(
            fh,
            Handle {
                file,
                pending,
                append: flags & libc::O_APPEND != 0,
            },
        );
        fh
    }

    /// The file of handle `fh`.
    pub(super) fn file(&self, fh: u64) -> Result<Arc<File>, Errno> {
        lock(&self.files)
            .get(&fh)
            .map(|h| Arc::clone(&h.file))
            .ok_or(Errno::EBADF)
    }

    /// The file of handle `fh`, its copy-up if still in progress, and whether it appends.
    pub(super) fn io(&self, fh: u64) -> Result<(Arc<File>, Copying, bool), Errno> {
        lock(&self.files)
            .get(&fh)
            .map(|h| {
                let pending = h.pending.clone().filter(|p| !p.is_complete());
                (Arc::clone(&h.file), pending, h.append)
            })
            .ok_or(Errno::EBADF)
    }

    /// Handle `fh` is released.
    pub(super) fn release(&self, fh: u64) {
        let released = lock(&self.files).remove(&fh);
        drop(released);
    }
}
