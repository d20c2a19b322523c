//! The processes of a VM run: starting qemu and virtiofsd confined in namespaces of their
//! own ([`spawn`]), waiting for their sockets, reaping them, and the run directory.

use std::fs;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::qemu::RunFiles;
use crate::cgroup;
use crate::error::{Error, Result};
use crate::sys;

use super::runner::{MAX_LOG_TAIL_BYTES, POLL_MS, QEMU_START_MS};

/// Kills and reaps a child on drop; then lets the thread it was started from end
/// (a child in a pid namespace of its own, see [`spawn`]).
pub(super) struct Reaped(pub(super) Child, pub(super) Option<NsThread>);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        // Only now may the thread that started it end.
        drop(self.1.take());
    }
}

/// The thread a child was started from after it unshared `CLONE_NEWPID`: the child is
/// pid 1 of a pid namespace of its own. The thread waits until dropped, because a
/// child's parent-death signal follows the thread that forked it: its end would kill
/// the child.
pub(super) struct NsThread {
    keep: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for NsThread {
    fn drop(&mut self) {
        drop(self.keep.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Spawns `cmd` from a thread of its own that first unshares `CLONE_NEWPID` (the
/// namespace is the thread's, for its children; no other thread's children go there).
pub(super) fn spawn_in_pid_ns(mut cmd: Command) -> std::io::Result<(Child, NsThread)> {
    let (tx, rx) = std::sync::mpsc::channel();
    let (keep, kept) = std::sync::mpsc::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("vm-pid-ns".into())
        .spawn(move || {
            let spawned = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWPID)
                .map_err(std::io::Error::from)
                .and_then(|()| cmd.spawn());
            let ok = spawned.is_ok();
            let _ = tx.send(spawned);
            if ok {
                // Until the child is reaped (the sender is dropped).
                let _ = kept.recv();
            }
        })?;
    let ns = NsThread {
        keep: Some(keep),
        thread: Some(thread),
    };
    let child = rx
        .recv()
        .map_err(|_| std::io::Error::other("the spawning thread ended"))??;
    Ok((child, ns))
}

/// Removes the run directory (sockets, logs) on drop.
pub(super) struct RunDirGuard(pub(super) PathBuf);

impl Drop for RunDirGuard {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// The per-run directories of VM runs under `state_dir`.
pub(super) fn runs_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("vm")
}

/// Removes the run directories of VM helpers that died (their qemu and virtiofsd died
/// with them: `PR_SET_PDEATHSIG`; their cgroups are reaped with the sandboxes').
pub fn reap_stale(state_dir: &Path) {
    let Ok(entries) = fs::read_dir(runs_dir(state_dir)) else {
        return;
    };
    for e in entries.flatten() {
        if cgroup::owner_is_gone(&e.file_name().to_string_lossy()) {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

/// Gives `path` (of the run directory) to qemu's uid and gid.
pub(super) fn give_qemu(path: &Path, id: u32) -> Result<()> {
    std::os::unix::fs::chown(path, Some(id), Some(id)).map_err(|source| Error::Setup {
        step: format!("vm: give {} to qemu's uid {id}", path.display()),
        source,
    })
}

pub(super) fn tail(path: &Path) -> String {
    let s = fs::read(path).unwrap_or_default();
    let from = s.len().saturating_sub(MAX_LOG_TAIL_BYTES);
    String::from_utf8_lossy(&s[from..]).trim().to_string()
}

pub(super) fn vm_failed(step: &str, files: &RunFiles, why: String) -> Error {
    let console = tail(&files.console());
    let qemu = tail(&files.dir.join("qemu.log"));
    let fsd = tail(&files.dir.join("virtiofsd.log"));
    Error::Setup {
        step: format!("vm: {step}"),
        source: std::io::Error::other(format!(
            "{why}\n--- guest console ---\n{console}\n--- qemu ---\n{qemu}\n--- virtiofsd ---\n{fsd}"
        )),
    }
}

/// The namespaces a VM process is started in (see [`sys::vm_child_pre_exec`]).
#[derive(Default)]
pub(super) struct Confine<'a> {
    /// `CLONE_NEW*` flags.
    pub(super) unshare: libc::c_int,
    /// A detached mount to attach, and where, in a mount namespace of its own.
    pub(super) attach: Option<(std::os::fd::BorrowedFd<'a>, &'a Path)>,
    /// A minimal root of its own, and an unprivileged uid for qemu ([`super::jail`]).
    pub(super) jail: Option<sys::Jail>,
    /// pid 1 of a pid namespace of its own (qemu: it sees and can signal no other
    /// process; virtiofsd makes its own for its server).
    pub(super) pid_ns: bool,
}

pub(super) fn spawn(
    bin: &Path,
    args: &[std::ffi::OsString],
    log: &Path,
    procs: &[fs::File],
    what: &str,
    confine: Confine<'_>,
) -> Result<Reaped> {
    let out = fs::File::create(log).map_err(|source| Error::StateDir {
        path: log.to_path_buf(),
        source,
    })?;
    let err = out.try_clone().map_err(|source| Error::StateDir {
        path: log.to_path_buf(),
        source,
    })?;
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    let fds: Vec<_> = procs.iter().map(AsFd::as_fd).collect();
    let Confine {
        unshare,
        attach,
        jail,
        pid_ns,
    } = confine;
    sys::vm_child_pre_exec(&mut cmd, &fds, unshare, attach, jail, pid_ns).map_err(|source| {
        Error::Setup {
            step: format!("vm: prepare {what}"),
            source,
        }
    })?;
    let spawned = if pid_ns {
        spawn_in_pid_ns(cmd).map(|(c, ns)| (c, Some(ns)))
    } else {
        cmd.spawn().map(|c| (c, None))
    };
    let (child, ns) = spawned.map_err(|source| {
        // A step of the confinement that failed in the child named itself in the log.
        let said = tail(log);
        Error::Setup {
            step: if said.is_empty() {
                format!("vm: start {what} ({})", bin.display())
            } else {
                format!("vm: start {what} ({}): {said}", bin.display())
            },
            source,
        }
    })?;
    Ok(Reaped(child, ns))
}

/// Waits until `path` exists, failing when `child` exits first or after `ms`.
pub(super) fn wait_for(
    path: &Path,
    child: &mut Reaped,
    ms: u64,
    files: &RunFiles,
    what: &str,
) -> Result<()> {
    let deadline = Instant::now() + Duration::from_millis(ms);
    while !path.exists() {
        if let Ok(Some(st)) = child.0.try_wait() {
            return Err(vm_failed(
                &format!("start {what}"),
                files,
                format!("{what} exited ({st}) before creating {}", path.display()),
            ));
        }
        if Instant::now() > deadline {
            return Err(vm_failed(
                &format!("start {what}"),
                files,
                format!("{} did not appear within {ms} ms", path.display()),
            ));
        }
        std::thread::sleep(Duration::from_millis(POLL_MS));
    }
    Ok(())
}

/// Connects to qemu's port socket. qemu binds a socket before it listens on it,
/// so a socket that exists may still refuse for a moment: refusals are retried until
/// `QEMU_START_MS` has passed, or qemu has exited.
pub(super) fn connect(path: &Path, qemu: &mut Reaped, files: &RunFiles) -> Result<UnixStream> {
    let deadline = Instant::now() + Duration::from_millis(QEMU_START_MS);
    loop {
        match UnixStream::connect(path) {
            Ok(s) => return Ok(s),
            Err(e)
                if e.kind() == std::io::ErrorKind::ConnectionRefused
                    && Instant::now() < deadline
                    && !matches!(qemu.0.try_wait(), Ok(Some(_))) =>
            {
                std::thread::sleep(Duration::from_millis(POLL_MS));
            }
            Err(e) => {
                return Err(vm_failed(
                    "connect to a qemu port",
                    files,
                    format!("{}: {e}", path.display()),
                ));
            }
        }
    }
}
