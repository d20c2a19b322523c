//! The sandbox's init: the first process inside the new namespaces (pid 1 there).
//!
//! It finishes the setup from the inside (ids, cgroup namespace, hostname, the
//! filesystem view, loopback, rlimits, capabilities, `no_new_privs`, seccomp), starts the
//! command, then reaps every process of the sandbox and forwards signals to the command.
//! When the command ends, init kills what is left of the sandbox and exits with the
//! command's status (128 + signal when it was killed).
//!
//! Protocol with the helper over a `SOCK_SEQPACKET` pair:
//! helper → init `go` + the detached mounts (`SCM_RIGHTS`);
//! init → helper `S` (set up) or `E<errno> <step>`;
//! helper → init `run` (init is in its cgroups now);
//! init → helper `R` (command started) or `E...` / `X<errno> <command>`.

use std::io::IoSliceMut;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::process::Command;

use nix::sys::resource::{Resource, getrlimit, setrlimit};
use nix::sys::signal::{SigSet, Signal, kill};
use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg, send};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Gid, Pid, Uid};

use crate::rootfs::{MAX_CGROUP_JOINS, MAX_DETACHED_MOUNTS, Plan};
use crate::spec::{Net, Spec};
use crate::sys;
use crate::syscall::LinuxSyscall;

/// `RLIMIT_NOFILE` inside the sandbox (soft, hard), lowered to the helper's hard limit.
pub const NOFILE_LIMIT: (u64, u64) = (4_096, 65_536);
/// Capabilities kept in the bounding set (the usual container set without SETFCAP: a
/// file capability written in the idmapped workspace would hold on the host; and
/// without NET_RAW: packet and raw sockets are kernel attack surface, ping uses ICMP
/// datagram sockets; `--cap-net-raw` keeps it); all others dropped.
pub const KEPT_CAPS: [u32; 12] = [
    0,  // CHOWN
    1,  // DAC_OVERRIDE
    3,  // FOWNER
    4,  // FSETID
    5,  // KILL
    6,  // SETGID
    7,  // SETUID
    8,  // SETPCAP
    10, // NET_BIND_SERVICE
    18, // SYS_CHROOT
    27, // MKNOD
    29, // AUDIT_WRITE
];
/// Exit code of init when setup failed (the helper reports the real error).
const SETUP_FAILED: i32 = 125;

/// The signals the helper and init forward to the command.
pub fn forwarded_signals() -> SigSet {
    let mut set = SigSet::empty();
    for s in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
    ] {
        set.add(s);
    }
    set
}

/// Everything init needs, prepared by the helper before the clone.
pub(crate) struct Context<'a> {
    pub spec: &'a Spec,
    pub plan: &'a Plan,
    pub sock: &'a OwnedFd,
    pub seccomp: &'a [seccompiler::BpfProgram],
}

fn report(sock: &OwnedFd, tag: char, err: &std::io::Error, what: &str) {
    let msg = format!("{tag}{} {what}", err.raw_os_error().unwrap_or(libc::EIO));
    let _ = send(sock.as_raw_fd(), msg.as_bytes(), MsgFlags::empty());
}

fn fail(sock: &OwnedFd, step: &str, err: impl Into<std::io::Error>) -> ! {
    report(sock, 'E', &err.into(), step);
    sys::exit_now(SETUP_FAILED)
}

/// Receives one message and the descriptors attached to it.
fn recv_with_fds(sock: &OwnedFd) -> std::io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut buf = [0u8; 64];
    let mut cmsg = nix::cmsg_space!([RawFd; MAX_DETACHED_MOUNTS + MAX_CGROUP_JOINS]);
    let mut iov = [IoSliceMut::new(&mut buf)];
    let msg = recvmsg::<()>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            for fd in raw {
                fds.push(sys::adopt_received_fd(fd));
            }
        }
    }
    let n = msg.bytes;
    Ok((buf[..n].to_vec(), fds))
}

fn recv_plain(sock: &OwnedFd) -> std::io::Result<Vec<u8>> {
    let mut buf = [0u8; 64];
    let n = nix::sys::socket::recv(sock.as_raw_fd(), &mut buf, MsgFlags::empty())?;
    Ok(buf[..n].to_vec())
}

