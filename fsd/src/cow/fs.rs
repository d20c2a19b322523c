//! A workspace as a [`FileSystem`]: requests become [`Cow`] calls. In
//! [`OpenMode::Cached`] opens are "not implemented" and I/O arrives by inode
//! (`cached.rs`); in [`OpenMode::Passthrough`] opens offer passthrough backing files
//! (blob-cache files for unmodified files, the upper files once written) so reads, writes
//! and mmap never reach the daemon.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::OpenMode;
use super::fdio::fallocate;
use super::handles::Handles;
use super::namespace::Make;
use super::ops::Cow;
use super::setattr::set_attr;
use crate::blobfiles::read_full_at;
use crate::filesystem::{
    self, Attr, Context, DirPlusSink, DirSink, Errno, Features, FileKind, FileSystem, Listings,
    NAME_MAX_BYTES, Opened, RenameFlags, SetAttr, StatFs, errno_of_io, errno_of_nix,
};
use crate::placement::Placement;

/// One workspace's filesystem, as a server serves it.
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

    /// The attributes of a node just looked up or made; the lookup is given back when
    /// they cannot be read.
    fn entry(&self, node: &super::node::Node) -> Result<Attr, Errno> {
        self.cow.attr(node).inspect_err(|_| {
            self.cow.table.forget(node.ino, 1);
        })
    }

    /// A second name `name` in `parent` for node `ino`.
    fn link(&self, ino: u64, parent: u64, name: &[u8]) -> Result<super::node::Node, Errno> {
        let n = self.cow.table.get(ino)?;
        if n.kind == FileKind::Directory {
            return Err(Errno::EPERM);
        }
        let source = {
            let _r = self.cow.ns_read();
            self.cow.copy_up(n.ino, false)?
        };
        self.cow.make(parent, name, Make::Link { source }, 0, 0)
    }
}

impl FileSystem for CowFs {
    fn features(&self) -> Features {
        Features {
            // Listings carry attributes (a walk then needs no lookup per name), in every
            // piece of a listing.
            listings: Listings::Plus,
            // Opens never reach the daemon in the cached mode, so `O_TRUNC` must come as a
            // `setattr` there.
            atomic_o_trunc: self.mode == OpenMode::Passthrough,
            direct_io_mmap: true,
            passthrough: self.want_passthrough,
        }
    }

    fn passthrough_taken(&self, taken: bool) {
        self.passthrough.store(taken, Ordering::Relaxed);
    }

    /// Every request but `forget` (sent by whichever process reclaims memory) first
    /// places the serving thread on its requester's CPUs ([`crate::placement`]).
    fn serving(&self, ctx: &Context) {
        if let Some(p) = &self.placement {
            p.serve(ctx.pid);
        }
    }

    fn lookup(&self, _ctx: &Context, parent: u64, name: &[u8]) -> Result<Option<Attr>, Errno> {
        match self.cow.lookup(parent, name)? {
            Some(node) => self.entry(&node).map(Some),
            None => Ok(None),
        }
    }

    fn forget(&self, ino: u64, n: u64) {
        let held = self.cow.table.find(ino);
        self.cow.table.forget(ino, n);
        if let Some(node) = held
            && self.cow.table.find(ino).is_none()
        {
            self.forgotten(&node);
        }
    }

    fn getattr(&self, _ctx: &Context, ino: u64) -> Result<Attr, Errno> {
        self.cow.table.get(ino).and_then(|n| self.cow.attr(&n))
    }

    fn setattr(&self, _ctx: &Context, ino: u64, fh: u64, change: SetAttr) -> Result<Attr, Errno> {
        let n = self.cow.table.get(ino)?;
        let node = self.changed_node(n.ino, change.empties())?;
        let by_handle = (fh != 0 && change.size.is_some())
            .then(|| self.handles.file(fh).ok())
            .flatten();
        set_attr(&self.cow, ino, node, by_handle, change)
    }

    fn readlink(&self, _ctx: &Context, ino: u64) -> Result<Vec<u8>, Errno> {
        let node = self.cow.table.get(ino)?;
        if let Some(fd) = &node.upper {
            use std::os::unix::ffi::OsStringExt;
            return nix::fcntl::readlinkat(fd.as_ref(), "")
                .map(OsStringExt::into_vec)
                .map_err(errno_of_nix);
        }
        match &node.lower {
            Some(e) if e.kind == cowspace_store::Kind::Symlink => Ok(e.data().to_vec()),
            _ => Err(Errno::EINVAL),
        }
    }

    fn make(
        &self,
        ctx: &Context,
        parent: u64,
        name: &[u8],
        what: filesystem::Make<'_>,
    ) -> Result<Attr, Errno> {
        let made = match what {
            filesystem::Make::File { mode } => Make::File { mode },
            filesystem::Make::Dir { mode } => Make::Dir { mode },
            filesystem::Make::Symlink { target } => Make::Symlink { target },
            filesystem::Make::Special { mode, rdev } => match Cow::special_kind(mode)? {
                // A regular file: a `create` the kernel makes this way in the cached mode.
                FileKind::RegularFile => Make::File { mode },
                _ => Make::Special { mode, rdev },
            },
            filesystem::Make::Link { ino } => {
                let node = self.link(ino, parent, name)?;
                return self.entry(&node);
            }
        };
        let node = self.cow.make(parent, name, made, ctx.uid, ctx.gid)?;
        self.entry(&node)
    }

    fn remove(&self, _ctx: &Context, parent: u64, name: &[u8], dir: bool) -> Result<(), Errno> {
        self.cow.remove(parent, name, dir)
    }

