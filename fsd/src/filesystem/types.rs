//! The values the filesystem core speaks in: errors, file kinds, attributes, the changes
//! `setattr` asks for, opens, listings' sinks and statfs. None of them belongs to a wire
//! protocol; each server ([`crate::fuse`]) converts them to its own.

use std::fs::File;
use std::sync::Arc;
use std::time::SystemTime;

/// An error answered to a request: a Linux errno.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Errno(i32);

impl Errno {
    pub const EPERM: Errno = Errno(libc::EPERM);
    pub const ENOENT: Errno = Errno(libc::ENOENT);
    pub const EIO: Errno = Errno(libc::EIO);
    pub const EBADF: Errno = Errno(libc::EBADF);
    pub const EEXIST: Errno = Errno(libc::EEXIST);
    pub const EXDEV: Errno = Errno(libc::EXDEV);
    pub const ENOTDIR: Errno = Errno(libc::ENOTDIR);
    pub const EISDIR: Errno = Errno(libc::EISDIR);
    pub const EINVAL: Errno = Errno(libc::EINVAL);
    pub const ENOSPC: Errno = Errno(libc::ENOSPC);
    pub const EROFS: Errno = Errno(libc::EROFS);
    pub const E2BIG: Errno = Errno(libc::E2BIG);
    pub const ERANGE: Errno = Errno(libc::ERANGE);
    pub const ENAMETOOLONG: Errno = Errno(libc::ENAMETOOLONG);
    pub const ENOSYS: Errno = Errno(libc::ENOSYS);
    pub const ENOTEMPTY: Errno = Errno(libc::ENOTEMPTY);
    pub const ENOTTY: Errno = Errno(libc::ENOTTY);
    pub const EOPNOTSUPP: Errno = Errno(libc::EOPNOTSUPP);
    /// "No such attribute" (`ENODATA` on Linux).
    pub const NO_XATTR: Errno = Errno(libc::ENODATA);

    /// The errno numbered `n`; a number that is no errno (0 or negative) is `EIO`.
    pub fn from_i32(n: i32) -> Errno {
        if n > 0 { Errno(n) } else { Errno::EIO }
    }

    pub fn code(self) -> i32 {
        self.0
    }
}

impl std::fmt::Display for Errno {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", std::io::Error::from_raw_os_error(self.0))
    }
}

/// What kind of object a name is.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum FileKind {
    RegularFile,
    Directory,
    Symlink,
    NamedPipe,
    CharDevice,
    BlockDevice,
    Socket,
}

/// An object's attributes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    /// 512-byte blocks allocated.
    pub blocks: u64,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    pub kind: FileKind,
    /// Permission bits (`0o7777`).
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
}

/// Who asks: the requester's ids and process.
#[derive(Clone, Copy, Debug)]
pub struct Context {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

/// A time `setattr` sets.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum SetTime {
    /// The server's clock at the change.
    Now,
    At(SystemTime),
}

/// What a `setattr` changes (`None`: left as it is).
#[derive(Clone, Copy, Default, Debug)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
}

impl SetAttr {
    /// Whether the file's content is cut to nothing (so a copy-up need not copy it).
    pub fn empties(&self) -> bool {
        self.size == Some(0)
    }
}

/// How a rename treats an existing target (`renameat2(2)`'s flags).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct RenameFlags(u32);

impl RenameFlags {
    pub const NOREPLACE: RenameFlags = RenameFlags(libc::RENAME_NOREPLACE);
    pub const EXCHANGE: RenameFlags = RenameFlags(libc::RENAME_EXCHANGE);
    pub const WHITEOUT: RenameFlags = RenameFlags(libc::RENAME_WHITEOUT);

    pub fn from_bits(bits: u32) -> RenameFlags {
        RenameFlags(bits)
    }

    pub fn bits(self) -> u32 {
        self.0
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn contains(self, other: RenameFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

/// A file a server may hand to the kernel as an open's backing file, so its reads and
/// writes never reach the daemon (FUSE passthrough). `key` names the file: the kernel
/// takes one backing file per inode, so an open is passed through only when the inode
/// has no live backing or one with the same key.
pub struct Backing {
    pub file: Arc<File>,
    pub key: BackingKey,
}

/// What names a backing file (the core's choice: for instance its device and inode).
pub type BackingKey = (u64, u64, u64);

/// An answered open.
pub struct Opened {
    /// The handle later requests of this open carry.
    pub fh: u64,
    /// The kernel keeps the file's cached pages from earlier opens.
    pub keep_cache: bool,
    /// Reads and writes bypass the kernel's page cache.
    pub direct_io: bool,
    /// A close sends no flush.
    pub no_flush: bool,
    /// A backing file for passthrough, if the core offers one (the server then drops
    /// `keep_cache` and `direct_io`, which passthrough does not take).
    pub backing: Option<Backing>,
}

/// Receives a listing's entries; `add` answers `true` when full (the entry was not
/// taken).
pub trait DirSink {
    /// An entry named `name` of `kind`, numbered `ino`; `next` is the offset a listing
    /// continued after it starts from.
    fn add(&mut self, ino: u64, next: u64, kind: FileKind, name: &[u8]) -> bool;
}

/// Receives a listing's entries with their attributes (each entry but `.` and `..` is a
/// lookup, as `lookup` makes: a full sink's entry was not taken and its lookup is given
/// back by the core).
pub trait DirPlusSink {
    fn add(&mut self, next: u64, name: &[u8], attr: &Attr) -> bool;
}

/// The filesystem's figures for `statfs`.
#[derive(Clone, Copy, Debug, Default)]
pub struct StatFs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}

/// How listings are best asked for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Listings {
    /// Every piece of a listing with attributes.
    Plus,
    /// With attributes when the kernel judges them useful.
    PlusAuto,
}

/// What a core wants of the server's session, asked once at its start.
#[derive(Clone, Copy, Debug)]
pub struct Features {
    pub listings: Listings,
    /// Opens with `O_TRUNC` come as one request (else a `setattr` follows the open).
    pub atomic_o_trunc: bool,
    /// Shared mmap of files opened with direct I/O.
    pub direct_io_mmap: bool,
    /// Passthrough of opens the core gives a [`Backing`].
    pub passthrough: bool,
}
