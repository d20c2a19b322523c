//! Materialize: making a writable copy of the corpus for one worker, and what using
//! it costs — cowspace materializers against `cp -a`, `git worktree`, `git clone`,
//! kernel overlayfs over a plain directory, `fuse-overlayfs`, a btrfs subvolume
//! snapshot and `cp --reflink=always`.
//!
//! Every method starts from the same source: a normal git checkout of the corpus
//! (the tree plus `.git`), so `git status` and a commit mean the same in every
//! workspace. Each method implements [`Materializer`] (create and remove one
//! workspace); [`UseCost`] wraps it into a runner [`Method`] that times the create,
//! measures the disk it added, runs the same use workload in every workspace, times
//! the capture of the changes and the removal, and — for the methods that create in
//! milliseconds — a fast loop of creates and removes and N concurrent creates.
//! btrfs and reflink methods run on loop filesystems bench makes and removes.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{Context, Result};

use super::{Ctx, Method, MethodInfo, Prepared, Sample, Section, metric};
use crate::cancel::{DirGuard, MountGuard};
use crate::corpus::{git, walk};
use crate::mountctl::{Mountctl, StoreGuard, find_pids, proc_status_bytes};
use crate::proc::{self, timed};
use crate::results::{Better, MetricDef, Role};

/// Files the write workload creates, renames and deletes.
const WRITE_CREATE_FILES: usize = 1000;
const WRITE_RENAME_FILES: usize = 100;
const WRITE_DELETE_FILES: usize = 100;
const WRITE_FILE_BYTES: usize = 1024;
/// A string no corpus file contains, so grep reads everything.
const GREP_NEEDLE: &str = "cowspace-bench-needle-0f3c9a";
/// Loop filesystem image size: small corpora, large corpora.
const LOOP_SMALL: u64 = 4 << 30;
const LOOP_LARGE: u64 = 8 << 30;

/// A made workspace and what must go when it is removed.
pub struct Workspace {
    pub path: PathBuf,
    /// Directories whose blocks are the workspace's disk cost (methods without
    /// [`Materializer::disk_fs`]).
    pub cost_dirs: Vec<PathBuf>,
    pub has_git: bool,
    /// The workspace id, for methods that have one (cowspace).
    pub id: Option<String>,
    pub mount: Option<MountGuard>,
    /// Removes everything the workspace created, also on error paths.
    pub guard: DirGuard,
}

/// How long a method's create takes, which decides what bench measures of it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Speed {
    /// Milliseconds: also a fast loop of creates/removes, N concurrent creates, and
    /// `git status` in a second, fresh workspace.
    Fast,
    /// Seconds (clones of every file): the normal runs only.
    Medium,
    /// A full copy of the tree: only `--slow-runs` runs.
    Slow,
}

/// One way to make a writable copy of the corpus.
pub trait Materializer: Send + Sync {
    fn info(&self) -> MethodInfo;
    fn speed(&self) -> Speed;
    /// Makes a workspace below `dir` (an empty directory owned by the caller) or on
    /// the method's own filesystem.
    fn create(&self, dir: &Path) -> Result<Workspace>;
    /// Removes it completely (timed as teardown).
    fn remove(&self, ws: Workspace) -> Result<()> {
        if let Some(m) = ws.mount {
            m.unmount()?;
        }
        ws.guard.remove()
    }
    /// Captures the workspace's changes (timed): `git add -A && git commit` by default.
    fn commit(&self, ws: &Workspace) -> Result<bool> {
        if !ws.has_git {
            return Ok(false);
        }
        proc::run(git().arg("-C").arg(&ws.path).args(["add", "-A"]))?;
        proc::run(
            git()
                .arg("-C")
                .arg(&ws.path)
                .args(["commit", "-q", "-m", "bench"]),
        )?;
        Ok(true)
    }
    /// A filesystem whose used-space growth is the workspace's disk cost (for
    /// methods sharing extents, where allocated blocks per file overstate it).
    fn disk_fs(&self) -> Option<PathBuf> {
        None
    }
    /// What the method's workspaces read from: warmed before each run.
    fn backing(&self) -> Vec<PathBuf>;
    /// Resident memory of the method's daemon(s) now, and its peak, in bytes.
    fn daemon_rss(&self) -> Option<(u64, u64)> {
        None
    }
    /// Starts the peak of [`Materializer::daemon_rss`] afresh from what is resident now,
    /// for a daemon that outlives the run (the peak then is this run's).
    fn reset_peak_rss(&self) {}
}

pub struct MaterializeSection {
    largest: Option<PathBuf>,
    /// The directory of the tree renamed with `mv` and its entry count (see
    /// [`dir_to_move`]).
    moved: Option<(PathBuf, usize)>,
    /// Stores the cowspace methods use (daemons stopped on drop) — before `loops`,
    /// so they go first.
    stores: Vec<Arc<StoreGuard>>,
    /// Loop filesystems made for the btrfs and reflink methods.
    loops: Vec<Arc<LoopFs>>,
    notes: Vec<String>,
}

impl MaterializeSection {
    pub fn new() -> Self {
        Self {
            largest: None,
            moved: None,
            stores: Vec::new(),
            loops: Vec::new(),
            notes: Vec::new(),
        }
    }
}

const IDS: &[&str] = &[
    "cowspace-overlay-native",
    "cowspace-overlay-native-socket",
    "cowspace-overlay-view",
    "cowspace-overlay-socket",
    "cowspace-overlay-checkout",
    "cowspace-fuse",
    "cowspace-fuse-socket",
    "cowspace-btrfs",
    "cowspace-reflink",
    "cp-a",
    "git-worktree",
    "git-clone-shared",
    "git-clone-local",
    "overlayfs",
    "fuse-overlayfs",
    "btrfs-snapshot",
    "reflink-copy",
];