/// Runs init. Never returns.
pub(crate) fn main(ctx: Context<'_>) -> ! {
    let sock = ctx.sock;
    if let Err(e) = sys::close_fds_except(sock.as_raw_fd()) {
        fail(sock, "close inherited descriptors", e);
    }
    // A long-lived sandbox outlives its caller: nothing of the caller's stdio stays
    // open in it (a caller reading the helper's output to its end would wait for ever).
    if ctx.spec.keep {
        let null = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null");
        match null {
            Ok(null) => {
                let _ = nix::unistd::dup2_stdin(&null);
                let _ = nix::unistd::dup2_stdout(&null);
                let _ = nix::unistd::dup2_stderr(&null);
            }
            Err(e) => fail(sock, "open /dev/null", e),
        }
    }
    if let Err(e) = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL) {
        fail(sock, "set the parent-death signal", e);
    }
    let mut mounts = match recv_with_fds(sock) {
        Ok((msg, fds)) if msg == b"go" => fds,
        Ok(_) => sys::exit_now(SETUP_FAILED), // the helper gave up
        Err(e) => fail(sock, "wait for the helper", e),
    };
    // After the mounts come the `tasks` files of the sandbox's v1 cgroups (opened by the
    // helper): writing 0 moves this single-threaded process in, without the wait a move
    // by pid costs. Closed right after, before anything of the command's runs.
    if mounts.len() < ctx.plan.detached.len() {
        fail(
            sock,
            "receive the mounts",
            std::io::Error::other("fewer descriptors than mounts"),
        );
    }
    for tasks in mounts.split_off(ctx.plan.detached.len()) {
        if let Err(e) = nix::unistd::write(&tasks, b"0") {
            fail(sock, "join the sandbox's cgroup", e);
        }
    }

    // A new session without a controlling terminal: the command cannot reach the host's
    // terminal through /dev/tty or job control.
    if let Err(e) = nix::unistd::setsid() {
        fail(sock, "setsid", e);
    }
    // Now mapped: become root of the user namespace, with no supplementary groups.
    let root_g = Gid::from_raw(0);
    let root_u = Uid::from_raw(0);
    if let Err(e) = nix::unistd::setresgid(root_g, root_g, root_g) {
        fail(sock, "setresgid 0 inside the user namespace", e);
    }
    if let Err(e) = nix::unistd::setgroups(&[]) {
        fail(sock, "drop supplementary groups", e);
    }
    if let Err(e) = nix::unistd::setresuid(root_u, root_u, root_u) {
        fail(sock, "setresuid 0 inside the user namespace", e);
    }
    // The kernel clears the parent-death signal when the effective uid or gid changes:
    // arm it again, or a SIGKILLed helper would leave this init (and the command) running.
    // Had the helper died in between, the next message from it never comes and init ends.
    if let Err(e) = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL) {
        fail(sock, "set the parent-death signal again", e);
    }
    if let Err(e) = nix::unistd::sethostname(&ctx.spec.name) {
        fail(sock, "sethostname", e);
    }
    if let Err(e) = crate::rootfs::apply(&LinuxSyscall, &ctx.plan.steps, &mounts) {
        fail(sock, &e.step, e.source);
    }
    drop(mounts);
    if ctx.spec.net == Net::Loopback
        && let Err(e) = sys::loopback_up()
    {
        fail(sock, "bring the loopback up", e);
    }
    if let Err(e) = sys::allow_ping_sockets(crate::alloc::IDS_PER_SANDBOX) {
        fail(sock, "set net.ipv4.ping_group_range", e);
    }
    if let Err(e) = setrlimit(Resource::RLIMIT_CORE, 0, 0) {
        fail(sock, "setrlimit RLIMIT_CORE", e);
    }
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap_or((NOFILE_LIMIT.0, NOFILE_LIMIT.1));
    let nofile_hard = NOFILE_LIMIT.1.min(hard);
    if let Err(e) = setrlimit(
        Resource::RLIMIT_NOFILE,
        NOFILE_LIMIT.0.min(nofile_hard),
        nofile_hard,
    ) {
        fail(sock, "setrlimit RLIMIT_NOFILE", e);
    }
    if let Err(e) = drop_capabilities(ctx.spec.extra_caps()) {
        fail(sock, "drop capabilities from the bounding set", e);
    }
    if let Err(e) = nix::sys::prctl::set_no_new_privs() {
        fail(sock, "set no_new_privs", e);
    }
    if let Err(e) = crate::seccomp::install(ctx.seccomp) {
        fail(sock, "install the seccomp filter", e);
    }

    // A command that is not there is reported before the helper announces the sandbox
    // (and its ports) as ready.
    if !ctx.spec.keep
        && !command_exists(
            &ctx.spec.command[0],
            ctx.spec.env.get("PATH").map(String::as_str),
        )
    {
        report(
            sock,
            'X',
            &std::io::Error::from_raw_os_error(libc::ENOENT),
            &ctx.spec.command[0],
        );
        sys::exit_now(SETUP_FAILED);
    }
    let _ = send(sock.as_raw_fd(), b"S", MsgFlags::empty());
    match recv_plain(sock) {
        Ok(msg) if msg == b"run" => {}
        _ => sys::exit_now(SETUP_FAILED),
    }
    // The helper has moved this process into the sandbox's cgroups before `run`, so the
    // new cgroup namespace is rooted there. (Capabilities in the effective set are
    // untouched by the bounding-set drop; only the command's exec loses them.)
    if let Err(e) = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWCGROUP) {
        fail(sock, "unshare the cgroup namespace", e);
    }
    if ctx.spec.keep {
        let _ = send(sock.as_raw_fd(), b"R", MsgFlags::empty());
        crate::serve::serve(sock, ctx.spec)
    }

    // The command must start with no blocked signal, and std does not reset the mask
    // (the helper blocked the forwarded ones before the clone): unblock for the spawn,
    // block again for `supervise`, which reaps once before it first waits.
    let mut signals = forwarded_signals();
    signals.add(Signal::SIGCHLD);
    if let Err(e) = SigSet::empty().thread_set_mask() {
        fail(sock, "unblock signals for the command", e);
    }
    let spec = ctx.spec;
    let child = Command::new(&spec.command[0])
        .args(&spec.command[1..])
        .env_clear()
        .envs(&spec.env)
        .current_dir("/workspace")
        .spawn();
    if let Err(e) = signals.thread_block() {
        fail(sock, "block signals in init", e);
    }
    let main_pid = match child {
        Ok(c) => Pid::from_raw(c.id() as i32),
        Err(e) => {
            report(sock, 'X', &e, &spec.command[0]);
            sys::exit_now(SETUP_FAILED);
        }
    };
    let _ = send(sock.as_raw_fd(), b"R", MsgFlags::empty());
    // The helper's reader sees the end of the protocol.
    let _ = nix::sys::socket::shutdown(sock.as_raw_fd(), nix::sys::socket::Shutdown::Both);
    supervise(main_pid, &signals)
}

