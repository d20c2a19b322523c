//! The one FUSE server: serves any [`FileSystem`] core to the kernel through `fuser`. It
//! decides what is FUSE's alone: the entry and attribute lifetime, the capabilities asked
//! for at `INIT`, the xattr size protocol, and the passthrough backing files (one per
//! inode while any open holds it: the kernel refuses two different backing files for one
//! inode).

mod convert;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use fuser::{
    AccessFlags, BackingId, FileHandle, FopenFlags, Generation, INodeNo, InitFlags, IoctlFlags,
    KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use crate::filesystem::{
    Backing, BackingKey, Context, DirPlusSink, DirSink, Errno, FileKind, FileSystem, Listings,
    Make, Opened, RenameFlags, SetAttr, SetTime, lock, with_read_buffer,
};
use convert::{errno, file_attr, file_type, negative_attr};

/// How long the kernel may trust entries (negative ones too) and attributes. A snapshot
/// never changes, and every change to a workspace goes through its mount, where the
/// kernel drops or refreshes what each change touches; so nothing the kernel caches goes
/// stale while a mount serves. A short bound would only make every walk ask again.
pub const TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// A core served over FUSE.
pub struct FuseServer<F: FileSystem> {
    fs: Arc<F>,
    /// Whether the kernel took passthrough at `INIT`.
    passthrough: bool,
    /// By inode: the live backing file's key and id.
    backing: Mutex<HashMap<u64, (BackingKey, Weak<BackingId>)>>,
    /// By handle: the backing id an open holds.
    held: Mutex<HashMap<u64, Arc<BackingId>>>,
}

fn ctx(req: &Request) -> Context {
    Context {
        uid: req.uid(),
        gid: req.gid(),
        pid: req.pid(),
    }
}

/// The FUSE flags of an open: passed through (`true`) or served.
fn fopen_flags(o: &Opened, passed: bool) -> FopenFlags {
    let mut f = FopenFlags::empty();
    if o.no_flush {
        f |= FopenFlags::FOPEN_NOFLUSH;
    }
    // The kernel refuses FOPEN_KEEP_CACHE with passthrough (the page cache is the
    // backing file's), and direct I/O has no meaning there.
    if !passed && o.keep_cache {
        f |= FopenFlags::FOPEN_KEEP_CACHE;
    }
    if !passed && o.direct_io {
        f |= FopenFlags::FOPEN_DIRECT_IO;
    }
    f
}

fn set_time(t: Option<TimeOrNow>) -> Option<SetTime> {
    t.map(|t| match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(t) => SetTime::At(t),
    })
}

/// The xattr protocol: size 0 asks for the length; a too-small buffer is `ERANGE`.
fn reply_sized(value: Result<Vec<u8>, Errno>, size: u32, reply: ReplyXattr) {
    let value = match value {
        Ok(v) => v,
        Err(e) => return reply.error(errno(e)),
    };
    let Ok(len) = u32::try_from(value.len()) else {
        return reply.error(errno(Errno::E2BIG));
    };
    if size == 0 {
        reply.size(len);
    } else if len > size {
        reply.error(errno(Errno::ERANGE));
    } else {
        reply.data(&value);
    }
}

fn reply_empty(r: Result<(), Errno>, reply: ReplyEmpty) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(e)),
    }
}

fn reply_entry(r: Result<crate::filesystem::Attr, Errno>, reply: ReplyEntry) {
    match r {
        Ok(a) => reply.entry(&TTL, &file_attr(&a), Generation(0)),
        Err(e) => reply.error(errno(e)),
    }
}

/// Asks for FUSE passthrough at stack depth 1 (backing files live on a plain
/// filesystem, and kernel overlayfs accepts a FUSE mount as a lower layer only at depth
/// 1). `false`: the kernel offers none, and the daemon serves the I/O.
fn negotiate_passthrough(config: &mut KernelConfig) -> io::Result<bool> {
    if config
        .add_capabilities(InitFlags::FUSE_PASSTHROUGH)
        .is_err()
    {
        return Ok(false);
    }
    config
        .set_max_stack_depth(1)
        .map_err(|_| io::Error::other("stack depth 1 refused"))?;
    Ok(true)
}

