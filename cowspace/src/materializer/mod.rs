//! The `Materializer` seam: how a workspace is made from a snapshot.
//!
//! Every materializer gives the same semantics (a writable copy-on-write view of the
//! snapshot whose changes can be diffed and committed); they differ in mechanism. A
//! materializer that cannot work on this host says why from [`Materializer::probe`], and
//! a workspace asking for it by name is refused — never silently given another.

pub mod btrfs;
pub mod copy;
pub mod forktree;
pub mod fulltree;
pub mod fuse;
pub mod nfs;
pub mod overlay;
pub mod plaindir;
pub mod reflink;

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use cowspace_store::diff::DiffEntry;
use cowspace_store::{Editor, SnapshotId, Store};

use crate::error::{Error, Result};
use crate::mounts;
use crate::registry::Record;

pub use crate::kinds::{Choice, LowerKind, LowerPlan, MaterializerKind};

/// Where a workspace's changes are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangesLiveIn {
    /// An upper directory in overlay's format (`<private>/upper`): overlay and fuse.
    Upper,
    /// A whole tree with the stamps it was made with (`<private>/tree`): btrfs, reflink,
    /// copy.
    FullTree,
    /// Somewhere of the materializer's own (it implements diff, capture and changes).
    Own,
}

/// What a materializer works on: the runtime root's store and one workspace's record.
#[derive(Clone, Copy)]
pub struct WorkspaceCtx<'a> {
    pub store: &'a Store,
    pub rec: &'a Record,
}

impl<'a> WorkspaceCtx<'a> {
    pub fn new(store: &'a Store, rec: &'a Record) -> WorkspaceCtx<'a> {
        WorkspaceCtx { store, rec }
    }

    /// The snapshot the workspace was made from.
    pub fn base(&self) -> Result<SnapshotId> {
        Ok(self.rec.snapshot.parse()?)
    }
}

/// How one kind of workspace is made, changed into a snapshot, and unmade.
pub trait Materializer: Send + Sync {
    fn kind(&self) -> MaterializerKind;

    /// `Ok` when it can work on this host; otherwise what the host lacks.
    fn probe(&self, store: &Store) -> std::result::Result<(), String>;

    /// [`Materializer::probe`], then whatever more a slower check can tell (`doctor`):
    /// a trial of the mechanism itself where one is cheap enough.
    fn check(&self, store: &Store) -> std::result::Result<(), String> {
        self.probe(store)
    }

    /// The lower a create of `snapshot` uses: this materializer's own policy for
    /// `asked` (`auto`: its choice). A lower it cannot use is refused here, before
    /// anything is made.
    fn lower(
        &self,
        store: &Store,
        snapshot: &SnapshotId,
        asked: Choice<LowerKind>,
    ) -> Result<LowerPlan>;

