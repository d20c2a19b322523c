//! Booting one VM ([`boot`]), running one command in it ([`run`]), and tearing it down
//! ([`super::start`] keeps one as a long-lived sandbox).

use std::fs;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{SigSet, Signal, kill};
use nix::unistd::Pid;

use super::agent::Channel;
use super::jail;
use super::probe::Isolation;
use super::procs::{
    Confine, Reaped, RunDirGuard, connect, give_qemu, runs_dir, spawn, vm_failed, wait_for,
};
use super::qemu::{self, GuestNet, Machine, RunFiles};
use super::{Prepared, VmSpec};
use crate::cgroup;
use crate::error::{Error, Result};
use crate::keeper::InitMsg;
use crate::spec::Limits;
use crate::sys;

/// How long virtiofsd may take to create its socket.
const VIRTIOFSD_START_MS: u64 = 10_000;
/// How long qemu may take to create its port sockets.
pub(super) const QEMU_START_MS: u64 = 10_000;
/// How long the guest may take from qemu's start to `ready` (TCG boots in seconds).
const BOOT_TIMEOUT_MS: u64 = 60_000;
/// How long qemu may take to end after the guest's `BYE`.
const QEMU_EXIT_MS: u64 = 10_000;
/// How long the guest may take to end its processes and unmount the workspace.
const SHUTDOWN_MS: u64 = 10_000;
/// Most bytes of a log quoted in an error.
pub(super) const MAX_LOG_TAIL_BYTES: usize = 2048;
/// Pause between polls for a socket or an exit.
pub(super) const POLL_MS: u64 = 5;

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

/// How a VM run ended (or, for [`start`], the sandbox: `code` 0).
#[derive(Debug, Clone)]
pub struct VmOutcome {
    /// The command's exit status (128 + N when the helper got signal N).
    pub code: u8,
    /// From qemu's start to the guest's `ready`.
    pub boot_ms: u64,
    /// Processes the kernel OOM-killed in the host cgroup (qemu's, not the guest's).
    pub oom_kills: u64,
}

/// A booted VM: its processes, cgroup, run directory and agent channel. Dropping it
/// kills qemu and virtiofsd and removes the cgroup and the run directory.
pub struct Booted {
    /// The agent's channel.
    pub channel: Arc<Channel>,
    /// qemu (dropped first: the fields drop in order).
    vm: Reaped,
    fsd: Reaped,
    ro_fsds: Vec<Reaped>,
    group: cgroup::Group,
    _dir: RunDirGuard,
    /// qemu's uid and gid (held until qemu is gone: no other sandbox is given them).
    _ids: crate::alloc::IdLease,
    files: RunFiles,
    /// From qemu's start to the agent's `READY`.
    pub boot_ms: u64,
    /// The guest kernel's release, as the agent read it.
    pub guest_release: String,
    /// The published ports' leases (held until the VM is gone).
    pub ports: Vec<crate::alloc::HeldPort>,
    /// `--net egress`: the proxy, and the relay of the guest's connections to it.
    pub egress: Option<(Arc<crate::egress::EgressProxy>, Arc<super::netmux::NetMux>)>,
}

impl std::fmt::Debug for Booted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Booted")
            .field("qemu", &self.vm.0.id())
            .finish()
    }
}

impl Booted {
    /// qemu's pid.
    pub fn qemu_pid(&self) -> i32 {
        self.vm.0.id() as i32
    }
    /// virtiofsd's pid.
    pub fn virtiofsd_pid(&self) -> i32 {
        self.fsd.0.id() as i32
    }
    /// qemu's monitor socket (host path).
    pub fn qmp_sock(&self) -> PathBuf {
        self.files.qmp()
    }
    /// The cgroup directories of qemu and virtiofsd.
    pub fn cgroups(&self) -> Vec<PathBuf> {
        self.group
            .dirs()
            .into_iter()
            .map(Path::to_path_buf)
            .collect()
    }

