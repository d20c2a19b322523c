//! Checkouts: a snapshot as a read-only directory of hard links into the blob cache,
//! built once per snapshot and shared by every workspace of it, so overlay workspaces
//! can work without the daemon.
//!
//! A hard link shares its inode's mode, so the blob cache keeps one read-only variant per
//! (content, mode): `<blobs>/ab/<id>.m<mode>`, copied once from the plain blob.
//!
//! Only the first file of a checkout with a given (content, mode) is linked to the blob;
//! later files with the same bytes get their own copy, so two distinct files of the
//! snapshot (two empty files, say) never show as one inode, which tools such as `tar`,
//! `cp -a` and `rsync -H` would take for a hard link.
//!
//! A file that carries xattrs in the snapshot gets its own copy with them set: a blob is
//! shared by every snapshot holding the same bytes, so xattrs set on it would show in all
//! of them. An overlay workspace on the checkout then shows the snapshot's xattrs, and a
//! copy-up keeps them, as its commit does.
//!
//! Link counts (`docs/CONFORMANCE.md`): a file linked to its blob counts the blob cache's
//! own name and the names of every other checkout linking the same variant, so its
//! `st_nlink` is above the snapshot's; a file with a copy of its own (the same bytes and
//! mode as an earlier file of the snapshot, or xattrs) reports the snapshot's count.

use std::collections::HashSet;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use cowspace_store::tree::Target;
use cowspace_store::{ContentId, SnapshotId, Store, TreeId};

use crate::error::{Error, Result};

/// Where the checkout of `snapshot` lives.
pub fn checkout_path(store: &Store, snapshot: &SnapshotId) -> PathBuf {
    store.layout().checkouts().join(snapshot.to_hex())
}

/// The checkouts' lock, held shared while a checkout is found or built for a workspace
/// (whose record exists by then) and exclusively while unused checkouts are pruned, so
/// a prune never removes a checkout a create has just decided to use. Released on drop.
pub fn lock(store: &Store, exclusive: bool) -> Result<fs::File> {
    let dir = store.layout().cache();
    fs::create_dir_all(&dir).map_err(Error::io("create directory", &dir))?;
    crate::lockfile::lock(&store.layout().checkouts_lock(), exclusive)
}

/// The blob-cache file of `content` with permission bits `mode` (made if missing).
fn blob_variant(store: &Store, content: &ContentId, mode: u32) -> Result<PathBuf> {
    let plain = store.blob_cache().ensure(content)?;
    let variant = PathBuf::from(format!("{}.m{:o}", plain.display(), mode & 0o7777));
    if variant.exists() {
        return Ok(variant);
    }
    let tmp = PathBuf::from(crate::tmpname::unique(&format!(
        "{}.tmp",
        variant.display()
    )));
    let _ = fs::remove_file(&tmp);
    fs::copy(&plain, &tmp).map_err(Error::io("copy blob", &tmp))?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(mode & 0o7777))
        .map_err(Error::io("chmod blob", &tmp))?;
    // Never replace an existing variant: a concurrent build may be hard-linking it, and
    // link(2) of an inode that a rename just unlinked fails with ENOENT. Linking the new
    // file into place fails instead when another process was first; then use theirs.
    let placed = fs::hard_link(&tmp, &variant);
    let _ = fs::remove_file(&tmp);
    match placed {
        Ok(()) => Ok(variant),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(variant),
        Err(e) => Err(Error::io("place blob", &variant)(e)),
    }
}

/// Makes sure the checkout of `snapshot` exists and returns its path. Built under a
/// temporary name and renamed into place, so a half-built checkout is never used.
pub fn ensure_checkout(store: &Store, snapshot: &SnapshotId) -> Result<PathBuf> {
    let _shared = lock(store, false)?;
    let dest = checkout_path(store, snapshot);
    if dest.is_dir() {
        return Ok(dest);
    }
    // `checkout_path`'s directory.
    let parent = &store.layout().checkouts();
    fs::create_dir_all(parent).map_err(Error::io("create directory", parent))?;
    let tmp = parent.join(crate::tmpname::unique(&format!(
        ".tmp-{}",
        snapshot.short()
    )));
    let snap = store.snapshot(snapshot)?;
    let built = (|| {
        fs::create_dir(&tmp).map_err(Error::io("create directory", &tmp))?;
        let mut made = Made::default();
        build(store, &snap.root, &tmp, &tmp, &mut made)?;
        cowspace_store::export::set_xattrs(&tmp, &snap.root_xattrs)?;
        fs::set_permissions(&tmp, fs::Permissions::from_mode(snap.root_mode))
            .map_err(Error::io("chmod", &tmp))
    })();
    if let Err(e) = built {
        remove_tree(&tmp);
        return Err(e);
    }
    match fs::rename(&tmp, &dest) {
        Ok(()) => Ok(dest),
        // Another process finished the same checkout first: use theirs.
        Err(_) if dest.is_dir() => {
            remove_tree(&tmp);
            Ok(dest)
        }
        Err(e) => {
            remove_tree(&tmp);
            Err(Error::io("rename checkout into place", &dest)(e))
        }
    }
}

