//! Sandboxes: `mountctl run WS -- /bin/true` (start, one command, stop), `mountctl
//! sandbox start WS` to ready (then stopped, untimed), and `mountctl exec WS --
//! /bin/true` into a running sandbox, beside `bwrap --unshare-all --unshare-user …
//! /bin/true`, `unshare -Urmnpf /bin/true` and `nsenter -t INIT -a /bin/true` into the
//! same running sandbox (the floor for an exec), alternating one at a time
//! (`--fast-loop` per method). With a VM placement available: `sandbox start WS --vm`
//! to ready, `exec WS -- /bin/true` into a running VM and `run WS --vm -- /bin/true`,
//! the accelerator in their labels (the boots are slow methods: `--slow-runs` each).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;

use anyhow::Result;

use super::{Ctx, Method, MethodInfo, Prepared, Sample, Section, metric};
use crate::cancel::DirGuard;
use crate::mountctl::StoreGuard;
use crate::proc::{self, timed};
use crate::results::{Better, MetricDef, Role};

const IDS: &[&str] = &[
    "mountctl-run",
    "mountctl-start",
    "mountctl-exec",
    "nsenter",
    "bwrap",
    "unshare",
    "vm-start",
    "vm-exec",
    "vm-run",
];

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
    label: String,
    role: Role,
    shown: String,
    cmd: Vec<std::ffi::OsString>,
    /// Run after each timed start, untimed (`sandbox stop` after `sandbox start`).
    after: Option<Box<Start>>,
    /// Runs only `--slow-runs` rounds (a VM boot).
    slow: bool,
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
            label: self.label.clone(),
            role: self.role,
            command: self.shown.clone(),
        }
    }

    fn slow(&self) -> bool {
        self.slow
    }

    fn run_once(&mut self, ctx: &Ctx, _round: usize) -> Result<Sample> {
        ctx.before_step()?;
        let (_, t) = timed(|| self.once())?;
        if let Some(stop) = &self.after {
            stop.once()?;
        }
        Ok(vec![("start_s", t.wall_s())])
    }
}

impl Section for SandboxSection {
    fn id(&self) -> &'static str {
        "sandbox"
    }

    fn title(&self) -> String {
        "Sandboxes: /bin/true in a workspace's sandbox (run, start, exec)".into()
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
            ..metric(
                "start_s",
                "spawn to exit of /bin/true (sandbox start: to ready)",
                "s",
                Better::Lower,
            )
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
                let id = v["id"].as_str().unwrap_or_default().to_string();
                self.notes.push(format!(
                    "`mountctl run`'s workspace: `mountctl create bench` (default: {} materializer, {} lower) of the corpus; runtime root {}.",
                    v["materializer"].as_str().unwrap_or("?"),
                    v["lower_kind"].as_str().unwrap_or("?"),
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
                            label: "mountctl run WS -- /bin/true".into(),
                            role: Role::Cowspace,
                            shown: "mountctl --root ROOT run WS -- /bin/true".into(),
                            cmd,
                            after: None,
                            slow: false,
                        }
                    }
                    (Err(why), _) | (_, Err(why)) => {
                        out.push(skip(id, why.clone()));
                        continue;
                    }
                },
                "mountctl-start" | "mountctl-exec" | "nsenter" => match self.long_lived(ctx, id) {
                    Ok(start) => start,
                    Err(why) => {
                        out.push(skip(id, why));
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
                        label: "bwrap --unshare-all".into(),
                        role: Role::Baseline,
                        shown: "bwrap --unshare-all --unshare-user --die-with-parent --new-session --ro-bind /usr /usr --symlink usr/bin /bin --symlink usr/sbin /sbin --symlink usr/lib /lib --symlink usr/lib64 /lib64 --proc /proc --dev /dev --tmpfs /tmp --bind WS /workspace /bin/true".into(),
                        cmd,
                        after: None,
                        slow: false,
                    }
                }
                "vm-start" | "vm-exec" | "vm-run" => match self.vm(ctx, id) {
                    Ok(start) => start,
                    Err(why) => {
                        out.push(skip(id, why));
                        continue;
                    }
                },
                _ => {
                    let Some(u) = proc::which("unshare") else {
                        out.push(skip(id, "unshare not found on PATH (util-linux)".into()));
                        continue;
                    };
                    Start {
                        id,
                        label: "unshare -Urmnpf".into(),
                        role: Role::Baseline,
                        shown: "unshare -Urmnpf /bin/true".into(),
                        cmd: vec![u.into_os_string(), "-Urmnpf".into(), "/bin/true".into()],
                        after: None,
                        slow: false,
                    }
                }
            };
            // One untimed start: a method that cannot run here is skipped with why.
            match start
                .once()
                .and_then(|()| start.after.as_ref().map_or(Ok(()), |a| a.once()))
            {
                Ok(()) => out.push(Prepared::Ready(Box::new(start))),
                Err(e) => out.push(skip(id, format!("{e:#}"))),
            }
        }
        Ok(out)
    }
}