struct Plain<'a>(&'a mut ReplyDirectory);

impl DirSink for Plain<'_> {
    fn add(&mut self, ino: u64, next: u64, kind: FileKind, name: &[u8]) -> bool {
        self.0
            .add(INodeNo(ino), next, file_type(kind), OsStr::from_bytes(name))
    }
}

struct Plus<'a>(&'a mut ReplyDirectoryPlus);

impl DirPlusSink for Plus<'_> {
    fn add(&mut self, next: u64, name: &[u8], attr: &crate::filesystem::Attr) -> bool {
        self.0.add(
            INodeNo(attr.ino),
            next,
            OsStr::from_bytes(name),
            &TTL,
            &file_attr(attr),
            Generation(0),
        )
    }
}

impl<F: FileSystem> FuseServer<F> {
    pub fn new(fs: Arc<F>) -> FuseServer<F> {
        FuseServer {
            fs,
            passthrough: false,
            backing: Mutex::default(),
            held: Mutex::default(),
        }
    }

    /// The backing id for an open of `ino` on `b`, or `None` when passthrough is off, the
    /// kernel refuses the file, or the inode's live backing is another file (then the
    /// open is served by the daemon).
    fn pass(
        &self,
        ino: u64,
        b: &Backing,
        register: impl FnOnce(&std::fs::File) -> io::Result<BackingId>,
    ) -> Option<Arc<BackingId>> {
        if !self.passthrough {
            return None;
        }
        let mut map = lock(&self.backing);
        if let Some((key, weak)) = map.get(&ino)
            && let Some(id) = weak.upgrade()
        {
            return (*key == b.key).then_some(id);
        }
        match register(&b.file) {
            Ok(id) => {
                let id = Arc::new(id);
                map.insert(ino, (b.key, Arc::downgrade(&id)));
                Some(id)
            }
            Err(e) => {
                tracing::warn!(ino, error = %e, "passthrough refused; the daemon serves this open");
                None
            }
        }
    }

    /// Holds `id` for handle `fh` until its release.
    fn hold(&self, ino: u64, fh: u64, id: &Arc<BackingId>) {
        lock(&self.held).insert(fh, Arc::clone(id));
        self.fs.passed_through(ino);
    }
}

