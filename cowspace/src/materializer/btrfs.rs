//! `btrfs`: on a btrfs runtime root, a snapshot's checkout is made once as a read-only
//! subvolume (`<root>/cache/subvols/<snapshot>`, files cloned from the checkout, with its
//! stamp file `<snapshot>.stamps` beside it); each workspace is a writable subvolume
//! snapshot of it (`<private_dir>/tree`, constant time whatever the tree's size),
//! bind-mounted at its path. The snapshot keeps every inode's number and times, so the
//! base's stamps (hard-linked into the workspace) serve its diff and commit.
//!
//! Subvolumes are made and deleted with the btrfs ioctls (`sys`), not the `btrfs`
//! program: no process per workspace. A workspace's subvolume is deleted by
//! [`crate::checkout::remove_tree`] (through [`crate::subvol`]), which every removal
//! path uses.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use cowspace_store::{SnapshotId, Store};

use crate::error::{Error, Result};
use crate::kinds::{Choice, LowerKind, LowerPlan};
use crate::materializer::fulltree::{self, Fill, Stamps};
use crate::materializer::{ChangesLiveIn, Materializer, MaterializerKind, WorkspaceCtx};
use crate::subvol::{
    create_subvolume, delete_subvolume, is_btrfs, is_subvolume, snapshot_subvolume,
};

/// Where the base subvolume of `snapshot` lives.
pub fn subvol_path(store: &Store, snapshot: &SnapshotId) -> PathBuf {
    store.layout().subvols().join(snapshot.to_hex())
}

fn base_stamps(subvol: &Path) -> PathBuf {
    subvol.with_extension("stamps")
}

/// Creates and deletes a subvolume in the runtime root's `tmp/`, once per root and
/// process.
fn trial_subvolume(root_tmp: &Path) -> std::result::Result<(), String> {
    static PROBED: Mutex<Option<HashMap<PathBuf, std::result::Result<(), String>>>> =
        Mutex::new(None);
    let mut g = PROBED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(r) = g.get_or_insert_with(HashMap::new).get(root_tmp) {
        return r.clone();
    }
    let p = root_tmp.join(format!("subvol-probe-{}", std::process::id()));
    let r = fs::create_dir_all(root_tmp)
        .map_err(|e| format!("cannot create {}: {e}", root_tmp.display()))
        .and_then(|()| create_subvolume(&p).map_err(|e| format!("a trial subvolume failed: {e}")))
        .and_then(|()| {
            delete_subvolume(&p).map_err(|e| format!("deleting a trial subvolume failed: {e}"))
        });
    g.get_or_insert_with(HashMap::new)
        .insert(root_tmp.to_path_buf(), r.clone());
    r
}

/// The lock of `<root>/cache/subvols` (`dir`): held while a base is found or built and
/// snapshotted for a workspace, and while unused bases are pruned. Released on drop.
fn lock_bases(dir: &Path) -> Result<fs::File> {
    fs::create_dir_all(dir).map_err(Error::io("create directory", dir))?;
    crate::lockfile::lock(&dir.join(".lock"), true)
}

/// Deletes the base subvolumes (and their stamps) of `<root>/cache/subvols` whose snapshot
/// is not in `used` (the snapshots of live btrfs workspaces, listed by the caller under
/// this lock: a create records its workspace before it takes the lock to find its base).
/// Returns how many were deleted.
pub fn prune_bases(
    store: &Store,
    used: &dyn Fn() -> Result<std::collections::HashSet<String>>,
) -> Result<u64> {
    let dir = store.layout().subvols();
    if !dir.is_dir() {
        return Ok(0);
    }
    let _lock = lock_bases(&dir)?;
    let used = used()?;
    let mut removed = 0;
    for e in fs::read_dir(&dir)
        .map_err(Error::io("list", &dir))?
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        // Bases are named by snapshot id; their stamps beside them; nothing else here
        // but the lock and build leftovers of a dead create (`.tmp-*`, reclaimed by the
        // next build of the same snapshot).
        if name.len() != 64 || !name.bytes().all(|b| b.is_ascii_hexdigit()) || used.contains(&name)
        {
            continue;
        }
        let path = e.path();
        if let Ok(m) = fs::symlink_metadata(&path)
            && is_subvolume(&path, &m)
        {
            delete_subvolume(&path)?;
            let _ = fs::remove_file(base_stamps(&path));
            removed += 1;
        }
    }
    Ok(removed)
}

