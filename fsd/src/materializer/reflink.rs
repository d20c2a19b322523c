//! `reflink`: the workspace is a copy of the snapshot's checkout in which every file is an
//! `FICLONE` clone (it shares the checkout's extents until written), in
//! `<private_dir>/tree`, bind-mounted at its path. Needs a filesystem that clones (xfs
//! made with `reflink=1`, btrfs) holding the whole runtime root. Creating one costs a
//! walk of the tree (a clone per file) but no file data; no daemon is needed.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use cowspace_store::diff::DiffEntry;
use cowspace_store::{Editor, SnapshotId, Store};

use crate::error::Result;
use crate::materializer::fulltree::{self, Fill};
use crate::materializer::{Materializer, MaterializerKind};
use crate::registry::Record;

/// Clones a small file in the runtime root's `tmp/` once per root and process.
fn trial_clone(root_tmp: &Path) -> std::result::Result<(), String> {
    static PROBED: Mutex<Option<HashMap<PathBuf, std::result::Result<(), String>>>> =
        Mutex::new(None);
    let mut g = PROBED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(r) = g.get_or_insert_with(HashMap::new).get(root_tmp) {
        return r.clone();
    }
    let r = (|| {
        fs::create_dir_all(root_tmp)
            .map_err(|e| format!("cannot create {}: {e}", root_tmp.display()))?;
        let a = root_tmp.join(format!("reflink-probe-{}-a", std::process::id()));
        let b = root_tmp.join(format!("reflink-probe-{}-b", std::process::id()));
        let out = (|| {
            fs::write(&a, b"cowspace reflink probe\n")
                .map_err(|e| format!("cannot write {}: {e}", a.display()))?;
            let src =
                fs::File::open(&a).map_err(|e| format!("cannot open {}: {e}", a.display()))?;
            let dst =
                fs::File::create(&b).map_err(|e| format!("cannot create {}: {e}", b.display()))?;
            crate::sys::ficlone(&dst, &src).map_err(|e| {
                format!(
                    "the runtime root is on {}, which cannot clone files (FICLONE: {e}); reflink needs btrfs or xfs made with reflink=1",
                    fulltree::fs_name(root_tmp)
                )
            })
        })();
        let _ = fs::remove_file(&a);
        let _ = fs::remove_file(&b);
        out
    })();
    g.get_or_insert_with(HashMap::new)
        .insert(root_tmp.to_path_buf(), r.clone());
    r
}

/// The reflink (`FICLONE`) materializer.
pub struct Reflink;

impl Materializer for Reflink {
    fn kind(&self) -> MaterializerKind {
        MaterializerKind::Reflink
    }

    fn probe(&self, store: &Store) -> std::result::Result<(), String> {
        trial_clone(&store.layout().tmp())?;
        if !nix::unistd::geteuid().is_root() {
            return Err(
                "the reflink materializer bind-mounts the workspace at its path, which needs root"
                    .into(),
            );
        }
        Ok(())
    }

    fn lower(
        &self,
        store: &Store,
        snapshot: &SnapshotId,
        asked: Option<&str>,
    ) -> Result<Option<(&'static str, PathBuf)>> {
        fulltree::checkout_lower(self.kind(), store, snapshot, asked)
    }

    fn mount(&self, rec: &Record) -> Result<()> {
        fulltree::make_copied(rec, Fill::Clone)?;
        fulltree::show(rec)
    }

    fn diff(
        &self,
        store: &Store,
        base: &SnapshotId,
        rec: &Record,
    ) -> Result<Vec<(DiffEntry, Option<PathBuf>)>> {
        fulltree::diff(store, base, rec)
    }

    fn capture(&self, ed: &mut Editor<'_>, rec: &Record) -> Result<()> {
        fulltree::capture(ed, rec)
    }
}
