//! Files: what moving files in and out of a workspace through cowspace costs, each
//! figure beside what a user would otherwise run, in the same run (`docs/files.md`).
//!
//! One workspace (`mountctl create bench --name files`, no sandbox running, so the
//! baselines may write to its host path as root) serves every method:
//! - **in**: 1,000 files of 4 KiB written through the daemon's files API (`files_mkdir`,
//!   then 1,000 `files_write` requests, data base64, on one control-socket connection,
//!   as a runtime would speak it) against `cp -r` of the same 1,000 files from the host
//!   into the workspace's host path;
//! - **out**: `mountctl cp WS:big HOSTDIR` of a 1 GiB tree (256 files of 4 MiB written
//!   into the workspace before the runs) against `tar c -C WSPATH big | tar x -C HOSTDIR`;
//! - **watch**: `mountctl --json watch WS` running (started for each run, untimed), a file written through the host path,
//!   the time from the write to its event line (`--fast-loop` writes, spread over the runs).
//!
//! Ratios (API ÷ `cp -r`, `mountctl cp` ÷ tar) pair the methods run by run
//! ([`Section::derive`]): they alternate within each round.

mod methods;
mod wire;

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;

use anyhow::{Context, Result};

use super::{Ctx, MethodInfo, Prepared, Section, metric};
use crate::cancel::DirGuard;
use crate::mountctl::{Mountctl, StoreGuard};
use crate::proc;
use crate::results::{Better, MethodResult, MetricDef, Role};
use crate::stats;

const API_WRITE: &str = "files-api-write";
const CP_IN: &str = "cp-r-in";
const MOUNTCTL_CP_OUT: &str = "mountctl-cp-out";
const TAR_OUT: &str = "tar-out";
const WATCH: &str = "mountctl-watch";
const IDS: &[&str] = &[API_WRITE, CP_IN, MOUNTCTL_CP_OUT, TAR_OUT, WATCH];

/// Files written into the workspace per run.
const SMALL_FILES: usize = 1_000;
const SMALL_FILE_BYTES: usize = 4 << 10;
/// The tree copied out: this many files of `BIG_FILE_BYTES` (1 GiB).
const BIG_FILES: u64 = 256;
const BIG_FILE_BYTES: usize = 4 << 20;
/// With `--quick`: 64 MiB.
const QUICK_BIG_FILES: u64 = 16;
/// Directories inside the workspace.
const BIG_DIR: &str = "big";
const WATCH_DIR: &str = "watch";
const WS_NAME: &str = "files";

/// (derived ratio, measured metric, ours, baseline).
const PAIRED: &[(&str, &str, &str, &str)] = &[
    ("write_ratio", "write_s", API_WRITE, CP_IN),
    ("copy_ratio", "copy_s", MOUNTCTL_CP_OUT, TAR_OUT),
];

/// What the methods share; the workspace and its store go with the last method.
struct Fixture {
    mountctl: Mountctl,
    root: PathBuf,
    socket: PathBuf,
    ws_id: String,
    ws_path: PathBuf,
    /// The 1,000 files (name, contents), also at `small_src` on the host.
    small: Vec<(String, Vec<u8>)>,
    small_src: PathBuf,
    /// Where copies out go.
    out: PathBuf,
    big_files: u64,
    big_bytes: u64,
    // Dropped last: the store (its workspace, its daemon), then the host directories.
    _store: StoreGuard,
    _src: DirGuard,
    _out: DirGuard,
}

