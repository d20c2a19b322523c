//! Network: what the egress proxy of `--net egress` costs a sandbox's traffic, on
//! loopback, each figure beside the same client on the host going straight to the origin,
//! in the same run.
//!
//! The origin ([`origin`]) is a thread server of this process on the host's 127.0.0.1,
//! answering from memory. The sandbox (`mountctl sandbox start net --net egress
//! --add-host origin.test:127.0.0.1 --allow-host origin.test:PORT`) reaches it only
//! through its proxy; the host's client reaches it at 127.0.0.1:PORT. One run of a method
//! does, in order: a 1 GiB download as plain HTTP through the proxy (curl's
//! `http_proxy`), a 1 GiB download through a `CONNECT` tunnel (`curl -p`; direct: a
//! second plain download), 1,000 short requests with a new connection each and 1,000 on
//! one kept-alive connection (one Python process), `pip install six idna` from the
//! origin's package index, and 1,000 connections held open at once (the proxy's `VmRSS`
//! read while they are held). The clients and why they were chosen: [`clients`]; one
//! method's run: [`method`].
//!
//! Paired figures (proxy ÷ direct, proxy − direct) are computed run by run
//! ([`Section::derive`]): the two methods alternate within each round, so a round's pair
//! saw the same machine.

pub(crate) mod clients;
mod method;
mod origin;

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use anyhow::Result;

use super::{Ctx, Prepared, Section, metric};
use crate::cancel::DirGuard;
use crate::mountctl::{Mountctl, StoreGuard, proc_status_bytes};
use crate::proc;
use crate::results::{Better, MethodResult, MetricDef};
use clients::{HOLD_CONNECTIONS, REQUESTS};
use method::{Client, Side, info};
use origin::{Origin, Routes};

const PROXY_ID: &str = "egress-proxy";
const DIRECT_ID: &str = "direct";
const IDS: &[&str] = &[PROXY_ID, DIRECT_ID];

/// Length of each bulk download.
const BULK_BYTES: u64 = 1 << 30;
/// The same with `--quick` (a smoke test).
const QUICK_BULK_BYTES: u64 = 64 << 20;
/// The origin's name inside the sandbox (`--add-host`, `--allow-host`).
const ORIGIN_NAME: &str = "origin.test";
/// The sandbox's workspace name.
const SANDBOX_NAME: &str = "net";
/// The wheels `scripts/setup.sh` downloads (six and idna), as the e2e tests find them.
const WHEELHOUSE_ENV: &str = "COWSPACE_TEST_WHEELS";
const WHEELHOUSE_DEFAULT: &str = "/var/cache/cowspace/test-wheels";
const PIP_PACKAGES: &[&str] = &["six", "idna"];
/// Every client runs under `timeout` with this bound (seconds), on both sides: a bound
/// against hangs, never a measurement.
const CLIENT_TIMEOUT_S: &str = "600";
const PYTHON: &str = "/usr/bin/python3";
const LATENCY_SCRIPT: &str = "latency.py";
const HOLD_SCRIPT: &str = "hold.py";
/// The whole environment of the host's clients: what a sandbox's command gets, less the
/// proxy variables (direct means direct). The host's own (here `PIP_FIND_LINKS`,
/// `PYTHONDONTWRITEBYTECODE`, …) would make pip on the host a different client.
const DIRECT_ENV: &[(&str, &str)] = &[
    (
        "PATH",
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    ),
    ("HOME", "/root"),
    ("LANG", "C.UTF-8"),
];

/// (derived metric, measured metric, how the proxy's run and direct's run combine).
const PAIRED: &[(&str, &str, Pair)] = &[
    ("download_ratio", "download_mbps", Pair::Ratio),
    (
        "download_connect_ratio",
        "download_connect_mbps",
        Pair::Ratio,
    ),
    ("request_added_s", "request_s", Pair::Difference),
    (
        "request_keepalive_added_s",
        "request_keepalive_s",
        Pair::Difference,
    ),
    ("pip_ratio", "pip_install_s", Pair::Ratio),
];

