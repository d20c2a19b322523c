//! The baselines that need no filesystem of their own: `cp -a`, `git worktree`, `git
//! clone`, kernel overlayfs over the plain checkout and `fuse-overlayfs`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use super::{Materializer, Speed, Workspace, info};
use crate::cancel::{DirGuard, MountGuard};
use crate::corpus::git;
use crate::mountctl::{find_pids, proc_status_bytes};
use crate::proc;
use crate::sections::MethodInfo;

pub(super) struct CpA {
    pub(super) tree: PathBuf,
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
        Ok(Workspace::plain(path.clone(), vec![path], guard))
    }
}

pub(super) struct Git {
    pub(super) id: &'static str,
    pub(super) repo: PathBuf,
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
        Ok(Workspace::plain(path, cost_dirs, guard))
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

pub(super) struct Overlay {
    pub(super) lower: PathBuf,
    pub(super) fuse: bool,
    pub(super) scratch: PathBuf,
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
            mount,
            ..Workspace::plain(merged, vec![upper, work], guard)
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
