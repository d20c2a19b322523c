//! The long-lived sandbox's init: after setup it starts the commands the helper (the
//! sandbox's keeper, [`crate::keeper`]) asks for, and reaps every process.
//!
//! An exec'd command is a child of this init, so it has exactly what the sandbox's
//! first process had: its namespaces, cgroups, capability bounding set, `no_new_privs`,
//! seccomp filter and rlimits, and no descriptor but the three it was given. No host
//! process ever enters the sandbox's namespaces to start it (the runc escapes through a
//! leaked host descriptor or `/proc/PID/exe` of a joining runtime process have no
//! process to act on).
//!
//! Protocol with the keeper over the setup `SOCK_SEQPACKET` pair, one message each:
//! keeper → init `x` ID JSON ([`ExecRequest`]) with stdin, stdout and stderr
//! (`SCM_RIGHTS`; none for a pseudo-terminal); `k` ID SIGNAL.
//! init → keeper `r` ID PID (with the terminal's master for a pseudo-terminal);
//! `f` ID ERRNO WHAT (not started; WHAT 0 the command, 1 the working directory);
//! `d` ID STATUS (ended: its exit code, or 128 + signal).
//! ID is a little-endian u64, PID, SIGNAL, ERRNO and STATUS little-endian i32.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::process::{Command, Stdio};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, Signal, kill};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use crate::spec::Spec;
use crate::sys;

pub use sandbox_api::exec::{ExecRequest, MAX_EXEC_REQUEST_BYTES};
/// Most execs running at once in one sandbox.
pub const MAX_EXECS_AT_ONCE: usize = 1024;

/// Message tags.
pub(crate) mod tag {
    pub const EXEC: u8 = b'x';
    pub const SIGNAL: u8 = b'k';
    pub const STARTED: u8 = b'r';
    pub const FAILED: u8 = b'f';
    pub const DONE: u8 = b'd';
}

/// Encodes a message: tag, id, then `rest`.
pub(crate) fn frame(tag: u8, id: u64, rest: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(9 + rest.len());
    m.push(tag);
    m.extend_from_slice(&id.to_le_bytes());
    m.extend_from_slice(rest);
    m
}

/// Splits a message into tag, id and the rest.
pub(crate) fn unframe(m: &[u8]) -> Option<(u8, u64, &[u8])> {
    if m.len() < 9 {
        return None;
    }
    let id = u64::from_le_bytes(m[1..9].try_into().ok()?);
    Some((m[0], id, &m[9..]))
}

/// Reads a little-endian i32 at the start of `b`.
pub(crate) fn le_i32(b: &[u8]) -> Option<i32> {
    Some(i32::from_le_bytes(b.get(..4)?.try_into().ok()?))
}

pub(crate) use sandbox_api::msg::{recv_msg, send_msg};

/// Serves execs until the keeper goes away (then this init, and with it every process
/// of the sandbox, ends). Never returns.
pub(crate) fn serve(sock: &OwnedFd, spec: &Spec) -> ! {
    let mut mask = SigSet::all();
    mask.remove(Signal::SIGKILL);
    mask.remove(Signal::SIGSTOP);
    if mask.thread_block().is_err() {
        sys::exit_now(1);
    }
    let Ok(sfd) = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
    else {
        sys::exit_now(1)
    };
    let mut running: HashMap<i32, u64> = HashMap::new();
    loop {
        let (sock_ready, sig_ready) = {
            let mut fds = [
                PollFd::new(sock.as_fd(), PollFlags::POLLIN),
                PollFd::new(sfd.as_fd(), PollFlags::POLLIN),
            ];
            match poll(&mut fds, PollTimeout::NONE) {
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => sys::exit_now(1),
                Ok(_) => {}
            }
            let hit = |f: &PollFd<'_>| f.revents().is_some_and(|r| !r.is_empty());
            (hit(&fds[0]), hit(&fds[1]))
        };
        if sig_ready {
            while let Ok(Some(_)) = sfd.read_signal() {}
            reap(sock, &mut running);
        }
        if sock_ready {
            let (msg, fds) = match recv_msg(sock.as_raw_fd(), 3) {
                Ok((m, _)) if m.is_empty() => sys::exit_now(0),
                Ok(x) => x,
                Err(_) => sys::exit_now(0),
            };
            let Some((t, id, rest)) = unframe(&msg) else {
                continue;
            };
            match t {
                tag::EXEC => {
                    if running.len() >= MAX_EXECS_AT_ONCE {
                        let _ = reply_failed(sock, id, libc::EAGAIN, 0);
                        continue;
                    }
                    match start(rest, fds, spec) {
                        Ok((pid, master)) => {
                            running.insert(pid, id);
                            let mut body = pid.to_le_bytes().to_vec();
                            body.push(0);
                            let raw: Vec<RawFd> = master.iter().map(|m| m.as_raw_fd()).collect();
                            let _ =
                                send_msg(sock.as_raw_fd(), &frame(tag::STARTED, id, &body), &raw);
                        }
                        Err((errno, what)) => {
                            let _ = reply_failed(sock, id, errno, what);
                        }
                    }
                }
                tag::SIGNAL => {
                    let sig = le_i32(rest).and_then(|s| Signal::try_from(s).ok());
                    if let (Some(sig), Some((&pid, _))) =
                        (sig, running.iter().find(|(_, v)| **v == id))
                    {
                        let _ = kill(Pid::from_raw(pid), sig);
                    }
                }
                _ => {}
            }
        }
    }
}