fn info(id: &'static str) -> MethodInfo {
    let (label, role, command) = match id {
        API_WRITE => (
            "files API: files_mkdir + 1,000 files_write (one connection)",
            Role::Cowspace,
            "{\"op\":\"files_write\",\"args\":{\"workspace\":WS,\"path\":\"wN/fNNNN\",\"data\":BASE64}} ×1,000 on one connection to ROOT/run/fsd.sock (after one files_mkdir)",
        ),
        CP_IN => (
            "cp -r into the host path",
            Role::Baseline,
            "cp -r SRC WSPATH/cN (SRC: the same 1,000 files on the host)",
        ),
        MOUNTCTL_CP_OUT => (
            "mountctl cp WS:big HOSTDIR",
            Role::Cowspace,
            "mountctl --root ROOT cp WS:big HOSTDIR/mN",
        ),
        TAR_OUT => (
            "tar c | tar x from the host path",
            Role::Baseline,
            "tar c -C WSPATH big | tar x -C HOSTDIR/tN",
        ),
        _ => (
            "mountctl --json watch WS: write to event line",
            Role::Cowspace,
            "mountctl --root ROOT --json watch WS (running); a write of WSPATH/watch/rR-I through the host path",
        ),
    };
    MethodInfo {
        id,
        label: label.into(),
        role,
        command: command.into(),
    }
}

pub struct FilesSection {
    notes: Vec<String>,
    /// Every watch latency (seconds), for the notes.
    latencies: Rc<RefCell<Vec<f64>>>,
}

impl FilesSection {
    pub fn new() -> Self {
        Self {
            notes: Vec::new(),
            latencies: Rc::new(RefCell::new(Vec::new())),
        }
    }
}

/// Pairs `ours` with `base` run by run (the shorter list bounds it).
fn ratios(ours: &[f64], base: &[f64]) -> Vec<f64> {
    ours.iter().zip(base).map(|(a, b)| a / b).collect()
}

fn fixture(ctx: &Ctx, big: bool) -> Result<(Fixture, String)> {
    let mc = ctx.mountctl.clone().map_err(anyhow::Error::msg)?;
    eprintln!("bench: files: importing the corpus and creating a workspace (untimed)…");
    let store = StoreGuard::import(&mc, ctx.scratch_path("files-store"), &ctx.corpus.tree)?;
    let root = store.root.clone();
    let path = ctx.scratch_path("files-ws");
    let v = mc.json(
        &root,
        &[
            "create".as_ref(),
            "bench".as_ref(),
            "--name".as_ref(),
            WS_NAME.as_ref(),
            "--path".as_ref(),
            path.as_os_str(),
        ],
    )?;
    let ws_id = v["id"]
        .as_str()
        .context("create printed no id")?
        .to_string();
    let ws_path = v["path"].as_str().map_or(path, PathBuf::from);
    mc.json(&root, &["daemon".as_ref(), "start".as_ref()])?;
    let note = format!(
        "One workspace `mountctl create bench --name files` ({} materializer, {} lower) of the corpus, no sandbox running; runtime root {}.",
        v["materializer"].as_str().unwrap_or("?"),
        v["lower_kind"].as_str().unwrap_or("?"),
        root.display()
    );
    std::fs::create_dir(ws_path.join(WATCH_DIR))?;

    let src = DirGuard::create(ctx.scratch_path("files-src"))?;
    let mut small = Vec::with_capacity(SMALL_FILES);
    for i in 0..SMALL_FILES {
        let mut b = vec![0u8; SMALL_FILE_BYTES];
        wire::fill(&mut b, i as u64);
        let name = format!("f{i:04}");
        std::fs::write(src.path().join(&name), &b)?;
        small.push((name, b));
    }
    let big_files = if ctx.quick {
        QUICK_BIG_FILES
    } else {
        BIG_FILES
    };
    if big {
        eprintln!(
            "bench: files: writing {} MiB into the workspace (untimed)…",
            (big_files * BIG_FILE_BYTES as u64) >> 20
        );
        let dir = ws_path.join(BIG_DIR);
        std::fs::create_dir(&dir)?;
        let mut b = vec![0u8; BIG_FILE_BYTES];
        for i in 0..big_files {
            crate::cancel::check()?;
            wire::fill(&mut b, 1_000_000 + i);
            std::fs::write(dir.join(format!("b{i:03}")), &b)?;
        }
        nix::unistd::sync();
    }
    let out = DirGuard::create(ctx.scratch_path("files-out"))?;
    Ok((
        Fixture {
            mountctl: mc,
            socket: root.join("run/fsd.sock"),
            root,
            ws_id,
            ws_path,
            small,
            small_src: src.path().to_path_buf(),
            out: out.path().to_path_buf(),
            big_files,
            big_bytes: big_files * BIG_FILE_BYTES as u64,
            _store: store,
            _src: src,
            _out: out,
        },
        note,
    ))
}

