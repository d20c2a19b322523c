//! Pause and resume of a long-lived sandbox, its idle pause, and the suspend refusals.
//!
//! The keeper holds one [`PauseState`]: whether the sandbox is paused, since when and by
//! whom (a `pause` request, or its own idle timer), and when it last saw activity (an
//! exec, a connection or traffic through a published port). The backend does the
//! freezing ([`super::Backend::pause`]: a namespace sandbox's cgroup freezer, a VM's
//! qemu `stop`).
//!
//! The contract (`docs/sandbox.md`, "Pause, resume, suspend"):
//! - A sandbox paused by request stays paused until `resume`: an exec is refused at once
//!   (`busy`, exit 5, naming `mountctl sandbox resume`), connections to its published
//!   ports are accepted and answered after the resume.
//! - A sandbox paused by its idle timer is resumed by the next exec or connection (or
//!   traffic on an open one) before that goes in.
//! - `pause` of a paused sandbox and `resume` of a running one are refused
//!   (`invalid_input`, exit 9) saying which it is and since when.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::Shared;
use crate::error::{Error, Result};

/// Most time between two looks of the idle timer, in milliseconds.
const IDLE_POLL_MAX_MS: u64 = 500;
/// How long `criu check` may take before the suspend refusal stops waiting for it.
const CRIU_CHECK_TIMEOUT_S: u32 = 10;

/// Who paused the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PausedBy {
    /// `sandbox pause`: resumed only by `sandbox resume`.
    Request,
    /// The idle timer: resumed by the next exec or connection.
    Idle,
}

