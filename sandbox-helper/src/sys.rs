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

/// Every signal's disposition back to the default, in a child between fork and exec.
/// A signal ignored by whoever started the helper (a background job of a
/// non-interactive shell has SIGINT and SIGQUIT ignored, `nohup` SIGHUP) would stay
/// ignored across exec: the sandbox's commands start as a fresh login would, with none.
/// Async-signal-safe (the raw `rt_sigaction` system call: glibc's wrappers refuse the
/// real-time signals it reserves, which a launcher may have ignored too); SIGKILL and
/// SIGSTOP cannot change and are skipped.
fn default_dispositions() {
    /// The kernel's `struct sigaction` on x86_64 and aarch64: handler, flags, restorer,
    /// a 64-bit mask.
    #[repr(C)]
    struct KernelSigaction {
        handler: usize,
        flags: u64,
        restorer: usize,
        mask: u64,
    }
    let dfl = KernelSigaction {
        handler: libc::SIG_DFL,
        flags: 0,
        restorer: 0,
        mask: 0,
    };
    for sig in 1..=64 {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: rt_sigaction reads one kernel `struct sigaction` (`dfl`, which lives
        // across the call, its mask size passed as 8 bytes) and writes nothing (no old
        // action asked for); SIG_DFL installs no handler.
        unsafe {
            libc::syscall(
                libc::SYS_rt_sigaction,
                sig,
                &dfl as *const KernelSigaction,
                std::ptr::null_mut::<KernelSigaction>(),
                8usize,
            );
        }
    }
}

/// Prepares the sandbox's first command (spawned by its init): every signal's
/// disposition the default.
pub fn first_command_pre_exec(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and makes only the
    // async-signal-safe `rt_sigaction` system call.
    unsafe {
        cmd.pre_exec(|| {
            default_dispositions();
            Ok(())
        });
    }
}

/// Prepares `cmd` (spawned by the sandbox init for an exec) to start like the sandbox's
/// first command: every signal unblocked (init keeps them blocked for its signalfd) and
/// at its default disposition, a new session, and, when `controlling_tty`, its stdin (a
/// pseudo-terminal slave) as the session's controlling terminal.
pub fn exec_pre_exec(cmd: &mut std::process::Command, controlling_tty: bool) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and calls only
    // async-signal-safe functions (rt_sigaction, sigprocmask, setsid, ioctl) on its own
    // state.
    unsafe {
        cmd.pre_exec(move || {
            default_dispositions();
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            if libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            if controlling_tty && libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
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

/// One step of making a VM process's minimal root, with its paths already under the
/// stage (see [`crate::vm::jail`]).
enum JailOp {
    Mkdir(CString),
    Proc(CString),
    Symlink {
        target: CString,
        at: CString,
    },
    Mknod {
        at: CString,
        rdev: libc::dev_t,
        owned: bool,
    },
    Bind {
        source: CString,
        at: CString,
        file: bool,
        writable: bool,
    },
}

/// A minimal root, and for qemu an unprivileged identity, for a VM process, prepared in
/// the parent so that the child only makes syscalls on memory it already has.
pub struct Jail {
    stage: CString,
    tmpfs_opts: CString,
    ops: Vec<JailOp>,
    /// The uid and gid to become (qemu); `None` stays root (virtiofsd, which serves
    /// files of every owner and makes its own sandbox).
    ids: Option<(libc::uid_t, libc::gid_t)>,
}

impl Jail {
    /// The child will assemble `plan` on a tmpfs mounted at `stage` (an empty directory
    /// of the host; the mount is the child's alone, so one stage serves every child),
    /// pivot into it and, given `ids`, become that uid and gid.
    pub fn new(
        plan: &crate::vm::jail::Plan,
        stage: &Path,
        ids: Option<(u32, u32)>,
    ) -> io::Result<Jail> {
        use crate::vm::jail::{Entry, staged};
        let at = |p: &Path| cpath(Path::new(&staged(stage, p)));
        let mut ops = Vec::new();
        for e in &plan.entries {
            ops.push(match e {
                Entry::Dir(p) => JailOp::Mkdir(at(p)?),
                Entry::Proc(p) => JailOp::Proc(at(p)?),
                Entry::Symlink { at: p, target } => JailOp::Symlink {
                    target: cpath(target)?,
                    at: at(p)?,
                },
                Entry::Device { at: p, rdev, owned } => JailOp::Mknod {
                    at: at(p)?,
                    rdev: *rdev as libc::dev_t,
                    owned: *owned,
                },
                Entry::Bind {
                    source,
                    at: p,
                    file,
                    writable,
                } => JailOp::Bind {
                    source: cpath(source)?,
                    at: at(p)?,
                    file: *file,
                    writable: *writable,
                },
            });
        }
        Ok(Jail {
            stage: cpath(stage)?,
            tmpfs_opts: CString::new(crate::vm::jail::ROOT_TMPFS_OPTS)
                .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?,
            ops,
            ids,
        })
    }
}

/// Writes `sandbox-helper: vm jail: STEP: ` to the child's stderr (its log) and gives
/// the errno of the failed call, so that the parent's error names the step.
///
/// # Safety
/// Async-signal-safe: `write(2)` only.
unsafe fn jail_failed(step: &str) -> io::Error {
    let err = io::Error::last_os_error();
    for part in ["sandbox-helper: vm jail: ", step, ": failed\n"] {
        // SAFETY: writes from a live &str of its length to fd 2.
        unsafe { libc::write(2, part.as_ptr().cast(), part.len()) };
    }
    err
}

/// `mount_setattr(path, flags)` setting `set` and clearing `clr`.
///
/// # Safety
/// Async-signal-safe: one syscall on the caller's NUL-terminated path.
unsafe fn setattr(path: *const libc::c_char, recursive: bool, set: u64, clr: u64) -> libc::c_long {
    let attr = MountAttr {
        attr_set: set,
        attr_clr: clr,
        propagation: 0,
        userns_fd: 0,
    };
    let flags = if recursive { libc::AT_RECURSIVE } else { 0 };
    // SAFETY: `attr` lives across the call and its size is passed; `path` is the caller's.
    unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            path,
            flags as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    }
}

/// Carries out `jail` in the child (see [`vm_child_pre_exec`]).
///
/// # Safety
/// Runs between fork and exec: async-signal-safe calls only, on `jail`'s memory.
unsafe fn enter_jail(jail: &Jail, unshare: libc::c_int) -> io::Result<()> {
    // SAFETY: every call below is async-signal-safe and takes NUL-terminated strings
    // that `jail` owns, or integers.
    unsafe {
        if libc::unshare(unshare | libc::CLONE_NEWNS) != 0 {
            return Err(jail_failed("unshare the namespaces"));
        }
        let null = std::ptr::null::<libc::c_char>();
        if libc::mount(
            null,
            c"/".as_ptr(),
            null,
            libc::MS_REC | libc::MS_PRIVATE,
            null.cast(),
        ) != 0
        {
            return Err(jail_failed("make the mounts private"));
        }
        if libc::mount(
            c"tmpfs".as_ptr(),
            jail.stage.as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID,
            jail.tmpfs_opts.as_ptr().cast(),
        ) != 0
        {
            return Err(jail_failed("mount the root tmpfs"));
        }
        for op in &jail.ops {
            match op {
                JailOp::Mkdir(at) => {
                    if libc::mkdir(at.as_ptr(), 0o755) != 0 {
                        return Err(jail_failed("make a directory of the root"));
                    }
                }
                JailOp::Proc(at) => {
                    if libc::mkdir(at.as_ptr(), 0o555) != 0 {
                        return Err(jail_failed("make a directory of the root"));
                    }
                    if libc::mount(
                        c"proc".as_ptr(),
                        at.as_ptr(),
                        c"proc".as_ptr(),
                        libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                        null.cast(),
                    ) != 0
                    {
                        return Err(jail_failed("mount /proc"));
                    }
                }
                JailOp::Symlink { target, at } => {
                    if libc::symlink(target.as_ptr(), at.as_ptr()) != 0 {
                        return Err(jail_failed("make a link of the root"));
                    }
                }
                JailOp::Mknod { at, rdev, owned } => {
                    let mode = if *owned { 0o600 } else { 0o666 };
                    if libc::mknod(at.as_ptr(), libc::S_IFCHR | mode, *rdev) != 0 {
                        return Err(jail_failed("make a device node"));
                    }
                    // mknod obeys the umask: the mode is set again.
                    let chown_failed = match jail.ids {
                        Some((uid, gid)) if *owned => libc::chown(at.as_ptr(), uid, gid) != 0,
                        _ => false,
                    };
                    if libc::chmod(at.as_ptr(), mode) != 0 || chown_failed {
                        return Err(jail_failed("give a device node its owner"));
                    }
                }
                JailOp::Bind {
                    source,
                    at,
                    file,
                    writable,
                } => {
                    let made = if *file {
                        let fd = libc::open(
                            at.as_ptr(),
                            libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                            0o600,
                        );
                        fd >= 0 && libc::close(fd) == 0
                    } else {
                        libc::mkdir(at.as_ptr(), 0o755) == 0
                    };
                    if !made {
                        return Err(jail_failed("make a mount point"));
                    }
                    // The writable run directory alone, not what is mounted below it
                    // (the stage itself); the system directories with their submounts.
                    let rec = if *writable { 0 } else { libc::MS_REC };
                    if libc::mount(
                        source.as_ptr(),
                        at.as_ptr(),
                        null,
                        libc::MS_BIND | rec,
                        null.cast(),
                    ) != 0
                    {
                        return Err(jail_failed("bind a path into the root"));
                    }
                    let (set, clr) = if *writable {
                        (
                            MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
                            MOUNT_ATTR_RDONLY,
                        )
                    } else {
                        (MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, 0)
                    };
                    if setattr(at.as_ptr(), !*writable, set, clr) != 0 {
                        return Err(jail_failed("make a bind read-only"));
                    }
                }
            }
        }
        if libc::chdir(jail.stage.as_ptr()) != 0 {
            return Err(jail_failed("enter the root"));
        }
        // pivot_root(".", ".") stacks the old root on the new one; detaching it leaves
        // the new root alone (no directory for the old root is needed).
        if libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) != 0 {
            return Err(jail_failed("pivot_root"));
        }
        if libc::umount2(c".".as_ptr(), libc::MNT_DETACH) != 0 {
            return Err(jail_failed("detach the host's root"));
        }
        if libc::chdir(c"/".as_ptr()) != 0 {
            return Err(jail_failed("enter the root"));
        }
        if setattr(
            c"/".as_ptr(),
            false,
            MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID,
            0,
        ) != 0
        {
            return Err(jail_failed("make the root read-only"));
        }
        if unshare & libc::CLONE_NEWUTS != 0 {
            let name = b"cowspace-vm";
            if libc::sethostname(name.as_ptr().cast(), name.len()) != 0 {
                return Err(jail_failed("set the host name"));
            }
        }
    }
    Ok(())
}

/// Gives up root for good in the child: an empty bounding set and ambient set, no
/// supplementary groups, `gid` and `uid` (the kernel then clears every capability),
/// `no_new_privs`.
///
/// # Safety
/// Runs between fork and exec: async-signal-safe calls only.
unsafe fn drop_to(uid: libc::uid_t, gid: libc::gid_t) -> io::Result<()> {
    // SAFETY: prctl, setgroups, setresgid, setresuid with integer arguments or null.
    unsafe {
        for cap in 0..=63 {
            if libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) != 0
                && *libc::__errno_location() != libc::EINVAL
            {
                return Err(jail_failed("drop the bounding capabilities"));
            }
        }
        if libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        ) != 0
        {
            return Err(jail_failed("clear the ambient capabilities"));
        }
        if libc::setgroups(0, std::ptr::null()) != 0 {
            return Err(jail_failed("setgroups"));
        }
        if libc::setresgid(gid, gid, gid) != 0 {
            return Err(jail_failed("setresgid"));
        }
        if libc::setresuid(uid, uid, uid) != 0 {
            return Err(jail_failed("setresuid"));
        }
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(jail_failed("set no_new_privs"));
        }
    }
    Ok(())
}

