//! [`UseCost`]: what using a workspace of any [`Materializer`] costs, timed the same for
//! every method.

use std::path::{Path, PathBuf};
use std::process::Command;

use std::io::Write;

use anyhow::{Context, Result};

use super::{GREP_NEEDLE, Materializer, Speed, WRITE_CREATE_FILES, WRITE_DELETE_FILES, Workspace};
use super::{WRITE_FILE_BYTES, WRITE_RENAME_FILES, conc_metric};
use crate::cancel::DirGuard;
use crate::corpus::{git, walk};
use crate::proc::{self, timed};
use crate::sections::{Ctx, Method, MethodInfo, Sample};

pub(super) fn largest_file(tree: &Path) -> Result<Option<PathBuf>> {
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
pub(super) const MOVED_DIR_ENTRIES: usize = 500;

/// The directory of `tree` (not the root) with the number of entries beneath it nearest
/// [`MOVED_DIR_ENTRIES`] (the first in path order among equals), and that number.
pub(super) fn dir_to_move(tree: &Path) -> Result<Option<(PathBuf, usize)>> {
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
pub(super) struct UseCost {
    pub(super) m: Box<dyn Materializer>,
    pub(super) largest: Option<PathBuf>,
    pub(super) moved: Option<PathBuf>,
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
