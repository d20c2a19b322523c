//! The programmatic API a runtime embeds (and `mountctl` and the daemon use): open a
//! runtime root, create workspaces of snapshots, diff, commit, remove, list, sweep,
//! recover.
//!
//! ```no_run
//! use cowspace::runtime::{CreateOptions, Runtime};
//! # fn main() -> cowspace::error::Result<()> {
//! let rt = Runtime::open(std::path::Path::new("/var/lib/cowspace"))?;
//! let ws = rt.create(&CreateOptions { snapshot: "myrepo/main".into(), ..Default::default() })?;
//! std::fs::write(ws.path.join("hello.txt"), "hi\n").unwrap();
//! for (change, _) in rt.diff(&ws.id)? {
//!     println!("{:?} {}", change.change, change.path);
//! }
//! let snap = rt.commit(&ws.id, &Default::default())?;
//! println!("captured {}", snap.snapshot);
//! rt.remove(&ws.id, false)?;
//! # Ok(()) }
//! ```

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use cowspace_store::diff::DiffEntry;
use cowspace_store::{Expect, ImportReport, SnapshotId, Source, Store, StoreConfig};
use serde::Serialize;

use crate::checkout;
use crate::error::{Error, Result};
use crate::materializer::{self, LowerKind, Materializer, MaterializerKind, Materializers};
use crate::registry::{Creator, Record, Registry, Status, now};
use crate::served::{PLAIN_VIEW_DIR, VIEW_DIR};
use crate::upper;

/// How to create a workspace.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(default)]
pub struct CreateOptions {
    /// A snapshot id (or unique prefix) or a ref name.
    pub snapshot: String,
    pub name: Option<String>,
    /// `auto` (default), `overlay`, `fuse`, `btrfs`, `reflink` or `copy`.
    pub materializer: Option<String>,
    /// For overlay: `native` (a metadata image of the snapshot over the blob cache as a
    /// data-only layer: file bytes read by the kernel from the blobs, no daemon needed),
    /// `view` (the daemon's lazy snapshot view), `checkout` (a shared directory of hard
    /// links) or `auto` (default: [`auto_lower`]).
    pub lower: Option<String>,
    /// Where the workspace appears (must not exist). Default: under the runtime root.
    pub path: Option<PathBuf>,
    /// The worker this workspace belongs to (recorded as evidence).
    pub worker: Option<String>,
}

/// How to capture a workspace.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(default)]
pub struct CommitOptions {
    /// Move this ref to the new snapshot.
    #[serde(rename = "ref")]
    pub ref_name: Option<String>,
    /// The snapshot the ref must hold (default: the workspace's previous capture or base
    /// if the ref exists, else the ref must not exist).
    pub expect: Option<String>,
    pub message: String,
    /// Make a snapshot even when nothing changed since the previous capture (or the
    /// base). Without it such a commit makes none and answers with that snapshot
    /// (`unchanged: true`).
    pub allow_empty: bool,
    /// Capture paths the base's recorded exclusion policy leaves out too (by default a
    /// new `.venv`, `node_modules`, ... is left out, as its import would).
    pub include_excluded: bool,
}

/// What a sweep did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SweepReport {
    /// Workspaces whose mount had vanished (now `stopped`, recoverable).
    pub stopped: Vec<String>,
    /// Interrupted creations and removals finished off.
    pub finished: Vec<String>,
    /// Workspaces still being created by a live process, left to it.
    pub creating: Vec<String>,
    /// Workspaces still being removed by a live process, left to it.
    pub removing: Vec<String>,
    /// Mounts and directories under the runtime root that no live record owns, removed.
    pub leftovers_removed: Vec<String>,
    /// Workspaces whose sandbox had died (its keeper killed): their host mount is
    /// their own again and their record clear.
    pub sandboxes_cleared: Vec<String>,
}

/// An open runtime root.
pub struct Runtime {
    store: Store,
    registry: Mutex<Registry>,
    materializers: Materializers,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("root", &self.store.root())
            .finish()
    }
}

fn new_id() -> String {
    let mut h = blake3::Hasher::new();
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    h.update(&t.to_le_bytes());
    h.update(&std::process::id().to_le_bytes());
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    h.update(
        &N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            .to_le_bytes(),
    );
    format!("ws-{}", hex::encode(&h.finalize().as_bytes()[..8]))
}

/// Whether a workspace's lower layer still answers. `statfs` always reaches the
/// filesystem: a `stat` of a snapshot view whose daemon died is answered from the
/// kernel's attribute cache (the view's entries are cached for long), while `statfs`
/// fails with ENOTCONN once the FUSE connection is gone.
fn lower_alive(lower: &Path) -> bool {
    nix::sys::statfs::statfs(lower).is_ok()
}

/// One rule for workspace names, the sandbox's (a name is its sandbox's hostname and
/// part of its cgroup's name): 1 to 63 of `[A-Za-z0-9_.-]`, starting with a letter or
/// digit (so never read as an option), and not `ws-…` (ids look like that).
fn check_name(name: &str) -> Result<()> {
    let ok = sandbox_helper::spec::validate_name(name).is_ok() && !name.starts_with("ws-");
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "workspace name {name:?}: use 1 to {} letters, digits, '.', '_' or '-', starting \
             with a letter or digit and not with 'ws-'",
            sandbox_helper::spec::MAX_NAME_BYTES
        )))
    }
}

impl Runtime {
    /// Opens an initialised runtime root.
    pub fn open(root: &Path) -> Result<Runtime> {
        Runtime::open_with(root, Materializers::standard())
    }

