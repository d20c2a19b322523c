//! A long-lived VM sandbox: the helper boots the VM ([`super::boot`]) and stays as its
//! keeper, serving execs (through the guest agent, [`super::agent::VmBackend`]), status
//! and stop on the keeper socket a namespace sandbox's keeper serves
//! ([`crate::keeper`]), until the VM ends; then it frees everything.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::agent::VmBackend;
use super::qemu::GuestNet;
use super::runner::{VmOutcome, base_env, block_stop_signals, boot, guest_net, running};
use super::{Prepared, VmSpec};
use crate::cgroup;
use crate::error::{Error, Result};

/// Pause between looks whether a long-lived VM's virtiofsd still runs.
const WATCH_MS: u64 = 100;

/// Starts a long-lived VM sandbox for `spec` and keeps it until it is stopped: the
/// keeper's socket ([`crate::keeper`]) serves execs (through the guest agent), status
/// and stop; `on_ready` gets the status once the guest is up (the caller announces it
/// and detaches). `stop` (or SIGTERM, SIGINT, SIGHUP) ends qemu; this returns once
/// qemu, virtiofsd, the cgroup, the run directory and the port leases are gone.
pub fn start(
    spec: &VmSpec,
    prep: &Prepared,
    state_dir: &Path,
    cgroup_root: &Path,
    on_ready: impl FnOnce(&serde_json::Value),
) -> Result<VmOutcome> {
    // Blocked before any thread starts: the keeper's signal thread takes them.
    let _ = block_stop_signals()?;
    let listener = crate::keeper::listen_on(state_dir, &spec.name)?;
    let leases = crate::alloc::lease_ports(state_dir, &spec.name, &spec.publish)?;
    let mut booted = boot(spec, prep, state_dir, cgroup_root, leases, |_| {})?;
    let ports: serde_json::Map<String, serde_json::Value> = booted
        .ports
        .iter()
        .map(|l| (l.internal.to_string(), l.host.into()))
        .collect();
    let started_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let cgroups = booted.cgroups();
    let host = cgroup::read_back(&cgroups);
    let mut limits = serde_json::json!({
        "memory_bytes": spec.memory_mib << 20,
        "cpus": spec.cpus,
        "host_memory_bytes": host["memory_bytes"],
    });
    if let Some(p) = spec.pids {
        limits["pids"] = serde_json::json!(p);
    }
    if spec.cpuset.is_some() {
        limits["cpuset_cpus"] = host["cpuset_cpus"].clone();
    }
    if limits["host_memory_bytes"].is_null() {
        limits["host_memory_bytes"] = serde_json::json!(spec.host_memory_bytes());
    }
    let net = match guest_net(spec, &booted.ports) {
        _ if spec.egress.is_some() => "egress",
        GuestNet::None => "none",
        GuestNet::Loopback => "loopback",
        GuestNet::Published(_) => "published",
    };
    let status = serde_json::json!({
        "name": spec.name,
        "provider": "vm",
        "isolation": prep.accel.isolation.as_str(),
        "reason": prep.accel.reason,
        "accel": prep.accel.accel,
        "keeper_pid": std::process::id(),
        "init_pid": booted.qemu_pid(),
        "qemu_pid": booted.qemu_pid(),
        "virtiofsd_pid": booted.virtiofsd_pid(),
        "ports": ports,
        "net": net,
        "limits": limits,
        "cgroups": cgroups,
        "started_at": started_at,
        "boot_ms": booted.boot_ms,
        "guest_kernel": booted.guest_release,
        "kernel": prep.kernel.image,
        "initramfs_blake3": prep.initrd.1,
        "workspace": spec.dir,
        "workdir": spec.workdir,
    });
    let backend = Arc::new(VmBackend {
        channel: booted.channel.clone(),
        env: base_env(spec),
        workdir: spec.workdir.clone(),
        stopping: AtomicBool::new(false),
        qmp: booted.qmp_sock(),
        qemu: prep.qemu.clone(),
        egress: booted.egress.as_ref().map(|(p, _)| p.clone()),
    });
    let stopped = crate::keeper::serve(
        &listener,
        backend.clone(),
        Pid::from_raw(booted.qemu_pid()),
        status.clone(),
        cgroups,
        None,
    );
    // A virtiofsd that dies leaves the guest without its workspace: the VM ends too.
    let ending = Arc::new(AtomicBool::new(false));
    {
        let (ending, fsd, qemu) = (ending.clone(), booted.virtiofsd_pid(), booted.qemu_pid());
        std::thread::Builder::new()
            .name("virtiofsd-watch".into())
            .spawn(move || {
                while !ending.load(Ordering::SeqCst) {
                    if !running(fsd) {
                        if !ending.load(Ordering::SeqCst) {
                            let _ = kill(Pid::from_raw(qemu), Signal::SIGKILL);
                        }
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(WATCH_MS));
                }
            })
            .map_err(|source| Error::Setup {
                step: "vm: watch virtiofsd".into(),
                source,
            })?;
    }
    on_ready(&status);
    booted.wait_qemu();
    ending.store(true, Ordering::SeqCst);
    backend.stopping.store(true, Ordering::SeqCst);
    let oom_kills = booted.free();
    drop(listener);
    let oom_kills = oom_kills?;
    stopped.reply(oom_kills);
    Ok(VmOutcome {
        code: 0,
        boot_ms: 0,
        oom_kills,
    })
}