fn label(id: &str) -> (&'static str, Role) {
    match id {
        "cowspace-overlay-native" => ("cowspace overlay (native lower)", Role::Cowspace),
        "cowspace-overlay-native-socket" => (
            "cowspace overlay (native lower), through the control socket",
            Role::Cowspace,
        ),
        "cowspace-overlay-view" => ("cowspace overlay (view lower)", Role::Cowspace),
        "cowspace-overlay-socket" => (
            "cowspace overlay (view lower), through the control socket",
            Role::Cowspace,
        ),
        "cowspace-overlay-checkout" => ("cowspace overlay (checkout lower)", Role::Cowspace),
        "cowspace-fuse" => ("cowspace fuse", Role::Cowspace),
        "cowspace-fuse-socket" => ("cowspace fuse, through the control socket", Role::Cowspace),
        "cowspace-btrfs" => ("cowspace btrfs", Role::Cowspace),
        "cowspace-reflink" => ("cowspace reflink", Role::Cowspace),
        "cp-a" => ("cp -a", Role::Baseline),
        "git-worktree" => ("git worktree add --detach", Role::Baseline),
        "git-clone-shared" => ("git clone --shared", Role::Baseline),
        "git-clone-local" => ("git clone --local", Role::Baseline),
        "overlayfs" => ("overlayfs over a plain dir", Role::Baseline),
        "fuse-overlayfs" => ("fuse-overlayfs", Role::Baseline),
        "btrfs-snapshot" => ("btrfs subvolume snapshot", Role::Baseline),
        "reflink-copy" => ("cp -a --reflink=always", Role::Baseline),
        _ => ("?", Role::Baseline),
    }
}

fn info(id: &'static str, command: String) -> MethodInfo {
    let (l, role) = label(id);
    MethodInfo {
        id,
        label: l.into(),
        role,
        command,
    }
}

fn conc_metric(n: usize) -> Option<&'static str> {
    match n {
        1 => Some("concurrent_1_s"),
        8 => Some("concurrent_8_s"),
        64 => Some("concurrent_64_s"),
        _ => None,
    }
}

