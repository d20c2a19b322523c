//! The helper's `vm-run` and `vm-start` commands (the binary's; the VM itself is the
//! library's `vm` module).

use std::path::PathBuf;

use sandbox_helper::Error;

use crate::{RunArgs, announce, controls_of, detach_stdio, open_ready_fd, state_dir_or_default};

#[derive(clap::Args)]
pub(crate) struct VmRunArgs {
    #[command(flatten)]
    pub(crate) run: RunArgs,
    /// Run under software emulation (TCG), which is no isolation boundary; the result
    /// says `isolation: needs_validation`.
    #[arg(long)]
    pub(crate) accept_emulation: bool,
    /// Where initramfs images are cached (default $COWSPACE_ROOT/cache/vm).
    #[arg(long)]
    pub(crate) cache_dir: Option<PathBuf>,
}

pub(crate) fn cache_dir_or_default(d: Option<PathBuf>) -> PathBuf {
    d.unwrap_or_else(|| {
        sandbox_helper::default_state_dir()
            .parent()
            .and_then(std::path::Path::parent)
            .unwrap_or(std::path::Path::new("/var/lib/cowspace"))
            .join("cache")
            .join("vm")
    })
}

/// The validated VM spec of `vm-run`'s or `vm-start`'s flags.
fn vm_spec(args: VmRunArgs) -> Result<sandbox_helper::vm::VmSpec, Error> {
    let cache_dir = cache_dir_or_default(args.cache_dir);
    let mut r = args.run;
    let state_dir = state_dir_or_default(r.state_dir.clone());
    let controls = controls_of(&mut r)?;
    if r.image_meta.is_some() || controls.image.is_some() {
        return Err(Error::Unsupported {
            control: "image root",
            reason: "a VM guest boots from the helper's own initramfs (busybox and the agent) \
                     and sees only the workspace and the --ro-bind directories through \
                     virtio-fs; sharing an image's tree into the guest as its root is not built \
                     yet. Drop --vm to run on the image in a namespace sandbox, or drop --image \
                     to run the VM on its own root"
                .into(),
        });
    }
    sandbox_helper::vm::VmSpec::validate(
        &r.name,
        &r.dir,
        &controls,
        r.command,
        args.accept_emulation,
        &cache_dir,
        &state_dir,
    )
}

/// Starts a long-lived VM sandbox; prints (or writes to --ready-fd) its status once the
/// guest is up, then detaches from the caller's stdio and keeps it until it stops.
pub(crate) fn vm_start_cmd(
    args: VmRunArgs,
    ready_out: &mut Option<std::fs::File>,
) -> Result<u8, Error> {
    use sandbox_helper::vm;
    if !args.run.command.is_empty() {
        return Err(Error::InvalidInput(
            "vm-start takes no command (run commands with `exec`)".into(),
        ));
    }
    let state_dir = state_dir_or_default(args.run.state_dir.clone());
    let cgroup_root = args.run.cgroup_root.clone();
    let name = args.run.name.clone();
    let mut args = args;
    // Validated with a placeholder command: a sandbox's commands come with each exec.
    args.run.command = vec!["true".into()];
    let spec = vm_spec(args)?;
    let prep = vm::prepare(&spec)?;
    let log = sandbox_helper::keeper::paths(&state_dir, &name)
        .1
        .with_extension("log");
    let outcome = vm::start(&spec, &prep, &state_dir, &cgroup_root, |status| {
        if let Some(p) = status["ports"].as_object() {
            for (internal, host) in p {
                eprintln!("published {internal} -> 127.0.0.1:{host}");
            }
        }
        eprintln!(
            "sandbox-helper: {}: vm up in {} ms (accel {}); isolation: {}: {}",
            spec.name,
            status["boot_ms"],
            prep.accel.accel.as_str(),
            prep.accel.isolation.as_str(),
            prep.accel.reason
        );
        announce(ready_out, &status);
        detach_stdio(&log);
    })?;
    if outcome.oom_kills > 0 {
        eprintln!(
            "sandbox-helper: {}: the kernel OOM-killed {} host process(es) of the VM at the memory limit",
            spec.name, outcome.oom_kills
        );
    }
    Ok(0)
}

/// Runs CMD in a VM; the ready line (accelerator, isolation and why, boot time, pids)
/// goes to --ready-fd or, with --json, stdout; a `needs_validation` note to stderr.
pub(crate) fn vm_run_cmd(args: VmRunArgs) -> Result<u8, Error> {
    use sandbox_helper::vm;
    // Killed with the caller: SIGTERM ends the VM, so no VM outlives its `run`.
    sandbox_helper::vm::set_parent_death_signal()?;
    let state_dir = state_dir_or_default(args.run.state_dir.clone());
    let cgroup_root = args.run.cgroup_root.clone();
    let mut ready_out = open_ready_fd(args.run.ready_fd)?;
    let json = args.run.json;
    let spec = vm_spec(args)?;
    let prep = vm::prepare(&spec)?;
    let outcome = vm::run(&spec, &prep, &state_dir, &cgroup_root, |ready| {
        eprintln!(
            "sandbox-helper: {}: vm up in {} ms (accel {}, qemu pid {}); isolation: {}: {}",
            spec.name,
            ready.boot_ms,
            prep.accel.accel.as_str(),
            ready.qemu_pid,
            prep.accel.isolation.as_str(),
            prep.accel.reason
        );
        if json || ready_out.is_some() {
            let line = serde_json::json!({
                "name": spec.name,
                "placement": "vm",
                "accel": prep.accel.accel,
                "isolation": prep.accel.isolation.as_str(),
                "reason": prep.accel.reason,
                "kernel": prep.kernel.image,
                "kernel_version": prep.kernel.version,
                "initramfs": prep.initrd.0,
                "initramfs_blake3": prep.initrd.1,
                "boot_ms": ready.boot_ms,
                "qemu_pid": ready.qemu_pid,
                "virtiofsd_pid": ready.virtiofsd_pid,
                "memory_mib": spec.memory_mib,
                "cpus": spec.cpus,
            });
            announce(&mut ready_out, &line);
        }
    })?;
    Ok(outcome.code)
}
