//! The `fuser` adapter of a workspace: translates requests into [`Cow`] calls. In
//! [`OpenMode::Cached`] opens are "not implemented" and I/O arrives by inode
//! (`cached.rs`); in [`OpenMode::Passthrough`] opens are answered with passthrough
//! backing files (blob-cache files for unmodified files, the upper files once written) so
//! reads, writes and mmap never reach the daemon.

use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::SystemTime;

use fuser::{
    AccessFlags, Errno, FileHandle, FileType, Filesystem, Generation, INodeNo, InitFlags,
    IoctlFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use super::OpenMode;
use super::fdio::fallocate;
use super::handles::Handles;
use super::namespace::Make;
use super::node::Node;
use super::ops::Cow;
use super::setattr::{SetAttr, set_attr};
use crate::blobfiles::read_full_at;
use crate::fusecore::{
    NAME_MAX_BYTES, TTL, errno_of_io, errno_of_nix, negative_attr, negotiate_passthrough,
    with_read_buffer,
};
use crate::placement::Placement;

/// The filesystem `fuser` serves for one workspace.
pub struct CowFs {
    pub cow: Arc<Cow>,
    pub(super) handles: Handles,
    mode: OpenMode,
    want_passthrough: bool,
    pub passthrough: Arc<AtomicBool>,
    /// `OPEN` requests received.
    opens: Arc<AtomicU64>,
    /// Where the request threads run (`None`: wherever the scheduler puts them).
    placement: Option<Placement>,
}

impl CowFs {
    pub fn new(
        cow: Arc<Cow>,
        mode: OpenMode,
        want_passthrough: bool,
        passthrough: Arc<AtomicBool>,
        opens: Arc<AtomicU64>,
        follow_cpus: bool,
    ) -> CowFs {
        CowFs {
            cow,
            handles: Handles::default(),
            mode,
            want_passthrough,
            passthrough,
            opens,
            placement: Placement::new(follow_cpus),
        }
    }

    /// Every request but `forget` (sent by whichever process reclaims memory) first
    /// places the serving thread on its requester's CPUs ([`crate::placement`]).
    fn place(&self, req: &Request) {
        if let Some(p) = &self.placement {
            p.serve(req.pid());
        }
    }

    fn entry(&self, node: &Node, reply: ReplyEntry) {
        match self.cow.attr(node) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => {
                self.cow.table.forget(node.ino, 1);
                reply.error(e)
            }
        }
    }

    /// Answers a request that made a name: its entry, or why not.
    fn made(&self, made: Result<Node, Errno>, reply: ReplyEntry) {
        match made {
            Ok(n) => self.entry(&n, reply),
            Err(e) => reply.error(e),
        }
    }

    /// Makes `name` in `parent` as `what`, owned by the requester.
    fn make(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        what: Make<'_>,
        reply: ReplyEntry,
    ) {
        let made = self
            .cow
            .make(parent.0, name.as_bytes(), what, req.uid(), req.gid());
        self.made(made, reply)
    }
}

