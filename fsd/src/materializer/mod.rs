//! The `Materializer` seam: how a workspace is made from a snapshot.
//!
//! Every materializer gives the same semantics (a writable copy-on-write view of the
//! snapshot whose changes can be diffed and committed); they differ in mechanism. A
//! materializer that cannot work on this host says why from [`Materializer::probe`], and
//! a workspace asking for it by name is refused — never silently given another.

pub mod overlay;

use std::path::PathBuf;

use cowspace_store::diff::DiffEntry;
use cowspace_store::{Editor, SnapshotId, Store};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::registry::Record;

/// The materializers cowspace knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MaterializerKind {
    Overlay,
    Fuse,
    Btrfs,
    Reflink,
    Copy,
}

impl MaterializerKind {
    pub const ALL: [MaterializerKind; 5] = [
        MaterializerKind::Overlay,
        MaterializerKind::Fuse,
        MaterializerKind::Btrfs,
        MaterializerKind::Reflink,
        MaterializerKind::Copy,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            MaterializerKind::Overlay => "overlay",
            MaterializerKind::Fuse => "fuse",
            MaterializerKind::Btrfs => "btrfs",
            MaterializerKind::Reflink => "reflink",
            MaterializerKind::Copy => "copy",
        }
    }

    pub fn parse(s: &str) -> Result<MaterializerKind> {
        MaterializerKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "unknown materializer {s:?}; choose auto, overlay, fuse, btrfs, reflink or copy"
                ))
            })
    }
}

/// How one kind of workspace is made, changed into a snapshot, and unmade.
pub trait Materializer: Send + Sync {
    fn kind(&self) -> MaterializerKind;

    /// `Ok` when it can work on this host; otherwise what the host lacks.
    fn probe(&self, store: &Store) -> std::result::Result<(), String>;

    /// Makes the workspace appear at `rec.path`, using `rec.lower` and private state under
    /// `rec.private_dir`. Creates no state outside those.
    fn mount(&self, rec: &Record) -> Result<()>;

    /// Makes the workspace disappear from `rec.path`, keeping its private state.
    /// Processes using it make this `Busy` unless `force`.
    fn unmount(&self, rec: &Record, force: bool) -> Result<()>;

    /// Whether the workspace is currently usable at its path.
    fn is_mounted(&self, rec: &Record) -> Result<bool>;

    /// The workspace's changes against its base snapshot, each with the host path of
    /// the new content (for patches). Should cost what changed.
    fn diff(
        &self,
        store: &Store,
        base: &SnapshotId,
        rec: &Record,
    ) -> Result<Vec<(DiffEntry, Option<PathBuf>)>>;

    /// Tells `ed` (an editor of the base snapshot) every change of the workspace.
    fn capture(&self, ed: &mut Editor<'_>, rec: &Record) -> Result<()>;
}

/// A materializer that is not part of this build; probing says so.
pub struct NotBuilt(pub MaterializerKind);

impl Materializer for NotBuilt {
    fn kind(&self) -> MaterializerKind {
        self.0
    }
    fn probe(&self, _: &Store) -> std::result::Result<(), String> {
        Err(format!(
            "the {} materializer is not available in this version of cowspace",
            self.0.as_str()
        ))
    }
    fn mount(&self, _: &Record) -> Result<()> {
        Err(Error::Unsupported {
            name: self.0.as_str().into(),
            why: "not available in this version".into(),
        })
    }
    fn unmount(&self, _: &Record, _: bool) -> Result<()> {
        Ok(())
    }
    fn is_mounted(&self, _: &Record) -> Result<bool> {
        Ok(false)
    }
    fn diff(
        &self,
        _: &Store,
        _: &SnapshotId,
        _: &Record,
    ) -> Result<Vec<(DiffEntry, Option<PathBuf>)>> {
        Err(self.mount_error())
    }
    fn capture(&self, _: &mut Editor<'_>, _: &Record) -> Result<()> {
        Err(self.mount_error())
    }
}

impl NotBuilt {
    fn mount_error(&self) -> Error {
        Error::Unsupported {
            name: self.0.as_str().into(),
            why: "not available in this version".into(),
        }
    }
}

/// The materializer of a kind.
pub fn materializer(kind: MaterializerKind) -> Box<dyn Materializer> {
    match kind {
        MaterializerKind::Overlay => Box::new(overlay::Overlay),
        other => Box::new(NotBuilt(other)),
    }
}

/// The fastest materializer that works here (the order is the preference).
pub fn pick_auto(store: &Store) -> Result<MaterializerKind> {
    let mut why = Vec::new();
    for kind in [
        MaterializerKind::Overlay,
        MaterializerKind::Fuse,
        MaterializerKind::Btrfs,
        MaterializerKind::Reflink,
    ] {
        match materializer(kind).probe(store) {
            Ok(()) => return Ok(kind),
            Err(w) => why.push(format!("{}: {w}", kind.as_str())),
        }
    }
    Err(Error::Unsupported {
        name: "auto".into(),
        why: why.join("; "),
    })
}
