//! `bench`: measures cowspace against the tools users would otherwise use, on real
//! corpora, and writes a JSON record and a Markdown table per run.
//!
//! `bench run` prepares a corpus (cached), runs the selected sections (import, …)
//! alternating methods run by run, and writes `<out>/<stamp>-<corpus>.json` and
//! `.md`. `bench report FILE|DIR` re-renders the Markdown of an earlier run.
//! Everything a run creates lives in one `run-<pid>-…` directory under the work
//! directory and is removed on exit, including after Ctrl-C.
#![forbid(unsafe_code)]

mod cancel;
mod chart;
mod corpus;
mod machine;
mod mountctl;
mod proc;
mod report;
mod results;
mod sections;
mod stats;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Instant, SystemTime};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

use corpus::{CorpusSpec, CorpusUnavailable};
use results::{MountctlInfo, RunResult, SCHEMA, Settings};
use sections::{Ctx, PageCache, Section};

#[derive(Parser, Debug)]
#[command(name = "bench", version, about = "The cowspace benchmark harness")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run benchmark sections on a corpus and write JSON + Markdown.
    Run(Box<RunArgs>),
    /// Render the Markdown of an earlier run (a JSON file, or the newest in a directory).
    Report {
        /// A run's JSON file, or a directory of them.
        path: PathBuf,
    },
    /// Draw materialize time vs tree size (SVG, log-log, one line per method) from
    /// runs' JSON on corpora of different sizes.
    Chart {
        /// Where the SVG goes.
        #[arg(long)]
        out: PathBuf,
        /// Run JSON files (or directories of them: every `*.json` inside).
        #[arg(required = true)]
        runs: Vec<PathBuf>,
    },
}

#[derive(clap::Args, Debug, Clone)]
struct RunArgs {
    /// `synthetic`, `linux` (Debian's linux-source), or a directory path.
    #[arg(long, default_value = "synthetic")]
    corpus: String,
    /// Files in the synthetic corpus (regular files plus symlinks).
    #[arg(long)]
    files: Option<u64>,
    /// Seed of the synthetic corpus and of the changed-file choice.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Comma-separated sections.
    #[arg(long, value_delimiter = ',')]
    sections: Option<Vec<String>>,
    /// Comma-separated method ids (default: all of the selected sections).
    #[arg(long, value_delimiter = ',')]
    methods: Option<Vec<String>>,
    /// Runs per method.
    #[arg(long)]
    runs: Option<usize>,
    /// Runs of the slow methods (full copies: cp -a, git worktree/clone); default: --runs.
    #[arg(long)]
    slow_runs: Option<usize>,
    /// Fast-loop repetitions: creates/removes of the millisecond materializers (spread
    /// over the runs) and sandbox starts per method.
    #[arg(long)]
    fast_loop: Option<usize>,
    /// How many files the "changed" import step modifies.
    #[arg(long, default_value_t = 100)]
    changed_files: usize,
    /// Where the JSON and Markdown go.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
    /// Corpus cache (default: $XDG_CACHE_HOME/cowspace-bench, else /var/tmp/cowspace-bench).
    #[arg(long)]
    cache: Option<PathBuf>,
    /// Where runs create stores, copies and checkouts (default: <cache>/work).
    #[arg(long)]
    work: Option<PathBuf>,
    /// Small synthetic corpus (2,000 files) and 3 runs: a smoke test (CI).
    #[arg(long)]
    quick: bool,
    /// Drop the page cache before every timed step (root only).
    #[arg(long)]
    cold: bool,
    /// The mountctl binary (default: next to bench, else on PATH).
    #[arg(long)]
    mountctl: Option<PathBuf>,
    /// Run each workload step of the materialize section (`git status`, the walks, the
    /// reads, grep, the writes, the append, `mv`) confined to these CPUs (a list as
    /// `taskset -c` takes it: `0`, `0-3,6`), as a worker its runtime confined. Creates,
    /// commits and removes, and the daemon they start, are not confined.
    #[arg(long, value_name = "LIST")]
    worker_cpus: Option<String>,
}

const QUICK_FILES: u64 = 2_000;
const QUICK_RUNS: usize = 3;
const DEFAULT_FILES: u64 = 100_000;
const DEFAULT_RUNS: usize = 5;
const DEFAULT_FAST_LOOP: usize = 100;
const QUICK_FAST_LOOP: usize = 10;

