//! Forks of full-tree workspaces (`btrfs`, `reflink`, `copy`): the parent's whole tree
//! is its private layer, so a fork is a copy of that tree with a stamp file that keeps
//! the fork's diff and commit costing what changed (`fulltree`).
//!
//! A fork goes in two steps, so that the parent's sandbox stays frozen for one copy
//! whatever the number of forks:
//! 1. [`Stage::take`] (while the parent holds still): one point-in-time copy of the
//!    parent's tree beside it in its private directory — a read-only subvolume snapshot
//!    (btrfs, constant time), `cp -a --reflink=always` (reflink: every file cloned, hard
//!    links, xattrs, symlinks, modes and times kept) or `cp -a --reflink=never` (copy: the
//!    bytes, O(tree), since a copy workspace shares no base with anything).
//! 2. [`Stage::place`] (after the thaw), once per fork: the fork's tree and stamps from
//!    the stage — a writable snapshot of it (btrfs), a copy of it, or the stage itself
//!    moved into place for the last fork (reflink, copy).
//!
//! Stamps. A btrfs snapshot keeps every inode's number and times, so the parent's stamp
//! file holds for its snapshot as it is (hard-linked, keeping its mtime, which marks the
//! racy entries). A copy has new inodes and times: its stamps are made by walking the
//! copy beside its original, and an entry gets a row only when its original was
//! unchanged since the base by the original's stamps, stamped as it is in the copy;
//! every other entry has none and is read by the fork's diff, as the parent's is. The
//! walk runs after the thaw: an entry the parent changed after the copy no longer
//! matches its stamp (its ctime moved), so it gets no row and is read (never trusted).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use cowspace_store::tree::join_path as join;

use crate::error::{Error, Result};
use crate::materializer::MaterializerKind;
use crate::materializer::fulltree::{self, Stamp, Stamps};
use crate::registry::Record;
use crate::subvol::snapshot_subvolume;

/// The point-in-time copy of a full-tree workspace's tree that its forks are made from.
/// Dropping it deletes what is left of it.
pub struct Stage {
    kind: MaterializerKind,
    tree: PathBuf,
    /// btrfs: the parent's stamp file, linked.
    stamps: PathBuf,
    /// reflink, copy: the stamps of the stage's entries whose original was unchanged
    /// ([`Stage::stamp`]).
    rows: Option<HashMap<Vec<u8>, Stamp>>,
}

impl Stage {
    /// Copies the tree of `parent` (a `kind` workspace) at this instant, beside it in its
    /// private directory. The only step that must run while the parent holds still.
    pub fn take(parent: &Record, kind: MaterializerKind) -> Result<Stage> {
        let name = crate::tmpname::unique("fork-stage");
        let stage = Stage {
            kind,
            tree: parent.private_dir.join(format!("{name}.tree")),
            stamps: parent.private_dir.join(format!("{name}.stamps")),
            rows: None,
        };
        let from = fulltree::tree_dir(parent);
        match kind {
            MaterializerKind::Btrfs => {
                snapshot_subvolume(&from, &stage.tree, true)?;
                let src = fulltree::stamps_path(parent);
                fs::hard_link(&src, &stage.stamps).map_err(Error::io("link stamps", &src))?;
            }
            MaterializerKind::Reflink | MaterializerKind::Copy => {
                copy_tree(&from, &stage.tree, kind)?
            }
            other => {
                return Err(Error::Invalid(format!(
                    "a {other} workspace has no full tree to fork"
                )));
            }
        }
        Ok(stage)
    }

    /// Stamps the stage's entries from the parent's stamps (reflink, copy; nothing to do
    /// for btrfs, whose snapshot keeps the parent's stamps true). Runs after the thaw.
    pub fn stamp(&mut self, parent: &Record) -> Result<()> {
        if self.kind == MaterializerKind::Btrfs {
            return Ok(());
        }
        let theirs = Stamps::load(&fulltree::stamps_path(parent))?;
        let rows = restamp(&self.tree, &fulltree::tree_dir(parent), &|p, m| {
            theirs.unchanged(p, m)
        })?;
        self.rows = Some(rows);
        Ok(())
    }

