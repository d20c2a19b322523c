//! The `fuser` adapter: translates FUSE requests into [`ViewCore`] calls and answers
//! with long cache lifetimes. Every mutating operation is `EROFS`; reading xattrs is
//! `ENOSYS` in the plain view (see [`super::plain`]).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::SystemTime;

use cowspace_store::Tree;
use fuser::{
    AccessFlags, BackingId, Errno, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenAccMode, OpenFlags, RenameFlags,
    ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry,
    ReplyIoctl, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use super::ReadMode;
use super::core::{VIEW_BLKSIZE_BYTES, ViewCore};
use super::inode::{Node, NodeKind};
use crate::fusecore::{
    NAME_MAX_BYTES, TTL, errno_of_blob_io, kind_file_type, lock, negative_attr,
    negotiate_passthrough, reply_sized, with_read_buffer,
};

/// An open file: a passthrough backing shared by the inode's opens, or a blob fd.
enum OpenFile {
    /// Held only to keep the kernel's backing file registered while the open lives.
    Backed(#[allow(dead_code)] Arc<BackingId>),
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
    /// One `BackingId` per inode while it has live passthrough opens (the kernel refuses
    /// two different backing files for one inode).
    backing: Mutex<HashMap<u64, Weak<BackingId>>>,
}

impl Handles {
    fn next(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// The filesystem `fuser` serves.
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

    fn reply_node(&self, node: &Node, reply: ReplyEntry) {
        reply.entry(&TTL, &self.core.attr(node), Generation(0));
    }

    fn open_passthrough(
        &self,
        ino: u64,
        file: &File,
        reply: &ReplyOpen,
    ) -> std::io::Result<Arc<BackingId>> {
        let mut backing = lock(&self.handles.backing);
        if let Some(id) = backing.get(&ino).and_then(Weak::upgrade) {
            return Ok(id);
        }
        let id = Arc::new(reply.open_backing(file)?);
        backing.insert(ino, Arc::downgrade(&id));
        Ok(id)
    }

    /// The node whose extended attributes are asked for; `ENOSYS` on the plain view,
    /// which the kernel remembers per connection and asks no more (for `listxattr` too:
    /// a name listed but not readable would fail overlay copy-ups).
    fn xattr_node(&self, ino: INodeNo) -> Result<Arc<Node>, Errno> {
        self.core
            .counters
            .xattr_requests
            .fetch_add(1, Ordering::Relaxed);
        if !self.core.xattrs {
            return Err(Errno::ENOSYS);
        }
        self.core.node(ino.0)
    }
}

/// `fuser::Filesystem` methods, each given as its name, argument types and reply type,
/// that answer `EROFS` whatever they are asked.
macro_rules! refuse_changes {
    ($($name:ident($($arg:ty),* $(,)?) $reply:ty;)*) => {
        $(fn $name(&self, $(_: $arg,)* reply: $reply) {
            reply.error(Errno::EROFS);
        })*
    };
}

impl Filesystem for ViewFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Optional capabilities: each is taken when the kernel offers it.
        for cap in [
            InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO,
            InitFlags::FUSE_CACHE_SYMLINKS,
            InitFlags::FUSE_PARALLEL_DIROPS,
            // Idmapped mounts of the view (Linux 6.12+, with default_permissions): the
            // sandbox mounts an overlay of an idmapped clone of it (docs/sandbox.md).
            InitFlags::FUSE_ALLOW_IDMAP,
        ] {
            let _ = config.add_capabilities(cap);
        }
        if self.mode == ReadMode::Passthrough {
            if negotiate_passthrough(config)? {
                self.core
                    .counters
                    .passthrough
                    .store(true, Ordering::Relaxed);
            } else {
                tracing::info!("kernel offers no FUSE passthrough; the daemon serves reads")
            }
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.core.lookup(parent.0, name.as_bytes()) {
            Ok(Some(node)) => self.reply_node(&node, reply),
            // A negative entry with a lifetime: the kernel caches the absence.
            Ok(None) => reply.entry(&TTL, &negative_attr(), Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.core.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.core.node(ino.0) {
            Ok(node) => reply.attr(&TTL, &self.core.attr(&node)),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.core.node(ino.0) {
            Ok(node) => match &node.kind {
                NodeKind::Symlink { target } => reply.data(target),
                _ => reply.error(Errno::EINVAL),
            },
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.acc_mode() != OpenAccMode::O_RDONLY || flags.0 & nix::libc::O_TRUNC != 0 {
            return reply.error(Errno::EROFS);
        }
        let node = match self.core.node(ino.0) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let content = match &node.kind {
            NodeKind::File { content } => *content,
            NodeKind::Root | NodeKind::Dir { .. } => return reply.error(Errno::EISDIR),
            _ => return reply.error(Errno::EINVAL),
        };
        self.core.counters.opens.fetch_add(1, Ordering::Relaxed);
        match self.core.remote_chunks(&content) {
            Ok(Some(c)) => {
                let fh = self.handles.next();
                lock(&self.handles.files).insert(fh, OpenFile::Chunked(c));
                return reply.opened(
                    FileHandle(fh),
                    FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_NOFLUSH,
                );
            }
            Ok(None) => {}
            Err(e) => return reply.error(e),
        }
        if self.mode == ReadMode::Cached {
            // "Not implemented": from now on the kernel opens and closes the view's files
            // without asking, and keeps their pages cached between opens (its default
            // for such opens). This open goes on the same way.
            return reply.error(Errno::ENOSYS);
        }
        let file = match self.core.open_blob(&content) {
            Ok(f) => f,
            Err(e) => return reply.error(e),
        };
        let fh = self.handles.next();
        if self.passthrough() {
            match self.open_passthrough(node.ino, &file, &reply) {
                Ok(id) => {
                    self.core
                        .counters
                        .passthrough_opens
                        .fetch_add(1, Ordering::Relaxed);
                    lock(&self.handles.files).insert(fh, OpenFile::Backed(Arc::clone(&id)));
                    // The kernel refuses FOPEN_KEEP_CACHE with passthrough (the page cache
                    // is the backing file's).
                    return reply.opened_passthrough(
                        FileHandle(fh),
                        FopenFlags::FOPEN_NOFLUSH,
                        &id,
                    );
                }
                Err(e) => {
                    tracing::warn!(ino = node.ino, error = %e, "passthrough refused; serving reads");
                }
            }
        }
        lock(&self.handles.files).insert(fh, OpenFile::Plain(Arc::new(file)));
        // Nothing to flush on close of a read-only file.
        reply.opened(
            FileHandle(fh),
            FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_NOFLUSH,
        );
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.core.counters.reads.fetch_add(1, Ordering::Relaxed);
        let held = match lock(&self.handles.files).get(&fh.0) {
            Some(OpenFile::Plain(f)) => Some(Source::Blob(Arc::clone(f))),
            Some(OpenFile::Chunked(c)) => Some(Source::Chunks(Arc::clone(c))),
            Some(OpenFile::Backed(_)) => return reply.error(Errno::EBADF),
            None => None,
        };
        let source = match held {
            Some(s) => s,
            // Opens carry no handle in `Cached` mode.
            None if fh.0 == 0 => match self.source_of(ino.0) {
                Ok(s) => s,
                Err(e) => return reply.error(e),
            },
            None => return reply.error(Errno::EBADF),
        };
        let file = match source {
            Source::Blob(f) => f,
            Source::Chunks(c) => {
                return match self.core.read_chunked(&c, offset, size) {
                    Ok(data) => {
                        self.core
                            .counters
                            .read_bytes
                            .fetch_add(data.len() as u64, Ordering::Relaxed);
                        reply.data(&data)
                    }
                    Err(e) => reply.error(e),
                };
            }
        };
        with_read_buffer(size, |buf| {
            match crate::blobfiles::read_full_at(&file, buf, offset) {
                Ok(n) => {
                    self.core
                        .counters
                        .read_bytes
                        .fetch_add(n as u64, Ordering::Relaxed);
                    reply.data(&buf[..n])
                }
                Err(e) => reply.error(errno_of_blob_io("read blob", e)),
            }
        })
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let released = lock(&self.handles.files).remove(&fh.0);
        if let Some(OpenFile::Backed(id)) = released {
            let mut backing = lock(&self.handles.backing);
            drop(id);
            if backing.get(&ino.0).is_some_and(|w| w.strong_count() == 0) {
                backing.remove(&ino.0);
            }
        }
        reply.ok();
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Nothing to flush in a read-only view: "not implemented" stops the kernel from
        // sending a flush at every close.
        reply.error(Errno::ENOSYS);
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // "Not implemented": the kernel then opens directories without asking and caches
        // their listings (its default for such opens); listings are found by inode.
        reply.error(Errno::ENOSYS);
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let (node, tree) = match self.listing(ino.0) {
            Ok(l) => l,
            Err(e) => return reply.error(e),
        };
        // Index 0 is ".", 1 is "..", 2.. the tree's entries; an entry's offset is the
        // index of the next one.
        let entries = tree.as_ref().map_or(&[][..], |t| &t.entries[..]);
        for i in offset..2 + entries.len() as u64 {
            let full = match i {
                0 => reply.add(INodeNo(node.ino), 1, FileType::Directory, "."),
                1 => reply.add(INodeNo(parent_of(&node)), 2, FileType::Directory, ".."),
                _ => {
                    let e = &entries[(i - 2) as usize];
                    let ino = match self.core.peek_child(&node, e) {
                        Ok(ino) => ino,
                        Err(err) if i == offset => return reply.error(err),
                        Err(_) => break,
                    };
                    reply.add(
                        INodeNo(ino),
                        i + 1,
                        kind_file_type(e.kind),
                        OsStr::from_bytes(&e.name),
                    )
                }
            };
            if full {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let (node, tree) = match self.listing(ino.0) {
            Ok(l) => l,
            Err(e) => return reply.error(e),
        };
        let entries = tree.as_ref().map_or(&[][..], |t| &t.entries[..]);
        let dir_attr = self.core.attr(&node);
        let mut added_any = false;
        for i in offset..2 + entries.len() as u64 {
            // "." and ".." take no lookup in the kernel; every other entry takes one.
            let full = match i {
                0 => reply.add(INodeNo(node.ino), 1, ".", &TTL, &dir_attr, Generation(0)),
                1 => {
                    let mut a = dir_attr;
                    a.ino = INodeNo(parent_of(&node));
                    reply.add(a.ino, 2, "..", &TTL, &a, Generation(0))
                }
                _ => {
                    let e = &entries[(i - 2) as usize];
                    let child = match self.core.acquire_child(&node, e) {
                        Ok(c) => c,
                        Err(err) if !added_any => return reply.error(err),
                        Err(_) => break,
                    };
                    let attr = self.core.attr(&child);
                    let full = reply.add(
                        attr.ino,
                        i + 1,
                        OsStr::from_bytes(&e.name),
                        &TTL,
                        &attr,
                        Generation(0),
                    );
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
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(
            0,
            0,
            0,
            0,
            0,
            VIEW_BLKSIZE_BYTES,
            NAME_MAX_BYTES,
            VIEW_BLKSIZE_BYTES,
        );
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let node = match self.xattr_node(ino) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        match node
            .xattrs
            .iter()
            .find(|(n, _)| n.as_slice() == name.as_bytes())
        {
            Some((_, value)) => reply_sized(value, size, reply),
            None => reply.error(Errno::NO_XATTR),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let node = match self.xattr_node(ino) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let mut names = Vec::new();
        for (n, _) in &node.xattrs {
            names.extend_from_slice(n);
            names.push(0);
        }
        reply_sized(&names, size, reply);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        // Permission bits are checked by the kernel (default_permissions); only writing
        // is refused here.
        if mask.contains(AccessFlags::W_OK) {
            reply.error(Errno::EROFS);
        } else {
            reply.ok();
        }
    }

    // Everything below would change a snapshot.
    refuse_changes! {
        setattr(&Request, INodeNo, Option<u32>, Option<u32>, Option<u32>, Option<u64>,
            Option<TimeOrNow>, Option<TimeOrNow>, Option<SystemTime>, Option<FileHandle>,
            Option<SystemTime>, Option<SystemTime>, Option<SystemTime>,
            Option<fuser::BsdFileFlags>) ReplyAttr;
        mknod(&Request, INodeNo, &OsStr, u32, u32, u32) ReplyEntry;
        mkdir(&Request, INodeNo, &OsStr, u32, u32) ReplyEntry;
        unlink(&Request, INodeNo, &OsStr) ReplyEmpty;
        rmdir(&Request, INodeNo, &OsStr) ReplyEmpty;
        symlink(&Request, INodeNo, &OsStr, &Path) ReplyEntry;
        rename(&Request, INodeNo, &OsStr, INodeNo, &OsStr, RenameFlags) ReplyEmpty;
        link(&Request, INodeNo, INodeNo, &OsStr) ReplyEntry;
        write(&Request, INodeNo, FileHandle, u64, &[u8], WriteFlags, OpenFlags,
            Option<LockOwner>) ReplyWrite;
        create(&Request, INodeNo, &OsStr, u32, u32, i32) ReplyCreate;
        setxattr(&Request, INodeNo, &OsStr, &[u8], i32, u32) ReplyEmpty;
        removexattr(&Request, INodeNo, &OsStr) ReplyEmpty;
        fallocate(&Request, INodeNo, FileHandle, u64, u64, i32) ReplyEmpty;
    }

    /// No ioctls: answered without the default's per-call warning (programs probe every
    /// file they open — Python asks `isatty` — and a log line each cost more than the read).
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY);
    }
}

/// The inode of `..`: the parent directory (the mount root is its own parent).
fn parent_of(node: &Node) -> u64 {
    match &node.kind {
        NodeKind::Dir { parent, .. } => *parent,
        _ => node.ino,
    }
}
