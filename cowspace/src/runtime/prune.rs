//! What `gc` removes beside the store: caches no live workspace uses.

use super::*;

impl Runtime {
    /// Deletes the btrfs base subvolumes (`cache/subvols`) no live workspace uses.
    /// Returns how many.
    pub fn prune_subvolumes(&self) -> Result<u64> {
        materializer::btrfs::prune_bases(&self.store, &|| {
            Ok(self
                .reg()
                .list(false)?
                .into_iter()
                .filter(|r| r.materializer == MaterializerKind::Btrfs)
                .map(|r| r.snapshot)
                .collect())
        })
    }

    /// Removes checkouts no live workspace uses, then the blob-cache variants only they
    /// linked. Returns (checkouts, variants) removed.
    pub fn prune_checkouts(&self) -> Result<(u64, u64)> {
        // Records listed under the lock: a create records its workspace before it looks
        // for its checkout under the shared lock, so one that is not listed here finds
        // the checkout gone afterwards and builds it again.
        let _exclusive = checkout::lock(&self.store, true)?;
        let used = self.snapshots_on(LowerKind::Checkout)?;
        let dir = self.store.layout().checkouts();
        let mut removed = 0;
        if let Ok(rd) = fs::read_dir(&dir) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if !used.contains(&name) {
                    checkout::remove_tree(&e.path());
                    removed += 1;
                }
            }
        }
        let variants = self.store.blob_cache().remove_unlinked_variants()?;
        Ok((removed, variants))
    }

    /// Removes the native lowers (images and their mounts, `cache/native`) no live
    /// workspace uses. Returns how many. Like [`Runtime::prune_checkouts`], the records
    /// are listed under the checkouts' lock held exclusively.
    pub fn prune_native(&self) -> Result<u64> {
        let _exclusive = checkout::lock(&self.store, true)?;
        let mut used = self.snapshots_on(LowerKind::Native)?;
        // Images that running sandboxes have as their root (`crate::sandbox_image`).
        used.extend(self.images_in_use()?);
        // Images a ref names keep their lower and its mount (`crate::image::held`).
        used.extend(self.images_named()?);
        crate::native::prune(&self.store, &used)
    }

    /// The snapshots (hex) live workspaces on the lower kind `lower` are made from.
    pub(crate) fn snapshots_on(
        &self,
        lower: LowerKind,
    ) -> Result<std::collections::HashSet<String>> {
        Ok(self
            .reg()
            .list(false)?
            .into_iter()
            .filter(|r| r.lower_kind == lower)
            .map(|r| r.snapshot)
            .collect())
    }

    /// Evicts least recently used blob-cache entries down to `max_bytes`, never one a
    /// native lower redirects to (a checkout's hard links keep theirs on their own).
    /// Under the checkouts' lock held exclusively, so no image is being built meanwhile.
    pub fn evict_blobs(&self, max_bytes: u64) -> Result<cowspace_store::blobcache::EvictReport> {
        let _exclusive = checkout::lock(&self.store, true)?;
        let held = crate::native::held_blobs(&self.store)?;
        Ok(self
            .store
            .blob_cache()
            .evict(max_bytes, &|id| held.contains(id))?)
    }
}
