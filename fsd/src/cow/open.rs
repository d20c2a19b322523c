//! Opens in the passthrough open mode ([`super::OpenMode::Passthrough`]): a handle
//! backed by the blob-cache file or the upper file (FUSE passthrough), else served by the
//! daemon with direct I/O; `create` makes the file and opens it so.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use cowspace_store::ContentId;

use super::fs::CowFs;
use super::handles::Copying;
use super::namespace::Make;
use super::node::Node;
use crate::filesystem::{Attr, Backing, BackingKey, Context, Errno, FileKind, Opened, errno_of_io};

/// The key of a blob's backing: every open of an unmodified file offers the same blob.
const BLOB_KEY: BackingKey = (0, 0, 0);

/// The key of an upper file's backing: its device and inode, opened read-write or not.
fn upper_key(m: &std::fs::Metadata, rw: bool) -> BackingKey {
    (m.dev(), m.ino(), 1 + u64::from(rw))
}

/// An open answered by the daemon's own I/O (no page cache: a passthrough open of the
/// same inode may write beside it), or passed through to `backing`.
fn opened(fh: u64, backing: Option<Backing>) -> Opened {
    Opened {
        fh,
        keep_cache: false,
        direct_io: true,
        no_flush: false,
        backing,
    }
}

impl CowFs {
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

    /// The backing an open of `node` (opened with `flags`) offers: read-write when it
    /// can be, so every later open of the inode may share it.
    fn upper_backing(&self, node: &Node, flags: i32) -> Option<Backing> {
        let (file, rw) = self
            .cow
            .upper_of(node)
            .ok()
            .and_then(|p| Self::upper_backing_file(&p))?;
        if !rw && flags & libc::O_ACCMODE != libc::O_RDONLY {
            return None;
        }
        let key = upper_key(&file.metadata().ok()?, rw);
        Some(Backing {
            file: Arc::new(file),
            key,
        })
    }

    /// An open in the passthrough mode: a handle backed by the blob or upper file
    /// (passthrough), else served by the daemon with direct I/O.
    pub(super) fn open_with_handle(&self, ino: u64, flags: i32) -> Result<Opened, Errno> {
        let node = self.cow.table.get(ino)?;
        if node.kind == FileKind::Directory {
            return Err(Errno::EISDIR);
        }
        let (ino, file, pending) = self.open_node(&node, flags)?;
        let node = self.cow.table.get(ino).unwrap_or(node);
        let backing = if !self.passthrough.load(Ordering::Relaxed) || pending.is_some() {
            // Never passed through to a file still being copied up.
            None
        } else if node.upper.is_none() {
            Some(Backing {
                file: Arc::clone(&file),
                key: BLOB_KEY,
            })
        } else {
            self.upper_backing(&node, flags)
        };
        let fh = self.handles.add(file, pending, flags);
        Ok(opened(fh, backing))
    }

    /// `create` in the passthrough mode: `name` made in `parent` as a file of `mode`
    /// (owned by the requester) and opened with `flags`.
    pub(super) fn create_open(
        &self,
        ctx: &Context,
        parent: u64,
        name: &[u8],
        mode: u32,
        flags: i32,
    ) -> Result<(Attr, Opened), Errno> {
        let node = self
            .cow
            .make(parent, name, Make::File { mode }, ctx.uid, ctx.gid)?;
        let attr = self.cow.attr(&node)?;
        let file = Arc::new(self.cow.open_upper(&node, flags & !libc::O_TRUNC)?.1);
        let backing = if self.passthrough.load(Ordering::Relaxed) {
            // Read-write only: the new file is written through this open.
            self.upper_backing(&node, libc::O_RDWR)
        } else {
            None
        };
        let fh = self.handles.add(file, None, flags);
        Ok((attr, opened(fh, backing)))
    }
}
