//! Safe wrappers for the raw syscalls the sandbox needs that `nix` does not cover.
//!
//! This is the only module of the crate with `unsafe`; every block says why it is sound.
//! Return values are checked in one place ([`check`]).
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

use nix::sys::signal::{SigSet, Signal};
use nix::unistd::Pid;

mod prexec;
mod vmchild;
pub use prexec::{
    EGRESS_CHILD_FIRST_FD, egress_child_pre_exec, exec_pre_exec, first_command_pre_exec,
};
pub use vmchild::{Jail, vm_child_pre_exec};

/// `MOUNT_ATTR_*` flags of `mount_setattr(2)` (linux/mount.h).
pub const MOUNT_ATTR_RDONLY: u64 = 0x0000_0001;
/// Ignore suid and sgid bits.
pub const MOUNT_ATTR_NOSUID: u64 = 0x0000_0002;
/// Disallow access to device special files.
pub const MOUNT_ATTR_NODEV: u64 = 0x0000_0004;
/// Disallow program execution.
pub const MOUNT_ATTR_NOEXEC: u64 = 0x0000_0008;
/// Idmap the mount with the user namespace in `userns_fd`.
pub const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;

/// `struct mount_attr` of `mount_setattr(2)`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

fn check(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn cpath(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

/// What a fork-like clone returns.
#[derive(Debug)]
pub enum Forked {
    /// In the parent: the child's pid (in the parent's pid namespace).
    Parent(Pid),
    /// In the child.
    Child,
}

/// Number of threads of this process (from `/proc/self/task`).
pub fn thread_count() -> io::Result<usize> {
    Ok(std::fs::read_dir("/proc/self/task")?.count())
}

/// Safe wrapper for a fork-like `clone(2)` into new namespaces (`flags` are `CLONE_NEW*`).
///
/// Refuses (`EBUSY`) unless the process is single-threaded: a fork of a multi-threaded
/// process could copy a lock held by another thread.
pub fn clone_fork(flags: libc::c_int) -> io::Result<Forked> {
    if thread_count()? != 1 {
        return Err(io::Error::new(
            io::ErrorKind::ResourceBusy,
            "clone of a multi-threaded process refused",
        ));
    }
    // SAFETY: with a NULL stack `clone` behaves like `fork`: the child continues on a
    // copy of the parent's address space and stack. The process is single-threaded
    // (checked above), so no lock can be held by another thread at the copy.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (flags | libc::SIGCHLD) as libc::c_ulong,
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_int>(),
            std::ptr::null_mut::<libc::c_int>(),
            0 as libc::c_ulong,
        )
    };
    match check(ret)? {
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent(Pid::from_raw(pid as i32))),
    }
}

/// Safe wrapper for `open_tree(OPEN_TREE_CLONE)` of `path`: a detached copy of the mount
/// at `path` (not recursive), which can be changed with [`mount_setattr`] and attached
/// elsewhere with [`move_mount`].
///
/// `path` is opened first with `openat2(RESOLVE_NO_SYMLINKS)`: it must be a canonical
/// path, and a component swapped for a symlink after it was validated makes this fail
/// (`ELOOP`) instead of cloning whatever the symlink points at.
pub fn open_tree_clone(path: &Path) -> io::Result<OwnedFd> {
    let opened = open_path_no_symlinks(path)?;
    // SAFETY: `opened` is a valid descriptor for the duration of the call and the path
    // is a static empty C string.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            opened.as_raw_fd(),
            c"".as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | libc::AT_EMPTY_PATH as libc::c_uint,
        )
    };
    let fd = check(ret)? as RawFd;
    // SAFETY: `fd` was just returned by the kernel and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens `path` as an `O_PATH` descriptor with `openat2(RESOLVE_NO_SYMLINKS)`: fails
