//! The snapshot view as a [`FileSystem`]: requests become [`ViewCore`] calls. Every
//! change is `EROFS` (the trait's defaults); reading xattrs is `ENOSYS` in the plain view
//! (see [`super::plain`]).

use std::collections::HashMap;
use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cowspace_store::Tree;

use super::ReadMode;
use super::core::{VIEW_BLKSIZE_BYTES, ViewCore};
use super::inode::{Node, NodeKind};
use crate::filesystem::{
    Attr, Backing, Context, DirPlusSink, DirSink, Errno, Features, FileKind, FileSystem, Listings,
    NAME_MAX_BYTES, Opened, StatFs, errno_of_blob_io, kind_file_type, lock,
};

/// An open file: a blob fd (passed through to the kernel when it takes passthrough), or
/// chunks read by range.
enum OpenFile {
    Plain(Arc<File>),
    /// A large file still partly on a remote, read by range ([`ViewCore::remote_chunks`]).
    Chunked(Arc<super::core::Chunked>),
}

/// Where a read's bytes come from.
enum Source {
    Blob(Arc<File>),
    Chunks(Arc<super::core::Chunked>),
}

/// Blob-cache files kept open for [`ReadMode::Cached`] reads, which carry no handle.
const OPEN_BLOBS_MAX: usize = 256;

#[derive(Default)]
struct Handles {
    next: AtomicU64,
    files: Mutex<HashMap<u64, OpenFile>>,
    /// By inode, for reads without a handle ([`ReadMode::Cached`]); cleared when full.
    blobs: Mutex<HashMap<u64, Arc<File>>>,
    /// By inode, for reads without a handle: the files read by range; cleared when full.
    lazy: Mutex<HashMap<u64, Arc<super::core::Chunked>>>,
}

