//! The seam between the sandbox's setup sequence and the kernel.
//!
//! [`crate::rootfs::apply`] builds the sandbox's filesystem view only through
//! [`Syscall`], so unit tests run the real sequence without root against a recording
//! implementation and assert the calls and their order. [`LinuxSyscall`] is the real one.

use std::io;
use std::os::fd::BorrowedFd;
use std::path::Path;

use nix::mount::{MntFlags, MsFlags};
use nix::sys::stat::Mode;

/// The privileged filesystem operations of the setup sequence.
///
/// Every method is the plain kernel call: no retries, no fallbacks; the caller names the
/// step when one fails.
pub trait Syscall {
    /// `mount(2)`.
    fn mount(
        &self,
        source: Option<&str>,
        target: &Path,
        fstype: Option<&str>,
        flags: MsFlags,
        data: Option<&str>,
    ) -> io::Result<()>;
    /// `mkdir(2)`; an existing directory is not an error.
    fn mkdir(&self, path: &Path, mode: u32) -> io::Result<()>;
    /// Creates (or truncates) a regular file with `contents`.
    fn write_file(&self, path: &Path, contents: &[u8]) -> io::Result<()>;
    /// `symlink(2)`: `link` pointing at `target`.
    fn symlink(&self, target: &Path, link: &Path) -> io::Result<()>;
    /// `move_mount(2)` of a detached mount onto `target`.
    fn attach(&self, mount: BorrowedFd<'_>, target: &Path) -> io::Result<()>;
    /// `pivot_root(2)`.
    fn pivot_root(&self, new_root: &Path, put_old: &Path) -> io::Result<()>;
    /// `umount2(target, MNT_DETACH)`.
    fn umount_detach(&self, target: &Path) -> io::Result<()>;
    /// `rmdir(2)`.
    fn rmdir(&self, path: &Path) -> io::Result<()>;
    /// `chdir(2)`.
    fn chdir(&self, path: &Path) -> io::Result<()>;
}

/// The real kernel.
#[derive(Debug, Default, Clone, Copy)]
pub struct LinuxSyscall;

impl Syscall for LinuxSyscall {
    fn mount(
        &self,
        source: Option<&str>,
        target: &Path,
        fstype: Option<&str>,
        flags: MsFlags,
        data: Option<&str>,
    ) -> io::Result<()> {
        nix::mount::mount(source, target, fstype, flags, data).map_err(io::Error::from)
    }

    fn mkdir(&self, path: &Path, mode: u32) -> io::Result<()> {
        match nix::unistd::mkdir(path, Mode::from_bits_truncate(mode)) {
            Ok(()) | Err(nix::errno::Errno::EEXIST) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    fn write_file(&self, path: &Path, contents: &[u8]) -> io::Result<()> {
        std::fs::write(path, contents)
    }

    fn symlink(&self, target: &Path, link: &Path) -> io::Result<()> {
        std::os::unix::fs::symlink(target, link)
    }

    fn attach(&self, mount: BorrowedFd<'_>, target: &Path) -> io::Result<()> {
        crate::sys::move_mount(mount, target)
    }

    fn pivot_root(&self, new_root: &Path, put_old: &Path) -> io::Result<()> {
        nix::unistd::pivot_root(new_root, put_old).map_err(io::Error::from)
    }

    fn umount_detach(&self, target: &Path) -> io::Result<()> {
        nix::mount::umount2(target, MntFlags::MNT_DETACH).map_err(io::Error::from)
    }

    fn rmdir(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_dir(path)
    }

    fn chdir(&self, path: &Path) -> io::Result<()> {
        nix::unistd::chdir(path).map_err(io::Error::from)
    }
}
