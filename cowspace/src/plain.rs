//! Which snapshots the plain view may serve.
//!
//! The daemon mounts the view twice: `run/view` serves every snapshot with its extended
//! attributes, `run/view-plain` serves only snapshots without any and answers `getxattr`
//! and `listxattr` with `ENOSYS`, after which the kernel stops asking that connection
//! (kernel overlayfs otherwise asks its lower layer for an overlay xattr on every entry
//! it looks up in a fresh mount, one round trip each).
//!
//! Whether a snapshot has xattrs is a function of its id (the id covers every tree), so
//! it is found once per runtime root by walking the snapshot's trees and recorded in a
//! marker file, `<root>/cache/xattrs/<snapshot-hex>`, holding `none` or `some` (written
//! under a temporary name, synced, then renamed into place). A missing or unreadable
//! marker means "unknown", which is served like `some`: by the full view.
//!
//! Invariant: a snapshot with xattrs is never served by the plain view (that would drop
//! them silently). The plain view itself checks the marker before it resolves a
//! snapshot, and refuses an entry that carries xattrs.

use std::collections::HashSet;
use std::fs;
use std::io::Write;
use std::path::PathBuf;

use cowspace_store::{SnapshotId, Store};

const NONE: &str = "none";
const SOME: &str = "some";

/// The marker file of `snapshot`.
pub fn marker_path(store: &Store, snapshot: &SnapshotId) -> PathBuf {
    store.layout().xattr_markers().join(snapshot.to_hex())
}

/// What the marker of `snapshot` says: `Some(true)` it has xattrs, `Some(false)` it has
/// none, `None` unknown (no marker, or one this build cannot read).
pub fn recorded(store: &Store, snapshot: &SnapshotId) -> Option<bool> {
    let text = fs::read_to_string(marker_path(store, snapshot)).ok()?;
    match text.trim_end() {
        NONE => Some(false),
        SOME => Some(true),
        _ => None,
    }
}

/// Whether `snapshot` has an extended attribute on any entry: the recorded answer, else
/// found by walking its trees (each distinct subtree once) and recorded. A marker that
/// cannot be written is logged; the answer stands.
pub fn has_xattrs(store: &Store, snapshot: &SnapshotId) -> cowspace_store::Result<bool> {
    if let Some(known) = recorded(store, snapshot) {
        return Ok(known);
    }
    let found = walk(store, snapshot)?;
    if let Err(e) = record(store, snapshot, found) {
        tracing::warn!(snapshot = %snapshot.to_hex(), "record whether the snapshot has xattrs: {e}");
    }
    Ok(found)
}

/// Records what an import that wrote every tree of `snapshot` saw (`has`: any entry with
/// an extended attribute), so that nothing walks its trees to find it again; a marker
/// already there stands. As in [`has_xattrs`], a marker that cannot be written is logged.
pub fn record_import(store: &Store, snapshot: &SnapshotId, has: bool) {
    if recorded(store, snapshot).is_some() {
        return;
    }
    if let Err(e) = record(store, snapshot, has) {
        tracing::warn!(snapshot = %snapshot.to_hex(), "record whether the snapshot has xattrs: {e}");
    }
}

fn walk(store: &Store, snapshot: &SnapshotId) -> cowspace_store::Result<bool> {
    let snap = store.snapshot(snapshot)?;
    if !snap.root_xattrs.is_empty() {
        return Ok(true);
    }
    let root = snap.root;
    let mut seen = HashSet::from([root]);
    let mut stack = vec![root];
    while let Some(id) = stack.pop() {
        for e in store.tree(&id)?.entries {
            if !e.xattrs.is_empty() {
                return Ok(true);
            }
            if let Some(sub) = e.subtree()
                && seen.insert(sub)
            {
                stack.push(sub);
            }
        }
    }
    Ok(false)
}

