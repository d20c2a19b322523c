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
use crate::materializer::{ChangesLiveIn, LowerKind, Materializer, MaterializerKind, WorkspaceCtx};
use crate::registry::Record;
use crate::upper::UpperChange;

/// The test double of kind `0` (see the module docs).
pub struct PlainDir(pub MaterializerKind);

impl PlainDir {
    /// Where an unmounted workspace's tree waits.
    fn parked(rec: &Record) -> PathBuf {
        rec.private_dir.join("plain-tree")
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
        _asked: crate::kinds::Choice<LowerKind>,
    ) -> Result<crate::kinds::LowerPlan> {
        // Read from the store itself, as fuse workspaces are: no checkout is made.
        Ok(crate::kinds::LowerPlan::new(
            LowerKind::Store,
            store.root().join("store"),
        ))
    }

    fn mount(&self, cx: &WorkspaceCtx<'_>) -> Result<()> {
        let rec = cx.rec;
        if rec.path.is_dir() {
            return Ok(());
        }
        let parked = Self::parked(rec);
        if parked.is_dir() {
            return fs::rename(&parked, &rec.path).map_err(Error::io("move back", &rec.path));
        }
        cx.store.export_dir(&cx.base()?, &rec.path)?;
        Ok(())
    }

    fn unmount(&self, cx: &WorkspaceCtx<'_>, _force: bool) -> Result<()> {
        let rec = cx.rec;
        if !rec.path.is_dir() {
            return Ok(());
        }
        fs::rename(&rec.path, Self::parked(rec)).map_err(Error::io("move away", &rec.path))
    }

    fn is_mounted(&self, cx: &WorkspaceCtx<'_>) -> Result<bool> {
        let rec = cx.rec;
        Ok(rec.path.is_dir())
    }

    fn diff(&self, cx: &WorkspaceCtx<'_>) -> Result<Vec<(DiffEntry, Option<PathBuf>)>> {
        crate::upper::diff_changes(cx.store, &cx.base()?, self.changes(cx)?)
    }

    fn capture(&self, cx: &WorkspaceCtx<'_>, ed: &mut Editor<'_>) -> Result<()> {
        crate::upper::capture_changes(ed, self.changes(cx)?)
    }

    fn changes(&self, cx: &WorkspaceCtx<'_>) -> Result<Vec<UpperChange>> {
        fulltree::changes(cx.store, &cx.base()?, &cx.rec.path, &Stamps::default())
    }
}