/// Whether `program` names a file inside the view: as a path when it has a `/`, else
/// through the command's `PATH`, as `execvp` would look it up.
fn command_exists(program: &str, path: Option<&str>) -> bool {
    if program.contains('/') {
        return std::path::Path::new(program).is_file();
    }
    path.unwrap_or_default()
        .split(':')
        .filter(|dir| !dir.is_empty())
        .any(|dir| std::path::Path::new(dir).join(program).is_file())
}

fn drop_capabilities(extra: &[u32]) -> std::io::Result<()> {
    let last = sys::cap_last_cap()?;
    for cap in 0..=last {
        if !KEPT_CAPS.contains(&cap) && !extra.contains(&cap) {
            sys::capbset_drop(cap)?;
        }
    }
    sys::ambient_clear_all()
}

/// Reaps every child, forwards signals to the command, and exits with its status.
fn supervise(main: Pid, signals: &SigSet) -> ! {
    let mut status: Option<i32> = None;
    // A SIGCHLD may have been discarded while unblocked for the spawn: reap first.
    let mut sig = Signal::SIGCHLD;
    loop {
        if sig != Signal::SIGCHLD {
            let _ = kill(main, sig);
            sig = signals.wait().unwrap_or(Signal::SIGCHLD);
            continue;
        }
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) if pid == main => status = Some(code),
                Ok(WaitStatus::Signaled(pid, s, _)) if pid == main => status = Some(128 + s as i32),
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(_) => {}
            }
        }
        if let Some(code) = status {
            // The command is done: nothing of the sandbox outlives it.
            let _ = kill(Pid::from_raw(-1), Signal::SIGKILL);
            while waitpid(Pid::from_raw(-1), None).is_ok() {}
            sys::exit_now(code);
        }
        sig = signals.wait().unwrap_or(Signal::SIGCHLD);
    }
}
