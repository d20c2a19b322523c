//! What both cores answer alike: the one place where an error becomes an errno, file
//! kinds and attributes of host objects, reads into a kept buffer, the lock of the cores'
//! maps.

use std::cell::RefCell;
use std::fs;
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cowspace_store::{ErrorKind, Kind};
use nix::sys::stat::{FileStat, SFlag};

use super::{Attr, Errno, FileKind};

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
pub fn kind_file_type(kind: Kind) -> FileKind {
    match kind {
        Kind::Dir => FileKind::Directory,
        Kind::File | Kind::Hardlink => FileKind::RegularFile,
        Kind::Symlink => FileKind::Symlink,
        Kind::Fifo => FileKind::NamedPipe,
        Kind::CharDevice => FileKind::CharDevice,
        Kind::BlockDevice => FileKind::BlockDevice,
    }
}

/// The file type a host object is served as.
pub fn host_file_type(ft: fs::FileType) -> FileKind {
    if ft.is_dir() {
        FileKind::Directory
    } else if ft.is_symlink() {
        FileKind::Symlink
    } else if ft.is_fifo() {
        FileKind::NamedPipe
    } else if ft.is_char_device() {
        FileKind::CharDevice
    } else if ft.is_block_device() {
        FileKind::BlockDevice
    } else if ft.is_socket() {
        FileKind::Socket
    } else {
        FileKind::RegularFile
    }
}

/// The file type of the `S_IFMT` bits of `mode`, if they name one.
pub fn mode_file_type(mode: u32) -> Option<FileKind> {
    Some(match SFlag::from_bits_truncate(mode & libc::S_IFMT) {
        SFlag::S_IFDIR => FileKind::Directory,
        SFlag::S_IFLNK => FileKind::Symlink,
        SFlag::S_IFIFO => FileKind::NamedPipe,
        SFlag::S_IFCHR => FileKind::CharDevice,
        SFlag::S_IFBLK => FileKind::BlockDevice,
        SFlag::S_IFSOCK => FileKind::Socket,
        SFlag::S_IFREG => FileKind::RegularFile,
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
pub fn attr_of_stat(ino: u64, st: &FileStat) -> Attr {
    Attr {
        ino,
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        atime: time(st.st_atime, st.st_atime_nsec),
        mtime: time(st.st_mtime, st.st_mtime_nsec),
        ctime: time(st.st_ctime, st.st_ctime_nsec),
        kind: mode_file_type(st.st_mode).unwrap_or(FileKind::RegularFile),
        perm: (st.st_mode & 0o7777) as u16,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: st.st_rdev as u32,
        blksize: st.st_blksize as u32,
    }
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
            Some(FileKind::Directory)
        );
        assert_eq!(mode_file_type(libc::S_IFSOCK), Some(FileKind::Socket));
        assert_eq!(mode_file_type(0o644), None);
        assert_eq!(kind_file_type(Kind::Hardlink), FileKind::RegularFile);
    }
}