#[derive(Debug, Clone, Copy)]
enum Pair {
    Ratio,
    Difference,
}

/// Stops the sandbox on drop (before its store goes).
struct SandboxGuard {
    mountctl: Mountctl,
    root: PathBuf,
}

impl Drop for SandboxGuard {
    fn drop(&mut self) {
        if let Err(e) = self.mountctl.json(
            &self.root,
            &["sandbox".as_ref(), "stop".as_ref(), SANDBOX_NAME.as_ref()],
        ) {
            eprintln!("bench: network: stopping the sandbox: {e:#}");
        }
    }
}

pub struct NetworkSection {
    notes: Rc<RefCell<Vec<String>>>,
    // Dropped in this order: the sandbox, its store, the origin, the fixtures.
    sandbox: Option<SandboxGuard>,
    store: Option<StoreGuard>,
    origin: Option<Origin>,
    fixtures: Option<DirGuard>,
    pip_dir: Option<DirGuard>,
}

impl NetworkSection {
    pub fn new() -> Self {
        Self {
            notes: Rc::new(RefCell::new(Vec::new())),
            sandbox: None,
            store: None,
            origin: None,
            fixtures: None,
            pip_dir: None,
        }
    }

    fn note(&self, n: String) {
        self.notes.borrow_mut().push(n);
    }
}

fn skip(id: &'static str, why: String) -> Prepared {
    Prepared::Skipped(info(id), why)
}

/// Raises this process's open-file limit to its hard limit: the origin holds a
/// connection per held client connection.
fn raise_nofile() -> Result<u64> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    }
    Ok(hard)
}

/// A directory for the host's pip targets on tmpfs (the sandbox's `/tmp` is one), else
/// in the run's scratch directory.
fn pip_dir(ctx: &Ctx) -> Result<(DirGuard, &'static str)> {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        let p = shm.join(format!("cowspace-bench-pip-{}", std::process::id()));
        if let Ok(g) = DirGuard::create(p) {
            return Ok((g, "tmpfs (/dev/shm)"));
        }
    }
    Ok((
        DirGuard::create(ctx.scratch_path("network-pip"))?,
        "the run's scratch directory",
    ))
}