/// Makes `cmd`'s child a confined VM process: an empty signal mask, `SIGKILL` when this
/// process dies (`PR_SET_PDEATHSIG`, so no VM outlives a killed helper), its own process
/// group, and a member of the cgroups whose `cgroup.procs` files are `procs` (one per
/// hierarchy) from before its first instruction (so guest RAM is charged to them).
/// The caller keeps `procs` open until the spawn returned.
/// `unshare` (`CLONE_NEW*` flags, 0 for none) gives it namespaces of its own.
/// `attach` (a detached mount, from [`open_tree_clone`], and a directory) is attached
/// there in a mount namespace of the child's own, made private first so that nothing of
/// it reaches the host's; with a `jail`, the directory is the jail's (attached after the
/// pivot). `jail` puts it in a minimal root of its own (a mount namespace whose root is
/// a tmpfs holding only the jail's entries) and, given its ids, gives up root for them;
/// a failed step is named on the child's stderr.
/// `pid_ns`: the caller spawns from a thread that unshared `CLONE_NEWPID`, so the child
/// is pid 1 of a pid namespace of its own, where `getppid()` is 0 (the parent is
/// outside it): the check that the helper did not die before the parent-death signal
/// was asked for cannot be made there, and a cgroup sweep ends such a child instead.
pub fn vm_child_pre_exec(
    cmd: &mut std::process::Command,
    procs: &[BorrowedFd<'_>],
    unshare: libc::c_int,
    attach: Option<(BorrowedFd<'_>, &Path)>,
    jail: Option<Jail>,
    pid_ns: bool,
) -> io::Result<()> {
    use std::os::unix::process::CommandExt;
    let procs: Vec<RawFd> = procs.iter().map(|f| f.as_raw_fd()).collect();
    let attach = match attach {
        Some((fd, target)) => Some((fd.as_raw_fd(), cpath(target)?)),
        None => None,
    };
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the closure runs in the forked child before exec and calls only
    // async-signal-safe functions (sigprocmask, prctl, setpgid, write, unshare, mount,
    // move_mount, mount_setattr, mkdir, symlink, mknod, chown, open, close, chdir,
    // pivot_root, umount2, sethostname, setgroups, setres[ug]id, getppid) on its own
    // state (the `struct mount_attr`s are on its stack, their size passed);
    // `procs` and the detached mount stay open in the parent until the spawn returned
    // (the caller's promise), so the child's inherited copies of them are valid; the
    // paths are NUL-terminated strings owned by the closure.
    unsafe {
        cmd.pre_exec(move || {
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            if libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }
            let death_signal = || {
                if libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                    0,
                    0,
                    0,
                ) != 0
                {
                    return Err(io::Error::last_os_error());
                }
                // The helper died before the signal was asked for: end now.
                if !pid_ns && libc::getppid() != parent {
                    libc::_exit(137);
                }
                Ok(())
            };
            death_signal()?;
            if libc::setpgid(0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            if jail.is_none() && unshare != 0 && libc::unshare(unshare) != 0 {
                return Err(io::Error::last_os_error());
            }
            if let Some(jail) = &jail {
                enter_jail(jail, unshare)?;
            } else if attach.is_some() {
                if libc::unshare(libc::CLONE_NEWNS) != 0 {
                    return Err(io::Error::last_os_error());
                }
                if libc::mount(
                    std::ptr::null(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ) != 0
                {
                    return Err(io::Error::last_os_error());
                }
            }
            if let Some((tree, target)) = &attach
                && libc::syscall(
                    libc::SYS_move_mount,
                    *tree,
                    c"".as_ptr(),
                    libc::AT_FDCWD,
                    target.as_ptr(),
                    MOVE_MOUNT_F_EMPTY_PATH,
                ) != 0
            {
                return Err(if jail.is_some() {
                    jail_failed("attach the shared directory")
                } else {
                    io::Error::last_os_error()
                });
            }
            for &fd in &procs {
                let zero = b"0";
                if libc::write(fd, zero.as_ptr().cast(), zero.len()) != 1 {
                    return Err(io::Error::last_os_error());
                }
            }
            if let Some((uid, gid)) = jail.as_ref().and_then(|j| j.ids) {
                drop_to(uid, gid)?;
                // A change of credentials cleared the parent-death signal.
                death_signal()?;
            }
            Ok(())
        });
    }
    Ok(())
}

/// Safe wrapper for `prctl(PR_SET_PDEATHSIG, sig)` on this process: `sig` is delivered
/// when the thread that forked it (the caller's main thread) ends.
pub fn set_parent_death_signal(sig: Signal) -> io::Result<()> {
    // SAFETY: plain prctl with integer arguments on the calling process.
    check(unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, sig as libc::c_ulong, 0, 0, 0) }.into())
        .map(|_| ())
}

