//! `PlainDir`: a materializer that needs no privilege and no mount, for tests of the
//! runtime (and of a runtime embedding it). The workspace is a plain directory tree
//! exported from the snapshot at the workspace's path; unmounting moves it into the
//! private directory and mounting moves it back, so its state survives both. Diff and
//! commit compare the whole tree with the snapshot (nothing is stamped), which is slow
//! on large trees and exact on any.
//!
//! It stands in for a kind of the table (`Materializers::standard().with(...)`): the
//! record keeps that kind's name, so it never reaches a runtime that uses the real one.

use std::fs;
use std::path::PathBuf;

use cowspace_store::diff::DiffEntry;
use cowspace_store::{Editor, SnapshotId, Store};

use crate::error::{Error, Result};
use crate::materializer::fulltree::{self, Stamps};
use crate::materializer::{ChangesLiveIn, LowerKind, Materializer, MaterializerKind};
use crate::registry::Record;
use crate::upper::UpperChange;

/// The test double of kind `0` (see the module docs).
pub struct PlainDir(pub MaterializerKind);

impl PlainDir {
    /// Where an unmounted workspace's tree waits.
    fn parked(rec: &Record) -> PathBuf {
        rec.private_dir.join("plain-tree")
    }

    fn tree_changes(store: &Store, base: &SnapshotId, rec: &Record) -> Result<Vec<UpperChange>> {
        fulltree::changes(store, base, &rec.path, &Stamps::default())
    }
}

impl Materializer for PlainDir {
    fn kind(&self) -> MaterializerKind {
        self.0
    }

    fn probe(&self, _store: &Store) -> std::result::Result<(), String> {
        Ok(())
    }

    fn changes_live_in(&self) -> ChangesLiveIn {
        ChangesLiveIn::Own
    }

    fn lower(
        &self,
        store: &Store,
        _snapshot: &SnapshotId,
        _asked: Option<&str>,
    ) -> Result<Option<(LowerKind, PathBuf)>> {
        // Read from the store itself, as fuse workspaces are: no checkout is made.
        Ok(Some((LowerKind::Store, store.root().join("store"))))
    }

    fn mount(&self, rec: &Record) -> Result<()> {
        if rec.path.is_dir() {
            return Ok(());
        }
        let parked = Self::parked(rec);
        if parked.is_dir() {
            return fs::rename(&parked, &rec.path).map_err(Error::io("move back", &rec.path));
        }
        let store = fulltree::store_of(rec)?;
        let snapshot: SnapshotId = rec.snapshot.parse()?;
        store.export_dir(&snapshot, &rec.path)?;
        Ok(())
    }

    fn unmount(&self, rec: &Record, _force: bool) -> Result<()> {
        if !rec.path.is_dir() {
            return Ok(());
        }
        fs::rename(&rec.path, Self::parked(rec)).map_err(Error::io("move away", &rec.path))
    }

    fn is_mounted(&self, rec: &Record) -> Result<bool> {
        Ok(rec.path.is_dir())
    }

    fn diff(
        &self,
        store: &Store,
        base: &SnapshotId,
        rec: &Record,
    ) -> Result<Vec<(DiffEntry, Option<PathBuf>)>> {
        crate::upper::diff_changes(store, base, Self::tree_changes(store, base, rec)?)
    }

    fn capture(&self, ed: &mut Editor<'_>, rec: &Record) -> Result<()> {
        let base: SnapshotId = rec.snapshot.parse()?;
        let changes = Self::tree_changes(ed.store(), &base, rec)?;
        crate::upper::capture_changes(ed, changes)
    }

    fn changes(&self, store: &Store, base: &SnapshotId, rec: &Record) -> Result<Vec<UpperChange>> {
        Self::tree_changes(store, base, rec)
    }
}
