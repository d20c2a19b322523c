//! The helper's side of a sandbox run: refuse, lease, prepare, clone, hand over, wait,
//! clean up.

use std::fs::File;
use std::io::{IoSlice, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::thread::JoinHandleExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::sched::CloneFlags;
use nix::sys::signal::{SigmaskHow, Signal, kill};
use nix::sys::socket::{
    AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType, send, sendmsg, socketpair,
};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::Pid;

use crate::alloc::{self, IDS_PER_SANDBOX};
use crate::cgroup::{self, Group};
use crate::error::{Error, Result};
use crate::net::Network;
use crate::rootfs::{self, MAX_CGROUP_JOINS, MAX_DETACHED_MOUNTS, RealHost};
use crate::spec::Spec;
use crate::{init, probe, seccomp, sys};

/// Where the helper keeps its leases and per-run directories, and which cgroups it uses.
#[derive(Debug, Clone)]
pub struct Options {
    /// The state directory (host-wide: sandboxes sharing it never share a uid or port).
    pub state_dir: PathBuf,
    /// The cgroup root (normally `/sys/fs/cgroup`).
    pub cgroup_root: PathBuf,
}

/// A published port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Published {
    /// Port inside the sandbox.
    pub internal: u16,
    /// Port on the host's 127.0.0.1.
    pub host: u16,
}

/// What is known once the sandbox is set up, just before its command starts.
#[derive(Debug, Clone)]
pub struct Ready {
    /// The published ports.
    pub published: Vec<Published>,
    /// First host uid of the sandbox's range (inside uid 0).
    pub host_uid_base: u32,
    /// The sandbox init's pid on the host.
    pub init_pid: i32,
    /// The sandbox's cgroup directories.
    pub cgroups: Vec<PathBuf>,
    /// What became of the host's mount of the workspace ([`Spec::suspend_host_mount`]).
    pub host_mount: HostMount,
}

/// The host's mount of the workspace during the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostMount {
    /// Left alone (not asked to suspend it).
    Kept,
    /// Unmounted for the run; the caller mounts it again.
    Suspended,
    /// In use on the host (`EBUSY`), so it stays mounted during the run.
    Busy,
    /// Replaced by one mount shared by the host and the sandbox ([`crate::share`]).
    Shared,
}

impl HostMount {
    pub fn as_str(self) -> &'static str {
        match self {
            HostMount::Kept => "kept",
            HostMount::Suspended => "suspended",
            HostMount::Busy => "busy",
            HostMount::Shared => "shared",
        }
    }
}

/// Unmounts the host's overlay at `dir` (not lazily: one in use stays, and says so).
/// Unmounting an overlay syncs its upper filesystem, which takes milliseconds: run
/// beside the sandbox's setup.
fn suspend_host_mount(dir: &Path) -> Result<HostMount> {
    match nix::mount::umount2(dir, nix::mount::MntFlags::empty()) {
        Ok(()) => Ok(HostMount::Suspended),
        Err(nix::errno::Errno::EBUSY) => Ok(HostMount::Busy),
        // Gone already (unmounted meanwhile): nothing to suspend.
        Err(nix::errno::Errno::EINVAL) => Ok(HostMount::Kept),
        Err(e) => Err(Error::Sync(std::io::Error::other(format!(
            "unmount the host's mount of {}: {e}",
            dir.display()
        )))),
    }
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// The command's exit status (128 + signal number when killed).
    pub code: u8,
    /// Processes the kernel OOM-killed in the sandbox's memory group.
    pub oom_kills: u64,
    /// Forks the kernel refused at the sandbox's process limit (`--pids`).
    pub refused_forks: u64,
}

/// Namespaces the sandbox init is cloned into (the cgroup namespace follows after the
/// helper has moved init into its cgroups).
const NAMESPACES: CloneFlags = CloneFlags::CLONE_NEWUSER
    .union(CloneFlags::CLONE_NEWNS)
    .union(CloneFlags::CLONE_NEWPID)
    .union(CloneFlags::CLONE_NEWNET)
    .union(CloneFlags::CLONE_NEWIPC)
    .union(CloneFlags::CLONE_NEWUTS);
/// Pause between polls of the signal-forwarding thread.
const SIGNAL_POLL_MS: u64 = 100;

/// Removes the per-run directory on drop.
struct RunDir(PathBuf);

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(self.0.join("root"));
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// This run's overlay work directory beside the workspace's upper layer (see
/// [`crate::overlay`]), removed on drop.
struct OverlayWorkDir(PathBuf);

