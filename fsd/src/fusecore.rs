//! What both FUSE servers, the snapshot view (`view/`) and the workspace server
//! (`cow/`), answer the kernel alike: the one place where an error becomes an errno, the
//! entry and attribute TTL, file types and attributes, reads into a kept buffer, the xattr
//! reply protocol and the passthrough negotiation.

use std::cell::RefCell;
use std::fs;
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cowspace_store::{ErrorKind, Kind};
use fuser::{Errno, FileAttr, FileType, INodeNo, InitFlags, KernelConfig, ReplyXattr};
use nix::sys::stat::{FileStat, SFlag};

/// How long the kernel may trust entries (negative ones too) and attributes. A snapshot
/// never changes, and every change to a workspace goes through its mount, where the
/// kernel drops or refreshes what each change touches; so nothing the kernel caches goes
/// stale while a mount serves. A short bound would only make every walk ask again.
pub const TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// Longest name either server serves or makes.
pub const NAME_MAX_BYTES: u32 = 255;

/// Largest read (or write) the daemon answers (the kernel asks for at most its
/// `max_pages`).
pub const MAX_IO_BYTES: u32 = 16 * 1024 * 1024;

/// Largest read buffer a serving thread keeps between requests; a larger read gets a
/// buffer of its own.
const KEPT_READ_BUFFER_BYTES: usize = 1024 * 1024;

thread_local! {
    /// The serving thread's read buffer. A fresh zeroed buffer per `READ` cost page
    /// faults and zeroing on every file read for the first time.
    static READ_BUFFER: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with a buffer of `size` bytes, at most [`MAX_IO_BYTES`] (contents
/// unspecified: `f` fills what it uses).
pub fn with_read_buffer<R>(size: u32, f: impl FnOnce(&mut [u8]) -> R) -> R {
    let size = size.min(MAX_IO_BYTES) as usize;
    if size > KEPT_READ_BUFFER_BYTES {
        return f(&mut vec![0u8; size]);
    }
    READ_BUFFER.with_borrow_mut(|b| {
        if b.len() < size {
            b.resize(size, 0);
        }
        f(&mut b[..size])
    })
}

/// Locks `m`, taking it over if a panic poisoned it: every critical section of the
/// servers' maps is a single insert, update or remove, so a poisoned map is consistent.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The errno for a store error.
///
/// `NotFound` → `ENOENT`; `Corrupt` → `EIO`, logged naming the object (the data is never
/// served); everything else → `EIO`, logged. `what` names the operation for the log.
pub fn errno_of_store(what: &str, err: &cowspace_store::Error) -> Errno {
    match err.kind() {
        ErrorKind::NotFound => Errno::ENOENT,
        ErrorKind::Corrupt => {
            tracing::error!(op = what, error = %err, "corrupt store object; refusing to serve it");
            Errno::EIO
        }
        kind => {
            tracing::error!(op = what, kind = kind.as_str(), error = %err, "store read failed");
            Errno::EIO
        }
    }
}

/// The errno of a failed host I/O: its OS error, else `EIO`.
pub fn errno_of_io(err: io::Error) -> Errno {
    Errno::from_i32(err.raw_os_error().unwrap_or(libc::EIO))
}

/// The errno of a failed system call.
pub fn errno_of_nix(err: nix::Error) -> Errno {
    Errno::from_i32(err as i32)
}

/// The errno of a failed I/O on a blob-cache file, logged (`what` names the operation).
pub fn errno_of_blob_io(what: &str, err: io::Error) -> Errno {
    tracing::error!(op = what, error = %err, "blob cache I/O failed");
    errno_of_io(err)
}

/// The file type a snapshot entry is served as.
pub fn kind_file_type(kind: Kind) -> FileType {
    match kind {
        Kind::Dir => FileType::Directory,
        Kind::File | Kind::Hardlink => FileType::RegularFile,
        Kind::Symlink => FileType::Symlink,
        Kind::Fifo => FileType::NamedPipe,
        Kind::CharDevice => FileType::CharDevice,
        Kind::BlockDevice => FileType::BlockDevice,
    }
}

/// The file type a host object is served as.
pub fn host_file_type(ft: fs::FileType) -> FileType {
    if ft.is_dir() {
        FileType::Directory
    } else if ft.is_symlink() {
        FileType::Symlink
    } else if ft.is_fifo() {
        FileType::NamedPipe
    } else if ft.is_char_device() {
        FileType::CharDevice
    } else if ft.is_block_device() {
        FileType::BlockDevice
    } else if ft.is_socket() {
        FileType::Socket
    } else {
        FileType::RegularFile
    }
}

/// The file type of the `S_IFMT` bits of `mode`, if they name one.
pub fn mode_file_type(mode: u32) -> Option<FileType> {
    Some(match SFlag::from_bits_truncate(mode & libc::S_IFMT) {
        SFlag::S_IFDIR => FileType::Directory,
        SFlag::S_IFLNK => FileType::Symlink,
        SFlag::S_IFIFO => FileType::NamedPipe,
        SFlag::S_IFCHR => FileType::CharDevice,
        SFlag::S_IFBLK => FileType::BlockDevice,
        SFlag::S_IFSOCK => FileType::Socket,
        SFlag::S_IFREG => FileType::RegularFile,
        _ => return None,
    })
}

fn time(secs: i64, nsecs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsecs as u32)
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()) + Duration::from_nanos(nsecs as u64)
    }
}

