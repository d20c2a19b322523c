//! The `Materializer` seam: how a workspace is made from a snapshot.
//!
//! Every materializer gives the same semantics (a writable copy-on-write view of the
//! snapshot whose changes can be diffed and committed); they differ in mechanism. A
//! materializer that cannot work on this host says why from [`Materializer::probe`], and
//! a workspace asking for it by name is refused — never silently given another.

pub mod btrfs;
pub mod copy;
pub mod fulltree;
pub mod fuse;
pub mod overlay;
pub mod reflink;

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use cowspace_store::diff::DiffEntry;
use cowspace_store::{Editor, SnapshotId, Store};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::mounts;
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

    /// The read-only source this materializer makes workspaces from when it chooses it
    /// itself: `(lower_kind, path)`, recorded as the workspace's `lower_kind` and `lower`.
    /// `asked` is the `lower` the user gave (`None` or `auto`: no preference); one this
    /// materializer cannot use is refused here, before anything is made. `None`: the
    /// runtime's choice of `view` or `checkout` (overlay).
    fn lower(
        &self,
        _store: &Store,
        _snapshot: &SnapshotId,
        _asked: Option<&str>,
    ) -> Result<Option<(&'static str, PathBuf)>> {
        Ok(None)
    }

    /// Makes the workspace appear at `rec.path`, using `rec.lower` and private state under
    /// `rec.private_dir`. Creates no state outside those.
    fn mount(&self, rec: &Record) -> Result<()>;

    /// Makes the workspace disappear from `rec.path`, keeping its private state.
    /// Processes using it make this `Busy` unless `force`.
    fn unmount(&self, rec: &Record, force: bool) -> Result<()> {
        unmount_path(rec, force)
    }

    /// [`Materializer::unmount`] for a removal: where the mount's teardown costs time
    /// (evicting every inode a used workspace made, syncing an overlay's upper layer) and
    /// this process tears down later ([`mounts::deferring`], the daemon), the workspace
    /// leaves `rec.path` now and its superblock goes on the teardown thread.
    fn unmount_for_removal(&self, rec: &Record, force: bool) -> Result<()> {
        self.unmount(rec, force)
    }

    /// Whether the workspace is currently usable at its path.
    fn is_mounted(&self, rec: &Record) -> Result<bool> {
        mounts::is_mounted(&rec.path)
    }

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
        MaterializerKind::Btrfs => Box::new(btrfs::Btrfs),
        MaterializerKind::Reflink => Box::new(copy::Copied(fulltree::Fill::Clone)),
        MaterializerKind::Copy => Box::new(copy::Copied(fulltree::Fill::Copy)),
        MaterializerKind::Fuse => Box::new(fuse::Fuse),
    }
}

/// Unmounts the workspace at `rec.path` if mounted. `Busy` while processes use it,
/// unless `force`, which kills them (then detaches lazily if it is still busy).
pub(crate) fn unmount_path(rec: &Record, force: bool) -> Result<()> {
    unmount_path_with(rec, force, |p| mounts::unmount(p).map(|()| None)).map(drop)
}

/// [`unmount_path`], keeping the mount's superblock alive in a detached clone (returned,
/// when one could be taken; see [`mounts::unmount_keeping_superblock`]): its teardown
/// happens when the clone is closed.
pub(crate) fn unmount_path_keeping_superblock(
    rec: &Record,
    force: bool,
) -> Result<Option<OwnedFd>> {
    unmount_path_with(rec, force, mounts::unmount_keeping_superblock)
}

fn unmount_path_with(
    rec: &Record,
    force: bool,
    unmount: impl Fn(&Path) -> std::result::Result<Option<OwnedFd>, nix::Error>,
) -> Result<Option<OwnedFd>> {
    // Unmounted first and asked after: reading the mount table costs more than the
    // unmount, and grows with every workspace mounted.
    match unmount(&rec.path) {
        Ok(clone) => Ok(clone),
        // Not a mount point; or one this process may not unmount (also EINVAL), which
        // the mount table tells apart.
        Err(nix::Error::EINVAL | nix::Error::ENOENT) if !mounts::is_mounted(&rec.path)? => Ok(None),
        Err(nix::Error::EBUSY) => {
            let pids = mounts::users_of(&rec.path);
            if !force {
                return Err(Error::Busy {
                    id: rec.id.clone(),
                    pids,
                });
            }
            for pid in &pids {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(*pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            // Give the killed processes a moment to release the mount.
            for _ in 0..50 {
                match unmount(&rec.path) {
                    Ok(clone) => return Ok(clone),
                    Err(nix::Error::EBUSY) => {
                        std::thread::sleep(std::time::Duration::from_millis(20))
                    }
                    Err(source) => {
                        return Err(Error::Unmount {
                            target: rec.path.clone(),
                            source,
                        });
                    }
                }
            }
            mounts::unmount_lazy(&rec.path).map(|()| None)
        }
        Err(source) => Err(Error::Unmount {
            target: rec.path.clone(),
            source,
        }),
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