impl SandboxSection {
    /// A workspace of the section's store for the long-lived methods (made once each).
    fn workspace(&mut self, ctx: &Ctx, name: &str) -> std::result::Result<PathBuf, String> {
        let mc = ctx.mountctl.clone()?;
        let store = match &self.store {
            Some(s) => s.clone(),
            None => {
                let g =
                    StoreGuard::import(&mc, ctx.scratch_path("sandbox-store"), &ctx.corpus.tree)
                        .map(Arc::new)
                        .map_err(|e| format!("importing the corpus failed: {e:#}"))?;
                self.store = Some(g.clone());
                g
            }
        };
        let path = ctx.scratch_path(&format!("sandbox-{name}"));
        if !path.exists() {
            mc.json(
                &store.root,
                &[
                    "create".as_ref(),
                    "bench".as_ref(),
                    "--name".as_ref(),
                    name.as_ref(),
                    "--path".as_ref(),
                    path.as_os_str(),
                ],
            )
            .map_err(|e| format!("{e:#}"))?;
        }
        Ok(store.root.clone())
    }

    fn long_lived(&mut self, ctx: &Ctx, id: &'static str) -> std::result::Result<Start, String> {
        let mc = ctx.mountctl.clone()?;
        let base = |root: &std::path::Path, args: &[&str]| -> Vec<std::ffi::OsString> {
            let mut v: Vec<std::ffi::OsString> =
                vec![mc.path.clone().into(), "--root".into(), root.into()];
            v.extend(args.iter().map(Into::into));
            v
        };
        if id == "mountctl-start" {
            let root = self.workspace(ctx, "cycle")?;
            return Ok(Start {
                id,
                label: "mountctl sandbox start WS (to ready)".into(),
                role: Role::Cowspace,
                shown: "mountctl --root ROOT sandbox start WS (then `sandbox stop WS`, untimed)"
                    .into(),
                cmd: base(&root, &["-q", "sandbox", "start", "cycle"]),
                after: Some(Box::new(Start {
                    id,
                    label: String::new(),
                    role: Role::Cowspace,
                    shown: "mountctl sandbox stop WS".into(),
                    cmd: base(&root, &["-q", "sandbox", "stop", "cycle"]),
                    after: None,
                    slow: false,
                })),
                slow: false,
            });
        }
        // exec and nsenter share one running sandbox.
        let root = self.workspace(ctx, "live")?;
        let status = mc.json(
            &root,
            &["sandbox".as_ref(), "status".as_ref(), "live".as_ref()],
        );
        let init = match status {
            Ok(v) => v["init_pid"].as_i64(),
            Err(_) => mc
                .json(
                    &root,
                    &["sandbox".as_ref(), "start".as_ref(), "live".as_ref()],
                )
                .map_err(|e| format!("starting the sandbox failed: {e:#}"))?["init_pid"]
                .as_i64(),
        }
        .ok_or("the sandbox's status has no init_pid")?;
        if !self.notes.iter().any(|n| n.contains("running sandbox")) {
            self.notes.push(
                "`mountctl exec` and `nsenter` go into one running sandbox (`mountctl sandbox \
                 start live`, default limits); `nsenter -a` enters its namespaces as root with \
                 none of the sandbox's other controls (the floor for an exec)."
                    .into(),
            );
        }
        Ok(if id == "mountctl-exec" {
            Start {
                id,
                label: "mountctl exec WS -- /bin/true".into(),
                role: Role::Cowspace,
                shown: "mountctl --root ROOT exec WS -- /bin/true".into(),
                cmd: base(&root, &["exec", "live", "--", "/bin/true"]),
                after: None,
                slow: false,
            }
        } else {
            let n = proc::which("nsenter").ok_or("nsenter not found on PATH (util-linux)")?;
            Start {
                id,
                label: "nsenter -t INIT -a /bin/true".into(),
                role: Role::Baseline,
                shown: "nsenter -t INIT_PID -a /bin/true (into the running sandbox)".into(),
                cmd: vec![
                    n.into_os_string(),
                    "-t".into(),
                    init.to_string().into(),
                    "-a".into(),
                    "/bin/true".into(),
                ],
                after: None,
                slow: false,
            }
        })
    }

