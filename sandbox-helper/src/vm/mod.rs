//! VM placement: commands run in a qemu `microvm` guest with the workspace shared in by
//! virtio-fs, talked to over one virtio-serial port by a guest agent of ours.
//!
//! Everything is found and checked before anything starts ([`prepare`]): the accelerator
//! (software emulation runs only when the caller accepted it: it is no isolation
//! boundary), qemu, virtiofsd, the guest kernel and its modules, busybox; then the
//! initramfs (busybox, `/init`, the agent, the modules) is taken from its cache or
//! built. [`boot`] starts `virtiofsd` and qemu in a cgroup of their own whose memory
//! limit covers guest RAM and qemu's overhead, each killed if the helper dies, and waits
//! for the agent's `READY` on the port `cowspace.agent` ([`qemu::AGENT_PORT`]).
//!
//! The agent (`guest/agent.rs`) is the guest's pid 1 after `/init`; the frames it
//! exchanges with the host are [`proto`]'s: execs with stdin, stdout, stderr, signals
//! and exit status, several at once, each flow-controlled on its own. [`run`] runs one
//! command with the helper's own standard streams and shuts the guest down; [`start`]
//! keeps the VM as a long-lived sandbox behind the same keeper socket as a namespace
//! sandbox ([`crate::keeper`], through [`agent::VmBackend`]).
//!
//! The guest has no network interface but `lo` unless ports are published; then
//! `eth0` is on qemu's user network with `restrict=on` (nothing outside is reachable
//! from the guest) and each published port is forwarded from a leased 127.0.0.1 port
//! of the host (`hostfwd`). With `--net egress` the guest reaches the sandbox's egress
//! proxy over the agent's channel, never over a network ([`netmux`]).

pub mod agent;
pub mod initramfs;
/// The minimal roots a VM's processes see: a leaf of the crate (`crate::jail`), so the
/// code that carries them out (`crate::sys`) need not import the VM module.
pub use crate::jail;
mod keep;
pub mod netmux;
pub mod netrelay;
pub mod probe;
mod procs;
pub mod proto;
pub mod qemu;
mod qmp;
mod runner;

use std::path::{Path, PathBuf};

pub use keep::start;
pub use probe::{Accel, AccelProbe, Isolation};
pub use procs::reap_stale;
pub use runner::{Booted, VmOutcome, VmReady, boot, run};

use crate::error::{Error, Result};
use crate::spec::{Controls, Net, parse_bytes, validate_name};

/// Guest RAM when no `--memory` is given.
pub const DEFAULT_MEMORY_MIB: u64 = 256;
/// Least guest RAM accepted (the kernel and busybox need about 64 MiB).
pub const MIN_MEMORY_MIB: u64 = 128;
/// Most virtual CPUs.
pub const MAX_CPUS: u32 = 64;
/// Most `--ro-bind` of a VM (microvm has eight virtio-mmio slots: the workspace, the
/// agent's port, the network and these).
pub const MAX_RO_BINDS: usize = 4;
/// What qemu and virtiofsd use beside guest RAM and the translation cache.
pub const OVERHEAD_MIB: u64 = 256;

