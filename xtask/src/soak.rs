//! `cargo xtask soak`: hundreds of workspaces, dozens of sandboxes building and testing a
//! real project at once, faults injected at seeded random moments, the runtime's
//! invariants checked after each fault and at the end, figures printed.
//!
//! ```text
//! cargo xtask soak [--minutes M] [--workspaces N] [--sandboxes S] [--seed X] [--json] [--release]
//! ```
//! The defaults are the short form CI runs (2.5 minutes of load, 16 workspaces, 8
//! sandboxes); the long form is `--minutes 60 --workspaces 200 --sandboxes 64`.
//! Needs root and the project `scripts/setup.sh` downloads. Everything lives under
//! `/tmp/cowspace-soakPID/` and is taken down at the end, also when a check fails.

mod env;
mod fault;
mod proc;
mod report;
mod worker;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use env::{ADMIN_DEADLINE, Env};

const USAGE: &str = "cargo xtask soak [--minutes M] [--workspaces N] [--sandboxes S] [--seed X] [--baseline-secs S] [--json] [--release]

Workspaces alive at once (N), of which S run a sandbox building and testing a real
project (simplejson's C extension and test suite) over and over, serving files on a
published port, writing and reading files through the files API, committing every
third iteration; every kind of fault injected at seeded random moments (kill -9 of the
daemon, a keeper, an init, mountctl mid-create/commit/remove; a full disk quota, a
fork bomb, memory past the limit) and the runtime checked after each and at the end.
Defaults: the short form CI runs (2.5 min, 16 workspaces, 8 sandboxes, 30 s baseline).
The long form: --minutes 60 --workspaces 200 --sandboxes 64 --baseline-secs 240.
Exit 1 with the failed check named; everything under /tmp/cowspace-soakPID/ is taken
down at the end either way.";

/// The soak's settings.
#[derive(Debug, Clone)]
pub struct Opts {
    /// Minutes of load with faults (after the baseline and the set-up).
    pub minutes: f64,
    /// Workspaces alive at once (the sandboxes' and idle ones).
    pub workspaces: usize,
    /// Sandboxes running builds at once.
    pub sandboxes: usize,
    pub seed: u64,
    pub json: bool,
    pub release: bool,
    /// Each sandbox's memory limit and most processes.
    pub memory: String,
    pub pids: u64,
    /// Each workspace's disk quota.
    pub disk: String,
    /// Seconds of the baseline (the same builds in plain directories).
    pub baseline_secs: u64,
}

impl Opts {
    fn parse(args: &[String]) -> Result<Opts> {
        let mut o = Opts {
            minutes: 2.5,
            workspaces: 16,
            sandboxes: 8,
            seed: 1,
            json: false,
            release: false,
            memory: "512m".into(),
            pids: 128,
            disk: "128m".into(),
            baseline_secs: 30,
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut val = |name: &str| {
                it.next()
                    .cloned()
                    .with_context(|| format!("{name} needs a value"))
            };
            match a.as_str() {
                "--minutes" => o.minutes = val(a)?.parse().context("--minutes: a number")?,
                "--workspaces" => {
                    o.workspaces = val(a)?.parse().context("--workspaces: a count")?
                }
                "--sandboxes" => o.sandboxes = val(a)?.parse().context("--sandboxes: a count")?,
                "--seed" => o.seed = val(a)?.parse().context("--seed: an integer")?,
                "--baseline-secs" => {
                    o.baseline_secs = val(a)?.parse().context("--baseline-secs: seconds")?
                }
                "--json" => o.json = true,
                "--release" => o.release = true,
                other => bail!(
                    "unexpected argument {other:?}; usage: {}",
                    USAGE.lines().next().unwrap_or_default()
                ),
            }
        }
        if o.sandboxes == 0 || o.workspaces < o.sandboxes + 1 {
            bail!(
                "--workspaces must exceed --sandboxes (idle workspaces take the commit faults), and --sandboxes be at least 1"
            );
        }
        if o.minutes.is_nan() || o.minutes <= 0.0 {
            bail!("--minutes must be positive");
        }
        Ok(o)
    }
}

/// Set by SIGINT or SIGTERM.
static INTERRUPTED: std::sync::LazyLock<std::sync::Arc<AtomicBool>> =
    std::sync::LazyLock::new(|| std::sync::Arc::new(AtomicBool::new(false)));

/// Whether SIGINT or SIGTERM came.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// The faults, in the order of the issue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    KillDaemon,
    KillKeeper,
    KillInit,
    KillMountctlCreate,
    KillMountctlCommit,
    KillMountctlRemove,
    DiskFull,
    ForkBomb,
    MemoryHog,
}