impl Filesystem for CowFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Opens never reach the daemon in the cached mode, so `O_TRUNC` must come as a
        // `setattr` (the kernel sends one after the open when this is not negotiated).
        if self.mode == OpenMode::Passthrough {
            let _ = config.add_capabilities(InitFlags::FUSE_ATOMIC_O_TRUNC);
        }
        for cap in [
            InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP,
            // Listings carry attributes (a walk then needs no lookup per name), lookups
            // in one directory run in parallel, and a symlink's target (never changed in
            // place) is read once. Every piece of a listing carries them, not only the
            // first (no `FUSE_READDIRPLUS_AUTO`): with it, the pieces after the first came
            // without, and a walk then looked up each of their names (7,000 lookups in
            // the Linux tree, a fifth of a first walk's time).
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_CACHE_SYMLINKS,
            // The sandbox maps the workspace to its uids with an idmapped mount.
            InitFlags::FUSE_ALLOW_IDMAP,
        ] {
            let _ = config.add_capabilities(cap);
        }
        if self.want_passthrough {
            if negotiate_passthrough(config)? {
                self.passthrough.store(true, Ordering::Relaxed);
            } else {
                tracing::info!("kernel offers no FUSE passthrough; the daemon serves I/O")
            }
        }
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.place(req);
        match self.cow.lookup(parent.0, name.as_bytes()) {
            Ok(Some(node)) => self.entry(&node, reply),
            // A negative entry (node 0): the kernel remembers the name is absent until
            // something makes it.
            Ok(None) => reply.entry(&TTL, &negative_attr(), Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        let held = self.cow.table.find(ino.0);
        self.cow.table.forget(ino.0, nlookup);
        if let Some(node) = held
            && self.cow.table.find(ino.0).is_none()
        {
            self.forgotten(&node);
        }
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.place(req);
        match self.cow.table.get(ino.0).and_then(|n| self.cow.attr(&n)) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        self.place(req);
        let change = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
        };
        let set = self
            .cow
            .table
            .get(ino.0)
            .and_then(|n| self.changed_node(n.ino, change.empties()))
            .and_then(|node| {
                let by_handle = fh
                    .filter(|_| change.size.is_some())
                    .and_then(|fh| self.handles.file(fh.0).ok());
                set_attr(&self.cow, ino.0, node, by_handle, change)
            });
        match set {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        self.place(req);
        let node = match self.cow.table.get(ino.0) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        if let Some(fd) = &node.upper {
            match nix::fcntl::readlinkat(fd.as_ref(), "") {
                Ok(t) => reply.data(t.as_bytes()),
                Err(e) => reply.error(errno_of_nix(e)),
            }
        } else {
            match &node.lower {
                Some(e) if e.kind == cowspace_store::Kind::Symlink => reply.data(e.data()),
                _ => reply.error(Errno::EINVAL),
            }
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.place(req);
        let what = match Cow::special_kind(mode) {
            // A regular file: a `create` the kernel makes this way in the cached mode.
            Ok(FileType::RegularFile) => Make::File { mode },
            Ok(_) => Make::Special {
                mode,
                rdev: u64::from(rdev),
            },
            Err(e) => return reply.error(e),
        };
        self.make(req, parent, name, what, reply)
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        self.place(req);
        self.make(req, parent, name, Make::Dir { mode }, reply)
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.place(req);
        match self.cow.remove(parent.0, name.as_bytes(), false) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.place(req);
        match self.cow.remove(parent.0, name.as_bytes(), true) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        self.place(req);
        let target = target.as_os_str().as_bytes();
        self.make(req, parent, link_name, Make::Symlink { target }, reply)
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.place(req);
        match self.cow.rename(
            parent.0,
            name.as_bytes(),
            newparent.0,
            newname.as_bytes(),
            flags,
        ) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.place(req);
        let made = self.cow.table.get(ino.0).and_then(|n| {
            if n.kind == FileType::Directory {
                return Err(Errno::EPERM);
            }
            let source = {
                let _r = self.cow.ns_read();
                self.cow.copy_up(n.ino, false)?
            };
            self.cow
                .make(newparent.0, newname.as_bytes(), Make::Link { source }, 0, 0)
        });
        self.made(made, reply)
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.place(req);
        self.opens.fetch_add(1, Ordering::Relaxed);
        if self.mode == OpenMode::Cached {
            // "Not implemented": the kernel opens every file of this mount without asking
            // from now on (handle 0, its pages kept between opens).
            return reply.error(Errno::ENOSYS);
        }
        self.open_with_handle(ino.0, flags.0, reply)
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        self.place(req);
        if self.mode == OpenMode::Cached {
            // The kernel then makes new files with `mknod` and opens them as any other.
            return reply.error(Errno::ENOSYS);
        }
        self.create_open(req, parent.0, name.as_bytes(), mode, flags, reply)
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.place(req);
        with_read_buffer(size, |buf| {
            let n = if fh.0 == 0 {
                self.read_by_inode(ino.0, offset, buf)
            } else {
                match self.handles.io(fh.0) {
                    Ok((_, Some(p), _)) => p.read_at(buf, offset).map_err(errno_of_io),
                    Ok((file, None, _)) => read_full_at(&file, buf, offset).map_err(errno_of_io),
                    Err(e) => Err(e),
                }
            };
            match n {
                Ok(n) => reply.data(&buf[..n]),
                Err(e) => reply.error(e),
            }
        })
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.place(req);
        if fh.0 == 0 {
            return match self.write_by_inode(ino.0, offset, data) {
                Ok(()) => reply.written(data.len() as u32),
                Err(e) => reply.error(e),
            };
        }
        let (file, pending, append) = match self.handles.io(fh.0) {
            Ok(x) => x,
            Err(e) => return reply.error(e),
        };
        let written = match pending {
            Some(p) => p.write_at(&file, data, offset, append),
            None => file.write_all_at(data, offset),
        };
        match written {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(errno_of_io(e)),
        }
    }

    fn flush(
        &self,
        req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lo: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.place(req);
        // Nothing is buffered here (writes are passed through or written at once) and
        // locks are the kernel's: "not implemented" stops a flush at every close.
        reply.error(Errno::ENOSYS);
    }

    fn release(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.place(req);
        self.handles.release(ino.0, fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.place(req);
        if fh.0 == 0 {
            return match self.fsync_by_inode(ino.0, datasync) {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            };
        }
        let r = self.handles.file(fh.0).and_then(|f| {
            if datasync {
                f.sync_data()
            } else {
                f.sync_all()
            }
            .map_err(errno_of_io)
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.place(req);
        if fh.0 == 0 {
            return match self.fallocate_by_inode(ino.0, offset, length, mode) {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            };
        }
        let r = self.handles.io(fh.0).and_then(|(f, pending, _)| {
            // Ranges may move or vanish: a copy-up in progress is finished first.
            if let Some(p) = pending {
                p.finish().map_err(errno_of_io)?;
            }
            fallocate(&f, offset, length, mode).map_err(errno_of_io)
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn opendir(&self, req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.place(req);
        // "Not implemented": from then on the kernel opens directories of this mount
        // without asking and sends no release, keeps their listings
        // (`FOPEN_CACHE_DIR | FOPEN_KEEP_CACHE` is its default then) and drops one when
        // its directory changes through this mount, which every change does. Reads
        // arrive by inode; cookies that are a function of the name keep a listing read
        // in pieces right while the directory changes (`listing.rs`).
        reply.error(Errno::ENOSYS);
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        self.place(req);
        self.do_readdir(ino.0, offset, reply)
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        self.place(req);
        self.do_readdirplus(ino.0, offset, reply)
    }

    fn fsyncdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.place(req);
        let r = self
            .cow
            .table
            .get(ino.0)
            .and_then(|n| self.cow.upper_of(&n))
            .and_then(|p| {
                File::open(p)
                    .and_then(|f| f.sync_all())
                    .map_err(errno_of_io)
            });
        match r {
            // A directory only in the snapshot has nothing to sync.
            Ok(()) | Err(Errno::EIO) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.place(req);
        match nix::sys::statvfs::statvfs(&self.cow.layers.upper) {
            Ok(s) => reply.statfs(
                s.blocks(),
                s.blocks_free(),
                s.blocks_available(),
                s.files(),
                s.files_free(),
                s.block_size() as u32,
                NAME_MAX_BYTES,
                s.fragment_size() as u32,
            ),
            Err(e) => reply.error(errno_of_nix(e)),
        }
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.place(req);
        self.do_getxattr(ino, name, size, reply)
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.place(req);
        self.do_listxattr(ino, size, reply)
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        self.place(req);
        self.do_setxattr(ino, name, value, flags, reply)
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.place(req);
        self.do_removexattr(ino, name, reply)
    }

    fn access(&self, req: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        self.place(req);
        // Permission bits are checked by the kernel (default_permissions).
        reply.ok();
    }

    /// No ioctls, answered without the library's per-call warning (programs probe files
    /// they open: Python asks `isatty` of each).
    fn ioctl(
        &self,
        req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        self.place(req);
        reply.error(Errno::ENOTTY);
    }
}