/// with `ELOOP` when any component of the path as given (the last one included) is a
/// symlink or a `/proc` magic link, instead of following it.
pub fn open_path_no_symlinks(path: &Path) -> io::Result<OwnedFd> {
    use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
    // Not O_NOFOLLOW: with O_PATH it would open a final symlink itself rather than fail.
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS);
    Ok(nix::fcntl::openat2(nix::fcntl::AT_FDCWD, path, how)?)
}

/// Safe wrapper for `mount_setattr(fd, "", AT_EMPTY_PATH, {attr_set, userns_fd})` on a
/// detached mount.
pub fn mount_setattr(
    mount: BorrowedFd<'_>,
    attr_set: u64,
    userns: Option<BorrowedFd<'_>>,
) -> io::Result<()> {
    let attr = MountAttr {
        attr_set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.map_or(0, |fd| fd.as_raw_fd() as u64),
    };
    // SAFETY: `attr` is a valid `struct mount_attr` whose size is passed; the path is a
    // static empty C string.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            mount.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    check(ret).map(drop)
}

/// Safe wrapper for `move_mount(fd, "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH)`:
/// attaches a detached mount at `target`.
pub fn move_mount(mount: BorrowedFd<'_>, target: &Path) -> io::Result<()> {
    let c = cpath(target)?;
    // SAFETY: both strings are valid NUL-terminated strings that outlive the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            mount.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            c.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    check(ret).map(drop)
}

/// Safe wrapper for `prctl(PR_CAPBSET_DROP, cap)`.
pub fn capbset_drop(cap: u32) -> io::Result<()> {
    // SAFETY: plain integer arguments.
    let ret = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
    check(ret as libc::c_long).map(drop)
}

/// Safe wrapper for `prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)`.
pub fn ambient_clear_all() -> io::Result<()> {
    // SAFETY: plain integer arguments.
    let ret = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    check(ret as libc::c_long).map(drop)
}

/// Brings the loopback interface of the calling thread's network namespace up
/// (`SIOCGIFFLAGS` / `SIOCSIFFLAGS` on `lo`).
pub fn loopback_up() -> io::Result<()> {
    let sock = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Datagram,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    // SAFETY: `ifreq` is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: `req` is a valid `ifreq` naming `lo`; the kernel fills in `ifru_flags`.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } as libc::c_long)?;
    // SAFETY: reading the union member the kernel just wrote.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    req.ifr_ifru.ifru_flags = flags | libc::IFF_UP as libc::c_short;
    // SAFETY: `req` is a valid `ifreq` with the new flags.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } as libc::c_long)?;
    Ok(())
}

/// Lets every group of the calling process's user namespace open ICMP datagram
/// ("ping") sockets in its network namespace (`net.ipv4.ping_group_range`, which also
/// covers ICMPv6), so ping needs no `CAP_NET_RAW`. The range is in the writer's user
/// namespace and must be mapped there: `0 .. ids - 1`, the sandbox's whole gid map.
pub fn allow_ping_sockets(ids: u32) -> io::Result<()> {
    std::fs::write(
        "/proc/sys/net/ipv4/ping_group_range",
        format!("0 {}\n", ids - 1),
    )
}

/// Closes every file descriptor from 3 up except `keep`.
///
/// Meant for a freshly cloned child that will not return to code owning those
/// descriptors (it ends with `exit`), so no owner can use or close them again.
pub fn close_fds_except(keep: RawFd) -> io::Result<()> {
    let ranges = [(3u32, keep as u32 - 1), (keep as u32 + 1, u32::MAX)];
    for (first, last) in ranges {
        if first > last {
            continue;
        }
        // SAFETY: closes descriptors only; see the contract above.
        check(unsafe { libc::syscall(libc::SYS_close_range, first, last, 0u32) })?;
    }
    Ok(())
}

/// Safe wrapper for `sigtimedwait(2)`: waits up to `timeout` for one of `set` (which
/// must be blocked in the calling thread).
pub fn sigtimedwait(set: &SigSet, timeout: Duration) -> io::Result<Option<Signal>> {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `set` points to a valid sigset; `info` may be NULL.
    let ret = unsafe { libc::sigtimedwait(set.as_ref(), std::ptr::null_mut(), &ts) };
    if ret < 0 {
        let err = io::Error::last_os_error();
        return match err.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(None),
            _ => Err(err),
        };
    }
    Ok(Signal::try_from(ret).ok())
}

