//! Loop filesystems (btrfs, XFS with reflinks) that bench makes and removes, and the
//! baselines on them: a btrfs subvolume snapshot and `cp -a --reflink=always`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::Result;

use super::{Materializer, Speed, Workspace, info};
use crate::cancel::DirGuard;
use crate::proc;
use crate::sections::{Ctx, MethodInfo};

/// Loop filesystem image size: small corpora, large corpora.
const LOOP_SMALL: u64 = 4 << 30;
const LOOP_LARGE: u64 = 8 << 30;

/// A loop-mounted btrfs or XFS (reflink=1) filesystem in the run's scratch
/// directory; unmounted (the loop device is auto-cleared) and deleted on drop.
pub struct LoopFs {
    pub(super) kind: &'static str,
    pub(super) img: PathBuf,
    pub(crate) mnt: PathBuf,
    pub(super) size: u64,
}

impl LoopFs {
    pub(crate) fn make(ctx: &Ctx, kind: &'static str) -> std::result::Result<Self, String> {
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
pub(super) struct LoopBaseline {
    id: &'static str,
    fs: Arc<LoopFs>,
    src: PathBuf,
    n: AtomicUsize,
}

impl LoopBaseline {
    pub(super) fn prepare(id: &'static str, fs: Arc<LoopFs>, checkout: &Path) -> Result<Self> {
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
        Ok(Workspace::plain(path, Vec::new(), guard))
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