fn all_sections() -> Vec<Box<dyn Section>> {
    vec![
        Box::new(sections::import::ImportSection::new()),
        Box::new(sections::materialize::MaterializeSection::new()),
        Box::new(sections::sandbox::SandboxSection::new()),
        Box::new(sections::remote::RemoteSection::new()),
        Box::new(sections::images::ImagesSection::new()),
        Box::new(sections::fork::ForkSection::new()),
        Box::new(sections::network::NetworkSection::new()),
        Box::new(sections::inject::InjectSection::new()),
        Box::new(sections::files::FilesSection::new()),
        Box::new(sections::clients::ClientsSection::new()),
    ]
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Run(a) => run(*a),
        Cmd::Report { path } => report(&path),
        Cmd::Chart { out, runs } => chart::write(&out, &runs),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        // A step whose command the signal ended fails with that command's error.
        Err(e) if e.is::<cancel::Interrupted>() || cancel::interrupted() => {
            eprintln!("bench: {}", cancel::Interrupted);
            ExitCode::from(130)
        }
        Err(e) => {
            eprintln!("bench: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn usage(msg: String) -> anyhow::Error {
    eprintln!("bench: {msg}");
    std::process::exit(2)
}

fn default_cache() -> PathBuf {
    match std::env::var_os("XDG_CACHE_HOME") {
        Some(x) if !x.is_empty() => PathBuf::from(x).join("cowspace-bench"),
        _ => PathBuf::from("/var/tmp/cowspace-bench"),
    }
}

fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

fn run(a: RunArgs) -> Result<()> {
    // Validate everything before any effect.
    let files = a
        .files
        .unwrap_or(if a.quick { QUICK_FILES } else { DEFAULT_FILES });
    let runs = a
        .runs
        .unwrap_or(if a.quick { QUICK_RUNS } else { DEFAULT_RUNS });
    if runs == 0 {
        return Err(usage("--runs must be at least 1".into()));
    }
    let slow_runs = a.slow_runs.unwrap_or(runs).min(runs);
    let fast_loop = a.fast_loop.unwrap_or(if a.quick {
        QUICK_FAST_LOOP
    } else {
        DEFAULT_FAST_LOOP
    });
    if slow_runs == 0 || fast_loop == 0 {
        return Err(usage(
            "--slow-runs and --fast-loop must be at least 1".into(),
        ));
    }
    if files == 0 {
        return Err(usage("--files must be at least 1".into()));
    }
    let spec = CorpusSpec::parse(&a.corpus, files, a.seed).map_err(|e| usage(format!("{e:#}")))?;
    let mut sections = all_sections();
    let known: Vec<&str> = sections.iter().map(|s| s.id()).collect();
    let wanted: Vec<String> = a
        .sections
        .clone()
        .unwrap_or_else(|| known.iter().map(|s| s.to_string()).collect());
    for w in &wanted {
        if !known.contains(&w.as_str()) {
            return Err(usage(format!(
                "unknown section `{w}` (known: {})",
                known.join(", ")
            )));
        }
    }
    sections.retain(|s| wanted.iter().any(|w| w == s.id()));
    if let Some(ms) = &a.methods {
        let ids: Vec<&str> = sections.iter().flat_map(|s| s.method_ids()).collect();
        for m in ms {
            if !ids.contains(&m.as_str()) {
                return Err(usage(format!(
                    "unknown method `{m}` for sections {} (known: {})",
                    wanted.join(","),
                    ids.join(", ")
                )));
            }
        }
    }
    let worker_cpus = a
        .worker_cpus
        .as_deref()
        .map(proc::parse_cpu_list)
        .transpose()
        .map_err(|e| usage(format!("--worker-cpus: {e:#}")))?;
    let is_root = nix::unistd::geteuid().is_root();
    if a.cold && !is_root {
        return Err(usage("--cold drops the page cache and needs root".into()));
    }

    cancel::install()?;
    let started = Instant::now();
    let started_at = now_rfc3339();
    let cache = a.cache.clone().unwrap_or_else(default_cache);
    let work = a.work.clone().unwrap_or_else(|| cache.join("work"));
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    cancel::sweep_stale_runs(&work)?;
    corpus::sweep_partials(&cache)?;
    let machine = machine::Machine::probe(&work, &cache);

    let mountctl = mountctl::Mountctl::locate(a.mountctl.as_deref());
    let mountctl_info = mountctl.as_ref().ok().map(|m| MountctlInfo {
        path: m.path.display().to_string(),
        version: m.version(),
    });

    let settings = Settings {
        corpus: spec.arg(),
        files,
        seed: a.seed,
        runs,
        sections: wanted.clone(),
        methods: a.methods.clone(),
        page_cache: if a.cold { "cold" } else { "warm" }.into(),
        quick: a.quick,
        changed_files: a.changed_files,
        slow_runs,
        fast_loop,
        worker_cpus: a.worker_cpus.clone(),
    };
    let reproduce = reproduce_line(&settings, &a);

    let (corpus, corpus_skipped) = match corpus::prepare(&spec, &cache) {
        Ok(c) => (Some(c), None),
        Err(e) if e.is::<CorpusUnavailable>() => {
            eprintln!("bench: corpus {} skipped: {e}", spec.arg());
            (None, Some(e.to_string()))
        }
        Err(e) => return Err(e),
    };

    let mut section_results = Vec::new();
    if let Some(corpus) = &corpus {
        let scratch = cancel::DirGuard::create(work.join(format!(
            "run-{}-{}",
            std::process::id(),
            SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs())
        )))?;
        let ctx = Ctx {
            corpus,
            scratch: scratch.path(),
            mountctl: mountctl.clone(),
            page_cache: if a.cold {
                PageCache::Cold
            } else {
                PageCache::Warm
            },
            seed: a.seed,
            changed_files: a.changed_files,
            is_root,
            quick: a.quick,
            slow_runs,
            fast_loop,
            concurrency: if a.quick { vec![1, 8] } else { vec![1, 8, 64] },
            runs,
            worker_cpus,
        };
        let selected = |id: &str| {
            a.methods
                .as_ref()
                .is_none_or(|ms| ms.iter().any(|m| m == id))
        };
        let mut outcome = Ok(());
        for s in &mut sections {
            eprintln!("bench: section {} on {}…", s.id(), corpus.meta.key);
            match sections::run_section(s.as_mut(), &ctx, runs, &selected) {
                Ok(r) => section_results.push(r),
                Err(e) => {
                    outcome = Err(e);
                    break;
                }
            }
        }
        // Sections hold daemons and mounts; they go before the scratch directory.
        drop(sections);
        outcome?;
        // A signal a section took for a failed step writes no report.
        cancel::check()?;
        scratch.remove()?;
    }

    let result = RunResult {
        schema: SCHEMA.into(),
        bench_version: env!("CARGO_PKG_VERSION").into(),
        started_at: started_at.clone(),
        finished_at: now_rfc3339(),
        duration_s: started.elapsed().as_secs_f64(),
        argv: std::env::args().collect(),
        reproduce,
        machine,
        settings,
        corpus: corpus.map(|c| c.meta),
        corpus_skipped,
        mountctl: mountctl_info,
        sections: section_results,
    };
    let stem = format!(
        "{}-{}",
        started_at.replace([':', '-'], ""),
        result.corpus.as_ref().map_or("skipped", |c| c.key.as_str())
    );
    let json_path = a.out.join(format!("{stem}.json"));
    let md_path = a.out.join(format!("{stem}.md"));
    std::fs::write(&json_path, serde_json::to_vec_pretty(&result)?)
        .with_context(|| format!("writing {}", json_path.display()))?;
    let md = report::markdown(&result);
    std::fs::write(&md_path, &md).with_context(|| format!("writing {}", md_path.display()))?;
    println!("{md}");
    eprintln!(
        "bench: wrote {} and {}",
        json_path.display(),
        md_path.display()
    );
    Ok(())
}

fn reproduce_line(s: &Settings, a: &RunArgs) -> String {
    // --files only shapes the synthetic corpus.
    let files = if s.corpus == "synthetic" {
        format!(" --files {}", s.files)
    } else {
        String::new()
    };
    let mut line = format!(
        "bench run --corpus {}{files} --seed {} --runs {} --slow-runs {} --fast-loop {} --sections {} --changed-files {}",
        s.corpus,
        s.seed,
        s.runs,
        s.slow_runs,
        s.fast_loop,
        s.sections.join(","),
        s.changed_files
    );
    if let Some(m) = &s.methods {
        line.push_str(&format!(" --methods {}", m.join(",")));
    }
    if a.cold {
        line.push_str(" --cold");
    }
    if let Some(c) = &s.worker_cpus {
        line.push_str(&format!(" --worker-cpus {c}"));
    }
    if let Some(w) = &a.work {
        line.push_str(&format!(" --work {}", w.display()));
    }
    if let Some(m) = &a.mountctl {
        line.push_str(&format!(" --mountctl {}", m.display()));
    }
    line
}

fn report(path: &Path) -> Result<()> {
    let file = if path.is_dir() {
        let mut jsons: Vec<PathBuf> = std::fs::read_dir(path)
            .with_context(|| format!("reading {}", path.display()))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .collect();
        jsons.sort();
        match jsons.pop() {
            Some(p) => p,
            None => bail!("no run JSON in {}", path.display()),
        }
    } else {
        path.to_path_buf()
    };
    let bytes = std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
    let r: RunResult = serde_json::from_slice(&bytes)
        .with_context(|| format!("{} is not a bench run (schema {SCHEMA})", file.display()))?;
    if r.schema != SCHEMA {
        bail!(
            "{} has schema {}, this bench reads {SCHEMA}",
            file.display(),
            r.schema
        );
    }
    print!("{}", report::markdown(&r));
    Ok(())
}