impl OverlayWorkDir {
    fn create(layers: &crate::overlay::Layers) -> Result<OverlayWorkDir> {
        crate::overlay::reap_stale_work_dirs(&layers.upper_parent);
        let path = layers.upper_parent.join(&layers.work_name);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|source| Error::StateDir {
                path: path.clone(),
                source,
            })?;
        Ok(OverlayWorkDir(path))
    }
}

impl Drop for OverlayWorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Kills and reaps the init on drop unless it was reaped.
struct InitGuard(Option<Pid>);

impl Drop for InitGuard {
    fn drop(&mut self) {
        if let Some(pid) = self.0.take() {
            let _ = kill(pid, Signal::SIGKILL);
            let _ = waitpid(pid, None);
        }
    }
}

/// Restores the signal mask on drop.
struct MaskGuard(nix::sys::signal::SigSet);

impl Drop for MaskGuard {
    fn drop(&mut self) {
        let _ = nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&self.0), None);
    }
}

/// A sandbox whose init is set up and in its cgroups, just before its command starts
/// (or, for a long-lived one, before it serves execs). Dropping it kills init.
struct Live {
    pid: Pid,
    guard: InitGuard,
    group: Group,
    ours: OwnedFd,
    ready: Ready,
    leases: Vec<alloc::PortLease>,
    shared: Option<crate::share::SharedMount>,
    // Freed last, in this order.
    _mask: MaskGuard,
    _image_layer: Option<crate::image::PrivateLayer>,
    _work_dir: Option<OverlayWorkDir>,
    _run_dir: RunDir,
    _root_dir: RunDir,
    _ids: alloc::IdLease,
}

