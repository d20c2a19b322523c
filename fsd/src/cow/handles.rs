//! Open files and directories of a workspace's session: file handles, passthrough
//! backing ids (one per inode while any open of it holds one: the kernel refuses two
//! different backing files for one inode), and the listings of open directories.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use cowspace_store::ContentId;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use fuser::{
    BackingId, Errno, FileHandle, FileType, FopenFlags, Generation, INodeNo, ReplyDirectoryPlus,
    ReplyOpen,
};

use super::fs::{CowFs, TTL, parent_of};
use super::lazy::Pending;
use super::node::Node;
use super::ops::{Listing, errno};

/// What a passthrough backing file is: the same file for every open of an inode, or the
/// kernel refuses the open.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Backing {
    Blob,
    /// An upper file (device, inode) opened read-write, or read-only (`false`).
    Upper(u64, u64, bool),
}

/// A file's copy-up while still in progress (`lazy.rs`).
pub(super) type Copying = Option<Arc<Pending>>;

pub(super) struct Handle {
    pub(super) file: Arc<File>,
    pub(super) _backing: Option<Arc<BackingId>>,
    /// The file's copy-up, still in progress when opened: reads and writes go through it.
    pub(super) pending: Option<Arc<Pending>>,
    /// Opened with `O_APPEND` (writes land at the end whatever the offset).
    pub(super) append: bool,
}

