//! Opens in the passthrough open mode ([`super::OpenMode::Passthrough`]): a handle
//! backed by the blob-cache file or the upper file (FUSE passthrough), else served by the
//! daemon with direct I/O; `create` makes the file and opens it so.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use cowspace_store::ContentId;
use fuser::{
    BackingId, Errno, FileHandle, FileType, FopenFlags, Generation, ReplyCreate, ReplyOpen, Request,
};

use super::fs::CowFs;
use super::handles::{Backing, Copying};
use super::namespace::Make;
use super::node::Node;
use crate::fusecore::{TTL, errno_of_io, lock};

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
                errno_of_io(e)
            })?;
            return Ok((node.ino, Arc::new(file), None));
        }
        let (node, file, pending) = self.cow.open_upper(node, flags)?;
        Ok((node.ino, Arc::new(file), pending))
    }

    pub(super) fn what_backs(&self, node: &Node, file: &File) -> Result<Backing, Errno> {
        if node.upper.is_none() {
            return Ok(Backing::Blob);
        }
        let m = file.metadata().map_err(errno_of_io)?;
        Ok(Backing::Upper(m.dev(), m.ino(), true))
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
                let fh = self.handles.add(file, Some(Arc::clone(&id)), None, flags);
                reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), &id);
            }
            None => {
                let fh = self.handles.add(file, None, pending, flags);
                reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO);
            }
        }
    }

    /// `create` in the passthrough mode: `name` made in `parent` as a file of `mode`
    /// (owned by the requester) and opened with `flags`.
    pub(super) fn create_open(
        &self,
        req: &Request,
        parent: u64,
        name: &[u8],
        mode: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let made = self
            .cow
            .make(parent, name, Make::File { mode }, req.uid(), req.gid());
        let node = match made {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let attr = match self.cow.attr(&node) {
            Ok(a) => a,
            Err(e) => return reply.error(e),
        };
        let file = match self.cow.open_upper(&node, flags & !libc::O_TRUNC) {
            Ok((_, f, _)) => Arc::new(f),
            Err(e) => return reply.error(e),
        };
        let backing = self
            .cow
            .upper_of(&node)
            .ok()
            .and_then(|p| Self::upper_backing_file(&p))
            .and_then(|(bf, rw)| {
                let m = bf.metadata().ok()?;
                self.backing(node.ino, Backing::Upper(m.dev(), m.ino(), rw), &bf, |f| {
                    reply.open_backing(f)
                })
                .filter(|_| rw)
            });
        match backing {
            Some(id) => {
                let fh = self.handles.add(file, Some(Arc::clone(&id)), None, flags);
                reply.created_passthrough(
                    &TTL,
                    &attr,
                    Generation(0),
                    FileHandle(fh),
                    FopenFlags::empty(),
                    &id,
                );
            }
            None => {
                let fh = self.handles.add(file, None, None, flags);
                reply.created(
                    &TTL,
                    &attr,
                    Generation(0),
                    FileHandle(fh),
                    FopenFlags::FOPEN_DIRECT_IO,
                );
            }
        }
    }
}
