//! `create` in four steps: resolve the request into a [`CreatePlan`] (every check, no
//! effect), record the workspace as `creating` (a crash from then on is visible to
//! sweep), realise it (pins, private state, lower, mount), and on a failure roll back
//! what was realised and record the workspace as `failed`.

use std::fs;
use std::path::PathBuf;
use std::time::Instant;

use cowspace_store::SnapshotId;

use super::{CreateOptions, Prefill, Runtime, check_name, new_id};
use crate::checkout;
use crate::error::{Error, Result};
use crate::kinds::{Choice, LowerKind, LowerPlan, MaterializerKind};
use crate::materializer::{self, Materializer};
use crate::registry::{Creator, Record, Status, now};

/// What a create will make, decided before anything is made.
struct CreatePlan<'r> {
    snapshot: SnapshotId,
    kind: MaterializerKind,
    mat: &'r dyn Materializer,
    lower: LowerPlan,
    /// The quota's limit in bytes.
    disk: Option<u64>,
    id: String,
    private_dir: PathBuf,
    path: PathBuf,
    /// The path was given (`--path`): its directory is the create's to remove on failure.
    custom_path: bool,
}

impl Runtime {
    /// Creates a workspace. Everything is checked before anything is made; a failure
    /// part-way undoes what was made and records the workspace as `failed`.
    pub fn create(&self, o: &CreateOptions) -> Result<Record> {
        self.create_with(o, None)
    }

    /// [`Runtime::create`]; `prefill` (a fork) gives the new workspace its private state
    /// before it is mounted, instead of its lower.
    pub(crate) fn create_with(
        &self,
        o: &CreateOptions,
        prefill: Option<Prefill<'_>>,
    ) -> Result<Record> {
        let started = Instant::now();
        let plan = self.plan_create(o)?;
        let mut rec = self.record_create(o, &plan)?;
        if let Err(e) = self.realise(&plan, &mut rec, prefill) {
            self.roll_back(&plan, &mut rec, &e);
            return Err(e);
        }
        rec.create_ms = started.elapsed().as_secs_f64() * 1e3;
        self.reg().set_status(&mut rec, Status::Active)?;
        if plan.lower.native_later {
            // The daemon (which serves this workspace's view) builds the native lower
            // for the next creates; a daemon that cannot only costs them the view.
            let req = crate::protocol::Request::PrepareNative(crate::protocol::SnapshotArg {
                snapshot: rec.snapshot.clone(),
            });
            if let Err(e) = crate::daemon::request(self.store.root(), &req) {
                tracing::warn!(snapshot = %rec.snapshot, "asking the daemon to build the native lower: {e}");
            }
        }
        Ok(rec)
    }

