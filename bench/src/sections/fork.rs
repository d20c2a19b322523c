//! Fork and pause: what `mountctl fork` and `sandbox pause`/`resume` cost.
//!
//! Fixtures (untimed): the corpus imported into a runtime root in the run's scratch
//! directory (the runtime root's own filesystem), a workspace of it (`create bench`, the
//! default materializer) with `--changed-files` files changed, and a namespace sandbox
//! running in it. Methods:
//! - `fork-1`, `fork-16`: `mountctl fork WS` and `fork WS --count 16` (the forks removed
//!   after each run, untimed), with the time the parent's sandbox stayed frozen as the
//!   fork reports it (`frozen_ms`);
//! - `cp-reflink`: the baseline, `cp -a --reflink=auto` of a checkout of the same tree
//!   (the corpus directory) to a new directory on the same filesystem;
//! - `pause-resume`: `sandbox pause WS` then `sandbox resume WS`, each a whole command;
//! - `fork16-2g-root`, `fork16-2g-xfs`, `fork16-2g-btrfs`: a workspace whose private layer
//!   holds one 2 GiB file, forked at once into several (16 on a loop filesystem; on the
//!   runtime root's filesystem as many as its free space allows safely, at most 16),
//!   with the disk space used before and after (statvfs, after `sync`);
//! - `fork-btrfs`: a btrfs workspace of the corpus (a full tree: subvolume snapshots) on a
//!   btrfs loop filesystem, forked once and 16 at once.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use anyhow::{Context, Result};
use serde_json::Value;

use super::materialize::LoopFs;
use super::{Ctx, Method, MethodInfo, Prepared, Sample, Section, change_files, metric};
use crate::corpus::walk;
use crate::mountctl::{Mountctl, StoreGuard};
use crate::proc::{self, timed};
use crate::results::{Better, MethodResult, MetricDef, Role};

const IDS: &[&str] = &[
    "fork-1",
    "fork-16",
    "cp-reflink",
    "pause-resume",
    "fork16-2g-root",
    "fork16-2g-xfs",
    "fork16-2g-btrfs",
    "fork-btrfs",
];
const BASELINES: &[&str] = &["cp-reflink"];
/// The private layer of the large-layer cases.
const LARGE_LAYER_BYTES: u64 = 2 << 30;
/// Forks of the large-layer cases (where the filesystem's space allows).
const LARGE_FORKS: u64 = 16;
/// Space left free on the runtime root's filesystem after the large-layer case's copies.
const ROOT_FS_MARGIN_BYTES: u64 = 24 << 30;
/// Forks of the large-layer case on the runtime root's filesystem, where each is a copy
/// unless it clones: a shared disk is not filled with 16 × 2 GiB.
const ROOT_FS_LARGE_FORKS: u64 = 4;

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// A workspace whose sandbox the section started: stopped on drop (before its store).
struct Sandboxed {
    mountctl: Mountctl,
    root: PathBuf,
    ws: String,
}

impl Drop for Sandboxed {
    fn drop(&mut self) {
        let _ = self
            .mountctl
            .json(&self.root, &[os("sandbox"), os("stop"), os(&self.ws)]);
    }
}

/// Bytes in use on the filesystem holding `path`, after a sync.
fn used_bytes(path: &Path) -> Result<u64> {
    nix::unistd::sync();
    let s = nix::sys::statvfs::statvfs(path).context("statvfs")?;
    Ok((s.blocks() - s.blocks_free()) * s.fragment_size())
}

fn available_bytes(path: &Path) -> u64 {
    nix::sys::statvfs::statvfs(path)
        .map(|s| s.blocks_available() * s.fragment_size())
        .unwrap_or(0)
}

/// Forks `ws` `count` times and removes the forks (untimed); the wall time of the fork
/// command and what it answered.
fn fork_and_remove(mc: &Mountctl, root: &Path, ws: &str, count: u64) -> Result<(f64, Value)> {
    let n = count.to_string();
    let (v, t) = timed(|| mc.json(root, &[os("fork"), os(ws), os("--count"), os(&n)]))?;
    remove_forks(mc, root, &v)?;
    Ok((t.wall_s(), v))
}

fn remove_forks(mc: &Mountctl, root: &Path, v: &Value) -> Result<()> {
    for f in v["forks"].as_array().context("fork: no forks")? {
        let id = f["id"].as_str().context("fork: no id")?;
        mc.json(root, &[os("remove"), os(id), os("--force")])?;
    }
    Ok(())
}

/// The corpus workspace with a running sandbox.
struct Parent {
    mountctl: Mountctl,
    root: PathBuf,
    ws: String,
}

