//! Sandbox start: time from starting `mountctl run WS -- /bin/true` to its exit,
//! beside `bwrap --unshare-all --unshare-user … /bin/true` and `unshare -Urmnpf
//! /bin/true`, alternating one start at a time (`--fast-loop` starts per method).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;

use anyhow::Result;

use super::{Ctx, Method, MethodInfo, Prepared, Sample, Section, metric};
use crate::cancel::DirGuard;
use crate::mountctl::StoreGuard;
use crate::proc::{self, timed};
use crate::results::{Better, MetricDef, Role};

const IDS: &[&str] = &["mountctl-run", "bwrap", "unshare"];

pub struct SandboxSection {
    /// The store holding the workspace `mountctl run` uses; removed on drop.
    store: Option<Arc<StoreGuard>>,
    /// The plain directory bwrap binds when there is no workspace.
    plain: Option<DirGuard>,
    notes: Vec<String>,
}

impl SandboxSection {
    pub fn new() -> Self {
        Self {
            store: None,
            plain: None,
            notes: Vec::new(),
        }
    }
}

fn bwrap_args(ws: &std::path::Path) -> Vec<std::ffi::OsString> {
    let mut a: Vec<std::ffi::OsString> = [
        "--unshare-all",
        "--unshare-user",
        "--die-with-parent",
        "--new-session",
        "--ro-bind",
        "/usr",
        "/usr",
        "--symlink",
        "usr/bin",
        "/bin",
        "--symlink",
        "usr/sbin",
        "/sbin",
        "--symlink",
        "usr/lib",
        "/lib",
        "--symlink",
        "usr/lib64",
        "/lib64",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        "--bind",
    ]
    .iter()
    .map(Into::into)
    .collect();
    a.push(ws.into());
    a.push("/workspace".into());
    a.push("/bin/true".into());
    a
}

struct Start {
    id: &'static str,
    label: &'static str,
    role: Role,
    shown: String,
    cmd: Vec<std::ffi::OsString>,
}

impl Start {
    fn command(&self) -> Command {
        let mut c = Command::new(&self.cmd[0]);
        c.args(&self.cmd[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        c
    }

    fn once(&self) -> Result<()> {
        let out = self.command().output()?;
        anyhow::ensure!(
            out.status.success(),
            "`{}` failed ({}): {}",
            self.shown,
            out.status,
            proc::tail(&out.stderr, &[])
        );
        Ok(())
    }
}

impl Method for Start {
    fn info(&self) -> MethodInfo {
        MethodInfo {
            id: self.id,
            label: self.label.into(),
            role: self.role,
            command: self.shown.clone(),
        }
    }

    fn run_once(&mut self, ctx: &Ctx, _round: usize) -> Result<Sample> {
        ctx.before_step()?;
        let (_, t) = timed(|| self.once())?;
        Ok(vec![("start_s", t.wall_s())])
    }
}

impl Section for SandboxSection {
    fn id(&self) -> &'static str {
        "sandbox"
    }

    fn title(&self) -> String {
        "Sandbox start: /bin/true in a workspace's sandbox".into()
    }

    fn description(&self) -> String {
        "One run = one start: the time from spawning the command to its exit (wall clock, \
         including process start), `/bin/true` as the sandboxed program. The methods \
         alternate start by start."
            .into()
    }

    fn metrics(&self) -> Vec<MetricDef> {
        vec![MetricDef {
            show_p99: true,
            ..metric("start_s", "start to exit of /bin/true", "s", Better::Lower)
        }]
    }

    fn method_ids(&self) -> Vec<&'static str> {
        IDS.to_vec()
    }

    fn notes(&self) -> Vec<String> {
        self.notes.clone()
    }

    fn rounds(&self, _runs: usize, ctx: &Ctx) -> usize {
        ctx.fast_loop
    }

    fn verbose_runs(&self) -> bool {
        false
    }

