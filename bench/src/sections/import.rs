//! Import: making a stored, deduplicated snapshot of a tree — `mountctl import`
//! against what users would otherwise do to keep a copy of a tree (`tar | zstd`,
//! `git add -A && git commit`).
//!
//! All methods work on one private copy of the corpus (`cp -a`, removed at the end),
//! because the "100 files changed" step edits it. One run of a method: a cold
//! import into a fresh destination, a re-import of the unchanged tree, then
//! [`change_files`] and a re-import. Each method changes its own 100 files, so the
//! copy drifts by a few bytes per run (about 4 KiB over a whole run).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use super::{Ctx, Method, MethodInfo, Prepared, Sample, Section, change_files, metric};
use crate::cancel::DirGuard;
use crate::corpus::walk;
use crate::mountctl::{Mountctl, field_u64};
use crate::proc::{self, Timing, timed};
use crate::results::{Better, MetricDef, Role};

pub struct ImportSection {
    work: Option<DirGuard>,
    files: Vec<PathBuf>,
    notes: Vec<String>,
}

impl ImportSection {
    pub fn new() -> Self {
        Self {
            work: None,
            files: Vec::new(),
            notes: Vec::new(),
        }
    }
}

const STORE: &str = "store";
const TAR_ZSTD: &str = "tar-zstd";
const GIT: &str = "git-commit";
const STORE_GIT: &str = "store-git";
/// The same from a packed repository, as a clone is.
const STORE_GIT_PACKED: &str = "store-git-packed";
const STORE_REPACK: &str = "store-repack";
/// Tiny imports before the repack of `store-repack` (as in a store fed by many small
/// captures), and in `--quick` runs.
const TINY_IMPORTS: usize = 2_000;
const QUICK_TINY_IMPORTS: usize = 20;

fn info(id: &'static str) -> MethodInfo {
    match id {
        STORE => MethodInfo {
            id,
            label: "cowspace store (mountctl import)".into(),
            role: Role::Cowspace,
            command: "mountctl --root ROOT --json init; mountctl --root ROOT --json import TREE --ref bench --no-default-excludes (×3: cold, unchanged, 100 changed)".into(),
        },
        STORE_GIT => MethodInfo {
            id,
            label: "cowspace store from git (mountctl import --git)".into(),
            role: Role::Cowspace,
            command: "git init/add -A -f/commit of TREE into a fresh repository (not timed); mountctl --root ROOT --json init; mountctl --root ROOT --json import REPO --git HEAD --ref bench (×3: cold, the same commit again, a commit of 100 changed files)".into(),
        },
        STORE_GIT_PACKED => MethodInfo {
            id,
            label: "cowspace store from a packed git repository (mountctl import --git)".into(),
            role: Role::Cowspace,
            command: "as store-git, with the repository repacked (git repack -a -d, not timed) after each commit, so every object is in a pack as in a clone".into(),
        },
        STORE_REPACK => MethodInfo {
            id,
            label: "cowspace store: repack of many tiny imports (mountctl repack)".into(),
            role: Role::Cowspace,
            command: format!(
                "mountctl --root ROOT --json init; {TINY_IMPORTS} × (write 3 bytes to a one-file \
                 tree; mountctl --root ROOT --json import DIR --ref tiny; not timed); \
                 mountctl --root ROOT --json repack ({QUICK_TINY_IMPORTS} imports with --quick)"
            ),
        },
        TAR_ZSTD => MethodInfo {
            id,
            label: "tar | zstd -T0 -3".into(),
            role: Role::Baseline,
            command: "tar -cf - -C TREE . | zstd -T0 -3 > OUT (×3; tar has no incremental mode, each is a full archive)".into(),
        },
        GIT => MethodInfo {
            id,
            label: "git add -A -f && git commit".into(),
            role: Role::Baseline,
            command: "git init; git add -A -f && git commit -q (×3, --allow-empty when unchanged; fresh repository, gc.auto=0; -f so the tree's own .gitignore cannot hide files)".into(),
        },
        _ => unreachable!("unknown import method {id}"),
    }
}