#[derive(Default)]
pub(super) struct Handles {
    pub(super) next: AtomicU64,
    pub(super) files: Mutex<HashMap<u64, Handle>>,
    pub(super) backing: Mutex<HashMap<u64, (Backing, Weak<BackingId>)>>,
    /// Files kept open for I/O by inode (the cached open mode, `cached.rs`).
    pub(super) by_inode: Mutex<HashMap<u64, super::cached::InodeFile>>,
    /// Serialises copies of deleted files (`cached.rs`).
    pub(super) orphans: Mutex<()>,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl CowFs {
    /// The backing id for an open of `ino` on `file`, or `None` when the inode's live
    /// backing is another file (then the open is served by the daemon).
    pub(super) fn backing(
        &self,
        ino: u64,
        what: Backing,
        file: &File,
        register: impl FnOnce(&File) -> std::io::Result<BackingId>,
    ) -> Option<Arc<BackingId>> {
        if !self.passthrough.load(Ordering::Relaxed) {
            return None;
        }
        let mut map = lock(&self.handles.backing);
        if let Some((w, weak)) = map.get(&ino)
            && let Some(id) = weak.upgrade()
        {
            return (*w == what).then_some(id);
        }
        match register(file) {
            Ok(id) => {
                let id = Arc::new(id);
                map.insert(ino, (what, Arc::downgrade(&id)));
                Some(id)
            }
            Err(e) => {
                tracing::warn!(ino, error = %e, "passthrough refused; the daemon serves this open");
                None
            }
        }
    }

    /// The file a passthrough backing of an upper file is registered with: read-write when
    /// possible, so every later open of the inode may share it.
    pub(super) fn upper_backing_file(path: &Path) -> Option<(File, bool)> {
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
        {
            Ok(f) => Some((f, true)),
            Err(_) => std::fs::File::open(path).ok().map(|f| (f, false)),
        }
    }

    pub(super) fn open_node(
        &self,
        node: &Node,
        flags: i32,
    ) -> Result<(u64, Arc<File>, Copying), Errno> {
        let write = flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
        if node.upper.is_none() && !write {
            let e = node.lower.as_ref().ok_or(Errno::EIO)?;
            let content = ContentId::from_bytes(e.hash);
            let file = self.cow.layers.open_blob(&content, e.size).map_err(|e| {
                tracing::warn!(ino = node.ino, error = %e, "cannot open a blob");
                errno(e)
            })?;
            return Ok((node.ino, Arc::new(file), None));
        }
        let (node, file, pending) = self.cow.open_upper(node, flags)?;
        Ok((node.ino, Arc::new(file), pending))
    }

    pub(super) fn add_handle(
        &self,
        file: Arc<File>,
        backing: Option<Arc<BackingId>>,
        pending: Option<Arc<Pending>>,
        flags: i32,
    ) -> u64 {
        let fh = self.next();
        lock(&self.handles.files).insert(
            fh,
            Handle {
                file,
                _backing: backing,
                pending,
                append: flags & libc::O_APPEND != 0,
            },
        );
        fh
    }

    pub(super) fn handle_file(&self, fh: u64) -> Result<Arc<File>, Errno> {
        lock(&self.handles.files)
            .get(&fh)
            .map(|h| Arc::clone(&h.file))
            .ok_or(Errno::EBADF)
    }

    /// The file of handle `fh`, its copy-up if still in progress, and whether it appends.
    pub(super) fn handle_io(&self, fh: u64) -> Result<(Arc<File>, Copying, bool), Errno> {
        lock(&self.handles.files)
            .get(&fh)
            .map(|h| {
                let pending = h.pending.clone().filter(|p| !p.is_complete());
                (Arc::clone(&h.file), pending, h.append)
            })
            .ok_or(Errno::EBADF)
    }

    /// Directory `ino` and its listing.
    pub(super) fn dir_listing(&self, ino: u64) -> Result<(Node, Arc<Listing>), Errno> {
        let node = self.cow.table.get(ino)?;
        if node.kind != FileType::Directory {
            return Err(Errno::ENOTDIR);
        }
        let listing = self.cow.listing(&node)?;
        Ok((node, listing))
    }

    pub(super) fn what_backs(&self, node: &Node, file: &File) -> Result<Backing, Errno> {
        if node.upper.is_none() {
            return Ok(Backing::Blob);
        }
        let m = file.metadata().map_err(errno)?;
        Ok(Backing::Upper(m.dev(), m.ino(), true))
    }

    /// `readdirplus`: entries with their attributes, each (but `.` and `..`) taking a
    /// lookup as `lookup` would.
    pub(super) fn do_readdirplus(&self, ino: INodeNo, offset: u64, mut reply: ReplyDirectoryPlus) {
        let (node, listing) = match self.dir_listing(ino.0) {
            Ok(x) => x,
            Err(e) => return reply.error(e),
        };
        // "." and ".." take no lookup in the kernel; every other entry takes one. (The
        // directory's attributes only for a read from the start: half of a walk's reads
        // are the empty one that ends a directory.)
        if offset < 2 {
            let dir_attr = match self.cow.attr(&node) {
                Ok(a) => a,
                Err(e) => return reply.error(e),
            };
            for i in offset..2 {
                let mut a = dir_attr;
                let full = if i == 0 {
                    reply.add(a.ino, 1, ".", &TTL, &a, Generation(0))
                } else {
                    a.ino = INodeNo(parent_of(&node));
                    reply.add(a.ino, 2, "..", &TTL, &a, Generation(0))
                };
                if full {
                    return reply.ok();
                }
            }
        }
        let mut added_any = offset < 2;
        let lookups = match self.cow.lookups_in(&node) {
            Ok(l) => l,
            Err(e) => return reply.error(e),
        };
        for (off, e) in listing.after(offset) {
            // The name as it is now (it may have changed since the listing was taken).
            let child = match lookups.lookup(&e.name) {
                Ok(Some(c)) => c,
                Ok(None) => continue,
                Err(err) if !added_any => return reply.error(err),
                Err(_) => break,
            };
            let attr = match self.cow.attr(&child) {
                Ok(a) => a,
                Err(err) => {
                    self.cow.table.forget(child.ino, 1);
                    if !added_any {
                        return reply.error(err);
                    }
                    break;
                }
            };
            let full = reply.add(
                attr.ino,
                *off,
                OsStr::from_bytes(&e.name),
                &TTL,
                &attr,
                Generation(0),
            );
            if full {
                // Not sent: give the lookup back.
                self.cow.table.forget(child.ino, 1);
                break;
            }
            added_any = true;
        }
        reply.ok();
    }

    /// An open in the passthrough mode: a handle backed by the blob or upper file
    /// (passthrough), else served by the daemon with direct I/O.
    pub(super) fn open_with_handle(&self, ino: u64, flags: i32, reply: ReplyOpen) {
        let node = match self.cow.table.get(ino) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        if node.kind == FileType::Directory {
            return reply.error(Errno::EISDIR);
        }
        let (ino, file, pending) = match self.open_node(&node, flags) {
            Ok(x) => x,
            Err(e) => return reply.error(e),
        };
        let node = self.cow.table.get(ino).unwrap_or(node);
        let what = match self.what_backs(&node, &file) {
            Ok(w) => w,
            Err(e) => return reply.error(e),
        };
        let backing = match what {
            // Never passed through to a file still being copied up.
            _ if pending.is_some() => None,
            Backing::Blob => self.backing(ino, what, &file, |f| reply.open_backing(f)),
            Backing::Upper(..) => match self
                .cow
                .upper_of(&node)
                .ok()
                .and_then(|p| Self::upper_backing_file(&p))
            {
                Some((bf, rw)) => {
                    let Backing::Upper(d, i, _) = what else {
                        unreachable!()
                    };
                    self.backing(ino, Backing::Upper(d, i, rw), &bf, |f| {
                        reply.open_backing(f)
                    })
                    .filter(|_| rw || flags & libc::O_ACCMODE == libc::O_RDONLY)
                }
                None => None,
            },
        };
        match backing {
            Some(id) => {
                let fh = self.add_handle(file, Some(Arc::clone(&id)), None, flags);
                reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), &id);
            }
            None => {
                let fh = self.add_handle(file, None, pending, flags);
                reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO);
            }
        }
    }
}
