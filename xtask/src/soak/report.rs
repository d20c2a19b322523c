//! The baseline (the same builds in plain directories, no sandboxes) and the figures.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use serde_json::json;

use super::env::Env;
use super::proc::{self, quantile};
use super::worker::build_script;
use super::{FaultRecord, Opts};

/// The PATH commands see inside a sandbox.
const SANDBOX_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The baseline's result.
#[derive(Debug, Clone)]
pub struct Baseline {
    pub iterations: u64,
    pub secs: f64,
    pub median_ms: f64,
}

impl Baseline {
    pub fn per_minute(&self) -> f64 {
        self.iterations as f64 * 60.0 / self.secs
    }
}

/// Runs the build and tests in `--sandboxes` plain copies at once for `baseline_secs`.
pub fn baseline(env: &Env, opts: &Opts) -> Result<Baseline> {
    let dirs: Vec<String> = (0..opts.sandboxes)
        .map(|j| env.base.join("baseline").join(format!("b{j}")))
        .map(|d| d.to_string_lossy().to_string())
        .collect();
    for d in &dirs {
        proc::host(
            "cp",
            &["-a", &env.src.to_string_lossy(), d],
            None,
            super::env::ADMIN_DEADLINE,
        )?;
    }
    let window = Duration::from_secs(opts.baseline_secs);
    let times = Mutex::new(Vec::new());
    let errors = Mutex::new(Vec::new());
    let started = Instant::now();
    std::thread::scope(|s| {
        for d in &dirs {
            let (times, errors) = (&times, &errors);
            s.spawn(move || {
                while started.elapsed() < window && !super::interrupted() {
                    let t = Instant::now();
                    // The sandbox's PATH, so the same python3 and gcc build (a host
                    // user's PATH may put another python3 first); each build in a
                    // session of its own, as each sandbox is, so the scheduler's
                    // autogroups share the CPUs between them alike.
                    let mut c = std::process::Command::new("setsid");
                    c.args(["-w", "sh", "-c", &build_script(d)])
                        .env("PATH", SANDBOX_PATH);
                    let r = proc::spawn(c, None).and_then(|r| r.wait(Duration::from_secs(3600)));
                    let r = match r {
                        Ok(o) if o.ok() => Ok(o),
                        Ok(o) => Err(anyhow::anyhow!("{}{}", o.stdout, o.describe())),
                        Err(e) => Err(e),
                    };
                    match r {
                        Ok(_) => times.lock().unwrap().push(t.elapsed().as_secs_f64() * 1e3),
                        Err(e) => {
                            errors.lock().unwrap().push(format!("{e:#}"));
                            return;
                        }
                    }
                }
            });
        }
    });
    if let Some(e) = errors.into_inner().unwrap().into_iter().next() {
        bail!(
            "the baseline build failed in a plain directory (the host lacks what the project needs: gcc, python3-dev, setuptools?): {e}"
        );
    }
    // Builds under way when the window closes are finished and counted, and the time
    // runs until the last ends, as in the loaded phase.
    let secs = started.elapsed().as_secs_f64();
    let times = times.into_inner().unwrap();
    Ok(Baseline {
        iterations: times.len() as u64,
        secs,
        median_ms: quantile(&times, 0.5),
    })
}

/// What the soak measured.
#[derive(Debug, Clone)]
pub struct Figures {
    pub opts: Opts,
    pub baseline: Baseline,
    pub load_secs: f64,
    pub iterations: u64,
    pub interrupted: u64,
    pub iteration_ms: Vec<f64>,
    pub exec_ms: Vec<f64>,
    pub create_ms: Vec<f64>,
    pub rss_max: u64,
    pub rss_last: u64,
    pub commits: usize,
    pub faults: Vec<FaultRecord>,
    pub bound_s: f64,
    pub loadavg: String,
    pub total_secs: f64,
}

impl Figures {
    pub fn per_minute(&self) -> f64 {
        self.iterations as f64 * 60.0 / self.load_secs
    }