impl Section for ImportSection {
    fn id(&self) -> &'static str {
        "import"
    }

    fn title(&self) -> String {
        "Import: snapshot a tree into storage".into()
    }

    fn description(&self) -> String {
        "One run per method: cold import of the tree into a fresh destination, re-import of the \
         unchanged tree, re-import after appending a line to {N} deterministically chosen files. \
         Times are wall-clock of the whole command(s), including process start. MB/s = logical \
         bytes of the tree / cold time. Stored bytes are what the destination holds after the \
         cold import (the store's own count from `mountctl stats` when it reports one); disk is \
         allocated blocks measured by bench."
            .into()
    }

    fn metrics(&self) -> Vec<MetricDef> {
        vec![
            metric("cold_s", "cold import", "s", Better::Lower),
            metric(
                "cold_mbps",
                "cold import throughput",
                "MB/s",
                Better::Higher,
            ),
            metric(
                "cold_cpu_s",
                "cold import CPU (user+sys)",
                "s",
                Better::Lower,
            ),
            metric(
                "unchanged_s",
                "re-import, unchanged tree",
                "s",
                Better::Lower,
            ),
            metric(
                "changed_s",
                "re-import, {N} files changed",
                "s",
                Better::Lower,
            ),
            metric(
                "unchanged_files_read",
                "files read by the unchanged re-import",
                "files",
                Better::Lower,
            ),
            metric(
                "changed_files_read",
                "files read by the {N}-changed re-import",
                "files",
                Better::Lower,
            ),
            metric(
                "stored_bytes",
                "stored after cold import",
                "bytes",
                Better::Lower,
            ),
            metric("stored_ratio", "stored / logical", "ratio", Better::Lower),
            metric(
                "dedup_ratio",
                "dedup ratio (mountctl stats)",
                "ratio",
                Better::Higher,
            ),
            metric(
                "disk_bytes",
                "disk used after cold import",
                "bytes",
                Better::Lower,
            ),
            metric(
                "changed_added_bytes",
                "stored added by the {N}-file change",
                "bytes",
                Better::Lower,
            ),
            metric("repack_s", "repack of the tiny imports", "s", Better::Lower),
            metric(
                "repack_packs_before",
                "packs before the repack",
                "packs",
                Better::Lower,
            ),
            metric(
                "repack_packs_after",
                "packs after the repack",
                "packs",
                Better::Lower,
            ),
            metric(
                "repack_disk_before",
                "disk used by packs before the repack",
                "bytes",
                Better::Lower,
            ),
            metric(
                "repack_disk_after",
                "disk used by packs after the repack",
                "bytes",
                Better::Lower,
            ),
        ]
    }

    fn method_ids(&self) -> Vec<&'static str> {
        vec![
            STORE,
            STORE_GIT,
            STORE_GIT_PACKED,
            STORE_REPACK,
            TAR_ZSTD,
            GIT,
        ]
    }

    fn prepare(&mut self, ctx: &Ctx, selected: &dyn Fn(&str) -> bool) -> Result<Vec<Prepared>> {
        let mut out = Vec::new();
        let mut ready_ids = Vec::new();
        for id in self.method_ids().into_iter().filter(|id| selected(id)) {
            match availability(id, ctx) {
                Ok(()) => ready_ids.push(id),
                Err(why) => out.push(Prepared::Skipped(info(id), why)),
            }
        }
        if ready_ids.is_empty() {
            return Ok(out);
        }
        let work = DirGuard::create(ctx.scratch_path("import-tree"))?;
        eprintln!(
            "bench: import: copying the corpus to {} (cp -a)…",
            work.path().display()
        );
        let tree = work.path().join("tree");
        proc::run(
            Command::new("cp")
                .arg("-a")
                .arg(&ctx.corpus.tree)
                .arg(&tree),
        )?;
        nix::unistd::sync();
        self.files = walk::regular_files(&tree)?;
        if self.files.is_empty() {
            bail!("the corpus has no regular files to import");
        }
        self.notes.push(format!(
            "All methods read the same private copy of the corpus ({} regular files); the \
             changed-files step appends one line to {} files chosen from the seed, run and method.",
            self.files.len(),
            ctx.changed_files.min(self.files.len())
        ));
        self.work = Some(work);
        for id in ready_ids {
            let m: Box<dyn Method> = match id {
                STORE => Box::new(StoreImport {
                    mountctl: ctx.mountctl.clone().expect("availability checked"),
                    tree: tree.clone(),
                    files: self.files.clone(),
                }),
                STORE_REPACK => Box::new(StoreRepack {
                    mountctl: ctx.mountctl.clone().expect("availability checked"),
                }),
                STORE_GIT | STORE_GIT_PACKED => Box::new(StoreGitImport {
                    mountctl: ctx.mountctl.clone().expect("availability checked"),
                    tree: tree.clone(),
                    files: self.files.clone(),
                    packed: id == STORE_GIT_PACKED,
                }),
                TAR_ZSTD => Box::new(TarZstd {
                    tree: tree.clone(),
                    files: self.files.clone(),
                }),
                GIT => Box::new(GitCommit {
                    tree: tree.clone(),
                    files: self.files.clone(),
                }),
                _ => unreachable!(),
            };
            out.push(Prepared::Ready(m));
        }
        Ok(out)
    }

    fn notes(&self) -> Vec<String> {
        self.notes.clone()
    }
}