/// Makes the read-only base subvolume of `rec`'s snapshot (and its stamps) unless it
/// exists, and returns the bases' lock, held: the caller snapshots the base before a
/// prune may delete it. Serialised so two creates do not build it twice.
fn ensure_base(cx: &WorkspaceCtx<'_>) -> Result<fs::File> {
    let rec = cx.rec;
    let subvol = rec.lower.clone();
    let stamps = base_stamps(&subvol);
    let dir = subvol.parent().ok_or_else(|| {
        Error::Invalid(format!(
            "workspace {}: its recorded base subvolume {} has no parent directory",
            rec.id,
            subvol.display()
        ))
    })?;
    let lock = lock_bases(dir)?;
    if subvol.is_dir() && stamps.is_file() {
        return Ok(lock);
    }
    if subvol.is_dir() {
        // Made by hand or by an older build without stamps: start again.
        delete_subvolume(&subvol)?;
    }
    let (store, snapshot) = (cx.store, cx.base()?);
    let checkout = crate::checkout::ensure_checkout(store, &snapshot)?;
    let tmp = dir.join(crate::tmpname::unique(&format!(
        ".tmp-{}",
        snapshot.short()
    )));
    if fs::symlink_metadata(&tmp).is_ok() {
        delete_subvolume(&tmp)?;
    }
    create_subvolume(&tmp)?;
    let built = (|| {
        let rows = fulltree::build(store, &snapshot, &checkout, &tmp, Fill::Clone)?;
        Stamps::write(&rows, &stamps)?;
        let f = fs::File::open(&tmp).map_err(Error::io("open", &tmp))?;
        crate::sys::btrfs_set_readonly(&f).map_err(Error::io("make read-only", &tmp))?;
        fs::rename(&tmp, &subvol).map_err(Error::io("rename subvolume into place", &subvol))
    })();
    if let Err(e) = built {
        let _ = delete_subvolume(&tmp);
        return Err(e);
    }
    Ok(lock)
}

/// The btrfs subvolume-snapshot materializer.
pub struct Btrfs;

impl Materializer for Btrfs {
    fn kind(&self) -> MaterializerKind {
        MaterializerKind::Btrfs
    }

    fn probe(&self, store: &Store) -> std::result::Result<(), String> {
        if !is_btrfs(store.root()) {
            return Err(format!(
                "the runtime root {} is on {}, not btrfs",
                store.root().display(),
                fulltree::fs_name(store.root())
            ));
        }
        if !nix::unistd::geteuid().is_root() {
            return Err(
                "making and deleting subvolumes and bind-mounting the workspace needs root".into(),
            );
        }
        trial_subvolume(&store.layout().tmp())
    }

    fn lower(
        &self,
        store: &Store,
        snapshot: &SnapshotId,
        asked: Choice<LowerKind>,
    ) -> Result<LowerPlan> {
        match asked {
            Choice::Auto => Ok(LowerPlan::new(
                LowerKind::Subvolume,
                subvol_path(store, snapshot),
            )),
            Choice::Exactly(other) => Err(Error::Invalid(format!(
                "lower {other}: the btrfs materializer snapshots a subvolume of the checkout (lower auto)"
            ))),
        }
    }

    fn mount(&self, cx: &WorkspaceCtx<'_>) -> Result<()> {
        let rec = cx.rec;
        if !fulltree::made(rec) {
            let _base_lock = ensure_base(cx)?;
            let tree = fulltree::tree_dir(rec);
            if let Ok(m) = fs::symlink_metadata(&tree) {
                // A snapshot left by an interrupted create.
                if is_subvolume(&tree, &m) {
                    delete_subvolume(&tree)?;
                } else {
                    crate::checkout::remove_tree(&tree);
                }
            }
            fs::create_dir_all(&rec.private_dir)
                .map_err(Error::io("create directory", &rec.private_dir))?;
            snapshot_subvolume(&rec.lower, &tree, false)?;
            // Last: the stamps mark the tree complete.
            let stamps = fulltree::stamps_path(rec);
            let _ = fs::remove_file(&stamps);
            fs::hard_link(base_stamps(&rec.lower), &stamps)
                .map_err(Error::io("link stamps", &stamps))?;
        }
        fulltree::show(rec)
    }

    fn changes_live_in(&self) -> ChangesLiveIn {
        ChangesLiveIn::FullTree
    }
}
