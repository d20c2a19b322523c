//! Support for the workspace suite: the root gate, a runtime root that cleans up every
//! mount, daemon and directory it made (also when an assertion fails), and small process
//! and mount-table helpers.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Instant;

use cowspace_tests::{Out, TestRoot, fsd_pids_of, mounts_under};
use serde_json::Value;

/// Skips (returns) when the suite cannot run here, saying why; fails instead under
/// `CI=true`, where CI is root with `/dev/fuse` and a skip would hide a regression.
macro_rules! require_root {
    () => {
        if let Err(why) = $crate::workspaces::support::can_run() {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("workspace e2e test cannot run under CI=true: {why}");
            }
            eprintln!("SKIPPED: {why}");
            return;
        }
    };
}
pub(crate) use require_root;

/// Whether the suite can run: root (kernel overlay mounts), `/dev/fuse` (the view lower)
/// and overlayfs in the kernel.
pub fn can_run() -> Result<(), String> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid_root = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2))
        == Some("0");
    if !euid_root {
        return Err("not root: workspaces are kernel overlay mounts, which need root".into());
    }
    if !Path::new("/dev/fuse").exists() {
        return Err("no /dev/fuse: the snapshot view (--lower view) needs FUSE".into());
    }
    let fs = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    if !fs.lines().any(|l| l.trim_end().ends_with("overlay")) {
        return Err("the kernel has no overlay filesystem".into());
    }
    Ok(())
}

/// A workspace as `create --json` reported it.
#[derive(Debug, Clone)]
pub struct Ws {
    pub id: String,
    pub path: PathBuf,
    pub json: Value,
}

/// A runtime root for workspace tests. Dropping it (also while a test panics) removes
/// every workspace it created with `remove --force`, stops its daemon, lazily unmounts
/// whatever is still mounted under its temporary directory (deepest first) and kills
/// the `fsd` of this root if it still runs; then the temporary directory goes.
#[derive(Debug)]
pub struct WsRoot {
    pub t: TestRoot,
    created: Mutex<Vec<String>>,
}

impl WsRoot {
    pub fn new() -> WsRoot {
        WsRoot::new_in(&std::env::temp_dir())
    }

    /// A runtime root in a temporary directory under `parent` (a loop filesystem, say).
    pub fn new_in(parent: &Path) -> WsRoot {
        WsRoot {
            t: TestRoot::new_in(parent),
            created: Mutex::new(Vec::new()),
        }
    }

    pub fn root(&self) -> &Path {
        self.t.root()
    }

    /// One request over the root's control socket; gives its `result` (asserting `ok`).
    #[track_caller]
    pub fn socket(&self, op: &str, args: Value) -> Value {
        use std::io::{BufRead, BufReader, Write};
        let path = self.root().join("run/fsd.sock");
        let mut s = std::os::unix::net::UnixStream::connect(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        writeln!(s, "{}", serde_json::json!({"op": op, "args": args})).unwrap();
        let mut line = String::new();
        BufReader::new(&s).read_line(&mut line).unwrap();
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["ok"], true, "{op}: {v}");
        v["result"].clone()
    }

    /// Remembers a workspace id for the cleanup.
    pub fn track(&self, id: &str) {
        self.created
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(id.to_owned());
    }

    /// `create SNAP args... --json`, remembering the workspace when it was made.
    pub fn create_out(&self, snap: &str, args: &[&str]) -> Out {
        let mut all = vec!["create", snap];
        all.extend_from_slice(args);
        let out = self.t.json(&all);
        if out.code == 0
            && let Ok(v) = serde_json::from_str::<Value>(out.stdout.trim())
            && let Some(id) = v["id"].as_str()
        {
            self.track(id);
        }
        out
    }

    /// Creates a workspace (asserting success and the documented JSON fields).
    #[track_caller]
    pub fn create(&self, snap: &str, args: &[&str]) -> Ws {
        let out = self.create_out(snap, args).ok();
        let v = out.json();
        for key in [
            "id",
            "path",
            "materializer",
            "lower_kind",
            "lower",
            "snapshot",
            "elapsed_ms",
        ] {
            assert!(!v[key].is_null(), "create --json lacks {key:?}: {v}");
        }
        let path = PathBuf::from(v["path"].as_str().expect("path"));
        assert!(
            path.is_dir(),
            "the workspace path {path:?} is not a directory"
        );
        Ws {
            id: v["id"].as_str().expect("id").to_owned(),
            path,
            json: v,
        }
    }

    /// Imports `dir` and gives the snapshot id.
    #[track_caller]
    pub fn import(&self, dir: &Path, extra: &[&str]) -> String {
        self.t.import(dir, extra)["snapshot"]
            .as_str()
            .expect("snapshot")
            .to_owned()
    }

