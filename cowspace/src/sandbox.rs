//! Long-lived sandboxes of workspaces: start, exec, status, list, stop.
//!
//! The privileged work (namespaces, cgroups, the shared overlay mount, the exec'd
//! processes) is `sandbox-helper`'s: `sandbox_start` runs `sandbox-helper start`, which
//! stays as the sandbox's keeper, and records it in the workspace's registry record
//! before returning. `exec`, `status` and `stop` talk to the keeper's socket
//! ([`sandbox_api::keeper`]). A keeper that died (even by `SIGKILL`) took its sandbox
//! with it; [`Runtime::sweep`] then mounts the host's view of the workspace again and
//! clears the record.

use std::io::{BufRead, BufReader, Read};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use crate::error::{Error, ErrorKind, Result};
use crate::registry::Record;
use crate::runtime::{Runtime, live_sandbox};

pub use crate::sandbox_net::PolicyUpdate;

/// Environment variable naming the `sandbox-helper` binary.
pub const HELPER_ENV: &str = "COWSPACE_SANDBOX_HELPER";
/// Longest ready line read from the helper.
const MAX_READY_LINE_BYTES: u64 = 64 * 1024;
/// Longest refusal read from the helper's stderr.
const MAX_HELPER_STDERR_BYTES: u64 = 64 * 1024;

/// What a sandbox is started with (the `sandbox start` flags; the control socket's
/// `sandbox_start` args): the helper's own [`sandbox_api::spec::Controls`].
pub type SandboxOptions = sandbox_api::spec::Controls;

/// `o` with what it leaves unset taken from the configuration's `[sandbox]` defaults.
/// Their `net` applies only to a sandbox that publishes no port (one that does gets
/// `loopback` unless it names a network). Their `allow_host`, `deny_host` and `add_host`
/// apply only to a sandbox whose network (its own or the default) is `egress`, each
/// list only when the start gives none of it.
pub fn with_defaults(mut o: SandboxOptions, d: &crate::config::SandboxDefaults) -> SandboxOptions {
    if o.net.is_none() && o.publish.is_empty() {
        o.net = d.net.as_ref().and_then(|s| s.value.parse().ok());
    }
    if o.net == Some(sandbox_api::spec::Net::Egress) {
        for (list, default) in [
            (&mut o.allow_host, &d.allow_host),
            (&mut o.deny_host, &d.deny_host),
            (&mut o.add_host, &d.add_host),
        ] {
            if list.is_empty()
                && let Some(s) = default
            {
                list.clone_from(&s.value);
            }
        }
    }
    if o.memory.is_none() {
        o.memory = d.memory.as_ref().map(|s| s.value.clone());
    }
    if o.pids.is_none() {
        o.pids = d.pids.as_ref().map(|s| s.value);
    }
    if o.cpus.is_none() {
        o.cpus = d.cpus.as_ref().map(|s| s.value);
    }
    if o.cpuset_cpus.is_none() {
        o.cpuset_cpus = d.cpuset_cpus.as_ref().map(|s| s.value.clone());
    }
    if o.image.is_none() {
        o.image = d.image.as_ref().map(|s| s.value.clone());
    }
    o
}

/// The controls the helper gets: `o`, with the runtime's own `env` and `binds` before
/// the user's so that the user's win. The same for a namespace sandbox and a VM (which
/// refuses by name what it does not enforce yet).
pub(crate) fn helper_controls(
    o: &SandboxOptions,
    env: Vec<String>,
    binds: Vec<String>,
) -> SandboxOptions {
    let mut c = o.clone();
    c.env = env.into_iter().chain(o.env.iter().cloned()).collect();
    c.ro_bind = binds.into_iter().chain(o.ro_bind.iter().cloned()).collect();
    c
}

/// The controls on their way to the helper: JSON on a pipe whose read end the helper
/// inherits as `--controls-fd=N` (no control travels as a command-line string for the
/// privileged helper to parse back; it decodes the same type, refusing unknown keys).
pub(crate) struct ControlsPipe {
    read: std::os::fd::OwnedFd,
    write: std::io::PipeWriter,
    json: Vec<u8>,
}