    pub fn print(&self, as_json: bool) {
        let p = |xs: &[f64], q| quantile(xs, q);
        if as_json {
            let v = json!({
                "workspaces": self.opts.workspaces,
                "sandboxes": self.opts.sandboxes,
                "seed": self.opts.seed,
                "load_secs": self.load_secs,
                "total_secs": self.total_secs,
                "iterations": self.iterations,
                "iterations_interrupted_by_faults": self.interrupted,
                "iterations_per_minute": self.per_minute(),
                "baseline_iterations_per_minute": self.baseline.per_minute(),
                "baseline_median_ms": self.baseline.median_ms,
                "ratio_to_baseline": self.per_minute() / self.baseline.per_minute(),
                "iteration_ms": {"p50": p(&self.iteration_ms, 0.5), "p99": p(&self.iteration_ms, 0.99), "max": p(&self.iteration_ms, 1.0)},
                "exec_ms": {"p50": p(&self.exec_ms, 0.5), "p99": p(&self.exec_ms, 0.99), "max": p(&self.exec_ms, 1.0)},
                "create_ms": {"p50": p(&self.create_ms, 0.5), "p99": p(&self.create_ms, 0.99), "max": p(&self.create_ms, 1.0), "count": self.create_ms.len()},
                "daemon_rss_bytes": {"max": self.rss_max, "last": self.rss_last},
                "commits": self.commits,
                "latency_bound_s": self.bound_s,
                "loadavg": self.loadavg,
                "faults": self.faults.iter().map(|f| json!({
                    "at_s": f.at_s, "fault": format!("{:?}", f.fault), "target": f.target, "outcome": f.outcome,
                })).collect::<Vec<_>>(),
            });
            println!("{v}");
            return;
        }
        println!(
            "soak: {} workspaces, {} sandboxes, seed {}, {:.1} min of load ({:.1} min in all)",
            self.opts.workspaces,
            self.opts.sandboxes,
            self.opts.seed,
            self.load_secs / 60.0,
            self.total_secs / 60.0
        );
        println!(
            "  iterations: {} ({:.1} per minute; {} cut by a fault aimed at them, recovered)",
            self.iterations,
            self.per_minute(),
            self.interrupted
        );
        println!(
            "  baseline, plain directories, same concurrency: {:.1} per minute (median build {:.1} s)",
            self.baseline.per_minute(),
            self.baseline.median_ms / 1e3
        );
        println!(
            "  ratio soak / baseline: {:.2}",
            self.per_minute() / self.baseline.per_minute()
        );
        println!(
            "  iteration time p50 {:.1} s, p99 {:.1} s, max {:.1} s (bound {:.0} s)",
            p(&self.iteration_ms, 0.5) / 1e3,
            p(&self.iteration_ms, 0.99) / 1e3,
            p(&self.iteration_ms, 1.0) / 1e3,
            self.bound_s
        );
        println!(
            "  exec latency under load p50 {:.0} ms, p99 {:.0} ms",
            p(&self.exec_ms, 0.5),
            p(&self.exec_ms, 0.99)
        );
        println!(
            "  create latency under load p50 {:.0} ms, p99 {:.0} ms ({} creates)",
            p(&self.create_ms, 0.5),
            p(&self.create_ms, 0.99),
            self.create_ms.len()
        );
        println!(
            "  daemon RSS max {:.1} MiB, at the end {:.1} MiB",
            self.rss_max as f64 / 1048576.0,
            self.rss_last as f64 / 1048576.0
        );
        println!("  commits: {} (all present, fsck clean)", self.commits);
        println!("  load average at the end: {}", self.loadavg);
        println!("  faults ({}):", self.faults.len());
        for f in &self.faults {
            println!(
                "    {:>7.1} s {:?} {}: {}",
                f.at_s, f.fault, f.target, f.outcome
            );
        }
    }
}
