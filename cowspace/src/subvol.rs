//! btrfs subvolumes: whether a directory is one, and making, snapshotting and deleting
//! them. Below both the btrfs materializer and [`crate::checkout::remove_tree`] (which
//! every removal path uses).

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::error::{Error, Result};

/// The inode number of every btrfs subvolume's root directory
/// (`BTRFS_FIRST_FREE_OBJECTID`).
const SUBVOL_ROOT_INO: u64 = 256;

pub(crate) fn is_btrfs(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::BTRFS_SUPER_MAGIC)
}

/// Whether `path` (with metadata `meta`) is the root of a btrfs subvolume.
pub fn is_subvolume(path: &Path, meta: &fs::Metadata) -> bool {
    meta.is_dir() && meta.ino() == SUBVOL_ROOT_INO && is_btrfs(path)
}

fn parent_and_name(path: &Path) -> Result<(fs::File, &OsStr)> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(Error::Invalid(format!("{} has no parent", path.display())));
    };
    let dir = fs::File::open(parent).map_err(Error::io("open", parent))?;
    Ok((dir, name))
}

/// Deletes the subvolume at `path` with everything in it.
pub fn delete_subvolume(path: &Path) -> Result<()> {
    let (parent, name) = parent_and_name(path)?;
    crate::sys::btrfs_subvol_destroy(&parent, name).map_err(Error::io("delete subvolume", path))
}

pub(crate) fn create_subvolume(path: &Path) -> Result<()> {
    let (parent, name) = parent_and_name(path)?;
    crate::sys::btrfs_subvol_create(&parent, name).map_err(Error::io("create subvolume", path))
}

/// Makes `dest` a snapshot of the subvolume `source` (read-only if asked).
pub(crate) fn snapshot_subvolume(source: &Path, dest: &Path, readonly: bool) -> Result<()> {
    let src = fs::File::open(source).map_err(Error::io("open", source))?;
    let (parent, name) = parent_and_name(dest)?;
    crate::sys::btrfs_snapshot(&parent, &src, name, readonly)
        .map_err(Error::io("snapshot subvolume into", dest))
}