/// A validated VM run.
#[derive(Debug, Clone)]
pub struct VmSpec {
    /// The run's name.
    pub name: String,
    /// The workspace directory, shared at `/workspace`.
    pub dir: PathBuf,
    /// The command.
    pub command: Vec<String>,
    /// The command's environment beyond `PATH` and `HOME`.
    pub env: Vec<(String, String)>,
    /// Guest RAM in MiB (`--memory`).
    pub memory_mib: u64,
    /// Virtual CPUs (`--cpus`, rounded up).
    pub cpus: u32,
    /// `--net loopback` or `egress` (without `--publish` the guest has no other
    /// interface).
    pub loopback: bool,
    /// `--net egress`: the policy of the egress proxy the guest reaches over the
    /// agent's channel ([`netmux`]).
    pub egress: Option<cowspace_egress::policy::Policy>,
    /// `--publish`: guest ports forwarded from a unique 127.0.0.1 host port each.
    pub publish: Vec<u16>,
    /// The caller accepts software emulation (`--accept-emulation`).
    pub accept_emulation: bool,
    /// `--secret`: files of the guest's `/run/secrets` (a read-only tmpfs).
    pub secrets: Vec<crate::spec::Secret>,
    /// `--cpuset-cpus`: the host CPUs qemu and virtiofsd run on (the cgroup's cpuset).
    pub cpuset: Option<String>,
    /// `--ro-bind`: host directories shown read-only in the guest.
    pub ro_binds: Vec<crate::spec::RoBind>,
    /// `--pids`: most processes and threads of the sandbox at once, in the guest (a
    /// cgroup of the guest's own, which every exec joins; the agent is not in it).
    pub pids: Option<u64>,
    /// Where initramfs images are cached.
    pub cache_dir: PathBuf,
    /// `--workdir`: where the command and every exec without its own start, in the guest.
    pub workdir: String,
}

impl VmSpec {
    /// Validates the controls for a VM run, refusing those a VM does not enforce yet.
    /// `state_dir` is the helper's (no secret may come from there).
    pub fn validate(
        name: &str,
        dir: &Path,
        controls: &Controls,
        command: Vec<String>,
        accept_emulation: bool,
        cache_dir: &Path,
        state_dir: &Path,
    ) -> Result<VmSpec> {
        validate_name(name)?;
        if command.is_empty() {
            return Err(Error::InvalidInput("no command given after `--`".into()));
        }
        if !dir.is_dir() {
            return Err(Error::InvalidInput(format!(
                "workspace directory {} does not exist",
                dir.display()
            )));
        }
        // The keeper of a VM sees no published-port traffic (qemu forwards the ports
        // itself), so it could not tell an idle VM from a busy server.
        if controls.idle_timeout.is_some() {
            return Err(Error::VmUnavailable {
                what: "--idle-timeout",
                reason: "a VM's published ports are qemu's own forwards, whose traffic the \
                         keeper does not see: pause a VM sandbox with `mountctl sandbox pause \
                         WS`, or use a namespace sandbox (leave out --vm) for the idle pause"
                    .into(),
            });
        }
        if controls.image_workdir {
            return Err(Error::InvalidInput(
                "--image-workdir needs --image, which a VM sandbox does not take yet".into(),
            ));
        }
        if controls.io_max.is_some() || controls.io_weight.is_some() {
            return Err(Error::VmUnavailable {
                what: "--io-max / --io-weight",
                reason: "a VM's disk I/O is qemu's and virtiofsd's, whose cgroup is not yet \
                         given an I/O limit: use a namespace sandbox (leave out --vm)"
                    .into(),
            });
        }
        let egress = crate::spec::egress_policy(controls.net.unwrap_or(Net::None), controls)?;
        if !controls.inject.is_empty() {
            return Err(Error::VmUnavailable {
                what: "--inject",
                reason: "the guest's trust store cannot yet be given the sandbox's \
                         certificate authority: use a namespace sandbox (leave out --vm)"
                    .into(),
            });
        }
        if controls.net == Some(Net::None) && !controls.publish.is_empty() {
            return Err(Error::InvalidInput(
                "--publish needs a network inside: use --net loopback (or leave --net out)".into(),
            ));
        }
        let mut publish = controls.publish.clone();
        publish.sort_unstable();
        publish.dedup();
        if publish.contains(&0) {
            return Err(Error::InvalidInput("--publish 0: not a port".into()));
        }
        let ro_binds = crate::spec::read_ro_binds(&controls.ro_bind, state_dir)?;
        if ro_binds.len() > MAX_RO_BINDS {
            return Err(Error::InvalidInput(format!(
                "more than {MAX_RO_BINDS} --ro-bind for a VM (each is a virtio-fs device)"
            )));
        }
        if let Some(b) = ro_binds.iter().find(|b| !b.source.is_dir()) {
            return Err(Error::InvalidInput(format!(
                "--ro-bind {}: a VM binds directories only (virtio-fs shares a directory)",
                b.source.display()
            )));
        }
        if let Some(p) = controls.pids
            && p < crate::spec::MIN_PIDS
        {
            return Err(Error::InvalidInput(format!(
                "--pids {p}: at least {} (the command counts)",
                crate::spec::MIN_PIDS
            )));
        }
        let memory_mib = match &controls.memory {
            Some(m) => parse_bytes(m)? >> 20,
            None => DEFAULT_MEMORY_MIB,
        };
        if memory_mib < MIN_MEMORY_MIB {
            return Err(Error::InvalidInput(format!(
                "--memory {}: a VM needs at least {MIN_MEMORY_MIB} MiB of guest RAM",
                controls.memory.as_deref().unwrap_or("")
            )));
        }
        let cpus = match controls.cpus {
            Some(c) if c > 0.0 && c <= f64::from(MAX_CPUS) => c.ceil() as u32,
            Some(c) => {
                return Err(Error::InvalidInput(format!(
                    "--cpus {c}: a VM takes between 1 and {MAX_CPUS} CPUs"
                )));
            }
            None => 1,
        };
        let mut env = Vec::new();
        for e in &controls.env {
            let (k, v) = e
                .split_once('=')
                .ok_or_else(|| Error::InvalidInput(format!("--env {e:?}: expected KEY=VALUE")))?;
            let ok = !k.is_empty()
                && !k.as_bytes()[0].is_ascii_digit()
                && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !ok {
                return Err(Error::InvalidInput(format!(
                    "--env {e:?}: a name is letters, digits and _ (not starting with a digit)"
                )));
            }
            env.push((k.to_string(), v.to_string()));
        }
        Ok(VmSpec {
            name: name.to_string(),
            dir: dir.to_path_buf(),
            command,
            env,
            memory_mib,
            cpus,
            loopback: matches!(controls.net, Some(Net::Loopback | Net::Egress)),
            egress,
            publish,
            accept_emulation,
            cache_dir: cache_dir.to_path_buf(),
            secrets: crate::spec::read_secrets(&controls.secret, state_dir)?,
            cpuset: crate::spec::parse_cpuset(controls.cpuset_cpus.as_deref())?,
            ro_binds,
            pids: controls.pids,
            workdir: crate::spec::parse_workdir(controls.workdir.as_deref())?
                .to_string_lossy()
                .into_owned(),
        })
    }