    /// [`Runtime::open`] with its own materializers (the daemon registers its FUSE
    /// server this way; tests put a double in).
    pub fn open_with(root: &Path, materializers: Materializers) -> Result<Runtime> {
        let store = Store::open(root, StoreConfig::default())?;
        let registry = Registry::open(root)?;
        Ok(Runtime {
            store,
            registry: Mutex::new(registry),
            materializers,
        })
    }

    /// The materializers this runtime makes workspaces with.
    pub fn materializers(&self) -> &Materializers {
        &self.materializers
    }

    /// The materializer of workspace `rec`.
    pub(crate) fn materializer_of(&self, rec: &Record) -> &dyn Materializer {
        self.materializers.get(rec.materializer)
    }

    /// The store of this runtime root.
    pub fn store(&self) -> &Store {
        &self.store
    }

    pub(crate) fn reg(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Creates a workspace. Everything is checked before anything is made; a failure
    /// part-way undoes what was made and records the workspace as `failed`.
    pub fn create(&self, o: &CreateOptions) -> Result<Record> {
        let started = Instant::now();
        let snapshot = self.store.resolve(&o.snapshot)?;
        if let Some(n) = &o.name {
            check_name(n)?;
        }
        let kind = match o.materializer.as_deref().unwrap_or("auto") {
            "auto" => self.materializers.pick_auto(&self.store)?,
            name => MaterializerKind::parse(name)?,
        };
        let mat = self.materializers.get(kind);
        if let Err(why) = mat.probe(&self.store) {
            return Err(Error::Unsupported {
                name: kind.as_str().into(),
                why,
            });
        }
        let mut prepare_later = false;
        let lower_kind = match o.lower.as_deref().unwrap_or("auto") {
            "auto" => {
                let (lower, _) = auto_lower(&self.store, kind);
                if lower == LowerKind::Native && self.native_later(&snapshot)? {
                    prepare_later = true;
                    LowerKind::View
                } else {
                    lower
                }
            }
            "native" if kind == MaterializerKind::Overlay => {
                if let Err(why) = crate::native::probe(&self.store) {
                    return Err(Error::Unsupported {
                        name: "overlay --lower native".into(),
                        why: format!("{why}; use --lower view or --lower checkout"),
                    });
                }
                LowerKind::Native
            }
            "native" => LowerKind::Native,
            "view" => LowerKind::View,
            "checkout" => LowerKind::Checkout,
            other => {
                return Err(Error::Invalid(format!(
                    "lower {other:?}: choose auto, native, view or checkout"
                )));
            }
        };
        let id = new_id();
        let private_dir = self.store.layout().workspace(&id);
        let path = match &o.path {
            Some(p) => {
                let p = if p.is_absolute() {
                    p.clone()
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
                p
            }
            None => private_dir.join("mnt"),
        };
        // Full-tree materializers choose their own lower (a checkout, a subvolume).
        let (lower_kind, lower) = match mat.lower(&self.store, &snapshot, o.lower.as_deref())? {
            Some((k, p)) => (k, p),
            None if lower_kind == LowerKind::View => (lower_kind, self.view_path(&snapshot)),
            None if lower_kind == LowerKind::Native => {
                let meta = crate::native::meta_path(&self.store, &snapshot);
                (lower_kind, meta)
            }
            None => (lower_kind, checkout::checkout_path(&self.store, &snapshot)),
        };
        let t = now();
        let mut rec = Record {
            id: id.clone(),
            name: o.name.clone(),
            worker: o.worker.clone(),
            snapshot: snapshot.to_hex(),
            materializer: kind,
            lower_kind,
            lower,
            path,
            private_dir: private_dir.clone(),
            status: Status::Creating,
            created_at: t,
            updated_at: t,
            stopped_at: None,
            policies: serde_json::json!({
                "source": self.store.snapshot(&snapshot)?.source,
                "policy": self.store.snapshot(&snapshot)?.policy,
            }),
            diagnostics: vec![],
            ports: serde_json::json!({}),
            commits: vec![],
            create_ms: 0.0,
            sandbox_pid: None,
            sandbox: None,
            overlay_redirects: true,
            // Sweeps and a daemon starting meanwhile leave the workspace to this process.
            creator: Creator::current(),
        };
        // The record first (a crash from here on is visible to sweep), then the effects.
        self.reg().insert(&rec)?;
        let made = (|| -> Result<()> {
            self.store.pin(&snapshot, &id)?;
            fs::create_dir_all(&private_dir)
                .map_err(Error::io("create directory", &private_dir))?;
            if lower_kind == LowerKind::View {
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
            } else if lower_kind == LowerKind::Native {
                // Held until the overlay holds the image (see `release_native`).
                let _shared = crate::native::ensure(&self.store, &snapshot)?;
                return mat.mount(&rec);
            } else if lower_kind != materializer::fuse::LOWER_KIND {
                checkout::ensure_checkout(&self.store, &snapshot)?;
            }
            mat.mount(&rec)
        })();
        if let Err(e) = made {
            let _ = mat.unmount(&rec, true);
            if o.path.is_some() {
                let _ = fs::remove_dir(&rec.path);
            }
            checkout::remove_tree(&private_dir);
            let _ = self.store.unpin(&id);
            rec.diagnostics.push(format!("create failed: {e}"));
            let _ = self.reg().set_status(&mut rec, Status::Failed);
            let _ = self.release_native(&rec);
            return Err(e);
        }
        rec.create_ms = started.elapsed().as_secs_f64() * 1e3;
        self.reg().set_status(&mut rec, Status::Active)?;
        if prepare_later {
            // The daemon (which serves this workspace's view) builds the native lower
            // for the next creates; a daemon that cannot only costs them the view.
            let req =
                serde_json::json!({"op": "prepare_native", "args": {"snapshot": rec.snapshot}});
            if let Err(e) = crate::daemon::request(self.store.root(), &req) {
                tracing::warn!(snapshot = %rec.snapshot, "asking the daemon to build the native lower: {e}");
            }
        }
        Ok(rec)
    }

    /// Whether a `--lower auto` create of `snapshot` takes the view now and leaves the
    /// native lower to the daemon: its image is not built, the snapshot is too large to
    /// build it during the create ([`crate::native::eager`]) and the view is usable.
    fn native_later(&self, snapshot: &SnapshotId) -> Result<bool> {
        if crate::native::is_built(&self.store, snapshot)
            || !Path::new("/dev/fuse").exists()
            || !nix::unistd::geteuid().is_root()
        {
            return Ok(false);
        }
        let c = self.store.snapshot(snapshot)?.counts;
        Ok(!crate::native::eager(c.files, c.bytes))
    }

    /// Builds the native lower of `snapshot` (image and blobs) now, unless it is built.
    pub fn prepare_native(&self, snapshot: &SnapshotId) -> Result<()> {
        crate::native::probe(&self.store).map_err(|why| Error::Unsupported {
            name: "overlay --lower native".into(),
            why,
        })?;
        crate::native::prepare(&self.store, snapshot)
    }

    /// The directory of `snapshot` in the daemon's views: the plain view
    /// (`run/view-plain`, no xattr round trips) when the snapshot is known to have no
    /// xattrs, else the full view (`run/view`). Found once per snapshot (see
    /// [`crate::view::plain`]); an unknown answer is the full view. A running daemon
    /// without a plain view (an older build) serves it from its full view.
    fn view_path(&self, snapshot: &SnapshotId) -> PathBuf {
        let run = self.store.layout().run();
        let full = run.join(VIEW_DIR).join(snapshot.to_hex());
        let plain = match crate::plain::has_xattrs(&self.store, snapshot) {
            Ok(false) => run.join(PLAIN_VIEW_DIR).join(snapshot.to_hex()),
            Ok(true) => return full,
            Err(e) => {
                tracing::warn!(snapshot = %snapshot.to_hex(), "whether the snapshot has xattrs: {e}; the full view serves it");
                return full;
            }
        };
        if !plain.is_dir() && full.is_dir() {
            return full;
        }
        plain
    }

    /// Adds `evidence` (where the workspace's snapshot came from) to its record, under
    /// `policies.checkout`.
    pub fn record_evidence(&self, ws: &str, evidence: serde_json::Value) -> Result<Record> {
        let id = self.reg().get(ws)?.id;
        self.reg().modify(&id, |r| {
            r.policies["checkout"] = evidence;
            Ok(r.clone())
        })
    }

    /// The runtime root.
    pub fn root(&self) -> &Path {
        self.store.root()
    }

    /// One workspace's record by id or name, as the registry has it.
    pub fn get(&self, ws: &str) -> Result<Record> {
        self.reg().get(ws)
    }

    /// Records the long-lived sandbox of the workspace `id` (its id, not a name): its
    /// keeper's pid, its status at start and its published ports.
    pub(crate) fn record_sandbox(
        &self,
        id: &str,
        keeper: i32,
        status: serde_json::Value,
        ports: serde_json::Value,
    ) -> Result<()> {
        self.reg().modify(id, |r| {
            r.sandbox_pid = Some(keeper);
            r.sandbox = Some(status);
            r.ports = ports;
            Ok(())
        })
    }

    /// Live workspaces (`all`: also removed and failed ones).
    pub fn list(&self, all: bool) -> Result<Vec<Record>> {
        self.reg().list(all)
    }

    /// One workspace by id or name. A sandbox recorded by a `mountctl run` that died
    /// without clearing it is not shown (nor its ports).
    pub fn status(&self, ws: &str) -> Result<Record> {
        let mut rec = self.reg().get(ws)?;
        if rec.sandbox_pid.is_some() && live_sandbox(&rec).is_none() {
            rec.sandbox_pid = None;
            rec.ports = serde_json::json!({});
        }
        Ok(rec)
    }

    fn usable(&self, ws: &str, op: &'static str) -> Result<Record> {
        let rec = self.reg().get(ws)?;
        if !matches!(rec.status, Status::Active | Status::Stopped) {
            return Err(Error::WrongState {
                id: rec.id,
                status: rec.status.as_str().into(),
                op,
            });
        }
        Ok(rec)
    }

    /// The workspace's changes against its base, read from its private state only.
    pub fn diff(&self, ws: &str) -> Result<Vec<(DiffEntry, Option<PathBuf>)>> {
        self.diff_with(ws, false)
    }

    /// [`Runtime::diff`]; with `include_excluded`, also the new paths the base's recorded
    /// exclusion policy leaves out (a commit leaves them out too, unless told the same).
    pub fn diff_with(
        &self,
        ws: &str,
        include_excluded: bool,
    ) -> Result<Vec<(DiffEntry, Option<PathBuf>)>> {
        let rec = self.usable(ws, "diff")?;
        let base: SnapshotId = rec.snapshot.parse()?;
        let mut changes = self.materializer_of(&rec).diff(&self.store, &base, &rec)?;
        if let Some(mut filter) = self.change_filter(&base, include_excluded)? {
            let mut failed = None;
            changes.retain(|(c, _)| {
                let dir = c.new_kind == Some(cowspace_store::Kind::Dir);
                match filter.left_out(&self.store, &c.raw_path, dir) {
                    Ok(out) => !out || c.change == cowspace_store::diff::Change::Deleted,
                    Err(e) => {
                        failed.get_or_insert(e);
                        true
                    }
                }
            });
            if let Some(e) = failed {
                return Err(e.into());
            }
        }
        Ok(changes)
    }

    /// The base's recorded exclusion policy as a filter of changes, unless
    /// `include_excluded` (or the policy leaves nothing out).
    fn change_filter(
        &self,
        base: &SnapshotId,
        include_excluded: bool,
    ) -> Result<Option<cowspace_store::import::exclude::ChangeFilter>> {
        if include_excluded {
            return Ok(None);
        }
        let snap = self.store.snapshot(base)?;
        Ok(cowspace_store::import::exclude::ChangeFilter::new(
            &snap.policy,
            snap.root,
        )?)
    }

    /// A unified patch of the workspace's changes.
    pub fn patch(&self, ws: &str) -> Result<String> {
        let changes = self.diff(ws)?;
        upper::patch(&self.store, &changes)
    }

    /// Captures the workspace as a new snapshot (parent: its previous capture, else its
    /// base), optionally moving a ref by compare-and-swap. The workspace stays usable.
    pub fn commit(&self, ws: &str, o: &CommitOptions) -> Result<ImportReport> {
        let mut rec = self.usable(ws, "commit")?;
        let base: SnapshotId = rec.snapshot.parse()?;
        let previous: SnapshotId = match rec.commits.last() {
            Some(p) => p.parse()?,
            None => base,
        };
        let expect = match (&o.ref_name, &o.expect) {
            (Some(_), Some(e)) => Some(Expect::At(self.store.resolve(e)?)),
            (Some(name), None) => Some(match self.store.get_ref(name)? {
                Some(_) => Expect::At(previous),
                None => Expect::Absent,
            }),
            (None, _) => None,
        };
        let kind = rec.materializer;
        let mat = self.materializers.get(kind);
        let mut ed = self.store.edit(&base)?;
        if let Some(filter) = self.change_filter(&base, o.include_excluded)? {
            ed.exclude_by(filter);
        }
        ed.set_parents(vec![previous]);
        // Pinned with the commit: gc keeps it while the workspace lives.
        ed.pin_for(&rec.id);
        if !o.allow_empty {
            ed.unless_same_as(previous);
        }
        mat.capture(&mut ed, &rec)?;
        // git's index, carried on with a token the capture's workspaces vouch for
        // (docs/git.md); read from a file of the private directory, gone after.
        let index_copy = rec.private_dir.join("capture-git-index");
        let _ = fs::remove_file(&index_copy);
        if mat.upper_dir(&rec).is_some()
            && let Some(index) = crate::gitfsmonitor::capture_index(self, &rec)
                .unwrap_or_else(|e| {
                    tracing::warn!(workspace = %rec.id, "git's index is captured as git left it: {e}");
                    None
                })
        {
            fs::write(&index_copy, &index.bytes).map_err(Error::io("write", &index_copy))?;
            ed.put_file(b".git/index", index_copy.clone(), index.mode, vec![], None)?;
            ed.set_git_fsmonitor(Some(index.token));
        }
        let report = ed.commit(
            &o.message,
            Source::Workspace { id: rec.id.clone() },
            o.ref_name.as_deref().zip(expect),
        );
        let _ = fs::remove_file(&index_copy);
        let report = report?;
        if report.unchanged {
            return Ok(report);
        }
        rec.commits.push(report.snapshot.to_hex());
        rec.updated_at = now();
        self.reg().update(&rec)?;
        Ok(report)
    }

    /// The workspace a sandbox may run in: `active`, mounted, its lower layer present,
    /// and no other sandbox running in it. Records `pid` (the caller's, then the helper's
    /// through [`Runtime::move_sandbox`]) as its sandbox
    /// ([`Record::sandbox_pid`]) in the same registry transaction.
    pub fn claim_sandbox(&self, ws: &str, pid: i32) -> Result<Record> {
        let rec = self.reg().get(ws)?;
        let mat = self.materializer_of(&rec);
        let mounted =
            rec.status == Status::Active && mat.is_mounted(&rec)? && lower_alive(&rec.lower);
        if !mounted {
            let status = if rec.status == Status::Active {
                "active but not mounted (its mount or lower layer is gone)".to_string()
            } else {
                rec.status.as_str().to_string()
            };
            return Err(Error::WrongState {
                id: rec.id,
                status,
                op: "a sandbox (`mountctl recover WS` mounts it again)",
            });
        }
        self.reg().modify(&rec.id, |r| {
            if let Some(pid) = live_sandbox(r) {
                return Err(Error::Answered {
                    kind: crate::error::ErrorKind::Exists,
                    message: format!(
                        "a sandbox runs in workspace {} already (sandbox-helper pid {pid})",
                        r.id
                    ),
                    hint: Some(
                        "one sandbox per workspace: `mountctl exec WS -- CMD` runs more commands \
                         in a sandbox started with `mountctl sandbox start WS`; or wait for the \
                         run to end"
                            .into(),
                    ),
                });
            }
            r.sandbox_pid = Some(pid);
            r.ports = serde_json::json!({});
            Ok(r.clone())
        })
    }

    /// Replaces the claimed sandbox pid `from` of `ws` by `to` (the caller claims with
    /// its own pid, starts the helper, then records the helper's).
    pub fn move_sandbox(&self, ws: &str, from: i32, to: i32) -> Result<()> {
        let id = self.reg().get(ws)?.id;
        self.reg().modify(&id, |r| {
            if r.sandbox_pid == Some(from) {
                r.sandbox_pid = Some(to);
            }
            Ok(())
        })
    }

    /// Records the published ports (internal -> host, a JSON object) of the sandbox
    /// running in `ws`, shown by `status` while it runs.
    pub fn set_ports(&self, ws: &str, ports: serde_json::Value) -> Result<()> {
        let id = self.reg().get(ws)?.id;
        self.reg().modify(&id, |r| {
            r.ports = ports;
            Ok(())
        })
    }

    /// While a sandbox runs in `ws` on its own overlay of the workspace's layers, the
    /// host's overlay of the same upper layer would be a second, unsynchronised mount of
    /// it (overlayfs leaves that undefined). This unmounts the host's; `false` when it is
    /// in use on the host and stays mounted (its view may then be stale until the run
    /// ends). [`Runtime::resume_host_mount`] mounts it again.
    pub fn suspend_host_mount(&self, ws: &str) -> Result<bool> {
        let rec = self.reg().get(ws)?;
        if !crate::mounts::is_mounted(&rec.path)? {
            return Ok(true);
        }
        match crate::mounts::unmount(&rec.path) {
            Ok(()) => Ok(true),
            Err(nix::Error::EBUSY) => Ok(false),
            Err(source) => Err(Error::Unmount {
                target: rec.path.clone(),
                source,
            }),
        }
    }

    /// Mounts the host's overlay of `ws` again after a sandbox run (see
    /// [`Runtime::suspend_host_mount`]). A workspace removed meanwhile is left alone.
    pub fn resume_host_mount(&self, ws: &str) -> Result<()> {
        let rec = self.reg().get(ws)?;
        if rec.status != Status::Active || crate::mounts::is_mounted(&rec.path)? {
            return Ok(());
        }
        let mat = self.materializer_of(&rec);
        mat.mount(&rec)
    }

    /// Forgets the sandbox `helper_pid` of `ws` (it ended): no sandbox, no ports.
    pub fn release_sandbox(&self, ws: &str, helper_pid: i32) -> Result<()> {
        let id = self.reg().get(ws)?.id;
        self.reg().modify(&id, |r| {
            if r.sandbox_pid == Some(helper_pid) {
                r.sandbox_pid = None;
                r.sandbox = None;
                r.ports = serde_json::json!({});
            }
            Ok(())
        })
    }

    /// Unmounts the workspace and deletes its private state. `Busy` while processes use
    /// it, unless `force` (which ends them). A sandbox running in it (`mountctl run`)
    /// counts as a user: `force` kills it (its init, then the helper if it lingers).
    pub fn remove(&self, ws: &str, force: bool) -> Result<Record> {
        let mut rec = self.reg().get(ws)?;
        // A long-lived sandbox belongs to the workspace: removing it stops the sandbox
        // first (a one-shot `run` in progress is a user: busy unless `force`).
        if rec.sandbox.is_some() && !matches!(rec.status, Status::Removed) {
            if live_sandbox(&rec).is_some() {
                self.sandbox_stop(&rec.id)?;
            } else {
                self.forget_sandbox(&rec)?;
            }
            rec = self.reg().get(&rec.id)?;
        }
        if matches!(rec.status, Status::Removed) {
            return Err(Error::NoWorkspace(format!("{ws} (it was removed already)")));
        }
        if let Some(pid) = live_creator(&rec) {
            let (status, op) = if rec.status == Status::Creating {
                (
                    format!("still being created by pid {pid}"),
                    "remove (remove it once its create has returned)",
                )
            } else {
                (
                    format!("being removed by pid {pid}"),
                    "remove (another remove is under way)",
                )
            };
            return Err(Error::WrongState {
                id: rec.id,
                status,
                op,
            });
        }
        let sandbox = live_sandbox(&rec);
        if let Some(helper) = sandbox
            && !force
        {
            return Err(Error::Busy {
                id: rec.id.clone(),
                pids: vec![helper],
            });
        }
        // Recorded before the sandbox is ended: its `mountctl run` then sees the workspace
        // going and does not mount the host's overlay again behind this removal.
        // No scan of every process first: the unmount itself fails with EBUSY while
        // anything uses the workspace, and only then are its users looked up.
        // This process is the remover from here on: sweep leaves the removal to it while
        // it lives, and finishes it once it is gone. A refused removal puts the creator
        // back, so it changes nothing.
        let made_by = std::mem::replace(&mut rec.creator, Creator::current());
        self.reg().set_status(&mut rec, Status::CleanupPending)?;
        if let Some(helper) = sandbox {
            kill_sandbox(helper);
            rec.sandbox_pid = None;
            rec.ports = serde_json::json!({});
        }
        self.finish_removal(&mut rec, force, made_by)?;
        Ok(rec)
    }

    fn finish_removal(
        &self,
        rec: &mut Record,
        force: bool,
        made_by: Option<crate::registry::Creator>,
    ) -> Result<()> {
        let mat = self.materializer_of(&rec);
        if let Err(e) = mat.unmount_for_removal(rec, force) {
            // Still mounted: back to active, as it was, so nothing is half-removed.
            if matches!(e, Error::Busy { .. }) {
                rec.creator = made_by;
                self.reg().set_status(rec, Status::Active)?;
            }
            return Err(e);
        }
        // A resume racing this removal may have mounted it again: unmount once more.
        // EINVAL is "not a mount point" here: the unmount above showed this process may
        // unmount at this path.
        if !matches!(
            crate::mounts::unmount(&rec.path),
            Err(nix::Error::EINVAL | nix::Error::ENOENT)
        ) {
            mat.unmount(rec, force)?;
        }
        if !rec.path.starts_with(&rec.private_dir) {
            let _ = fs::remove_dir(&rec.path);
        }
        checkout::remove_tree(&rec.private_dir);
        if rec.private_dir.exists() {
            return Err(Error::Io {
                step: "remove private state",
                path: rec.private_dir.clone(),
                source: std::io::Error::other("still present"),
            });
        }
        self.store.unpin(&rec.id)?;
        self.reg().set_status(rec, Status::Removed)?;
        self.release_native(rec)
    }

    /// After the workspace `rec` went: the mount of its native lower's image goes too
    /// once no live workspace uses it ([`crate::native::release`]).
    fn release_native(&self, rec: &Record) -> Result<()> {
        if rec.lower_kind != LowerKind::Native {
            return Ok(());
        }
        crate::native::release(&rec.lower, || {
            Ok(self.reg().live_using(&rec.snapshot, LowerKind::Native)? > 0)
        })
    }

    /// Whether the daemon serves workspace `rec` (its view lower, or the workspace
    /// itself): such a workspace stops when the daemon does.
    pub fn daemon_serves(&self, rec: &Record) -> bool {
        rec.lower_kind == LowerKind::View || self.materializer_of(rec).served_by_daemon()
    }

    /// Called by a daemon that just mounted a new snapshot view: overlays still mounted on
    /// an earlier daemon's view hold a dead FUSE connection, so they are detached and
    /// marked `stopped` (their written data is intact; `recover` mounts them again).
    ///
    /// To be called before the new view is mounted: until then no create can mount an
    /// overlay on a view, so every active one found here is on the earlier daemon's.
    /// Workspaces still `creating` are their creators' (see [`Runtime::sweep`]).
    pub fn daemon_started(&self) -> Result<Vec<String>> {
        let records = self.reg().list(false)?;
        let mut stopped = Vec::new();
        for rec in records {
            // Fuse workspaces were served by the earlier daemon itself.
            let served = self.daemon_serves(&rec);
            if rec.status != Status::Active || !served {
                continue;
            }
            if crate::mounts::is_mounted(&rec.path)? {
                crate::mounts::unmount_lazy(&rec.path)?;
            }
            let why = format!(
                "{}: the daemon serving its lower restarted; `mountctl recover {}` remounts it",
                now(),
                rec.id
            );
            if self.set_status_if(&rec, Status::Active, Status::Stopped, why)? {
                stopped.push(rec.id);
            }
        }
        Ok(stopped)
    }

    /// Moves `rec` from `from` to `to` (adding `why` to its diagnostics) in one registry
    /// transaction, unless another process changed its status since it was read: `false`
    /// then, and the record is left as that process made it.
    fn set_status_if(&self, rec: &Record, from: Status, to: Status, why: String) -> Result<bool> {
        self.reg().modify(&rec.id, |r| {
            if r.status != from {
                return Ok(false);
            }
            r.diagnostics.push(why);
            r.status = to;
            if matches!(to, Status::Stopped | Status::Removed) {
                r.stopped_at = Some(now());
            }
            Ok(true)
        })
    }

    /// Deletes the btrfs base subvolumes (`cache/subvols`) no live workspace uses.
    /// Returns how many.
    pub fn prune_subvolumes(&self) -> Result<u64> {
        materializer::btrfs::prune_bases(&self.store, &|| {
            Ok(self
                .reg()
                .list(false)?
                .into_iter()
                .filter(|r| r.materializer == MaterializerKind::Btrfs)
                .map(|r| r.snapshot)
                .collect())
        })
    }

    /// Removes checkouts no live workspace uses, then the blob-cache variants only they
    /// linked. Returns (checkouts, variants) removed.
    pub fn prune_checkouts(&self) -> Result<(u64, u64)> {
        // Records listed under the lock: a create records its workspace before it looks
        // for its checkout under the shared lock, so one that is not listed here finds
        // the checkout gone afterwards and builds it again.
        let _exclusive = checkout::lock(&self.store, true)?;
        let used = self.snapshots_on(LowerKind::Checkout)?;
        let dir = self.store.layout().checkouts();
        let mut removed = 0;
        if let Ok(rd) = fs::read_dir(&dir) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if !used.contains(&name) {
                    checkout::remove_tree(&e.path());
                    removed += 1;
                }
            }
        }
        let variants = self.store.blob_cache().remove_unlinked_variants()?;
        Ok((removed, variants))
    }

