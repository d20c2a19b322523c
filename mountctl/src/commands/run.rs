//! `mountctl run WS -- CMD`: runs CMD in the workspace's sandbox.
//!
//! Thin: claims the workspace for one sandbox in the registry (it must be `active` and
//! mounted, with no other sandbox running in it), starts `sandbox-helper` (next to this
//! binary, or `$COWSPACE_SANDBOX_HELPER`) with the workspace's path, records the helper's
//! pid and, from its ready line on a pipe (`--ready-fd`), the published ports; waits
//! and exits with CMD's status. The helper runs in its own process group; SIGINT,
//! SIGTERM, SIGHUP and SIGQUIT (a terminal's Ctrl-C included) are forwarded to it once
//! (it forwards them to CMD); the registry is cleared when the run ends.
//! The helper's refusals (7 unsupported, 9 invalid, 5 no free uid range or port) and
//! its messages pass through unchanged: its stderr is ours.

use std::io::{BufRead, BufReader, Read};
use std::os::fd::AsRawFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Command, ExitCode};

use anyhow::Context;
use cowspace_fsd::runtime::Runtime;
use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::cli::RunArgs;
use crate::output::Ctx;

/// Environment variable naming the `sandbox-helper` binary.
pub const HELPER_ENV: &str = "COWSPACE_SANDBOX_HELPER";
/// Longest ready line read from the helper.
const MAX_READY_LINE_BYTES: u64 = 64 * 1024;

fn helper_path() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os(HELPER_ENV) {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().context("find the mountctl binary")?;
    let helper = exe.with_file_name("sandbox-helper");
    anyhow::ensure!(
        helper.is_file(),
        "no sandbox-helper next to {} (install it there, or set {HELPER_ENV})",
        exe.display()
    );
    Ok(helper)
}

/// Forgets the workspace's sandbox (and its ports) when the run ends, however it ends.
struct Claim<'a> {
    rt: &'a Runtime,
    id: String,
    pid: i32,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.rt.release_sandbox(&self.id, self.pid) {
            eprintln!("mountctl: clearing the sandbox record of {}: {e}", self.id);
        }
    }
}