fn record(store: &Store, snapshot: &SnapshotId, has: bool) -> std::io::Result<()> {
    let dir = store.layout().xattr_markers();
    fs::create_dir_all(&dir)?;
    let hex = snapshot.to_hex();
    let tmp = dir.join(crate::tmpname::unique(&format!(".{hex}.tmp")));
    let written = (|| {
        let mut f = fs::File::create(&tmp)?;
        writeln!(f, "{}", if has { SOME } else { NONE })?;
        f.sync_all()?;
        fs::rename(&tmp, dir.join(&hex))
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written
}

/// The directory of `snapshot` in the daemon's views: the plain view
/// (`run/view-plain`, no xattr round trips) when the snapshot is known to have no
/// xattrs, else the full view (`run/view`). Found once per snapshot (see
/// [`crate::plain`]); an unknown answer is the full view. A running daemon
/// without a plain view (an older build) serves it from its full view.
pub fn view_path(store: &Store, snapshot: &SnapshotId) -> PathBuf {
    let layout = store.layout();
    let full = layout.view().join(snapshot.to_hex());
    let plain = match crate::plain::has_xattrs(store, snapshot) {
        Ok(false) => layout.plain_view().join(snapshot.to_hex()),
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

#[cfg(test)]
mod tests {
    use super::*;
    use cowspace_store::{ImportOptions, StoreConfig};

    fn store_with(tree: impl Fn(&std::path::Path)) -> (tempfile::TempDir, Store, SnapshotId) {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        fs::create_dir_all(src.join("a/b")).unwrap();
        fs::write(src.join("a/b/f"), b"f").unwrap();
        fs::write(src.join("g"), b"g").unwrap();
        tree(&src);
        let store = Store::init(&tmp.path().join("root"), StoreConfig::default()).unwrap();
        let snap = store
            .import_dir(&src, &ImportOptions::new())
            .unwrap()
            .snapshot;
        (tmp, store, snap)
    }

    #[test]
    fn a_snapshot_without_xattrs_is_recorded_none() {
        let (_tmp, store, snap) = store_with(|_| {});
        assert_eq!(recorded(&store, &snap), None);
        assert!(!has_xattrs(&store, &snap).unwrap());
        assert_eq!(recorded(&store, &snap), Some(false));
        assert_eq!(
            fs::read_to_string(marker_path(&store, &snap)).unwrap(),
            "none\n"
        );
        // Nothing but the marker is left in its directory.
        let names: Vec<_> = fs::read_dir(store.layout().xattr_markers())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from(snap.to_hex())]);
    }

    #[test]
    fn an_xattr_deep_in_the_tree_is_found_and_recorded_some() {
        let (_tmp, store, snap) = store_with(|src| {
            xattr::set(src.join("a/b/f"), "user.deep", b"v").unwrap();
        });
        assert!(has_xattrs(&store, &snap).unwrap());
        assert_eq!(recorded(&store, &snap), Some(true));
        assert_eq!(
            fs::read_to_string(marker_path(&store, &snap)).unwrap(),
            "some\n"
        );
    }

    /// What an import saw of xattrs is what a walk of its trees finds.
    #[test]
    fn an_imports_own_answer_is_the_walks() {
        for with in [false, true] {
            let (tmp, store, _) = store_with(|src| {
                if with {
                    xattr::set(src.join("a/b/f"), "user.deep", b"v").unwrap();
                }
            });
            // (A second import: the first one's snapshot has the same trees.)
            let src = tmp.path().join("src");
            fs::write(src.join("new"), b"n").unwrap();
            let r = store.import_dir(&src, &ImportOptions::new()).unwrap();
            assert_eq!(r.has_xattrs, Some(with));
            assert_eq!(walk(&store, &r.snapshot).unwrap(), with);
            record_import(&store, &r.snapshot, with);
            assert_eq!(recorded(&store, &r.snapshot), Some(with));
        }
    }

    #[test]
    fn an_unreadable_marker_is_unknown_and_rewritten() {
        let (_tmp, store, snap) = store_with(|_| {});
        let m = marker_path(&store, &snap);
        fs::create_dir_all(m.parent().unwrap()).unwrap();
        fs::write(&m, b"").unwrap();
        assert_eq!(recorded(&store, &snap), None);
        assert!(!has_xattrs(&store, &snap).unwrap());
        assert_eq!(recorded(&store, &snap), Some(false));
    }
}
