//! Clients: what the Python and Node clients (`clients/python`, `clients/typescript`)
//! add over a few lines of raw socket code in the same language, in the same run.
//!
//! One run of a method is one long-lived process (`loop.py`, `loop.mjs`, written to the
//! run's scratch directory) that does `--fast-loop` `create`+`remove` of a workspace of
//! the corpus and then `--fast-loop` `exec -- /bin/true` into one running sandbox, each
//! timed inside the process (so interpreter start-up is not counted), after a few
//! untimed warm-up iterations; the run's figure is the median. The raw Python exec
//! speaks the keeper's `SOCK_SEQPACKET` protocol with `/dev/null` descriptors; Node has
//! no `SCM_RIGHTS`, so the raw Node exec is `mountctl exec` as a child process, as the
//! client's own is. Ratios (client ÷ raw) pair the methods run by run.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::rc::Rc;

use anyhow::{Context, Result, ensure};

use super::{Ctx, Method, MethodInfo, Prepared, Sample, Section, metric};
use crate::mountctl::{Mountctl, StoreGuard};
use crate::proc::{self, timed};
use crate::results::{Better, MethodResult, MetricDef, Role};
use crate::stats;

const PY_CLIENT: &str = "python-client";
const PY_RAW: &str = "python-raw";
const NODE_CLIENT: &str = "node-client";
const NODE_RAW: &str = "node-raw";
const IDS: &[&str] = &[PY_CLIENT, PY_RAW, NODE_CLIENT, NODE_RAW];

/// (client, raw) pairs whose ratios are derived.
const PAIRS: &[(&str, &str)] = &[(PY_CLIENT, PY_RAW), (NODE_CLIENT, NODE_RAW)];
/// (derived ratio, measured metric).
const RATIOS: &[(&str, &str)] = &[
    ("create_remove_ratio", "create_remove_s"),
    ("exec_ratio", "exec_s"),
];

const PY_SCRIPT: &str = include_str!("loop.py");
const NODE_SCRIPT: &str = include_str!("loop.mjs");
/// Untimed iterations before the timed ones, in each loop.
const WARMUP: usize = 3;
/// The workspace whose sandbox runs for the execs.
const LIVE_NAME: &str = "live";
/// Where the clients are (this source tree).
const CLIENTS_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../clients");

fn info(id: &'static str) -> MethodInfo {
    let (label, role, command) = match id {
        PY_CLIENT => (
            "Python client (cowspace.Client)",
            Role::Cowspace,
            "PYTHONPATH=clients/python/src: Client(ROOT).create(SNAP) + .remove(ID, force=True); .exec(WS, [\"/bin/true\"])",
        ),
        PY_RAW => (
            "Python, raw socket",
            Role::Baseline,
            "socket: {\"op\":\"create\"} + {\"op\":\"remove\"} lines; {\"op\":\"exec\"} then the keeper's SOCK_SEQPACKET exec with /dev/null fds (socket.send_fds)",
        ),
        NODE_CLIENT => (
            "Node client (clients/typescript)",
            Role::Cowspace,
            "await Client.connect({root}); create(SNAP) + remove(ID, {force: true}); exec(WS, ['/bin/true'])",
        ),
        _ => (
            "Node, raw socket",
            Role::Baseline,
            "net socket: {\"op\":\"create\"} + {\"op\":\"remove\"} lines; exec: spawn(mountctl exec WS -- /bin/true) (Node has no SCM_RIGHTS)",
        ),
    };
    MethodInfo {
        id,
        label: label.into(),
        role,
        command: command.into(),
    }
}

/// Stops the sandbox on drop (before its store goes).
struct Live {
    store: StoreGuard,
}

impl Drop for Live {
    fn drop(&mut self) {
        if let Err(e) = self.store.mountctl.json(
            &self.store.root,
            &["sandbox".as_ref(), "stop".as_ref(), LIVE_NAME.as_ref()],
        ) {
            eprintln!("bench: clients: stopping the sandbox: {e:#}");
        }
    }
}