    /// Removes the native lowers (images and their mounts, `cache/native`) no live
    /// workspace uses. Returns how many. Like [`Runtime::prune_checkouts`], the records
    /// are listed under the checkouts' lock held exclusively.
    pub fn prune_native(&self) -> Result<u64> {
        let _exclusive = checkout::lock(&self.store, true)?;
        crate::native::prune(&self.store, &self.snapshots_on(LowerKind::Native)?)
    }

    /// The snapshots (hex) live workspaces on the lower kind `lower` are made from.
    fn snapshots_on(&self, lower: LowerKind) -> Result<std::collections::HashSet<String>> {
        Ok(self
            .reg()
            .list(false)?
            .into_iter()
            .filter(|r| r.lower_kind == lower)
            .map(|r| r.snapshot)
            .collect())
    }

    /// Evicts least recently used blob-cache entries down to `max_bytes`, never one a
    /// native lower redirects to (a checkout's hard links keep theirs on their own).
    /// Under the checkouts' lock held exclusively, so no image is being built meanwhile.
    pub fn evict_blobs(&self, max_bytes: u64) -> Result<cowspace_store::blobcache::EvictReport> {
        let _exclusive = checkout::lock(&self.store, true)?;
        let held = crate::native::held_blobs(&self.store)?;
        Ok(self
            .store
            .blob_cache()
            .evict(max_bytes, &|id| held.contains(id))?)
    }