fn reply_failed(sock: &OwnedFd, id: u64, errno: i32, what: u8) -> std::io::Result<()> {
    let mut body = errno.to_le_bytes().to_vec();
    body.push(what);
    send_msg(sock.as_raw_fd(), &frame(tag::FAILED, id, &body), &[])
}

/// Reaps every ended process; tells the keeper of the execs among them.
fn reap(sock: &OwnedFd, running: &mut HashMap<i32, u64>) {
    loop {
        let (pid, code) = match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) => (pid, code),
            Ok(WaitStatus::Signaled(pid, s, _)) => (pid, 128 + s as i32),
            Ok(WaitStatus::StillAlive) | Err(_) => return,
            Ok(_) => continue,
        };
        if let Some(id) = running.remove(&pid.as_raw()) {
            let _ = send_msg(
                sock.as_raw_fd(),
                &frame(tag::DONE, id, &code.to_le_bytes()),
                &[],
            );
        }
    }
}

/// Starts one exec; `Err((errno, what))` when it could not (what: 0 the command, 1 the
/// working directory, 2 the request).
fn start(body: &[u8], fds: Vec<OwnedFd>, spec: &Spec) -> Result<(i32, Option<OwnedFd>), (i32, u8)> {
    let req: ExecRequest = serde_json::from_slice(body).map_err(|_| (libc::EINVAL, 2))?;
    if req.argv.is_empty() || req.argv.iter().any(|a| a.contains('\0')) {
        return Err((libc::EINVAL, 2));
    }
    let workdir = req
        .workdir
        .clone()
        .map_or_else(|| spec.workdir.clone(), std::path::PathBuf::from);
    if !workdir.is_dir() {
        return Err((libc::ENOENT, 1));
    }
    let mut cmd = Command::new(&req.argv[0]);
    cmd.args(&req.argv[1..])
        .env_clear()
        .envs(&spec.env)
        .envs(req.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&workdir);
    let mut master = None;
    if let Some((rows, cols)) = req.tty {
        let (m, slave) =
            open_pty(rows, cols).map_err(|e| (e.raw_os_error().unwrap_or(libc::EIO), 2))?;
        let dup = |f: &OwnedFd| {
            f.try_clone()
                .map_err(|e| (e.raw_os_error().unwrap_or(libc::EIO), 2))
        };
        cmd.stdin(Stdio::from(dup(&slave)?))
            .stdout(Stdio::from(dup(&slave)?))
            .stderr(Stdio::from(slave));
        master = Some(m);
    } else {
        let Ok([inp, out, err]) = <[OwnedFd; 3]>::try_from(fds) else {
            return Err((libc::EINVAL, 2));
        };
        cmd.stdin(Stdio::from(inp))
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err));
    }
    if let Some((uid, gid)) = spec.user {
        use std::os::unix::process::CommandExt;
        cmd.uid(uid).gid(gid);
    }
    sys::exec_pre_exec(&mut cmd, req.tty.is_some());
    let child = cmd
        .spawn()
        .map_err(|e| (e.raw_os_error().unwrap_or(libc::ENOENT), 0))?;
    Ok((child.id() as i32, master))
}

/// A new pseudo-terminal of the sandbox's own `devpts`: (master, slave).
fn open_pty(rows: u16, cols: u16) -> std::io::Result<(OwnedFd, OwnedFd)> {
    use nix::fcntl::OFlag;
    let master = nix::pty::posix_openpt(OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC)?;
    nix::pty::grantpt(&master)?;
    nix::pty::unlockpt(&master)?;
    let name = nix::pty::ptsname_r(&master)?;
    let slave: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(&name)?
        .into();
    sys::set_window_size(slave.as_fd(), rows, cols)?;
    let master: OwnedFd = master.into();
    Ok((master, slave))
}

use std::os::unix::fs::OpenOptionsExt;