struct Fork {
    id: &'static str,
    count: u64,
    p: Arc<Parent>,
}

impl Method for Fork {
    fn info(&self) -> MethodInfo {
        MethodInfo {
            id: self.id,
            label: format!("mountctl fork WS --count {}", self.count),
            role: Role::Cowspace,
            command: format!(
                "mountctl fork WS --count {} (WS: the corpus with changed files, its sandbox running)",
                self.count
            ),
        }
    }

    fn run_once(&mut self, ctx: &Ctx, _round: usize) -> Result<Sample> {
        ctx.before_step()?;
        let (s, v) = fork_and_remove(&self.p.mountctl, &self.p.root, &self.p.ws, self.count)?;
        Ok(vec![
            ("fork_s", s),
            ("per_fork_ms", s * 1e3 / self.count as f64),
            ("frozen_ms", v["frozen_ms"].as_f64().unwrap_or(f64::NAN)),
        ])
    }
}

struct CpReflink {
    tree: PathBuf,
}

impl Method for CpReflink {
    fn info(&self) -> MethodInfo {
        MethodInfo {
            id: "cp-reflink",
            label: "cp -a --reflink=auto of a checkout".into(),
            role: Role::Baseline,
            command: "cp -a --reflink=auto CHECKOUT DEST (same filesystem)".into(),
        }
    }

    fn slow(&self) -> bool {
        true
    }

    fn run_once(&mut self, ctx: &Ctx, round: usize) -> Result<Sample> {
        let dest = ctx.scratch_path(&format!("fork-cp-{round}"));
        crate::cancel::remove_tree(&dest)?;
        ctx.before_step()?;
        let ((), t) = timed(|| {
            proc::run(
                Command::new("cp")
                    .args(["-a", "--reflink=auto"])
                    .arg(&self.tree)
                    .arg(&dest),
            )
            .map(drop)
        })?;
        crate::cancel::remove_tree(&dest)?;
        Ok(vec![
            ("fork_s", t.wall_s()),
            ("per_fork_ms", t.wall_s() * 1e3),
        ])
    }
}

struct PauseResume {
    p: Arc<Parent>,
}

impl Method for PauseResume {
    fn info(&self) -> MethodInfo {
        MethodInfo {
            id: "pause-resume",
            label: "mountctl sandbox pause / resume".into(),
            role: Role::Cowspace,
            command: "mountctl sandbox pause WS; mountctl sandbox resume WS (namespace sandbox)"
                .into(),
        }
    }

    fn run_once(&mut self, ctx: &Ctx, _round: usize) -> Result<Sample> {
        let (mc, root, ws) = (&self.p.mountctl, &self.p.root, &self.p.ws);
        let mut pause = Vec::new();
        let mut resume = Vec::new();
        for _ in 0..ctx.fast_per_round().max(1) {
            ctx.before_step()?;
            let (_, t) = timed(|| mc.json(root, &[os("sandbox"), os("pause"), os(ws)]))?;
            pause.push(t.wall_s() * 1e3);
            let (_, t) = timed(|| mc.json(root, &[os("sandbox"), os("resume"), os(ws)]))?;
            resume.push(t.wall_s() * 1e3);
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        Ok(vec![
            ("pause_ms", median(&mut pause)),
            ("resume_ms", median(&mut resume)),
        ])
    }
}

/// A workspace whose private layer holds one large file, on some filesystem.
struct Large {
    id: &'static str,
    fs_label: String,
    mountctl: Mountctl,
    root: PathBuf,
    ws: String,
    count: u64,
    /// Keeps the runtime root's store (and its loop filesystem) alive.
    _store: Arc<StoreGuard>,
    _loop: Option<Arc<LoopFs>>,
}

impl Method for Large {
    fn info(&self) -> MethodInfo {
        MethodInfo {
            id: self.id,
            label: format!(
                "fork --count {} of a 2 GiB private layer on {}",
                self.count, self.fs_label
            ),
            role: Role::Cowspace,
            command: format!("mountctl fork WS --count {}", self.count),
        }
    }

    fn slow(&self) -> bool {
        true
    }