    /// Waits until qemu has exited (stopped from outside, or the guest powered off).
    pub(super) fn wait_qemu(&mut self) {
        while let Err(e) = self.vm.0.wait() {
            if e.kind() != std::io::ErrorKind::Interrupted {
                break;
            }
        }
    }

    /// Shuts the guest down (its processes ended, the workspace synced and unmounted),
    /// waits for qemu, then frees everything: virtiofsd, the cgroup, the run directory.
    fn shut_down(mut self) -> Result<u64> {
        if self.channel.shutdown(Duration::from_millis(SHUTDOWN_MS)) {
            let deadline = Instant::now() + Duration::from_millis(QEMU_EXIT_MS);
            while self.vm.0.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(POLL_MS));
            }
        }
        self.free()
    }

    /// Frees what is left once qemu ended (or ends it).
    pub(super) fn free(mut self) -> Result<u64> {
        // The port leases go with `self`, after qemu.
        let _ = self.vm.0.kill();
        self.wait_qemu();
        let _ = self.fsd.0.kill();
        let _ = self.fsd.0.wait();
        for d in &mut self.ro_fsds {
            let _ = d.0.kill();
            let _ = d.0.wait();
        }
        if let Some((proxy, mux)) = &self.egress {
            mux.close_all();
            proxy.stop();
        }
        let oom = self.group.oom_kills().unwrap_or(0);
        self.group.destroy()?;
        Ok(oom)
    }
}

/// Whether process `pid` (a child of this one) runs: neither gone nor a zombie.
pub(super) fn running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X'))
    })
}

/// The guest's network for `spec`, with the host ports leased for its `--publish`.
pub(super) fn guest_net(spec: &VmSpec, leases: &[crate::alloc::HeldPort]) -> GuestNet {
    if !leases.is_empty() {
        GuestNet::Published(leases.iter().map(|l| (l.host, l.internal)).collect())
    } else if spec.loopback {
        GuestNet::Loopback
    } else {
        GuestNet::None
    }
}

/// Boots a VM for `spec` with `prep`: its cgroup under `cgroup_root`, its run directory
/// under `state_dir/vm/`, virtiofsd, qemu, and the agent's channel once the guest said
/// `READY`. `leases` are the host ports of `--publish`: their listeners are closed just
/// before qemu starts (qemu binds the ports itself); [`Booted`] holds their locks.
pub fn boot(
    spec: &VmSpec,
    prep: &Prepared,
    state_dir: &Path,
    cgroup_root: &Path,
    leases: Vec<crate::alloc::PortLease>,
    on_qemu: impl FnOnce(i32),
) -> Result<Booted> {
    if prep.accel.isolation == Isolation::NeedsValidation && !spec.accept_emulation {
        return Err(Error::VmUnavailable {
            what: "isolation",
            reason: prep.accel.reason.clone(),
        });
    }
    let (group, procs) = vm_cgroup(spec, cgroup_root)?;
    let (dir_guard, ids, files) = run_dir(spec, state_dir)?;
    let qemu_id = ids.base();
    // Every VM process's minimal root is a tmpfs the child mounts here in a mount
    // namespace of its own (so one stage serves them all).
    let stage = files.dir.join("root");
    fs::create_dir(&stage).map_err(|source| Error::StateDir {
        path: stage.clone(),
        source,
    })?;
    let (fsd, ro_fsds) = start_virtiofsds(spec, prep, &files, &stage, &procs, qemu_id)?;
    // qemu binds the published ports itself, on the host's 127.0.0.1: their listeners
    // go now (the port locks stay held, so no other sandbox is given them).
    let ports: Vec<_> = leases.into_iter().map(|l| l.into_held()).collect();
    let net = guest_net(spec, &ports);
    let started = Instant::now();
    let mut vm = start_qemu(spec, prep, &files, &stage, &procs, qemu_id, net)?;
    drop(procs);
    on_qemu(vm.0.id() as i32);
    wait_for(&files.agent(), &mut vm, QEMU_START_MS, &files, "qemu")?;
    let sock = connect(&files.agent(), &mut vm, &files)?;
    let (channel, guest_release) = match Channel::open(sock, Duration::from_millis(BOOT_TIMEOUT_MS))
    {
        Ok(x) => x,
        Err(e) => {
            let why = if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) {
                format!("no word from the guest agent within {BOOT_TIMEOUT_MS} ms")
            } else {
                e.to_string()
            };
            return Err(vm_failed("boot the guest", &files, why));
        }
    };
    let boot_ms = started.elapsed().as_millis() as u64;
    let mounts: Vec<(String, String)> = spec
        .ro_binds
        .iter()
        .enumerate()
        .map(|(i, b)| (qemu::ro_tag(i), b.target.display().to_string()))
        .collect();
    channel
        .mount_ro(&mounts)
        .and_then(|()| channel.put_secrets(&spec.secrets))
        .map_err(|e| {
            vm_failed(
                "give the guest its binds and secrets",
                &files,
                e.to_string(),
            )
        })?;
    let egress = match &spec.egress {
        Some(policy) => Some(start_egress(&channel, policy, state_dir, &spec.name)?),
        None => None,
    };
    Ok(Booted {
        channel,
        vm,
        fsd,
        ro_fsds,
        group,
        _dir: dir_guard,
        _ids: ids,
        files,
        boot_ms,
        guest_release,
        ports,
        egress,
    })
}