    /// Makes the workspace appear at `rec.path`, using `rec.lower` and private state under
    /// `rec.private_dir`. Creates no state outside those.
    fn mount(&self, cx: &WorkspaceCtx<'_>) -> Result<()>;

    /// Makes the workspace disappear from `rec.path`, keeping its private state.
    /// Processes using it make this `Busy` unless `force`.
    fn unmount(&self, cx: &WorkspaceCtx<'_>, force: bool) -> Result<()> {
        unmount_path(cx.rec, force)
    }

    /// [`Materializer::unmount`] for a removal: where the mount's teardown costs time
    /// (evicting every inode a used workspace made, syncing an overlay's upper layer) and
    /// this process tears down later ([`mounts::deferring`], the daemon), the workspace
    /// leaves `rec.path` now and its superblock goes on the teardown thread.
    fn unmount_for_removal(&self, cx: &WorkspaceCtx<'_>, force: bool) -> Result<()> {
        self.unmount(cx, force)
    }

    /// Whether the workspace is currently usable at its path.
    fn is_mounted(&self, cx: &WorkspaceCtx<'_>) -> Result<bool> {
        mounts::is_mounted(&cx.rec.path)
    }

    /// Where the workspace's changes are, which decides how they are diffed, committed
    /// and listed unless a materializer says otherwise itself.
    fn changes_live_in(&self) -> ChangesLiveIn;

    /// Makes the workspace's changes readable where they live before they are diffed
    /// or committed (fuse: its copy-ups in progress are finished).
    fn settle(&self, _cx: &WorkspaceCtx<'_>) -> Result<()> {
        Ok(())
    }

    /// The workspace's changes against its base snapshot, each with the host path of
    /// the new content (for patches). Costs what changed.
    fn diff(&self, cx: &WorkspaceCtx<'_>) -> Result<Vec<(DiffEntry, Option<PathBuf>)>> {
        self.settle(cx)?;
        let base = cx.base()?;
        match self.changes_live_in() {
            ChangesLiveIn::Upper => crate::upper::diff(cx.store, &base, &cx.rec.upper_dir()),
            ChangesLiveIn::FullTree => fulltree::diff(cx.store, &base, cx.rec),
            ChangesLiveIn::Own => Err(own_changes(self.kind())),
        }
    }

    /// Tells `ed` (an editor of the base snapshot) every change of the workspace.
    fn capture(&self, cx: &WorkspaceCtx<'_>, ed: &mut Editor<'_>) -> Result<()> {
        self.settle(cx)?;
        match self.changes_live_in() {
            ChangesLiveIn::Upper => crate::upper::capture(ed, &cx.rec.upper_dir()),
            ChangesLiveIn::FullTree => fulltree::capture(cx, ed),
            ChangesLiveIn::Own => Err(own_changes(self.kind())),
        }
    }

    /// What changed in the workspace since it was made, as an upper layer records it,
    /// read as cheaply as the mechanism allows (the git fsmonitor asks on every `git
    /// status`). Copy-ups in progress need not be finished: paths are what counts.
    fn changes(&self, cx: &WorkspaceCtx<'_>) -> Result<Vec<crate::upper::UpperChange>> {
        match self.changes_live_in() {
            ChangesLiveIn::Upper => crate::upper::changes(&cx.rec.upper_dir()),
            ChangesLiveIn::FullTree => fulltree::changes_of(cx.store, &cx.base()?, cx.rec),
            ChangesLiveIn::Own => Err(own_changes(self.kind())),
        }
    }

    /// The workspace's upper directory in overlay's format, where it has one (the
    /// sandbox then shows it to git's fsmonitor, and commits carry git's index on).
    fn upper_dir(&self, rec: &Record) -> Option<PathBuf> {
        (self.changes_live_in() == ChangesLiveIn::Upper).then(|| rec.upper_dir())
    }

    /// Whether the daemon serves the workspace itself (its mount dies with the daemon).
    fn served_by_daemon(&self) -> bool {
        false
    }

    /// Whether a sandbox shares the host's mount of the workspace: one overlay of the
    /// workspace's layers, idmapped for the sandbox, that the host path shows too;
    /// otherwise the sandbox binds the workspace path.
    fn sandbox_shares_host_mount(&self) -> bool {
        false
    }
}

/// The materializers a [`crate::Runtime`] uses, one per kind:
/// [`Materializers::standard`], with any kind replaced (the daemon registers its FUSE
/// server; tests put a double in).
#[derive(Clone)]
pub struct Materializers {
    table: [std::sync::Arc<dyn Materializer>; MaterializerKind::ALL.len()],
}

impl Materializers {
    /// The materializers of this build.
    pub fn standard() -> Materializers {
        Materializers {
            table: MaterializerKind::ALL.map(standard),
        }
    }

    /// This table with `m` serving its kind.
    pub fn with(mut self, m: std::sync::Arc<dyn Materializer>) -> Materializers {
        let i = Self::index(m.kind());
        self.table[i] = m;
        self
    }

    /// This table with fuse workspaces served by `host` (this process is the daemon).
    pub fn with_fuse_host(self, host: std::sync::Arc<dyn fuse::FuseHost>) -> Materializers {
        let nfs = nfs::Nfs {
            served: fuse::Fuse {
                host: Some(std::sync::Arc::clone(&host)),
            },
        };
        self.with(std::sync::Arc::new(fuse::Fuse { host: Some(host) }))
            .with(std::sync::Arc::new(nfs))
    }

