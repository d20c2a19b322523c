//! The `fuser` adapter of a workspace: translates requests into [`Cow`] calls, answers
//! opens with passthrough backing files (blob-cache files for unmodified files, the upper
//! files once written) so reads, writes and mmap never reach the daemon.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, SystemTime};

use cowspace_store::ContentId;
use fuser::{
    AccessFlags, BackingId, Errno, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use nix::fcntl::AT_FDCWD;
use nix::sys::stat::UtimensatFlags;
use nix::sys::time::TimeSpec;

use super::layers::reserved_xattr;
use super::lazy::Pending;
use super::node::Node;
use super::ops::{Cow, Listed, Make, errno};

/// How long the kernel may trust entries and attributes. Every change goes through this
/// mount, so the bound only covers what the kernel cannot see (the sandbox's overlay of
/// the same upper layer, which the host never mounts at the same time).
pub const TTL: Duration = Duration::from_secs(1);

/// Largest read or write answered by the daemon (opens that could not pass through).
const MAX_IO_BYTES: u32 = 16 * 1024 * 1024;

/// What a passthrough backing file is: the same file for every open of an inode, or the
/// kernel refuses the open.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Backing {
    Blob,
    /// An upper file (device, inode) opened read-write, or read-only (`false`).
    Upper(u64, u64, bool),
}

/// A file's copy-up while still in progress (`lazy.rs`).
type Copying = Option<Arc<Pending>>;

struct Handle {
    file: Arc<File>,
    _backing: Option<Arc<BackingId>>,
    /// The file's copy-up, still in progress when opened: reads and writes go through it.
    pending: Option<Arc<Pending>>,
    /// Opened with `O_APPEND` (writes land at the end whatever the offset).
    append: bool,
}

struct Dir {
    entries: Vec<Listed>,
}

#[derive(Default)]
struct Handles {
    next: AtomicU64,
    files: Mutex<HashMap<u64, Handle>>,
    dirs: Mutex<HashMap<u64, Dir>>,
    backing: Mutex<HashMap<u64, (Backing, Weak<BackingId>)>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The filesystem `fuser` serves for one workspace.
pub struct CowFs {
    pub cow: Arc<Cow>,
    handles: Handles,
    want_passthrough: bool,
    pub passthrough: Arc<AtomicBool>,
}

impl CowFs {
    pub fn new(cow: Arc<Cow>, want_passthrough: bool, passthrough: Arc<AtomicBool>) -> CowFs {
        CowFs {
            cow,
            handles: Handles::default(),
            want_passthrough,
            passthrough,
        }
    }