/// The descriptor numbers the egress proxy's process gets its five descriptors under
/// (`3..3 + N`); every other one above 2 is closed before it starts.
pub const EGRESS_CHILD_FIRST_FD: RawFd = 3;

/// Prepares the egress proxy's process (`sandbox-helper egress-proxy`): `fds` moved to
/// [`EGRESS_CHILD_FIRST_FD`] onwards and every other descriptor above 2 closed (the
/// keeper's ready pipe and sockets must not live on in it); no supplementary groups,
/// uid and gid `uid`/`gid` (every capability goes with uid 0), `no_new_privs`, and
/// `SIGKILL` when the keeper's thread that started it ends (armed after the uid change,
/// which clears it).
pub fn egress_child_pre_exec(cmd: &mut std::process::Command, fds: [RawFd; 5], uid: u32, gid: u32) {
    use std::os::unix::process::CommandExt;
    /// Where the descriptors wait while they are moved (above any they could collide with).
    const PARK_FD: libc::c_int = 1000;
    // SAFETY: the closure runs in the forked child before exec and makes only
    // async-signal-safe system calls on its own descriptors and credentials.
    unsafe {
        cmd.pre_exec(move || {
            default_dispositions();
            let mut parked = [0 as libc::c_int; 5];
            for (i, fd) in fds.iter().enumerate() {
                parked[i] = libc::fcntl(*fd, libc::F_DUPFD, PARK_FD);
                if parked[i] < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            for (i, p) in parked.iter().enumerate() {
                if libc::dup2(*p, EGRESS_CHILD_FIRST_FD + i as libc::c_int) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            let first_free = (EGRESS_CHILD_FIRST_FD + 5) as libc::c_uint;
            if libc::syscall(libc::SYS_close_range, first_free, libc::c_uint::MAX, 0u32) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setresgid(gid, gid, gid) != 0
                || libc::setresuid(uid, uid, uid) != 0
                || libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                    0,
                    0,
                    0,
                ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
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