    /// The materializer of `kind`.
    pub fn get(&self, kind: MaterializerKind) -> &dyn Materializer {
        self.table[Self::index(kind)].as_ref()
    }

    /// The fastest materializer that works here (the order is the preference).
    pub fn pick_auto(&self, store: &Store) -> Result<MaterializerKind> {
        let mut why = Vec::new();
        for kind in [
            MaterializerKind::Overlay,
            MaterializerKind::Fuse,
            MaterializerKind::Btrfs,
            MaterializerKind::Reflink,
        ] {
            match self.get(kind).probe(store) {
                Ok(()) => return Ok(kind),
                Err(w) => why.push(format!("{}: {w}", kind.as_str())),
            }
        }
        Err(Error::Unsupported {
            name: "auto".into(),
            why: why.join("; "),
        })
    }

    /// `kind`'s place in the table: `ALL` lists the kinds in their declaration order
    /// (checked by a test of `kinds.rs`), so its place is its discriminant.
    fn index(kind: MaterializerKind) -> usize {
        kind as usize
    }
}

/// What the defaults answer for a materializer that keeps its changes itself
/// ([`ChangesLiveIn::Own`]) but did not implement the method asked for: a bug.
fn own_changes(kind: MaterializerKind) -> Error {
    Error::Unsupported {
        name: kind.as_str().into(),
        why: "this materializer keeps its changes itself and does not implement this".into(),
    }
}

/// The standard materializer of a kind.
fn standard(kind: MaterializerKind) -> std::sync::Arc<dyn Materializer> {
    match kind {
        MaterializerKind::Overlay => std::sync::Arc::new(overlay::Overlay),
        MaterializerKind::Btrfs => std::sync::Arc::new(btrfs::Btrfs),
        MaterializerKind::Reflink => std::sync::Arc::new(copy::Copied(fulltree::Fill::Clone)),
        MaterializerKind::Copy => std::sync::Arc::new(copy::Copied(fulltree::Fill::Copy)),
        MaterializerKind::Fuse => std::sync::Arc::new(fuse::Fuse::default()),
        MaterializerKind::Nfs => std::sync::Arc::new(nfs::Nfs::default()),
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

/// How long a removal waits, at most, for a busy workspace whose users are all on their
/// way out (exiting, zombies) or cannot be found (a reference the kernel lets go of
/// shortly: a FUSE release still in flight) before it says busy. A live process using
/// it makes the removal busy at once.
pub(crate) const BUSY_SETTLE_MS: u64 = 2_000;

/// How often the unmount is tried again meanwhile.
const BUSY_POLL_MS: u64 = 5;

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
        Err(nix::Error::EBUSY) if !force => settle(
            &rec.id,
            &rec.path,
            &unmount,
            &Holders {
                of: &mounts::users_of,
                exiting: &mounts::is_exiting,
                settle_ms: BUSY_SETTLE_MS,
            },
        ),
        Err(nix::Error::EBUSY) => {
            let pids = mounts::users_of(&rec.path);
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

/// Who holds a busy mount: the seam [`settle`]'s tests replace.
struct Holders<'a> {
    /// The processes using a path ([`mounts::users_of`]).
    of: &'a dyn Fn(&Path) -> Vec<i32>,
    /// Whether a process is on its way out ([`mounts::is_exiting`]).
    exiting: &'a dyn Fn(i32) -> bool,
    /// [`BUSY_SETTLE_MS`].
    settle_ms: u64,
}

/// After an unmount of `path` failed with EBUSY (and no `--force`): `Busy`, naming them,
/// when live processes use it (seen at two looks in a row, so that a child between
/// `fork` and `exec` that inherited a descriptor does not count); else the unmount is
/// tried again until the processes that were exiting are gone, for at most
/// `settle_ms`. Processes finishing their `exit` (a workload's commands that just
/// ended) hold their working directory and files a moment after their parent saw them
/// end.
fn settle(
    id: &str,
    path: &Path,
    unmount: &dyn Fn(&Path) -> std::result::Result<Option<OwnedFd>, nix::Error>,
    h: &Holders<'_>,
) -> Result<Option<OwnedFd>> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(h.settle_ms);
    let mut live_before: Option<Vec<i32>> = None;
    loop {
        let users = (h.of)(path);
        let live: Vec<i32> = users.iter().copied().filter(|p| !(h.exiting)(*p)).collect();
        let held = live_before
            .as_ref()
            .is_some_and(|before| live.iter().any(|p| before.contains(p)));
        if held || std::time::Instant::now() >= deadline {
            let pids = if live.is_empty() { users } else { live };
            return Err(Error::Busy {
                id: id.to_string(),
                pids,
            });
        }
        live_before = Some(live);
        std::thread::sleep(std::time::Duration::from_millis(BUSY_POLL_MS));
        match unmount(path) {
            Ok(clone) => return Ok(clone),
            Err(nix::Error::EBUSY) => {}
            Err(nix::Error::EINVAL | nix::Error::ENOENT) if !mounts::is_mounted(path)? => {
                return Ok(None);
            }
            Err(source) => {
                return Err(Error::Unmount {
                    target: path.to_path_buf(),
                    source,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    type Unmount = std::result::Result<Option<OwnedFd>, nix::Error>;

    /// An unmount that is busy `busy_for` times, then succeeds; and how often it ran.
    fn busy_then_free(busy_for: usize) -> (std::rc::Rc<Cell<usize>>, impl Fn(&Path) -> Unmount) {
        let tries = std::rc::Rc::new(Cell::new(0));
        let t = tries.clone();
        (tries, move |_: &Path| {
            t.set(t.get() + 1);
            if t.get() <= busy_for {
                Err(nix::Error::EBUSY)
            } else {
                Ok(None)
            }
        })
    }

    #[test]
    fn a_removal_waits_for_users_that_are_exiting() {
        // The first unmount (by the caller) and two more are busy while pid 42 exits.
        let (tries, unmount) = busy_then_free(3);
        let h = Holders {
            of: &|_| if tries.get() < 3 { vec![42] } else { vec![] },
            exiting: &|pid| pid == 42,
            settle_ms: 60_000,
        };
        assert!(unmount(Path::new("/ws")).is_err());
        settle("ws-1", Path::new("/ws"), &unmount, &h).expect("unmounted once 42 is gone");
        assert_eq!(tries.get(), 4);
    }

    #[test]
    fn a_live_user_makes_it_busy_at_once_and_is_named() {
        let (_, unmount) = busy_then_free(usize::MAX);
        let h = Holders {
            of: &|_| vec![7, 42],
            exiting: &|pid| pid == 42,
            settle_ms: 60_000,
        };
        match settle("ws-1", Path::new("/ws"), &unmount, &h) {
            Err(Error::Busy { id, pids }) => {
                assert_eq!(id, "ws-1");
                assert_eq!(pids, vec![7], "the live user, not the exiting one");
            }
            other => panic!("not busy: {other:?}"),
        }
    }

    #[test]
    fn a_user_seen_once_does_not_count() {
        // A child between fork and exec holds an inherited descriptor for a moment.
        let looks = Cell::new(0);
        let (_, unmount) = busy_then_free(2);
        let h = Holders {
            of: &|_| {
                looks.set(looks.get() + 1);
                if looks.get() == 1 { vec![9] } else { vec![] }
            },
            exiting: &|_| false,
            settle_ms: 60_000,
        };
        assert!(unmount(Path::new("/ws")).is_err());
        settle("ws-1", Path::new("/ws"), &unmount, &h).expect("unmounted");
    }

    #[test]
    fn a_mount_busy_with_no_user_found_is_busy_after_the_bound() {
        let (_, unmount) = busy_then_free(usize::MAX);
        let h = Holders {
            of: &|_| vec![],
            exiting: &|_| false,
            settle_ms: 0,
        };
        assert!(matches!(
            settle("ws-1", Path::new("/ws"), &unmount, &h),
            Err(Error::Busy { pids, .. }) if pids.is_empty()
        ));
    }
}
