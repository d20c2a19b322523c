//! The `mountctl` binary as users run it: bench measures the real CLI, never
//! library internals.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::proc;

#[derive(Debug, Clone)]
pub struct Mountctl {
    pub path: PathBuf,
}

impl Mountctl {
    /// `--mountctl PATH`, else `mountctl` next to the `bench` executable, else on PATH.
    /// `Err` is the reason methods needing it are skipped.
    pub fn locate(explicit: Option<&Path>) -> std::result::Result<Self, String> {
        if let Some(p) = explicit {
            return if p.is_file() {
                Ok(Self {
                    path: p.to_path_buf(),
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
                return Ok(Self { path: p });
            }
        }
        proc::which("mountctl").map(|path| Self { path }).ok_or_else(|| {
            "mountctl not found next to bench or on PATH (build it: cargo build --release -p mountctl, or pass --mountctl PATH)".to_string()
        })
    }

    pub fn command(&self, root: &Path) -> Command {
        let mut c = Command::new(&self.path);
        c.arg("--root").arg(root).arg("--json");
        c
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
