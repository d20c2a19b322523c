//! The `mountctl` binary as users run it: bench measures the real CLI, never
//! library internals.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::proc;

/// The `mountctl` located last: git's fsmonitor hook in workspaces runs it
/// (`COWSPACE_MOUNTCTL`, set by [`crate::corpus::git`]), as it would the one on `PATH`.
pub static LOCATED: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

#[derive(Debug, Clone)]
pub struct Mountctl {
    pub path: PathBuf,
    /// Environment every run of it gets (a remote's credentials).
    pub env: Vec<(String, String)>,
}

impl Mountctl {
    /// `--mountctl PATH`, else `mountctl` next to the `bench` executable, else on PATH.
    /// `Err` is the reason methods needing it are skipped.
    pub fn locate(explicit: Option<&Path>) -> std::result::Result<Self, String> {
        let found = Self::find(explicit)?;
        let _ = LOCATED.set(found.path.clone());
        Ok(found)
    }

    fn find(explicit: Option<&Path>) -> std::result::Result<Self, String> {
        if let Some(p) = explicit {
            return if p.is_file() {
                Ok(Self {
                    path: p.to_path_buf(),
                    env: Vec::new(),
                })
            } else {
                Err(format!("--mountctl {} does not exist", p.display()))
            };
        }
        if let Some(dir) = std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(Path::to_path_buf))
        {
            let p = dir.join("mountctl");
            if p.is_file() {
                return Ok(Self {
                    path: p,
                    env: Vec::new(),
                });
            }
        }
        proc::which("mountctl").map(|path| Self {
            path,
            env: Vec::new(),
        }).ok_or_else(|| {
            "mountctl not found next to bench or on PATH (build it: cargo build --release -p mountctl, or pass --mountctl PATH)".to_string()
        })
    }

    pub fn command(&self, root: &Path) -> Command {
        let mut c = Command::new(&self.path);
        c.arg("--root").arg(root).arg("--json");
        c.envs(self.env.iter().map(|(k, v)| (k, v)));
        c
    }

    /// The same binary, with `key=value` in the environment of every run.
    pub fn with_env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Runs `mountctl --root ROOT --json ARGS…` and parses its one JSON object.
    /// A failure carries mountctl's `{"error": …}` kind and message.
    pub fn json(&self, root: &Path, args: &[&std::ffi::OsStr]) -> Result<Value> {
        let mut c = self.command(root);
        c.args(args);
        let shown = proc::display(&c);
        let (code, stdout, stderr) = proc::run_status(&mut c)?;
        let parsed: Option<Value> = serde_json::from_slice(&stdout).ok();
        if code != Some(0) {
            let detail = parsed
                .as_ref()
                .and_then(|v| v.get("error"))
                .map(|e| {
                    format!(
                        "{}: {}",
                        e.get("kind").and_then(Value::as_str).unwrap_or("error"),
                        e.get("message").and_then(Value::as_str).unwrap_or("")
                    )
                })
                .unwrap_or_else(|| proc::tail(&stderr, &stdout));
            bail!(
                "`{shown}` exited with {}: {detail}",
                code.map_or("a signal".into(), |c| c.to_string())
            );
        }
        parsed.with_context(|| {
            format!(
                "`{shown}` printed no JSON object: {}",
                proc::tail(&stdout, &stderr)
            )
        })
    }

    /// `mountctl --version`, if it answers.
    pub fn version(&self) -> Option<String> {
        let out = proc::run(Command::new(&self.path).arg("--version")).ok()?;
        Some(String::from_utf8_lossy(&out).trim().to_string())
    }
}

/// Reads an unsigned integer field, tolerating its absence.
pub fn field_u64(v: &Value, key: &str) -> Option<u64> {
    v.get(key)
        .and_then(|x| x.as_u64().or_else(|| x.as_f64().map(|f| f as u64)))
}

/// A store root bench made (with the corpus imported as ref `bench`), whose
/// workspaces must be removed, daemon stopped and mounts gone before the root is
/// deleted — all on drop, also after Ctrl-C.
pub struct StoreGuard {
    pub mountctl: Mountctl,
    pub root: PathBuf,
    /// Delete the root on drop (not for roots on a loop filesystem that goes as a
    /// whole: btrfs base subvolumes are read-only).
    pub remove_root: bool,
}

impl StoreGuard {
    /// `mountctl init` + `mountctl import TREE --ref bench --no-default-excludes`
    /// (untimed fixture work).
    pub fn import(mountctl: &Mountctl, root: PathBuf, tree: &Path) -> Result<Self> {
        let g = Self {
            mountctl: mountctl.clone(),
            root,
            remove_root: true,
        };
        g.mountctl.json(&g.root, &["init".as_ref()])?;
        g.mountctl.json(
            &g.root,
            &[
                "import".as_ref(),
                tree.as_os_str(),
                "--ref".as_ref(),
                "bench".as_ref(),
                "--no-default-excludes".as_ref(),
            ],
        )?;
        Ok(g)
    }

    /// The root's `fsd`, when one runs.
    pub fn daemon_pid(&self) -> Option<u32> {
        let want = std::fs::canonicalize(&self.root).unwrap_or_else(|_| self.root.clone());
        find_pids(|args| {
            args.first()
                .is_some_and(|a| a.rsplit('/').next() == Some("fsd"))
                && args.windows(2).any(|w| {
                    w[0] == "--root" && (Path::new(&w[1]) == want || Path::new(&w[1]) == self.root)
                })
        })
        .into_iter()
        .next()
    }
}

impl Drop for StoreGuard {
    fn drop(&mut self) {
        if let Ok(v) = self.mountctl.json(&self.root, &["list".as_ref()]) {
            for r in v.as_array().into_iter().flatten() {
                if let Some(id) = r.get("id").and_then(Value::as_str)
                    && let Err(e) = self.mountctl.json(
                        &self.root,
                        &["remove".as_ref(), id.as_ref(), "--force".as_ref()],
                    )
                {
                    eprintln!("bench: removing workspace {id}: {e:#}");
                }
            }
        }
        let mut c = self.command_root();
        c.args(["daemon", "stop"]);
        if let Err(e) = proc::run(&mut c) {
            eprintln!(
                "bench: stopping the daemon of {}: {e:#}",
                self.root.display()
            );
        }
        if self.remove_root
            && let Err(e) = crate::cancel::remove_tree(&self.root)
        {
            eprintln!("bench: cleanup of {} failed: {e:#}", self.root.display());
        }
    }
}

impl StoreGuard {
    fn command_root(&self) -> Command {
        self.mountctl.command(&self.root)
    }
}

/// Pids whose command line (split at NULs) satisfies `f`.
pub fn find_pids(f: impl Fn(&[String]) -> bool) -> Vec<u32> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let args: Vec<String> = c
                    .split(|b| *b == 0)
                    .filter(|a| !a.is_empty())
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect();
                f(&args)
            })
        })
        .collect()
}

/// A `/proc/PID/status` size field (`VmRSS`, `VmHWM`) in bytes.
pub fn proc_status_bytes(pid: u32, key: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines().find_map(|l| {
        let rest = l.strip_prefix(key)?.strip_prefix(':')?;
        let kb: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kb * 1024)
    })
}