/// Refuses, leases, prepares and clones: everything up to the point where the command
/// would start. The process must be single-threaded (the sandbox init is a fork).
fn prepare(spec: &Spec, opts: &Options) -> Result<Live> {
    // Refuse before any effect.
    probe::require_base()?;
    let placements = cgroup::require(&opts.cgroup_root, &spec.limits)?;
    let programs = seccomp::programs()?;
    if sys::thread_count().map_err(Error::Clone)? != 1 {
        return Err(Error::Clone(std::io::Error::other(
            "the helper must be single-threaded to fork the sandbox",
        )));
    }

    let state = &opts.state_dir;
    std::fs::create_dir_all(state).map_err(|source| Error::StateDir {
        path: state.clone(),
        source,
    })?;
    cgroup::reap_stale(&placements);
    reap_stale_run_dirs(&state.join("run"));
    reap_stale_run_dirs(Path::new(ROOTS_DIR));
    crate::vm::reap_stale(state);
    let ids = alloc::lease_ids(state, &spec.name)?;
    let leases = alloc::lease_ports(state, &spec.name, &spec.publish)?;
    let published: Vec<Published> = leases
        .iter()
        .map(|l| Published {
            internal: l.internal,
            host: l.host,
        })
        .collect();
    let run_dir = RunDir(
        state
            .join("run")
            .join(format!("{}.{}", spec.name, std::process::id())),
    );
    std::fs::create_dir_all(&run_dir.0).map_err(|source| Error::StateDir {
        path: run_dir.0.clone(),
        source,
    })?;
    // The new root is mounted over by init as the sandbox's root, through a path the
    // sandbox's uid must be able to search: a root-owned directory every user may
    // traverse, not under the runtime root (which may lie under a 0700 directory).
    let roots = Path::new(ROOTS_DIR);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o711)
        .create(roots)
        .map_err(|source| Error::StateDir {
            path: roots.to_path_buf(),
            source,
        })?;
    let _ = std::fs::set_permissions(roots, std::os::unix::fs::PermissionsExt::from_mode(0o711));
    let root_dir = RunDir(roots.join(format!("{}.{}", spec.name, std::process::id())));
    let new_root = root_dir.0.join("root");
    std::fs::create_dir_all(&new_root).map_err(|source| Error::StateDir {
        path: new_root.clone(),
        source,
    })?;
    let work_dir = match &spec.overlay {
        Some(layers) => Some(OverlayWorkDir::create(layers)?),
        None => None,
    };
    let image_layer = match &spec.image {
        Some(_) => Some(crate::image::PrivateLayer::create(
            &run_dir.0.join("image"),
        )?),
        None => None,
    };
    let plan = rootfs::plan(spec, &new_root, &RealHost);
    assert!(
        plan.detached.len() <= MAX_DETACHED_MOUNTS,
        "too many mounts planned"
    );
    let group = Group::create(&placements, &spec.name, &spec.limits)?;
    let joins = group.self_joins()?;
    assert!(
        joins.len() <= MAX_CGROUP_JOINS,
        "too many cgroup hierarchies"
    );

    let (ours, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| Error::Sync(e.into()))?;
    let mut old_mask = nix::sys::signal::SigSet::empty();
    let mut blocked = init::forwarded_signals();
    blocked.add(Signal::SIGHUP);
    nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&blocked), Some(&mut old_mask))
        .map_err(|e| Error::Clone(e.into()))?;
    let mask = MaskGuard(old_mask);

    // The host's overlay goes before the clone: a mount namespace cloned while it is
    // mounted would keep a copy of it (a second live overlay over the upper layer) until
    // init detaches its old root.
    if spec.share_host_mount {
        crate::share::unmount_host(&spec.workspace)?;
    }
    let pid = match sys::clone_fork(NAMESPACES.bits()).map_err(Error::Clone)? {
        sys::Forked::Child => init::main(init::Context {
            spec,
            plan: &plan,
            sock: &theirs,
            seccomp: &programs,
        }),
        sys::Forked::Parent(pid) => pid,
    };
    drop(theirs);
    let guard = InitGuard(Some(pid));

    let map = format!("0 {} {IDS_PER_SANDBOX}\n", ids.base());
    for file in ["uid_map", "gid_map"] {
        std::fs::write(format!("/proc/{pid}/{file}"), &map)
            .map_err(|source| Error::IdMap { file, source })?;
    }
    // A long-lived sandbox of an overlay workspace: the helper mounts the workspace once
    // on layers idmapped with init's user namespace, at the host path, and init gets a
    // clone of that mount (`crate::share`).
    let shared = match (&spec.overlay, spec.share_host_mount, &work_dir) {
        (Some(layers), true, Some(work)) => {
            let userns = File::open(format!("/proc/{pid}/ns/user")).map_err(Error::Sync)?;
            let work_name = work
                .0
                .file_name()
                .ok_or_else(|| Error::StateDir {
                    path: work.0.clone(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        "the overlay work directory has no name",
                    ),
                })?
                .to_os_string();
            Some(crate::share::share(
                layers,
                &spec.workspace,
                &work_name,
                userns.as_fd(),
                ids.base(),
                &root_dir.0.join("layers"),
            )?)
        }
        _ => None,
    };
    // An image root: the helper mounts the image's overlay on layers idmapped with
    // init's user namespace, and init attaches it as its root (`crate::image`).
    let image_root = match (&spec.image, &image_layer) {
        (Some(image), Some(layer)) => {
            let userns = File::open(format!("/proc/{pid}/ns/user")).map_err(Error::Sync)?;
            Some(crate::image::mount(
                image,
                layer,
                userns.as_fd(),
                ids.base(),
                &root_dir.0.join("image-layers"),
            )?)
        }
        _ => None,
    };
    // Init joins its v1 groups itself (`Group::self_joins`, handed over with the mounts);
    // a move by pid (v2 here) takes the kernel's thread-group lock, whose first taking
    // waits for an RCU grace period: done while init builds its view. Init enters its
    // cgroup namespace, and the command starts, only after `run`, sent once both are done.
    // The host's overlay of the workspace goes away in the same window (the sandbox
    // mounts its own overlay of the layers, read from the mount table at validation).
    let (handover, moved, host_mount) = std::thread::scope(|scope| {
        let mover = scope.spawn(|| group.add(pid));
        let suspender = spec
            .suspend_host_mount
            .then(|| scope.spawn(|| suspend_host_mount(&spec.workspace)));
        let handover = hand_over(pid, &plan, &joins, &ours, spec, image_root);
        // A thread that panicked is a step that failed: its error, then the clean-up.
        let panicked = |step: &str| Error::Setup {
            step: step.into(),
            source: std::io::Error::other("the thread doing it panicked"),
        };
        let host_mount = match suspender {
            Some(t) => t
                .join()
                .unwrap_or_else(|_| Err(panicked("unmount the workspace on the host"))),
            None => Ok(HostMount::Kept),
        };
        let moved = mover
            .join()
            .unwrap_or_else(|_| Err(panicked("move init into its cgroup")));
        (handover, moved, host_mount)
    });
    let host_mount = host_mount?;
    moved?;
    handover?;

    let ready = Ready {
        published,
        host_uid_base: ids.base(),
        init_pid: pid.as_raw(),
        cgroups: group.dirs().into_iter().map(Path::to_path_buf).collect(),
        host_mount: if shared.is_some() {
            HostMount::Shared
        } else {
            host_mount
        },
    };
    Ok(Live {
        pid,
        guard,
        group,
        ours,
        ready,
        leases,
        shared,
        _mask: mask,
        _image_layer: image_layer,
        _work_dir: work_dir,
        _run_dir: run_dir,
        _root_dir: root_dir,
        _ids: ids,
    })
}

