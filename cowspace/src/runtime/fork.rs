//! Forks: new workspaces holding exactly what a workspace shows at one instant, made in
//! time proportional to its changes (`mountctl fork`, the socket's `fork`).
//!
//! A fork has the parent's base snapshot and a copy of its private layer (the upper
//! directory of an overlay or fuse workspace: new and modified files, whiteouts, opaque
//! directories, redirects of renamed directories, hard links, xattrs). The copy is
//! `cp -a --reflink=auto` (coreutils: reflinks where the filesystem has them, so its
//! cost is the changes' metadata; a plain copy of the changes elsewhere), never a copy
//! of the base. The layer is copied once beside the parent's; each fork is made as a
//! workspace of the base first, unmounted, given a copy of that copy (the last one the
//! copy itself), and mounted again; a fork that fails is removed, with every fork made
//! before it and the copy (nothing half-made).
//!
//! If the parent's sandbox runs, its processes are frozen (the sandbox's pause) for the
//! one copy and thawed before the forks are made, so every fork holds one instant of what
//! they wrote; the answer says how long they stayed frozen (a parent with a disk quota
//! stays frozen until every fork has its copy, made straight from its layer). Host processes writing to the parent are not
//! frozen.
//!
//! A full-tree workspace (btrfs, reflink, copy) has its whole tree as private layer: its
//! forks come from one point-in-time copy of that tree taken while the sandbox is frozen
//! (a subvolume snapshot, a clone or a copy: `materializer::forktree`), and are made
//! from that copy after the thaw, each with stamps that keep its diff and commit costing
//! what changed.

use std::path::Path;
use std::time::Instant;

use serde_json::{Value, json};

use crate::error::{Error, Result};
use crate::materializer::{ChangesLiveIn, forktree};
use crate::registry::{Record, Status};
use crate::runtime::{CreateOptions, Runtime, live_sandbox};

/// Most forks one call makes.
pub const MAX_FORKS: usize = 64;

/// How to fork.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ForkOptions {
    /// The fork's name (one fork only).
    pub name: Option<String>,
    /// How many forks (default 1); with several and a name, NAME-1 ... NAME-N.
    pub count: Option<usize>,
    /// Start a sandbox in each fork with the controls the parent's was started with.
    pub sandbox: bool,
}

/// Copies the upper directory `from` into the empty `to` (contents, not the directory
/// itself), keeping everything overlayfs records there; clones where the filesystem can.
fn copy_upper(from: &Path, to: &Path) -> Result<()> {
    crate::materializer::forktree::cp_a(from, to, "--reflink=auto", "copy the private layer")
}

/// A copy of a private layer that forks are made from; removed on drop.
struct StageDir(std::path::PathBuf);

impl Drop for StageDir {
    fn drop(&mut self) {
        crate::checkout::remove_tree(&self.0);
    }
}