    fn prepare(&mut self, ctx: &Ctx, selected: &dyn Fn(&str) -> bool) -> Result<Vec<Prepared>> {
        let mut out = Vec::new();
        // The workspace `mountctl run` uses (and bwrap binds): the corpus, view lower.
        // Its root is in the run's scratch directory, whose parents are 0755, so the
        // sandbox's unprivileged uid can traverse to it.
        let mut ws: std::result::Result<(String, PathBuf), String> = Err("not needed".into());
        if selected("mountctl-run") {
            ws = (|| -> std::result::Result<(String, PathBuf), String> {
                let mc = ctx.mountctl.clone()?;
                eprintln!(
                    "bench: sandbox: importing the corpus and creating a workspace (untimed)…"
                );
                let g =
                    StoreGuard::import(&mc, ctx.scratch_path("sandbox-store"), &ctx.corpus.tree)
                        .map(Arc::new)
                        .map_err(|e| format!("importing the corpus failed: {e:#}"))?;
                self.store = Some(g.clone());
                let path = ctx.scratch_path("sandbox-ws");
                let v = mc
                    .json(
                        &g.root,
                        &[
                            "create".as_ref(),
                            "bench".as_ref(),
                            "--path".as_ref(),
                            path.as_os_str(),
                        ],
                    )
                    .map_err(|e| format!("{e:#}"))?;
                let id = v["workspace"].as_str().unwrap_or_default().to_string();
                self.notes.push(format!(
                    "`mountctl run`'s workspace: `mountctl create bench` (default: {} materializer, {} lower) of the corpus; runtime root {}.",
                    v["materializer"].as_str().unwrap_or("?"),
                    v["lower"].as_str().unwrap_or("?"),
                    g.root.display()
                ));
                Ok((id, path))
            })();
        }
        let bind = match &ws {
            Ok((_, p)) => p.clone(),
            Err(_) => {
                let d = DirGuard::create(ctx.scratch_path("sandbox-plain"))?;
                let p = d.path().to_path_buf();
                self.plain = Some(d);
                p
            }
        };
        for &id in IDS.iter().filter(|id| selected(id)) {
            let start = match id {
                "mountctl-run" => match (&ws, &ctx.mountctl) {
                    (Ok((wsid, _)), Ok(mc)) => {
                        let root = &self.store.as_ref().expect("store with the workspace").root;
                        let mut cmd: Vec<std::ffi::OsString> = vec![
                            mc.path.clone().into(),
                            "--root".into(),
                            root.into(),
                            "run".into(),
                            wsid.into(),
                            "--".into(),
                            "/bin/true".into(),
                        ];
                        cmd.shrink_to_fit();
                        Start {
                            id,
                            label: "mountctl run WS -- /bin/true",
                            role: Role::Cowspace,
                            shown: "mountctl --root ROOT run WS -- /bin/true".into(),
                            cmd,
                        }
                    }
                    (Err(why), _) | (_, Err(why)) => {
                        out.push(skip(id, why.clone()));
                        continue;
                    }
                },
                "bwrap" => {
                    let Some(b) = proc::which("bwrap") else {
                        out.push(skip(
                            id,
                            "bwrap not found on PATH (apt-get install -y bubblewrap)".into(),
                        ));
                        continue;
                    };
                    let mut cmd = vec![b.into_os_string()];
                    cmd.extend(bwrap_args(&bind));
                    Start {
                        id,
                        label: "bwrap --unshare-all",
                        role: Role::Baseline,
                        shown: "bwrap --unshare-all --unshare-user --die-with-parent --new-session --ro-bind /usr /usr --symlink usr/bin /bin --symlink usr/sbin /sbin --symlink usr/lib /lib --symlink usr/lib64 /lib64 --proc /proc --dev /dev --tmpfs /tmp --bind WS /workspace /bin/true".into(),
                        cmd,
                    }
                }
                _ => {
                    let Some(u) = proc::which("unshare") else {
                        out.push(skip(id, "unshare not found on PATH (util-linux)".into()));
                        continue;
                    };
                    Start {
                        id,
                        label: "unshare -Urmnpf",
                        role: Role::Baseline,
                        shown: "unshare -Urmnpf /bin/true".into(),
                        cmd: vec![u.into_os_string(), "-Urmnpf".into(), "/bin/true".into()],
                    }
                }
            };
            // One untimed start: a method that cannot run here is skipped with why.
            match start.once() {
                Ok(()) => out.push(Prepared::Ready(Box::new(start))),
                Err(e) => out.push(skip(id, format!("{e:#}"))),
            }
        }
        Ok(out)
    }
}

fn skip(id: &'static str, why: String) -> Prepared {
    let (label, role) = match id {
        "mountctl-run" => ("mountctl run WS -- /bin/true", Role::Cowspace),
        "bwrap" => ("bwrap --unshare-all", Role::Baseline),
        _ => ("unshare -Urmnpf", Role::Baseline),
    };
    Prepared::Skipped(
        MethodInfo {
            id,
            label: label.into(),
            role,
            command: String::new(),
        },
        why,
    )
}
