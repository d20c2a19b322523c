//! What a child runs between fork and exec: signal dispositions, sessions, the egress
//! proxy's descriptors and identity.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::RawFd;

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
