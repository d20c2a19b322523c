//! Small helpers for the host objects a workspace is made of, reached through `O_PATH`
//! descriptors (`/proc/self/fd/N`): paths of held objects, opens for metadata, times,
//! and copies of file content in the kernel.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{AT_FDCWD, OFlag};
use nix::sys::stat::{Mode, UtimensatFlags};
use nix::sys::time::TimeSpec;

/// Buffer of a copy where the kernel cannot copy between the two files itself.
const PLAIN_COPY_BUF_BYTES: u64 = 1024 * 1024;

/// `/proc/self/fd/N`: a path that reaches exactly the object an `O_PATH` descriptor holds
/// (a symlink itself, not its target), whatever names it has now.
pub fn fd_path(fd: &impl std::os::fd::AsRawFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// `/proc/self/fd/N/name`: the entry `name` of the directory an `O_PATH` descriptor
/// holds. Upper entries are reached this way rather than by their full path, which may
/// be longer than `PATH_MAX` and costs a lookup per component.
pub fn at(dir: &impl std::os::fd::AsRawFd, name: &[u8]) -> PathBuf {
    let mut p = fd_path(dir);
    p.push(std::ffi::OsStr::from_bytes(name));
    p
}

/// Opens `path` without following a final symlink, for metadata only.
pub fn open_path(path: &Path) -> io::Result<OwnedFd> {
    nix::fcntl::open(
        path,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(io::Error::from)
}

/// Sets atime and mtime of `path` (not following a symlink) to `secs`.
pub fn set_times(path: &Path, secs: u64) -> io::Result<()> {
    let t = TimeSpec::new(secs as i64, 0);
    nix::sys::stat::utimensat(AT_FDCWD, path, &t, &t, UtimensatFlags::NoFollowSymlink)
        .map_err(io::Error::from)
}

/// Copies `len` bytes of `src` into the empty `dest`: a reflink where the filesystem can
/// share extents, else `copy_file_range` (in the kernel; no bytes pass through here).
pub fn copy_content(src: &File, dest: &File, len: u64) -> io::Result<()> {
    if crate::sys::ficlone(dest, src).is_ok() {
        return Ok(());
    }
    copy_range(src, dest, 0, len)
}

/// Copies bytes `[off, off + len)` of `src` to the same place in `dest`, in the kernel
/// (`copy_file_range`; a plain copy where the kernel cannot). `dest` must not append.
pub fn copy_range(src: &File, dest: &File, off: u64, len: u64) -> io::Result<()> {
    let mut off_in = off as i64;
    let mut off_out = off as i64;
    let mut left = len;
    while left > 0 {
        let chunk = left.min(1 << 30) as usize;
        match nix::fcntl::copy_file_range(
            src.as_fd(),
            Some(&mut off_in),
            dest.as_fd(),
            Some(&mut off_out),
            chunk,
        ) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the source ended before the bytes to copy",
                ));
            }
            Ok(n) => left -= n as u64,
            Err(nix::Error::EINTR) => {}
            Err(nix::Error::EXDEV | nix::Error::ENOSYS | nix::Error::EOPNOTSUPP) => {
                // Old kernels or odd filesystems: a plain copy of what is left.
                let mut buf = vec![0u8; left.min(PLAIN_COPY_BUF_BYTES) as usize];
                while left > 0 {
                    let n = left.min(buf.len() as u64) as usize;
                    src.read_exact_at(&mut buf[..n], off_in as u64)?;
                    dest.write_all_at(&buf[..n], off_out as u64)?;
                    off_in += n as i64;
                    off_out += n as i64;
                    left -= n as u64;
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// `fallocate(2)` with the request's `mode` bits as they came.
pub fn fallocate(file: &File, offset: u64, length: u64, mode: i32) -> io::Result<()> {
    nix::fcntl::fallocate(
        file,
        nix::fcntl::FallocateFlags::from_bits_retain(mode),
        offset as i64,
        length as i64,
    )
    .map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn copy_content_copies_exactly() {
        let tmp = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        fs::write(tmp.path().join("src"), &data).unwrap();
        let dest = File::create(tmp.path().join("dst")).unwrap();
        copy_content(
            &File::open(tmp.path().join("src")).unwrap(),
            &dest,
            data.len() as u64,
        )
        .unwrap();
        assert_eq!(fs::read(tmp.path().join("dst")).unwrap(), data);
    }
}