/// The VM's cgroup (its memory and CPUs), and its `cgroup.procs` files, which every
/// process the VM starts joins.
fn vm_cgroup(spec: &VmSpec, cgroup_root: &Path) -> Result<(cgroup::Group, Vec<fs::File>)> {
    let limits = Limits {
        memory_bytes: Some(spec.host_memory_bytes()),
        cpuset: spec.cpuset.clone(),
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
    Ok((group, procs))
}

/// The VM's run directory, owned by the uid leased for its qemu: the sockets qemu
/// creates and connects to, its console log.
fn run_dir(
    spec: &VmSpec,
    state_dir: &Path,
) -> Result<(RunDirGuard, crate::alloc::IdLease, RunFiles)> {
    let dir = runs_dir(state_dir).join(format!("{}.{}", spec.name, std::process::id()));
    fs::create_dir_all(&dir).map_err(|source| Error::StateDir {
        path: dir.clone(),
        source,
    })?;
    let dir_guard = RunDirGuard(dir.clone());
    // qemu runs as a host uid of its own, leased like a namespace sandbox's range (two
    // VMs never share one, so neither can signal, trace or read the other), and owns
    // its run directory alone: the sockets it creates and connects to, its console log.
    let ids = crate::alloc::lease_ids(state_dir, &format!("vm-{}", spec.name))?;
    let qemu_id = ids.base();
    fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).map_err(
        |source| Error::StateDir {
            path: dir.clone(),
            source,
        },
    )?;
    give_qemu(&dir, qemu_id)?;
    Ok((dir_guard, ids, RunFiles { dir }))
}