    fn run_once(&mut self, ctx: &Ctx, _round: usize) -> Result<Sample> {
        let before = used_bytes(&self.root)?;
        ctx.before_step()?;
        let n = self.count.to_string();
        let (v, t) = timed(|| {
            self.mountctl.json(
                &self.root,
                &[os("fork"), os(&self.ws), os("--count"), os(&n)],
            )
        })?;
        let grown = used_bytes(&self.root)?.saturating_sub(before);
        remove_forks(&self.mountctl, &self.root, &v)?;
        Ok(vec![
            ("fork_s", t.wall_s()),
            ("per_fork_ms", t.wall_s() * 1e3 / self.count as f64),
            ("grown_per_fork_bytes", grown as f64 / self.count as f64),
        ])
    }
}

/// A btrfs workspace of the corpus (changed files) on a btrfs loop filesystem.
struct BtrfsFork {
    mountctl: Mountctl,
    root: PathBuf,
    ws: String,
    _store: Arc<StoreGuard>,
    _loop: Arc<LoopFs>,
}

impl Method for BtrfsFork {
    fn info(&self) -> MethodInfo {
        MethodInfo {
            id: "fork-btrfs",
            label: "mountctl fork of a btrfs workspace (1, then 16 at once)".into(),
            role: Role::Cowspace,
            command: "mountctl fork WS; mountctl fork WS --count 16 (WS: --materializer btrfs)"
                .into(),
        }
    }

    fn run_once(&mut self, ctx: &Ctx, _round: usize) -> Result<Sample> {
        ctx.before_step()?;
        let (one, _) = fork_and_remove(&self.mountctl, &self.root, &self.ws, 1)?;
        ctx.before_step()?;
        let (sixteen, _) = fork_and_remove(&self.mountctl, &self.root, &self.ws, 16)?;
        Ok(vec![("fork_s", one), ("fork16_s", sixteen)])
    }
}

pub struct ForkSection {
    notes: Vec<String>,
    /// Dropped first: the sandbox stops before its store goes, the stores before their
    /// loop filesystems.
    sandbox: Option<Sandboxed>,
    stores: Vec<Arc<StoreGuard>>,
    loops: Vec<(&'static str, Arc<LoopFs>)>,
}

impl ForkSection {
    pub fn new() -> Self {
        Self {
            notes: Vec::new(),
            sandbox: None,
            stores: Vec::new(),
            loops: Vec::new(),
        }
    }

    /// The section's loop filesystem of `kind`, made at its first use.
    fn loop_fs(
        &mut self,
        ctx: &Ctx,
        kind: &'static str,
    ) -> std::result::Result<Arc<LoopFs>, String> {
        if let Some((_, l)) = self.loops.iter().find(|(k, _)| *k == kind) {
            return Ok(l.clone());
        }
        let l = Arc::new(LoopFs::make(ctx, kind)?);
        self.loops.push((kind, l.clone()));
        Ok(l)
    }
}

/// A store of the corpus at `root` and a workspace of it (`create_args`) with
/// `ctx.changed_files` files changed; the workspace's id.
fn corpus_workspace(
    ctx: &Ctx,
    mc: &Mountctl,
    root: PathBuf,
    create_args: &[&str],
) -> Result<(StoreGuard, String, Value)> {
    let g = StoreGuard::import(mc, root, &ctx.corpus.tree)?;
    let mut args = vec![os("create"), os("bench")];
    args.extend(create_args.iter().map(|a| os(a)));
    let v = mc.json(&g.root, &args)?;
    let ws = v["id"].as_str().context("create: no id")?.to_string();
    let path = PathBuf::from(v["path"].as_str().context("create: no path")?);
    let files = walk::regular_files(&ctx.corpus.tree)?;
    change_files(&path, &files, ctx.changed_files, ctx.seed, 0, 41)?;
    Ok((g, ws, v))
}

/// A fresh root at `root` holding a one-file snapshot and an overlay workspace of it
/// whose private layer holds a 2 GiB file.
fn large_workspace(mc: &Mountctl, root: PathBuf, scratch: &Path) -> Result<(StoreGuard, String)> {
    let src = scratch.join(format!(
        "fork-large-src-{}",
        root.file_name().and_then(OsStr::to_str).unwrap_or("x")
    ));
    std::fs::create_dir_all(&src)?;
    std::fs::write(src.join("readme.txt"), b"base\n")?;
    let g = StoreGuard::import(mc, root, &src)?;
    crate::cancel::remove_tree(&src)?;
    let v = mc.json(
        &g.root,
        &[
            os("create"),
            os("bench"),
            os("--materializer"),
            os("overlay"),
        ],
    )?;
    let ws = v["id"].as_str().context("create: no id")?.to_string();
    let path = PathBuf::from(v["path"].as_str().context("create: no path")?);
    // Incompressible bytes, written through the workspace into its private layer.
    use std::io::Write;
    let mut f =
        std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path.join("big.bin"))?);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut block = vec![0u8; 1 << 20];
    for _ in 0..(LARGE_LAYER_BYTES >> 20) {
        for c in block.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            c.copy_from_slice(&x.to_le_bytes());
        }
        f.write_all(&block)?;
    }
    f.into_inner()?.sync_all()?;
    Ok((g, ws))
}

