//! The JSON a run writes (schema in docs/bench-schema.md). Everything a report
//! shows is in here, so `bench report` can re-render any earlier run.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::corpus::CorpusMeta;
use crate::machine::Machine;
use crate::stats::Summary;

pub const SCHEMA: &str = "cowspace-bench/1";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunResult {
    pub schema: String,
    pub bench_version: String,
    /// RFC 3339, UTC.
    pub started_at: String,
    pub finished_at: String,
    pub duration_s: f64,
    /// The arguments as given.
    pub argv: Vec<String>,
    /// A command line with every setting explicit that reproduces this run.
    pub reproduce: String,
    pub machine: Machine,
    pub settings: Settings,
    /// The corpus, or `None` when it was unavailable (see `corpus_skipped`).
    pub corpus: Option<CorpusMeta>,
    pub corpus_skipped: Option<String>,
    pub mountctl: Option<MountctlInfo>,
    pub sections: Vec<SectionResult>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Settings {
    pub corpus: String,
    pub files: u64,
    pub seed: u64,
    pub runs: usize,
    pub sections: Vec<String>,
    /// `None`: every method of the selected sections.
    pub methods: Option<Vec<String>>,
    /// `warm` (tree read right before each method's run) or `cold` (caches dropped
    /// before every timed step).
    pub page_cache: String,
    pub quick: bool,
    pub changed_files: usize,
    /// Runs of the slow (full-copy) methods.
    #[serde(default)]
    pub slow_runs: usize,
    /// Fast-loop repetitions (millisecond creates/removes; sandbox starts).
    #[serde(default)]
    pub fast_loop: usize,
    /// `--worker-cpus`: the CPUs the materialize section's workload steps were confined
    /// to (absent: not confined).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_cpus: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MountctlInfo {
    pub path: String,
    pub version: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SectionResult {
    pub id: String,
    pub title: String,
    /// What one run of a method does, in words.
    pub description: String,
    pub metrics: Vec<MetricDef>,
    /// Methods in the order of their first run; each round rotates the start.
    pub methods: Vec<MethodResult>,
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Better {
    Lower,
    Higher,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MetricDef {
    pub id: String,
    pub label: String,
    /// `s`, `MB/s` (10^6 bytes per second), `bytes`, `ratio`.
    pub unit: String,
    pub better: Better,
    /// The report adds a p99 row for this metric (tail latency matters, e.g. materialize).
    #[serde(default)]
    pub show_p99: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A cowspace method (what is being evaluated).
    Cowspace,
    /// What users would otherwise use.
    Baseline,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    /// Not run: unavailable on this host or not implemented yet (`reason` says which).
    Skipped,
    /// Started and failed (`reason` has the error); samples before the failure are kept.
    Failed,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MethodResult {
    pub id: String,
    pub label: String,
    pub role: Role,
    /// The commands one run executes, as a user would type them.
    pub command: String,
    pub status: Status,
    pub reason: Option<String>,
    pub runs_completed: usize,
    /// Metric id → one value per completed run, in run order.
    pub samples: BTreeMap<String, Vec<f64>>,
    pub summary: BTreeMap<String, Summary>,
    pub notes: Vec<String>,
}