/// The virtiofsd of the workspace and one per `--ro-bind`, each confined to a minimal
/// root holding what it serves, their sockets given to qemu's uid.
fn start_virtiofsds(
    spec: &VmSpec,
    prep: &Prepared,
    files: &RunFiles,
    stage: &Path,
    procs: &[fs::File],
    qemu_id: u32,
) -> Result<(Reaped, Vec<Reaped>)> {
    // virtiofsd, pid 1 of a pid namespace of its own, in a root holding only its
    // program, libraries, run directory and the directory it serves (attached at
    // `/share`): from its exec on it sees nothing else of the host. Its own sandbox
    // (`--sandbox=namespace`) then unshares mount, pid and network namespaces and forks
    // the server, whose pivot_root into `/share` moves both processes' roots.
    let fsd_plan =
        jail::plan_virtiofsd(Path::new("/"), &prep.virtiofsd, &files.dir).map_err(|e| {
            Error::Setup {
                step: format!("vm: plan virtiofsd's root: {} {}", e.what, e.path.display()),
                source: e.source,
            }
        })?;
    let fsd_jail = || {
        sys::Jail::new(&fsd_plan, stage, None).map_err(|source| Error::Setup {
            step: "vm: prepare virtiofsd's root".into(),
            source,
        })
    };
    let share_at = Path::new(jail::SHARE_DIR);
    let jailed_files = RunFiles {
        dir: jail::RUN_DIR.into(),
    };
    // The workspace, opened where it is now (its path resolved once, then no link
    // followed), attached in virtiofsd's root.
    let workspace = fs::canonicalize(&spec.dir)
        .and_then(|d| sys::open_tree_clone(&d))
        .map_err(|source| Error::DetachedMount {
            path: spec.dir.clone(),
            source,
        })?;
    let mut fsd = spawn(
        &prep.virtiofsd,
        &qemu::virtiofsd_args(&jailed_files, share_at),
        &files.dir.join("virtiofsd.log"),
        procs,
        "virtiofsd",
        Confine {
            attach: Some((std::os::fd::AsFd::as_fd(&workspace), share_at)),
            jail: Some(fsd_jail()?),
            pid_ns: true,
            ..Confine::default()
        },
    )?;
    drop(workspace);
    wait_for(
        &files.fs_sock(),
        &mut fsd,
        VIRTIOFSD_START_MS,
        files,
        "virtiofsd",
    )?;
    give_qemu(&files.fs_sock(), qemu_id)?;
    // One read-only virtiofsd per --ro-bind: the source, opened without following a
    // symlink, attached (read-only) in a mount namespace of that virtiofsd's own.
    let mut ro_fsds = Vec::new();
    for (i, b) in spec.ro_binds.iter().enumerate() {
        let tree = sys::open_tree_clone(&b.source).map_err(|source| Error::DetachedMount {
            path: b.source.clone(),
            source,
        })?;
        sys::mount_setattr(
            std::os::fd::AsFd::as_fd(&tree),
            sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV,
            None,
        )
        .map_err(|source| Error::DetachedMount {
            path: b.source.clone(),
            source,
        })?;
        let mut d = spawn(
            &prep.virtiofsd,
            &qemu::ro_virtiofsd_args(&jailed_files, i, share_at),
            &files.dir.join(format!("virtiofsd-ro{i}.log")),
            procs,
            "virtiofsd",
            Confine {
                attach: Some((std::os::fd::AsFd::as_fd(&tree), share_at)),
                jail: Some(fsd_jail()?),
                pid_ns: true,
                ..Confine::default()
            },
        )?;
        drop(tree);
        wait_for(
            &files.ro_sock(i),
            &mut d,
            VIRTIOFSD_START_MS,
            files,
            "virtiofsd",
        )?;
        give_qemu(&files.ro_sock(i), qemu_id)?;
        ro_fsds.push(d);
    }
    Ok((fsd, ro_fsds))
}