pub const ALL_FAULTS: [Fault; 9] = [
    Fault::KillDaemon,
    Fault::KillKeeper,
    Fault::KillInit,
    Fault::KillMountctlCreate,
    Fault::KillMountctlCommit,
    Fault::KillMountctlRemove,
    Fault::DiskFull,
    Fault::ForkBomb,
    Fault::MemoryHog,
];

/// What the fault injector and one worker share.
#[derive(Debug, Default)]
pub struct Slot {
    /// A fault the worker is to carry out in its sandbox.
    pub mailbox: Mutex<Option<Fault>>,
    /// Set before its keeper or init is killed; cleared when it has recovered.
    pub pending: AtomicBool,
    /// Its running sandbox (`sandbox start --json`).
    pub info: Mutex<Option<serde_json::Value>>,
    /// How the last fault aimed at it ended.
    pub outcome: Mutex<Option<Result<String, String>>>,
}

impl Slot {
    pub fn report(&self, r: Result<String, String>) {
        *self.outcome.lock().unwrap() = Some(r);
    }
}

/// Figures gathered while the soak runs.
#[derive(Debug, Default)]
pub struct Stats {
    pub iteration_ms: Vec<f64>,
    pub exec_ms: Vec<f64>,
    pub create_ms: Vec<f64>,
    /// Iterations cut by a fault aimed at their worker (recovered from).
    pub interrupted: u64,
    pub rss_max: u64,
    pub rss_last: u64,
    pub rss_samples: u64,
}

/// One fault and how it ended.
#[derive(Debug, Clone)]
pub struct FaultRecord {
    pub at_s: f64,
    pub fault: Fault,
    pub target: String,
    pub outcome: String,
}

pub struct Shared<'a> {
    pub env: &'a Env,
    pub opts: Opts,
    pub slots: Vec<Slot>,
    pub stop: AtomicBool,
    pub failures: Mutex<Vec<String>>,
    pub commits: Mutex<Vec<String>>,
    pub stats: Mutex<Stats>,
    pub faults: Mutex<Vec<FaultRecord>>,
    /// No command of a worker may take longer (the latency bound).
    pub bound: Duration,
    pub started: Instant,
    pub transient: AtomicU64,
    /// Set once every kind of fault has been injected (the load goes on until then).
    pub every_fault_done: AtomicBool,
}

impl Shared<'_> {
    pub fn stopping(&self) -> bool {
        if interrupted() && !self.stop.load(Ordering::SeqCst) {
            self.fail("interrupted (SIGINT or SIGTERM)".into());
        }
        self.stop.load(Ordering::SeqCst)
    }

    pub fn fail(&self, msg: String) {
        eprintln!("soak: FAILED: {msg}");
        self.failures.lock().unwrap().push(msg);
        self.stop.store(true, Ordering::SeqCst);
    }

    pub fn record_iteration(&self, ms: f64, exec_ms: f64) {
        let mut s = self.stats.lock().unwrap();
        s.iteration_ms.push(ms);
        s.exec_ms.push(exec_ms);
    }

    pub fn count_interrupted(&self) {
        self.stats.lock().unwrap().interrupted += 1;
    }

    /// `create` with the run's disk quota, its time recorded; a `soak/` directory
    /// with a marker file written through the files API.
    pub fn create_workspace(&self, name: &str) -> Result<()> {
        let out = self.env.mc.ok(
            &[
                "--json",
                "create",
                "soak/base",
                "--name",
                name,
                "--disk",
                &self.opts.disk,
            ],
            ADMIN_DEADLINE,
        )?;
        self.stats.lock().unwrap().create_ms.push(out.ms);
        self.env
            .mc
            .ok(&["fs", "mkdir", &format!("{name}:soak")], ADMIN_DEADLINE)?;
        let w = self.env.mc.run_in(
            &["fs", "write", &format!("{name}:soak/marker")],
            name.as_bytes(),
            ADMIN_DEADLINE,
        )?;
        if !w.ok() {
            bail!("fs write {name}:soak/marker: {}", w.describe());
        }
        Ok(())
    }
}