impl Section for MaterializeSection {
    fn id(&self) -> &'static str {
        "materialize"
    }

    fn title(&self) -> String {
        "Materialize: a writable copy for one worker, and using it".into()
    }

    fn description(&self) -> String {
        format!(
            "Every method starts from the same normal git checkout of the corpus (tree + \
             `.git`). One run per method: create a workspace (timed, including process \
             start), measure the disk it added, `git status` (for full copies here, right \
             after the copy), stat every entry twice, read every file, grep the tree for an \
             absent string, write workload ({WRITE_CREATE_FILES} files of {WRITE_FILE_BYTES} \
             B created, {WRITE_RENAME_FILES} renamed, {WRITE_DELETE_FILES} deleted), append \
             one byte to the largest file, capture the changes (`mountctl commit`; `git add -A \
             && git commit` for the baselines), rename a directory of about \
             {MOVED_DIR_ENTRIES} entries with `mv`, read the daemon's memory, then remove the \
             workspace (timed as teardown). Methods that create in milliseconds also get: \
             `git status` as the first command in a second, fresh workspace; a fast loop of \
             creates and removes (spread over the runs); and N concurrent creates (total \
             time, daemon RSS with the last N alive)."
        )
    }

    fn metrics(&self) -> Vec<MetricDef> {
        let p99 = |m: MetricDef| MetricDef {
            show_p99: true,
            ..m
        };
        vec![
            p99(metric("materialize_s", "materialize", "s", Better::Lower)),
            p99(metric("create_s", "create, fast loop", "s", Better::Lower)),
            p99(metric("remove_s", "remove, fast loop", "s", Better::Lower)),
            metric("teardown_s", "teardown (after use)", "s", Better::Lower),
            metric("disk_added_bytes", "disk added", "bytes", Better::Lower),
            metric("stat_walk_1_s", "stat walk, first", "s", Better::Lower),
            metric("stat_walk_2_s", "stat walk, second", "s", Better::Lower),
            metric("full_read_s", "read every file", "s", Better::Lower),
            metric("grep_s", "grep -r (absent string)", "s", Better::Lower),
            metric(
                "git_status_s",
                "git status, first in a fresh workspace",
                "s",
                Better::Lower,
            ),
            metric("write_s", "write workload", "s", Better::Lower),
            metric(
                "append_s",
                "1-byte append to the largest file",
                "s",
                Better::Lower,
            ),
            metric("commit_s", "capture the changes", "s", Better::Lower),
            metric(
                "dir_rename_s",
                "mv of a directory of the tree",
                "s",
                Better::Lower,
            ),
            metric(
                "daemon_peak_rss_bytes",
                "daemon peak RSS",
                "bytes",
                Better::Lower,
            ),
            metric(
                "concurrent_1_s",
                "1 concurrent create (total)",
                "s",
                Better::Lower,
            ),
            metric(
                "concurrent_8_s",
                "8 concurrent creates (total)",
                "s",
                Better::Lower,
            ),
            metric(
                "concurrent_64_s",
                "64 concurrent creates (total)",
                "s",
                Better::Lower,
            ),
            metric(
                "concurrent_rss_bytes",
                "daemon RSS, most concurrent alive",
                "bytes",
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

    fn prepare(&mut self, ctx: &Ctx, selected: &dyn Fn(&str) -> bool) -> Result<Vec<Prepared>> {
        self.largest = largest_file(&ctx.corpus.tree)?;
        self.moved = dir_to_move(&ctx.corpus.tree)?;
        if let Some((dir, n)) = &self.moved {
            self.notes.push(format!(
                "The directory renamed with `mv` (after the capture): `{}`, {n} entries beneath.",
                dir.display()
            ));
        }
        let moved = self.moved.as_ref().map(|(d, _)| d.clone());
        let mut out = Vec::new();
        let wanted: Vec<&'static str> = IDS.iter().copied().filter(|id| selected(id)).collect();
        let needs_src = !wanted.is_empty();
        // The common source: a git checkout of the corpus.
        let src: std::result::Result<PathBuf, String> = if !needs_src {
            Err(String::new())
        } else if proc::which("git").is_none() {
            Err("git not found on PATH".into())
        } else {
            ctx.corpus
                .git_checkout(ctx.scratch)
                .map_err(|e| format!("building the corpus' git checkout: {e:#}"))
        };
        let repo = src.as_ref().ok().map(|_| {
            let r = ctx
                .corpus
                .git_repo(ctx.scratch)
                .expect("built with the checkout");
            // Worktrees left by an interrupted run point at removed directories.
            let _ = proc::run(git().arg("--git-dir").arg(&r).args(["worktree", "prune"]));
            r
        });
        if let Ok(s) = &src {
            self.notes.push(format!(
                "Source of every method: a git checkout of the corpus (`git clone --no-hardlinks` \
                 of a one-commit repository), {}; the cowspace stores import it with \
                 `mountctl import CHECKOUT --ref bench --no-default-excludes` (untimed).",
                s.display()
            ));
        }
        let mut ext4_store: Option<std::result::Result<Arc<StoreGuard>, String>> = None;
        let mut loops: [Option<std::result::Result<Arc<LoopFs>, String>>; 2] = [None, None];
        let mut loop_stores: [Option<std::result::Result<Arc<StoreGuard>, String>>; 2] =
            [None, None];

        for &id in &wanted {
            // Fixture work (imports, copies) takes minutes on large trees: Ctrl-C stops here.
            crate::cancel::check()?;
            let skip = |why: String| Prepared::Skipped(info(id, String::new()), why);
            let src = match &src {
                Ok(s) => s.clone(),
                Err(why) => {
                    out.push(skip(why.clone()));
                    continue;
                }
            };
            let m: Box<dyn Materializer> = match id {
                "cowspace-overlay-native"
                | "cowspace-overlay-native-socket"
                | "cowspace-overlay-view"
                | "cowspace-overlay-socket"
                | "cowspace-overlay-checkout"
                | "cowspace-fuse"
                | "cowspace-fuse-socket" => {
                    let store = ext4_store
                        .get_or_insert_with(|| {
                            let mc = ctx.mountctl.clone()?;
                            eprintln!("bench: materialize: importing the checkout (untimed)…");
                            let g = StoreGuard::import(
                                &mc,
                                ctx.scratch_path("materialize-store"),
                                &src,
                            )
                            .map(Arc::new)
                            .map_err(|e| format!("importing the corpus failed: {e:#}"))?;
                            self.stores.push(g.clone());
                            Ok(g)
                        })
                        .clone();
                    let store = match store {
                        Ok(s) => s,
                        Err(why) => {
                            out.push(skip(why));
                            continue;
                        }
                    };
                    let args: &'static [&'static str] = match id {
                        "cowspace-overlay-native" | "cowspace-overlay-native-socket" => {
                            &["--materializer", "overlay", "--lower", "native"]
                        }
                        "cowspace-overlay-view" | "cowspace-overlay-socket" => {
                            &["--materializer", "overlay", "--lower", "view"]
                        }
                        "cowspace-overlay-checkout" => {
                            &["--materializer", "overlay", "--lower", "checkout"]
                        }
                        _ => &["--materializer", "fuse"],
                    };
                    match Cowspace::probed(id, args, store, None, Speed::Fast, ctx.scratch) {
                        Ok((mut m, note)) => {
                            self.notes.push(note);
                            m.socket = id.ends_with("-socket");
                            Box::new(m)
                        }
                        Err(why) => {
                            out.push(skip(why));
                            continue;
                        }
                    }
                }
                "cowspace-btrfs" | "btrfs-snapshot" | "cowspace-reflink" | "reflink-copy" => {
                    let k = usize::from(id.contains("reflink"));
                    let fs = loops[k]
                        .get_or_insert_with(|| {
                            let l = LoopFs::make(ctx, if k == 0 { "btrfs" } else { "xfs" })
                                .map(Arc::new)?;
                            self.loops.push(l.clone());
                            self.notes.push(format!(
                                "{}: a {} GiB sparse {} image at {}, loop-mounted at {} \
                                 (made and removed by bench).",
                                if k == 0 {
                                    "btrfs methods"
                                } else {
                                    "reflink methods"
                                },
                                l.size >> 30,
                                if k == 0 {
                                    "btrfs (mkfs.btrfs)"
                                } else {
                                    "XFS (mkfs.xfs -m reflink=1)"
                                },
                                l.img.display(),
                                l.mnt.display()
                            ));
                            Ok(l)
                        })
                        .clone();
                    let fs = match fs {
                        Ok(f) => f,
                        Err(why) => {
                            out.push(skip(why));
                            continue;
                        }
                    };
                    if id.starts_with("cowspace-") {
                        let store = loop_stores[k]
                            .get_or_insert_with(|| {
                                let mc = ctx.mountctl.clone()?;
                                eprintln!(
                                    "bench: materialize: importing the checkout into a store on \
                                     the {} loop filesystem (untimed)…",
                                    fs.kind
                                );
                                let g = StoreGuard::import(&mc, fs.mnt.join("store"), &src)
                                    .map(|mut g| {
                                        g.remove_root = false;
                                        Arc::new(g)
                                    })
                                    .map_err(|e| format!("importing the corpus failed: {e:#}"))?;
                                self.stores.push(g.clone());
                                Ok(g)
                            })
                            .clone();
                        let store = match store {
                            Ok(s) => s,
                            Err(why) => {
                                out.push(skip(why));
                                continue;
                            }
                        };
                        let (args, speed): (&'static [&'static str], Speed) = if k == 0 {
                            (&["--materializer", "btrfs"], Speed::Fast)
                        } else {
                            (&["--materializer", "reflink"], Speed::Medium)
                        };
                        match Cowspace::probed(
                            id,
                            args,
                            store,
                            Some(fs.clone()),
                            speed,
                            ctx.scratch,
                        ) {
                            Ok((m, note)) => {
                                self.notes.push(note);
                                Box::new(m)
                            }
                            Err(why) => {
                                out.push(skip(why));
                                continue;
                            }
                        }
                    } else {
                        match LoopBaseline::prepare(id, fs.clone(), &src) {
                            Ok(m) => Box::new(m),
                            Err(e) => {
                                out.push(skip(format!("preparing its source failed: {e:#}")));
                                continue;
                            }
                        }
                    }
                }
                "cp-a" => Box::new(CpA { tree: src.clone() }),
                "git-worktree" | "git-clone-shared" | "git-clone-local" => Box::new(Git {
                    id,
                    repo: repo.clone().expect("with the checkout"),
                }),
                "overlayfs" => {
                    if !ctx.is_root {
                        out.push(skip("mounting overlayfs needs root".into()));
                        continue;
                    }
                    if !std::fs::read_to_string("/proc/filesystems")
                        .is_ok_and(|f| f.lines().any(|l| l.ends_with("\toverlay")))
                        && proc::run(Command::new("modprobe").arg("overlay")).is_err()
                    {
                        out.push(skip("the kernel has no overlay filesystem".into()));
                        continue;
                    }
                    Box::new(Overlay {
                        lower: src.clone(),
                        fuse: false,
                        scratch: ctx.scratch.to_path_buf(),
                    })
                }
                "fuse-overlayfs" => {
                    if proc::which("fuse-overlayfs").is_none() {
                        out.push(skip(
                            "fuse-overlayfs not found on PATH (apt-get install -y fuse-overlayfs)"
                                .into(),
                        ));
                        continue;
                    }
                    Box::new(Overlay {
                        lower: src.clone(),
                        fuse: true,
                        scratch: ctx.scratch.to_path_buf(),
                    })
                }
                _ => unreachable!(),
            };
            out.push(Prepared::Ready(Box::new(UseCost {
                m,
                largest: self.largest.clone(),
                moved: moved.clone(),
            })));
        }
        Ok(out)
    }
}

