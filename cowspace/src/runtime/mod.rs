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
//! // Refused (busy) while it holds changes no commit took; `true` throws them away.
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
use crate::kinds::Choice;
use crate::materializer::{
    self, LowerKind, Materializer, MaterializerKind, Materializers, WorkspaceCtx,
};
use crate::registry::{Creator, Record, Registry, Status, now};
use crate::upper;

mod changes;
mod claims;
mod commit;
mod create;
mod fork;
mod lifecycle;
mod prune;

pub use crate::materializer::overlay::auto_lower;
pub use changes::Uncommitted;
use claims::kill_sandbox;
pub use claims::live_sandbox;
pub use commit::commit_json;
pub use fork::{ForkOptions, MAX_FORKS};
pub use lifecycle::live_creator;

/// Gives a new workspace its private state before it is mounted (a fork).
pub(crate) type Prefill<'a> = &'a dyn Fn(&Record) -> Result<()>;

/// How to create a workspace.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CreateOptions {
    /// A snapshot id (or unique prefix) or a ref name.
    pub snapshot: String,
    pub name: Option<String>,
    /// `auto`, `overlay`, `fuse`, `btrfs`, `reflink` or `copy`; not given: the
    /// configuration's default (`auto` unless set).
    pub materializer: Option<Choice<MaterializerKind>>,
    /// For overlay: `native` (a metadata image of the snapshot over the blob cache as a
    /// data-only layer: file bytes read by the kernel from the blobs, no daemon needed),
    /// `view` (the daemon's lazy snapshot view), `checkout` (a shared directory of hard
    /// links) or `auto` (the materializer's policy; overlay's is [`auto_lower`]).
    pub lower: Option<Choice<LowerKind>>,
    /// Where the workspace appears (must not exist). Default: under the runtime root.
    pub path: Option<PathBuf>,
    /// The worker this workspace belongs to (recorded as evidence).
    pub worker: Option<String>,
    /// A quota on the bytes its private state may hold (`20g`, or bytes): refused
    /// (unsupported) where it cannot be enforced ([`crate::quota`]).
    #[serde(deserialize_with = "sandbox_api::spec::bytes_text")]
    pub disk: Option<String>,
    /// A quota on its inodes: refused (unsupported), no filesystem quota of this kernel
    /// counts inodes ([`crate::quota::check_request`]).
    pub inodes: Option<u64>,
}

/// How to capture a workspace.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
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
    let ok = sandbox_api::spec::validate_name(name).is_ok() && !name.starts_with("ws-");
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "workspace name {name:?}: use 1 to {} letters, digits, '.', '_' or '-', starting \
             with a letter or digit and not with 'ws-'",
            sandbox_api::spec::MAX_NAME_BYTES
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
        crate::remote::attach(&store);
        // A root whose workspaces live in their own filesystem image has it mounted
        // before anything reads or writes `workspaces/` (after a reboot it is not).
        // Only root can mount it: others get on, and what they read of workspaces/ says
        // what is missing.
        if let Err(e) = crate::quota::ensure_workspaces_fs(root) {
            if nix::unistd::geteuid().is_root() {
                return Err(e);
            }
            tracing::warn!(
                "the workspaces filesystem of {} is not mounted: {e}",
                root.display()
            );
        }
        let registry = Registry::open(root)?;
        Ok(Runtime {
            store,
            registry: Mutex::new(registry),
            materializers,
        })
    }

    /// Imports into this runtime root as `mountctl import` does ([`crate::import`]).
    pub fn import(&self, req: crate::import::ImportRequest<'_>) -> Result<crate::import::Imported> {
        crate::import::import(self.store.root(), req)
    }

    /// The materializers this runtime makes workspaces with.
    pub fn materializers(&self) -> &Materializers {
        &self.materializers
    }

    /// What a materializer works on for workspace `rec`.
    pub(crate) fn cx<'a>(&'a self, rec: &'a Record) -> WorkspaceCtx<'a> {
        WorkspaceCtx::new(&self.store, rec)
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

    /// Builds the native lower of `snapshot` (image and blobs) now, unless it is built.
    pub fn prepare_native(&self, snapshot: &SnapshotId) -> Result<()> {
        crate::native::probe(&self.store).map_err(|why| Error::Unsupported {
            name: "overlay --lower native".into(),
            why,
        })?;
        crate::native::prepare(&self.store, snapshot)
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

    /// Live workspaces (`all`: also removed and failed ones), each with its disk use
    /// where it has a quota.
    pub fn list(&self, all: bool) -> Result<Vec<Record>> {
        let mut recs = self.reg().list(all)?;
        for r in &mut recs {
            with_disk_use(r);
        }
        Ok(recs)
    }

    /// One workspace by id or name. A sandbox recorded by a `mountctl run` that died
    /// without clearing it is not shown (nor its ports).
    pub fn status(&self, ws: &str) -> Result<Record> {
        let mut rec = self.reg().get(ws)?;
        if rec.sandbox_pid.is_some() && live_sandbox(&rec).is_none() {
            rec.sandbox_pid = None;
            rec.ports = serde_json::json!({});
        }
        with_disk_use(&mut rec);
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
}

/// Fills in `rec.disk` from its quota's counters (a live workspace with a quota).
fn with_disk_use(rec: &mut Record) {
    if matches!(rec.status, Status::Active | Status::Stopped) {
        rec.disk = crate::quota::DiskQuota::of(&rec.policies).and_then(|q| q.usage());
    }
}