    fn next(&self) -> u64 {
        self.handles.next.fetch_add(1, Ordering::Relaxed) + 1
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

    /// The backing id for an open of `ino` on `file`, or `None` when the inode's live
    /// backing is another file (then the open is served by the daemon).
    fn backing(
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
    fn upper_backing_file(path: &Path) -> Option<(File, bool)> {
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
        {
            Ok(f) => Some((f, true)),
            Err(_) => std::fs::File::open(path).ok().map(|f| (f, false)),
        }
    }

    fn open_node(&self, node: &Node, flags: i32) -> Result<(u64, Arc<File>, Copying), Errno> {
        let write = flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
        if node.upper.is_none() && !write {
            let e = node.lower.as_ref().ok_or(Errno::EIO)?;
            let content = ContentId::from_bytes(e.hash);
            let path = self
                .cow
                .layers
                .store
                .blob_cache()
                .ensure(&content)
                .map_err(|e| crate::view::errno_of("materialise blob", &e))?;
            let file = Arc::new(File::open(path).map_err(errno)?);
            return Ok((node.ino, file, None));
        }
        let (node, file, pending) = self.cow.open_upper(node, flags)?;
        Ok((node.ino, Arc::new(file), pending))
    }

    fn add_handle(
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

    fn handle_file(&self, fh: u64) -> Result<Arc<File>, Errno> {
        lock(&self.handles.files)
            .get(&fh)
            .map(|h| Arc::clone(&h.file))
            .ok_or(Errno::EBADF)
    }

    /// The file of handle `fh`, its copy-up if still in progress, and whether it appends.
    fn handle_io(&self, fh: u64) -> Result<(Arc<File>, Copying, bool), Errno> {
        lock(&self.handles.files)
            .get(&fh)
            .map(|h| {
                let pending = h.pending.clone().filter(|p| !p.is_complete());
                (Arc::clone(&h.file), pending, h.append)
            })
            .ok_or(Errno::EBADF)
    }

    fn what_backs(&self, node: &Node, file: &File) -> Result<Backing, Errno> {
        if node.upper.is_none() {
            return Ok(Backing::Blob);
        }
        let m = file.metadata().map_err(errno)?;
        Ok(Backing::Upper(m.dev(), m.ino(), true))
    }

    fn setattr_inner(&self, ino: u64, s: SetAttr) -> Result<fuser::FileAttr, Errno> {
        let SetAttr {
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
            fh,
        } = s;
        let node = self.cow.table.get(ino)?;
        let node = {
            let _r = self.cow.ns.read().unwrap_or_else(|p| p.into_inner());
            self.cow.copy_up(node.ino, size == Some(0))?
        };
        let path = self.cow.upper_of(&node)?;
        // A copy-up in progress: size and times change under its lock.
        let pending = node
            .upper
            .as_ref()
            .and_then(|fd| self.cow.lazy.get(fd.as_ref()));
        if uid.is_some() || gid.is_some() {
            let fd = node.upper.as_ref().ok_or(Errno::EIO)?;
            nix::unistd::fchownat(
                fd.as_ref(),
                "",
                uid.map(nix::unistd::Uid::from_raw),
                gid.map(nix::unistd::Gid::from_raw),
                nix::fcntl::AtFlags::AT_EMPTY_PATH,
            )
            .map_err(|e| Errno::from_i32(e as i32))?;
        }
        if let Some(m) = mode {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(m & 0o7777))
                .map_err(errno)?;
        }
        if let Some(len) = size {
            let by_handle = fh.and_then(|fh| self.handle_file(fh.0).ok());
            match (&pending, by_handle) {
                (Some(p), _) => p.truncate(len).map_err(errno)?,
                (None, Some(f)) if f.set_len(len).is_ok() => {}
                _ => nix::unistd::truncate(&path, len as i64)
                    .map_err(|e| Errno::from_i32(e as i32))?,
            }
        }
        if atime.is_some() || mtime.is_some() {
            let ts = |t: Option<TimeOrNow>| match t {
                None => TimeSpec::UTIME_OMIT,
                Some(TimeOrNow::Now) => TimeSpec::UTIME_NOW,
                Some(TimeOrNow::SpecificTime(t)) => {
                    match t.duration_since(SystemTime::UNIX_EPOCH) {
                        Ok(d) => TimeSpec::new(d.as_secs() as i64, d.subsec_nanos() as i64),
                        Err(e) => {
                            let d = e.duration();
                            let (s, n) = (d.as_secs() as i64, d.subsec_nanos() as i64);
                            if n == 0 {
                                TimeSpec::new(-s, 0)
                            } else {
                                TimeSpec::new(-s - 1, 1_000_000_000 - n)
                            }
                        }
                    }
                }
            };
            let set = || {
                nix::sys::stat::utimensat(
                    AT_FDCWD,
                    &path,
                    &ts(atime),
                    &ts(mtime),
                    UtimensatFlags::FollowSymlink,
                )
            };
            match &pending {
                Some(p) => p.locked(set),
                None => set(),
            }
            .map_err(|e| Errno::from_i32(e as i32))?;
        }
        self.cow.attr(&self.cow.table.get(ino)?)
    }
}

/// What a `setattr` changes.
struct SetAttr {
    mode: Option<u32>,
    uid: Option<u32>,
    gid: Option<u32>,
    size: Option<u64>,
    atime: Option<TimeOrNow>,
    mtime: Option<TimeOrNow>,
    fh: Option<FileHandle>,
}

/// The xattr protocol: size 0 asks for the length; a too-small buffer is `ERANGE`.
fn reply_sized(value: &[u8], size: u32, reply: ReplyXattr) {
    let Ok(len) = u32::try_from(value.len()) else {
        return reply.error(Errno::E2BIG);
    };
    if size == 0 {
        reply.size(len);
    } else if len > size {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(value);
    }
}

impl Filesystem for CowFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        for cap in [
            InitFlags::FUSE_ATOMIC_O_TRUNC,
            InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP,
            // The sandbox maps the workspace to its uids with an idmapped mount.
            InitFlags::FUSE_ALLOW_IDMAP,
        ] {
            let _ = config.add_capabilities(cap);
        }
        if self.want_passthrough {
            match config.add_capabilities(InitFlags::FUSE_PASSTHROUGH) {
                Ok(()) => {
                    config
                        .set_max_stack_depth(1)
                        .map_err(|_| std::io::Error::other("stack depth 1 refused"))?;
                    self.passthrough.store(true, Ordering::Relaxed);
                }
                Err(_) => {
                    tracing::info!("kernel offers no FUSE passthrough; the daemon serves I/O")
                }
            }
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.cow.lookup(parent.0, name.as_bytes()) {
            Ok(Some(node)) => self.entry(&node, reply),
            Ok(None) => reply.error(Errno::ENOENT),
            Err(e) => reply.error(e),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.cow.table.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.cow.table.get(ino.0).and_then(|n| self.cow.attr(&n)) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
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
        let s = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
            fh,
        };
        match self.setattr_inner(ino.0, s) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let node = match self.cow.table.get(ino.0) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        if let Some(fd) = &node.upper {
            match nix::fcntl::readlinkat(fd.as_ref(), "") {
                Ok(t) => reply.data(t.as_bytes()),
                Err(e) => reply.error(Errno::from_i32(e as i32)),
            }
        } else {
            match &node.lower {
                Some(e) if e.kind == cowspace_store::Kind::Symlink => reply.data(&e.data),
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
        let made = Cow::special_kind(mode).and_then(|_| {
            self.cow.make(
                parent.0,
                name.as_bytes(),
                Make::Special {
                    mode,
                    rdev: u64::from(rdev),
                },
                req.uid(),
                req.gid(),
            )
        });
        match made {
            Ok(n) => self.entry(&n, reply),
            Err(e) => reply.error(e),
        }
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
        match self.cow.make(
            parent.0,
            name.as_bytes(),
            Make::Dir { mode },
            req.uid(),
            req.gid(),
        ) {
            Ok(n) => self.entry(&n, reply),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.cow.remove(parent.0, name.as_bytes(), false) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
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
        match self.cow.make(
            parent.0,
            link_name.as_bytes(),
            Make::Symlink {
                target: target.as_os_str().as_bytes(),
            },
            req.uid(),
            req.gid(),
        ) {
            Ok(n) => self.entry(&n, reply),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
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
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let made = self.cow.table.get(ino.0).and_then(|n| {
            if n.kind == FileType::Directory {
                return Err(Errno::EPERM);
            }
            let source = {
                let _r = self.cow.ns.read().unwrap_or_else(|p| p.into_inner());
                self.cow.copy_up(n.ino, false)?
            };
            self.cow
                .make(newparent.0, newname.as_bytes(), Make::Link { source }, 0, 0)
        });
        match made {
            Ok(n) => self.entry(&n, reply),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let node = match self.cow.table.get(ino.0) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        if node.kind == FileType::Directory {
            return reply.error(Errno::EISDIR);
        }
        let (ino, file, pending) = match self.open_node(&node, flags.0) {
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
                    .filter(|_| rw || flags.0 & libc::O_ACCMODE == libc::O_RDONLY)
                }
                None => None,
            },
        };
        match backing {
            Some(id) => {
                let fh = self.add_handle(file, Some(Arc::clone(&id)), None, flags.0);
                reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), &id);
            }
            None => {
                let fh = self.add_handle(file, None, pending, flags.0);
                reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO);
            }
        }
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
        let made = self.cow.make(
            parent.0,
            name.as_bytes(),
            Make::File { mode },
            req.uid(),
            req.gid(),
        );
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
                let fh = self.add_handle(file, Some(Arc::clone(&id)), None, flags);
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
                let fh = self.add_handle(file, None, None, flags);
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

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let (file, pending, _) = match self.handle_io(fh.0) {
            Ok(x) => x,
            Err(e) => return reply.error(e),
        };
        let mut buf = vec![0u8; size.min(MAX_IO_BYTES) as usize];
        if let Some(p) = pending {
            return match p.read_at(&mut buf, offset) {
                Ok(n) => reply.data(&buf[..n]),
                Err(e) => reply.error(errno(e)),
            };
        }
        let mut n = 0;
        while n < buf.len() {
            match file.read_at(&mut buf[n..], offset + n as u64) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return reply.error(errno(e)),
            }
        }
        reply.data(&buf[..n]);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let (file, pending, append) = match self.handle_io(fh.0) {
            Ok(x) => x,
            Err(e) => return reply.error(e),
        };
        let written = match pending {
            Some(p) => p.write_at(&file, data, offset, append),
            None => file.write_all_at(data, offset),
        };
        match written {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lo: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
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
        drop(released);
        let mut backing = lock(&self.handles.backing);
        if backing
            .get(&ino.0)
            .is_some_and(|(_, w)| w.strong_count() == 0)
        {
            backing.remove(&ino.0);
        }
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let r = self.handle_file(fh.0).and_then(|f| {
            if datasync {
                f.sync_data()
            } else {
                f.sync_all()
            }
            .map_err(errno)
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let r = self.handle_io(fh.0).and_then(|(f, pending, _)| {
            // Ranges may move or vanish: a copy-up in progress is finished first.
            if let Some(p) = pending {
                p.finish().map_err(errno)?;
            }
            nix::fcntl::fallocate(
                f.as_ref(),
                nix::fcntl::FallocateFlags::from_bits_retain(mode),
                offset as i64,
                length as i64,
            )
            .map_err(|e| Errno::from_i32(e as i32))
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let node = match self.cow.table.get(ino.0) {
            Ok(n) if n.kind == FileType::Directory => n,
            Ok(_) => return reply.error(Errno::ENOTDIR),
            Err(e) => return reply.error(e),
        };
        match self.cow.list(&node) {
            Ok(entries) => {
                let fh = self.next();
                lock(&self.handles.dirs).insert(fh, Dir { entries });
                reply.opened(FileHandle(fh), FopenFlags::empty());
            }
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let node = match self.cow.table.get(ino.0) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        if offset == 0 {
            // A listing from the start (a rewind) shows the directory as it is now; later
            // offsets keep reading the listing taken then, so concurrent changes never
            // make an entry appear twice or be skipped.
            match self.cow.list(&node) {
                Ok(entries) => {
                    if let Some(d) = lock(&self.handles.dirs).get_mut(&fh.0) {
                        d.entries = entries;
                    }
                }
                Err(e) => return reply.error(e),
            }
        }
        let dirs = lock(&self.handles.dirs);
        let Some(dir) = dirs.get(&fh.0) else {
            return reply.error(Errno::EBADF);
        };
        let parent = if node.ino == super::node::ROOT_INO {
            node.ino
        } else {
            node.parent
        };
        for i in offset..2 + dir.entries.len() as u64 {
            let full = match i {
                0 => reply.add(INodeNo(node.ino), 1, FileType::Directory, "."),
                1 => reply.add(INodeNo(parent), 2, FileType::Directory, ".."),
                _ => {
                    let e = &dir.entries[(i - 2) as usize];
                    reply.add(INodeNo(e.ino), i + 1, e.kind, OsStr::from_bytes(&e.name))
                }
            };
            if full {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        lock(&self.handles.dirs).remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let r = self
            .cow
            .table
            .get(ino.0)
            .and_then(|n| self.cow.upper_of(&n))
            .and_then(|p| File::open(p).and_then(|f| f.sync_all()).map_err(errno));
        match r {
            // A directory only in the snapshot has nothing to sync.
            Ok(()) | Err(Errno::EIO) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match nix::sys::statvfs::statvfs(&self.cow.layers.upper) {
            Ok(s) => reply.statfs(
                s.blocks(),
                s.blocks_free(),
                s.blocks_available(),
                s.files(),
                s.files_free(),
                s.block_size() as u32,
                255,
                s.fragment_size() as u32,
            ),
            Err(e) => reply.error(Errno::from_i32(e as i32)),
        }
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        if reserved_xattr(name.as_bytes()) {
            return reply.error(Errno::NO_XATTR);
        }
        let node = match self.cow.table.get(ino.0) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        if node.upper.is_some() {
            if node.kind == FileType::Symlink {
                return reply.error(Errno::NO_XATTR);
            }
            match self.cow.upper_of(&node).map(|p| xattr::get_deref(p, name)) {
                Ok(Ok(Some(v))) => reply_sized(&v, size, reply),
                Ok(Ok(None)) => reply.error(Errno::NO_XATTR),
                Ok(Err(e)) => reply.error(errno(e)),
                Err(e) => reply.error(e),
            }
        } else {
            let found = node.lower.as_ref().and_then(|e| {
                e.xattrs
                    .iter()
                    .find(|(n, _)| n.as_slice() == name.as_bytes())
            });
            match found {
                Some((_, v)) => reply_sized(v, size, reply),
                None => reply.error(Errno::NO_XATTR),
            }
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let node = match self.cow.table.get(ino.0) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let mut names = Vec::new();
        if node.upper.is_some() {
            if node.kind != FileType::Symlink {
                let list = match self.cow.upper_of(&node).map(xattr::list_deref) {
                    Ok(Ok(l)) => l,
                    Ok(Err(e)) => return reply.error(errno(e)),
                    Err(e) => return reply.error(e),
                };
                for n in list {
                    if !reserved_xattr(n.as_bytes()) {
                        names.extend_from_slice(n.as_bytes());
                        names.push(0);
                    }
                }
            }
        } else if let Some(e) = &node.lower {
            for (n, _) in &e.xattrs {
                names.extend_from_slice(n);
                names.push(0);
            }
        }
        reply_sized(&names, size, reply);
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        if reserved_xattr(name.as_bytes()) {
            return reply.error(Errno::EPERM);
        }
        if name.as_bytes().starts_with(b"system.") {
            // POSIX ACLs are not kept (tools then set the mode with chmod, which the
            // kernel's attribute cache sees).
            return reply.error(Errno::EOPNOTSUPP);
        }
        let r = self.cow.table.get(ino.0).and_then(|n| {
            let n = {
                let _r = self.cow.ns.read().unwrap_or_else(|p| p.into_inner());
                self.cow.copy_up(n.ino, false)?
            };
            let p = self.cow.upper_of(&n)?;
            let exists = matches!(xattr::get_deref(&p, name), Ok(Some(_)));
            if flags & libc::XATTR_CREATE != 0 && exists {
                return Err(Errno::EEXIST);
            }
            if flags & libc::XATTR_REPLACE != 0 && !exists {
                return Err(Errno::NO_XATTR);
            }
            xattr::set_deref(&p, name, value).map_err(errno)
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        if reserved_xattr(name.as_bytes()) {
            return reply.error(Errno::NO_XATTR);
        }
        let r = self.cow.table.get(ino.0).and_then(|n| {
            let n = {
                let _r = self.cow.ns.read().unwrap_or_else(|p| p.into_inner());
                self.cow.copy_up(n.ino, false)?
            };
            let p = self.cow.upper_of(&n)?;
            xattr::remove_deref(&p, name).map_err(errno)
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // Permission bits are checked by the kernel (default_permissions).
        reply.ok();
    }
}