fn largest_file(tree: &Path) -> Result<Option<PathBuf>> {
    let mut best: Option<(u64, PathBuf)> = None;
    walk::visit(tree, &mut |rel, md| {
        if md.is_file() && best.as_ref().is_none_or(|(s, _)| md.len() > *s) {
            best = Some((md.len(), rel.to_path_buf()));
        }
        Ok(())
    })?;
    Ok(best.map(|(_, p)| p))
}

/// Entries beneath the directory [`dir_to_move`] picks, as near as the tree has.
const MOVED_DIR_ENTRIES: usize = 500;

/// The directory of `tree` (not the root) with the number of entries beneath it nearest
/// [`MOVED_DIR_ENTRIES`] (the first in path order among equals), and that number.
fn dir_to_move(tree: &Path) -> Result<Option<(PathBuf, usize)>> {
    let mut counts: std::collections::BTreeMap<PathBuf, usize> = Default::default();
    walk::visit(tree, &mut |rel, md| {
        if md.is_dir() {
            counts.entry(rel.to_path_buf()).or_insert(0);
        }
        for a in rel.ancestors().skip(1) {
            if !a.as_os_str().is_empty() {
                *counts.entry(a.to_path_buf()).or_insert(0) += 1;
            }
        }
        Ok(())
    })?;
    Ok(counts
        .into_iter()
        .min_by_key(|(_, n)| n.abs_diff(MOVED_DIR_ENTRIES)))
}

/// Used bytes of the filesystem holding `p`, after flushing it.
fn fs_used(p: &Path) -> Result<u64> {
    nix::unistd::sync();
    let s = nix::sys::statvfs::statvfs(p).with_context(|| format!("statvfs {}", p.display()))?;
    Ok((s.blocks() - s.blocks_free()) * s.fragment_size())
}

fn git_status(p: &Path) -> Result<()> {
    proc::run(git().arg("-C").arg(p).args(["status", "--porcelain"])).map(drop)
}

/// Runs the use workload on any [`Materializer`].
struct UseCost {
    m: Box<dyn Materializer>,
    largest: Option<PathBuf>,
    moved: Option<PathBuf>,
}

impl Method for UseCost {
    fn info(&self) -> MethodInfo {
        self.m.info()
    }

    fn slow(&self) -> bool {
        self.m.speed() == Speed::Slow
    }

