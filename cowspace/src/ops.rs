//! The store's operations as a runtime answers them, the same on the command line
//! (`--json`) and the control socket: snapshots, refs, show, export, stats and gc (with
//! the runtime's own caches). One function per operation, one JSON shape each.

use std::path::Path;
use std::time::Instant;

use cowspace_store::browse::{EntryView, Found};
use cowspace_store::gc::GcOptions;
use cowspace_store::{Expect, Store};
use serde_json::{Value, json};

use crate::error::Result;
use crate::runtime::Runtime;

/// Every snapshot, newest first, with the refs naming it.
pub fn snapshots(store: &Store) -> Result<Value> {
    let refs = store.refs()?;
    let list: Vec<Value> = store
        .snapshots()?
        .iter()
        .map(|(id, s)| {
            let names: Vec<&str> = refs
                .iter()
                .filter(|(_, r)| r == id)
                .map(|(n, _)| n.as_str())
                .collect();
            json!({
                "snapshot": id, "created_at": s.created_at, "message": s.message,
                "parents": s.parents, "source": s.source, "files": s.counts.files,
                "bytes": s.counts.bytes, "refs": names,
            })
        })
        .collect();
    Ok(Value::Array(list))
}

/// Every ref: name → snapshot.
pub fn refs(store: &Store) -> Result<Value> {
    let map: serde_json::Map<String, Value> = store
        .refs()?
        .into_iter()
        .map(|(n, s)| (n, json!(s)))
        .collect();
    Ok(Value::Object(map))
}

/// Moves (or makes) ref `name` to `snapshot` by compare-and-swap: it must hold `expect`
/// (a snapshot or ref), must not exist when `expect` is `None`, or may hold anything
/// with `force`.
pub fn ref_set(
    store: &Store,
    name: &str,
    snapshot: &str,
    expect: Option<&str>,
    force: bool,
) -> Result<Value> {
    let new = store.resolve(snapshot)?;
    let expect = match (expect, force) {
        (_, true) => Expect::Any,
        (Some(e), false) => Expect::At(store.resolve(e)?),
        (None, false) => Expect::Absent,
    };
    store.set_ref(name, &new, expect)?;
    Ok(json!({"ref": name, "snapshot": new}))
}

/// Deletes ref `name`, which must hold `expect`.
pub fn ref_delete(store: &Store, name: &str, expect: &str) -> Result<Value> {
    let expect = store.resolve(expect)?;
    store.delete_ref(name, expect)?;
    Ok(json!({"ref": name, "deleted": true}))
}

/// A snapshot's metadata and what `path` holds in it (the root when empty): a
/// directory's entries, or one entry.
pub fn show(store: &Store, spec: &str, path: &str) -> Result<Value> {
    let id = store.resolve(spec)?;
    let snap = store.snapshot(&id)?;
    let found = store.lookup(&id, path)?;
    let (entry, entries): (Option<EntryView>, Option<Vec<EntryView>>) = match &found {
        Found::Dir { entry, tree } => (
            entry.as_ref().map(EntryView::from),
            Some(tree.entries.iter().map(EntryView::from).collect()),
        ),
        Found::Leaf(e) => (Some(EntryView::from(e)), None),
    };
    Ok(json!({
        "snapshot": id, "meta": snap, "path": path, "entry": entry, "entries": entries,
    }))
}

/// Exports a snapshot to the new directory (or, with `tar`, the new archive) `dest`.
pub fn export(store: &Store, spec: &str, dest: &Path, tar: bool) -> Result<Value> {
    let id = store.resolve(spec)?;
    let t = Instant::now();
    if tar {
        store.export_tar(&id, dest)?;
    } else {
        store.export_dir(&id, dest)?;
    }
    let ms = t.elapsed().as_secs_f64() * 1e3;
    // `ms`: the old name of `elapsed_ms`, until the release after next.
    let dest = dest.display().to_string();
    Ok(json!({"snapshot": id, "dest": dest, "tar": tar, "elapsed_ms": ms, "ms": ms}))
}

/// What is stored, and how well it deduplicates and compresses.
pub fn stats(store: &Store) -> Result<Value> {
    Ok(json!(store.stats()?))
}

/// How `gc` runs.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GcRequest {
    /// Say what would be removed; remove nothing.
    pub dry_run: bool,
    /// Keep unreferenced snapshots younger than this many seconds.
    pub grace_secs: i64,
    /// Wait for running imports instead of failing as busy.
    pub wait: bool,
    /// Bound of the blob cache in bytes (least recently used blobs beyond it go).
    pub blob_cache_max: u64,
}

impl Default for GcRequest {
    fn default() -> Self {
        GcRequest {
            dry_run: false,
            grace_secs: cowspace_store::gc::DEFAULT_GC_GRACE_SECS,
            wait: false,
            blob_cache_max: cowspace_store::blobcache::DEFAULT_BLOB_CACHE_MAX_BYTES,
        }
    }
}

/// What `gc` did (or would do, in a dry run).
#[derive(Debug, Clone)]
pub struct GcAnswer {
    /// The store's part: snapshots and packs.
    pub report: cowspace_store::gc::GcReport,
    pub checkouts_removed: u64,
    pub blob_variants_removed: u64,
    pub subvolumes_removed: u64,
    pub native_lowers_removed: u64,
    pub ended_workspace_pins_released: u64,
    pub blob_cache: cowspace_store::blobcache::EvictReport,
}

impl GcAnswer {
    /// The answer's JSON: the store's report with the runtime's counts beside it.
    pub fn to_json(&self) -> Value {
        let mut value = json!(self.report);
        value["checkouts_removed"] = json!(self.checkouts_removed);
        value["blob_variants_removed"] = json!(self.blob_variants_removed);
        value["subvolumes_removed"] = json!(self.subvolumes_removed);
        value["native_lowers_removed"] = json!(self.native_lowers_removed);
        value["ended_workspace_pins_released"] = json!(self.ended_workspace_pins_released);
        value["blob_cache"] = json!(self.blob_cache);
        value
    }
}

impl Runtime {
    /// Collects garbage: the checkouts, btrfs bases and native lowers no live workspace
    /// uses (first, so eviction sees their blobs as unlinked), the pins of ended
    /// workspaces, the store's unreferenced snapshots and dead packs (keeping what live
    /// workspaces were made from or committed), then the blob cache down to its bound.
    pub fn gc(&self, o: &GcRequest) -> Result<GcAnswer> {
        let (checkouts, variants, subvolumes, native, released) = if o.dry_run {
            (0, 0, 0, 0, 0)
        } else {
            let (checkouts, variants) = self.prune_checkouts()?;
            (
                checkouts,
                variants,
                self.prune_subvolumes()?,
                self.prune_native()?,
                self.release_ended_pins()?,
            )
        };
        let held = self.held_snapshots()?;
        let report = self.store().gc_holding(
            GcOptions {
                dry_run: o.dry_run,
                grace_secs: o.grace_secs,
                wait: o.wait,
            },
            &held,
        )?;
        let blob_cache = if o.dry_run {
            Default::default()
        } else {
            self.evict_blobs(o.blob_cache_max)?
        };
        Ok(GcAnswer {
            report,
            checkouts_removed: checkouts,
            blob_variants_removed: variants,
            subvolumes_removed: subvolumes,
            native_lowers_removed: native,
            ended_workspace_pins_released: released,
            blob_cache,
        })
    }
}
