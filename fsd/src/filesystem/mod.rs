//! The filesystem core's interface: what a server asks of a filesystem, wire-free, in
//! the sense of virtiofsd's `filesystem.rs`. Two cores implement it, the snapshot view
//! (`view/`) and the workspace (`cow/`); one server speaks FUSE for either
//! ([`crate::fuse::FuseServer`]), and any other protocol serves the same cores through
//! this trait.
//!
//! Inode numbers are the core's; each `lookup`, `create`-like call and each entry a
//! `readdirplus` sink takes counts one lookup, which `forget` gives back. Handle 0 means
//! "no open": a core answers I/O by inode then (the cached open modes, and stateless
//! protocols).

mod types;
mod util;

pub use types::{
    Attr, Backing, BackingKey, Context, DirPlusSink, DirSink, Errno, Features, FileKind, Listings,
    Opened, RenameFlags, SetAttr, SetTime, StatFs,
};
pub use util::{
    MAX_IO_BYTES, NAME_MAX_BYTES, attr_of_stat, errno_of_blob_io, errno_of_io, errno_of_nix,
    errno_of_store, host_file_type, kind_file_type, lock, mode_file_type, with_read_buffer,
};

/// What makes a new name.
#[derive(Clone, Copy, Debug)]
pub enum Make<'a> {
    /// A regular file of `mode`.
    File {
        mode: u32,
    },
    Dir {
        mode: u32,
    },
    Symlink {
        target: &'a [u8],
    },
    /// A device, FIFO or socket (`mode` carries its type).
    Special {
        mode: u32,
        rdev: u64,
    },
    /// A second name for node `ino`.
    Link {
        ino: u64,
    },
}

/// A filesystem a server serves. The defaults answer as a read-only filesystem does:
/// every change is `EROFS`.
pub trait FileSystem: Send + Sync + 'static {
    /// What the core wants of the session; asked once, before any request.
    fn features(&self) -> Features;

    /// Whether the kernel took passthrough (after [`FileSystem::features`] asked for it).
    fn passthrough_taken(&self, _taken: bool) {}

    /// Called before every request but `forget`, with who asks.
    fn serving(&self, _ctx: &Context) {}

    /// `name` in directory `parent`: its attributes (a lookup taken), or `None` when it
    /// does not exist.
    fn lookup(&self, ctx: &Context, parent: u64, name: &[u8]) -> Result<Option<Attr>, Errno>;

    /// Drops `n` lookups of `ino`.
    fn forget(&self, ino: u64, n: u64);

    fn getattr(&self, ctx: &Context, ino: u64) -> Result<Attr, Errno>;

    /// Applies `change` (through open handle `fh`, if not 0) and gives the attributes after.
    fn setattr(
        &self,
        _ctx: &Context,
        _ino: u64,
        _fh: u64,
        _change: SetAttr,
    ) -> Result<Attr, Errno> {
        Err(Errno::EROFS)
    }

    fn readlink(&self, ctx: &Context, ino: u64) -> Result<Vec<u8>, Errno>;

    /// Makes `name` in `parent` (owned by the requester) and gives its attributes (a
    /// lookup taken).
    fn make(
        &self,
        _ctx: &Context,
        _parent: u64,
        _name: &[u8],
        _what: Make<'_>,
    ) -> Result<Attr, Errno> {
        Err(Errno::EROFS)
    }

    /// Removes `name` from `parent`: a directory when `dir`, else anything else.
    fn remove(&self, _ctx: &Context, _parent: u64, _name: &[u8], _dir: bool) -> Result<(), Errno> {
        Err(Errno::EROFS)
    }

    fn rename(
        &self,
        _ctx: &Context,
        _parent: u64,
        _name: &[u8],
        _new_parent: u64,
        _new_name: &[u8],
        _flags: RenameFlags,
    ) -> Result<(), Errno> {
        Err(Errno::EROFS)
    }

    /// Opens `ino` with `flags` (`open(2)`'s). `ENOSYS`: the core wants no opens, and
    /// I/O comes by inode (handle 0).
    fn open(&self, ctx: &Context, ino: u64, flags: i32) -> Result<Opened, Errno>;

    /// Makes file `name` in `parent` as [`FileSystem::make`] does and opens it.
    fn create(
        &self,
        _ctx: &Context,
        _parent: u64,
        _name: &[u8],
        _mode: u32,
        _flags: i32,
    ) -> Result<(Attr, Opened), Errno> {
        Err(Errno::EROFS)
    }

    /// Reads into `buf` from `offset`; gives the bytes read (fewer only at the end).
    fn read(
        &self,
        ctx: &Context,
        ino: u64,
        fh: u64,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, Errno>;

    /// Writes all of `data` at `offset`.
    fn write(
        &self,
        _ctx: &Context,
        _ino: u64,
        _fh: u64,
        _offset: u64,
        _data: &[u8],
    ) -> Result<(), Errno> {
        Err(Errno::EROFS)
    }

    /// The open `fh` of `ino` is closed.
    fn release(&self, ino: u64, fh: u64);

    /// Makes what was written to `ino` durable (its data only when `datasync`).
    fn fsync(&self, _ctx: &Context, _ino: u64, _fh: u64, _datasync: bool) -> Result<(), Errno> {
        Ok(())
    }

    fn fsyncdir(&self, _ctx: &Context, _ino: u64) -> Result<(), Errno> {
        Ok(())
    }

    fn fallocate(
        &self,
        _ctx: &Context,
        _ino: u64,
        _fh: u64,
        _offset: u64,
        _length: u64,
        _mode: i32,
    ) -> Result<(), Errno> {
        Err(Errno::EROFS)
    }

    /// Directory `ino`'s entries after `offset` (0: from the start, with `.` and `..`).
    fn readdir(
        &self,
        ctx: &Context,
        ino: u64,
        offset: u64,
        out: &mut dyn DirSink,
    ) -> Result<(), Errno>;

    /// As [`FileSystem::readdir`], each entry with its attributes and a lookup.
    fn readdirplus(
        &self,
        ctx: &Context,
        ino: u64,
        offset: u64,
        out: &mut dyn DirPlusSink,
    ) -> Result<(), Errno>;

    fn statfs(&self, ctx: &Context, ino: u64) -> Result<StatFs, Errno>;

    /// The value of extended attribute `name`.
    fn getxattr(&self, ctx: &Context, ino: u64, name: &[u8]) -> Result<Vec<u8>, Errno>;

    /// The names of `ino`'s extended attributes, each followed by a NUL.
    fn listxattr(&self, ctx: &Context, ino: u64) -> Result<Vec<u8>, Errno>;

    /// Sets attribute `name` (`flags`: `XATTR_CREATE`, `XATTR_REPLACE`).
    fn setxattr(
        &self,
        _ctx: &Context,
        _ino: u64,
        _name: &[u8],
        _value: &[u8],
        _flags: i32,
    ) -> Result<(), Errno> {
        Err(Errno::EROFS)
    }

    fn removexattr(&self, _ctx: &Context, _ino: u64, _name: &[u8]) -> Result<(), Errno> {
        Err(Errno::EROFS)
    }

    /// Whether the requester may access `ino` as `mask` asks (`access(2)`'s bits);
    /// permission bits are the kernel's (`default_permissions`), so this answers only
    /// what a core refuses whoever asks.
    fn access(&self, _ctx: &Context, _ino: u64, mask: i32) -> Result<(), Errno> {
        if mask & libc::W_OK != 0 {
            Err(Errno::EROFS)
        } else {
            Ok(())
        }
    }

    /// An open of `ino` was passed through to its backing file.
    fn passed_through(&self, _ino: u64) {}
}