impl Handles {
    fn next(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// The snapshot view a server serves.
pub struct ViewFs {
    core: Arc<ViewCore>,
    handles: Handles,
    mode: ReadMode,
}

impl ViewFs {
    pub fn new(core: Arc<ViewCore>, mode: ReadMode) -> ViewFs {
        ViewFs {
            core,
            handles: Handles::default(),
            mode,
        }
    }

    /// The blob-cache file of a file node, for a read that came without a handle.
    /// For reads without a handle: the blob file of `ino`, or its chunks when it is read
    /// by range ([`ViewCore::remote_chunks`]); each found once per inode.
    fn source_of(&self, ino: u64) -> Result<Source, Errno> {
        if let Some(f) = lock(&self.handles.blobs).get(&ino) {
            return Ok(Source::Blob(Arc::clone(f)));
        }
        if let Some(c) = lock(&self.handles.lazy).get(&ino) {
            return Ok(Source::Chunks(Arc::clone(c)));
        }
        let node = self.core.node(ino)?;
        if let NodeKind::File { content } = &node.kind
            && let Some(c) = self.core.remote_chunks(content)?
        {
            let mut lazy = lock(&self.handles.lazy);
            if lazy.len() >= OPEN_BLOBS_MAX {
                lazy.clear();
            }
            lazy.insert(ino, Arc::clone(&c));
            return Ok(Source::Chunks(c));
        }
        self.blob_of(ino).map(Source::Blob)
    }

    fn blob_of(&self, ino: u64) -> Result<Arc<File>, Errno> {
        if let Some(f) = lock(&self.handles.blobs).get(&ino) {
            return Ok(Arc::clone(f));
        }
        let node = self.core.node(ino)?;
        let NodeKind::File { content } = &node.kind else {
            return Err(Errno::EISDIR);
        };
        let f = Arc::new(self.core.open_blob(content)?);
        let mut blobs = lock(&self.handles.blobs);
        if blobs.len() >= OPEN_BLOBS_MAX {
            blobs.clear();
        }
        blobs.insert(ino, Arc::clone(&f));
        Ok(f)
    }

    /// A directory node and its tree (none for the mount root, which lists nothing).
    /// Trees never change, so every call lists the same entries at the same offsets.
    fn listing(&self, ino: u64) -> Result<(Arc<Node>, Option<Arc<Tree>>), Errno> {
        let node = self.core.node(ino)?;
        let tree = match &node.kind {
            NodeKind::Root => None,
            NodeKind::Dir { .. } => Some(self.core.tree(&node)?),
            _ => return Err(Errno::ENOTDIR),
        };
        Ok((node, tree))
    }

    fn passthrough(&self) -> bool {
        self.core.counters.passthrough.load(Ordering::Relaxed)
    }

    /// The node whose extended attributes are asked for; `ENOSYS` on the plain view,
    /// which the kernel remembers per connection and asks no more (for `listxattr` too:
    /// a name listed but not readable would fail overlay copy-ups).
    fn xattr_node(&self, ino: u64) -> Result<Arc<Node>, Errno> {
        self.core
            .counters
            .xattr_requests
            .fetch_add(1, Ordering::Relaxed);
        if !self.core.xattrs {
            return Err(Errno::ENOSYS);
        }
        self.core.node(ino)
    }
}

impl FileSystem for ViewFs {
    fn features(&self) -> Features {
        Features {
            listings: Listings::PlusAuto,
            atomic_o_trunc: false,
            direct_io_mmap: false,
            passthrough: self.mode == ReadMode::Passthrough,
        }
    }

    fn passthrough_taken(&self, taken: bool) {
        self.core
            .counters
            .passthrough
            .store(taken, Ordering::Relaxed);
    }

    fn lookup(&self, _ctx: &Context, parent: u64, name: &[u8]) -> Result<Option<Attr>, Errno> {
        Ok(self
            .core
            .lookup(parent, name)?
            .map(|node| self.core.attr(&node)))
    }

    fn forget(&self, ino: u64, n: u64) {
        self.core.forget(ino, n);
    }

    fn getattr(&self, _ctx: &Context, ino: u64) -> Result<Attr, Errno> {
        Ok(self.core.attr(&*self.core.node(ino)?))
    }

    fn readlink(&self, _ctx: &Context, ino: u64) -> Result<Vec<u8>, Errno> {
        match &self.core.node(ino)?.kind {
            NodeKind::Symlink { target } => Ok(target.to_vec()),
            _ => Err(Errno::EINVAL),
        }
    }

    fn open(&self, _ctx: &Context, ino: u64, flags: i32) -> Result<Opened, Errno> {
        if flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
            return Err(Errno::EROFS);
        }
        let node = self.core.node(ino)?;
        let content = match &node.kind {
            NodeKind::File { content } => *content,
            NodeKind::Root | NodeKind::Dir { .. } => return Err(Errno::EISDIR),
            _ => return Err(Errno::EINVAL),
        };
        self.core.counters.opens.fetch_add(1, Ordering::Relaxed);
        // Nothing to flush on close of a read-only file.
        let opened = |fh, backing| Opened {
            fh,
            keep_cache: true,
            direct_io: false,
            no_flush: true,
            backing,
        };
        if let Some(c) = self.core.remote_chunks(&content)? {
            let fh = self.handles.next();
            lock(&self.handles.files).insert(fh, OpenFile::Chunked(c));
            return Ok(opened(fh, None));
        }
        if self.mode == ReadMode::Cached {
            // "Not implemented": from now on the kernel opens and closes the view's files
            // without asking, and keeps their pages cached between opens (its default
            // for such opens). This open goes on the same way.
            return Err(Errno::ENOSYS);
        }
        let file = Arc::new(self.core.open_blob(&content)?);
        let fh = self.handles.next();
        lock(&self.handles.files).insert(fh, OpenFile::Plain(Arc::clone(&file)));
        // Every open of an inode offers the same blob: one key.
        let backing = self.passthrough().then(|| Backing {
            file,
            key: (0, 0, 0),
        });
        Ok(opened(fh, backing))
    }

    fn passed_through(&self, _ino: u64) {
        self.core
            .counters
            .passthrough_opens
            .fetch_add(1, Ordering::Relaxed);
    }

    fn read(
        &self,
        _ctx: &Context,
        ino: u64,
        fh: u64,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, Errno> {
        self.core.counters.reads.fetch_add(1, Ordering::Relaxed);
        let held = match lock(&self.handles.files).get(&fh) {
            Some(OpenFile::Plain(f)) => Some(Source::Blob(Arc::clone(f))),
            Some(OpenFile::Chunked(c)) => Some(Source::Chunks(Arc::clone(c))),
            None => None,
        };
        let source = match held {
            Some(s) => s,
            // Opens carry no handle in `Cached` mode.
            None if fh == 0 => self.source_of(ino)?,
            None => return Err(Errno::EBADF),
        };
        let n = match source {
            Source::Blob(file) => crate::blobfiles::read_full_at(&file, buf, offset)
                .map_err(|e| errno_of_blob_io("read blob", e))?,
            Source::Chunks(c) => {
                let size = u32::try_from(buf.len()).unwrap_or(u32::MAX);
                let data = self.core.read_chunked(&c, offset, size)?;
                let n = data.len().min(buf.len());
                buf[..n].copy_from_slice(&data[..n]);
                n
            }
        };
        self.core
            .counters
            .read_bytes
            .fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }

    fn release(&self, _ino: u64, fh: u64) {
        lock(&self.handles.files).remove(&fh);
    }

    fn readdir(
        &self,
        _ctx: &Context,
        ino: u64,
        offset: u64,
        out: &mut dyn DirSink,
    ) -> Result<(), Errno> {
        let (node, tree) = self.listing(ino)?;
        // Index 0 is ".", 1 is "..", 2.. the tree's entries; an entry's offset is the
        // index of the next one.
        let entries = tree.as_ref().map_or(&[][..], |t| &t.entries[..]);
        for i in offset..2 + entries.len() as u64 {
            let full = match i {
                0 => out.add(node.ino, 1, FileKind::Directory, b"."),
                1 => out.add(parent_of(&node), 2, FileKind::Directory, b".."),
                _ => {
                    let e = &entries[(i - 2) as usize];
                    let ino = match self.core.peek_child(&node, e) {
                        Ok(ino) => ino,
                        Err(err) if i == offset => return Err(err),
                        Err(_) => break,
                    };
                    out.add(ino, i + 1, kind_file_type(e.kind), &e.name)
                }
            };
            if full {
                break;
            }
        }
        Ok(())
    }

    fn readdirplus(
        &self,
        _ctx: &Context,
        ino: u64,
        offset: u64,
        out: &mut dyn DirPlusSink,
    ) -> Result<(), Errno> {
        let (node, tree) = self.listing(ino)?;
        let entries = tree.as_ref().map_or(&[][..], |t| &t.entries[..]);
        let dir_attr = self.core.attr(&node);
        let mut added_any = false;
        for i in offset..2 + entries.len() as u64 {
            // "." and ".." take no lookup in the kernel; every other entry takes one.
            let full = match i {
                0 => out.add(1, b".", &dir_attr),
                1 => {
                    let mut a = dir_attr;
                    a.ino = parent_of(&node);
                    out.add(2, b"..", &a)
                }
                _ => {
                    let e = &entries[(i - 2) as usize];
                    let child = match self.core.acquire_child(&node, e) {
                        Ok(c) => c,
                        Err(err) if !added_any => return Err(err),
                        Err(_) => break,
                    };
                    let full = out.add(i + 1, &e.name, &self.core.attr(&child));
                    if full {
                        // Not sent: give the lookup back.
                        self.core.forget(child.ino, 1);
                    }
                    full
                }
            };
            if full {
                break;
            }
            added_any = true;
        }
        Ok(())
    }

    fn statfs(&self, _ctx: &Context, _ino: u64) -> Result<StatFs, Errno> {
        Ok(StatFs {
            bsize: VIEW_BLKSIZE_BYTES,
            namelen: NAME_MAX_BYTES,
            frsize: VIEW_BLKSIZE_BYTES,
            ..StatFs::default()
        })
    }

    fn getxattr(&self, _ctx: &Context, ino: u64, name: &[u8]) -> Result<Vec<u8>, Errno> {
        let node = self.xattr_node(ino)?;
        node.xattrs
            .iter()
            .find(|(n, _)| n.as_slice() == name)
            .map(|(_, v)| v.clone())
            .ok_or(Errno::NO_XATTR)
    }

    fn listxattr(&self, _ctx: &Context, ino: u64) -> Result<Vec<u8>, Errno> {
        let node = self.xattr_node(ino)?;
        let mut names = Vec::new();
        for (n, _) in &node.xattrs {
            names.extend_from_slice(n);
            names.push(0);
        }
        Ok(names)
    }
}

/// The inode of `..`: the parent directory (the mount root is its own parent).
fn parent_of(node: &Node) -> u64 {
    match &node.kind {
        NodeKind::Dir { parent, .. } => *parent,
        _ => node.ino,
    }
}
