//! The generic runner: sections of methods measured in alternation.
//!
//! A [`Section`] (import, materialize, …) offers methods; each [`Method`] does one
//! measured repetition per call and returns its metric samples. The runner
//! interleaves methods run by run (round r starts with method r mod n: A B C, B C A,
//! …) so machine drift hits all of them alike, records a failing method as failed
//! (keeping what it measured) and carries on with the others.

pub mod clients;
pub mod files;
pub mod fork;
pub mod images;
pub mod images_start;
pub mod import;
pub mod inject;
pub mod materialize;
pub mod network;
pub mod remote;
pub mod sandbox;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::cancel;
use crate::corpus::Corpus;
use crate::mountctl::Mountctl;
use crate::results::{MethodResult, MetricDef, Role, SectionResult, Status};
use crate::stats;

/// Page-cache state for timed steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageCache {
    /// The tree is read right before each method's run (idle pages get evicted).
    Warm,
    /// `sync; echo 3 > /proc/sys/vm/drop_caches` before every timed step (root only).
    Cold,
}

/// Everything a method may use.
pub struct Ctx<'a> {
    pub corpus: &'a Corpus,
    /// This run's private directory (removed at the end).
    pub scratch: &'a Path,
    pub mountctl: std::result::Result<Mountctl, String>,
    pub page_cache: PageCache,
    pub seed: u64,
    pub changed_files: usize,
    pub is_root: bool,
    /// `--quick`: reduced sections (no loop filesystems, fewer repetitions).
    pub quick: bool,
    /// Runs of the slow (full-copy) methods; at most the section's runs.
    pub slow_runs: usize,
    /// Repetitions of the fast loops (creates and removes of millisecond methods,
    /// sandbox starts), spread over the runs.
    pub fast_loop: usize,
    /// Concurrent-workspace counts measured for the fast methods.
    pub concurrency: Vec<usize>,
    /// `--runs`.
    pub runs: usize,
    /// `--worker-cpus`: where workload steps run ([`Ctx::as_worker`]).
    pub worker_cpus: Option<nix::sched::CpuSet>,
}

impl Ctx<'_> {
    /// Brings the page cache into the stated state before a method's run.
    pub fn prepare_cache(&self, tree: &Path) -> Result<()> {
        match self.page_cache {
            PageCache::Warm => {
                crate::corpus::walk::read_all(tree)?;
                Ok(())
            }
            PageCache::Cold => drop_caches(),
        }
    }

    /// Called right before each timed step.
    pub fn before_step(&self) -> Result<()> {
        cancel::check()?;
        if self.page_cache == PageCache::Cold {
            drop_caches()?;
        }
        Ok(())
    }

    /// Runs `f` (a workload step and whatever it starts) on `--worker-cpus`, then puts
    /// this thread back where it was.
    pub fn as_worker<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        use nix::sched::{sched_getaffinity, sched_setaffinity};
        use nix::unistd::Pid;
        let Some(cpus) = &self.worker_cpus else {
            return f();
        };
        let before = sched_getaffinity(Pid::from_raw(0))?;
        sched_setaffinity(Pid::from_raw(0), cpus)?;
        let out = f();
        sched_setaffinity(Pid::from_raw(0), &before)?;
        out
    }

    /// A timed workload step ([`crate::proc::timed`]) on `--worker-cpus`.
    pub fn worker_step<T>(
        &self,
        f: impl FnOnce() -> Result<T>,
    ) -> Result<(T, crate::proc::Timing)> {
        self.as_worker(|| crate::proc::timed(f))
    }

    /// Fast-loop repetitions per round: `fast_loop` spread over the runs.
    pub fn fast_per_round(&self) -> usize {
        self.fast_loop.div_ceil(self.runs.max(1))
    }

    pub fn scratch_path(&self, name: &str) -> PathBuf {
        self.scratch.join(name)
    }
}

