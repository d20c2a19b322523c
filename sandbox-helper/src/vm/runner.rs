//! Starting, talking to and tearing down one VM (see the protocol in [`super`]).

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{SigSet, Signal, kill};
use nix::unistd::Pid;

use super::probe::Isolation;
use super::qemu::{self, Machine, RunFiles};
use super::{Prepared, VmSpec};
use crate::cgroup;
use crate::error::{Error, Result};
use crate::spec::Limits;
use crate::sys;

/// How long virtiofsd may take to create its socket.
const VIRTIOFSD_START_MS: u64 = 10_000;
/// How long qemu may take to create its port sockets.
const QEMU_START_MS: u64 = 10_000;
/// How long the guest may take from qemu's start to `ready` (TCG boots in seconds).
const BOOT_TIMEOUT_MS: u64 = 60_000;
/// How long qemu may take to end after `bye`.
const QEMU_EXIT_MS: u64 = 10_000;
/// Longest control line read from the guest.
const MAX_CTL_LINE_BYTES: u64 = 4096;
/// Most bytes of a log quoted in an error.
const MAX_LOG_TAIL_BYTES: usize = 2048;
/// Pause between polls for a socket or an exit.
const POLL_MS: u64 = 5;

/// Told once the guest is up, before the command runs.
#[derive(Debug, Clone)]
pub struct VmReady {
    /// From qemu's start to the guest's `ready`.
    pub boot_ms: u64,
    /// qemu's pid.
    pub qemu_pid: i32,
    /// virtiofsd's pid.
    pub virtiofsd_pid: i32,
}

/// How a VM run ended.
#[derive(Debug, Clone)]
pub struct VmOutcome {
    /// The command's exit status (128 + N when the helper got signal N).
    pub code: u8,
    /// From qemu's start to the guest's `ready`.
    pub boot_ms: u64,
}

/// Kills and reaps a child on drop.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Removes the run directory (sockets, logs) on drop.
struct RunDirGuard(PathBuf);