impl ControlsPipe {
    /// Adds `--controls-fd` for `controls` to `cmd`.
    pub(crate) fn attach(cmd: &mut Command, controls: &SandboxOptions) -> Result<ControlsPipe> {
        let json = serde_json::to_vec(controls)
            .map_err(|e| Error::Invalid(format!("sandbox controls not encodable: {e}")))?;
        let (read, write) =
            std::io::pipe().map_err(Error::io("create the controls pipe", "sandbox-helper"))?;
        let read: std::os::fd::OwnedFd = read.into();
        nix::fcntl::fcntl(
            &read,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
        )
        .map_err(|e| Error::io("pass the controls pipe on", "sandbox-helper")(e.into()))?;
        cmd.arg(format!("--controls-fd={}", read.as_raw_fd()));
        Ok(ControlsPipe { read, write, json })
    }

    /// Once the helper is spawned: this process's copy of the read end closes, and the
    /// controls are written (on a thread: they may exceed the pipe's buffer) and the
    /// pipe closed, which the helper reads as their end.
    pub(crate) fn send(self) {
        drop(self.read);
        let (mut w, json) = (self.write, self.json);
        std::thread::spawn(move || {
            use std::io::Write;
            let _ = w.write_all(&json);
        });
    }
}

/// The `sandbox-helper` binary: `$COWSPACE_SANDBOX_HELPER`, else the one next to the
/// running program.
pub fn helper_path() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(HELPER_ENV) {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().map_err(Error::io("find the running program", "."))?;
    let helper = exe.with_file_name("sandbox-helper");
    if !helper.is_file() {
        return Err(Error::Unsupported {
            name: "sandbox".into(),
            why: format!(
                "no sandbox-helper next to {} (build it with `cargo build --bins`, install it \
                 there, or set {HELPER_ENV})",
                exe.display()
            ),
        });
    }
    Ok(helper)
}

/// The sandbox's name (its hostname): the workspace's name, else (no name, or one made
/// by an earlier version under a looser rule) its id.
pub fn sandbox_name(rec: &Record) -> String {
    rec.name
        .clone()
        .filter(|n| sandbox_api::spec::validate_name(n).is_ok())
        .unwrap_or_else(|| rec.id.clone())
}

fn kind_of(k: sandbox_api::Kind) -> ErrorKind {
    match k {
        sandbox_api::Kind::InvalidInput => ErrorKind::InvalidInput,
        sandbox_api::Kind::Unsupported => ErrorKind::Unsupported,
        sandbox_api::Kind::Busy => ErrorKind::Busy,
        sandbox_api::Kind::NotFound => ErrorKind::NotFound,
        sandbox_api::Kind::Exists => ErrorKind::Exists,
        sandbox_api::Kind::Io => ErrorKind::Io,
    }
}

/// A helper library error as this crate's.
pub fn from_helper(e: sandbox_api::Error) -> Error {
    Error::Answered {
        kind: kind_of(e.kind()),
        message: e.to_string(),
        hint: e.hint(),
    }
}

fn kind_of_exit(code: i32) -> ErrorKind {
    match code {
        2 | 9 => ErrorKind::InvalidInput,
        3 => ErrorKind::NotFound,
        4 => ErrorKind::Exists,
        5 => ErrorKind::Busy,
        7 => ErrorKind::Unsupported,
        _ => ErrorKind::Io,
    }
}

fn not_running(rec: &Record) -> Error {
    Error::Answered {
        kind: ErrorKind::NotFound,
        message: format!("no sandbox runs for workspace {}", rec.id),
        hint: Some(format!(
            "start one with `mountctl sandbox start {}`",
            sandbox_name(rec)
        )),
    }
}

impl Runtime {
    /// The helper's state directory of this runtime root.
    pub fn sandbox_state_dir(&self) -> PathBuf {
        self.store().layout().sandbox_state()
    }

    /// Starts a long-lived sandbox for workspace `ws` and returns its status once it is
    /// ready (`exists` when one runs already). The workspace stays mounted at its path.
    pub fn sandbox_start(&self, ws: &str, o: &SandboxOptions) -> Result<Value> {
        self.start_sandbox(ws, o, None)
    }