    fn run_once(&mut self, ctx: &Ctx, round: usize) -> Result<Sample> {
        let id = self.m.info().id;
        let dir = DirGuard::create(ctx.scratch_path(&format!("mat-{id}-r{round}")))?;
        for b in self.m.backing() {
            ctx.prepare_cache(&b)?;
        }
        self.m.reset_peak_rss();
        ctx.before_step()?;
        let before = self.m.disk_fs().map(|f| fs_used(&f)).transpose()?;
        let (ws, t_make) = timed(|| self.m.create(&dir.path().join("a")))?;
        let mut s: Sample = vec![("materialize_s", t_make.wall_s())];
        let disk = match (self.m.disk_fs(), before) {
            (Some(f), Some(b)) => fs_used(&f)?.saturating_sub(b),
            _ => {
                let mut d = 0;
                for c in &ws.cost_dirs {
                    d += walk::disk_added(c)?;
                }
                d
            }
        };
        s.push(("disk_added_bytes", disk as f64));
        let p = ws.path.clone();
        let fast = self.m.speed() == Speed::Fast;
        if ws.has_git && !fast {
            ctx.before_step()?;
            let (_, t) = ctx.worker_step(|| git_status(&p))?;
            s.push(("git_status_s", t.wall_s()));
        }
        for key in ["stat_walk_1_s", "stat_walk_2_s"] {
            ctx.before_step()?;
            let (_, t) = ctx.worker_step(|| walk::visit(&p, &mut |_, _| Ok(())))?;
            s.push((key, t.wall_s()));
        }
        ctx.before_step()?;
        let (_, t) = ctx.worker_step(|| walk::read_all(&p))?;
        s.push(("full_read_s", t.wall_s()));
        ctx.before_step()?;
        let (_, t) = ctx.worker_step(|| {
            let (code, out, err) = proc::run_status(
                Command::new("grep")
                    .args(["-r", "-F", "-l", "--", GREP_NEEDLE])
                    .arg(&p),
            )?;
            // 1 = no match, which is the expected outcome.
            anyhow::ensure!(
                code == Some(1),
                "grep exited {code:?}: {}",
                proc::tail(&err, &out)
            );
            Ok(())
        })?;
        s.push(("grep_s", t.wall_s()));
        ctx.before_step()?;
        let (_, t) = ctx.worker_step(|| write_workload(&p))?;
        s.push(("write_s", t.wall_s()));
        if let Some(l) = &self.largest {
            ctx.before_step()?;
            let (_, t) = ctx.worker_step(|| {
                let mut f = std::fs::OpenOptions::new().append(true).open(p.join(l))?;
                f.write_all(b"x")?;
                Ok(())
            })?;
            s.push(("append_s", t.wall_s()));
        }
        ctx.before_step()?;
        let (did, t) = timed(|| self.m.commit(&ws))?;
        if did {
            s.push(("commit_s", t.wall_s()));
        }
        if let Some(dir) = &self.moved {
            // After the capture, so the rows before stay as they were. `mv`, as a user
            // would: where rename says EXDEV (overlayfs), it copies.
            ctx.before_step()?;
            let mut to = dir.clone().into_os_string();
            to.push("-moved");
            let (_, t) = ctx.worker_step(|| {
                proc::run(Command::new("mv").arg(p.join(dir)).arg(p.join(&to))).map(drop)
            })?;
            s.push(("dir_rename_s", t.wall_s()));
        }
        if let Some((_, peak)) = self.m.daemon_rss() {
            s.push(("daemon_peak_rss_bytes", peak as f64));
        }
        ctx.before_step()?;
        let (_, t) = timed(|| self.m.remove(ws))?;
        s.push(("teardown_s", t.wall_s()));

        if fast {
            // `git status` as the first command in a fresh workspace.
            ctx.before_step()?;
            let ws = self.m.create(&dir.path().join("b"))?;
            if ws.has_git {
                let (_, t) = ctx.worker_step(|| git_status(&ws.path))?;
                s.push(("git_status_s", t.wall_s()));
            }
            self.m.remove(ws)?;
            // The fast loop: create and remove, back to back.
            for i in 0..ctx.fast_per_round() {
                ctx.before_step()?;
                let (ws, t) = timed(|| self.m.create(&dir.path().join(format!("f{i}"))))?;
                s.push(("create_s", t.wall_s()));
                let (_, t) = timed(|| self.m.remove(ws))?;
                s.push(("remove_s", t.wall_s()));
            }
            // N concurrent creates.
            for &n in &ctx.concurrency {
                let Some(key) = conc_metric(n) else { continue };
                ctx.before_step()?;
                let m = &*self.m;
                let base = dir.path().join(format!("c{n}"));
                let (made, t) = timed(|| {
                    let made: Vec<Result<Workspace>> = std::thread::scope(|sc| {
                        let hs: Vec<_> = (0..n)
                            .map(|i| {
                                let d = base.join(i.to_string());
                                sc.spawn(move || m.create(&d))
                            })
                            .collect();
                        hs.into_iter()
                            .map(|h| {
                                h.join()
                                    .unwrap_or_else(|_| Err(anyhow::anyhow!("panicked")))
                            })
                            .collect()
                    });
                    Ok(made)
                })?;
                let rss = self.m.daemon_rss();
                let mut first_err = None;
                let mut alive = Vec::new();
                for w in made {
                    match w {
                        Ok(w) => alive.push(w),
                        Err(e) => {
                            first_err.get_or_insert(e);
                        }
                    }
                }
                for w in alive {
                    if let Err(e) = self.m.remove(w) {
                        first_err.get_or_insert(e);
                    }
                }
                if let Some(e) = first_err {
                    return Err(e.context(format!("{n} concurrent creates")));
                }
                s.push((key, t.wall_s()));
                if Some(&n) == ctx.concurrency.iter().max()
                    && let Some((now, _)) = rss
                {
                    s.push(("concurrent_rss_bytes", now as f64));
                }
            }
        }
        dir.remove()?;
        Ok(s)
    }
}

fn write_workload(root: &Path) -> Result<()> {
    let d = root.join("bench-writes");
    std::fs::create_dir(&d)?;
    let data = vec![b'w'; WRITE_FILE_BYTES];
    for i in 0..WRITE_CREATE_FILES {
        std::fs::write(d.join(format!("f{i}")), &data)?;
    }
    for i in 0..WRITE_RENAME_FILES {
        std::fs::rename(d.join(format!("f{i}")), d.join(format!("r{i}")))?;
    }
    for i in 0..WRITE_DELETE_FILES {
        std::fs::remove_file(d.join(format!("f{}", WRITE_CREATE_FILES - 1 - i)))?;
    }
    Ok(())
}

struct CpA {
    tree: PathBuf,
}

impl Materializer for CpA {
    fn info(&self) -> MethodInfo {
        info(
            "cp-a",
            "cp -a CHECKOUT WS; git add -A && git commit; rm -rf WS".into(),
        )
    }
    fn speed(&self) -> Speed {
        Speed::Slow
    }
    fn backing(&self) -> Vec<PathBuf> {
        vec![self.tree.clone()]
    }
    fn create(&self, dir: &Path) -> Result<Workspace> {
        let path = dir.join("ws");
        std::fs::create_dir_all(dir)?;
        let guard = DirGuard::adopt(path.clone());
        proc::run(Command::new("cp").arg("-a").arg(&self.tree).arg(&path))?;
        Ok(Workspace {
            cost_dirs: vec![path.clone()],
            path,
            has_git: true,
            id: None,
            mount: None,
            guard,
        })
    }
}

struct Git {
    id: &'static str,
    repo: PathBuf,
}

impl Materializer for Git {
    fn info(&self) -> MethodInfo {
        let c = match self.id {
            "git-worktree" => {
                "git --git-dir REPO worktree add -q --detach WS main; git add -A && git commit; git worktree remove --force WS"
            }
            "git-clone-shared" => {
                "git clone -q --shared REPO WS; git add -A && git commit; rm -rf WS"
            }
            _ => "git clone -q --local REPO WS; git add -A && git commit; rm -rf WS",
        };
        info(self.id, c.into())
    }

    fn speed(&self) -> Speed {
        Speed::Slow
    }

    fn backing(&self) -> Vec<PathBuf> {
        vec![self.repo.clone()]
    }