impl Drop for RunDirGuard {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// The per-run directories of VM runs under `state_dir`.
fn runs_dir(state_dir: &Path) -> PathBuf {
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

fn tail(path: &Path) -> String {
    let s = fs::read(path).unwrap_or_default();
    let from = s.len().saturating_sub(MAX_LOG_TAIL_BYTES);
    String::from_utf8_lossy(&s[from..]).trim().to_string()
}

fn vm_failed(step: &str, files: &RunFiles, why: String) -> Error {
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

fn spawn(
    bin: &Path,
    args: &[std::ffi::OsString],
    log: &Path,
    procs: &[fs::File],
    what: &str,
    unshare: libc::c_int,
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
    sys::vm_child_pre_exec(&mut cmd, &fds, unshare);
    let child = cmd.spawn().map_err(|source| Error::Setup {
        step: format!("vm: start {what} ({})", bin.display()),
        source,
    })?;
    Ok(Reaped(child))
}

/// Waits until `path` exists, failing when `child` exits first or after `ms`.
fn wait_for(path: &Path, child: &mut Reaped, ms: u64, files: &RunFiles, what: &str) -> Result<()> {
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

/// Connects to one of qemu's port sockets. qemu binds a socket before it listens on it,
/// so a socket that exists may still refuse for a moment: refusals are retried until
/// `QEMU_START_MS` has passed, or qemu has exited.
fn connect(path: &Path, qemu: &mut Reaped, files: &RunFiles) -> Result<UnixStream> {
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

/// Copies `from` to `to` until EOF (qemu closing the port), then flushes.
fn relay(mut from: UnixStream, mut to: impl Write + Send + 'static) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut from, &mut to);
        let _ = to.flush();
    })
}

/// Runs `spec` in a VM with `prep` (from [`super::prepare`]), its per-run files under
/// `state_dir/vm/`, its cgroup under `cgroup_root`. `on_ready` is told once the guest is
/// up. SIGINT, SIGTERM, SIGHUP and SIGQUIT to the helper end the VM (exit 128 + N).
pub fn run(
    spec: &VmSpec,
    prep: &Prepared,
    state_dir: &Path,
    cgroup_root: &Path,
    on_ready: impl FnOnce(&VmReady),
) -> Result<VmOutcome> {
    if prep.accel.isolation == Isolation::NeedsValidation && !spec.accept_emulation {
        return Err(Error::VmUnavailable {
            what: "isolation",
            reason: prep.accel.reason.clone(),
        });
    }
    // The signals that end the VM are taken by one thread; everything this thread starts
    // gets an empty mask back before exec.
    let signals = SigSet::from_iter([
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
    ]);
    signals.thread_block().map_err(|e| Error::Setup {
        step: "vm: block signals".into(),
        source: e.into(),
    })?;
    let limits = Limits {
        memory_bytes: Some(spec.host_memory_bytes()),
        ..Limits::default()
    };
    let placements = cgroup::require(cgroup_root, &limits)?;
    let group = cgroup::Group::create(&placements, &format!("vm-{}", spec.name), &limits)?;
    let mut procs = Vec::new();
    for d in group.dirs() {
        let path = d.join("cgroup.procs");
        procs.push(
            fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(|source| Error::Cgroup {
                    step: "open cgroup.procs",
                    path: path.clone(),
                    source,
                })?,
        );
    }
    let dir = runs_dir(state_dir).join(format!("{}.{}", spec.name, std::process::id()));
    fs::create_dir_all(&dir).map_err(|source| Error::StateDir {
        path: dir.clone(),
        source,
    })?;
    let _dir_guard = RunDirGuard(dir.clone());
    let files = RunFiles { dir };

    let mut fsd = spawn(
        &prep.virtiofsd,
        &qemu::virtiofsd_args(&files, &spec.dir),
        &files.dir.join("virtiofsd.log"),
        &procs,
        "virtiofsd",
        // It makes its own mount, pid and network namespaces (`--sandbox=namespace`).
        0,
    )?;
    wait_for(
        &files.fs_sock(),
        &mut fsd,
        VIRTIOFSD_START_MS,
        &files,
        "virtiofsd",
    )?;
    let machine = Machine {
        accel: prep.accel.accel,
        memory_mib: spec.memory_mib,
        cpus: spec.cpus,
        kernel: &prep.kernel.image,
        initrd: &prep.initrd.0,
        loopback: spec.loopback,
        tsc_khz: super::probe::host_tsc_khz(),
    };
    let started = Instant::now();
    let mut vm = spawn(
        &prep.qemu,
        &qemu::qemu_args(&machine, &files),
        &files.dir.join("qemu.log"),
        &procs,
        "qemu",
        // No network (the guest has none) and no host System V IPC; its sockets are
        // paths, which work across network namespaces.
        libc::CLONE_NEWNET | libc::CLONE_NEWIPC,
    )?;
    drop(procs);
    let qemu_pid = vm.0.id() as i32;
    let victim = Arc::new(AtomicI32::new(qemu_pid));
    let got = Arc::new(AtomicI32::new(0));
    {
        let (victim, got) = (victim.clone(), got.clone());
        std::thread::spawn(move || {
            if let Ok(sig) = signals.wait() {
                got.store(sig as i32, Ordering::SeqCst);
                let _ = kill(
                    Pid::from_raw(victim.load(Ordering::SeqCst)),
                    Signal::SIGKILL,
                );
            }
        });
    }
    for (file, _) in qemu::PORTS {
        wait_for(&files.port(file), &mut vm, QEMU_START_MS, &files, "qemu")?;
    }
    let out = connect(&files.port(qemu::PORTS[1].0), &mut vm, &files)?;
    let err = connect(&files.port(qemu::PORTS[2].0), &mut vm, &files)?;
    let mut ctl = connect(&files.port(qemu::PORTS[0].0), &mut vm, &files)?;
    let relays = [relay(out, std::io::stdout()), relay(err, std::io::stderr())];
    let interrupted = |got: &AtomicI32| match got.load(Ordering::SeqCst) {
        0 => None,
        s => Some(128u8.saturating_add(s as u8)),
    };

    let _ = ctl.set_read_timeout(Some(Duration::from_millis(BOOT_TIMEOUT_MS)));
    let mut reader = BufReader::new(
        ctl.try_clone()
            .map_err(|e| vm_failed("control port", &files, e.to_string()))?,
    );
    let line = read_line(&mut reader);
    if let Some(code) = interrupted(&got) {
        return Ok(VmOutcome { code, boot_ms: 0 });
    }
    let line = line.map_err(|e| vm_failed("boot the guest", &files, e))?;
    if line != "ready" {
        return Err(vm_failed(
            "boot the guest",
            &files,
            format!("the guest said {line:?}"),
        ));
    }
    let boot_ms = started.elapsed().as_millis() as u64;
    on_ready(&VmReady {
        boot_ms,
        qemu_pid,
        virtiofsd_pid: fsd.0.id() as i32,
    });
    let script = spec.script();
    ctl.write_all(format!("{}\n{script}", script.len()).as_bytes())
        .map_err(|e| vm_failed("send the command", &files, e.to_string()))?;
    let _ = ctl.set_read_timeout(None);
    let status = read_line(&mut reader);
    if let Some(code) = interrupted(&got) {
        return Ok(VmOutcome { code, boot_ms });
    }
    let status = status.map_err(|e| vm_failed("run the command", &files, e))?;
    let code = match status.strip_prefix("exit ").map(str::parse::<u8>) {
        Some(Ok(code)) => code,
        _ => {
            return Err(vm_failed(
                "run the command",
                &files,
                format!("the guest said {status:?}"),
            ));
        }
    };
    let _ = ctl.write_all(b"bye\n");
    let deadline = Instant::now() + Duration::from_millis(QEMU_EXIT_MS);
    while vm.0.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(POLL_MS));
    }
    // Ends qemu if it did not end by itself, so the output ports close.
    drop(vm);
    for r in relays {
        let _ = r.join();
    }
    drop(fsd);
    drop(group);
    Ok(VmOutcome { code, boot_ms })
}

/// One line from the guest (without its newline), or why there is none.
fn read_line(r: &mut BufReader<UnixStream>) -> std::result::Result<String, String> {
    let mut line = String::new();
    match r.by_ref().take(MAX_CTL_LINE_BYTES).read_line(&mut line) {
        Ok(0) => Err("qemu ended (the guest closed the control port)".into()),
        Ok(_) => Ok(line.trim_end_matches('\n').to_string()),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            Err(format!(
                "no answer from the guest within {BOOT_TIMEOUT_MS} ms"
            ))
        }
        Err(e) => Err(e.to_string()),
    }
}
