//! What gc must keep for workspaces: the snapshot each live workspace was made from and
//! every snapshot it committed. Both are pinned in the store (the base at create, a
//! commit in its own transaction); this module adds what the registry knows, for
//! workspaces recorded by versions that pinned only the base, and drops the pins of
//! workspaces that ended.

use std::collections::HashSet;

use cowspace_store::SnapshotId;
use cowspace_store::gc::Held;

use crate::error::Result;
use crate::registry::Status;
use crate::runtime::Runtime;

impl Runtime {
    /// The snapshots live workspaces hold: each one's base and commits.
    pub fn held_snapshots(&self) -> Result<Vec<Held>> {
        let mut out = Vec::new();
        for rec in self.reg().list(false)? {
            for hex in std::iter::once(&rec.snapshot).chain(rec.commits.iter()) {
                match hex.parse::<SnapshotId>() {
                    Ok(snapshot) => out.push(Held {
                        snapshot,
                        holder: rec.id.clone(),
                    }),
                    Err(e) => tracing::warn!(workspace = %rec.id, "recorded snapshot {hex:?}: {e}"),
                }
            }
        }
        Ok(out)
    }

    /// Drops the pins of workspaces recorded as `removed` or `failed` (a commit racing
    /// its workspace's removal may pin after the removal unpinned). Both states are
    /// final, so no live workspace loses a pin. Pins of holders the registry does not
    /// know (a runtime embedding the store) are left. Returns how many holders.
    pub fn release_ended_pins(&self) -> Result<u64> {
        let ended: HashSet<String> = self
            .reg()
            .list(true)?
            .into_iter()
            .filter(|r| matches!(r.status, Status::Removed | Status::Failed))
            .map(|r| r.id)
            .collect();
        let holders: HashSet<String> = self
            .store()
            .pins()?
            .into_iter()
            .map(|(_, h)| h)
            .filter(|h| ended.contains(h))
            .collect();
        for h in &holders {
            self.store().unpin(h)?;
        }
        Ok(holders.len() as u64)
    }
}
