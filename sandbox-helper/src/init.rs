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

use nix::sched::CloneFlags;
use nix::sys::resource::Resource;
use nix::sys::signal::{SigSet, Signal, kill};
use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg, send};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Gid, Pid, Uid};

use crate::rootfs::{MAX_CGROUP_JOINS, MAX_DETACHED_MOUNTS, Plan, Step, StepError};
use crate::spec::{Net, Spec};
use crate::sys;
use crate::syscall::{LinuxSyscall, Syscall};

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
    if let Err(e) = LinuxSyscall.set_pdeathsig(Signal::SIGKILL) {
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

    if let Err(e) = set_up(
        &LinuxSyscall,
        ctx.spec,
        &ctx.plan.steps,
        mounts,
        ctx.seccomp,
    ) {
        fail(sock, &e.step, e.source);
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
    if let Err(e) = LinuxSyscall.unshare(CloneFlags::CLONE_NEWCGROUP) {
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
    let mut cmd = Command::new(&spec.command[0]);
    cmd.args(&spec.command[1..])
        .env_clear()
        .envs(&spec.env)
        .current_dir(&spec.workdir);
    if let Some((uid, gid)) = spec.user {
        use std::os::unix::process::CommandExt;
        cmd.uid(uid).gid(gid);
    }
    sys::first_command_pre_exec(&mut cmd);
    let child = cmd.spawn();
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

/// The setup init makes from the inside once the helper has mapped its ids and moved
/// it into the sandbox's cgroups, in this order:
///
/// 1. a new session (no controlling terminal);
/// 2. gid 0, no supplementary groups, then uid 0: the uid goes last, as a change of
///    uid can cost the capability the group calls need;
/// 3. the parent-death signal again (the kernel clears it when the ids change);
/// 4. the hostname, the filesystem view ([`crate::rootfs::apply`]; the detached
///    `mounts` are closed right after), loopback, ping sockets, rlimits;
/// 5. the capability bounding set and the ambient set reduced, after every step that
///    needs a dropped capability;
/// 6. `no_new_privs`, then the seccomp filter, last: the filter may refuse calls the
///    steps before make, and it is installed only once nothing can gain privileges.
pub(crate) fn set_up(
    sys: &dyn Syscall,
    spec: &Spec,
    steps: &[Step],
    mounts: Vec<OwnedFd>,
    seccomp: &[seccompiler::BpfProgram],
) -> Result<(), StepError> {
    let named = |step: &str| {
        let step = step.to_string();
        move |source| StepError { step, source }
    };
    sys.setsid().map_err(named("setsid"))?;
    // Now mapped: become root of the user namespace, with no supplementary groups.
    let (root_g, root_u) = (Gid::from_raw(0), Uid::from_raw(0));
    sys.setresgid(root_g)
        .map_err(named("setresgid 0 inside the user namespace"))?;
    sys.setgroups(&[])
        .map_err(named("drop supplementary groups"))?;
    sys.setresuid(root_u)
        .map_err(named("setresuid 0 inside the user namespace"))?;
    // The kernel clears the parent-death signal when the effective uid or gid changes:
    // arm it again, or a SIGKILLed helper would leave this init (and the command) running.
    // Had the helper died in between, the next message from it never comes and init ends.
    sys.set_pdeathsig(Signal::SIGKILL)
        .map_err(named("set the parent-death signal again"))?;
    sys.sethostname(&spec.name).map_err(named("sethostname"))?;
    crate::rootfs::apply(sys, steps, &mounts)?;
    drop(mounts);
    if spec.net != Net::None {
        sys.loopback_up().map_err(named("bring the loopback up"))?;
    }
    sys.allow_ping_sockets(crate::alloc::IDS_PER_SANDBOX)
        .map_err(named("set net.ipv4.ping_group_range"))?;
    sys.setrlimit(Resource::RLIMIT_CORE, 0, 0)
        .map_err(named("setrlimit RLIMIT_CORE"))?;
    let (_, hard) = sys
        .getrlimit(Resource::RLIMIT_NOFILE)
        .unwrap_or((NOFILE_LIMIT.0, NOFILE_LIMIT.1));
    let nofile_hard = NOFILE_LIMIT.1.min(hard);
    sys.setrlimit(
        Resource::RLIMIT_NOFILE,
        NOFILE_LIMIT.0.min(nofile_hard),
        nofile_hard,
    )
    .map_err(named("setrlimit RLIMIT_NOFILE"))?;
    drop_capabilities(sys, spec.extra_caps())
        .map_err(named("drop capabilities from the bounding set"))?;
    sys.set_no_new_privs().map_err(named("set no_new_privs"))?;
    sys.install_seccomp(seccomp)
        .map_err(named("install the seccomp filter"))
}

fn drop_capabilities(sys: &dyn Syscall, extra: &[u32]) -> std::io::Result<()> {
    let last = sys.cap_last_cap()?;
    for cap in 0..=last {
        if !KEPT_CAPS.contains(&cap) && !extra.contains(&cap) {
            sys.capbset_drop(cap)?;
        }
    }
    sys.ambient_clear_all()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{RECORDED_CAP_LAST_CAP, Recorder};

    fn spec(net: Net) -> Spec {
        Spec {
            net,
            ..crate::testing::spec()
        }
    }

    fn set_up_recorded(rec: &Recorder, spec: &Spec) -> Result<(), StepError> {
        let steps = [Step::PivotRoot {
            new_root: "/r".into(),
        }];
        let mounts = vec![std::fs::File::open("/dev/null").unwrap().into()];
        set_up(rec, spec, &steps, mounts, &[vec![]])
    }

    #[test]
    fn ids_are_dropped_in_order_and_seccomp_comes_last_after_no_new_privs() {
        let rec = Recorder::default();
        set_up_recorded(&rec, &spec(Net::Loopback)).unwrap();
        let at = |prefix: &str| {
            rec.position(prefix)
                .unwrap_or_else(|| panic!("no {prefix}: {:?}", rec.calls()))
        };
        let order = [
            "setsid",
            "setresgid 0",
            "setgroups []",
            "setresuid 0",
            "set_pdeathsig SIGKILL",
            "sethostname w1",
            "pivot_root /r",
            "loopback_up",
            "setrlimit RLIMIT_NOFILE",
            "capbset_drop",
            "ambient_clear_all",
            "set_no_new_privs",
            "install_seccomp 1",
        ];
        for pair in order.windows(2) {
            assert!(
                at(pair[0]) < at(pair[1]),
                "{} must come before {}: {:?}",
                pair[0],
                pair[1],
                rec.calls()
            );
        }
        let calls = rec.calls();
        assert_eq!(calls.last().map(String::as_str), Some("install_seccomp 1"));
        // The ids change once each, and the bounding set keeps exactly the listed caps.
        assert_eq!(calls.iter().filter(|c| c.starts_with("setres")).count(), 2);
        let dropped: Vec<u32> = calls
            .iter()
            .filter_map(|c| c.strip_prefix("capbset_drop ")?.parse().ok())
            .collect();
        for cap in 0..=RECORDED_CAP_LAST_CAP {
            assert_eq!(
                dropped.contains(&cap),
                !KEPT_CAPS.contains(&cap),
                "cap {cap}"
            );
        }
        assert!(!calls.iter().any(|c| c.starts_with("unshare")), "{calls:?}");
    }

    #[test]
    fn without_loopback_no_interface_is_touched() {
        let rec = Recorder::default();
        set_up_recorded(&rec, &spec(Net::None)).unwrap();
        assert_eq!(rec.position("loopback_up"), None);
    }

    #[test]
    fn a_failing_call_stops_the_setup_and_is_named() {
        let rec = Recorder::failing_at("setgroups");
        let err = set_up_recorded(&rec, &spec(Net::None)).unwrap_err();
        assert_eq!(err.step, "drop supplementary groups");
        assert_eq!(err.source.raw_os_error(), Some(libc::EINVAL));
        assert_eq!(rec.calls().last().map(String::as_str), Some("setgroups []"));
        assert_eq!(rec.position("setresuid"), None);
        let rec = Recorder::failing_at("set_no_new_privs");
        set_up_recorded(&rec, &spec(Net::None)).unwrap_err();
        assert_eq!(rec.position("install_seccomp"), None);
    }
}