impl<F: FileSystem> fuser::Filesystem for FuseServer<F> {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        let want = self.fs.features();
        // Opens never reach the daemon when the core takes none, so `O_TRUNC` must come
        // as a `setattr` (the kernel sends one after the open when this is not taken).
        let mut caps = vec![
            // Lookups in one directory run in parallel, and a symlink's target (never
            // changed in place) is read once.
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_CACHE_SYMLINKS,
            // The sandbox maps mounts to its uids with an idmapped mount (Linux 6.12+,
            // with default_permissions; docs/sandbox.md).
            InitFlags::FUSE_ALLOW_IDMAP,
        ];
        caps.push(match want.listings {
            // Every piece of a listing carries attributes, not only the first: with
            // `AUTO`, the pieces after the first came without, and a walk then looked
            // up each of their names (7,000 lookups in the Linux tree, a fifth of a
            // first walk's time).
            Listings::Plus => InitFlags::FUSE_DO_READDIRPLUS,
            Listings::PlusAuto => InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO,
        });
        if want.atomic_o_trunc {
            caps.push(InitFlags::FUSE_ATOMIC_O_TRUNC);
        }
        if want.direct_io_mmap {
            caps.push(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP);
        }
        // Optional capabilities: each is taken when the kernel offers it.
        for cap in caps {
            let _ = config.add_capabilities(cap);
        }
        if want.passthrough {
            self.passthrough = negotiate_passthrough(config)?;
            if !self.passthrough {
                tracing::info!("kernel offers no FUSE passthrough; the daemon serves I/O")
            }
            self.fs.passthrough_taken(self.passthrough);
        }
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let c = ctx(req);
        self.fs.serving(&c);
        match self.fs.lookup(&c, parent.0, name.as_bytes()) {
            Ok(Some(a)) => reply.entry(&TTL, &file_attr(&a), Generation(0)),
            // A negative entry (node 0) with a lifetime: the kernel remembers the name is
            // absent until something makes it.
            Ok(None) => reply.entry(&TTL, &negative_attr(), Generation(0)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.fs.forget(ino.0, nlookup);
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let c = ctx(req);
        self.fs.serving(&c);
        match self.fs.getattr(&c, ino.0) {
            Ok(a) => reply.attr(&TTL, &file_attr(&a)),
            Err(e) => reply.error(errno(e)),
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
        let c = ctx(req);
        self.fs.serving(&c);
        let change = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: set_time(atime),
            mtime: set_time(mtime),
        };
        match self.fs.setattr(&c, ino.0, fh.map_or(0, |f| f.0), change) {
            Ok(a) => reply.attr(&TTL, &file_attr(&a)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        let c = ctx(req);
        self.fs.serving(&c);
        match self.fs.readlink(&c, ino.0) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(errno(e)),
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
        let c = ctx(req);
        self.fs.serving(&c);
        let what = Make::Special {
            mode,
            rdev: u64::from(rdev),
        };
        reply_entry(self.fs.make(&c, parent.0, name.as_bytes(), what), reply)
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
        let c = ctx(req);
        self.fs.serving(&c);
        reply_entry(
            self.fs
                .make(&c, parent.0, name.as_bytes(), Make::Dir { mode }),
            reply,
        )
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let c = ctx(req);
        self.fs.serving(&c);
        reply_empty(self.fs.remove(&c, parent.0, name.as_bytes(), false), reply)
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let c = ctx(req);
        self.fs.serving(&c);
        reply_empty(self.fs.remove(&c, parent.0, name.as_bytes(), true), reply)
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let c = ctx(req);
        self.fs.serving(&c);
        let target = target.as_os_str().as_bytes();
        reply_entry(
            self.fs
                .make(&c, parent.0, link_name.as_bytes(), Make::Symlink { target }),
            reply,
        )
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        let c = ctx(req);
        self.fs.serving(&c);
        let r = self.fs.rename(
            &c,
            parent.0,
            name.as_bytes(),
            newparent.0,
            newname.as_bytes(),
            RenameFlags::from_bits(flags.bits()),
        );
        reply_empty(r, reply)
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let c = ctx(req);
        self.fs.serving(&c);
        reply_entry(
            self.fs.make(
                &c,
                newparent.0,
                newname.as_bytes(),
                Make::Link { ino: ino.0 },
            ),
            reply,
        )
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let c = ctx(req);
        self.fs.serving(&c);
        let opened = match self.fs.open(&c, ino.0, flags.0) {
            Ok(o) => o,
            Err(e) => return reply.error(errno(e)),
        };
        if let Some(b) = &opened.backing
            && let Some(id) = self.pass(ino.0, b, |f| reply.open_backing(f))
        {
            self.hold(ino.0, opened.fh, &id);
            return reply.opened_passthrough(
                FileHandle(opened.fh),
                fopen_flags(&opened, true),
                &id,
            );
        }
        reply.opened(FileHandle(opened.fh), fopen_flags(&opened, false));
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
        let c = ctx(req);
        self.fs.serving(&c);
        let (attr, opened) = match self.fs.create(&c, parent.0, name.as_bytes(), mode, flags) {
            Ok(x) => x,
            Err(e) => return reply.error(errno(e)),
        };
        let attr = file_attr(&attr);
        if let Some(b) = &opened.backing
            && let Some(id) = self.pass(attr.ino.0, b, |f| reply.open_backing(f))
        {
            self.hold(attr.ino.0, opened.fh, &id);
            return reply.created_passthrough(
                &TTL,
                &attr,
                Generation(0),
                FileHandle(opened.fh),
                fopen_flags(&opened, true),
                &id,
            );
        }
        reply.created(
            &TTL,
            &attr,
            Generation(0),
            FileHandle(opened.fh),
            fopen_flags(&opened, false),
        );
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
        let c = ctx(req);
        self.fs.serving(&c);
        with_read_buffer(size, |buf| {
            match self.fs.read(&c, ino.0, fh.0, offset, buf) {
                Ok(n) => reply.data(&buf[..n]),
                Err(e) => reply.error(errno(e)),
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
        let c = ctx(req);
        self.fs.serving(&c);
        match self.fs.write(&c, ino.0, fh.0, offset, data) {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn flush(
        &self,
        req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.fs.serving(&ctx(req));
        // Nothing is buffered in the daemon (writes are passed through or written at
        // once) and locks are the kernel's: "not implemented" stops a flush at every
        // close.
        reply.error(errno(Errno::ENOSYS));
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
        self.fs.serving(&ctx(req));
        let released = lock(&self.held).remove(&fh.0);
        if let Some(id) = released {
            let mut backing = lock(&self.backing);
            drop(id);
            if backing
                .get(&ino.0)
                .is_some_and(|(_, w)| w.strong_count() == 0)
            {
                backing.remove(&ino.0);
            }
        }
        self.fs.release(ino.0, fh.0);
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
        let c = ctx(req);
        self.fs.serving(&c);
        reply_empty(self.fs.fsync(&c, ino.0, fh.0, datasync), reply)
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
        let c = ctx(req);
        self.fs.serving(&c);
        reply_empty(
            self.fs.fallocate(&c, ino.0, fh.0, offset, length, mode),
            reply,
        )
    }

    fn opendir(&self, req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.fs.serving(&ctx(req));
        // "Not implemented": from then on the kernel opens directories of this mount
        // without asking and sends no release, keeps their listings
        // (`FOPEN_CACHE_DIR | FOPEN_KEEP_CACHE` is its default then) and drops one when
        // its directory changes through this mount, which every change does. Listings
        // are read by inode; a core's offsets must keep a listing read in pieces right
        // while the directory changes.
        reply.error(errno(Errno::ENOSYS));
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let c = ctx(req);
        self.fs.serving(&c);
        match self.fs.readdir(&c, ino.0, offset, &mut Plain(&mut reply)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let c = ctx(req);
        self.fs.serving(&c);
        match self
            .fs
            .readdirplus(&c, ino.0, offset, &mut Plus(&mut reply))
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn fsyncdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let c = ctx(req);
        self.fs.serving(&c);
        reply_empty(self.fs.fsyncdir(&c, ino.0), reply)
    }

    fn statfs(&self, req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        let c = ctx(req);
        self.fs.serving(&c);
        match self.fs.statfs(&c, ino.0) {
            Ok(s) => reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
            ),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let c = ctx(req);
        self.fs.serving(&c);
        reply_sized(self.fs.getxattr(&c, ino.0, name.as_bytes()), size, reply)
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let c = ctx(req);
        self.fs.serving(&c);
        reply_sized(self.fs.listxattr(&c, ino.0), size, reply)
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
        let c = ctx(req);
        self.fs.serving(&c);
        reply_empty(
            self.fs.setxattr(&c, ino.0, name.as_bytes(), value, flags),
            reply,
        )
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let c = ctx(req);
        self.fs.serving(&c);
        reply_empty(self.fs.removexattr(&c, ino.0, name.as_bytes()), reply)
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let c = ctx(req);
        self.fs.serving(&c);
        reply_empty(self.fs.access(&c, ino.0, mask.bits()), reply)
    }

    /// No ioctls, answered without the library's per-call warning (programs probe every
    /// file they open — Python asks `isatty` — and a log line each cost more than the
    /// read).
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
        self.fs.serving(&ctx(req));
        reply.error(errno(Errno::ENOTTY));
    }
}