    fn rename(
        &self,
        _ctx: &Context,
        parent: u64,
        name: &[u8],
        new_parent: u64,
        new_name: &[u8],
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        self.cow.rename(parent, name, new_parent, new_name, flags)
    }

    fn open(&self, _ctx: &Context, ino: u64, flags: i32) -> Result<Opened, Errno> {
        self.opens.fetch_add(1, Ordering::Relaxed);
        if self.mode == OpenMode::Cached {
            // "Not implemented": the kernel opens every file of this mount without asking
            // from now on (handle 0, its pages kept between opens).
            return Err(Errno::ENOSYS);
        }
        self.open_with_handle(ino, flags)
    }

    fn create(
        &self,
        ctx: &Context,
        parent: u64,
        name: &[u8],
        mode: u32,
        flags: i32,
    ) -> Result<(Attr, Opened), Errno> {
        if self.mode == OpenMode::Cached {
            // The kernel then makes new files with `mknod` and opens them as any other.
            return Err(Errno::ENOSYS);
        }
        self.create_open(ctx, parent, name, mode, flags)
    }

    fn read(
        &self,
        _ctx: &Context,
        ino: u64,
        fh: u64,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, Errno> {
        if fh == 0 {
            return self.read_by_inode(ino, offset, buf);
        }
        match self.handles.io(fh)? {
            (_, Some(p), _) => p.read_at(buf, offset).map_err(errno_of_io),
            (file, None, _) => read_full_at(&file, buf, offset).map_err(errno_of_io),
        }
    }

    fn write(
        &self,
        _ctx: &Context,
        ino: u64,
        fh: u64,
        offset: u64,
        data: &[u8],
    ) -> Result<(), Errno> {
        if fh == 0 {
            return self.write_by_inode(ino, offset, data);
        }
        let (file, pending, append) = self.handles.io(fh)?;
        match pending {
            Some(p) => p.write_at(&file, data, offset, append),
            None => file.write_all_at(data, offset),
        }
        .map_err(errno_of_io)
    }

    fn release(&self, _ino: u64, fh: u64) {
        self.handles.release(fh);
    }

    fn fsync(&self, _ctx: &Context, ino: u64, fh: u64, datasync: bool) -> Result<(), Errno> {
        if fh == 0 {
            return self.fsync_by_inode(ino, datasync);
        }
        let f = self.handles.file(fh)?;
        if datasync {
            f.sync_data()
        } else {
            f.sync_all()
        }
        .map_err(errno_of_io)
    }

    fn fsyncdir(&self, _ctx: &Context, ino: u64) -> Result<(), Errno> {
        let r = self
            .cow
            .table
            .get(ino)
            .and_then(|n| self.cow.upper_of(&n))
            .and_then(|p| {
                File::open(p)
                    .and_then(|f| f.sync_all())
                    .map_err(errno_of_io)
            });
        match r {
            // A directory only in the snapshot has nothing to sync.
            Ok(()) | Err(Errno::EIO) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn fallocate(
        &self,
        _ctx: &Context,
        ino: u64,
        fh: u64,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> Result<(), Errno> {
        if fh == 0 {
            return self.fallocate_by_inode(ino, offset, length, mode);
        }
        let (f, pending, _) = self.handles.io(fh)?;
        // Ranges may move or vanish: a copy-up in progress is finished first.
        if let Some(p) = pending {
            p.finish().map_err(errno_of_io)?;
        }
        fallocate(&f, offset, length, mode).map_err(errno_of_io)
    }

    fn readdir(
        &self,
        _ctx: &Context,
        ino: u64,
        offset: u64,
        out: &mut dyn DirSink,
    ) -> Result<(), Errno> {
        self.do_readdir(ino, offset, out)
    }

    fn readdirplus(
        &self,
        _ctx: &Context,
        ino: u64,
        offset: u64,
        out: &mut dyn DirPlusSink,
    ) -> Result<(), Errno> {
        self.do_readdirplus(ino, offset, out)
    }

    fn statfs(&self, _ctx: &Context, _ino: u64) -> Result<StatFs, Errno> {
        let s = nix::sys::statvfs::statvfs(&self.cow.layers.upper).map_err(errno_of_nix)?;
        Ok(StatFs {
            blocks: s.blocks(),
            bfree: s.blocks_free(),
            bavail: s.blocks_available(),
            files: s.files(),
            ffree: s.files_free(),
            bsize: s.block_size() as u32,
            namelen: NAME_MAX_BYTES,
            frsize: s.fragment_size() as u32,
        })
    }

    fn getxattr(&self, _ctx: &Context, ino: u64, name: &[u8]) -> Result<Vec<u8>, Errno> {
        self.do_getxattr(ino, name)
    }

    fn listxattr(&self, _ctx: &Context, ino: u64) -> Result<Vec<u8>, Errno> {
        self.do_listxattr(ino)
    }

    fn setxattr(
        &self,
        _ctx: &Context,
        ino: u64,
        name: &[u8],
        value: &[u8],
        flags: i32,
    ) -> Result<(), Errno> {
        self.do_setxattr(ino, name, value, flags)
    }

    fn removexattr(&self, _ctx: &Context, ino: u64, name: &[u8]) -> Result<(), Errno> {
        self.do_removexattr(ino, name)
    }

    /// Permission bits are checked by the kernel (default_permissions).
    fn access(&self, _ctx: &Context, _ino: u64, _mask: i32) -> Result<(), Errno> {
        Ok(())
    }
}
