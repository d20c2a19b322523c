//! `copy`: the workspace is a plain byte copy of the snapshot's checkout in
//! `<private_dir>/tree`, bind-mounted at its path. The slow baseline every host can run
//! (given root for the bind mount); only used when asked for by name.

use std::path::PathBuf;

use cowspace_store::diff::DiffEntry;
use cowspace_store::{Editor, SnapshotId, Store};

use crate::error::Result;
use crate::materializer::fulltree::{self, Fill};
use crate::materializer::{Materializer, MaterializerKind};
use crate::registry::Record;

/// The plain-copy materializer.
pub struct Copy;

impl Materializer for Copy {
    fn kind(&self) -> MaterializerKind {
        MaterializerKind::Copy
    }

    fn probe(&self, _store: &Store) -> std::result::Result<(), String> {
        if !nix::unistd::geteuid().is_root() {
            return Err(
                "the copy materializer bind-mounts the workspace at its path, which needs root"
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
        fulltree::make_copied(rec, Fill::Copy)?;
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
