//! Materialize: making a writable copy of the corpus for one worker, and what using
//! it costs — cowspace materializers against `cp -a`, `git worktree`, `git clone`,
//! kernel overlayfs over a plain directory, `fuse-overlayfs`, btrfs and reflink.
//!
//! Each method implements [`Materializer`] (create and remove one workspace);
//! [`UseCost`] wraps it into a runner [`Method`] that times the create, measures the
//! disk it added, runs the same use workload in every workspace and times the
//! removal. Adding a cowspace materializer is one more `Materializer`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use super::{Ctx, Method, MethodInfo, Prepared, Sample, Section, metric};
use crate::cancel::{DirGuard, MountGuard};
use crate::corpus::{git, walk};
use crate::mountctl::Mountctl;
use crate::proc::{self, timed};
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
    /// Directories whose blocks are the workspace's disk cost.
    pub cost_dirs: Vec<PathBuf>,
    pub has_git: bool,
    /// The workspace id, for methods that have one (cowspace).
    pub id: Option<String>,
    pub mount: Option<MountGuard>,
    /// Removes everything the workspace created, also on error paths.
    pub guard: DirGuard,
}

/// One way to make a writable copy of the corpus.
pub trait Materializer {
    fn info(&self) -> MethodInfo;
    /// Makes a workspace below `dir` (an empty directory owned by the caller).
    fn create(&mut self, dir: &Path) -> Result<Workspace>;
    /// Removes it completely (timed as teardown).
    fn remove(&mut self, ws: Workspace) -> Result<()> {
        if let Some(m) = ws.mount {
            m.unmount()?;
        }
        ws.guard.remove()
    }
}

pub struct MaterializeSection {
    largest: Option<PathBuf>,
    /// The store the cowspace methods use; its daemon is stopped on drop.
    store: Option<StoreGuard>,
}

impl MaterializeSection {
    pub fn new() -> Self {
        Self {
            largest: None,
            store: None,
        }
    }
}

/// A store root whose daemon (started by `mountctl create` on demand) must be
/// stopped and whose mounts must go before the root is removed.
struct StoreGuard {
    mountctl: Mountctl,
    root: PathBuf,
}

impl Drop for StoreGuard {
    fn drop(&mut self) {
        let mut c = self.mountctl.command(&self.root);
        c.args(["daemon", "stop"]);
        if let Err(e) = proc::run(&mut c) {
            eprintln!(
                "bench: stopping the daemon of {}: {e:#}",
                self.root.display()
            );
        }
        if let Err(e) = crate::cancel::remove_tree(&self.root) {
            eprintln!("bench: cleanup of {} failed: {e:#}", self.root.display());
        }
    }
}

