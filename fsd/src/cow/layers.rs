//! The workspace's private state on disk, in exactly kernel overlayfs's upper-layer
//! format (`userxattr`, no redirects, no metacopy), and the operations the writable view
//! makes on it: whiteouts, opaque directories, copy-up, the stable inode numbers.
//!
//! Nothing here is kept in memory that the disk does not also say: the upper directory
//! is the truth, so a daemon that died is replaced by one that serves the same upper.

use std::fs::{self, File};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use cowspace_store::{ContentId, Entry, Kind, SnapshotId, Store};
use nix::fcntl::{AT_FDCWD, RenameFlags};
use nix::sys::stat::{Mode, SFlag, UtimensatFlags};
use nix::sys::time::TimeSpec;

use super::fdio::{copy_content, copy_range, set_times};
use super::lazy::{LAZY_COPY_MIN_BYTES, Pending};
use crate::view::{INO_LIMIT, InodeKey, VIEW_TIME_SECS};

/// The xattr holding a copied-up object's inode number (8 bytes, little-endian), so
/// `st_ino` survives copy-up and daemon restarts. `trusted.*` is neither recorded by
/// commits (`upper.rs` keeps `user.*` and `security.capability`) nor read by overlayfs
/// mounted with `userxattr`.
pub const INO_XATTR: &str = "trusted.cowspace.ino";
/// Overlay's opaque-directory mark under `userxattr` (what `upper.rs` reads).
pub const OPAQUE_XATTR: &str = "user.overlay.opaque";
/// Objects made in the workspace are numbered `UPPER_INO_BASE + (st_ino mod 2^48)` in
/// the upper directory; snapshot entries are numbered below [`INO_LIMIT`] (the view's
/// formula), so the two never meet.
pub const UPPER_INO_BASE: u64 = INO_LIMIT;

/// xattr names the workspace hides and refuses: overlay's metadata and ours.
pub fn reserved_xattr(name: &[u8]) -> bool {
    name.starts_with(b"user.overlay.")
        || name.starts_with(b"system.posix_acl_")
        || name.starts_with(b"trusted.overlay.")
        || name.starts_with(b"trusted.cowspace.")
}

/// Whether an upper entry is a whiteout (overlay's deleted-path record: a character
/// device 0:0).
pub fn is_whiteout(meta: &fs::Metadata) -> bool {
    meta.file_type().is_char_device() && meta.rdev() == 0
}

/// Whether an upper directory hides the snapshot's directory beneath it.
pub fn is_opaque(dir: &Path) -> bool {
    matches!(xattr::get(dir, OPAQUE_XATTR), Ok(Some(v)) if v == b"y")
        || matches!(xattr::get(dir, "trusted.overlay.opaque"), Ok(Some(v)) if v == b"y")
}

/// The inode number an upper object is served with.
pub fn upper_ino(path: &Path, meta: &fs::Metadata) -> u64 {
    if let Ok(Some(v)) = xattr::get(path, INO_XATTR)
        && let Ok(b) = <[u8; 8]>::try_from(v.as_slice())
    {
        return u64::from_le_bytes(b);
    }
    UPPER_INO_BASE + meta.ino() % INO_LIMIT
}

/// The inode number of snapshot entry `entry` at `path` (the view's numbers, so a file
/// has the identity a checkout's rewritten `.git/index` expects).
pub fn lower_ino(snapshot: &SnapshotId, path: &[u8], entry: &Entry) -> u64 {
    InodeKey::of_entry(snapshot, path, entry).ino(0)
}

/// The mtime (= ctime = atime) of a snapshot entry, as the view serves it.
pub fn lower_time_secs(path: &[u8], entry: &Entry) -> u64 {
    if entry.kind.has_content() {
        crate::view::served_time_secs(path)
    } else {
        VIEW_TIME_SECS
    }
}

pub use cowspace_store::tree::join_path as join;