    fn create(&self, dir: &Path) -> Result<Workspace> {
        let path = dir.join("ws");
        std::fs::create_dir_all(dir)?;
        let guard = DirGuard::adopt(path.clone());
        let mut cost_dirs = vec![path.clone()];
        match self.id {
            "git-worktree" => {
                proc::run(
                    git()
                        .arg("--git-dir")
                        .arg(&self.repo)
                        .args(["worktree", "add", "-q", "--detach"])
                        .arg(&path)
                        .arg("main"),
                )?;
                let name = path.file_name().context("worktree name")?;
                cost_dirs.push(self.repo.join("worktrees").join(name));
            }
            "git-clone-shared" => {
                proc::run(
                    git()
                        .args(["clone", "-q", "--shared"])
                        .arg(&self.repo)
                        .arg(&path),
                )?;
            }
            _ => {
                proc::run(
                    git()
                        .args(["clone", "-q", "--local"])
                        .arg(&self.repo)
                        .arg(&path),
                )?;
            }
        }
        Ok(Workspace {
            path,
            cost_dirs,
            has_git: true,
            id: None,
            mount: None,
            guard,
        })
    }

    fn remove(&self, ws: Workspace) -> Result<()> {
        if self.id == "git-worktree" {
            proc::run(
                git()
                    .arg("--git-dir")
                    .arg(&self.repo)
                    .args(["worktree", "remove", "--force"])
                    .arg(&ws.path),
            )?;
        }
        ws.guard.remove()
    }
}

struct Overlay {
    lower: PathBuf,
    fuse: bool,
    scratch: PathBuf,
}

impl Materializer for Overlay {
    fn info(&self) -> MethodInfo {
        if self.fuse {
            info("fuse-overlayfs", "mkdir upper work ws; fuse-overlayfs -o lowerdir=CHECKOUT,upperdir=upper,workdir=work ws; git add -A && git commit; fusermount -u ws; rm -rf upper work ws".into())
        } else {
            info("overlayfs", "mkdir upper work ws; mount -t overlay overlay -o lowerdir=CHECKOUT,upperdir=upper,workdir=work ws; git add -A && git commit; umount ws; rm -rf upper work ws".into())
        }
    }

    fn speed(&self) -> Speed {
        Speed::Fast
    }

    fn backing(&self) -> Vec<PathBuf> {
        vec![self.lower.clone()]
    }

    fn create(&self, dir: &Path) -> Result<Workspace> {
        let base = dir.join("overlay");
        std::fs::create_dir_all(dir)?;
        let guard = DirGuard::create(base.clone())?;
        let (upper, work, merged) = (base.join("upper"), base.join("work"), base.join("ws"));
        for d in [&upper, &work, &merged] {
            std::fs::create_dir(d)?;
        }
        let opts = format!(
            "lowerdir={},upperdir={},workdir={}",
            self.lower.display(),
            upper.display(),
            work.display()
        );
        if self.fuse {
            proc::run(
                Command::new("fuse-overlayfs")
                    .arg("-o")
                    .arg(&opts)
                    .arg(&merged),
            )?;
        } else {
            proc::run(
                Command::new("mount")
                    .args(["-t", "overlay", "overlay", "-o"])
                    .arg(&opts)
                    .arg(&merged),
            )?;
        }
        let mount = Some(MountGuard::new(merged.clone()));
        Ok(Workspace {
            path: merged,
            cost_dirs: vec![upper, work],
            has_git: true,
            id: None,
            mount,
            guard,
        })
    }

    /// The fuse-overlayfs processes of this run (one per mount): summed.
    fn daemon_rss(&self) -> Option<(u64, u64)> {
        if !self.fuse {
            return None;
        }
        let scratch = self.scratch.to_string_lossy().into_owned();
        let pids = find_pids(|a| {
            a.first()
                .is_some_and(|p| p.rsplit('/').next() == Some("fuse-overlayfs"))
                && a.iter().any(|x| x.contains(&scratch))
        });
        if pids.is_empty() {
            return None;
        }
        let sum = |k: &str| pids.iter().filter_map(|p| proc_status_bytes(*p, k)).sum();
        Some((sum("VmRSS"), sum("VmHWM")))
    }
}

/// A loop-mounted btrfs or XFS (reflink=1) filesystem in the run's scratch
/// directory; unmounted (the loop device is auto-cleared) and deleted on drop.
pub struct LoopFs {
    kind: &'static str,
    img: PathBuf,
    mnt: PathBuf,
    size: u64,
}

impl LoopFs {
    fn make(ctx: &Ctx, kind: &'static str) -> std::result::Result<Self, String> {
        if ctx.quick {
            return Err("loop filesystems are not made in --quick mode".into());
        }
        if !ctx.is_root {
            return Err(format!(
                "needs a loop {kind} filesystem, and making one needs root"
            ));
        }
        let mkfs = if kind == "btrfs" {
            "mkfs.btrfs"
        } else {
            "mkfs.xfs"
        };
        if proc::which(mkfs).is_none() {
            return Err(format!(
                "{mkfs} not found (apt-get install -y {})",
                if kind == "btrfs" {
                    "btrfs-progs"
                } else {
                    "xfsprogs"
                }
            ));
        }
        if !std::fs::read_to_string("/proc/filesystems")
            .is_ok_and(|f| f.lines().any(|l| l.trim_end().ends_with(kind)))
            && proc::run(Command::new("modprobe").arg(kind)).is_err()
        {
            return Err(format!("the kernel has no {kind} filesystem"));
        }
        let size = if ctx.corpus.meta.stats.bytes.saturating_mul(4) < LOOP_SMALL {
            LOOP_SMALL
        } else {
            LOOP_LARGE
        };
        // Both images may fill up (sparse), plus a margin for everything else.
        let avail = nix::sys::statvfs::statvfs(ctx.scratch)
            .map(|s| s.blocks_available() * s.fragment_size())
            .unwrap_or(0);
        if avail < 2 * size + (2 << 30) {
            return Err(format!(
                "no space for two {} GiB loop filesystems in {} ({} GiB free)",
                size >> 30,
                ctx.scratch.display(),
                avail >> 30
            ));
        }
        let img = ctx.scratch_path(&format!("{kind}.img"));
        let mnt = ctx.scratch_path(&format!("{kind}-mnt"));
        let fs = LoopFs {
            kind,
            img: img.clone(),
            mnt: mnt.clone(),
            size,
        };
        let r = (|| -> Result<()> {
            std::fs::File::create(&img)?.set_len(size)?;
            let mut c = Command::new(mkfs);
            if kind == "btrfs" {
                c.args(["-q", "-f"]);
            } else {
                c.args(["-q", "-f", "-m", "reflink=1"]);
            }
            proc::run(c.arg(&img))?;
            std::fs::create_dir(&mnt)?;
            proc::run(
                Command::new("mount")
                    .args(["-o", "loop"])
                    .arg(&img)
                    .arg(&mnt),
            )?;
            Ok(())
        })();
        r.map(|()| fs)
            .map_err(|e| format!("making the loop {kind} filesystem failed: {e:#}"))
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        // remove_tree unmounts everything at or below the mount point first.
        for p in [&self.mnt, &self.img] {
            if let Err(e) = crate::cancel::remove_tree(p) {
                eprintln!("bench: cleanup of {} failed: {e:#}", p.display());
            }
        }
    }
}