    /// Reconciles the registry with the mount table and the disk. A workspace still
    /// `creating` is finished off (as `failed`) only when its creator is gone
    /// ([`live_creator`]); a live creator is left to finish it.
    ///
    /// Creates and removes run concurrently, so the order of the reads matters: a create
    /// records its workspace before it makes anything, hence records are read before the
    /// mount table (an `active` record's mount was made before the table was read) and
    /// the disk before the live records (a directory seen on disk has its record by then).
    /// Each change of status is made only if no other process changed it since.
    pub fn sweep(&self) -> Result<SweepReport> {
        let mut report = SweepReport::default();
        // Bind first: a registry guard held by the loop would deadlock the updates below.
        let records = self.reg().list(false)?;
        let mounts = crate::mounts::mounts()?;
        let mounted = |p: &Path| mounts.iter().any(|m| m.target == p);
        for rec in records {
            if rec.sandbox.is_some() && live_sandbox(&rec).is_none() {
                // Its host mount is the workspace's own again afterwards: the mount table
                // read above predates that, so this record's checks end here.
                // Reaped after the host's own overlay is back: the helper finds the
                // upper layer (and the dead sandbox's work directory beside it) from it.
                match self.forget_sandbox(&rec) {
                    Ok(()) => report.sandboxes_cleared.push(rec.id.clone()),
                    Err(e) => {
                        tracing::warn!(workspace = %rec.id, "clearing its dead sandbox: {e}")
                    }
                }
                self.reap_dead_sandboxes(&rec.path);
                continue;
            }
            match rec.status {
                Status::Creating if live_creator(&rec).is_some() => {
                    report.creating.push(rec.id.clone());
                }
                Status::CleanupPending if live_creator(&rec).is_some() => {
                    report.removing.push(rec.id.clone());
                }
                Status::Creating | Status::CleanupPending => {
                    let st = if rec.status == Status::Creating {
                        Status::Failed
                    } else {
                        Status::Removed
                    };
                    // Claimed first (the creator is gone, so only another sweep or a
                    // remove can move it meanwhile), then the effects, then recorded.
                    let claimed = self.reg().modify(&rec.id, |r| {
                        Ok(r.status == rec.status && live_creator(r).is_none())
                    })?;
                    if !claimed {
                        continue;
                    }
                    let _ = crate::mounts::unmount_lazy(&rec.path);
                    if !rec.path.starts_with(&rec.private_dir) {
                        let _ = fs::remove_dir(&rec.path);
                    }
                    checkout::remove_tree(&rec.private_dir);
                    let _ = self.store.unpin(&rec.id);
                    let why = "an interrupted create or remove was finished by sweep".to_string();
                    if self.set_status_if(&rec, rec.status, st, why)? {
                        report.finished.push(rec.id.clone());
                    }
                }
                Status::Active => {
                    // A fuse workspace is its own lower: its mount answers or is dead.
                    let lower_ok = lower_alive(&rec.lower)
                        && (!self.materializer_of(&rec).served_by_daemon()
                            || lower_alive(&rec.path));
                    if !mounted(&rec.path) || !lower_ok {
                        if mounted(&rec.path) {
                            let _ = crate::mounts::unmount_lazy(&rec.path);
                        }
                        let why = format!(
                            "sweep at {}: {}; its written data is kept, `mountctl recover {}` remounts it",
                            now(),
                            if lower_ok {
                                "the mount vanished"
                            } else {
                                "its lower layer is gone (daemon stopped?)"
                            },
                            rec.id
                        );
                        if self.set_status_if(&rec, Status::Active, Status::Stopped, why)? {
                            report.stopped.push(rec.id.clone());
                        }
                    }
                }
                _ => {}
            }
        }
        // Leftovers: overlay mounts and directories under workspaces/ no live record owns.
        let ws_dir = self.store.layout().workspaces();
        let on_disk: Vec<PathBuf> = fs::read_dir(&ws_dir)
            .map(|rd| rd.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        let live: std::collections::HashSet<PathBuf> = self
            .reg()
            .list(false)?
            .into_iter()
            .map(|r| r.private_dir)
            .collect();
        // A mount under workspaces/ belongs to the private directory `workspaces/<id>` it
        // is in (one set lookup per mount: sweeps with a thousand workspaces alive).
        let owner = |t: &Path| -> Option<PathBuf> {
            let rest = t.strip_prefix(&ws_dir).ok()?;
            rest.components().next().map(|c| ws_dir.join(c.as_os_str()))
        };
        for m in &mounts {
            if owner(&m.target).is_some_and(|d| !live.contains(&d)) {
                let _ = crate::mounts::unmount_lazy(&m.target);
                report
                    .leftovers_removed
                    .push(m.target.display().to_string());
            }
        }
        for p in on_disk {
            if !live.contains(&p) {
                let _ = crate::mounts::unmount_lazy(&p.join("mnt"));
                checkout::remove_tree(&p);
                report.leftovers_removed.push(p.display().to_string());
            }
        }
        // The snapshot views of a daemon that is gone (killed).
        for v in crate::daemon::detach_dead_views(&self.store.layout().root) {
            report.leftovers_removed.push(v.display().to_string());
        }
        Ok(report)
    }

    /// Mounts a stopped workspace again with everything that had been written.
    pub fn recover(&self, ws: &str) -> Result<Record> {
        let mut rec = self.reg().get(ws)?;
        let mat = self.materializer_of(&rec);
        if rec.status == Status::Active && mat.is_mounted(&rec)? && lower_alive(&rec.lower) {
            return Ok(rec);
        }
        if !matches!(rec.status, Status::Active | Status::Stopped) {
            return Err(Error::WrongState {
                id: rec.id,
                status: rec.status.as_str().into(),
                op: "recover",
            });
        }
        if mat.is_mounted(&rec)? {
            crate::mounts::unmount_lazy(&rec.path)?;
        }
        let snapshot: SnapshotId = rec.snapshot.parse()?;
        if rec.lower_kind == LowerKind::View {
            crate::daemon::ensure_running(self.store.root())?;
        }
        let _shared = if rec.lower_kind == LowerKind::Native {
            Some(crate::native::ensure(&self.store, &snapshot)?)
        } else {
            if rec.lower_kind != LowerKind::View && rec.lower_kind != materializer::fuse::LOWER_KIND
            {
                checkout::ensure_checkout(&self.store, &snapshot)?;
            }
            None
        };
        // Overlay needs an empty work directory after an unclean stop.
        let work = rec.work_dir();
        checkout::remove_tree(&work);
        mat.mount(&rec)?;
        rec.diagnostics.push(format!("recovered at {}", now()));
        self.reg().set_status(&mut rec, Status::Active)?;
        Ok(rec)
    }
}

/// What `commit` answers, the same on the CLI (`--json`) and the control socket: the
/// import report and `retention` (whether a ref holds the snapshot, the workspace that
/// pins it, and how long an unreferenced one outlives that workspace).
pub fn commit_json(r: &ImportReport) -> serde_json::Value {
    let referenced = r.ref_name.is_some();
    let mut v = serde_json::json!(r);
    v["retention"] = serde_json::json!({
        "referenced": referenced,
        "pinned_by": r.pinned_by,
        "grace_secs_after_removal": (!referenced).then_some(cowspace_store::gc::DEFAULT_GC_GRACE_SECS),
    });
    v
}

/// The lower `--lower auto` gives a workspace of materializer `kind`, and why: the
/// native lower reads file bytes straight from the blob cache with no daemon in the path
/// (it needs EROFS and data-only overlay layers, Linux 6.16+, and root); else the view
/// keeps file identity stable and reads lazily (it needs FUSE); else the checkout.
pub fn auto_lower(store: &Store, kind: MaterializerKind) -> (LowerKind, String) {
    let native = if kind == MaterializerKind::Overlay {
        crate::native::probe(store)
    } else {
        Err(format!(
            "the {} materializer makes its own tree",
            kind.as_str()
        ))
    };
    let native_why = match native {
        Ok(()) => {
            return (
                LowerKind::Native,
                "this host mounts EROFS images with data-only overlay layers".into(),
            );
        }
        Err(why) => why,
    };
    if Path::new("/dev/fuse").exists() && nix::unistd::geteuid().is_root() {
        return (
            LowerKind::View,
            format!("native lower unavailable ({native_why}); FUSE is usable"),
        );
    }
    (
        LowerKind::Checkout,
        format!("native lower unavailable ({native_why}); no usable FUSE for the view"),
    )
}

/// The recorded sandbox of `rec` if it still runs: the pid exists and is either a
/// `sandbox-helper` whose command line names the workspace's path, or (for the moment
/// between claiming and starting the helper) a `mountctl run` naming the workspace; so a
/// reused pid is not mistaken for it.
pub fn live_sandbox(rec: &Record) -> Option<i32> {
    let pid = rec.sandbox_pid?;
    let comm = crate::procfs::comm(pid)?;
    let cmdline = crate::procfs::cmdline(pid)?;
    let has = |want: &[u8]| cmdline.iter().any(|arg| arg == want);
    let ours = match comm.as_str() {
        "sandbox-helper" => {
            let path = rec.path.as_os_str().as_encoded_bytes();
            has(path) || has(&[b"--dir=".as_slice(), path].concat())
        }
        "mountctl" => {
            (has(b"run") || has(b"start"))
                && (has(rec.id.as_bytes())
                    || rec.name.as_deref().is_some_and(|n| has(n.as_bytes())))
        }
        _ => false,
    };
    ours.then_some(pid)
}

/// The pid of the process still creating or removing `rec`: its status is `creating` or
/// `cleanup_pending` and its recorded creator (the remover, once `cleanup_pending`)
/// runs (the same process, not a later one given its pid). A record without a creator
/// (written by an older build) has none.
pub fn live_creator(rec: &Record) -> Option<i32> {
    let c = rec.creator.as_ref()?;
    (matches!(rec.status, Status::Creating | Status::CleanupPending) && c.is_alive())
        .then_some(c.pid)
}

/// How long `remove --force` waits for a killed sandbox's helper to clean up and exit.
const SANDBOX_EXIT_WAIT_MS: u64 = 5_000;

/// Ends a sandbox: SIGKILL to its init (the helper's child; the whole pid namespace
/// dies with it), so the helper removes its cgroups and exits as usual; the helper
/// itself is killed when it has not exited after [`SANDBOX_EXIT_WAIT_MS`]. `pid` may be
/// a `mountctl run` recorded before it started its helper: then its helper is ended,
/// or that `mountctl` itself when it has none yet.
fn kill_sandbox(pid: i32) {
    use crate::procfs::children;
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let is_helper = |pid: i32| crate::procfs::comm(pid).is_some_and(|c| c == "sandbox-helper");
    let helper = if is_helper(pid) {
        pid
    } else if let Some(h) = children(pid).into_iter().find(|c| is_helper(*c)) {
        h
    } else {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        return;
    };
    for child in children(helper) {
        let _ = kill(Pid::from_raw(child), Signal::SIGKILL);
    }
    let gone = || crate::procfs::stat(helper).is_none_or(|s| s.is_zombie());
    let deadline = Instant::now() + std::time::Duration::from_millis(SANDBOX_EXIT_WAIT_MS);
    while !gone() && Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    if !gone() {
        let _ = kill(Pid::from_raw(helper), Signal::SIGKILL);
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