impl PausedBy {
    fn as_str(self) -> &'static str {
        match self {
            PausedBy::Request => "request",
            PausedBy::Idle => "idle",
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Paused {
    /// Seconds since the epoch.
    at_unix_s: u64,
    at: Instant,
    by: PausedBy,
}

/// Whether the sandbox is paused, and its idle timer.
#[derive(Debug)]
pub(crate) struct PauseState {
    paused: Mutex<Option<Paused>>,
    last_activity: Mutex<Instant>,
    idle_timeout: Option<Duration>,
}

fn now_unix_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl PauseState {
    /// Running, with the idle timeout `idle_timeout` (none: never paused by itself).
    pub(crate) fn new(idle_timeout: Option<Duration>) -> PauseState {
        PauseState {
            paused: Mutex::new(None),
            last_activity: Mutex::new(Instant::now()),
            idle_timeout,
        }
    }

    /// The pause lock: held while deciding and doing a pause, a resume or an exec's
    /// start, so the idle timer never pauses a sandbox whose exec is being sent.
    fn guard(&self) -> MutexGuard<'_, Option<Paused>> {
        self.paused.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes activity now (the idle timer starts again).
    pub(crate) fn touch(&self) {
        *self.last_activity.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    /// The status fields: `state`, `paused_at`, `paused_by`, `idle_timeout_ms`.
    pub(crate) fn status_into(&self, v: &mut Value) {
        let p = *self.guard();
        v["state"] = json!(if p.is_some() { "paused" } else { "running" });
        v["paused_at"] = json!(p.map(|p| p.at_unix_s));
        v["paused_by"] = json!(p.map(|p| p.by.as_str()));
        v["idle_timeout_ms"] = json!(self.idle_timeout.map(|d| d.as_millis() as u64));
    }
}

fn describe(p: &Paused) -> String {
    let how = match p.by {
        PausedBy::Request => "by `sandbox pause`",
        PausedBy::Idle => "by its idle timeout",
    };
    format!(
        "since {} (unix time, {} s ago, {how})",
        p.at_unix_s,
        p.at.elapsed().as_secs()
    )
}

/// Pauses the sandbox; refused when it is paused already.
pub(crate) fn pause(shared: &Shared, by: PausedBy) -> Result<Value> {
    let mut g = shared.pause.guard();
    pause_locked(shared, &mut g, by)
}

fn pause_locked(shared: &Shared, g: &mut Option<Paused>, by: PausedBy) -> Result<Value> {
    if let Some(p) = g.as_ref() {
        return Err(Error::InvalidInput(format!(
            "sandbox {:?} is paused already, {}: resume it with `mountctl sandbox resume WS`",
            shared.name,
            describe(p)
        )));
    }
    let t = Instant::now();
    shared.backend.pause(&shared.cgroups)?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let p = Paused {
        at_unix_s: now_unix_s(),
        at: Instant::now(),
        by,
    };
    *g = Some(p);
    Ok(
        json!({"paused": true, "paused_at": p.at_unix_s, "paused_by": by.as_str(), "elapsed_ms": ms}),
    )
}

/// Resumes the sandbox; refused when it runs.
pub(crate) fn resume(shared: &Shared) -> Result<Value> {
    let mut g = shared.pause.guard();
    let Some(p) = *g else {
        return Err(Error::InvalidInput(format!(
            "sandbox {:?} is not paused: it is running",
            shared.name
        )));
    };
    resume_locked(shared, &mut g, p)
}

fn resume_locked(shared: &Shared, g: &mut Option<Paused>, p: Paused) -> Result<Value> {
    let t = Instant::now();
    shared.backend.resume(&shared.cgroups)?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    *g = None;
    shared.pause.touch();
    Ok(json!({
        "resumed": true,
        "paused_ms": p.at.elapsed().as_secs_f64() * 1e3,
        "paused_by": p.by.as_str(),
        "elapsed_ms": ms,
    }))
}

/// Activity: the idle timer starts again, and a sandbox paused for idleness is resumed.
pub(crate) fn wake(shared: &Shared) {
    shared.pause.touch();
    let mut g = shared.pause.guard();
    if let Some(p) = *g
        && p.by == PausedBy::Idle
        && let Err(e) = resume_locked(shared, &mut g, p)
    {
        eprintln!("sandbox-helper: {}: resuming after idle: {e}", shared.name);
    }
}

/// Runs `start` (an exec's dispatch) unless the sandbox was paused by request: then the
/// refusal's message. A sandbox paused for idleness is resumed first. The pause lock is
/// held throughout, so the idle timer cannot pause in between.
pub(crate) fn unless_paused<T>(
    shared: &Shared,
    start: impl FnOnce() -> T,
) -> std::result::Result<T, String> {
    shared.pause.touch();
    let mut g = shared.pause.guard();
    if let Some(p) = *g {
        if p.by == PausedBy::Request {
            return Err(format!(
                "sandbox {:?} is paused, {}: resume it first with `mountctl sandbox resume WS`",
                shared.name,
                describe(&p)
            ));
        }
        resume_locked(shared, &mut g, p).map_err(|e| e.to_string())?;
    }
    Ok(start())
}

/// Before the sandbox is killed: thawed, since a frozen process does not die.
pub(crate) fn thaw_for_stop(shared: &Shared) {
    let mut g = shared.pause.guard();
    if g.take().is_some()
        && let Err(e) = shared.backend.resume(&shared.cgroups)
    {
        eprintln!(
            "sandbox-helper: {}: thawing before the stop: {e}",
            shared.name
        );
    }
}

/// The idle timer: pauses the sandbox once no exec ran and nothing came through its
/// published ports for its idle timeout. Returns at once without one.
pub(crate) fn start_idle_timer(shared: &Arc<Shared>) {
    let Some(timeout) = shared.pause.idle_timeout else {
        return;
    };
    let poll = Duration::from_millis((timeout.as_millis() as u64 / 4).clamp(10, IDLE_POLL_MAX_MS));
    let shared = shared.clone();
    let spawned = std::thread::Builder::new()
        .name("idle-timer".into())
        .spawn(move || {
            loop {
                std::thread::sleep(poll);
                if shared.stopping.load(Ordering::SeqCst) {
                    return;
                }
                let mut g = shared.pause.guard();
                if g.is_some() {
                    continue;
                }
                if shared.backend.running() > 0 {
                    drop(g);
                    shared.pause.touch();
                    continue;
                }
                let idle = shared
                    .pause
                    .last_activity
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .elapsed();
                if idle >= timeout
                    && let Err(e) = pause_locked(&shared, &mut g, PausedBy::Idle)
                {
                    eprintln!("sandbox-helper: {}: idle pause: {e}", shared.name);
                    drop(g);
                    shared.pause.touch();
                }
            }
        });
    if let Err(e) = spawned {
        eprintln!("sandbox-helper: starting the idle timer: {e}");
    }
}

/// Why a namespace sandbox cannot be suspended with its processes here. Checkpointing
/// processes needs CRIU: this is where a working CRIU plugs in (`criu dump --tree INIT
/// --freeze-cgroup FREEZER` of the paused sandbox into the state directory, and a keeper
/// started with `criu restore` behind the same `suspend` / `start --restore`
/// requests). Until `criu check` passes on the host, the request is refused, quoting
/// it.
pub(crate) fn namespace_suspend_refusal() -> Error {
    let alternative = "a VM sandbox (`sandbox start --vm`) keeps its processes and memory \
                       across `sandbox pause` / `resume`, and `sandbox pause` keeps a \
                       namespace sandbox's in memory; docs/sandbox.md, \"Pause, resume, \
                       suspend\", has the design of suspend to disk";
    let check = std::process::Command::new("timeout")
        .args([CRIU_CHECK_TIMEOUT_S.to_string().as_str(), "criu", "check"])
        .output();
    let found = match check {
        Ok(o) if o.status.success() => {
            "`criu check` passes on this host, but checkpointing with CRIU is not built \
             yet"
            .to_string()
        }
        // `timeout` answers 127 when it cannot run `criu`.
        Ok(o) if o.status.code() == Some(127) => {
            "CRIU is not installed here, and Debian 12's CRIU 3.17 fails `criu check` on \
             this kernel (\"vdso: Unexpected rt vDSO area bounds\")"
                .to_string()
        }
        Ok(o) => {
            let text = String::from_utf8_lossy(&o.stderr).into_owned()
                + &String::from_utf8_lossy(&o.stdout);
            let last = text
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("");
            format!("`criu check` fails on this kernel: {:?}", last.trim())
        }
        Err(e) => format!("`criu check` could not be run: {e}"),
    };
    Error::Unsupported {
        control: "suspend of a namespace sandbox (checkpoint of its processes)",
        reason: format!("{found}; {alternative}"),
    }
}

/// A VM's suspend to disk: refused with what blocks it (its virtio-fs share).
pub(crate) fn vm_suspend_refusal(qemu_version: &str) -> Error {
    Error::Unsupported {
        control: "suspend of a VM sandbox (qemu migration to a file)",
        reason: format!(
            "{qemu_version}: the workspace is shared by a vhost-user-fs device, which qemu \
             before 8.2 marks unmigratable (migration support for it arrived in qemu 8.2, \
             with virtiofsd's); `sandbox pause` keeps the VM's memory until `resume`. \
             docs/sandbox.md, \"Pause, resume, suspend\", has the two routes (qemu >= 8.2 \
             with virtiofsd migration; the workspace over NFS)"
        ),
    }
}