fn availability(id: &str, ctx: &Ctx) -> std::result::Result<(), String> {
    match id {
        STORE | STORE_REPACK => {
            let m = ctx.mountctl.as_ref().map_err(Clone::clone)?;
            probe_store(m, ctx.scratch)
        }
        STORE_GIT | STORE_GIT_PACKED => {
            let m = ctx.mountctl.as_ref().map_err(Clone::clone)?;
            proc::which("git").ok_or_else(|| "git not found on PATH".to_string())?;
            probe_store(m, ctx.scratch)
        }
        TAR_ZSTD => {
            for p in ["tar", "zstd"] {
                if proc::which(p).is_none() {
                    return Err(format!("{p} not found on PATH"));
                }
            }
            Ok(())
        }
        GIT => proc::which("git")
            .map(|_| ())
            .ok_or_else(|| "git not found on PATH".into()),
        _ => Err(format!("unknown method {id}")),
    }
}

/// Imports a three-file tree into a throwaway root. A mountctl that does not offer
/// import yet (usage error or "unsupported") makes the method skipped, with its
/// message; any other failure is a real failure of the method, reported as such.
fn probe_store(m: &Mountctl, scratch: &Path) -> std::result::Result<(), String> {
    let run = || -> Result<Option<String>> {
        let dir = DirGuard::create(scratch.join("store-probe"))?;
        let src = dir.path().join("src");
        std::fs::create_dir_all(src.join("d"))?;
        std::fs::write(src.join("a.txt"), b"probe\n")?;
        std::fs::write(src.join("d/b.txt"), b"probe b\n")?;
        let root = dir.path().join("root");
        for args in [
            vec![OsStr::new("init")],
            vec![
                OsStr::new("import"),
                src.as_os_str(),
                OsStr::new("--no-default-excludes"),
            ],
        ] {
            let mut c = m.command(&root);
            c.args(&args);
            let (code, stdout, stderr) = proc::run_status(&mut c)?;
            match code {
                Some(0) => {}
                Some(2) | Some(7) => {
                    return Ok(Some(format!(
                        "mountctl {} is not available yet (exit {}): {}",
                        args[0].to_string_lossy(),
                        code.unwrap_or(-1),
                        proc::tail(&stderr, &stdout)
                    )));
                }
                _ => bail!(
                    "`{}` failed (exit {code:?}): {}",
                    proc::display(&c),
                    proc::tail(&stderr, &stdout)
                ),
            }
        }
        Ok(None)
    };
    match run() {
        Ok(None) => Ok(()),
        Ok(Some(why)) => Err(why),
        Err(e) => Err(format!("probe import failed: {e:#}")),
    }
}