    /// The cgroup memory limit: guest RAM, the translation cache and qemu's own.
    pub fn host_memory_bytes(&self) -> u64 {
        (self.memory_mib + qemu::TCG_TB_MIB + OVERHEAD_MIB) << 20
    }
}

/// Has this process get `SIGTERM` when its parent dies (a `run` killed with `SIGKILL`
/// ends its VM), and refuses when the parent is gone already.
pub fn set_parent_death_signal() -> Result<()> {
    let parent = nix::unistd::getppid();
    crate::sys::set_parent_death_signal(nix::sys::signal::Signal::SIGTERM).map_err(|source| {
        Error::Setup {
            step: "vm: prctl(PR_SET_PDEATHSIG)".into(),
            source,
        }
    })?;
    if nix::unistd::getppid() != parent {
        return Err(Error::Setup {
            step: "vm: start".into(),
            source: std::io::Error::other("the caller ended before the VM started"),
        });
    }
    Ok(())
}

/// What a VM run uses, found before anything starts.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The accelerator and isolation.
    pub accel: AccelProbe,
    /// qemu.
    pub qemu: PathBuf,
    /// virtiofsd.
    pub virtiofsd: PathBuf,
    /// The guest kernel.
    pub kernel: probe::Kernel,
    /// The initramfs and its hash.
    pub initrd: (PathBuf, String),
}