pub fn run(ctx: &Ctx, a: RunArgs) -> anyhow::Result<ExitCode> {
    let rt = ctx.runtime()?;
    let helper = helper_path()?;
    // Signals are caught from here on (so this process outlives Ctrl-C and clears the
    // registry); the helper gets default dispositions back at exec.
    let mut signals =
        Signals::new([SIGINT, SIGTERM, SIGHUP, SIGQUIT]).context("install signal handlers")?;
    let me = std::process::id() as i32;
    let rec = rt.claim_sandbox(&a.workspace, me)?;
    let mut claim = Claim {
        rt: &rt,
        id: rec.id.clone(),
        pid: me,
    };

    let (ready_read, ready_write) = std::io::pipe().context("create the ready pipe")?;
    // The helper inherits the write end (exec keeps it without FD_CLOEXEC); it writes
    // its ready line there, never onto CMD's stdout.
    nix::fcntl::fcntl(
        &ready_write,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
    )
    .context("pass the ready pipe on")?;
    let mut cmd = Command::new(&helper);
    // Every value as `--flag=VALUE`: a value starting with `-` is never read as an
    // option by the privileged helper.
    let mut dir = std::ffi::OsString::from("--dir=");
    dir.push(&rec.path);
    let mut state = std::ffi::OsString::from("--state-dir=");
    state.push(ctx.root.join("run").join("sandbox"));
    cmd.arg("run")
        .arg(dir)
        .arg(format!("--name={}", sandbox_name(&rec)))
        .arg(state)
        .arg(format!("--ready-fd={}", ready_write.as_raw_fd()));
    // The helper replaces the host's overlay, for the run, by one overlay of the same
    // layers idmapped to the sandbox, which the host path and the sandbox share (one
    // upper layer is never under two live overlays); this process mounts the host's own
    // again after the run.
    let host_overlay = rec.materializer == "overlay";
    if host_overlay {
        cmd.arg("--share-host-mount");
    }
    if let Some(net) = &a.net {
        cmd.arg(format!("--net={net}"));
    }
    if let Some(m) = &a.memory {
        cmd.arg(format!("--memory={m}"));
    }
    if let Some(p) = a.pids {
        cmd.arg(format!("--pids={p}"));
    }
    if let Some(c) = a.cpus {
        cmd.arg(format!("--cpus={c}"));
    }
    for p in &a.publish {
        cmd.arg(format!("--publish={p}"));
    }
    // git's fsmonitor hook (docs/git.md), which the helper turns off since the sandbox
    // hides the private state: for an overlay or fuse workspace, the upper layer is shown
    // read-only, with the tokens the hook may vouch for (before the caller's --env, which
    // may override them).
    if matches!(rec.materializer.as_str(), "overlay" | "fuse")
        && let Some((env, binds)) =
            cowspace_fsd::gitfsmonitor::sandbox_setup(&rt, &rec, "/.cowspace/upper", "/workspace")
    {
        for e in env {
            cmd.arg(format!("--env={e}"));
        }
        for b in binds {
            cmd.arg(format!("--ro-bind={b}"));
        }
    }
    for e in &a.env {
        cmd.arg(format!("--env={e}"));
    }
    for b in &a.ro_bind {
        cmd.arg(format!("--ro-bind={b}"));
    }
    if ctx.json {
        cmd.arg("--json");
    }
    cmd.arg("--").args(&a.command);
    // Its own process group: a Ctrl-C at the terminal reaches only this process, which
    // forwards it once (CMD runs in a session of its own inside and never reads the
    // terminal as its controlling one).
    cmd.process_group(0);
    let mut child = cmd
        .spawn()
        .with_context(|| format!("start {}", helper.display()))?;
    drop(ready_write);
    let helper_pid = child.id() as i32;
    rt.move_sandbox(&rec.id, me, helper_pid)?;
    claim.pid = helper_pid;

    let handle = signals.handle();
    let forwarder = std::thread::spawn(move || {
        for sig in signals.forever() {
            if let Ok(sig) = nix::sys::signal::Signal::try_from(sig) {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(helper_pid), sig);
            }
        }
    });

    // One line once the sandbox is set up, or EOF when the helper refused.
    let mut line = String::new();
    let _ = BufReader::new(ready_read)
        .take(MAX_READY_LINE_BYTES)
        .read_line(&mut line);
    let ready: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
    if let Some(ports) = ready.get("ports")
        && ports.as_object().is_some_and(|p| !p.is_empty())
    {
        rt.set_ports(&rec.id, ports.clone())?;
    }
    if ready["host_mount"] == "busy" {
        eprintln!(
            "mountctl: warning: {} is in use on the host and stays mounted during the run; \
             its host view may be stale until the run ends (diff and commit read the \
             workspace's own layer and are exact)",
            rec.path.display()
        );
    }

    let status = loop {
        match child.wait() {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            other => break other.context("wait for sandbox-helper")?,
        }
    };
    handle.close();
    // Not joined: waking the forwarder from its signal wait took ~9 ms, and it has
    // nothing left to do once the helper is gone (the process exits soon after).
    drop(forwarder);
    // Also after a helper that failed without a ready line: it may have unmounted it.
    if host_overlay {
        rt.resume_host_mount(&rec.id)?;
    }
    drop(claim);
    let code = match (status.code(), status.signal()) {
        (Some(c), _) => c as u8,
        (None, Some(sig)) => 128u8.saturating_add(sig as u8),
        (None, None) => 1,
    };
    Ok(ExitCode::from(code))
}

/// The sandbox's name (its hostname): the workspace's name, else its id.
fn sandbox_name(rec: &cowspace_fsd::registry::Record) -> String {
    rec.name.clone().unwrap_or_else(|| rec.id.clone())
}