fn mbps(bytes: u64, t: &Timing) -> f64 {
    bytes as f64 / 1e6 / t.wall_s().max(1e-9)
}

struct StoreImport {
    mountctl: Mountctl,
    tree: PathBuf,
    files: Vec<PathBuf>,
}

impl StoreImport {
    fn import(&self, root: &Path, ctx: &Ctx, msg: &str) -> Result<(serde_json::Value, Timing)> {
        let args = [self.tree.as_os_str(), "--no-default-excludes".as_ref()];
        timed_import(&self.mountctl, root, ctx, &args, msg)
    }
}

/// `mountctl import SOURCE... --ref bench --message MSG` into `root`, timed.
fn timed_import(
    m: &Mountctl,
    root: &Path,
    ctx: &Ctx,
    source: &[&OsStr],
    msg: &str,
) -> Result<(serde_json::Value, Timing)> {
    ctx.before_step()?;
    let mut args: Vec<&OsStr> = vec!["import".as_ref()];
    args.extend_from_slice(source);
    args.extend(["--ref", "bench", "--message", msg].map(OsStr::new));
    timed(|| m.json(root, &args))
}

impl Method for StoreImport {
    fn info(&self) -> MethodInfo {
        info(STORE)
    }

    fn run_once(&mut self, ctx: &Ctx, round: usize) -> Result<Sample> {
        let dir = DirGuard::create(ctx.scratch_path(&format!("store-r{round}")))?;
        let root = dir.path().join("root");
        self.mountctl.json(&root, &[OsStr::new("init")])?;
        ctx.prepare_cache(&self.tree)?;
        let logical = walk::apparent_bytes(&self.tree)?;

        let (cold, t_cold) = self.import(&root, ctx, "cold")?;
        let after = AfterCold::of(&self.mountctl, &root, &cold)?;
        let (same, t_same) = self.import(&root, ctx, "unchanged")?;
        change_files(
            &self.tree,
            &self.files,
            ctx.changed_files,
            ctx.seed,
            round,
            1,
        )?;
        let (changed, t_changed) = self.import(&root, ctx, "changed")?;
        dir.remove()?;
        store_sample(
            ctx,
            logical,
            &after,
            [(&cold, &t_cold), (&same, &t_same), (&changed, &t_changed)],
        )
    }
}

/// What a store holds right after a cold import.
struct AfterCold {
    /// `mountctl stats`, if it answered.
    stats: Option<serde_json::Value>,
    stored: u64,
    disk: u64,
}

impl AfterCold {
    fn of(m: &Mountctl, root: &Path, cold: &serde_json::Value) -> Result<AfterCold> {
        let stats = m.json(root, &[OsStr::new("stats")]).ok();
        let stored = stats
            .as_ref()
            .and_then(|s| field_u64(s, "stored_bytes"))
            .or_else(|| field_u64(cold, "new_bytes_stored"))
            .context("neither `mountctl stats` nor the import reported stored bytes")?;
        let disk = walk::disk_added(root)?;
        Ok(AfterCold {
            stats,
            stored,
            disk,
        })
    }
}