/// Checks the host for `spec` and refuses, before any effect, what cannot run: software
/// emulation without acceptance, a missing qemu, virtiofsd, guest kernel or busybox.
pub fn prepare(spec: &VmSpec) -> Result<Prepared> {
    let accel = probe::accel();
    if accel.isolation == Isolation::NeedsValidation && !spec.accept_emulation {
        return Err(Error::VmUnavailable {
            what: "isolation",
            reason: format!(
                "{}; pass --accept-emulation (or set `[vm] accept_emulation = true` in the configuration) to run it anyway, reported as isolation: needs_validation, or run on a host with hardware KVM",
                accel.reason
            ),
        });
    }
    let qemu = probe::qemu()?;
    let virtiofsd = probe::virtiofsd()?;
    let kernel = probe::kernel()?;
    if spec.pids.is_some() {
        probe::pids_controller(&kernel).map_err(|reason| Error::VmUnavailable {
            what: "--pids",
            reason,
        })?;
    }
    let busybox = probe::busybox()?;
    let initrd = initramfs::cached(
        &initramfs::Inputs {
            busybox,
            modules: kernel.modules.clone(),
        },
        &spec.cache_dir,
    )?;
    Ok(Prepared {
        accel,
        qemu,
        virtiofsd,
        kernel,
        initrd,
    })
}

/// The `vm` row of `doctor`: what a VM placement would use here, and what is missing.
pub fn report(cache_dir: &Path) -> serde_json::Value {
    let accel = probe::accel();
    let qemu = probe::qemu();
    let virtiofsd = probe::virtiofsd();
    let kernel = probe::kernel();
    let busybox = probe::busybox();
    let mut missing = Vec::new();
    let mut note = |r: &std::result::Result<PathBuf, Error>| match r {
        Ok(p) => Some(p.clone()),
        Err(e) => {
            missing.push(e.to_string());
            None
        }
    };
    let qemu = note(&qemu);
    let virtiofsd = note(&virtiofsd);
    let busybox = note(&busybox);
    let initrd = match (&kernel, &busybox) {
        (Ok(k), Some(b)) => initramfs::cached(
            &initramfs::Inputs {
                busybox: b.clone(),
                modules: k.modules.clone(),
            },
            cache_dir,
        )
        .map_err(|e| missing.push(e.to_string()))
        .ok(),
        _ => None,
    };
    let kernel = kernel.map_err(|e| missing.push(e.to_string())).ok();
    serde_json::json!({
        "accel": accel.accel,
        "isolation": accel.isolation.as_str(),
        "reason": accel.reason,
        "channel": "virtio-serial (this host has no vhost-vsock)",
        "qemu": qemu.as_ref().map(|p| serde_json::json!({"path": p, "version": probe::version_of(p)})),
        "virtiofsd": virtiofsd.as_ref().map(|p| serde_json::json!({"path": p, "version": probe::version_of(p)})),
        "kernel": kernel.as_ref().map(|k| serde_json::json!({"path": k.image, "version": k.version, "blake3": probe::file_hash(&k.image)})),
        "initramfs": initrd.as_ref().map(|(p, h)| serde_json::json!({"path": p, "blake3": h})),
        "missing": missing,
        "available": missing.is_empty(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn controls() -> Controls {
        Controls::default()
    }

    #[test]
    fn refuses_what_a_vm_does_not_enforce() {
        let d = tempfile::tempdir().unwrap();
        let validate = |c: &Controls| {
            VmSpec::validate(
                "w",
                d.path(),
                c,
                vec!["true".into()],
                true,
                d.path(),
                d.path(),
            )
        };
        let mut c = controls();
        c.pids = Some(1);
        let e = validate(&c).unwrap_err();
        assert_eq!(e.kind(), crate::Kind::InvalidInput);
        c.pids = Some(16);
        let ok = validate(&c).unwrap();
        assert_eq!(ok.pids, Some(16));
        let mut c = controls();
        c.memory = Some("64m".into());
        let e = validate(&c).unwrap_err();
        assert_eq!(e.kind(), crate::Kind::InvalidInput);
    }
}