/// A snapshot entry being copied up: its path from the snapshot root, the entry, and the
/// inode number its copy keeps.
#[derive(Clone, Copy)]
pub struct Source<'a> {
    pub rel: &'a [u8],
    pub entry: &'a Entry,
    pub ino: u64,
}

/// The private state of one workspace.
pub struct Layers {
    pub store: std::sync::Arc<Store>,
    pub snapshot: SnapshotId,
    /// `<private_dir>/upper`.
    pub upper: PathBuf,
    /// `<private_dir>/work`: copy-ups are built here and renamed into place, so the upper
    /// never holds a half-made object. Emptied whenever the workspace is served again,
    /// and made at its first use ([`Layers::work_dir`]): a workspace that is never
    /// written costs one directory less to make and to remove.
    pub work: PathBuf,
    work_made: std::sync::atomic::AtomicBool,
    /// Owner of snapshot entries (the runtime root's owner, as in the view).
    pub uid: u32,
    pub gid: u32,
    tmp_seq: AtomicU64,
    /// Contents already placed in the blob cache by this mount, opened without asking the
    /// store's index again.
    ensured: crate::blobfiles::EnsuredBlobs,
}

impl Layers {
    pub fn new(
        store: std::sync::Arc<Store>,
        snapshot: SnapshotId,
        private_dir: &Path,
        uid: u32,
        gid: u32,
    ) -> Layers {
        Layers {
            store,
            snapshot,
            upper: private_dir.join("upper"),
            work: private_dir.join("work"),
            work_made: std::sync::atomic::AtomicBool::new(false),
            uid,
            gid,
            tmp_seq: AtomicU64::new(0),
            ensured: Default::default(),
        }
    }

    /// The blob-cache file of `content` (`size` bytes), opened for reading; placed there
    /// first unless it is there already (a blob file exists only complete: it appears by
    /// rename), so a present one costs no query of the store's index.
    pub fn open_blob(&self, content: &ContentId, size: u64) -> io::Result<File> {
        use crate::blobfiles::OpenBlobError;
        self.ensured
            .open(&self.store, content, Some(size))
            .map_err(|e| match e {
                OpenBlobError::Store(e) => io::Error::other(e),
                OpenBlobError::Io(e) => e,
            })
    }

    /// The work directory, made if this is its first use.
    pub fn work_dir(&self) -> io::Result<&Path> {
        if !self.work_made.load(Ordering::Acquire) {
            fs::create_dir_all(&self.work)?;
            self.work_made.store(true, Ordering::Release);
        }
        Ok(&self.work)
    }

    /// A fresh name in the work directory. (Should the directory fail to be made, making
    /// something at the name fails and says why.)
    pub fn tmp(&self) -> PathBuf {
        let n = self.tmp_seq.fetch_add(1, Ordering::Relaxed);
        let _ = self.work_dir();
        self.work.join(format!("t{}-{n}", std::process::id()))
    }

    /// Makes the upper root (with the snapshot root's mode and the view's times the first
    /// time) and empties the work directory (made again at its first use).
    pub fn prepare(&self, root_mode: u32, root_xattrs: &[(Vec<u8>, Vec<u8>)]) -> io::Result<()> {
        if !self.upper.exists() {
            let tmp = self.upper.with_extension("new");
            let _ = fs::remove_dir(&tmp);
            fs::create_dir_all(&tmp)?;
            fs::set_permissions(&tmp, fs::Permissions::from_mode(root_mode & 0o7777))?;
            for (name, value) in root_xattrs {
                xattr::set(&tmp, std::ffi::OsStr::from_bytes(name), value)?;
            }
            std::os::unix::fs::chown(&tmp, Some(self.uid), Some(self.gid))?;
            set_times(&tmp, VIEW_TIME_SECS)?;
            fs::rename(&tmp, &self.upper)?;
        }
        if self.work.exists() {
            crate::checkout::remove_tree(&self.work);
        }
        Ok(())
    }