pub fn drop_caches() -> Result<()> {
    nix::unistd::sync();
    std::fs::write("/proc/sys/vm/drop_caches", b"3")
        .map_err(|e| anyhow::anyhow!("dropping the page cache (needs root): {e}"))
}

/// Identity of a method, also for skipped ones.
#[derive(Debug, Clone)]
pub struct MethodInfo {
    pub id: &'static str,
    pub label: String,
    pub role: Role,
    pub command: String,
}

/// Every selected method of `ids` skipped for `why` (a section that cannot run here);
/// those in `baselines` are baselines, the others cowspace's.
pub fn skip_all(
    ids: &[&'static str],
    baselines: &[&str],
    selected: &dyn Fn(&str) -> bool,
    why: &str,
) -> Vec<Prepared> {
    ids.iter()
        .filter(|id| selected(id))
        .map(|id| {
            Prepared::Skipped(
                MethodInfo {
                    id,
                    label: (*id).into(),
                    role: if baselines.contains(id) {
                        Role::Baseline
                    } else {
                        Role::Cowspace
                    },
                    command: String::new(),
                },
                why.to_string(),
            )
        })
        .collect()
}

/// One measured repetition's values: metric id → value.
pub type Sample = Vec<(&'static str, f64)>;

pub trait Method {
    fn info(&self) -> MethodInfo;
    /// One repetition. `round` is 0-based; state it creates must be removed before
    /// returning (or held by guards that are).
    fn run_once(&mut self, ctx: &Ctx, round: usize) -> Result<Sample>;
    /// A slow method runs only `ctx.slow_runs` rounds (full copies of large trees).
    fn slow(&self) -> bool {
        false
    }
}

pub enum Prepared {
    Ready(Box<dyn Method>),
    Skipped(MethodInfo, String),
}

pub trait Section {
    fn id(&self) -> &'static str;
    fn title(&self) -> String;
    fn description(&self) -> String;
    fn metrics(&self) -> Vec<MetricDef>;
    /// Every method id this section knows (for validating `--methods`).
    fn method_ids(&self) -> Vec<&'static str>;
    /// Section-wide setup; returns the selected methods, ready or skipped with why.
    fn prepare(&mut self, ctx: &Ctx, selected: &dyn Fn(&str) -> bool) -> Result<Vec<Prepared>>;
    /// Notes for the report (e.g. how the section's fixtures were made).
    fn notes(&self) -> Vec<String> {
        Vec::new()
    }
    /// Rounds this section runs (default: `--runs`).
    fn rounds(&self, runs: usize, _ctx: &Ctx) -> usize {
        runs
    }
    /// Whether to print every run's sample line (sections with many tiny runs do not).
    fn verbose_runs(&self) -> bool {
        true
    }
    /// Adds samples computed from several methods' samples (e.g. a run-by-run ratio to a
    /// baseline), after the last round and before the summaries. Each added metric must be
    /// one of [`Section::metrics`].
    fn derive(&self, _methods: &mut [MethodResult]) {}
}

/// Runs one section: `runs` rounds over its ready methods, alternating.
pub fn run_section(
    section: &mut dyn Section,
    ctx: &Ctx,
    runs: usize,
    selected: &dyn Fn(&str) -> bool,
) -> Result<SectionResult> {
    let prepared = section.prepare(ctx, selected)?;
    let runs = section.rounds(runs, ctx);
    let mut results: Vec<MethodResult> = Vec::new();
    let mut ready: Vec<(usize, Box<dyn Method>)> = Vec::new();
    for p in prepared {
        let (info, status, reason, method) = match p {
            Prepared::Ready(m) => (m.info(), Status::Ok, None, Some(m)),
            Prepared::Skipped(info, why) => {
                eprintln!("bench: {}: {}: skipped: {why}", section.id(), info.id);
                (info, Status::Skipped, Some(why), None)
            }
        };
        results.push(MethodResult {
            id: info.id.to_string(),
            label: info.label,
            role: info.role,
            command: info.command,
            status,
            reason,
            runs_completed: 0,
            samples: BTreeMap::new(),
            summary: BTreeMap::new(),
            notes: Vec::new(),
        });
        if let Some(m) = method {
            ready.push((results.len() - 1, m));
        }
    }
    for round in 0..runs {
        let n = ready.len();
        for k in 0..n {
            let (ri, method) = &mut ready[(round + k) % n];
            let r = &mut results[*ri];
            if r.status != Status::Ok || (method.slow() && round >= ctx.slow_runs) {
                continue;
            }
            cancel::check()?;
            match method.run_once(ctx, round) {
                Ok(sample) => {
                    let declared = section.metrics();
                    for (k, _) in &sample {
                        anyhow::ensure!(
                            declared.iter().any(|d| d.id == *k),
                            "bench bug: {} reported undeclared metric {k}",
                            r.id
                        );
                    }
                    let shown: Vec<String> = sample
                        .iter()
                        .map(|(k, v)| format!("{k}={}", short(*v)))
                        .collect();
                    if section.verbose_runs() || round + 1 == runs || round % 25 == 0 {
                        eprintln!(
                            "bench: {} run {}/{runs} {}: {}",
                            section.id(),
                            round + 1,
                            r.id,
                            shown.join(" ")
                        );
                    }
                    for (k, v) in sample {
                        r.samples.entry(k.to_string()).or_default().push(v);
                    }
                    r.runs_completed += 1;
                }
                Err(e) if e.is::<cancel::Interrupted>() || cancel::interrupted() => {
                    return Err(e);
                }
                Err(e) => {
                    eprintln!("bench: {} {}: failed: {e:#}", section.id(), r.id);
                    r.status = Status::Failed;
                    r.reason = Some(format!("run {}: {e:#}", round + 1));
                }
            }
        }
    }
    section.derive(&mut results);
    let declared = section.metrics();
    for r in &results {
        for k in r.samples.keys() {
            anyhow::ensure!(
                declared.iter().any(|d| &d.id == k),
                "bench bug: {} has undeclared metric {k}",
                r.id
            );
        }
    }
    for r in &mut results {
        r.summary = r
            .samples
            .iter()
            .filter_map(|(k, v)| stats::summarize(v).map(|s| (k.clone(), s)))
            .collect();
    }
    Ok(SectionResult {
        id: section.id().to_string(),
        title: section.title(),
        description: section.description(),
        metrics: section.metrics(),
        methods: results,
        notes: section.notes(),
    })
}

fn short(v: f64) -> String {
    if v.abs() >= 1e6 {
        format!("{:.3e}", v)
    } else if v.fract() == 0.0 {
        format!("{v}")
    } else {
        format!("{v:.3}")
    }
}

/// A metric definition.
pub fn metric(id: &str, label: &str, unit: &str, better: crate::results::Better) -> MetricDef {
    MetricDef {
        id: id.into(),
        label: label.into(),
        unit: unit.into(),
        better,
        show_p99: false,
    }
}

/// Chooses `n` distinct regular files deterministically (from the seed, the round
/// and a per-method stream) and appends a line to each: a content change that a
/// stat-based index must notice. Returns how many files changed.
pub fn change_files(
    tree: &Path,
    files: &[PathBuf],
    n: usize,
    seed: u64,
    round: usize,
    stream: u64,
) -> Result<usize> {
    use std::io::Write;
    let mut rng =
        crate::corpus::rng::Rng::derive(seed, 0xC4A6_0000 + (round as u64) * 1024 + stream);
    let n = n.min(files.len());
    let mut chosen = std::collections::BTreeSet::new();
    while chosen.len() < n {
        chosen.insert(rng.index(files.len()));
    }
    for i in chosen {
        let p = tree.join(&files[i]);
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&p)
            .map_err(|e| anyhow::anyhow!("opening {} to change it: {e}", p.display()))?;
        writeln!(f, "// bench change: run {round} stream {stream} file {i}")?;
    }
    Ok(n)
}
