//! The cowspace methods: workspaces made with `mountctl create`, or through the daemon's
//! control socket.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{Context, Result};

use super::{LoopFs, Materializer, Speed, Workspace, info};
use crate::cancel::DirGuard;
use crate::mountctl::{Mountctl, StoreGuard, proc_status_bytes};
use crate::proc;
use crate::sections::MethodInfo;

/// A cowspace workspace made by `mountctl create bench ARGS --path WS`.
pub(super) struct Cowspace {
    id: &'static str,
    args: &'static [&'static str],
    store: Arc<StoreGuard>,
    /// The loop filesystem the store is on (btrfs, reflink).
    fs: Option<Arc<LoopFs>>,
    speed: Speed,
    n: AtomicUsize,
    /// Create and remove through the daemon's control socket, as a runtime embedding
    /// cowspace does (one connection per request), instead of running `mountctl`.
    pub(super) socket: bool,
}

impl Cowspace {
    fn mountctl(&self) -> &Mountctl {
        &self.store.mountctl
    }

    /// The method after one untimed create + remove (which also builds what the
    /// first workspace of a snapshot needs: the checkout, the base subvolume), with a
    /// note saying how long that took. Exit 7 (unsupported on this host) or 2 (no
    /// such materializer) makes the method skipped with mountctl's reason.
    pub(super) fn probed(
        id: &'static str,
        args: &'static [&'static str],
        store: Arc<StoreGuard>,
        fs: Option<Arc<LoopFs>>,
        speed: Speed,
        scratch: &Path,
    ) -> std::result::Result<(Self, String), String> {
        let m = Cowspace {
            id,
            args,
            store,
            fs,
            speed,
            n: AtomicUsize::new(0),
            socket: false,
        };
        let dir = scratch.join(format!("probe-{id}"));
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let mut c = m.mountctl().command(&m.store.root);
        c.args(["create", "bench"])
            .args(args)
            .arg("--path")
            .arg(m.ws_path(&dir));
        let t0 = std::time::Instant::now();
        let (code, out, err) = proc::run_status(&mut c).map_err(|e| format!("{e:#}"))?;
        let took = t0.elapsed().as_secs_f64();
        let r = match code {
            Some(0) => {
                let v: serde_json::Value =
                    serde_json::from_slice(&out).map_err(|e| e.to_string())?;
                let ws = v["id"].as_str().unwrap_or_default().to_string();
                m.mountctl()
                    .json(
                        &m.store.root,
                        &["remove".as_ref(), ws.as_ref(), "--force".as_ref()],
                    )
                    .map_err(|e| format!("{e:#}"))?;
                Ok(())
            }
            Some(2) | Some(7) => Err(format!(
                "mountctl create {}: {}",
                args.join(" "),
                proc::tail(&err, &out).replace('\n', " ")
            )),
            _ => Ok(()), // a real failure: let the runs fail and report it
        };
        let _ = crate::cancel::remove_tree(&dir);
        let _ = crate::cancel::remove_tree(&m.ws_path(&dir));
        r?;
        let note = format!(
            "{id}: the first workspace of the snapshot (untimed, before the runs) took \
             {took:.2} s (it builds what later creates share: the checkout, the base \
             subvolume, the blob cache entries)."
        );
        Ok((m, note))
    }

    /// One request on a new connection to the daemon's control socket; its result.
    fn request(&self, op: &str, args: serde_json::Value) -> Result<serde_json::Value> {
        use std::io::{BufRead, BufReader};
        let sock = self.store.root.join("run/fsd.sock");
        let mut s = std::os::unix::net::UnixStream::connect(&sock)
            .with_context(|| format!("connecting to {}", sock.display()))?;
        let mut line = serde_json::to_vec(&serde_json::json!({"op": op, "args": args}))?;
        line.push(b'\n');
        s.write_all(&line)?;
        let mut reply = String::new();
        BufReader::new(&s).read_line(&mut reply)?;
        let v: serde_json::Value = serde_json::from_str(&reply)
            .with_context(|| format!("the daemon's reply to {op}: {reply:?}"))?;
        anyhow::ensure!(
            v["ok"] == true,
            "{op} through the control socket: {}",
            v["error"]
        );
        Ok(v["result"].clone())
    }

    /// The `create` request's arguments that `self.args` (`--materializer M`,
    /// `--lower L`) stand for.
    fn socket_args(&self) -> serde_json::Value {
        let mut v = serde_json::json!({"snapshot": "bench"});
        for pair in self.args.chunks(2) {
            if let [flag, value] = pair {
                v[flag.trim_start_matches("--")] = (*value).into();
            }
        }
        v
    }

    fn ws_path(&self, dir: &Path) -> PathBuf {
        match &self.fs {
            // Full-tree materializers: the workspace on the same filesystem.
            Some(fs) => fs
                .mnt
                .join(format!("ws-{}", self.n.fetch_add(1, Ordering::SeqCst))),
            None => dir.join("ws"),
        }
    }
}