/// The largest capability number this kernel knows (`/proc/sys/kernel/cap_last_cap`).
pub fn cap_last_cap() -> io::Result<u32> {
    let text = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")?;
    text.trim()
        .parse()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad cap_last_cap"))
}

/// Ends the calling process at once, without running destructors or atexit handlers
/// (for a cloned child whose memory is a copy of the parent's).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: `_exit` never returns and touches no Rust state.
    unsafe { libc::_exit(code) }
}

/// Takes ownership of a descriptor just received in an `SCM_RIGHTS` message.
pub fn adopt_received_fd(fd: RawFd) -> OwnedFd {
    // SAFETY: the kernel installed `fd` in this process when the message was received;
    // nothing else knows or owns it.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// A terminal's window size (the one wrapper is `sandbox-api`'s).
pub use sandbox_api::keeper::{set_terminal_size as set_window_size, terminal_size as window_size};

/// Raises every permitted capability into the calling thread's effective set
/// (`capget` + `capset`): after `setfsuid` away from 0 the kernel clears the
/// filesystem capabilities from the effective set, which a mount made with that fsuid
/// must keep (overlayfs records its mounter's credentials for every later operation).
pub fn raise_effective_caps() -> io::Result<()> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    let mut hdr = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: `hdr` and `data` are the version-3 header and its two data words, valid
    // for the kernel to read and write.
    check(unsafe { libc::syscall(libc::SYS_capget, &mut hdr as *mut Header, data.as_mut_ptr()) })?;
    for d in &mut data {
        d.effective = d.permitted;
    }
    // SAFETY: as above; the kernel only reads them.
    check(unsafe { libc::syscall(libc::SYS_capset, &mut hdr as *mut Header, data.as_ptr()) })
        .map(drop)
}

/// Safe wrapper for `umount2(path, MNT_DETACH)` of a mount the helper made itself.
pub fn detach_mount(path: &Path) -> io::Result<()> {
    nix::mount::umount2(path, nix::mount::MntFlags::MNT_DETACH).map_err(io::Error::from)
}

/// `ioctl(fd, TIOCSTI, &byte)`: pushes `byte` into a terminal's input (tests only: the
/// sandbox's seccomp filter must refuse it).
#[cfg(test)]
pub fn tiocsti(fd: BorrowedFd<'_>, byte: u8) -> io::Result<()> {
    // SAFETY: TIOCSTI reads one byte from the pointer, which points at `byte`.
    let ret = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSTI, &byte as *const u8) };
    check(ret as libc::c_long).map(drop)
}

/// Safe wrapper for `prctl(PR_SET_PDEATHSIG, sig)` on this process: `sig` is delivered
/// when the thread that forked it (the caller's main thread) ends.
pub fn set_parent_death_signal(sig: Signal) -> io::Result<()> {
    // SAFETY: plain prctl with integer arguments on the calling process.
    check(unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, sig as libc::c_ulong, 0, 0, 0) }.into())
        .map(|_| ())
}

/// Safe wrapper for `prctl(PR_SET_DUMPABLE, 0)`: no core dump, and no `ptrace` or
/// `/proc/PID/mem` of this process by others of its uid.
pub fn set_not_dumpable() -> io::Result<()> {
    // SAFETY: plain prctl with integer arguments on the calling process.
    check(unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) }.into()).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_tree_clone_refuses_a_path_through_a_symlink() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("real/sub")).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("real"), tmp.path().join("link")).unwrap();
        let err = open_tree_clone(&tmp.path().join("link/sub")).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ELOOP), "{err}");
        let err = open_path_no_symlinks(&tmp.path().join("link")).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ELOOP), "{err}");
        assert!(open_path_no_symlinks(&tmp.path().join("real/sub")).is_ok());
    }
}