/// What [`build`] made so far.
#[derive(Default)]
struct Made {
    /// The blob variants already linked into this checkout.
    linked: HashSet<PathBuf>,
    /// The first name made of each multiply-linked symlink, by its link group.
    symlinks: std::collections::HashMap<[u8; 32], PathBuf>,
}

fn build(store: &Store, tree: &TreeId, dir: &Path, top: &Path, made: &mut Made) -> Result<()> {
    for e in store.tree(tree)?.entries {
        let path = dir.join(std::ffi::OsStr::from_bytes(&e.name));
        match e.target() {
            Target::Dir(sub) => {
                fs::create_dir(&path).map_err(Error::io("create directory", &path))?;
                build(store, &sub, &path, top, made)?;
                cowspace_store::export::set_xattrs(&path, &e.xattrs)?;
                fs::set_permissions(&path, fs::Permissions::from_mode(e.mode))
                    .map_err(Error::io("chmod", &path))?;
            }
            Target::File(content) => {
                let blob = blob_variant(store, &content, e.mode)?;
                if !e.xattrs.is_empty() {
                    // Its xattrs are its own, not its blob's (the module's doc).
                    fs::copy(&blob, &path).map_err(Error::io("copy blob", &path))?;
                    cowspace_store::export::set_xattrs(&path, &e.xattrs)?;
                } else if made.linked.insert(blob.clone()) {
                    fs::hard_link(&blob, &path).map_err(Error::io("link blob", &path))?;
                } else {
                    // Same bytes as an earlier, distinct file: its own inode (the copy
                    // keeps the variant's permission bits).
                    fs::copy(&blob, &path).map_err(Error::io("copy blob", &path))?;
                }
            }
            Target::Hardlink(_) => {
                let primary = top.join(std::ffi::OsStr::from_bytes(&e.data));
                fs::hard_link(&primary, &path).map_err(Error::io("hard link", &path))?;
            }
            Target::Symlink => match e.link_group().and_then(|g| made.symlinks.get(&g)) {
                // A further name of a symlink: a link of the symlink itself.
                Some(first) => {
                    fs::hard_link(first, &path).map_err(Error::io("hard link", &path))?
                }
                None => {
                    std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(&e.data), &path)
                        .map_err(Error::io("create symlink", &path))?;
                    if let Some(g) = e.link_group() {
                        made.symlinks.insert(g, path.clone());
                    }
                }
            },
            Target::Fifo | Target::CharDevice | Target::BlockDevice => {
                cowspace_store::export::create_special(&path, &e)?
            }
        }
    }
    Ok(())
}

/// Removes a directory tree, making read-only directories writable first (btrfs
/// subvolumes in it are deleted as subvolumes).
pub fn remove_tree(path: &Path) {
    fn open_up(p: &Path) {
        if let Ok(m) = fs::symlink_metadata(p)
            && m.is_dir()
        {
            // A btrfs subvolume (a workspace's tree, a base subvolume) goes in one call,
            // read-only or not.
            if crate::subvol::is_subvolume(p, &m) && crate::subvol::delete_subvolume(p).is_ok() {
                return;
            }
            let _ = fs::set_permissions(p, fs::Permissions::from_mode(0o700));
            if let Ok(rd) = fs::read_dir(p) {
                for e in rd.flatten() {
                    open_up(&e.path());
                }
            }
        }
    }
    if fs::symlink_metadata(path).is_err() {
        return;
    }
    open_up(path);
    let _ = fs::remove_dir_all(path);
}