    /// [`Runtime::sandbox_start`] of a namespace sandbox (`vm` None) or a VM.
    pub(crate) fn start_sandbox(
        &self,
        ws: &str,
        o: &SandboxOptions,
        vm: Option<&crate::vmrun::VmRun>,
    ) -> Result<Value> {
        let helper = helper_path()?;
        // The image is resolved (and its lower mounted) before anything is claimed.
        let image = match vm {
            None => self.sandbox_image(o)?,
            Some(_) => None,
        };
        let me = std::process::id() as i32;
        let rec = self.claim_sandbox(ws, me).map_err(|e| match e {
            Error::Busy { id, .. } => Error::Answered {
                kind: ErrorKind::Exists,
                message: format!("a sandbox runs for workspace {id} already"),
                hint: Some(
                    "use `mountctl exec WS -- CMD`, or `mountctl sandbox stop WS` first".into(),
                ),
            },
            other => other,
        })?;
        let headroom = crate::quota::Headroom::raise(&rec);
        let result = self.spawn_keeper(&helper, &rec, o, vm, me, image.as_ref());
        drop(headroom);
        if result.is_err() {
            let _ = self.release_sandbox(&rec.id, me);
            // The helper may have taken the host's overlay away before it failed.
            let _ = self.resume_host_mount(&rec.id);
        }
        result
    }