/// A store method's sample from its three imports (cold, unchanged, changed: the
/// reports and their timings), after checking the cold one took the whole tree.
fn store_sample(
    ctx: &Ctx,
    logical: u64,
    after: &AfterCold,
    [(cold, t_cold), (same, t_same), (changed, t_changed)]: [(&serde_json::Value, &Timing); 3],
) -> Result<Sample> {
    let st = &ctx.corpus.meta.stats;
    if let Some(f) = field_u64(cold, "files") {
        let links = field_u64(cold, "symlinks").unwrap_or(st.symlinks);
        anyhow::ensure!(
            f == st.files && links == st.symlinks,
            "mountctl imported {f} files and {links} symlinks, the tree has {} and {}",
            st.files,
            st.symlinks
        );
    }
    let stored = after.stored;
    let mut s: Sample = vec![
        ("cold_s", t_cold.wall_s()),
        ("cold_mbps", mbps(logical, t_cold)),
        ("cold_cpu_s", t_cold.cpu_s()),
        ("unchanged_s", t_same.wall_s()),
        ("changed_s", t_changed.wall_s()),
        ("stored_bytes", stored as f64),
        ("stored_ratio", stored as f64 / logical.max(1) as f64),
        ("disk_bytes", after.disk as f64),
    ];
    if let Some(a) = field_u64(changed, "new_bytes_stored") {
        s.push(("changed_added_bytes", a as f64));
    }
    if let Some(d) = after
        .stats
        .as_ref()
        .and_then(|v| v.get("dedup_ratio"))
        .and_then(|v| v.as_f64())
    {
        s.push(("dedup_ratio", d));
    }
    // mountctl reports how many file contents (blobs, from git) an import read: it skips
    // what it knows; the baselines have no such count.
    if let Some(n) = field_u64(same, "files_read") {
        s.push(("unchanged_files_read", n as f64));
    }
    if let Some(n) = field_u64(changed, "files_read") {
        s.push(("changed_files_read", n as f64));
    }
    Ok(s)
}

/// `mountctl import --git` of commits of the tree: what the store reads from git when
/// it has stored a commit's blobs before.
struct StoreGitImport {
    mountctl: Mountctl,
    tree: PathBuf,
    files: Vec<PathBuf>,
    /// Repack after each commit (`store-git-packed`).
    packed: bool,
}

impl StoreGitImport {
    fn repack(&self, gd: &Path) -> Result<()> {
        if self.packed {
            proc::run(git_of(gd, &self.tree).args(["repack", "-a", "-d", "-q"]))?;
        }
        Ok(())
    }

    fn import(
        &self,
        root: &Path,
        gd: &Path,
        ctx: &Ctx,
        msg: &str,
    ) -> Result<(serde_json::Value, Timing)> {
        let args = [gd.as_os_str(), "--git".as_ref(), "HEAD".as_ref()];
        timed_import(&self.mountctl, root, ctx, &args, msg)
    }
}

impl Method for StoreGitImport {
    fn info(&self) -> MethodInfo {
        info(match self.packed {
            true => STORE_GIT_PACKED,
            false => STORE_GIT,
        })
    }

    fn run_once(&mut self, ctx: &Ctx, round: usize) -> Result<Sample> {
        let dir = DirGuard::create(ctx.scratch_path(&format!("store-git-r{round}")))?;
        let gd = dir.path().join("repo.git");
        let root = dir.path().join("root");
        commit_tree(&gd, &self.tree, "cold", true)?;
        self.repack(&gd)?;
        self.mountctl.json(&root, &[OsStr::new("init")])?;
        ctx.prepare_cache(&gd)?;
        let logical = walk::apparent_bytes(&self.tree)?;
        let (cold, t_cold) = self.import(&root, &gd, ctx, "cold")?;
        let after = AfterCold::of(&self.mountctl, &root, &cold)?;
        let (same, t_same) = self.import(&root, &gd, ctx, "unchanged")?;
        change_files(
            &self.tree,
            &self.files,
            ctx.changed_files,
            ctx.seed,
            round,
            5,
        )?;
        commit_tree(&gd, &self.tree, "changed", false)?;
        self.repack(&gd)?;
        let (changed, t_changed) = self.import(&root, &gd, ctx, "changed")?;
        dir.remove()?;
        store_sample(
            ctx,
            logical,
            &after,
            [(&cold, &t_cold), (&same, &t_same), (&changed, &t_changed)],
        )
    }
}