    /// Every check of a create, and its choices: nothing is made here (but a daemon a
    /// chosen lower needs may be started).
    fn plan_create(&self, o: &CreateOptions) -> Result<CreatePlan<'_>> {
        let snapshot = match self.store.resolve(&o.snapshot) {
            Ok(s) => s,
            // Not here: a remote's snapshot is made known from its index alone.
            Err(e) if e.kind() == cowspace_store::ErrorKind::NotFound => {
                match crate::remote::resolve_lazy(&self.store, &o.snapshot)? {
                    Some(s) => s,
                    None => return Err(e.into()),
                }
            }
            Err(e) => return Err(e.into()),
        };
        if let Some(n) = &o.name {
            check_name(n)?;
        }
        let kind = match o.materializer.unwrap_or_default() {
            Choice::Auto => self.materializers.pick_auto(&self.store)?,
            Choice::Exactly(kind) => kind,
        };
        let mat = self.materializers.get(kind);
        if let Err(why) = mat.probe(&self.store) {
            return Err(Error::Unsupported {
                name: kind.as_str().into(),
                why,
            });
        }
        // Each materializer's own policy; refused here, before anything is made.
        let lower = mat.lower(&self.store, &snapshot, o.lower.unwrap_or_default())?;
        let disk = crate::quota::check_request(
            &self.store.layout().workspaces(),
            o.disk.as_deref(),
            o.inodes,
        )?;
        // The quota counts what the worker writes: an upper layer. A full tree (btrfs,
        // reflink, copy) is a subvolume or clone of shared data the quota cannot
        // separate from the worker's writes.
        if disk.is_some() && mat.changes_live_in() != materializer::ChangesLiveIn::Upper {
            return Err(Error::Unenforceable {
                what: format!("--disk with the {kind} materializer"),
                why: format!(
                    "a {kind} workspace is a whole tree of its own, and its quota would \
                     count the base's files (or, for btrfs, not the nested snapshot at all)"
                ),
                fix: "use --materializer overlay or fuse, whose private state holds only \
                      what the worker writes"
                    .into(),
            });
        }
        let id = new_id();
        let private_dir = self.store.layout().workspace(&id);
        let path = match &o.path {
            Some(p) => self.check_path(p)?,
            None => private_dir.join("mnt"),
        };
        Ok(CreatePlan {
            snapshot,
            kind,
            mat,
            lower,
            disk,
            id,
            private_dir,
            path,
            custom_path: o.path.is_some(),
        })
    }

    /// A `--path` a workspace may appear at: absolute (relative to this process's
    /// directory), not there yet, in an existing directory, outside the runtime root and
    /// other workspaces.
    fn check_path(&self, p: &std::path::Path) -> Result<PathBuf> {
        let p = if p.is_absolute() {
            p.to_path_buf()
        } else {
            std::env::current_dir()
                .map_err(Error::io("read", "current directory"))?
                .join(p)
        };
        if fs::symlink_metadata(&p).is_ok() {
            return Err(Error::PathExists(p));
        }
        match p.parent() {
            Some(parent) if parent.is_dir() => {}
            _ => {
                return Err(Error::Invalid(format!(
                    "the parent directory of {} does not exist",
                    p.display()
                )));
            }
        }
        crate::wspath::check_custom_path(&p, self.store.root(), &self.reg().list(false)?)?;
        Ok(p)
    }

    /// The workspace recorded as `creating`, before any effect.
    fn record_create(&self, o: &CreateOptions, plan: &CreatePlan<'_>) -> Result<Record> {
        let t = now();
        let snap = self.store.snapshot(&plan.snapshot)?;
        let rec = Record {
            id: plan.id.clone(),
            name: o.name.clone(),
            worker: o.worker.clone(),
            snapshot: plan.snapshot.to_hex(),
            materializer: plan.kind,
            lower_kind: plan.lower.kind,
            lower: plan.lower.path.clone(),
            path: plan.path.clone(),
            private_dir: plan.private_dir.clone(),
            status: Status::Creating,
            created_at: t,
            updated_at: t,
            stopped_at: None,
            policies: serde_json::json!({
                "source": snap.source,
                "policy": snap.policy,
            }),
            diagnostics: vec![],
            ports: serde_json::json!({}),
            commits: vec![],
            create_ms: 0.0,
            sandbox_pid: None,
            sandbox: None,
            overlay_redirects: true,
            committed_fingerprint: None,
            parent: None,
            disk: None,
            // Sweeps and a daemon starting meanwhile leave the workspace to this process.
            creator: Creator::current(),
        };
        self.reg().insert(&rec)?;
        Ok(rec)
    }

    /// The create's effects: the snapshot pinned, the private state (a limited
    /// subvolume under a quota), the lower made or held, the mount.
    fn realise(
        &self,
        plan: &CreatePlan<'_>,
        rec: &mut Record,
        prefill: Option<Prefill<'_>>,
    ) -> Result<()> {
        self.store.pin(&plan.snapshot, &plan.id)?;
        crate::remote::pin(&self.store, &plan.snapshot, &plan.id)?;
        match plan.disk {
            // Its own subvolume, limited: the quota covers everything it writes.
            Some(limit) => {
                let q = crate::quota::make_limited_dir(&plan.private_dir, limit)?;
                rec.policies["disk"] = serde_json::to_value(&q)
                    .map_err(|e| Error::Invalid(format!("recording the quota: {e}")))?;
                self.reg().update(rec)?;
            }
            None => fs::create_dir_all(&plan.private_dir)
                .map_err(Error::io("create directory", &plan.private_dir))?,
        }
        match plan.lower.kind {
            LowerKind::View => {
                // A view that answers means a daemon serves it: no round trip needed.
                if !rec.lower.is_dir() {
                    crate::daemon::ensure_running(self.store.root())?;
                }
                if !rec.lower.is_dir() {
                    return Err(Error::Daemon(format!(
                        "the snapshot view does not show {}",
                        rec.lower.display()
                    )));
                }
            }
            LowerKind::Native => {
                // Held until the overlay holds the image (see `release_native`).
                let _shared = crate::native::ensure(&self.store, &plan.snapshot)?;
                return plan.mat.mount(&self.cx(rec));
            }
            kind => match prefill {
                Some(fill) => fill(rec)?,
                None if kind != materializer::fuse::LOWER_KIND => {
                    checkout::ensure_checkout(&self.store, &plan.snapshot)?;
                }
                None => {}
            },
        }
        plan.mat.mount(&self.cx(rec))
    }

    /// Undoes what [`Runtime::realise`] made and records the workspace as `failed` with
    /// why; each step is tried whatever the others gave.
    fn roll_back(&self, plan: &CreatePlan<'_>, rec: &mut Record, e: &Error) {
        let _ = plan.mat.unmount(&self.cx(rec), true);
        if plan.custom_path {
            let _ = fs::remove_dir(&rec.path);
        }
        checkout::remove_tree(&plan.private_dir);
        let _ = self.store.unpin(&plan.id);
        crate::remote::unpin(&self.store, &plan.snapshot, &plan.id);
        rec.diagnostics.push(format!("create failed: {e}"));
        let _ = self.reg().set_status(rec, Status::Failed);
        let _ = self.release_native(rec);
    }
}