    /// The VM methods: refused (skipped with why) where `doctor` finds no VM placement.
    /// Software emulation is accepted: the label and a note name the accelerator.
    fn vm(&mut self, ctx: &Ctx, id: &'static str) -> std::result::Result<Start, String> {
        let mc = ctx.mountctl.clone()?;
        let name = match id {
            "vm-start" => "vmcycle",
            "vm-exec" => "vmlive",
            _ => "vmrun",
        };
        let root = self.workspace(ctx, name)?;
        let vm = mc
            .json(&root, &["doctor".as_ref()])
            .map_err(|e| format!("mountctl doctor failed: {e:#}"))?["vm"]
            .clone();
        if vm["available"] != true {
            return Err(format!("no VM placement here: {}", vm["missing"]));
        }
        let accel = vm["accel"].as_str().unwrap_or("?").to_string();
        if !self.notes.iter().any(|n| n.contains("VM methods")) {
            self.notes.push(format!(
                "VM methods: accelerator {accel}, isolation {}: {}. Under software emulation \
                 (tcg) the figures describe emulation, not the product. The boots are slow \
                 methods (`--slow-runs` each); `mountctl exec` goes into one running VM \
                 (`sandbox start vmlive --vm`, 256 MiB, 1 vCPU).",
                vm["isolation"].as_str().unwrap_or("?"),
                vm["reason"].as_str().unwrap_or("")
            ));
        }
        let base = |args: &[&str]| -> Vec<std::ffi::OsString> {
            let mut v: Vec<std::ffi::OsString> =
                vec![mc.path.clone().into(), "--root".into(), root.clone().into()];
            v.extend(args.iter().map(Into::into));
            v
        };
        let accept = "--accept-emulation";
        Ok(match id {
            "vm-start" => Start {
                id,
                label: format!("mountctl sandbox start WS --vm (to ready; accel {accel})"),
                role: Role::Cowspace,
                shown: "mountctl --root ROOT sandbox start WS --vm --accept-emulation (then `sandbox stop WS`, untimed)".into(),
                cmd: base(&["-q", "sandbox", "start", name, "--vm", accept]),
                after: Some(Box::new(Start {
                    id,
                    label: String::new(),
                    role: Role::Cowspace,
                    shown: "mountctl sandbox stop WS".into(),
                    cmd: base(&["-q", "sandbox", "stop", name]),
                    after: None,
                    slow: false,
                })),
                slow: true,
            },
            "vm-exec" => {
                let running = mc
                    .json(&root, &["sandbox".as_ref(), "status".as_ref(), name.as_ref()])
                    .is_ok();
                if !running {
                    mc.json(
                        &root,
                        &[
                            "sandbox".as_ref(),
                            "start".as_ref(),
                            name.as_ref(),
                            "--vm".as_ref(),
                            accept.as_ref(),
                        ],
                    )
                    .map_err(|e| format!("starting the VM failed: {e:#}"))?;
                }
                Start {
                    id,
                    label: format!("mountctl exec WS -- /bin/true (a running VM; accel {accel})"),
                    role: Role::Cowspace,
                    shown: "mountctl --root ROOT exec WS -- /bin/true (WS's VM running)".into(),
                    cmd: base(&["exec", name, "--", "/bin/true"]),
                    after: None,
                    slow: false,
                }
            }
            _ => Start {
                id,
                label: format!("mountctl run WS --vm -- /bin/true (accel {accel})"),
                role: Role::Cowspace,
                shown: "mountctl --root ROOT run WS --vm --accept-emulation -- /bin/true".into(),
                cmd: base(&["run", name, "--vm", accept, "--", "/bin/true"]),
                after: None,
                slow: true,
            },
        })
    }
}

fn skip(id: &'static str, why: String) -> Prepared {
    let (label, role) = match id {
        "mountctl-run" => ("mountctl run WS -- /bin/true", Role::Cowspace),
        "mountctl-start" => ("mountctl sandbox start WS (to ready)", Role::Cowspace),
        "mountctl-exec" => ("mountctl exec WS -- /bin/true", Role::Cowspace),
        "nsenter" => ("nsenter -t INIT -a /bin/true", Role::Baseline),
        "bwrap" => ("bwrap --unshare-all", Role::Baseline),
        "vm-start" => ("mountctl sandbox start WS --vm (to ready)", Role::Cowspace),
        "vm-exec" => (
            "mountctl exec WS -- /bin/true (a running VM)",
            Role::Cowspace,
        ),
        "vm-run" => ("mountctl run WS --vm -- /bin/true", Role::Cowspace),
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