struct TarZstd {
    tree: PathBuf,
    files: Vec<PathBuf>,
}

impl TarZstd {
    fn archive(&self, out: &Path, ctx: &Ctx) -> Result<Timing> {
        ctx.before_step()?;
        let _ = std::fs::remove_file(out);
        let ((), t) = timed(|| {
            proc::pipe_to_file(
                Command::new("tar")
                    .args(["-cf", "-", "-C"])
                    .arg(&self.tree)
                    .arg("."),
                Command::new("zstd").args(["-T0", "-3", "-q"]),
                out,
            )
        })?;
        Ok(t)
    }
}

impl Method for TarZstd {
    fn info(&self) -> MethodInfo {
        info(TAR_ZSTD)
    }

    fn run_once(&mut self, ctx: &Ctx, round: usize) -> Result<Sample> {
        let dir = DirGuard::create(ctx.scratch_path(&format!("tar-r{round}")))?;
        let out = dir.path().join("tree.tar.zst");
        ctx.prepare_cache(&self.tree)?;
        let logical = walk::apparent_bytes(&self.tree)?;
        let t_cold = self.archive(&out, ctx)?;
        let stored = std::fs::metadata(&out)?.len();
        let disk = walk::disk_added(dir.path())?;
        let t_same = self.archive(&out, ctx)?;
        change_files(
            &self.tree,
            &self.files,
            ctx.changed_files,
            ctx.seed,
            round,
            2,
        )?;
        let t_changed = self.archive(&out, ctx)?;
        let added = std::fs::metadata(&out)?.len();
        dir.remove()?;
        Ok(vec![
            ("cold_s", t_cold.wall_s()),
            ("cold_mbps", mbps(logical, &t_cold)),
            ("cold_cpu_s", t_cold.cpu_s()),
            ("unchanged_s", t_same.wall_s()),
            ("changed_s", t_changed.wall_s()),
            ("stored_bytes", stored as f64),
            ("stored_ratio", stored as f64 / logical.max(1) as f64),
            ("disk_bytes", disk as f64),
            ("changed_added_bytes", added as f64),
        ])
    }
}

struct GitCommit {
    tree: PathBuf,
    files: Vec<PathBuf>,
}

impl GitCommit {
    fn git(&self, gd: &Path) -> Command {
        git_of(gd, &self.tree)
    }

    fn commit(&self, gd: &Path, ctx: &Ctx, msg: &str, init: bool) -> Result<Timing> {
        ctx.before_step()?;
        let ((), t) = timed(|| commit_tree(gd, &self.tree, msg, init))?;
        Ok(t)
    }
}

/// `git` for the repository `gd` whose work tree is `tree`.
fn git_of(gd: &Path, tree: &Path) -> Command {
    let mut c = crate::corpus::git();
    c.arg("--git-dir").arg(gd).arg("--work-tree").arg(tree);
    c
}

/// Commits `tree` as it is into the repository `gd` (made first when `init`).
fn commit_tree(gd: &Path, tree: &Path, msg: &str, init: bool) -> Result<()> {
    if init {
        proc::run(git_of(gd, tree).args(["init", "-q"]))?;
    }
    // -f: every method must store the same files; a tree's own .gitignore (Debian's
    // linux-source ignores `/*`) would otherwise hide most of it.
    proc::run(git_of(gd, tree).args(["add", "-A", "-f"]))?;
    proc::run(git_of(gd, tree).args(["commit", "-q", "--allow-empty", "-m", msg]))?;
    Ok(())
}

impl Method for GitCommit {
    fn info(&self) -> MethodInfo {
        info(GIT)
    }