    /// Gives the new workspace `child` (its private directory made, nothing in it yet)
    /// its tree and stamp file, made from the stage; `last`: no fork is made from the
    /// stage after this one (a copy's stage is moved into place).
    pub fn place(&self, child: &Record, last: bool) -> Result<()> {
        let tree = fulltree::tree_dir(child);
        let stamps = fulltree::stamps_path(child);
        fs::create_dir_all(&child.private_dir)
            .map_err(Error::io("create directory", &child.private_dir))?;
        if self.kind == MaterializerKind::Btrfs {
            snapshot_subvolume(&self.tree, &tree, false)?;
            // Last: the stamps mark the tree complete.
            return fs::hard_link(&self.stamps, &stamps).map_err(Error::io("link stamps", &stamps));
        }
        let mine = self.rows.as_ref().ok_or_else(|| {
            Error::Invalid("a fork's stage was placed before it was stamped".into())
        })?;
        let rows = if last {
            fs::rename(&self.tree, &tree).map_err(Error::io("move the fork's tree into", &tree))?;
            // Moving a directory may change its own ctime; nothing under it changes.
            let mut rows = mine.clone();
            if let Some(root) = rows.get_mut(&Vec::new()) {
                let m = fs::symlink_metadata(&tree).map_err(Error::io("stat", &tree))?;
                *root = Stamp::of(&m);
            }
            rows
        } else {
            copy_tree(&self.tree, &tree, self.kind)?;
            // Nobody writes the stage: an entry as stamped is as its original was.
            restamp(&tree, &self.tree, &|p, m| {
                mine.get(p).is_some_and(|s| *s == Stamp::of(m))
            })?
        };
        Stamps::write(&rows, &stamps)
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        crate::checkout::remove_tree(&self.tree);
        let _ = fs::remove_file(&self.stamps);
    }
}

/// Copies the tree `from` to `to` (which must not exist) with `cp -a`: hard links,
/// xattrs, symlinks, special files, owners, modes and times kept, every file cloned
/// (`reflink`) or its bytes copied (`copy`).
fn copy_tree(from: &Path, to: &Path, kind: MaterializerKind) -> Result<()> {
    let reflink = if kind == MaterializerKind::Reflink {
        "--reflink=always"
    } else {
        "--reflink=never"
    };
    cp_a(from, to, reflink, "copy the workspace's tree")
}

/// `cp -a REFLINK --no-target-directory FROM TO` (`reflink`: coreutils' `--reflink=`
/// flag); `step` names the copy in an error (`copy the private layer`). coreutils' `cp` rather than a walk of
/// ours: it already keeps everything a workspace's tree or upper layer holds (hard links
/// across the tree, xattrs including overlayfs's, special files, times), and clones with
/// `FICLONE` where asked.
pub(crate) fn cp_a(from: &Path, to: &Path, reflink: &str, step: &'static str) -> Result<()> {
    let out = std::process::Command::new("cp")
        .args(["-a", reflink, "--no-target-directory"])
        .arg(from)
        .arg(to)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(Error::io("run cp", from))?;
    if !out.status.success() {
        return Err(Error::io(step, from)(std::io::Error::other(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        )));
    }
    Ok(())
}

/// The stamps of the entries of `copy` (a copy of `original`) whose original `kept`
/// says is unchanged since the base (`kept(path, original's metadata)`), stamped as they
/// are in the copy. Paths are relative, `/`-separated, `""` for the root.
fn restamp(
    copy: &Path,
    original: &Path,
    kept: &dyn Fn(&[u8], &fs::Metadata) -> bool,
) -> Result<HashMap<Vec<u8>, Stamp>> {
    let mut rows = HashMap::new();
    let mut stack: Vec<Vec<u8>> = vec![Vec::new()];
    while let Some(rel) = stack.pop() {
        let (c, o) = if rel.is_empty() {
            (copy.to_path_buf(), original.to_path_buf())
        } else {
            let r = Path::new(OsStr::from_bytes(&rel));
            (copy.join(r), original.join(r))
        };
        let cm = fs::symlink_metadata(&c).map_err(Error::io("stat", &c))?;
        if let Ok(om) = fs::symlink_metadata(&o)
            && om.file_type() == cm.file_type()
            && kept(&rel, &om)
        {
            rows.insert(rel.clone(), Stamp::of(&cm));
        }
        if cm.is_dir() {
            for e in fs::read_dir(&c).map_err(Error::io("read directory", &c))? {
                let e = e.map_err(Error::io("read directory", &c))?;
                stack.push(join(&rel, e.file_name().as_bytes()));
            }
        }
    }
    Ok(rows)
}