impl Section for NetworkSection {
    fn id(&self) -> &'static str {
        "network"
    }

    fn title(&self) -> String {
        "Network: a sandbox's traffic through the egress proxy, against the same client on the host"
            .into()
    }

    fn description(&self) -> String {
        format!(
            "One run of a method: a 1 GiB download (64 MiB with --quick) as plain HTTP and one through a CONNECT tunnel \
             (curl; direct: two plain downloads), {REQUESTS} short requests with a new connection \
             each and {REQUESTS} on one kept-alive connection (one Python process; per-request \
             median), `pip install six idna` from a package index the bench serves, and \
             {HOLD_CONNECTIONS} connections held open at once. Everything on loopback: the origin \
             is a thread of bench on the host's 127.0.0.1, answering from memory. Ratios and \
             added times pair the two methods run by run."
        )
    }

    fn metrics(&self) -> Vec<MetricDef> {
        vec![
            metric(
                "download_mbps",
                "bulk download, plain HTTP (curl)",
                "MB/s",
                Better::Higher,
            ),
            metric(
                "download_ratio",
                "bulk download, plain HTTP: proxy ÷ direct (target ≥ 0.8)",
                "ratio",
                Better::Higher,
            ),
            metric(
                "download_connect_mbps",
                "bulk download through a CONNECT tunnel (direct: a second plain download)",
                "MB/s",
                Better::Higher,
            ),
            metric(
                "download_connect_ratio",
                "bulk download, CONNECT tunnel: proxy ÷ direct (target ≥ 0.8)",
                "ratio",
                Better::Higher,
            ),
            metric(
                "proxy_cpu_per_gib_s",
                "proxy CPU time (user + system) per GiB, plain HTTP",
                "s",
                Better::Lower,
            ),
            metric(
                "proxy_cpu_connect_per_gib_s",
                "proxy CPU time (user + system) per GiB, CONNECT tunnel",
                "s",
                Better::Lower,
            ),
            metric(
                "request_s",
                "short request, new connection each (median of 1,000)",
                "s",
                Better::Lower,
            ),
            metric(
                "request_p99_s",
                "short request, new connection each (p99 of 1,000)",
                "s",
                Better::Lower,
            ),
            metric(
                "request_added_s",
                "added per request, new connection: proxy − direct medians (target ≤ 0.3 ms)",
                "s",
                Better::Lower,
            ),
            metric(
                "request_keepalive_s",
                "short request on one kept-alive connection (median of 1,000)",
                "s",
                Better::Lower,
            ),
            metric(
                "request_keepalive_added_s",
                "added per request, kept alive: proxy − direct medians",
                "s",
                Better::Lower,
            ),
            metric(
                "pip_install_s",
                "pip install six idna (--no-cache-dir)",
                "s",
                Better::Lower,
            ),
            metric(
                "pip_ratio",
                "pip install: proxy ÷ direct (target ≤ 1.2)",
                "ratio",
                Better::Lower,
            ),
            metric(
                "held_connections",
                "connections held open at once, of 1,000 (target ≥ 1,000)",
                "count",
                Better::Higher,
            ),
            metric(
                "proxy_rss_idle_bytes",
                "proxy VmRSS right before the connections are opened",
                "bytes",
                Better::Lower,
            ),
            metric(
                "proxy_rss_held_bytes",
                "proxy VmRSS with the connections held",
                "bytes",
                Better::Lower,
            ),
        ]
    }

    fn method_ids(&self) -> Vec<&'static str> {
        IDS.to_vec()
    }

    fn notes(&self) -> Vec<String> {
        self.notes.borrow().clone()
    }

    fn derive(&self, methods: &mut [MethodResult]) {
        let Some(base) = methods.iter().find(|m| m.id == DIRECT_ID) else {
            return;
        };
        let base = base.samples.clone();
        let Some(ours) = methods.iter_mut().find(|m| m.id == PROXY_ID) else {
            return;
        };
        for (out, measured, how) in PAIRED {
            let (Some(a), Some(b)) = (ours.samples.get(*measured), base.get(*measured)) else {
                continue;
            };
            let v = clients::paired(a, b, |a, b| match how {
                Pair::Ratio => a / b,
                Pair::Difference => a - b,
            });
            if !v.is_empty() {
                ours.samples.insert(out.to_string(), v);
            }
        }
    }

    fn prepare(&mut self, ctx: &Ctx, selected: &dyn Fn(&str) -> bool) -> Result<Vec<Prepared>> {
        let mut out = Vec::new();
        let Some(curl) = proc::which("curl") else {
            for id in IDS.iter().filter(|id| selected(id)) {
                out.push(skip(
                    id,
                    "curl not found on PATH (apt-get install -y curl)".into(),
                ));
            }
            return Ok(out);
        };
        let nofile = raise_nofile()?;
        let bulk_bytes = if ctx.quick {
            QUICK_BULK_BYTES
        } else {
            BULK_BYTES
        };
        let mut routes = Routes::new(bulk_bytes);
        let wheels =
            PathBuf::from(std::env::var(WHEELHOUSE_ENV).unwrap_or(WHEELHOUSE_DEFAULT.into()));
        let projects = routes.add_wheelhouse(&wheels).unwrap_or_default();
        let pip = PIP_PACKAGES.iter().all(|p| projects.iter().any(|q| q == p));
        if !pip {
            self.note(format!(
                "No pip figures: {} lacks wheels of {} (scripts/setup.sh downloads them).",
                wheels.display(),
                PIP_PACKAGES.join(" and ")
            ));
        }
        let origin = Origin::serve(routes)?;
        let port = origin.port;
        self.origin = Some(origin);
        let fixtures = DirGuard::create(ctx.scratch_path("network-src"))?;
        std::fs::write(fixtures.path().join(LATENCY_SCRIPT), clients::LATENCY_PY)?;
        std::fs::write(fixtures.path().join(HOLD_SCRIPT), clients::HOLD_PY)?;
        let scripts = fixtures.path().to_path_buf();
        self.fixtures = Some(fixtures);
        let (pip_guard, pip_where) = pip_dir(ctx)?;
        let pip_path = pip_guard.path().to_path_buf();
        self.pip_dir = Some(pip_guard);
        self.note(format!(
            "Origin: bench's own HTTP/1.1 server on 127.0.0.1:{port}, from memory; the sandbox \
             names it {ORIGIN_NAME} (`--add-host {ORIGIN_NAME}:127.0.0.1 --allow-host \
             {ORIGIN_NAME}:{port}`). Clients: {} (curl), {PYTHON} (urllib, then http.client \
             kept alive; pip {}), the same binaries on both sides; the host's clients run with \
             the sandbox's environment less its proxy variables (PATH, HOME=/root, LANG). pip targets: the sandbox's /tmp (tmpfs) against {pip_where}. \
             bench's open-file limit: {nofile}.",
            curl.display(),
            PIP_PACKAGES.join(", ")
        ));

        let notes = self.notes.clone();
        let make = |id: &'static str, side: Side| Client {
            id,
            side,
            port,
            curl: curl.clone(),
            bulk_bytes,
            pip,
            notes: notes.clone(),
        };
        if selected(DIRECT_ID) {
            let c = make(
                DIRECT_ID,
                Side::Direct {
                    scripts,
                    pip_dir: pip_path,
                },
            );
            match c.run(&c.curl(false, "/small")) {
                Ok(_) => out.push(Prepared::Ready(Box::new(c))),
                Err(e) => out.push(skip(DIRECT_ID, format!("{e:#}"))),
            }
        }
        if selected(PROXY_ID) {
            match self.sandbox(ctx, port) {
                Ok(side) => {
                    let c = make(PROXY_ID, side);
                    match c.run(&c.curl(false, "/small")) {
                        Ok(_) => out.push(Prepared::Ready(Box::new(c))),
                        Err(e) => out.push(skip(PROXY_ID, format!("{e:#}"))),
                    }
                }
                Err(why) => out.push(skip(PROXY_ID, why)),
            }
        }
        Ok(out)
    }
}