/// `btrfs subvolume snapshot` of a subvolume holding the checkout, or `cp -a
/// --reflink=always` of a copy of it on XFS.
struct LoopBaseline {
    id: &'static str,
    fs: Arc<LoopFs>,
    src: PathBuf,
    n: AtomicUsize,
}

impl LoopBaseline {
    fn prepare(id: &'static str, fs: Arc<LoopFs>, checkout: &Path) -> Result<Self> {
        eprintln!(
            "bench: materialize: copying the checkout onto the {} loop filesystem (untimed)…",
            fs.kind
        );
        let src = fs.mnt.join("base");
        if id == "btrfs-snapshot" {
            proc::run(
                Command::new("btrfs")
                    .args(["-q", "subvolume", "create"])
                    .arg(&src),
            )?;
            let mut from = checkout.as_os_str().to_owned();
            from.push("/.");
            proc::run(Command::new("cp").arg("-a").arg(from).arg(&src))?;
        } else {
            proc::run(Command::new("cp").arg("-a").arg(checkout).arg(&src))?;
        }
        Ok(Self {
            id,
            fs,
            src,
            n: AtomicUsize::new(0),
        })
    }
}

impl Materializer for LoopBaseline {
    fn info(&self) -> MethodInfo {
        if self.id == "btrfs-snapshot" {
            info(self.id, "btrfs subvolume snapshot BASE WS (BASE: a subvolume holding the checkout); git add -A && git commit; btrfs subvolume delete WS".into())
        } else {
            info(
                self.id,
                "cp -a --reflink=always SRC WS (SRC: a copy of the checkout on XFS); git add -A && git commit; rm -rf WS".into(),
            )
        }
    }

    fn speed(&self) -> Speed {
        if self.id == "btrfs-snapshot" {
            Speed::Fast
        } else {
            Speed::Medium
        }
    }

    fn backing(&self) -> Vec<PathBuf> {
        vec![self.src.clone()]
    }

    fn disk_fs(&self) -> Option<PathBuf> {
        Some(self.fs.mnt.clone())
    }

    fn create(&self, _dir: &Path) -> Result<Workspace> {
        let path = self
            .fs
            .mnt
            .join(format!("ws-{}", self.n.fetch_add(1, Ordering::SeqCst)));
        let guard = DirGuard::adopt(path.clone());
        if self.id == "btrfs-snapshot" {
            proc::run(
                Command::new("btrfs")
                    .args(["-q", "subvolume", "snapshot"])
                    .arg(&self.src)
                    .arg(&path),
            )?;
        } else {
            proc::run(
                Command::new("cp")
                    .args(["-a", "--reflink=always"])
                    .arg(&self.src)
                    .arg(&path),
            )?;
        }
        Ok(Workspace {
            cost_dirs: Vec::new(),
            path,
            has_git: true,
            id: None,
            mount: None,
            guard,
        })
    }

    fn remove(&self, ws: Workspace) -> Result<()> {
        if self.id == "btrfs-snapshot" {
            proc::run(
                Command::new("btrfs")
                    .args(["-q", "subvolume", "delete"])
                    .arg(&ws.path),
            )?;
        }
        ws.guard.remove()
    }
}

/// A cowspace workspace made by `mountctl create bench ARGS --path WS`.
struct Cowspace {
    id: &'static str,
    args: &'static [&'static str],
    store: Arc<StoreGuard>,
    /// The loop filesystem the store is on (btrfs, reflink).
    fs: Option<Arc<LoopFs>>,
    speed: Speed,
    n: AtomicUsize,
    /// Create and remove through the daemon's control socket, as a runtime embedding
    /// cowspace does (one connection per request), instead of running `mountctl`.
    socket: bool,
}

impl Cowspace {
    fn mountctl(&self) -> &Mountctl {
        &self.store.mountctl
    }