    fn spawn_keeper(
        &self,
        helper: &Path,
        rec: &Record,
        o: &SandboxOptions,
        vm: Option<&crate::vmrun::VmRun>,
        me: i32,
        image: Option<&crate::sandbox_image::SandboxImage>,
    ) -> Result<Value> {
        let (ready_read, ready_write) =
            std::io::pipe().map_err(Error::io("create the ready pipe", helper))?;
        nix::fcntl::fcntl(
            &ready_write,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
        )
        .map_err(|e| Error::io("pass the ready pipe on", helper)(e.into()))?;
        let mut cmd = Command::new(helper);
        // Every value as `--flag=VALUE`: a value that starts with `-` is never read as an
        // option by the privileged helper.
        cmd.arg(if vm.is_some() { "vm-start" } else { "start" })
            .arg(flag("--dir", rec.path.as_os_str()))
            .arg(format!("--name={}", sandbox_name(rec)))
            .arg(flag("--state-dir", self.sandbox_state_dir().as_os_str()))
            .arg(format!("--ready-fd={}", ready_write.as_raw_fd()));
        let controls = match vm {
            // The VM shares the host's own mount of the workspace through virtio-fs.
            Some(v) => {
                cmd.args(crate::vmrun::helper_flags(
                    v,
                    &self.store().layout().cache(),
                ));
                helper_controls(o, Vec::new(), Vec::new())
            }
            None => self.helper_controls_of(rec, o),
        };
        if let Some(i) = image {
            cmd.args(i.helper_flags());
        }
        let controls = crate::sandbox_image::controls_for(controls, image);
        let controls = ControlsPipe::attach(&mut cmd, &controls)?;
        cmd.arg("--");
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            // Its own process group: a Ctrl-C or hang-up of the caller's terminal does
            // not reach the sandbox, which lives until it is stopped.
            .process_group(0);
        let mut child = cmd
            .spawn()
            .map_err(Error::io("start sandbox-helper", helper))?;
        controls.send();
        drop(ready_write);
        drop(cmd);
        let keeper = child.id() as i32;
        self.move_sandbox(&rec.id, me, keeper)?;
        // Piped above, so `Some`: with none there would be nothing to read.
        let stderr = child.stderr.take();
        let err_reader = std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(stderr) = stderr {
                let _ = stderr.take(MAX_HELPER_STDERR_BYTES).read_to_string(&mut s);
            }
            s
        });
        let mut line = String::new();
        let _ = BufReader::new(ready_read)
            .take(MAX_READY_LINE_BYTES)
            .read_line(&mut line);
        let messages = err_reader.join().unwrap_or_default();
        // A refusal comes typed on the ready pipe (its kind, message and hint); stderr
        // is read only for a helper that ended before it could say anything.
        if let Ok(v) = serde_json::from_str::<Value>(&line)
            && let Some(e) = v.get("error")
        {
            let _ = child.wait();
            return Err(Error::Answered {
                kind: ErrorKind::parse(e["kind"].as_str().unwrap_or("io")).unwrap_or(ErrorKind::Io),
                message: e["message"]
                    .as_str()
                    .unwrap_or("the sandbox did not start")
                    .to_string(),
                hint: e["hint"].as_str().map(str::to_string),
            });
        }
        let Ok(status) = serde_json::from_str::<Value>(&line) else {
            let code = child.wait().ok().and_then(|s| s.code()).unwrap_or(1);
            let mut message = String::new();
            let mut hint = None;
            for l in messages.lines() {
                if let Some(h) = l.strip_prefix("hint: ") {
                    hint = Some(h.to_string());
                } else if message.is_empty() {
                    message = l.strip_prefix("sandbox-helper: ").unwrap_or(l).to_string();
                }
            }
            if message.is_empty() {
                message = format!("the sandbox did not start (sandbox-helper exit status {code})");
            }
            return Err(Error::Answered {
                kind: kind_of_exit(code),
                message,
                hint,
            });
        };
        // The keeper lives on; whoever stops it sees it go. A long-lived caller (the
        // daemon) reaps it then, so no zombie is left.
        std::thread::spawn(move || {
            let _ = child.wait();
        });
        let ports = status["ports"].clone();
        // What it was started with, for a fork's `--sandbox` (the user's controls, not
        // the runtime's own additions).
        let mut status = status;
        if let (Some(i), Some(name)) = (image, &o.image) {
            status["image"] = i.describe(name);
        }
        let mut recorded = status.clone();
        recorded["controls"] = json!(o);
        self.record_sandbox(&rec.id, keeper, recorded, ports)?;
        let mut out = status;
        out["workspace"] = json!(rec.id);
        out["path"] = json!(rec.path);
        out["messages"] = json!(messages.lines().collect::<Vec<_>>());
        Ok(out)
    }

    /// The controls of `o` for the helper, with the git fsmonitor hook's set-up for an
    /// overlay or fuse workspace first (the caller's `--env` may override it).
    fn helper_controls_of(&self, rec: &Record, o: &SandboxOptions) -> SandboxOptions {
        let (env, binds) = if self.materializer_of(rec).upper_dir(rec).is_some() {
            crate::gitfsmonitor::sandbox_setup(self.store(), rec, "/.cowspace/upper", "/workspace")
                .unwrap_or_default()
        } else {
            Default::default()
        };
        helper_controls(o, env, binds)
    }

    /// Runs `command` in a one-shot sandbox of `ws` (start, the command, stop) with this
    /// process's stdin, stdout and stderr, and gives its exit status (128 + N when it
    /// was killed by signal N). The helper's refusals (7 unsupported, 9 invalid, 5 busy
    /// or no free uid range or port) come back as its exit status, its message on
    /// stderr. SIGINT, SIGTERM, SIGHUP and SIGQUIT to this process are forwarded to the
    /// command meanwhile. `json`: the helper reports refusals as JSON on stdout.
    pub fn sandbox_run(
        &self,
        ws: &str,
        o: &SandboxOptions,
        command: &[String],
        json: bool,
    ) -> Result<u8> {
        self.one_shot(ws, o, command, json, None)
    }

    /// [`Runtime::sandbox_run`] in a namespace sandbox (`vm` None) or a VM.
    pub(crate) fn one_shot(
        &self,
        ws: &str,
        o: &SandboxOptions,
        command: &[String],
        json: bool,
        vm: Option<&crate::vmrun::VmRun>,
    ) -> Result<u8> {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM};
        use std::os::unix::process::ExitStatusExt;
        let helper = helper_path()?;
        // Resolved before anything is claimed; its locks are held for the whole run.
        let image = match vm {
            None => self.sandbox_image(o)?,
            Some(_) => None,
        };
        // Signals are caught from here on (so this process outlives Ctrl-C and clears
        // the registry); the helper gets default dispositions back at exec.
        let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP, SIGQUIT])
            .map_err(Error::io("install signal handlers", helper.clone()))?;
        let me = std::process::id() as i32;
        let rec = self.claim_sandbox(ws, me)?;
        let mut claim = Claim {
            rt: self,
            id: rec.id.clone(),
            pid: me,
        };
        let headroom = crate::quota::Headroom::raise(&rec);
        let (ready_read, ready_write) =
            std::io::pipe().map_err(Error::io("create the ready pipe", helper.clone()))?;
        // The helper inherits the write end (exec keeps it without FD_CLOEXEC); it
        // writes its ready line there, never onto the command's stdout.
        nix::fcntl::fcntl(
            &ready_write,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
        )
        .map_err(|e| Error::io("pass the ready pipe on", helper.clone())(e.into()))?;
        let mut cmd = Command::new(&helper);
        cmd.arg(if vm.is_some() { "vm-run" } else { "run" })
            .arg(flag("--dir", rec.path.as_os_str()))
            .arg(format!("--name={}", sandbox_name(&rec)))
            .arg(flag("--state-dir", self.sandbox_state_dir().as_os_str()))
            .arg(format!("--ready-fd={}", ready_write.as_raw_fd()));
        // One overlay of the workspace's layers idmapped to the sandbox, which the host
        // path and the sandbox share for the run; the host's own is mounted again after.
        let host_overlay = vm.is_none() && self.materializer_of(&rec).sandbox_shares_host_mount();
        if host_overlay {
            cmd.arg("--share-host-mount");
        }
        let controls = match vm {
            // The VM shares the host's own mount of the workspace through virtio-fs.
            Some(v) => {
                cmd.args(crate::vmrun::helper_flags(
                    v,
                    &self.store().layout().cache(),
                ));
                helper_controls(o, Vec::new(), Vec::new())
            }
            None => self.helper_controls_of(&rec, o),
        };
        if let Some(i) = &image {
            cmd.args(i.helper_flags());
        }
        let controls = crate::sandbox_image::controls_for(controls, image.as_ref());
        let controls = ControlsPipe::attach(&mut cmd, &controls)?;
        if json {
            cmd.arg("--json");
        }
        cmd.arg("--").args(command);
        // Its own process group: a Ctrl-C at the terminal reaches only this process,
        // which forwards it once (the command runs in a session of its own inside and
        // never reads the terminal as its controlling one).
        cmd.process_group(0);
        let mut child = cmd
            .spawn()
            .map_err(Error::io("start sandbox-helper", helper.clone()))?;
        controls.send();
        drop(ready_write);
        drop(cmd);
        let helper_pid = child.id() as i32;
        self.move_sandbox(&rec.id, me, helper_pid)?;
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
        drop(headroom);
        let ready: Value = serde_json::from_str(&line).unwrap_or_default();
        if let Some(ports) = ready.get("ports")
            && ports.as_object().is_some_and(|p| !p.is_empty())
        {
            self.set_ports(&rec.id, ports.clone())?;
        }
        let status = loop {
            match child.wait() {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                other => {
                    break other.map_err(Error::io("wait for sandbox-helper", helper.clone()))?;
                }
            }
        };
        handle.close();
        // Not joined: waking the forwarder from its signal wait took ~9 ms, and it has
        // nothing left to do once the helper is gone.
        drop(forwarder);
        // Also after a helper that failed without a ready line: it may have unmounted it.
        if host_overlay {
            self.resume_host_mount(&rec.id)?;
        }
        drop(claim);
        let image_snapshot = image.as_ref().map(|i| i.snapshot.to_hex());
        // Its locks go first: the release takes the image's mount lock exclusively.
        drop(image);
        // The command's status is the answer: a failed release leaves the mount to `sweep`.
        if let Some(s) = image_snapshot
            && let Err(e) = self.release_image(&s)
        {
            tracing::warn!(image = %s, "releasing the image's mount after the run: {e}");
        }
        Ok(match (status.code(), status.signal()) {
            (Some(c), _) => c as u8,
            (None, Some(sig)) => 128u8.saturating_add(sig as u8),
            (None, None) => 1,
        })
    }

    pub(crate) fn live_record(&self, ws: &str) -> Result<Record> {
        let rec = self.get(ws)?;
        match (&rec.sandbox, live_sandbox(&rec)) {
            (Some(_), Some(_)) => Ok(rec),
            // A keeper whose `sandbox start` was killed before it recorded the status:
            // the keeper answers for itself, and is adopted.
            (None, Some(pid)) => {
                let state = self.sandbox_state_dir();
                match sandbox_api::keeper::Client::connect(&state, &sandbox_name(&rec))
                    .and_then(|c| c.status())
                {
                    Ok(status) if status["keeper_pid"].as_i64() == Some(i64::from(pid)) => {
                        let ports = status["ports"].clone();
                        self.record_sandbox(&rec.id, pid, status, ports)?;
                        self.get(&rec.id)
                    }
                    _ => Err(not_running(&rec)),
                }
            }
            _ => Err(not_running(&rec)),
        }
    }

    /// A connection to the keeper of `ws`'s sandbox, for an exec (`not_found` when no
    /// sandbox runs: a command is never run on the host instead).
    pub fn sandbox_client(&self, ws: &str) -> Result<sandbox_api::keeper::Client> {
        self.client_of(&self.live_record(ws)?)
    }

    /// A connection to the keeper of `rec`'s running sandbox.
    pub(crate) fn client_of(&self, rec: &Record) -> Result<sandbox_api::keeper::Client> {
        sandbox_api::keeper::Client::connect(&self.sandbox_state_dir(), &sandbox_name(rec)).map_err(
            |e| match e {
                sandbox_api::Error::NotRunning { .. } => not_running(rec),
                other => from_helper(other),
            },
        )
    }

    /// The status of `ws`'s sandbox: what it was started with and, live, its processes,
    /// memory, OOM kills and running execs.
    pub fn sandbox_status(&self, ws: &str) -> Result<Value> {
        let rec = self.live_record(ws)?;
        let mut v = self.client_of(&rec)?.status().map_err(from_helper)?;
        v["workspace"] = json!(rec.id);
        v["path"] = json!(rec.path);
        if let Some(t) = v["started_at"].as_i64() {
            v["uptime_s"] = json!((crate::registry::now() - t).max(0));
        }
        Ok(v)
    }

    /// Every running sandbox of this root.
    pub fn sandbox_list(&self) -> Result<Vec<Value>> {
        let mut out = Vec::new();
        for rec in self.list(false)? {
            if live_sandbox(&rec).is_some()
                && let Ok(v) = self.sandbox_status(&rec.id)
            {
                out.push(v);
            }
        }
        Ok(out)
    }

    /// Pauses `ws`'s running sandbox: every process stopped where it is, its memory kept
    /// (a namespace sandbox's cgroup freezer; a VM's qemu `stop`). Answers `{"paused":
    /// true, "paused_at", "elapsed_ms"}`; `invalid_input` when paused already,
    /// `unsupported` without a freezer. Execs are then refused (`busy`) until
    /// [`Runtime::sandbox_resume`]; published ports keep their connections.
    pub fn sandbox_pause(&self, ws: &str) -> Result<Value> {
        let rec = self.live_record(ws)?;
        let mut v = self.client_of(&rec)?.pause().map_err(from_helper)?;
        v["workspace"] = json!(rec.id);
        Ok(v)
    }

    /// Resumes `ws`'s paused sandbox; `invalid_input` when it runs.
    pub fn sandbox_resume(&self, ws: &str) -> Result<Value> {
        let rec = self.live_record(ws)?;
        let mut v = self.client_of(&rec)?.resume().map_err(from_helper)?;
        v["workspace"] = json!(rec.id);
        Ok(v)
    }

    /// Suspends `ws`'s sandbox to disk with its processes: refused (`unsupported`) on
    /// this host for both providers, naming why (docs/sandbox.md, "Pause, resume,
    /// suspend").
    pub fn sandbox_suspend(&self, ws: &str) -> Result<Value> {
        let rec = self.live_record(ws)?;
        let mut v = self.client_of(&rec)?.suspend().map_err(from_helper)?;
        v["workspace"] = json!(rec.id);
        Ok(v)
    }

    /// Stops `ws`'s sandbox: every process in it killed, its cgroups, ports, uid range
    /// and mounts freed, the host's own mount of the workspace back in place. Idempotent:
    /// with no sandbox running the answer is `{"stopped": false, "was_running": false}`
    /// (a dead sandbox's record is cleared on the way).
    pub fn sandbox_stop(&self, ws: &str) -> Result<Value> {
        let rec = self.get(ws)?;
        if live_sandbox(&rec).is_none() {
            if rec.sandbox.is_some() {
                self.forget_sandbox(&rec)?;
            }
            return Ok(json!({"stopped": false, "was_running": false, "workspace": rec.id}));
        }
        let rec = self.live_record(ws)?;
        let keeper = rec.sandbox_pid.unwrap_or(0);
        let entered = host_users_of_shared_mount(&rec);
        let answer = match self.client_of(&rec) {
            Ok(c) => c.stop().map_err(from_helper)?,
            Err(_) => {
                // A keeper that does not answer is ended; its init dies with it.
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(keeper),
                    nix::sys::signal::Signal::SIGKILL,
                );
                json!({"stopped": true})
            }
        };
        wait_gone(keeper);
        self.forget_sandbox(&rec)?;
        let mut out = answer;
        out["workspace"] = json!(rec.id);
        out["was_running"] = json!(true);
        // Host processes that entered the workspace while the sandbox ran are still in
        // its mount, which the stop could only detach: they see no later change.
        let stale: Vec<Value> = entered
            .into_iter()
            .filter(|&pid| !crate::mounts::is_exiting(pid))
            .map(|pid| json!({"pid": pid, "command": crate::procfs::comm(pid)}))
            .collect();
        out["host_processes"] = json!(stale);
        Ok(out)
    }

    /// After a sandbox ended (stopped, or its keeper died): the host's mount of the
    /// workspace is its own again, and the record says no sandbox runs.
    pub(crate) fn forget_sandbox(&self, rec: &Record) -> Result<()> {
        let shared = rec
            .sandbox
            .as_ref()
            .is_some_and(|s| s["host_mount"] == "shared");
        if shared && crate::mounts::is_mounted(&rec.path)? {
            // A keeper killed before it could unmount left the shared overlay.
            let _ = crate::mounts::unmount_lazy(&rec.path);
        }
        if let Some(pid) = rec.sandbox_pid {
            self.release_sandbox(&rec.id, pid)?;
        }
        if let Some(image) = rec
            .sandbox
            .as_ref()
            .and_then(|s| s["image"]["snapshot"].as_str())
        {
            self.release_image(image)?;
        }
        self.resume_host_mount(&rec.id)
    }
}