/// The two loops' samples (seconds), as a loop script prints them.
#[derive(Debug, serde::Deserialize)]
struct Loops {
    create_remove: Vec<f64>,
    exec: Vec<f64>,
}

fn parse_loops(out: &str, iterations: usize) -> Result<Loops> {
    let line = out
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .with_context(|| format!("the loop printed no JSON line: {out:?}"))?;
    let l: Loops =
        serde_json::from_str(line).with_context(|| format!("the loop's line {line:?}"))?;
    ensure!(
        l.create_remove.len() == iterations && l.exec.len() == iterations,
        "the loop timed {} create+remove and {} execs, expected {iterations} each",
        l.create_remove.len(),
        l.exec.len()
    );
    ensure!(
        l.create_remove
            .iter()
            .chain(&l.exec)
            .all(|t| t.is_finite() && *t > 0.0),
        "the loop reported a time that is not positive"
    );
    Ok(l)
}

struct Loop {
    id: &'static str,
    interpreter: PathBuf,
    args: Vec<OsString>,
    env: Vec<(&'static str, OsString)>,
    _live: Rc<Live>,
}

impl Loop {
    fn run(&self, iterations: usize) -> Result<Loops> {
        let mut c = Command::new(&self.interpreter);
        c.args(&self.args)
            .arg(iterations.to_string())
            .arg(WARMUP.to_string())
            .args(self.extra())
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null());
        let out = proc::run(&mut c)?;
        parse_loops(&String::from_utf8_lossy(&out), iterations)
    }

    fn extra(&self) -> Vec<OsString> {
        let clients = Path::new(CLIENTS_DIR);
        let mc = self._live.store.mountctl.path.clone().into_os_string();
        match self.id {
            PY_CLIENT | PY_RAW => vec![clients.join("python/src").into()],
            _ => vec![clients.join("typescript/src/index.js").into(), mc],
        }
    }
}

impl Method for Loop {
    fn info(&self) -> MethodInfo {
        info(self.id)
    }

    fn run_once(&mut self, ctx: &Ctx, _round: usize) -> Result<Sample> {
        ctx.before_step()?;
        let (l, _) = timed(|| self.run(ctx.fast_loop))?;
        let med = |v: &[f64]| stats::median(v).context("no samples");
        let p90 = |v: &[f64]| stats::percentile(v, 90.0).context("no samples");
        Ok(vec![
            ("create_remove_s", med(&l.create_remove)?),
            ("create_remove_p90_s", p90(&l.create_remove)?),
            ("exec_s", med(&l.exec)?),
            ("exec_p90_s", p90(&l.exec)?),
        ])
    }
}

pub struct ClientsSection {
    notes: Vec<String>,
}

impl ClientsSection {
    pub fn new() -> Self {
        Self { notes: Vec::new() }
    }
}

/// The store, its `live` workspace and the sandbox running in it.
fn live(ctx: &Ctx, mc: &Mountctl) -> Result<(Live, String)> {
    eprintln!("bench: clients: importing the corpus and starting a sandbox (untimed)…");
    let store = StoreGuard::import(mc, ctx.scratch_path("clients-store"), &ctx.corpus.tree)?;
    let path = ctx.scratch_path("clients-live");
    let v = mc.json(
        &store.root,
        &[
            "create".as_ref(),
            "bench".as_ref(),
            "--name".as_ref(),
            LIVE_NAME.as_ref(),
            "--path".as_ref(),
            path.as_os_str(),
        ],
    )?;
    mc.json(&store.root, &["daemon".as_ref(), "start".as_ref()])?;
    let live = Live { store };
    mc.json(
        &live.store.root,
        &["sandbox".as_ref(), "start".as_ref(), LIVE_NAME.as_ref()],
    )?;
    let note = format!(
        "create+remove: `create` of snapshot `bench` (the corpus; default materializer {}, lower {}, default path) then `remove --force`; exec: into one running sandbox (`mountctl sandbox start live`, default limits). Runtime root {}.",
        v["materializer"].as_str().unwrap_or("?"),
        v["lower_kind"].as_str().unwrap_or("?"),
        live.store.root.display()
    );
    Ok((live, note))
}