/// Where the sandboxes' new roots are made (see [`prepare`]).
pub const ROOTS_DIR: &str = "/run/cowspace-sandbox";

/// Runs `spec` in a new sandbox and waits for it. `on_ready` is called once everything
/// is set up, just before the command starts (it prints the published ports).
///
/// The process must be single-threaded when this is called (the sandbox init is a fork).
pub fn run(spec: &Spec, opts: &Options, on_ready: impl FnOnce(&Ready)) -> Result<Outcome> {
    let mut live = prepare(spec, opts)?;
    let pid = live.pid;
    let netns = File::open(format!("/proc/{pid}/ns/net")).map_err(Error::Sync)?;
    on_ready(&live.ready);
    let network = network_of(spec, opts, netns, std::mem::take(&mut live.leases))?;
    send(live.ours.as_raw_fd(), b"run", MsgFlags::empty()).map_err(|e| Error::Sync(e.into()))?;
    expect_reply(&live.ours, b'R', spec)?;

    let stop = Arc::new(AtomicBool::new(false));
    let forwarder = {
        let stop = stop.clone();
        std::thread::spawn(move || forward_signals(pid, &stop))
    };
    let status = loop {
        match waitpid(pid, None) {
            Err(nix::errno::Errno::EINTR) => continue,
            other => break other,
        }
    };
    live.guard.0 = None;
    stop.store(true, Ordering::SeqCst);
    // Wake the forwarder now rather than after its poll interval: it sees `stop` first.
    let _ = nix::sys::pthread::pthread_kill(forwarder.as_pthread_t(), Signal::SIGUSR2);
    let _ = forwarder.join();
    network.stop();
    let code = match status.map_err(|e| Error::Wait(e.into()))? {
        WaitStatus::Exited(_, code) => code as u8,
        WaitStatus::Signaled(_, sig, _) => 128u8.saturating_add(sig as u8),
        other => {
            return Err(Error::Wait(std::io::Error::other(format!(
                "unexpected status {other:?}"
            ))));
        }
    };
    let oom_kills = live.group.oom_kills().unwrap_or(0);
    let refused_forks = live.group.refused_forks().unwrap_or(0);
    live.group.destroy()?;
    if let Some(mut m) = live.shared.take() {
        let _ = m.release();
    }
    let _ = std::io::stdout().flush();
    Ok(Outcome {
        code,
        oom_kills,
        refused_forks,
    })
}