    /// Records a deletion of `dir/name` (whose upper entry, if any, is already gone).
    pub fn whiteout(&self, dir: &Path, name: &[u8]) -> io::Result<()> {
        nix::sys::stat::mknodat(
            AT_FDCWD,
            &dir.join(std::ffi::OsStr::from_bytes(name)),
            SFlag::S_IFCHR,
            Mode::empty(),
            0,
        )
        .map_err(io::Error::from)
    }

    /// Replaces the upper entry `target` by a whiteout in one step.
    pub fn replace_by_whiteout(&self, target: &Path, target_is_dir: bool) -> io::Result<()> {
        let tmp = self.tmp();
        nix::sys::stat::mknodat(AT_FDCWD, &tmp, SFlag::S_IFCHR, Mode::empty(), 0)?;
        if target_is_dir {
            nix::fcntl::renameat2(
                AT_FDCWD,
                &tmp,
                AT_FDCWD,
                target,
                RenameFlags::RENAME_EXCHANGE,
            )?;
            // `tmp` is the old (empty) directory now.
            fs::remove_dir(&tmp)
        } else {
            fs::rename(&tmp, target)
        }
    }

    /// Removes the whiteouts in an upper directory whose merged listing is empty.
    pub fn clear_whiteouts(&self, dir: &Path) -> io::Result<()> {
        for e in fs::read_dir(dir)? {
            let e = e?;
            let meta = e.metadata()?;
            if is_whiteout(&meta) {
                fs::remove_file(e.path())?;
            } else {
                return Err(io::Error::from_raw_os_error(libc::ENOTEMPTY));
            }
        }
        Ok(())
    }

    /// Copies up the snapshot directory `src` to `target` (in its parent's upper
    /// directory, which exists) keeping its mode, xattrs, times and inode number.
    pub fn copy_up_dir(&self, target: PathBuf, src: Source<'_>) -> io::Result<PathBuf> {
        let tmp = self.tmp();
        fs::create_dir(&tmp)?;
        self.finish_copy(&tmp, src)?;
        match place_keeping_parent_times(&tmp, &target) {
            Ok(()) => Ok(target),
            Err(e) => {
                let _ = fs::remove_dir(&tmp);
                Err(e)
            }
        }
    }

    /// Copies up the snapshot entry `src` (a file, symlink or special file) to `target`
    /// (in its parent's upper directory, which exists). A file's content is cloned from
    /// its blob-cache file (`FICLONE`), else copied in the kernel (`copy_file_range`) — a
    /// file of at least [`LAZY_COPY_MIN_BYTES`] lazily: it is placed at full size with a
    /// copy-up record and returned as [`Pending`], whose blocks the caller has copied
    /// later (`lazy/`). `empty` skips the content (an open with `O_TRUNC`).
    pub fn copy_up_leaf(
        &self,
        target: PathBuf,
        src: Source<'_>,
        empty: bool,
    ) -> io::Result<(PathBuf, Option<Pending>)> {
        let entry = src.entry;
        let tmp = self.tmp();
        let mut pending = None;
        let made = (|| -> io::Result<()> {
            match entry.kind {
                Kind::File | Kind::Hardlink => {
                    let out = fs::OpenOptions::new()
                        .read(true)
                        .write(true)
                        .create_new(true)
                        .mode(0o600)
                        .open(&tmp)?;
                    if !empty && entry.size > 0 {
                        let content = ContentId::from_bytes(entry.hash);
                        let blob = self.open_blob(&content, entry.size)?;
                        if entry.size < LAZY_COPY_MIN_BYTES
                            || crate::sys::ficlone(&out, &blob).is_ok()
                        {
                            copy_content(&blob, &out, entry.size)?;
                        } else {
                            let again = out.try_clone()?;
                            match Pending::start(out, blob, content, entry.size) {
                                Ok(p) => pending = Some(p),
                                Err(e) => {
                                    // No record possible (no xattrs): the whole copy now.
                                    tracing::debug!(error = %e, "lazy copy-up refused");
                                    let blob = self.open_blob(&content, entry.size)?;
                                    copy_range(&blob, &again, 0, entry.size)?;
                                }
                            }
                        }
                    }
                }
                Kind::Symlink => {
                    std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(&entry.data), &tmp)?
                }
                Kind::Fifo | Kind::CharDevice | Kind::BlockDevice => {
                    let kind = match entry.kind {
                        Kind::Fifo => SFlag::S_IFIFO,
                        Kind::CharDevice => SFlag::S_IFCHR,
                        _ => SFlag::S_IFBLK,
                    };
                    nix::sys::stat::mknodat(
                        AT_FDCWD,
                        &tmp,
                        kind,
                        Mode::from_bits_truncate(0o600),
                        entry.rdev().unwrap_or(0),
                    )?
                }
                Kind::Dir => return Err(io::Error::from_raw_os_error(libc::EISDIR)),
            }
            self.finish_copy(&tmp, src)
        })();
        let placed = made.and_then(|()| place_keeping_parent_times(&tmp, &target));
        if let Err(e) = placed {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        Ok((target, pending))
    }