/// Forgets the workspace's one-shot sandbox (and its ports) when the run ends, however
/// it ends.
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

impl Runtime {
    /// Has the helper free what killed keepers left (their cgroups, per-run and overlay
    /// work directories; the keeper frees them itself when it is stopped). Best effort:
    /// a helper that cannot be run or fails leaves them to the next sandbox start.
    pub(crate) fn reap_dead_sandboxes(&self, workspace: &Path) {
        let Ok(helper) = helper_path() else {
            return;
        };
        let _ = Command::new(helper)
            .arg("reap")
            .arg(flag("--state-dir", self.sandbox_state_dir().as_os_str()))
            .arg(flag("--dir", workspace.as_os_str()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

fn flag(name: &str, value: &std::ffi::OsStr) -> std::ffi::OsString {
    let mut s = std::ffi::OsString::from(format!("{name}="));
    s.push(value);
    s
}

/// How long `stop` waits for a keeper to exit after it answered.
const KEEPER_EXIT_WAIT_MS: u64 = 5_000;

fn wait_gone(pid: i32) {
    if pid <= 0 {
        return;
    }
    let deadline =
        std::time::Instant::now() + std::time::Duration::from_millis(KEEPER_EXIT_WAIT_MS);
    while std::time::Instant::now() < deadline {
        let alive = crate::procfs::stat(pid).is_some_and(|s| !s.is_zombie());
        if !alive {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// The host processes using `rec`'s workspace while its sandbox shares the host's mount
/// (working directory, root, open files or mappings under its path): they are in the
/// sandbox's idmapped mount, which `sandbox stop` can only detach (they keep it until
/// they let go). The sandbox's own processes, seen from the host, are not among them:
/// those in its init's mount namespace and its keeper are left out.
fn host_users_of_shared_mount(rec: &Record) -> Vec<i32> {
    let Some(sandbox) = rec.sandbox.as_ref().filter(|s| s["host_mount"] == "shared") else {
        return Vec::new();
    };
    let mnt_ns = |pid: i64| std::fs::read_link(format!("/proc/{pid}/ns/mnt")).ok();
    let inside = sandbox["init_pid"].as_i64().and_then(mnt_ns);
    crate::mounts::users_of(&rec.path)
        .into_iter()
        .filter(|&pid| Some(pid) != rec.sandbox_pid)
        .filter(|&pid| inside.is_none() || mnt_ns(pid.into()) != inside)
        .collect()
}