    fn run_once(&mut self, ctx: &Ctx, round: usize) -> Result<Sample> {
        let dir = DirGuard::create(ctx.scratch_path(&format!("git-r{round}")))?;
        let gd = dir.path().join("repo.git");
        ctx.prepare_cache(&self.tree)?;
        let logical = walk::apparent_bytes(&self.tree)?;
        let t_cold = self.commit(&gd, ctx, "cold", true)?;
        let tracked = proc::run(self.git(&gd).args(["ls-files", "-z"]))?
            .split(|b| *b == 0)
            .filter(|p| !p.is_empty())
            .count() as u64;
        let st = &ctx.corpus.meta.stats;
        anyhow::ensure!(
            tracked == st.files + st.symlinks,
            "git tracked {tracked} paths, the tree has {} files and symlinks",
            st.files + st.symlinks
        );
        let stored = walk::apparent_bytes(&gd)?;
        let disk = walk::disk_added(&gd)?;
        let t_same = self.commit(&gd, ctx, "unchanged", false)?;
        let before = walk::apparent_bytes(&gd)?;
        change_files(
            &self.tree,
            &self.files,
            ctx.changed_files,
            ctx.seed,
            round,
            3,
        )?;
        let t_changed = self.commit(&gd, ctx, "changed", false)?;
        let added = walk::apparent_bytes(&gd)?.saturating_sub(before);
        dir.remove()?;
        Ok(vec![
            ("cold_s", t_cold.wall_s()),
            ("cold_mbps", mbps(logical, &t_cold)),
            ("cold_cpu_s", t_cold.cpu_s()),
            ("unchanged_s", t_same.wall_s()),
            ("changed_s", t_changed.wall_s()),
            ("stored_bytes", stored as f64),
            ("stored_ratio", stored as f64 / logical.max(1) as f64),
            ("disk_bytes", disk as f64),
            ("changed_added_bytes", added as f64),
        ])
    }
}

/// Many tiny imports, then `mountctl repack`: how many packs and how much disk before
/// and after, and how long the repack takes.
struct StoreRepack {
    mountctl: Mountctl,
}

impl Method for StoreRepack {
    fn info(&self) -> MethodInfo {
        info(STORE_REPACK)
    }

    fn slow(&self) -> bool {
        true
    }

    fn run_once(&mut self, ctx: &Ctx, round: usize) -> Result<Sample> {
        let dir = DirGuard::create(ctx.scratch_path(&format!("repack-r{round}")))?;
        let root = dir.path().join("root");
        let tiny = dir.path().join("tiny");
        std::fs::create_dir_all(&tiny)?;
        self.mountctl.json(&root, &[OsStr::new("init")])?;
        let n = if ctx.quick {
            QUICK_TINY_IMPORTS
        } else {
            TINY_IMPORTS
        };
        for i in 0..n {
            crate::cancel::check()?;
            // 3 bytes of content, different each time.
            std::fs::write(tiny.join("n"), format!("{:03}", i % 1000))?;
            let args = [
                OsStr::new("import"),
                tiny.as_os_str(),
                OsStr::new("--ref"),
                OsStr::new("tiny"),
            ];
            self.mountctl.json(&root, &args)?;
        }
        let packs = root.join("store/packs");
        let count = || -> Result<u64> {
            Ok(std::fs::read_dir(&packs)?
                .filter(|e| {
                    e.as_ref()
                        .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "pack"))
                })
                .count() as u64)
        };
        let (before, disk_before) = (count()?, walk::disk_added(&packs)?);
        ctx.before_step()?;
        let (report, t) = timed(|| self.mountctl.json(&root, &[OsStr::new("repack")]))?;
        let after = count()?;
        anyhow::ensure!(
            field_u64(&report, "packs_after") == Some(after),
            "repack reported {report}, {after} pack files are there"
        );
        let disk_after = walk::disk_added(&packs)?;
        self.mountctl.json(&root, &[OsStr::new("fsck")])?;
        dir.remove()?;
        Ok(vec![
            ("repack_s", t.wall_s()),
            ("repack_packs_before", before as f64),
            ("repack_packs_after", after as f64),
            ("repack_disk_before", disk_before as f64),
            ("repack_disk_after", disk_after as f64),
        ])
    }
}
