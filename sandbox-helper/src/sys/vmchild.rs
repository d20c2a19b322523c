//! A VM process's confinement, prepared in the parent and carried out in the child
//! between fork and exec (async-signal-safe calls only).
#![allow(unsafe_code)]

use super::*;

/// One step of making a VM process's minimal root, with its paths already under the
/// stage (see [`crate::jail`]).
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
        plan: &crate::jail::Plan,
        stage: &Path,
        ids: Option<(u32, u32)>,
    ) -> io::Result<Jail> {
        use crate::jail::{Entry, staged};
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
            tmpfs_opts: CString::new(crate::jail::ROOT_TMPFS_OPTS)
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