/// qemu, confined to its minimal root as the leased uid, in namespaces of its own.
fn start_qemu(
    spec: &VmSpec,
    prep: &Prepared,
    files: &RunFiles,
    stage: &Path,
    procs: &[fs::File],
    qemu_id: u32,
    net: GuestNet,
) -> Result<Reaped> {
    // The paths of the run directory as qemu's root shows it.
    let jailed_files = RunFiles {
        dir: jail::RUN_DIR.into(),
    };
    // qemu's minimal root: the paths on its command line are that root's.
    let plan = jail::plan(
        Path::new("/"),
        &jail::Needs {
            qemu: &prep.qemu,
            kernel: &prep.kernel.image,
            initrd: &prep.initrd.0,
            run_dir: &files.dir,
            kvm: prep.accel.accel == super::probe::Accel::Kvm,
        },
    )
    .map_err(|e| Error::Setup {
        step: format!("vm: plan qemu's root: {} {}", e.what, e.path.display()),
        source: e.source,
    })?;
    let qemu_jail =
        sys::Jail::new(&plan, stage, Some((qemu_id, qemu_id))).map_err(|source| Error::Setup {
            step: "vm: prepare qemu's root".into(),
            source,
        })?;
    let machine = Machine {
        accel: prep.accel.accel,
        memory_mib: spec.memory_mib,
        cpus: spec.cpus,
        kernel: Path::new(jail::KERNEL),
        initrd: Path::new(jail::INITRD),
        net: net.clone(),
        ro_binds: spec.ro_binds.len(),
        tsc_khz: super::probe::host_tsc_khz(),
        pids: spec.pids,
        label: &files.dir,
    };
    let unshare = match net {
        // No network at all (the guest has none), no host System V IPC, a host name of
        // its own; its sockets are paths, which work across network namespaces.
        GuestNet::None | GuestNet::Loopback => {
            libc::CLONE_NEWNET | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS
        }
        // The forwarded ports are the host's: qemu stays in its network namespace, and
        // `restrict=on` keeps the guest from reaching out through it.
        GuestNet::Published(_) => libc::CLONE_NEWIPC | libc::CLONE_NEWUTS,
    };
    spawn(
        &prep.qemu,
        &qemu::qemu_args(&machine, &jailed_files),
        &files.dir.join("qemu.log"),
        procs,
        "qemu",
        Confine {
            unshare,
            attach: None,
            // qemu sees nothing of the host but its libraries, firmware, the guest's
            // kernel and initramfs (read-only) and its run directory, as an
            // unprivileged uid without capabilities, pid 1 of a pid namespace of its
            // own (no other process to see or signal).
            jail: Some(qemu_jail),
            pid_ns: true,
        },
    )
}

/// The egress proxy of a `--net egress` VM, listening in a network namespace of its
/// own, and the relay of the guest's connections to it (told to the guest before any
/// exec).
fn start_egress(
    channel: &Arc<Channel>,
    policy: &cowspace_egress::policy::Policy,
    state_dir: &Path,
    name: &str,
) -> Result<(Arc<crate::egress::EgressProxy>, Arc<super::netmux::NetMux>)> {
    let failed = |step: &'static str| move |source| Error::Egress { step, source };
    let netns = super::netmux::private_netns().map_err(failed("make the proxy's namespace"))?;
    let proxy = crate::egress::EgressProxy::launch(&netns, policy.clone(), state_dir, name)?;
    let mux = match super::netmux::NetMux::start(channel, netns) {
        Ok(m) => m,
        Err(e) => {
            proxy.stop();
            return Err(failed("tell the guest to listen for its proxy")(e));
        }
    };
    Ok((Arc::new(proxy), mux))
}

/// The environment every command in the guest starts from: `PATH`, `HOME`, `--env`.
pub(super) fn base_env(spec: &VmSpec) -> Vec<(String, String)> {
    let mut env = vec![
        (
            "PATH".to_string(),
            "/bin:/sbin:/usr/bin:/usr/sbin".to_string(),
        ),
        ("HOME".to_string(), "/root".to_string()),
    ];
    if spec.egress.is_some() {
        env.extend(
            crate::spec::egress_env()
                .into_iter()
                .map(|(k, v)| (k.to_string(), v)),
        );
    }
    env.extend(spec.env.iter().cloned());
    env
}

/// The signals that end a VM, blocked in the calling thread (every thread started
/// later inherits the mask; qemu and virtiofsd get an empty one back before exec).
pub(super) fn block_stop_signals() -> Result<SigSet> {
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
    Ok(signals)
}