/// Attributes of a host object, served with inode number `ino`.
pub fn attr_of_stat(ino: u64, st: &FileStat) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        atime: time(st.st_atime, st.st_atime_nsec),
        mtime: time(st.st_mtime, st.st_mtime_nsec),
        ctime: time(st.st_ctime, st.st_ctime_nsec),
        crtime: time(st.st_ctime, st.st_ctime_nsec),
        kind: mode_file_type(st.st_mode).unwrap_or(FileType::RegularFile),
        perm: (st.st_mode & 0o7777) as u16,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: st.st_rdev as u32,
        blksize: st.st_blksize as u32,
        flags: 0,
    }
}

/// The attributes sent with a negative entry (node 0: "no such name"; the kernel reads
/// none of them).
pub fn negative_attr() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}

/// The xattr protocol: size 0 asks for the length; a too-small buffer is `ERANGE`.
pub fn reply_sized(value: &[u8], size: u32, reply: ReplyXattr) {
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

/// Asks for FUSE passthrough at stack depth 1 (backing files live on a plain
/// filesystem, and kernel overlayfs accepts a FUSE mount as a lower layer only at depth
/// 1). `false`: the kernel offers none, and the daemon serves the I/O.
pub fn negotiate_passthrough(config: &mut KernelConfig) -> io::Result<bool> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use cowspace_store::Error;

    #[test]
    fn store_kinds_map_to_errnos() {
        let nf = Error::NotFound {
            what: "tree",
            name: "x".into(),
        };
        assert_eq!(errno_of_store("t", &nf), Errno::ENOENT);
        let c = Error::Corrupt {
            what: "chunk",
            id: "ab".into(),
            why: "hashes to cd".into(),
        };
        assert_eq!(errno_of_store("t", &c), Errno::EIO);
        assert_eq!(errno_of_store("t", &Error::Busy("gc".into())), Errno::EIO);
    }

    #[test]
    fn io_errors_keep_their_os_error() {
        let e = io::Error::from_raw_os_error(libc::ENOSPC);
        assert_eq!(errno_of_io(e), Errno::from_i32(libc::ENOSPC));
        assert_eq!(errno_of_io(io::Error::other("no os error")), Errno::EIO);
        assert_eq!(
            errno_of_nix(nix::Error::EXDEV),
            Errno::from_i32(libc::EXDEV)
        );
    }

    #[test]
    fn modes_name_their_file_types() {
        assert_eq!(
            mode_file_type(libc::S_IFDIR | 0o755),
            Some(FileType::Directory)
        );
        assert_eq!(mode_file_type(libc::S_IFSOCK), Some(FileType::Socket));
        assert_eq!(mode_file_type(0o644), None);
        assert_eq!(kind_file_type(Kind::Hardlink), FileType::RegularFile);
    }
}
