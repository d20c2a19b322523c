//! The seam between the sandbox's setup sequence and the kernel.
//!
//! The privileged calls of init's setup (`init::set_up`: session, ids, hostname, the
//! filesystem view of [`crate::rootfs::apply`], loopback, rlimits, capabilities,
//! `no_new_privs`, seccomp), its parent-death signal, the cgroup namespace it enters and
//! the port proxy's `setns` go through [`Syscall`], so unit tests run the real sequence
//! without root against a recording implementation (`testing::Recorder`, in test
//! builds) and assert the calls and their order. [`LinuxSyscall`] is the real one.

use std::io;
use std::os::fd::BorrowedFd;
use std::path::Path;

use nix::mount::{MntFlags, MsFlags};
use nix::sched::CloneFlags;
use nix::sys::resource::Resource;
use nix::sys::signal::Signal;
use nix::sys::stat::Mode;
use nix::unistd::{Gid, Uid};
use seccompiler::BpfProgram;

/// The arguments of one `mount(2)`.
#[derive(Debug, Clone, Copy)]
pub struct Mount<'a> {
    /// The source (`None` for a remount or a propagation change).
    pub source: Option<&'a str>,
    /// The mount point.
    pub target: &'a Path,
    /// The filesystem type.
    pub fstype: Option<&'a str>,
    /// The `MS_*` flags.
    pub flags: MsFlags,
    /// The filesystem's options.
    pub data: Option<&'a str>,
}