/// Runs `spec` in a VM with `prep` (from [`super::prepare`]), its per-run files under
/// `state_dir/vm/`, its cgroup under `cgroup_root`, with this process's stdin, stdout
/// and stderr. `on_ready` is told once the guest is up. SIGINT, SIGTERM, SIGHUP and
/// SIGQUIT to the helper end the VM (exit 128 + N).
pub fn run(
    spec: &VmSpec,
    prep: &Prepared,
    state_dir: &Path,
    cgroup_root: &Path,
    on_ready: impl FnOnce(&VmReady),
) -> Result<VmOutcome> {
    let signals = block_stop_signals()?;
    let victim = Arc::new(AtomicI32::new(0));
    let got = Arc::new(AtomicI32::new(0));
    {
        let (victim, got) = (victim.clone(), got.clone());
        std::thread::spawn(move || {
            if let Ok(sig) = signals.wait() {
                got.store(sig as i32, Ordering::SeqCst);
                let pid = victim.load(Ordering::SeqCst);
                if pid > 0 {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                }
            }
        });
    }
    let interrupted = |got: &AtomicI32| match got.load(Ordering::SeqCst) {
        0 => None,
        s => Some(128u8.saturating_add(s as u8)),
    };
    let booted = boot(spec, prep, state_dir, cgroup_root, Vec::new(), |pid| {
        victim.store(pid, Ordering::SeqCst);
    });
    let booted = match booted {
        Ok(b) => b,
        Err(e) => {
            return match interrupted(&got) {
                Some(code) => Ok(VmOutcome {
                    code,
                    boot_ms: 0,
                    oom_kills: 0,
                }),
                None => Err(e),
            };
        }
    };
    let boot_ms = booted.boot_ms;
    on_ready(&VmReady {
        boot_ms,
        qemu_pid: booted.qemu_pid(),
        virtiofsd_pid: booted.virtiofsd_pid(),
    });
    let dup = |fd: std::os::fd::BorrowedFd<'_>| -> Result<OwnedFd> {
        fd.try_clone_to_owned().map_err(|source| Error::Setup {
            step: "vm: pass the standard streams on".into(),
            source,
        })
    };
    // A terminal is not passed: the VM has none for the command, and this process,
    // in a process group of its own, must not read the caller's (SIGTTIN).
    let stdin = if std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        OwnedFd::from(fs::File::open("/dev/null").map_err(|source| Error::Setup {
            step: "vm: open /dev/null".into(),
            source,
        })?)
    } else {
        dup(std::io::stdin().as_fd())?
    };
    let stdio = [
        stdin,
        dup(std::io::stdout().as_fd())?,
        dup(std::io::stderr().as_fd())?,
    ];
    let (tx, rx) = std::sync::mpsc::channel();
    let msg = super::proto::ExecMsg {
        argv: spec.command.clone(),
        env: base_env(spec),
        workdir: spec.workdir.clone(),
        tty: None,
    };
    booted
        .channel
        .exec(1, &msg, stdio, None, tx)
        .map_err(|e| vm_failed("send the command", &booted.files, e.to_string()))?;
    let mut code = None;
    while let Ok(m) = rx.recv() {
        match m {
            InitMsg::Started(..) => continue,
            InitMsg::Done(c) => code = Some(c.clamp(0, 255) as u8),
            InitMsg::Failed(errno, what) => {
                let err = std::io::Error::from_raw_os_error(errno);
                let cmd = &spec.command[0];
                code = Some(match (what, errno) {
                    (0, libc::ENOENT) => {
                        eprintln!("sandbox-helper: {cmd}: command not found in the VM");
                        127
                    }
                    _ => {
                        eprintln!("sandbox-helper: {cmd}: {err}");
                        126
                    }
                });
            }
            InitMsg::Gone => {}
        }
        break;
    }
    if let Some(c) = interrupted(&got) {
        let oom_kills = booted.free()?;
        return Ok(VmOutcome {
            code: c,
            boot_ms,
            oom_kills,
        });
    }
    let Some(code) = code else {
        return Err(vm_failed(
            "run the command",
            &booted.files,
            "qemu ended before the command did".into(),
        ));
    };
    let oom_kills = booted.shut_down()?;
    Ok(VmOutcome {
        code,
        boot_ms,
        oom_kills,
    })
}