    /// Owner, mode, xattrs, inode number and times of a copied-up object.
    fn finish_copy(&self, tmp: &Path, src: Source<'_>) -> io::Result<()> {
        let Source { rel, entry, ino } = src;
        std::os::unix::fs::lchown(tmp, Some(self.uid), Some(self.gid))?;
        if entry.kind != Kind::Symlink {
            fs::set_permissions(tmp, fs::Permissions::from_mode(entry.mode & 0o7777))?;
            for (name, value) in &entry.xattrs {
                xattr::set(tmp, std::ffi::OsStr::from_bytes(name), value)?;
            }
        }
        if let Err(e) = xattr::set(tmp, INO_XATTR, &ino.to_le_bytes()) {
            // Without CAP_SYS_ADMIN the number is the upper file's from now on.
            tracing::debug!(error = %e, "cannot keep the inode number of a copied-up entry");
        }
        set_times(tmp, lower_time_secs(rel, entry))
    }
}

/// Renames the finished copy `tmp` to `target` (which must not exist) and gives the
/// directory it lands in back its atime and mtime: a copy-up changes no name the
/// workspace shows, so the directory's times (set explicitly, or the snapshot's) stay.
fn place_keeping_parent_times(tmp: &Path, target: &Path) -> io::Result<()> {
    let parent = target
        .parent()
        .ok_or(io::Error::from_raw_os_error(libc::EINVAL))?;
    let m = fs::metadata(parent)?;
    nix::fcntl::renameat2(
        AT_FDCWD,
        tmp,
        AT_FDCWD,
        target,
        RenameFlags::RENAME_NOREPLACE,
    )?;
    let at = TimeSpec::new(m.atime(), m.atime_nsec());
    let mt = TimeSpec::new(m.mtime(), m.mtime_nsec());
    nix::sys::stat::utimensat(AT_FDCWD, parent, &at, &mt, UtimensatFlags::FollowSymlink)
        .map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_names_are_overlays_and_ours() {
        assert!(reserved_xattr(b"user.overlay.opaque"));
        assert!(reserved_xattr(b"trusted.overlay.origin"));
        assert!(reserved_xattr(INO_XATTR.as_bytes()));
        assert!(!reserved_xattr(b"user.mime_type"));
        assert!(!reserved_xattr(b"security.capability"));
    }

    #[test]
    fn join_paths() {
        assert_eq!(join(b"", b"a"), b"a");
        assert_eq!(join(b"a/b", b"c"), b"a/b/c");
    }

    #[test]
    fn upper_numbers_stay_above_snapshot_numbers() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("f");
        fs::write(&p, "x").unwrap();
        let meta = fs::symlink_metadata(&p).unwrap();
        let ino = upper_ino(&p, &meta);
        if nix::unistd::geteuid().is_root() {
            // A recorded number wins (trusted.* needs CAP_SYS_ADMIN).
            xattr::set(&p, INO_XATTR, &42u64.to_le_bytes()).unwrap();
            assert_eq!(upper_ino(&p, &meta), 42);
        }
        assert!(ino >= UPPER_INO_BASE);
    }
}