impl Materializer for Cowspace {
    fn info(&self) -> MethodInfo {
        info(
            self.id,
            if self.socket {
                let mut create = self.socket_args();
                create["path"] = "WS".into();
                format!(
                    "{{\"op\":\"create\",\"args\":{create}}} on ROOT/run/fsd.sock (a new connection per request); mountctl commit ID; {{\"op\":\"remove\",\"args\":{{\"workspace\":ID,\"force\":true}}}}"
                )
            } else {
                format!(
                    "mountctl --root ROOT --json create bench {} --path WS; mountctl commit ID; mountctl remove ID --force",
                    self.args.join(" ")
                )
            },
        )
    }

    fn speed(&self) -> Speed {
        self.speed
    }

    fn backing(&self) -> Vec<PathBuf> {
        vec![self.store.root.join("cache")]
    }

    fn disk_fs(&self) -> Option<PathBuf> {
        self.fs.as_ref().map(|f| f.mnt.clone())
    }

    fn create(&self, dir: &Path) -> Result<Workspace> {
        std::fs::create_dir_all(dir)?;
        let path = self.ws_path(dir);
        let guard = DirGuard::adopt(path.clone());
        let v = if self.socket {
            let path = path.to_str().context("workspace path is not UTF-8")?;
            let mut args = self.socket_args();
            args["path"] = path.into();
            let r = self.request("create", args)?;
            serde_json::json!({"id": r["id"], "path": r["path"]})
        } else {
            let mut args: Vec<&std::ffi::OsStr> = vec!["create".as_ref(), "bench".as_ref()];
            args.extend(self.args.iter().map(|a| std::ffi::OsStr::new(*a)));
            args.extend(["--path".as_ref(), path.as_os_str()]);
            self.mountctl().json(&self.store.root, &args)?
        };
        let ws = v["id"]
            .as_str()
            .context("mountctl create printed no workspace id")?;
        let private = self.store.root.join("workspaces").join(ws);
        anyhow::ensure!(
            private.is_dir(),
            "workspace {ws}'s private state is not at {} (needed for its disk cost)",
            private.display()
        );
        let path = v["path"].as_str().map_or(path, PathBuf::from);
        Ok(Workspace {
            cost_dirs: vec![private],
            has_git: path.join(".git").exists(),
            path,
            id: Some(ws.to_string()),
            mount: None,
            guard,
        })
    }

    fn commit(&self, ws: &Workspace) -> Result<bool> {
        let id = ws.id.clone().context("workspace id")?;
        self.mountctl()
            .json(&self.store.root, &["commit".as_ref(), id.as_ref()])?;
        Ok(true)
    }

    fn daemon_rss(&self) -> Option<(u64, u64)> {
        let pid = self.store.daemon_pid()?;
        Some((
            proc_status_bytes(pid, "VmRSS")?,
            proc_status_bytes(pid, "VmHWM")?,
        ))
    }

    fn reset_peak_rss(&self) {
        // `5`: the peak resident size set to the current one (Linux 4.0 and later).
        if let Some(pid) = self.store.daemon_pid()
            && let Err(e) = std::fs::write(format!("/proc/{pid}/clear_refs"), "5")
        {
            eprintln!("bench: resetting the daemon's peak RSS (pid {pid}): {e}");
        }
    }

    fn remove(&self, ws: Workspace) -> Result<()> {
        let id = ws.id.clone().context("workspace id")?;
        if self.socket {
            self.request(
                "remove",
                serde_json::json!({"workspace": id, "force": true}),
            )?;
        } else {
            self.mountctl().json(
                &self.store.root,
                &["remove".as_ref(), id.as_ref(), "--force".as_ref()],
            )?;
        }
        ws.guard.remove()
    }
}