/// Starts a long-lived sandbox for `spec` (`spec.keep`) and serves it until it stops:
/// `on_ready` is called once it is set up and its socket accepts execs (the caller
/// announces it and detaches from its own caller). Returns after `stop` (or a signal,
/// or init's death), once every process is gone and the cgroups, ports and mounts are
/// freed.
///
/// The process must be single-threaded when this is called (the sandbox init is a fork).
pub fn start(
    spec: &Spec,
    opts: &Options,
    on_ready: impl FnOnce(&Ready, &serde_json::Value),
) -> Result<Outcome> {
    assert!(spec.keep, "start is for long-lived sandboxes");
    let listener = crate::keeper::listen_on(&opts.state_dir, &spec.name)?;
    let mut live = prepare(spec, opts)?;
    let pid = live.pid;
    let netns = File::open(format!("/proc/{pid}/ns/net")).map_err(Error::Sync)?;
    let network = Arc::new(network_of(
        spec,
        opts,
        netns,
        std::mem::take(&mut live.leases),
    )?);
    send(live.ours.as_raw_fd(), b"run", MsgFlags::empty()).map_err(|e| Error::Sync(e.into()))?;
    expect_reply(&live.ours, b'R', spec)?;
    let ports = network.ports_json();
    let started_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let status = serde_json::json!({
        "name": spec.name,
        "provider": "namespaces",
        "isolation": "verified",
        "keeper_pid": std::process::id(),
        "init_pid": pid.as_raw(),
        "host_uid_base": live.ready.host_uid_base,
        // What a runtime's own tools may write into the shared mount as (root inside);
        // host root cannot create names there (`docs/files.md`).
        "host_write_ids": {"uid": live.ready.host_uid_base, "gid": live.ready.host_uid_base},
        "ports": ports,
        "net": spec.net.as_str(),
        "limits": crate::cgroup::read_back(&live.ready.cgroups),
        "cgroups": live.ready.cgroups,
        "started_at": started_at,
        "host_mount": live.ready.host_mount.as_str(),
        "workspace": spec.workspace,
        "idle_timeout_ms": spec.idle_timeout.map(|d| d.as_millis() as u64),
        "workdir": spec.workdir,
    });
    let init_sock = live.ours.try_clone().map_err(Error::Sync)?;
    let stopped = crate::keeper::serve(
        &listener,
        crate::keeper::InitBackend::start(init_sock, pid).map_err(|source| Error::Setup {
            step: "start the thread that reads the sandbox init's answers".into(),
            source,
        })?,
        pid,
        status.clone(),
        live.ready.cgroups.clone(),
        Some(network.clone()),
    );
    let mut announced = status.clone();
    if let Some(e) = network.egress() {
        announced["egress"] = e.status();
    }
    on_ready(&live.ready, &announced);
    while let Err(nix::errno::Errno::EINTR) = waitpid(pid, None) {}
    live.guard.0 = None;
    network.stop();
    let oom_kills = live.group.oom_kills().unwrap_or(0);
    let refused_forks = live.group.refused_forks().unwrap_or(0);
    let destroyed = live.group.destroy();
    if let Some(mut m) = live.shared.take()
        && let Ok(false) = m.release()
    {
        eprintln!(
            "sandbox-helper: {}: {} was in use on the host and was detached lazily",
            spec.name,
            spec.workspace.display()
        );
    }
    drop(listener);
    stopped.reply(oom_kills);
    destroyed?;
    Ok(Outcome {
        code: 0,
        oom_kills,
        refused_forks,
    })
}

/// The sandbox's network as its keeper runs it: its published ports, and with
/// `--net egress` its proxy (started with the policy, before the first command runs).
fn network_of(
    spec: &Spec,
    opts: &Options,
    netns: File,
    leases: Vec<crate::alloc::PortLease>,
) -> Result<Network> {
    let egress = match &spec.egress {
        Some(policy) => {
            let proxy = crate::egress::EgressProxy::launch(
                &netns,
                policy.clone(),
                &opts.state_dir,
                &spec.name,
            )?;
            if let Some(inject) = &spec.inject
                && let Err(e) = proxy.set_injections(inject.config.clone())
            {
                proxy.stop();
                return Err(e);
            }
            Some(proxy)
        }
        None => None,
    };
    Network::start(
        &spec.name,
        &opts.state_dir,
        netns,
        spec.net != crate::spec::Net::None,
        leases,
        egress,
    )
    .map_err(Error::Sync)
}

/// Makes the detached mounts of `plan` (the workspace idmapped with init's user
/// namespace), hands them to init with `go`, and waits until init has set up.
fn hand_over(
    pid: Pid,
    plan: &rootfs::Plan,
    joins: &[File],
    ours: &OwnedFd,
    spec: &Spec,
    mut image_root: Option<OwnedFd>,
) -> Result<()> {
    let userns = File::open(format!("/proc/{pid}/ns/user")).map_err(Error::Sync)?;
    let mut mounts: Vec<OwnedFd> = Vec::with_capacity(plan.detached.len());
    for (i, d) in plan.detached.iter().enumerate() {
        if plan.image_root == Some(i) {
            let fd = image_root.take().ok_or_else(|| Error::DetachedMount {
                path: d.host.clone(),
                source: std::io::Error::other("the image root was not mounted"),
            })?;
            mounts.push(fd);
            continue;
        }
        let fd = sys::open_tree_clone(&d.host).map_err(|source| Error::DetachedMount {
            path: d.host.clone(),
            source,
        })?;
        let userns = d.idmapped().then(|| userns.as_fd());
        sys::mount_setattr(fd.as_fd(), d.attrs, userns).map_err(|source| {
            if d.idmapped()
                && matches!(
                    source.raw_os_error(),
                    Some(libc::EINVAL | libc::EOPNOTSUPP | libc::EPERM)
                )
            {
                Error::Unsupported {
                    control: if spec.overlay.is_some() {
                        crate::overlay::CONTROL
                    } else {
                        "workspace mapped to the sandbox's uids (idmapped mount)"
                    },
                    reason: format!(
                        "the filesystem of {} refuses idmapped mounts: {source}",
                        d.host.display()
                    ),
                }
            } else {
                Error::DetachedMount {
                    path: d.host.clone(),
                    source,
                }
            }
        })?;
        mounts.push(fd);
    }
    let mut raw: Vec<i32> = mounts.iter().map(|m| m.as_raw_fd()).collect();
    // After the mounts, the cgroup files init joins by itself.
    raw.extend(joins.iter().map(|j| j.as_raw_fd()));
    sendmsg::<()>(
        ours.as_raw_fd(),
        &[IoSlice::new(b"go")],
        &[ControlMessage::ScmRights(&raw)],
        MsgFlags::empty(),
        None,
    )
    .map_err(|e| Error::Sync(e.into()))?;
    drop(mounts);
    expect_reply(ours, b'S', spec)
}