    /// The method after one untimed create + remove (which also builds what the
    /// first workspace of a snapshot needs: the checkout, the base subvolume), with a
    /// note saying how long that took. Exit 7 (unsupported on this host) or 2 (no
    /// such materializer) makes the method skipped with mountctl's reason.
    fn probed(
        id: &'static str,
        args: &'static [&'static str],
        store: Arc<StoreGuard>,
        fs: Option<Arc<LoopFs>>,
        speed: Speed,
        scratch: &Path,
    ) -> std::result::Result<(Self, String), String> {
        let m = Cowspace {
            id,
            args,
            store,
            fs,
            speed,
            n: AtomicUsize::new(0),
            socket: false,
        };
        let dir = scratch.join(format!("probe-{id}"));
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let mut c = m.mountctl().command(&m.store.root);
        c.args(["create", "bench"])
            .args(args)
            .arg("--path")
            .arg(m.ws_path(&dir));
        let t0 = std::time::Instant::now();
        let (code, out, err) = proc::run_status(&mut c).map_err(|e| format!("{e:#}"))?;
        let took = t0.elapsed().as_secs_f64();
        let r = match code {
            Some(0) => {
                let v: serde_json::Value =
                    serde_json::from_slice(&out).map_err(|e| e.to_string())?;
                let ws = v["id"].as_str().unwrap_or_default().to_string();
                m.mountctl()
                    .json(
                        &m.store.root,
                        &["remove".as_ref(), ws.as_ref(), "--force".as_ref()],
                    )
                    .map_err(|e| format!("{e:#}"))?;
                Ok(())
            }
            Some(2) | Some(7) => Err(format!(
                "mountctl create {}: {}",
                args.join(" "),
                proc::tail(&err, &out).replace('\n', " ")
            )),
            _ => Ok(()), // a real failure: let the runs fail and report it
        };
        let _ = crate::cancel::remove_tree(&dir);
        let _ = crate::cancel::remove_tree(&m.ws_path(&dir));
        r?;
        let note = format!(
            "{id}: the first workspace of the snapshot (untimed, before the runs) took \
             {took:.2} s (it builds what later creates share: the checkout, the base \
             subvolume, the blob cache entries)."
        );
        Ok((m, note))
    }

    /// One request on a new connection to the daemon's control socket; its result.
    fn request(&self, op: &str, args: serde_json::Value) -> Result<serde_json::Value> {
        use std::io::{BufRead, BufReader};
        let sock = self.store.root.join("run/fsd.sock");
        let mut s = std::os::unix::net::UnixStream::connect(&sock)
            .with_context(|| format!("connecting to {}", sock.display()))?;
        let mut line = serde_json::to_vec(&serde_json::json!({"op": op, "args": args}))?;
        line.push(b'\n');
        s.write_all(&line)?;
        let mut reply = String::new();
        BufReader::new(&s).read_line(&mut reply)?;
        let v: serde_json::Value = serde_json::from_str(&reply)
            .with_context(|| format!("the daemon's reply to {op}: {reply:?}"))?;
        anyhow::ensure!(
            v["ok"] == true,
            "{op} through the control socket: {}",
            v["error"]
        );
        Ok(v["result"].clone())
    }

    /// The `create` request's arguments that `self.args` (`--materializer M`,
    /// `--lower L`) stand for.
    fn socket_args(&self) -> serde_json::Value {
        let mut v = serde_json::json!({"snapshot": "bench"});
        for pair in self.args.chunks(2) {
            if let [flag, value] = pair {
                v[flag.trim_start_matches("--")] = (*value).into();
            }
        }
        v
    }

    fn ws_path(&self, dir: &Path) -> PathBuf {
        match &self.fs {
            // Full-tree materializers: the workspace on the same filesystem.
            Some(fs) => fs
                .mnt
                .join(format!("ws-{}", self.n.fetch_add(1, Ordering::SeqCst))),
            None => dir.join("ws"),
        }
    }
}

impl Materializer for Cowspace {
    fn info(&self) -> MethodInfo {
        info(
            self.id,
            if self.socket {
                let mut create = self.socket_args();
                create["path"] = "WS".into();
                format!(
                    "{{\"op\":\"create\",\"args\":{create}}} on ROOT/run/fsd.sock (a new connection per request); mountctl commit ID; {{\"op\":\"remove\",\"args\":{{\"workspace\":ID,\"force\":true}}}}"
                )
            } else {
                format!(
                    "mountctl --root ROOT --json create bench {} --path WS; mountctl commit ID; mountctl remove ID --force",
                    self.args.join(" ")
                )
            },
        )
    }

    fn speed(&self) -> Speed {
        self.speed
    }

    fn backing(&self) -> Vec<PathBuf> {
        vec![self.store.root.join("cache")]
    }

    fn disk_fs(&self) -> Option<PathBuf> {
        self.fs.as_ref().map(|f| f.mnt.clone())
    }

    fn create(&self, dir: &Path) -> Result<Workspace> {
        std::fs::create_dir_all(dir)?;
        let path = self.ws_path(dir);
        let guard = DirGuard::adopt(path.clone());
        let v = if self.socket {
            let path = path.to_str().context("workspace path is not UTF-8")?;
            let mut args = self.socket_args();
            args["path"] = path.into();
            let r = self.request("create", args)?;
            serde_json::json!({"id": r["id"], "path": r["path"]})
        } else {
            let mut args: Vec<&std::ffi::OsStr> = vec!["create".as_ref(), "bench".as_ref()];
            args.extend(self.args.iter().map(|a| std::ffi::OsStr::new(*a)));
            args.extend(["--path".as_ref(), path.as_os_str()]);
            self.mountctl().json(&self.store.root, &args)?
        };
        let ws = v["id"]
            .as_str()
            .context("mountctl create printed no workspace id")?;
        let private = self.store.root.join("workspaces").join(ws);
        anyhow::ensure!(
            private.is_dir(),
            "workspace {ws}'s private state is not at {} (needed for its disk cost)",
            private.display()
        );
        let path = v["path"].as_str().map_or(path, PathBuf::from);
        Ok(Workspace {
            cost_dirs: vec![private],
            has_git: path.join(".git").exists(),
            path,
            id: Some(ws.to_string()),
            mount: None,
            guard,
        })
    }

    fn commit(&self, ws: &Workspace) -> Result<bool> {
        let id = ws.id.clone().context("workspace id")?;
        self.mountctl()
            .json(&self.store.root, &["commit".as_ref(), id.as_ref()])?;
        Ok(true)
    }

    fn daemon_rss(&self) -> Option<(u64, u64)> {
        let pid = self.store.daemon_pid()?;
        Some((
            proc_status_bytes(pid, "VmRSS")?,
            proc_status_bytes(pid, "VmHWM")?,
        ))
    }

    fn reset_peak_rss(&self) {
        // `5`: the peak resident size set to the current one (Linux 4.0 and later).
        if let Some(pid) = self.store.daemon_pid()
            && let Err(e) = std::fs::write(format!("/proc/{pid}/clear_refs"), "5")
        {
            eprintln!("bench: resetting the daemon's peak RSS (pid {pid}): {e}");
        }
    }

    fn remove(&self, ws: Workspace) -> Result<()> {
        let id = ws.id.clone().context("workspace id")?;
        if self.socket {
            self.request(
                "remove",
                serde_json::json!({"workspace": id, "force": true}),
            )?;
        } else {
            self.mountctl().json(
                &self.store.root,
                &["remove".as_ref(), id.as_ref(), "--force".as_ref()],
            )?;
        }
        ws.guard.remove()
    }
}