impl Section for ClientsSection {
    fn id(&self) -> &'static str {
        "clients"
    }

    fn title(&self) -> String {
        "Clients: the Python and Node clients against raw socket code in the same language".into()
    }

    fn description(&self) -> String {
        "One run of a method: one long-lived process doing --fast-loop create+remove and \
         --fast-loop `exec -- /bin/true` into a running sandbox (3 untimed warm-ups each), \
         every operation timed inside the process; the run's figure is the median (p90 \
         beside it). Ratios (client ÷ raw, same language) pair the methods run by run."
            .into()
    }

    fn metrics(&self) -> Vec<MetricDef> {
        vec![
            metric(
                "create_remove_s",
                "create + remove of a workspace (the run's median)",
                "s",
                Better::Lower,
            ),
            metric(
                "create_remove_p90_s",
                "create + remove of a workspace (the run's p90)",
                "s",
                Better::Lower,
            ),
            metric(
                "create_remove_ratio",
                "create + remove: client ÷ raw socket (target ≤ 1.1)",
                "ratio",
                Better::Lower,
            ),
            metric(
                "exec_s",
                "exec -- /bin/true into a running sandbox (the run's median)",
                "s",
                Better::Lower,
            ),
            metric(
                "exec_p90_s",
                "exec -- /bin/true (the run's p90)",
                "s",
                Better::Lower,
            ),
            metric(
                "exec_ratio",
                "exec: client ÷ raw socket (target ≤ 1.1)",
                "ratio",
                Better::Lower,
            ),
        ]
    }

    fn method_ids(&self) -> Vec<&'static str> {
        IDS.to_vec()
    }

    fn notes(&self) -> Vec<String> {
        self.notes.clone()
    }

    fn derive(&self, methods: &mut [MethodResult]) {
        for (ours, base) in PAIRS {
            let Some(b) = methods
                .iter()
                .find(|m| m.id == *base)
                .map(|m| m.samples.clone())
            else {
                continue;
            };
            let Some(o) = methods.iter_mut().find(|m| m.id == *ours) else {
                continue;
            };
            for (out, measured) in RATIOS {
                let (Some(a), Some(b)) = (o.samples.get(*measured), b.get(*measured)) else {
                    continue;
                };
                let v: Vec<f64> = a.iter().zip(b).map(|(a, b)| a / b).collect();
                if !v.is_empty() {
                    o.samples.insert(out.to_string(), v);
                }
            }
        }
    }

    fn prepare(&mut self, ctx: &Ctx, selected: &dyn Fn(&str) -> bool) -> Result<Vec<Prepared>> {
        let wanted: Vec<&'static str> = IDS.iter().copied().filter(|id| selected(id)).collect();
        let skip_all = |why: String| -> Vec<Prepared> {
            wanted
                .iter()
                .map(|id| Prepared::Skipped(info(id), why.clone()))
                .collect()
        };
        let mc = match &ctx.mountctl {
            Ok(mc) => mc.clone(),
            Err(why) => return Ok(skip_all(why.clone())),
        };
        let (live, note) = match live(ctx, &mc) {
            Ok(l) => l,
            Err(e) => return Ok(skip_all(format!("{e:#}"))),
        };
        self.notes.push(note);
        let live = Rc::new(live);
        let scripts = ctx.scratch_path("clients-scripts");
        std::fs::create_dir_all(&scripts)?;
        std::fs::write(scripts.join("loop.py"), PY_SCRIPT)?;
        std::fs::write(scripts.join("loop.mjs"), NODE_SCRIPT)?;
        let python = proc::which("python3");
        let node = proc::which("node");
        let mut out = Vec::new();
        for id in wanted {
            let py = matches!(id, PY_CLIENT | PY_RAW);
            let (interp, script, missing) = if py {
                (python.clone(), "loop.py", "python3 not found on PATH")
            } else {
                (
                    node.clone(),
                    "loop.mjs",
                    "node not found on PATH (Node >= 20)",
                )
            };
            let Some(interpreter) = interp else {
                out.push(Prepared::Skipped(info(id), missing.into()));
                continue;
            };
            let mode = if matches!(id, PY_CLIENT | NODE_CLIENT) {
                "client"
            } else {
                "raw"
            };
            let m = Loop {
                id,
                args: vec![
                    scripts.join(script).into(),
                    mode.into(),
                    live.store.root.clone().into(),
                    "bench".into(),
                    LIVE_NAME.into(),
                ],
                env: vec![("PYTHONDONTWRITEBYTECODE", "1".into())],
                interpreter,
                _live: live.clone(),
            };
            // One untimed iteration: a method that cannot run here is skipped with why.
            match m.run(1) {
                Ok(_) => {
                    let v = proc::run(Command::new(&m.interpreter).arg("--version"))
                        .map(|o| String::from_utf8_lossy(&o).trim().to_string())
                        .unwrap_or_default();
                    if !v.is_empty() && !self.notes.iter().any(|n| n.contains(&v)) {
                        self.notes.push(format!("{}: {v}", m.interpreter.display()));
                    }
                    out.push(Prepared::Ready(Box::new(m)));
                }
                Err(e) => out.push(Prepared::Skipped(info(id), format!("{e:#}"))),
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn method(id: &str, samples: &[(&str, &[f64])]) -> MethodResult {
        MethodResult {
            id: id.into(),
            label: id.into(),
            role: Role::Cowspace,
            command: String::new(),
            status: crate::results::Status::Ok,
            reason: None,
            runs_completed: 0,
            samples: samples
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_vec()))
                .collect(),
            summary: BTreeMap::new(),
            notes: Vec::new(),
        }
    }

    #[test]
    fn loop_output_parses_and_must_have_every_iteration() {
        let l = parse_loops(
            "noise\n{\"create_remove\": [0.02, 0.03], \"exec\": [0.01, 0.012]}\n",
            2,
        )
        .unwrap();
        assert_eq!(l.create_remove, vec![0.02, 0.03]);
        assert!(parse_loops("{\"create_remove\": [0.02], \"exec\": [0.01, 0.01]}", 2).is_err());
        assert!(parse_loops("{\"create_remove\": [0, 1], \"exec\": [1, 1]}", 2).is_err());
        assert!(parse_loops("Traceback", 2).is_err());
    }

    #[test]
    fn derive_pairs_each_client_with_the_raw_socket_of_its_language() {
        let s = ClientsSection::new();
        let mut ms = vec![
            method(
                PY_CLIENT,
                &[("exec_s", &[0.011, 0.02]), ("create_remove_s", &[0.05])],
            ),
            method(
                PY_RAW,
                &[("exec_s", &[0.010, 0.01]), ("create_remove_s", &[0.05])],
            ),
            method(NODE_CLIENT, &[("exec_s", &[0.03])]),
        ];
        s.derive(&mut ms);
        let e = &ms[0].samples["exec_ratio"];
        assert!((e[0] - 1.1).abs() < 1e-9 && (e[1] - 2.0).abs() < 1e-9);
        assert!((ms[0].samples["create_remove_ratio"][0] - 1.0).abs() < 1e-9);
        assert!(!ms[1].samples.contains_key("exec_ratio"));
        assert!(
            !ms[2].samples.contains_key("exec_ratio"),
            "no node-raw: no ratio"
        );
        let declared: Vec<String> = s.metrics().into_iter().map(|m| m.id).collect();
        for m in &ms {
            for k in m.samples.keys() {
                assert!(declared.contains(k), "{k} is not declared");
            }
        }
    }

    #[test]
    fn the_loop_scripts_take_the_arguments_bench_gives() {
        // MODE ROOT SNAPSHOT WORKSPACE ITERATIONS WARMUP + the client's location.
        assert!(PY_SCRIPT.contains("mode, root, snapshot, workspace = sys.argv[1:5]"));
        assert!(PY_SCRIPT.contains("client_src = sys.argv[7]"));
        assert!(NODE_SCRIPT.contains(
            "const [mode, root, snapshot, workspace, iters, warm, clientIndex, mountctl] = process.argv.slice(2);"
        ));
    }
}