impl Section for FilesSection {
    fn id(&self) -> &'static str {
        "files"
    }

    fn title(&self) -> String {
        "Files: into, out of and watching a workspace, against cp -r and tar".into()
    }

    fn description(&self) -> String {
        "In: 1,000 files of 4 KiB written through the files API (files_write, base64, one \
         control-socket connection) against `cp -r` of the same files into the host path. \
         Out: `mountctl cp WS:big HOSTDIR` of a 1 GiB tree (256 files of 4 MiB; 64 MiB with \
         --quick) against `tar c | tar x` from the host path (slow methods: --slow-runs). \
         Watch: the time from a write through the host path to its line from `mountctl --json \
         watch`, the run's median of --fast-loop ÷ runs writes. Ratios pair the methods run by \
         run; every copy is checked (files, bytes) and removed after, untimed."
            .into()
    }

    fn metrics(&self) -> Vec<MetricDef> {
        vec![
            metric(
                "write_s",
                "1,000 files of 4 KiB written into the workspace",
                "s",
                Better::Lower,
            ),
            metric(
                "write_ratio",
                "files API ÷ cp -r (target ≤ 2)",
                "ratio",
                Better::Lower,
            ),
            metric("copy_s", "1 GiB tree copied out", "s", Better::Lower),
            metric("copy_mbps", "1 GiB tree copied out", "MB/s", Better::Higher),
            metric(
                "copy_ratio",
                "mountctl cp ÷ tar c | tar x (target ≤ 1.2)",
                "ratio",
                Better::Lower,
            ),
            metric(
                "watch_latency_s",
                "write to event line (the run's median; target ≤ 50 ms)",
                "s",
                Better::Lower,
            ),
            metric(
                "watch_latency_max_s",
                "write to event line (the run's slowest)",
                "s",
                Better::Lower,
            ),
        ]
    }

    fn method_ids(&self) -> Vec<&'static str> {
        IDS.to_vec()
    }

    fn notes(&self) -> Vec<String> {
        let mut n = self.notes.clone();
        let all = self.latencies.borrow();
        if let (Some(med), Some(p90)) = (stats::median(&all), stats::percentile(&all, 90.0)) {
            n.push(format!(
                "Watch: all {} writes: median {:.1} ms, p90 {:.1} ms, max {:.1} ms. `mountctl watch` \
                 reports a batch once its queue is quiet for {} ms \
                 (cowspace::watch::QUIET_MS), at most 50 ms after its first event.",
                all.len(),
                med * 1e3,
                p90 * 1e3,
                all.iter().copied().fold(0.0, f64::max) * 1e3,
                5
            ));
        }
        n
    }

    fn derive(&self, methods: &mut [MethodResult]) {
        for (out, measured, ours, base) in PAIRED {
            let Some(b) = methods
                .iter()
                .find(|m| m.id == *base)
                .and_then(|m| m.samples.get(*measured))
                .cloned()
            else {
                continue;
            };
            let Some(o) = methods.iter_mut().find(|m| m.id == *ours) else {
                continue;
            };
            let Some(a) = o.samples.get(*measured) else {
                continue;
            };
            let v = ratios(a, &b);
            if !v.is_empty() {
                o.samples.insert(out.to_string(), v);
            }
        }
    }

    fn prepare(&mut self, ctx: &Ctx, selected: &dyn Fn(&str) -> bool) -> Result<Vec<Prepared>> {
        let wanted: Vec<&'static str> = IDS.iter().copied().filter(|id| selected(id)).collect();
        let big = wanted.contains(&MOUNTCTL_CP_OUT) || wanted.contains(&TAR_OUT);
        let fx = match fixture(ctx, big) {
            Ok((fx, note)) => {
                self.notes.push(note);
                Rc::new(fx)
            }
            Err(e) => {
                let why = format!("{e:#}");
                return Ok(wanted
                    .into_iter()
                    .map(|id| Prepared::Skipped(info(id), why.clone()))
                    .collect());
            }
        };
        let mut out = Vec::new();
        for id in wanted {
            let m: std::result::Result<Box<dyn super::Method>, String> = match id {
                API_WRITE => Ok(Box::new(methods::ApiWrite { fx: fx.clone() })),
                CP_IN => proc::which("cp")
                    .ok_or_else(|| "cp not found on PATH".to_string())
                    .map(|cp| {
                        Box::new(methods::CpIn { fx: fx.clone(), cp }) as Box<dyn super::Method>
                    }),
                MOUNTCTL_CP_OUT => Ok(Box::new(methods::CopyOut {
                    fx: fx.clone(),
                    tar: false,
                })),
                TAR_OUT => proc::which("tar")
                    .ok_or_else(|| "tar not found on PATH".to_string())
                    .map(|_| {
                        Box::new(methods::CopyOut {
                            fx: fx.clone(),
                            tar: true,
                        }) as Box<dyn super::Method>
                    }),
                // One untimed start: a watch that cannot run here is skipped with why.
                _ => methods::Running::start(fx.clone())
                    .map(|_| {
                        Box::new(methods::Watch {
                            fx: fx.clone(),
                            all: self.latencies.clone(),
                        }) as Box<dyn super::Method>
                    })
                    .map_err(|e| format!("{e:#}")),
            };
            out.push(match m {
                Ok(m) => Prepared::Ready(m),
                Err(why) => Prepared::Skipped(info(id), why),
            });
        }
        if big {
            self.notes.push(format!(
                "The tree copied out: {} files of {} MiB written into the workspace through its host path before the runs (untimed); each copy lands in the run's scratch directory on the same disk.",
                fx.big_files,
                BIG_FILE_BYTES >> 20
            ));
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
    fn derive_pairs_each_cowspace_method_with_its_baseline_run_by_run() {
        let s = FilesSection::new();
        let mut ms = vec![
            method(API_WRITE, &[("write_s", &[0.2, 0.3])]),
            method(CP_IN, &[("write_s", &[0.1, 0.1])]),
            method(MOUNTCTL_CP_OUT, &[("copy_s", &[1.2])]),
            method(TAR_OUT, &[("copy_s", &[1.0])]),
        ];
        s.derive(&mut ms);
        let w = &ms[0].samples["write_ratio"];
        assert!((w[0] - 2.0).abs() < 1e-9 && (w[1] - 3.0).abs() < 1e-9);
        assert!((ms[2].samples["copy_ratio"][0] - 1.2).abs() < 1e-9);
        assert!(!ms[1].samples.contains_key("write_ratio"));
        let declared: Vec<String> = s.metrics().into_iter().map(|m| m.id).collect();
        for m in &ms {
            for k in m.samples.keys() {
                assert!(declared.contains(k), "{k} is not declared");
            }
        }
    }

    #[test]
    fn derive_without_a_baseline_changes_nothing() {
        let s = FilesSection::new();
        let mut ms = vec![method(API_WRITE, &[("write_s", &[0.2])])];
        s.derive(&mut ms);
        assert_eq!(ms[0].samples.len(), 1);
    }

    #[test]
    fn every_method_has_a_distinct_label_and_command() {
        let infos: Vec<MethodInfo> = IDS.iter().map(|id| info(id)).collect();
        for (i, a) in infos.iter().enumerate() {
            assert!(!a.command.is_empty());
            for b in &infos[i + 1..] {
                assert_ne!(a.label, b.label);
            }
        }
    }
}