impl Runtime {
    /// Forks workspace `ws`: `count` (default 1) new workspaces holding what it shows now.
    /// Answers the new workspaces' records (each with `parent`) and `frozen_ms`, how long
    /// the parent's sandbox stayed frozen (0 without one).
    pub fn fork(&self, ws: &str, o: &ForkOptions) -> Result<Value> {
        let count = o.count.unwrap_or(1);
        if count == 0 || count > MAX_FORKS {
            return Err(Error::Invalid(format!(
                "--count {count}: give 1 to {MAX_FORKS} forks"
            )));
        }
        let parent = self.get(ws)?;
        if parent.status == Status::Removed {
            return Err(Error::NoWorkspace(format!("{ws} (it was removed)")));
        }
        if parent.status != Status::Active {
            return Err(Error::WrongState {
                id: parent.id.clone(),
                status: parent.status.as_str().to_string(),
                op: "fork (only an active workspace is forked)",
            });
        }
        let mat = self.materializer_of(&parent);
        // `None`: the parent's changes live in its full tree, which is copied whole.
        let upper = match (mat.changes_live_in(), mat.upper_dir(&parent)) {
            (ChangesLiveIn::FullTree, _) => None,
            (_, Some(upper)) => Some(upper),
            (_, None) => {
                return Err(Error::Unsupported {
                    name: parent.materializer.to_string(),
                    why: "fork copies a workspace's private layer or tree; this materializer \
                          keeps its changes in a form fork cannot copy"
                        .into(),
                });
            }
        };
        let names: Vec<Option<String>> = match (&o.name, count) {
            (None, n) => vec![None; n],
            (Some(n), 1) => vec![Some(n.clone())],
            (Some(n), k) => (1..=k).map(|i| Some(format!("{n}-{i}"))).collect(),
        };
        let controls = if o.sandbox {
            let c = parent
                .sandbox
                .as_ref()
                .filter(|_| live_sandbox(&parent).is_some())
                .and_then(|s| s.get("controls").cloned())
                .ok_or_else(|| {
                    Error::Invalid(format!(
                        "--sandbox: no sandbox runs for workspace {} (or it was started by an \
                         older version, which recorded no controls)",
                        parent.id
                    ))
                })?;
            Some(
                serde_json::from_value::<crate::sandbox::SandboxOptions>(c)
                    .map_err(|e| Error::Invalid(format!("the parent's recorded controls: {e}")))?,
            )
        } else {
            None
        };
        // The parent's sandbox holds still while its layer is copied.
        let frozen = self.freeze_for_fork(&parent)?;
        let started = Instant::now();
        let frozen_ms = std::cell::Cell::new(None::<f64>);
        // Thaws the parent once (the first call), recording how long it stayed frozen.
        let thaw = || {
            if frozen_ms.get().is_none() {
                frozen_ms.set(Some(match frozen {
                    Some(t) => {
                        let ms = t.elapsed().as_secs_f64() * 1e3;
                        let _ = self.sandbox_resume(&parent.id);
                        ms
                    }
                    None => 0.0,
                }));
            }
        };
        let mut made: Vec<Record> = Vec::new();
        let options = |name: &Option<String>| CreateOptions {
            snapshot: parent.snapshot.clone(),
            name: name.clone(),
            materializer: Some(crate::kinds::Choice::Exactly(parent.materializer)),
            // The same lower for an overlay; the others have their own.
            lower: (parent.materializer == crate::materializer::MaterializerKind::Overlay)
                .then_some(crate::kinds::Choice::Exactly(parent.lower_kind)),
            path: None,
            worker: parent.worker.clone(),
            // A fork keeps its parent's quota.
            disk: crate::quota::DiskQuota::of(&parent.policies).map(|q| q.limit_bytes.to_string()),
            inodes: None,
        };
        let record_parent = |rec: &Record| {
            let parent_id = parent.id.clone();
            self.reg().modify(&rec.id, |r| {
                r.parent = Some(parent_id.clone());
                Ok(())
            })
        };
        let result = (|| -> Result<()> {
            mat.settle(&self.cx(&parent))?;
            let Some(upper) = upper.as_ref() else {
                // One copy while frozen; the forks are made from it after the thaw.
                let stage = forktree::Stage::take(&parent, parent.materializer);
                thaw();
                let mut stage = stage?;
                stage.stamp(&parent)?;
                for (i, name) in names.iter().enumerate() {
                    let last = i + 1 == names.len();
                    let place = |rec: &Record| stage.place(rec, last);
                    let rec = self.create_with(&options(name), Some(&place))?;
                    made.push(rec.clone());
                    record_parent(&rec)?;
                }
                return Ok(());
            };
            // One copy of the layer while frozen, beside the parent's; the forks are
            // given copies of it after the thaw (the last one the copy itself). Not for a
            // parent with a disk quota: its private directory is limited, and that copy
            // would count against it.
            let stage = crate::quota::DiskQuota::of(&parent.policies)
                .is_none()
                .then(|| {
                    StageDir(
                        parent
                            .private_dir
                            .join(crate::tmpname::unique("fork-stage")),
                    )
                });
            if let Some(st) = &stage {
                copy_upper(upper, &st.0)?;
                thaw();
            }
            for (i, name) in names.iter().enumerate() {
                let rec = self.create(&options(name))?;
                made.push(rec.clone());
                let child_mat = self.materializer_of(&rec);
                child_mat.unmount(&self.cx(&rec), false)?;
                let child_upper = child_mat
                    .upper_dir(&rec)
                    .ok_or_else(|| Error::Invalid("a fork has no private layer".into()))?;
                crate::checkout::remove_tree(&child_upper);
                crate::checkout::remove_tree(&rec.work_dir());
                std::fs::create_dir_all(rec.work_dir())
                    .map_err(Error::io("create", rec.work_dir()))?;
                match &stage {
                    // A rename across subvolumes (a fork with a quota) fails: then a copy.
                    Some(st) if i + 1 == names.len() => {
                        if std::fs::rename(&st.0, &child_upper).is_err() {
                            copy_upper(&st.0, &child_upper)?;
                        }
                    }
                    Some(st) => copy_upper(&st.0, &child_upper)?,
                    None => copy_upper(upper, &child_upper)?,
                }
                child_mat.mount(&self.cx(&rec))?;
                record_parent(&rec)?;
            }
            Ok(())
        })();
        thaw();
        let copy_ms = started.elapsed().as_secs_f64() * 1e3;
        let frozen_ms = frozen_ms.get().unwrap_or(0.0);
        if let Err(e) = result {
            for rec in made.iter().rev() {
                let _ = self.remove(&rec.id, true);
            }
            return Err(e);
        }
        let mut out = Vec::new();
        for rec in &made {
            let mut v = json!(self.get(&rec.id)?);
            if let Some(c) = &controls {
                v["sandbox"] = self.sandbox_start(&rec.id, c)?;
            }
            out.push(v);
        }
        Ok(
            json!({"parent": parent.id, "forks": out, "frozen_ms": frozen_ms, "elapsed_ms": copy_ms}),
        )
    }

    /// Freezes the parent's running sandbox for a fork; `None` when none runs or it is
    /// paused already (then it stays as it is).
    fn freeze_for_fork(&self, parent: &Record) -> Result<Option<Instant>> {
        if parent.sandbox.is_none() || live_sandbox(parent).is_none() {
            return Ok(None);
        }
        let at = Instant::now();
        match self.sandbox_pause(&parent.id) {
            Ok(_) => Ok(Some(at)),
            // Paused already (by request or idle): it holds still and stays paused.
            Err(e) if e.to_string().contains("paused already") => Ok(None),
            Err(e) => Err(e),
        }
    }
}