impl<'a> Mount<'a> {
    /// A mount of `target` with `flags` only: a remount or a propagation change.
    pub fn plain(target: &'a Path, flags: MsFlags) -> Mount<'a> {
        Mount {
            source: None,
            target,
            fstype: None,
            flags,
            data: None,
        }
    }
}

/// The privileged operations of the setup sequence.
///
/// Every method is the plain kernel call: no retries, no fallbacks; the caller names the
/// step when one fails.
pub trait Syscall {
    /// `mount(2)`.
    fn mount(&self, m: &Mount<'_>) -> io::Result<()>;
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
    /// `unlink(2)`.
    fn unlink(&self, path: &Path) -> io::Result<()>;
    /// `chdir(2)`.
    fn chdir(&self, path: &Path) -> io::Result<()>;
    /// `setsid(2)`.
    fn setsid(&self) -> io::Result<()>;
    /// `setresgid(2)` with the same id for the real, effective and saved gid.
    fn setresgid(&self, gid: Gid) -> io::Result<()>;
    /// `setgroups(2)`: the supplementary groups.
    fn setgroups(&self, groups: &[Gid]) -> io::Result<()>;
    /// `setresuid(2)` with the same id for the real, effective and saved uid.
    fn setresuid(&self, uid: Uid) -> io::Result<()>;
    /// `prctl(PR_SET_PDEATHSIG)`.
    fn set_pdeathsig(&self, signal: Signal) -> io::Result<()>;
    /// `sethostname(2)`.
    fn sethostname(&self, name: &str) -> io::Result<()>;
    /// `unshare(2)`.
    fn unshare(&self, flags: CloneFlags) -> io::Result<()>;
    /// `setns(2)`: the calling thread enters the namespace `ns` refers to.
    fn setns(&self, ns: BorrowedFd<'_>, nstype: CloneFlags) -> io::Result<()>;
    /// Brings the loopback interface of the network namespace up.
    fn loopback_up(&self) -> io::Result<()>;
    /// Lets the groups `0 .. ids - 1` open ICMP datagram sockets
    /// (`net.ipv4.ping_group_range`).
    fn allow_ping_sockets(&self, ids: u32) -> io::Result<()>;
    /// `getrlimit(2)`: (soft, hard).
    fn getrlimit(&self, resource: Resource) -> io::Result<(u64, u64)>;
    /// `setrlimit(2)`.
    fn setrlimit(&self, resource: Resource, soft: u64, hard: u64) -> io::Result<()>;
    /// The largest capability number the kernel knows.
    fn cap_last_cap(&self) -> io::Result<u32>;
    /// `prctl(PR_CAPBSET_DROP)`: drops `cap` from the bounding set.
    fn capbset_drop(&self, cap: u32) -> io::Result<()>;
    /// `prctl(PR_CAP_AMBIENT_CLEAR_ALL)`.
    fn ambient_clear_all(&self) -> io::Result<()>;
    /// `prctl(PR_SET_NO_NEW_PRIVS)`.
    fn set_no_new_privs(&self) -> io::Result<()>;
    /// Installs the seccomp filters, in order.
    fn install_seccomp(&self, programs: &[BpfProgram]) -> io::Result<()>;
}

/// The real kernel.
#[derive(Debug, Default, Clone, Copy)]
pub struct LinuxSyscall;

impl Syscall for LinuxSyscall {
    fn mount(&self, m: &Mount<'_>) -> io::Result<()> {
        nix::mount::mount(m.source, m.target, m.fstype, m.flags, m.data).map_err(io::Error::from)
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

    fn unlink(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn chdir(&self, path: &Path) -> io::Result<()> {
        nix::unistd::chdir(path).map_err(io::Error::from)
    }

    fn setsid(&self) -> io::Result<()> {
        nix::unistd::setsid().map(drop).map_err(io::Error::from)
    }

    fn setresgid(&self, gid: Gid) -> io::Result<()> {
        nix::unistd::setresgid(gid, gid, gid).map_err(io::Error::from)
    }

    fn setgroups(&self, groups: &[Gid]) -> io::Result<()> {
        nix::unistd::setgroups(groups).map_err(io::Error::from)
    }

    fn setresuid(&self, uid: Uid) -> io::Result<()> {
        nix::unistd::setresuid(uid, uid, uid).map_err(io::Error::from)
    }

    fn set_pdeathsig(&self, signal: Signal) -> io::Result<()> {
        nix::sys::prctl::set_pdeathsig(signal).map_err(io::Error::from)
    }

    fn sethostname(&self, name: &str) -> io::Result<()> {
        nix::unistd::sethostname(name).map_err(io::Error::from)
    }

    fn unshare(&self, flags: CloneFlags) -> io::Result<()> {
        nix::sched::unshare(flags).map_err(io::Error::from)
    }

    fn setns(&self, ns: BorrowedFd<'_>, nstype: CloneFlags) -> io::Result<()> {
        nix::sched::setns(ns, nstype).map_err(io::Error::from)
    }

    fn loopback_up(&self) -> io::Result<()> {
        crate::sys::loopback_up()
    }

    fn allow_ping_sockets(&self, ids: u32) -> io::Result<()> {
        crate::sys::allow_ping_sockets(ids)
    }

    fn getrlimit(&self, resource: Resource) -> io::Result<(u64, u64)> {
        nix::sys::resource::getrlimit(resource).map_err(io::Error::from)
    }

    fn setrlimit(&self, resource: Resource, soft: u64, hard: u64) -> io::Result<()> {
        nix::sys::resource::setrlimit(resource, soft, hard).map_err(io::Error::from)
    }

    fn cap_last_cap(&self) -> io::Result<u32> {
        crate::sys::cap_last_cap()
    }

    fn capbset_drop(&self, cap: u32) -> io::Result<()> {
        crate::sys::capbset_drop(cap)
    }

    fn ambient_clear_all(&self) -> io::Result<()> {
        crate::sys::ambient_clear_all()
    }

    fn set_no_new_privs(&self) -> io::Result<()> {
        nix::sys::prctl::set_no_new_privs().map_err(io::Error::from)
    }

    fn install_seccomp(&self, programs: &[BpfProgram]) -> io::Result<()> {
        crate::seccomp::install(programs)
    }
}
