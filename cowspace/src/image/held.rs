//! How long an image's metadata mount lives.
//!
//! An image's native lower (`crate::native`: its EROFS metadata image, mounted at
//! `<root>/cache/native/<snapshot>/meta`) is mounted by the first sandbox (or workspace)
//! on the image and then stays mounted for as long as the image exists, that is while a
//! ref names the image's snapshot, so a later `sandbox start --image` or `run --image`
//! finds it mounted and mounts nothing but its own overlay. A snapshot of any other kind
//! keeps the native lower's own rule: unmounted when its last live workspace goes.
//!
//! The mount goes
//! - at `image remove` of the last ref naming the image, once no live sandbox or
//!   workspace uses it ([`Runtime::image_remove`]; one that still runs keeps it until
//!   its own stop, whose release then finds the image gone);
//! - at `gc`, with the native lower itself, when no ref names the image any more and
//!   nothing live uses it (`Runtime::prune_native` keeps the lowers of named images, and
//!   so the blobs they redirect to);
//! - at `sweep`, for an image whose last ref went some other way (`ref delete`, a ref
//!   moved by `ref set`) ([`Runtime::release_unheld_images`]).
//!
//! `daemon stop` leaves it: the mount does not depend on the daemon (as a native
//! workspace's lower does not). After a reboot there is nothing to clean: the mount went
//! with the boot, and the next start on the image mounts it again
//! (`crate::native::ensure`). Every unmount is a [`crate::native::release`]: under the
//! image's mount lock held exclusively, which a start holds shared from the moment it
//! resolved the image until its sandbox is recorded, so none goes under a start.

use std::collections::HashSet;

use cowspace_store::SnapshotId;
use cowspace_store::image::info::ImageInfo;

use crate::error::Result;
use crate::runtime::Runtime;

impl Runtime {
    /// Whether a ref names `snapshot` (hex) and it is an image: its metadata mount stays.
    pub(crate) fn image_named(&self, snapshot: &str) -> Result<bool> {
        let store = self.store();
        for (_, id) in store.refs()? {
            if id.to_hex() == snapshot {
                return Ok(ImageInfo::of(&store.snapshot(&id)?).is_some());
            }
        }
        Ok(false)
    }

    /// The images (snapshot hex) refs name: `gc` keeps their native lowers.
    pub(crate) fn images_named(&self) -> Result<HashSet<String>> {
        let store = self.store();
        let mut out = HashSet::new();
        for (_, id) in store.refs()? {
            let hex = id.to_hex();
            if !out.contains(&hex) && ImageInfo::of(&store.snapshot(&id)?).is_some() {
                out.insert(hex);
            }
        }
        Ok(out)
    }

    /// Removes the ref `name` of an image ([`crate::image::remove`]); when no other ref
    /// names the image and no live sandbox or workspace uses it, its metadata mount goes
    /// too (the native lower itself with the next `gc`).
    pub fn image_remove(&self, name: &str) -> Result<SnapshotId> {
        let id = crate::image::remove(self.store().root(), name)?;
        self.release_image(&id.to_hex())?;
        Ok(id)
    }

    /// Unmounts the metadata mounts of native lowers that no ref naming an image, live
    /// workspace or live sandbox holds (`sweep`). Returns the snapshots (hex) released.
    pub(crate) fn release_unheld_images(&self) -> Result<Vec<String>> {
        let dir = crate::native::dir(self.store());
        let mounted: Vec<String> = crate::mounts::mounts()?
            .into_iter()
            .filter(|m| m.target.parent().is_some_and(|p| p.parent() == Some(&dir)))
            .filter(|m| m.target.file_name().is_some_and(|n| n == "meta"))
            .filter_map(|m| {
                let top = m.target.parent()?.file_name()?.to_str()?.to_string();
                top.parse::<SnapshotId>().ok().map(|_| top)
            })
            .collect();
        let mut released = Vec::new();
        for snapshot in mounted {
            self.release_image(&snapshot)?;
            let meta = crate::native::meta_path(self.store(), &snapshot.parse()?);
            if !crate::mounts::is_mounted(&meta)? {
                released.push(snapshot);
            }
        }
        Ok(released)
    }
}