impl Section for ForkSection {
    fn id(&self) -> &'static str {
        "fork"
    }

    fn title(&self) -> String {
        "Fork and pause".into()
    }

    fn description(&self) -> String {
        "fork-1 / fork-16: mountctl fork of a workspace of the corpus with changed files \
         while its namespace sandbox runs (the forks removed after each run, untimed), beside \
         cp -a --reflink=auto of the corpus directory (fork_ratio pairs fork-1 with it run \
         by run). frozen_ms: how long the parent's sandbox stayed frozen, as fork reports it. \
         pause-resume: sandbox pause then resume, whole commands. fork16-2g-*: a workspace \
         whose private layer is one 2 GiB file forked at once, with the disk used per fork. \
         fork-btrfs: a btrfs (full-tree) workspace of the corpus forked once and 16 at once. \
         Times are wall-clock of the whole command, process start included."
            .into()
    }

    fn metrics(&self) -> Vec<MetricDef> {
        use Better::Lower;
        vec![
            metric("fork_s", "fork (or copy)", "s", Lower),
            metric("fork16_s", "16 forks at once", "s", Lower),
            metric("per_fork_ms", "per fork", "ms", Lower),
            metric(
                "fork_ratio",
                "fork ÷ cp -a --reflink=auto, paired by run",
                "ratio",
                Lower,
            ),
            metric("frozen_ms", "parent's sandbox frozen", "ms", Lower),
            metric("pause_ms", "sandbox pause", "ms", Lower),
            metric("resume_ms", "sandbox resume", "ms", Lower),
            metric("grown_per_fork_bytes", "disk used per fork", "bytes", Lower),
        ]
    }

    fn method_ids(&self) -> Vec<&'static str> {
        IDS.to_vec()
    }

    fn notes(&self) -> Vec<String> {
        self.notes.clone()
    }

    fn derive(&self, methods: &mut [MethodResult]) {
        let Some(b) = methods
            .iter()
            .find(|m| m.id == "cp-reflink")
            .and_then(|m| m.samples.get("fork_s").cloned())
        else {
            return;
        };
        for id in ["fork-1", "fork-16"] {
            if let Some(ours) = methods.iter_mut().find(|m| m.id == id)
                && let Some(a) = ours.samples.get("fork_s")
            {
                let v = super::network::clients::paired(a, &b, |a, b| a / b);
                if !v.is_empty() {
                    ours.samples.insert("fork_ratio".into(), v);
                }
            }
        }
    }

    fn prepare(&mut self, ctx: &Ctx, selected: &dyn Fn(&str) -> bool) -> Result<Vec<Prepared>> {
        if !IDS.iter().any(|id| selected(id)) {
            return Ok(Vec::new());
        }
        let mc = match &ctx.mountctl {
            Ok(m) => m.clone(),
            Err(why) => return Ok(super::skip_all(IDS, BASELINES, selected, why)),
        };
        if !ctx.is_root {
            return Ok(super::skip_all(
                IDS,
                BASELINES,
                selected,
                "sandboxes and mounts need root",
            ));
        }
        let mut out: Vec<Prepared> = Vec::new();
        let skipped = |id: &'static str, why: String| {
            Prepared::Skipped(
                MethodInfo {
                    id,
                    label: id.into(),
                    role: if BASELINES.contains(&id) {
                        Role::Baseline
                    } else {
                        Role::Cowspace
                    },
                    command: String::new(),
                },
                why,
            )
        };
        if ["fork-1", "fork-16", "pause-resume"]
            .iter()
            .any(|id| selected(id))
        {
            eprintln!("bench: fork: importing the corpus, a workspace, its sandbox (untimed)…");
            let (g, ws, v) = corpus_workspace(ctx, &mc, ctx.scratch_path("fork-store"), &[])?;
            let g = Arc::new(g);
            mc.json(&g.root, &[os("sandbox"), os("start"), os(&ws)])?;
            self.sandbox = Some(Sandboxed {
                mountctl: mc.clone(),
                root: g.root.clone(),
                ws: ws.clone(),
            });
            self.notes.push(format!(
                "The forked workspace: `create bench` ({} materializer, {} lower) of the corpus \
                 with {} files changed, on {} (the runtime root's filesystem), a namespace \
                 sandbox running in it.",
                v["materializer"].as_str().unwrap_or("?"),
                v["lower_kind"].as_str().unwrap_or("?"),
                ctx.changed_files,
                crate_fs_name(&g.root),
            ));
            let p = Arc::new(Parent {
                mountctl: mc.clone(),
                root: g.root.clone(),
                ws,
            });
            self.stores.push(g);
            for (id, count) in [("fork-1", 1), ("fork-16", 16)] {
                if selected(id) {
                    out.push(Prepared::Ready(Box::new(Fork {
                        id,
                        count,
                        p: p.clone(),
                    })));
                }
            }
            if selected("pause-resume") {
                out.push(Prepared::Ready(Box::new(PauseResume { p })));
            }
        }
        if selected("cp-reflink") {
            out.push(Prepared::Ready(Box::new(CpReflink {
                tree: ctx.corpus.tree.clone(),
            })));
        }
        if selected("fork16-2g-root") {
            let avail = available_bytes(ctx.scratch);
            let fit =
                avail.saturating_sub(ROOT_FS_MARGIN_BYTES + LARGE_LAYER_BYTES) / LARGE_LAYER_BYTES;
            let count = fit.min(ROOT_FS_LARGE_FORKS);
            if count == 0 {
                out.push(skipped(
                    "fork16-2g-root",
                    format!(
                        "{} GiB free on the runtime root's filesystem: no room for a copy of a \
                         2 GiB layer beside a {} GiB margin",
                        avail >> 30,
                        ROOT_FS_MARGIN_BYTES >> 30
                    ),
                ));
            } else {
                eprintln!(
                    "bench: fork: a 2 GiB private layer on the runtime root's filesystem (untimed)…"
                );
                let (g, ws) =
                    large_workspace(&mc, ctx.scratch_path("fork-large-root"), ctx.scratch)?;
                let g = Arc::new(g);
                self.notes.push(format!(
                    "fork16-2g-root makes {count} forks, not {LARGE_FORKS}: where the filesystem \
                     cannot clone, each is a 2 GiB copy, and {} GiB were free on a disk shared \
                     with others.",
                    avail >> 30,
                ));
                out.push(Prepared::Ready(Box::new(Large {
                    id: "fork16-2g-root",
                    fs_label: format!("{} (the runtime root's)", crate_fs_name(&g.root)),
                    mountctl: mc.clone(),
                    root: g.root.clone(),
                    ws,
                    count,
                    _store: g.clone(),
                    _loop: None,
                })));
                self.stores.push(g);
            }
        }
        for (id, kind) in [("fork16-2g-xfs", "xfs"), ("fork16-2g-btrfs", "btrfs")] {
            if !selected(id) {
                continue;
            }
            match self.loop_fs(ctx, kind) {
                Err(why) => out.push(skipped(id, why)),
                Ok(l) => {
                    eprintln!("bench: fork: a 2 GiB private layer on a loop {kind} (untimed)…");
                    let (mut g, ws) =
                        large_workspace(&mc, l.mnt.join(format!("root-{id}")), ctx.scratch)?;
                    g.remove_root = false;
                    let g = Arc::new(g);
                    out.push(Prepared::Ready(Box::new(Large {
                        id,
                        fs_label: if kind == "xfs" {
                            "a loop xfs (reflink=1)".into()
                        } else {
                            "a loop btrfs".into()
                        },
                        mountctl: mc.clone(),
                        root: g.root.clone(),
                        ws,
                        count: LARGE_FORKS,
                        _store: g.clone(),
                        _loop: Some(l),
                    })));
                    self.stores.push(g);
                }
            }
        }
        if selected("fork-btrfs") {
            match self.loop_fs(ctx, "btrfs") {
                Err(why) => out.push(skipped("fork-btrfs", why)),
                Ok(l) => {
                    eprintln!(
                        "bench: fork: the corpus in a btrfs workspace on a loop btrfs (untimed)…"
                    );
                    let (mut g, ws, _) = corpus_workspace(
                        ctx,
                        &mc,
                        l.mnt.join("root-fork-btrfs"),
                        &["--materializer", "btrfs"],
                    )?;
                    // Its read-only base subvolume goes with the loop filesystem.
                    g.remove_root = false;
                    let g = Arc::new(g);
                    out.push(Prepared::Ready(Box::new(BtrfsFork {
                        mountctl: mc.clone(),
                        root: g.root.clone(),
                        ws,
                        _store: g.clone(),
                        _loop: l,
                    })));
                    self.stores.push(g);
                }
            }
        }
        Ok(out)
    }
}

/// The filesystem type of `path`, for the notes.
fn crate_fs_name(path: &Path) -> String {
    proc::run(Command::new("stat").args(["-f", "-c", "%T"]).arg(path))
        .map(|o| String::from_utf8_lossy(&o).trim().to_string())
        .unwrap_or_else(|_| "?".into())
}