const IDS: &[&str] = &[
    "cowspace-overlay",
    "cowspace-fuse",
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
        "cowspace-overlay" => ("cowspace overlay", Role::Cowspace),
        "cowspace-fuse" => ("cowspace fuse", Role::Cowspace),
        "cowspace-btrfs" => ("cowspace btrfs", Role::Cowspace),
        "cowspace-reflink" => ("cowspace reflink", Role::Cowspace),
        "cp-a" => ("cp -a", Role::Baseline),
        "git-worktree" => ("git worktree add --detach", Role::Baseline),
        "git-clone-shared" => ("git clone --shared", Role::Baseline),
        "git-clone-local" => ("git clone --local", Role::Baseline),
        "overlayfs" => ("overlayfs over a plain dir", Role::Baseline),
        "fuse-overlayfs" => ("fuse-overlayfs", Role::Baseline),
        "btrfs-snapshot" => ("btrfs subvolume snapshot", Role::Baseline),
        "reflink-copy" => ("cp --reflink=always", Role::Baseline),
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

impl Section for MaterializeSection {
    fn id(&self) -> &'static str {
        "materialize"
    }

    fn title(&self) -> String {
        "Materialize: a writable copy for one worker, and using it".into()
    }

    fn description(&self) -> String {
        format!(
            "One run per method: create a workspace of the corpus (timed, including process \
             start), measure the disk it added (allocated blocks of what it created; hard links \
             shared with the source are free), stat every entry twice, read every file, grep \
             the tree for an absent string, `git status` (methods with a git checkout only), \
             write workload ({WRITE_CREATE_FILES} files of {WRITE_FILE_BYTES} B created, \
             {WRITE_RENAME_FILES} renamed, {WRITE_DELETE_FILES} deleted), append one byte to \
             the largest file, then remove the workspace (timed as teardown)."
        )
    }

    fn metrics(&self) -> Vec<MetricDef> {
        vec![
            MetricDef {
                show_p99: true,
                ..metric("materialize_s", "materialize", "s", Better::Lower)
            },
            metric("teardown_s", "teardown", "s", Better::Lower),
            metric("disk_added_bytes", "disk added", "bytes", Better::Lower),
            metric("stat_walk_1_s", "stat walk, first", "s", Better::Lower),
            metric("stat_walk_2_s", "stat walk, second", "s", Better::Lower),
            metric("full_read_s", "read every file", "s", Better::Lower),
            metric("grep_s", "grep -r (absent string)", "s", Better::Lower),
            metric("git_status_s", "git status", "s", Better::Lower),
            metric("write_s", "write workload", "s", Better::Lower),
            metric(
                "append_s",
                "1-byte append to the largest file",
                "s",
                Better::Lower,
            ),
        ]
    }

    fn method_ids(&self) -> Vec<&'static str> {
        IDS.to_vec()
    }

    fn prepare(&mut self, ctx: &Ctx, selected: &dyn Fn(&str) -> bool) -> Result<Vec<Prepared>> {
        let tree = ctx.corpus.tree.clone();
        self.largest = largest_file(&tree)?;
        let mut out = Vec::new();
        let mut store: Option<std::result::Result<(Mountctl, PathBuf), String>> = None;
        let mut repo: Option<std::result::Result<PathBuf, String>> = None;
        let mut need_repo = |ctx: &Ctx| -> std::result::Result<PathBuf, String> {
            repo.get_or_insert_with(|| {
                if proc::which("git").is_none() {
                    return Err("git not found on PATH".into());
                }
                let r = ctx
                    .corpus
                    .git_repo(ctx.scratch)
                    .map_err(|e| format!("{e:#}"))?;
                // Worktrees left by an interrupted run point at removed directories.
                let _ = proc::run(git().arg("--git-dir").arg(&r).args(["worktree", "prune"]));
                Ok(r)
            })
            .clone()
        };
        for &id in IDS.iter().filter(|id| selected(id)) {
            let skip = |why: String, cmd: &str| Prepared::Skipped(info(id, cmd.into()), why);
            let m: Box<dyn Materializer> = match id {
                "cowspace-overlay" | "cowspace-fuse" | "cowspace-btrfs" | "cowspace-reflink" => {
                    match cowspace_store(ctx, &mut store) {
                        Err(why) => {
                            out.push(skip(why, ""));
                            continue;
                        }
                        Ok((mc, root)) => {
                            if self.store.is_none() {
                                self.store = Some(StoreGuard {
                                    mountctl: mc.clone(),
                                    root: root.clone(),
                                });
                            }
                            let kind = id.trim_start_matches("cowspace-");
                            let mut m = Cowspace {
                                id,
                                kind,
                                mountctl: mc,
                                root,
                            };
                            match m.probe(ctx.scratch) {
                                Ok(None) => Box::new(m),
                                Ok(Some(why)) | Err(why) => {
                                    out.push(skip(why, ""));
                                    continue;
                                }
                            }
                        }
                    }
                }
                "cp-a" => Box::new(CpA { tree: tree.clone() }),
                "git-worktree" | "git-clone-shared" | "git-clone-local" => match need_repo(ctx) {
                    Ok(r) => Box::new(Git { id, repo: r }),
                    Err(why) => {
                        out.push(skip(why, ""));
                        continue;
                    }
                },
                "overlayfs" => {
                    if !ctx.is_root {
                        out.push(skip(
                            "mounting overlayfs needs root".into(),
                            "mount -t overlay",
                        ));
                        continue;
                    }
                    if !std::fs::read_to_string("/proc/filesystems")
                        .is_ok_and(|f| f.lines().any(|l| l.ends_with("\toverlay")))
                        && proc::run(Command::new("modprobe").arg("overlay")).is_err()
                    {
                        out.push(skip(
                            "the kernel has no overlay filesystem".into(),
                            "mount -t overlay",
                        ));
                        continue;
                    }
                    Box::new(Overlay {
                        lower: tree.clone(),
                        fuse: false,
                    })
                }
                "fuse-overlayfs" => {
                    if proc::which("fuse-overlayfs").is_none() {
                        out.push(skip(
                            "fuse-overlayfs not found on PATH (apt-get install -y fuse-overlayfs)"
                                .into(),
                            "fuse-overlayfs -o lowerdir=…,upperdir=…,workdir=… MERGED",
                        ));
                        continue;
                    }
                    Box::new(Overlay {
                        lower: tree.clone(),
                        fuse: true,
                    })
                }
                "btrfs-snapshot" | "reflink-copy" => {
                    out.push(skip(
                        "not implemented in bench yet: needs a loop btrfs/XFS filesystem that \
                         bench creates and removes (the work directory is not one)"
                            .into(),
                        "",
                    ));
                    continue;
                }
                _ => unreachable!(),
            };
            out.push(Prepared::Ready(Box::new(UseCost {
                m,
                largest: self.largest.clone(),
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

/// Runs the use workload on any [`Materializer`].
struct UseCost {
    m: Box<dyn Materializer>,
    largest: Option<PathBuf>,
}

impl Method for UseCost {
    fn info(&self) -> MethodInfo {
        self.m.info()
    }

    fn run_once(&mut self, ctx: &Ctx, round: usize) -> Result<Sample> {
        let dir =
            DirGuard::create(ctx.scratch_path(&format!("mat-{}-r{round}", self.m.info().id)))?;
        ctx.prepare_cache(&ctx.corpus.tree)?;
        ctx.before_step()?;
        let (ws, t_make) = timed(|| self.m.create(dir.path()))?;
        let mut s: Sample = vec![("materialize_s", t_make.wall_s())];
        let mut disk = 0;
        for d in &ws.cost_dirs {
            disk += walk::disk_added(d)?;
        }
        s.push(("disk_added_bytes", disk as f64));
        let p = ws.path.clone();
        for key in ["stat_walk_1_s", "stat_walk_2_s"] {
            ctx.before_step()?;
            let (_, t) = timed(|| walk::visit(&p, &mut |_, _| Ok(())))?;
            s.push((key, t.wall_s()));
        }
        ctx.before_step()?;
        let (_, t) = timed(|| walk::read_all(&p))?;
        s.push(("full_read_s", t.wall_s()));
        ctx.before_step()?;
        let (_, t) = timed(|| {
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
        if ws.has_git {
            ctx.before_step()?;
            let (_, t) =
                timed(|| proc::run(git().arg("-C").arg(&p).args(["status", "--porcelain"])))?;
            s.push(("git_status_s", t.wall_s()));
        }
        ctx.before_step()?;
        let (_, t) = timed(|| write_workload(&p))?;
        s.push(("write_s", t.wall_s()));
        if let Some(l) = &self.largest {
            ctx.before_step()?;
            let (_, t) = timed(|| {
                let mut f = std::fs::OpenOptions::new().append(true).open(p.join(l))?;
                f.write_all(b"x")?;
                Ok(())
            })?;
            s.push(("append_s", t.wall_s()));
        }
        ctx.before_step()?;
        let (_, t) = timed(|| self.m.remove(ws))?;
        s.push(("teardown_s", t.wall_s()));
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
        info("cp-a", "cp -a TREE WS; rm -rf WS".into())
    }
    fn create(&mut self, dir: &Path) -> Result<Workspace> {
        let path = dir.join("ws");
        let guard = DirGuard::adopt(path.clone());
        proc::run(Command::new("cp").arg("-a").arg(&self.tree).arg(&path))?;
        Ok(Workspace {
            cost_dirs: vec![path.clone()],
            path,
            has_git: false,
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
                "git --git-dir REPO worktree add -q --detach WS main; git worktree remove --force WS"
            }
            "git-clone-shared" => "git clone -q --shared REPO WS; rm -rf WS",
            _ => "git clone -q --local REPO WS; rm -rf WS",
        };
        info(self.id, c.into())
    }

    fn create(&mut self, dir: &Path) -> Result<Workspace> {
        let path = dir.join("ws");
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

    fn remove(&mut self, ws: Workspace) -> Result<()> {
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
}

impl Materializer for Overlay {
    fn info(&self) -> MethodInfo {
        if self.fuse {
            info("fuse-overlayfs", "mkdir upper work ws; fuse-overlayfs -o lowerdir=TREE,upperdir=upper,workdir=work ws; fusermount -u ws; rm -rf upper work ws".into())
        } else {
            info("overlayfs", "mkdir upper work ws; mount -t overlay overlay -o lowerdir=TREE,upperdir=upper,workdir=work ws; umount ws; rm -rf upper work ws".into())
        }
    }

    fn create(&mut self, dir: &Path) -> Result<Workspace> {
        let base = dir.join("overlay");
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
            has_git: false,
            id: None,
            mount,
            guard,
        })
    }
}

/// A store root in the run's scratch directory holding the corpus as ref `bench`
/// (imported once per run, untimed); shared by the cowspace methods.
fn cowspace_store(
    ctx: &Ctx,
    cache: &mut Option<std::result::Result<(Mountctl, PathBuf), String>>,
) -> std::result::Result<(Mountctl, PathBuf), String> {
    cache
        .get_or_insert_with(|| {
            let mc = ctx.mountctl.clone()?;
            let root = ctx.scratch_path("materialize-store");
            let r = (|| -> Result<()> {
                mc.json(&root, &[std::ffi::OsStr::new("init")])?;
                eprintln!("bench: materialize: importing the corpus into a store (untimed)…");
                let tree = ctx.corpus.tree.as_os_str();
                let args = ["import", "--ref", "bench", "--no-default-excludes"];
                let mut v: Vec<&std::ffi::OsStr> = vec![args[0].as_ref(), tree];
                v.extend(args[1..].iter().map(|a| std::ffi::OsStr::new(*a)));
                mc.json(&root, &v)?;
                Ok(())
            })();
            r.map(|()| (mc, root))
                .map_err(|e| format!("importing the corpus failed: {e:#}"))
        })
        .clone()
}

/// A cowspace workspace made by `mountctl create --materializer KIND`.
struct Cowspace {
    id: &'static str,
    kind: &'static str,
    mountctl: Mountctl,
    root: PathBuf,
}

impl Cowspace {
    /// One create + remove; exit 7 (unsupported on this host) or 2 (no such
    /// materializer in this mountctl) makes the method skipped with mountctl's reason.
    fn probe(&mut self, scratch: &Path) -> std::result::Result<Option<String>, String> {
        let dir = scratch.join(format!("probe-{}", self.id));
        let mut c = self.mountctl.command(&self.root);
        c.args(["create", "bench", "--materializer", self.kind, "--path"])
            .arg(dir.join("ws"));
        let (code, out, err) = proc::run_status(&mut c).map_err(|e| format!("{e:#}"))?;
        match code {
            Some(0) => {
                let v: serde_json::Value =
                    serde_json::from_slice(&out).map_err(|e| e.to_string())?;
                let ws = v["workspace"].as_str().unwrap_or_default().to_string();
                self.mountctl
                    .json(
                        &self.root,
                        &["remove".as_ref(), ws.as_ref(), "--force".as_ref()],
                    )
                    .map_err(|e| format!("{e:#}"))?;
                let _ = crate::cancel::remove_tree(&dir);
                Ok(None)
            }
            Some(2) | Some(7) => {
                let _ = crate::cancel::remove_tree(&dir);
                Ok(Some(format!(
                    "mountctl create --materializer {}: {}",
                    self.kind,
                    proc::tail(&err, &out).replace('\n', " ")
                )))
            }
            _ => Ok(None), // a real failure: let the runs fail and report it
        }
    }
}

impl Materializer for Cowspace {
    fn info(&self) -> MethodInfo {
        info(
            self.id,
            format!(
                "mountctl --root ROOT --json create bench --materializer {} --path WS; mountctl --root ROOT --json remove ID --force",
                self.kind
            ),
        )
    }

    fn create(&mut self, dir: &Path) -> Result<Workspace> {
        let path = dir.join("ws");
        let guard = DirGuard::adopt(path.clone());
        let v = self.mountctl.json(
            &self.root,
            &[
                "create".as_ref(),
                "bench".as_ref(),
                "--materializer".as_ref(),
                self.kind.as_ref(),
                "--path".as_ref(),
                path.as_os_str(),
            ],
        )?;
        let ws = v["workspace"]
            .as_str()
            .context("mountctl create printed no workspace id")?;
        let private = self.root.join("workspaces").join(ws);
        anyhow::ensure!(
            private.is_dir(),
            "workspace {ws}'s private state is not at {} (needed for its disk cost)",
            private.display()
        );
        let path = v["path"].as_str().map_or(path, PathBuf::from);
        Ok(Workspace {
            cost_dirs: vec![private],
            path,
            has_git: false,
            id: Some(ws.to_string()),
            mount: None,
            guard,
        })
    }

    fn remove(&mut self, ws: Workspace) -> Result<()> {
        let id = ws.id.clone().context("workspace id")?;
        self.mountctl.json(
            &self.root,
            &["remove".as_ref(), id.as_ref(), "--force".as_ref()],
        )?;
        ws.guard.remove()
    }
}