/// Frees what sandboxes whose helper died (`SIGKILL`) left behind: their cgroups in
/// every hierarchy under `cgroup_root`, their per-run directories in `state_dir`, and,
/// with `workspace`, their overlay work directories beside that workspace's upper layer
/// (found from the overlay mounted at it). A helper that starts does the same; this is
/// for `sweep`, which must not wait for the next sandbox to start.
pub fn reap_stale(state_dir: &Path, cgroup_root: &Path, workspace: Option<&Path>) -> Result<()> {
    let placements: Vec<cgroup::Placement> = cgroup::ControllerKind::ALL
        .iter()
        .filter_map(|c| cgroup::locate(cgroup_root, *c).ok())
        .collect();
    cgroup::reap_stale(&placements);
    reap_stale_run_dirs(&state_dir.join("run"));
    reap_stale_run_dirs(Path::new(ROOTS_DIR));
    crate::vm::reap_stale(state_dir);
    if let Some(dir) = workspace
        && let Some(layers) = crate::overlay::detect(dir, "")?
    {
        crate::overlay::reap_stale_work_dirs(&layers.upper_parent);
    }
    Ok(())
}

/// Removes per-run directories of helpers that died without cleaning up.
fn reap_stale_run_dirs(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if cgroup::owner_is_gone(&entry.file_name().to_string_lossy()) {
            // An image root's private layer (`crate::image::PrivateLayer`).
            let _ = std::fs::remove_dir_all(entry.path().join("image"));
            drop(RunDir(entry.path()));
        }
    }
}

/// Reads init's answer: `tag` when all is well, else the failed step.
fn expect_reply(sock: &OwnedFd, tag: u8, spec: &Spec) -> Result<()> {
    let mut buf = [0u8; 512];
    let n = loop {
        match nix::sys::socket::recv(sock.as_raw_fd(), &mut buf, MsgFlags::empty()) {
            Err(nix::errno::Errno::EINTR) => continue,
            other => break other.map_err(|e| Error::Sync(e.into()))?,
        }
    };
    let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
    if n == 1 && buf[0] == tag {
        return Ok(());
    }
    let (head, what) = msg.split_once(' ').unwrap_or((&msg, ""));
    let errno = head
        .get(1..)
        .and_then(|e| e.parse().ok())
        .unwrap_or(libc::EIO);
    let source = std::io::Error::from_raw_os_error(errno);
    match head.chars().next() {
        Some('E') => Err(Error::Setup {
            step: what.to_string(),
            source,
        }),
        Some('X') => Err(Error::Exec {
            command: spec.command[0].clone(),
            source,
        }),
        _ => Err(Error::Setup {
            step: "sandbox init".into(),
            source: std::io::Error::other("init ended before starting the command"),
        }),
    }
}

/// Forwards the signals the helper receives to the sandbox init until `stop`.
fn forward_signals(init: Pid, stop: &AtomicBool) {
    let set = init::forwarded_signals();
    while !stop.load(Ordering::SeqCst) {
        if let Ok(Some(sig)) = sys::sigtimedwait(&set, Duration::from_millis(SIGNAL_POLL_MS))
            && !stop.load(Ordering::SeqCst)
        {
            let _ = kill(init, sig);
        }
    }
}