/// `cargo xtask soak ARGS`.
pub fn main(args: &[String]) -> ExitCode {
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let opts = match Opts::parse(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("xtask soak: {e:#}");
            return ExitCode::from(2);
        }
    };
    if !nix::unistd::geteuid().is_root() {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            eprintln!("xtask soak: needs root (mounts, namespaces, cgroups); CI=true: failing");
            return ExitCode::FAILURE;
        }
        eprintln!("xtask soak: skipped: needs root (mounts, namespaces, cgroups)");
        return ExitCode::SUCCESS;
    }
    // Ctrl-C or SIGTERM stops the soak at the next step, which then takes everything
    // down as after a failed check.
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        if let Err(e) = signal_hook::flag::register(sig, std::sync::Arc::clone(&INTERRUPTED)) {
            eprintln!("xtask soak: cannot catch signal {sig}: {e}");
            return ExitCode::FAILURE;
        }
    }
    match run(opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask soak: FAILED: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(opts: Opts) -> Result<()> {
    let profile = if opts.release { "release" } else { "debug" };
    let mut build = vec!["build", "--workspace", "--bins"];
    if opts.release {
        build.push("--release");
    }
    if !crate::cargo(&build) {
        bail!("`cargo {}` failed", build.join(" "));
    }
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"),
        PathBuf::from,
    );
    let bin_dir = target.join(profile);
    // Room for every workspace's quota is not needed (the image is sparse and the
    // quotas are ceilings); 8 GiB holds the builds of 200 workspaces and a few fills.
    let fs_size = if opts.workspaces > 32 { "16g" } else { "8g" };
    let total = Instant::now();
    let mut env = Env::setup(&bin_dir, fs_size)?;
    eprintln!(
        "soak: root {}, {} workspaces, {} sandboxes, {:.1} min, seed {}",
        env.root.display(),
        opts.workspaces,
        opts.sandboxes,
        opts.minutes,
        opts.seed
    );
    let baseline = report::baseline(&env, &opts)?;
    if interrupted() {
        bail!("interrupted (SIGINT or SIGTERM) during the baseline");
    }
    eprintln!(
        "soak: baseline: {} builds in plain directories in {:.0} s ({:.1} per minute, median {:.1} s)",
        baseline.iterations,
        baseline.secs,
        baseline.per_minute(),
        baseline.median_ms / 1e3
    );
    // The latency bound: no worker command, and no iteration, longer than ten times the
    // median baseline build under the same concurrency, and never less than 5 minutes.
    let bound = Duration::from_secs_f64((baseline.median_ms * 10.0 / 1e3).max(300.0));
    let result = fault::soak(&env, &opts, bound, &baseline);
    let result = match result {
        Ok(figures) => {
            let left = fault::final_checks(&env);
            match left {
                Ok(()) => Ok(figures),
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    };
    let forced = env.teardown();
    let result = result.and_then(|mut figures| {
        if !forced.is_empty() {
            bail!("the teardown had to force: {}", forced.join("; "));
        }
        figures.total_secs = total.elapsed().as_secs_f64();
        Ok(figures)
    });
    let figures = result?;
    figures.print(opts.json);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn the_defaults_are_the_short_form() {
        let o = Opts::parse(&[]).unwrap();
        assert_eq!((o.workspaces, o.sandboxes, o.minutes), (16, 8, 2.5));
    }

    #[test]
    fn the_long_form_parses() {
        let o = Opts::parse(&args(
            "--minutes 60 --workspaces 200 --sandboxes 64 --seed 9 --json",
        ))
        .unwrap();
        assert_eq!(
            (o.workspaces, o.sandboxes, o.seed, o.json),
            (200, 64, 9, true)
        );
    }

    #[test]
    fn bad_settings_are_refused() {
        for bad in [
            "--sandboxes 0",
            "--workspaces 4 --sandboxes 4",
            "--minutes 0",
            "--minutes",
            "--frob",
        ] {
            assert!(Opts::parse(&args(bad)).is_err(), "{bad} accepted");
        }
    }
}