impl NetworkSection {
    /// Imports the client scripts, makes a workspace of them and starts its sandbox with
    /// egress allowed to the origin only.
    fn sandbox(&mut self, ctx: &Ctx, port: u16) -> std::result::Result<Side, String> {
        if !ctx.is_root {
            return Err("sandboxes need root here (run bench as root)".into());
        }
        let mc = ctx.mountctl.clone()?;
        let src = self
            .fixtures
            .as_ref()
            .expect("fixtures made first")
            .path()
            .to_path_buf();
        eprintln!("bench: network: a workspace of the client scripts and its sandbox (untimed)…");
        let store = StoreGuard::import(&mc, ctx.scratch_path("network-store"), &src)
            .map_err(|e| format!("importing the client scripts failed: {e:#}"))?;
        let root = store.root.clone();
        self.store = Some(store);
        let ws = ctx.scratch_path("network-ws");
        mc.json(
            &root,
            &[
                "create".as_ref(),
                "bench".as_ref(),
                "--name".as_ref(),
                SANDBOX_NAME.as_ref(),
                "--path".as_ref(),
                ws.as_os_str(),
            ],
        )
        .map_err(|e| format!("{e:#}"))?;
        let add = format!("{ORIGIN_NAME}:127.0.0.1");
        let allow = format!("{ORIGIN_NAME}:{port}");
        let v = mc
            .json(
                &root,
                &[
                    "sandbox".as_ref(),
                    "start".as_ref(),
                    SANDBOX_NAME.as_ref(),
                    "--net".as_ref(),
                    "egress".as_ref(),
                    "--add-host".as_ref(),
                    add.as_ref(),
                    "--allow-host".as_ref(),
                    allow.as_ref(),
                ],
            )
            .map_err(|e| format!("starting the sandbox with --net egress failed: {e:#}"))?;
        self.sandbox = Some(SandboxGuard {
            mountctl: mc.clone(),
            root: root.clone(),
        });
        let status = mc
            .json(
                &root,
                &["sandbox".as_ref(), "status".as_ref(), SANDBOX_NAME.as_ref()],
            )
            .unwrap_or(v);
        let proxy_pid = status["egress"]["proxy_pid"]
            .as_u64()
            .and_then(|p| u32::try_from(p).ok())
            .ok_or_else(|| format!("the sandbox's status has no egress.proxy_pid: {status}"))?;
        let fresh = proc_status_bytes(proxy_pid, "VmRSS");
        let threads = std::fs::read_to_string(format!("/proc/{proxy_pid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Threads:").map(|t| t.trim().to_string()))
            })
            .unwrap_or_else(|| "?".into());
        self.note(format!(
            "The proxy (`{}`, pid {proxy_pid}) just after `sandbox start`: VmRSS {}, {threads} threads.",
            std::fs::read(format!("/proc/{proxy_pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).replace('\0', " ").trim().to_string())
                .unwrap_or_else(|_| "?".into()),
            fresh.map_or("?".into(), |b| crate::report::human_bytes(b as f64))
        ));
        Ok(Side::Proxy {
            mountctl: mc,
            root,
            proxy_pid,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::Role;
    use std::collections::BTreeMap;

    fn method(id: &str, samples: &[(&str, &[f64])]) -> MethodResult {
        MethodResult {
            id: id.into(),
            label: id.into(),
            role: Role::Baseline,
            command: String::new(),
            status: crate::results::Status::Ok,
            reason: None,
            runs_completed: 0,
            samples: samples
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_vec()))
                .collect::<BTreeMap<_, _>>(),
            summary: BTreeMap::new(),
            notes: Vec::new(),
        }
    }

    #[test]
    fn paired_figures_are_derived_run_by_run_and_declared() {
        let s = NetworkSection::new();
        let mut ms = vec![
            method(
                PROXY_ID,
                &[
                    ("download_mbps", &[800.0, 900.0]),
                    ("request_s", &[0.0012, 0.0011]),
                    ("pip_install_s", &[1.1]),
                ],
            ),
            method(
                DIRECT_ID,
                &[
                    ("download_mbps", &[1000.0, 1000.0]),
                    ("request_s", &[0.0010, 0.0010]),
                    ("pip_install_s", &[1.0, 1.0]),
                ],
            ),
        ];
        s.derive(&mut ms);
        let p = &ms[0].samples;
        assert_eq!(p["download_ratio"], vec![0.8, 0.9]);
        let added = &p["request_added_s"];
        assert!((added[0] - 0.0002).abs() < 1e-12 && (added[1] - 0.0001).abs() < 1e-12);
        assert_eq!(p["pip_ratio"].len(), 1, "only the runs both completed");
        assert!(
            !p.contains_key("download_connect_ratio"),
            "nothing measured"
        );
        assert!(!ms[1].samples.contains_key("download_ratio"));
        let declared: Vec<String> = s.metrics().into_iter().map(|m| m.id).collect();
        for (out, measured, _) in PAIRED {
            assert!(declared.iter().any(|d| d == out), "{out}");
            assert!(declared.iter().any(|d| d == measured), "{measured}");
        }
    }

    #[test]
    fn derive_without_a_baseline_changes_nothing() {
        let s = NetworkSection::new();
        let mut ms = vec![method(PROXY_ID, &[("download_mbps", &[800.0])])];
        s.derive(&mut ms);
        assert_eq!(ms[0].samples.len(), 1);
    }
}
