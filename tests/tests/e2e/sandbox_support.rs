//! Support for the sandbox escape suite: locating (building) `sandbox-helper`, the root
//! gate, running the helper with a timeout, and guards that clean up what a test made.
//!
//! The helper binary: `$COWSPACE_SANDBOX_HELPER` when set, else it is built once per test
//! run with `cargo build -p sandbox-helper` (the cargo that builds the tests) and taken
//! from the target directory beside this test executable (`target/<profile>/`).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Longest any single helper run may take in a test.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// Skips (returns) when the suite cannot run here, saying why; fails instead when
/// `CI=true`, where a skipped security test would hide a regression.
macro_rules! require_root {
    () => {
        if let Err(why) = $crate::sandbox::support::can_run() {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("sandbox e2e test cannot run under CI=true: {why}");
            }
            eprintln!("SKIPPED: {why}");
            return;
        }
    };
}
pub(crate) use require_root;

/// Whether the root-only suite can run: root, and a probe that passes.
pub fn can_run() -> Result<(), String> {
    if !effective_uid_is_root() {
        return Err(
            "not root: the sandbox helper needs root (user namespaces with a \
                    dedicated uid range, cgroups)"
                .into(),
        );
    }
    Ok(())
}

/// From `/proc/self/status` (this crate has no `unsafe` for `geteuid`).
fn effective_uid_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

/// The `sandbox-helper` binary (built once per test run).
pub fn helper() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        if let Some(p) = std::env::var_os("COWSPACE_SANDBOX_HELPER") {
            return PathBuf::from(p);
        }
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
        let cargo = option_env!("CARGO").unwrap_or("cargo");
        let status = Command::new(cargo)
            .args([
                "build",
                "-q",
                "-p",
                "sandbox-helper",
                "--bin",
                "sandbox-helper",
                "--manifest-path",
            ])
            .arg(&manifest)
            .status()
            .expect("running cargo build -p sandbox-helper");
        assert!(status.success(), "cargo build -p sandbox-helper failed");
        let exe = std::env::current_exe().expect("test executable path");
        let mut dir = exe.parent().expect("deps dir");
        if dir.ends_with("deps") {
            dir = dir.parent().expect("target/<profile>");
        }
        let path = dir.join("sandbox-helper");
        assert!(path.is_file(), "{} missing after the build", path.display());
        path
    })
}

/// A unique temporary directory with a workspace and a state directory, removed on drop.
pub struct Scratch {
    pub dir: tempfile::TempDir,
}

impl Scratch {
    pub fn new() -> Scratch {
        let dir = tempfile::Builder::new()
            .prefix("cowspace-sbx-e2e-")
            .tempdir()
            .expect("tempdir");
        std::fs::create_dir(dir.path().join("ws")).unwrap();
        std::fs::create_dir(dir.path().join("state")).unwrap();
        Scratch { dir }
    }
    pub fn ws(&self) -> PathBuf {
        self.dir.path().join("ws")
    }
    pub fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }
    /// `sandbox-helper run --dir WS --name NAME --state-dir STATE` and `extra`, then `--`.
    pub fn command(&self, name: &str, extra: &[&str], cmd: &[&str]) -> Command {
        self.command_in(&self.ws(), name, extra, cmd)
    }

    /// [`Scratch::command`] with another workspace directory.
    pub fn command_in(&self, ws: &Path, name: &str, extra: &[&str], cmd: &[&str]) -> Command {
        let mut c = Command::new(helper());
        c.arg("run").arg("--dir").arg(ws).arg("--name").arg(name);
        c.arg("--state-dir").arg(self.state());
        c.args(extra).arg("--").args(cmd);
        c.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }
}

/// A helper process this test started. On drop (a test that failed half-way) it gets
/// SIGTERM, which the helper forwards into the sandbox so it ends and cleans up its
/// cgroups, then SIGKILL after [`TERM_GRACE`]; always reaped.
pub struct Running(pub Option<Child>);

/// How long a dropped helper gets to end after SIGTERM.
pub const TERM_GRACE: Duration = Duration::from_secs(5);

impl Running {
    pub fn spawn(mut cmd: Command) -> Running {
        Running(Some(cmd.spawn().expect("spawning sandbox-helper")))
    }
    pub fn pid(&self) -> u32 {
        self.0.as_ref().unwrap().id()
    }
    /// Reads the first line of stdout (the `--json` ready line).
    pub fn ready_line(&mut self) -> String {
        let out = self.0.as_mut().unwrap().stdout.as_mut().unwrap();
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        while out.read(&mut byte).map(|n| n == 1).unwrap_or(false) && byte[0] != b'\n' {
            line.push(byte[0]);
        }
        String::from_utf8_lossy(&line).into_owned()
    }
    /// Waits up to [`RUN_TIMEOUT`]; kills the helper and panics when it takes longer.
    pub fn wait(mut self) -> Output {
        let deadline = Instant::now() + RUN_TIMEOUT;
        let mut child = self.0.take().unwrap();
        loop {
            if child.try_wait().expect("try_wait").is_some() {
                return child.wait_with_output().expect("collecting output");
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let out = child.wait_with_output().unwrap();
                panic!(
                    "sandbox-helper did not finish in {RUN_TIMEOUT:?}; stderr: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Running {
    /// SIGKILL the helper now (its sandbox dies with it) and reap it.
    pub fn kill_now(mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let Some(mut child) = self.0.take() else {
            return;
        };
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + TERM_GRACE;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Runs the helper to completion.
pub fn run(cmd: Command) -> Output {
    Running::spawn(cmd).wait()
}

/// Exit code, stdout and stderr of a finished run, for assertions and messages.
pub fn parts(out: &Output) -> (Option<i32>, String, String) {
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Pids of host processes whose command line starts with `marker` (e.g. `sleep 123`).
pub fn processes_with(marker: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if pid == std::process::id() {
            continue;
        }
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if text.starts_with(marker) {
                out.push(pid);
            }
        }
    }
    out
}

/// The sandbox's cgroup directories that still exist (`.../cowspace/NAME.HELPERPID`).
pub fn leftover_cgroups(name: &str, helper_pid: u32) -> Vec<PathBuf> {
    ["memory", "pids", "cpu", "unified"]
        .iter()
        .map(|c| {
            Path::new("/sys/fs/cgroup")
                .join(c)
                .join("cowspace")
                .join(format!("{name}.{helper_pid}"))
        })
        .filter(|p| p.exists())
        .collect()
}

/// A unique number for marking a test's processes (e.g. `sleep <marker>`).
pub fn marker() -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    format!("{}{:03}", 100_000 + std::process::id() % 100_000, n)
}
