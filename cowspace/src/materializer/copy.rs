//! `copy` and `reflink`: the workspace is a full copy of the snapshot's checkout in
//! `<private_dir>/tree`, bind-mounted at its path, diffed and committed through its stamp
//! file (`fulltree`). They differ only in how each file gets its bytes ([`Fill`]):
//! - `copy`: a plain byte copy. The slow baseline every host can run (given root for the
//!   bind mount); only used when asked for by name.
//! - `reflink`: an `FICLONE` clone (it shares the checkout's extents until written). Needs a
//!   filesystem that clones (xfs made with `reflink=1`, btrfs) holding the whole runtime
//!   root (see `reflink.rs`). Creating one costs a walk of the tree (a clone per file) but
//!   no file data; no daemon is needed.

use cowspace_store::{SnapshotId, Store};

use crate::error::Result;
use crate::materializer::fulltree::{self, Fill};
use crate::materializer::{ChangesLiveIn, Materializer, MaterializerKind, WorkspaceCtx, reflink};

/// The copying materializers: `Copied(Fill::Copy)` is `copy`, `Copied(Fill::Clone)` is
/// `reflink`.
pub struct Copied(pub Fill);

impl Materializer for Copied {
    fn kind(&self) -> MaterializerKind {
        match self.0 {
            Fill::Copy => MaterializerKind::Copy,
            Fill::Clone => MaterializerKind::Reflink,
        }
    }

    fn probe(&self, store: &Store) -> std::result::Result<(), String> {
        if self.0 == Fill::Clone {
            reflink::trial_clone(&store.layout().tmp())?;
        }
        if !nix::unistd::geteuid().is_root() {
            return Err(format!(
                "the {} materializer bind-mounts the workspace at its path, which needs root",
                self.kind().as_str()
            ));
        }
        Ok(())
    }

    fn lower(
        &self,
        store: &Store,
        snapshot: &SnapshotId,
        asked: crate::kinds::Choice<crate::kinds::LowerKind>,
    ) -> Result<crate::kinds::LowerPlan> {
        fulltree::checkout_lower(self.kind(), store, snapshot, asked)
    }

    fn mount(&self, cx: &WorkspaceCtx<'_>) -> Result<()> {
        let rec = cx.rec;
        fulltree::make_copied(cx, self.0)?;
        fulltree::show(rec)
    }

    fn changes_live_in(&self) -> ChangesLiveIn {
        ChangesLiveIn::FullTree
    }
}