    /// `commit WS --json` (with extra arguments): the new snapshot id, the report, and the
    /// wall-clock milliseconds the command took.
    #[track_caller]
    pub fn commit(&self, ws: &str, extra: &[&str]) -> (String, Value, f64) {
        let mut all = vec!["commit", ws];
        all.extend_from_slice(extra);
        let t = Instant::now();
        let v = self.t.json(&all).ok().json();
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let snap = v["snapshot"].as_str().expect("commit --json snapshot");
        assert_eq!(snap.len(), 64, "{v}");
        (snap.to_owned(), v, ms)
    }

    /// `remove WS --json`, asserting success: refused while the workspace has changes
    /// no commit took (use [`WsRoot::discard`] for those).
    #[track_caller]
    pub fn remove(&self, ws: &str) -> Value {
        self.t.json(["remove", ws]).ok().json()
    }

    /// `remove --force WS --json`, asserting success: the removal of a workspace whose
    /// changes the test leaves uncommitted on purpose.
    #[track_caller]
    pub fn discard(&self, ws: &str) -> Value {
        self.t.json(["remove", "--force", ws]).ok().json()
    }

    /// `list --all --json`.
    #[track_caller]
    pub fn list_all(&self) -> Value {
        self.t.json(["list", "--all"]).ok().json()
    }

    /// `status WS --json`.
    #[track_caller]
    pub fn status(&self, ws: &str) -> Value {
        self.t.json(["status", ws]).ok().json()
    }

    /// The entries of `<root>/workspaces/` (empty when it does not exist).
    pub fn ws_dirs(&self) -> Vec<String> {
        let d = self.root().join("workspaces");
        if d.is_dir() {
            cowspace_tests::dir_entries(&d)
        } else {
            Vec::new()
        }
    }

    /// Mount points under this test's temporary directory.
    pub fn mounts(&self) -> Vec<PathBuf> {
        mounts_under(self.t.scratch())
    }

    /// Running `fsd` processes serving this root.
    pub fn fsd_pids(&self) -> Vec<u32> {
        fsd_pids_of(self.root())
    }

    /// Stops the daemon and asserts nothing is left: no mount under the temporary
    /// directory, no directory under `<root>/workspaces/`, no `fsd` of this root.
    #[track_caller]
    pub fn assert_clean(&self) {
        self.t.run(["daemon", "stop", "--force"]).ok();
        // The daemon unmounts its views on its way out, which on a loaded machine can
        // take a while: its exit is awaited (not timed), then nothing may be left.
        let deadline = Instant::now() + std::time::Duration::from_secs(120);
        while !self.fsd_pids().is_empty() && Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(self.fsd_pids(), Vec::<u32>::new(), "a daemon still runs");
        assert_eq!(self.mounts(), Vec::<PathBuf>::new(), "mounts left behind");
        assert_eq!(self.ws_dirs(), Vec::<String>::new(), "workspace dirs left");
    }
}

impl Drop for WsRoot {
    fn drop(&mut self) {
        let ids = std::mem::take(&mut *self.created.lock().unwrap_or_else(|p| p.into_inner()));
        for id in ids.iter().rev() {
            let _ = self.t.run(["remove", "--force", id]);
        }
        let _ = self.t.run(["daemon", "stop", "--force"]);
        for m in self.mounts() {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(&m)
                .stderr(Stdio::null())
                .status();
        }
        for pid in self.fsd_pids() {
            kill9(pid);
        }
    }
}

/// `kill -9 PID`.
pub fn kill9(pid: u32) {
    let _ = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

/// Whether a process is alive (and not a zombie).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => {
            let state = s
                .rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().next());
            !matches!(state, Some("Z") | Some("X") | None)
        }
        Err(_) => false,
    }
}

/// A child process killed (and reaped) when dropped.
#[derive(Debug)]
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `sh -c script` in `dir`, asserting success; gives stdout.
#[track_caller]
pub fn sh(dir: &Path, script: &str) -> String {
    run_sh(dir, script, false)
}

/// Like [`sh`], and the script must also print nothing on stderr (a tool that succeeds
/// but warns, as `mv` does when it cannot keep what it copies, fails here).
#[track_caller]
pub fn sh_quiet(dir: &Path, script: &str) -> String {
    run_sh(dir, script, true)
}

#[track_caller]
fn run_sh(dir: &Path, script: &str, quiet: bool) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .unwrap_or_else(|e| panic!("sh -c {script:?}: {e}"));
    assert!(
        out.status.success() && (!quiet || out.stderr.is_empty()),
        "`{script}` in {} failed{} ({})\nstdout: {}\nstderr: {}",
        dir.display(),
        if quiet { " or warned" } else { "" },
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
