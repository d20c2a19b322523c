//! Materialize: making a writable copy of the corpus for one worker, and what using
//! it costs — cowspace materializers against `cp -a`, `git worktree`, `git clone`,
//! kernel overlayfs over a plain directory, `fuse-overlayfs`, a btrfs subvolume
//! snapshot and `cp --reflink=always`.
//!
//! Every method starts from the same source: a normal git checkout of the corpus
//! (the tree plus `.git`), so `git status` and a commit mean the same in every
//! workspace. Each method implements [`Materializer`] (create and remove one
//! workspace): `baselines.rs` (`cp -a`, git, overlayfs and fuse-overlayfs),
//! `loopfs.rs` (btrfs and reflink methods, on loop filesystems bench makes and
//! removes) and `cowspace.rs`. [`UseCost`] (`usecost.rs`) wraps one into a runner
//! [`Method`] that times the create, measures the disk it added, runs the same use
//! workload in every workspace, times the capture of the changes and the removal, and
//! — for the methods that create in milliseconds — a fast loop of creates and removes
//! and N concurrent creates.

mod baselines;
mod cowspace;
mod loopfs;
mod usecost;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use anyhow::Result;

use self::baselines::{CpA, Git, Overlay};
use self::cowspace::Cowspace;
use self::loopfs::LoopBaseline;
pub use self::loopfs::LoopFs;
use self::usecost::{MOVED_DIR_ENTRIES, UseCost, dir_to_move, largest_file};
use super::{Ctx, MethodInfo, Prepared, Section, metric};
use crate::cancel::{DirGuard, MountGuard};
use crate::corpus::git;
use crate::mountctl::StoreGuard;
use crate::proc;
use crate::results::{Better, MetricDef, Role};

/// Files the write workload creates, renames and deletes.
const WRITE_CREATE_FILES: usize = 1000;
const WRITE_RENAME_FILES: usize = 100;
const WRITE_DELETE_FILES: usize = 100;
const WRITE_FILE_BYTES: usize = 1024;
/// A string no corpus file contains, so grep reads everything.
const GREP_NEEDLE: &str = "cowspace-bench-needle-0f3c9a";

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

impl Workspace {
    /// A workspace at `path` with git, no id and no mount of its own.
    fn plain(path: PathBuf, cost_dirs: Vec<PathBuf>, guard: DirGuard) -> Workspace {
        Workspace {
            path,
            cost_dirs,
            has_git: true,
            id: None,
            mount: None,
            guard,
        }
    }
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

/// What several methods share, made at the first one's need (or why it could not be):
/// the store on the scratch filesystem, and the loop filesystems (btrfs, XFS) with a
/// store on each.
#[derive(Default)]
struct Fixtures {
    ext4_store: Option<std::result::Result<Arc<StoreGuard>, String>>,
    loops: [Option<std::result::Result<Arc<LoopFs>, String>>; 2],
    loop_stores: [Option<std::result::Result<Arc<StoreGuard>, String>>; 2],
}

impl MaterializeSection {
    /// Method `id` made ready, from the checkout `src` (and its repository `repo`), or
    /// why it is skipped.
    fn materializer(
        &mut self,
        ctx: &Ctx,
        id: &'static str,
        src: &Path,
        repo: &Option<PathBuf>,
        fx: &mut Fixtures,
    ) -> std::result::Result<Box<dyn Materializer>, String> {
        Ok(match id {
            "cowspace-overlay-native"
            | "cowspace-overlay-native-socket"
            | "cowspace-overlay-view"
            | "cowspace-overlay-socket"
            | "cowspace-overlay-checkout"
            | "cowspace-fuse"
            | "cowspace-fuse-socket" => {
                let store = fx
                    .ext4_store
                    .get_or_insert_with(|| {
                        eprintln!("bench: materialize: importing the checkout (untimed)…");
                        let root = ctx.scratch_path("materialize-store");
                        self.import_store(ctx, root, src, true)
                    })
                    .clone()?;
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
                let (mut m, note) =
                    Cowspace::probed(id, args, store, None, Speed::Fast, ctx.scratch)?;
                self.notes.push(note);
                m.socket = id.ends_with("-socket");
                Box::new(m)
            }
            "cowspace-btrfs" | "btrfs-snapshot" | "cowspace-reflink" | "reflink-copy" => {
                let k = usize::from(id.contains("reflink"));
                let fs = fx.loops[k]
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
                    .clone()?;
                if id.starts_with("cowspace-") {
                    let store = fx.loop_stores[k]
                        .get_or_insert_with(|| {
                            eprintln!(
                                "bench: materialize: importing the checkout into a store on \
                                 the {} loop filesystem (untimed)…",
                                fs.kind
                            );
                            // Its root goes with the loop filesystem.
                            self.import_store(ctx, fs.mnt.join("store"), src, false)
                        })
                        .clone()?;
                    let (args, speed): (&'static [&'static str], Speed) = if k == 0 {
                        (&["--materializer", "btrfs"], Speed::Fast)
                    } else {
                        (&["--materializer", "reflink"], Speed::Medium)
                    };
                    let (m, note) =
                        Cowspace::probed(id, args, store, Some(fs.clone()), speed, ctx.scratch)?;
                    self.notes.push(note);
                    Box::new(m)
                } else {
                    let m = LoopBaseline::prepare(id, fs.clone(), src)
                        .map_err(|e| format!("preparing its source failed: {e:#}"))?;
                    Box::new(m)
                }
            }
            "cp-a" => Box::new(CpA {
                tree: src.to_path_buf(),
            }),
            "git-worktree" | "git-clone-shared" | "git-clone-local" => Box::new(Git {
                id,
                repo: repo.clone().expect("with the checkout"),
            }),
            "overlayfs" => {
                if !ctx.is_root {
                    return Err("mounting overlayfs needs root".into());
                }
                if !std::fs::read_to_string("/proc/filesystems")
                    .is_ok_and(|f| f.lines().any(|l| l.ends_with("\toverlay")))
                    && proc::run(Command::new("modprobe").arg("overlay")).is_err()
                {
                    return Err("the kernel has no overlay filesystem".into());
                }
                Box::new(Overlay {
                    lower: src.to_path_buf(),
                    fuse: false,
                    scratch: ctx.scratch.to_path_buf(),
                })
            }
            "fuse-overlayfs" => {
                if proc::which("fuse-overlayfs").is_none() {
                    return Err(
                        "fuse-overlayfs not found on PATH (apt-get install -y fuse-overlayfs)"
                            .into(),
                    );
                }
                Box::new(Overlay {
                    lower: src.to_path_buf(),
                    fuse: true,
                    scratch: ctx.scratch.to_path_buf(),
                })
            }
            _ => unreachable!(),
        })
    }

    /// A store at `root` holding the checkout `src` (imported untimed, kept until the
    /// section ends; `remove_root`: its directory goes with it).
    fn import_store(
        &mut self,
        ctx: &Ctx,
        root: PathBuf,
        src: &Path,
        remove_root: bool,
    ) -> std::result::Result<Arc<StoreGuard>, String> {
        let mc = ctx.mountctl.clone()?;
        let mut g = StoreGuard::import(&mc, root, src)
            .map_err(|e| format!("importing the corpus failed: {e:#}"))?;
        g.remove_root = remove_root;
        let g = Arc::new(g);
        self.stores.push(g.clone());
        Ok(g)
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
        let mut fixtures = Fixtures::default();

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
            let m = match self.materializer(ctx, id, &src, &repo, &mut fixtures) {
                Ok(m) => m,
                Err(why) => {
                    out.push(skip(why));
                    continue;
                }
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
