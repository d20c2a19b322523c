//! Names made and removed in a workspace, in overlay's upper format: files, directories,
//! symlinks, special files and hard links made (over a whiteout, a directory made
//! opaque), `unlink` and `rmdir` (a snapshot name becomes a whiteout).

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::sync::Arc;

use crate::filesystem::{Errno, FileKind};
use cowspace_store::Kind;
use nix::fcntl::{AT_FDCWD, AtFlags, RenameFlags as HostRename};
use nix::sys::stat::{Mode, SFlag};

use super::fdio::{at, fd_path, open_path};
use super::layers::{OPAQUE_XATTR, upper_ino};
use super::node::Node;
use super::ops::Cow;
use super::resolve::Found;
use crate::filesystem::{NAME_MAX_BYTES, errno_of_io, host_file_type, mode_file_type};

/// What a new name is made as.
pub enum Make<'a> {
    File { mode: u32 },
    Dir { mode: u32 },
    Symlink { target: &'a [u8] },
    Special { mode: u32, rdev: u64 },
    Link { source: Node },
}

impl Cow {
    /// Makes `name` in `parent` as `what`, owned by `uid`/`gid` (the caller), and takes a
    /// lookup on it.
    pub fn make(
        &self,
        parent: u64,
        name: &[u8],
        what: Make<'_>,
        uid: u32,
        gid: u32,
    ) -> Result<Node, Errno> {
        if name.len() > NAME_MAX_BYTES as usize {
            return Err(Errno::from_i32(libc::ENAMETOOLONG));
        }
        let _r = self.ns_read();
        let _changes = self.names_change();
        let dir = self.copy_up(parent, false)?;
        let dir_fd = dir.upper.as_ref().ok_or(Errno::EIO)?;
        let target = at(dir_fd.as_ref(), name);
        let over_whiteout = match self.resolve(&dir, name)? {
            Found::Whiteout => true,
            Found::Absent => false,
            Found::Upper { .. } | Found::Lower(_) => return Err(Errno::EEXIST),
        };
        let dmeta = fs::metadata(fd_path(dir_fd.as_ref())).map_err(errno_of_io)?;
        let setgid_dir = dmeta.mode() & libc::S_ISGID != 0;
        let gid = if setgid_dir { dmeta.gid() } else { gid };
        let place = if over_whiteout {
            self.layers.tmp()
        } else {
            target.clone()
        };
        let made = (|| -> io::Result<()> {
            let mode = match &what {
                Make::File { mode } => {
                    fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(0o600)
                        .custom_flags(libc::O_NOFOLLOW)
                        .open(&place)?;
                    Some(*mode)
                }
                Make::Dir { mode } => {
                    fs::create_dir(&place)?;
                    let m = *mode | if setgid_dir { libc::S_ISGID } else { 0 };
                    if over_whiteout {
                        xattr::set(&place, OPAQUE_XATTR, b"y")?;
                    }
                    Some(m)
                }
                Make::Symlink { target } => {
                    std::os::unix::fs::symlink(OsStr::from_bytes(target), &place)?;
                    None
                }
                Make::Special { mode, rdev } => {
                    let kind = SFlag::from_bits_truncate(*mode & libc::S_IFMT);
                    nix::sys::stat::mknodat(
                        AT_FDCWD,
                        &place,
                        kind,
                        Mode::from_bits_truncate(0o600),
                        *rdev,
                    )?;
                    Some(*mode)
                }
                Make::Link { source } => {
                    let fd = source.upper.as_ref().ok_or(io::Error::other("no upper"))?;
                    nix::unistd::linkat(
                        AT_FDCWD,
                        &fd_path(fd.as_ref()),
                        AT_FDCWD,
                        &place,
                        AtFlags::AT_SYMLINK_FOLLOW,
                    )?;
                    return Ok(());
                }
            };
            std::os::unix::fs::lchown(&place, Some(uid), Some(gid))?;
            if let Some(m) = mode {
                fs::set_permissions(&place, fs::Permissions::from_mode(m & 0o7777))?;
            }
            Ok(())
        })();
        let placed = made.and_then(|()| {
            if !over_whiteout {
                return Ok(());
            }
            if matches!(what, Make::Dir { .. }) {
                // Swap the whiteout and the new directory in one step, then drop the
                // whiteout (now at the temporary name).
                nix::fcntl::renameat2(
                    AT_FDCWD,
                    &place,
                    AT_FDCWD,
                    &target,
                    HostRename::RENAME_EXCHANGE,
                )?;
                fs::remove_file(&place)
            } else {
                fs::rename(&place, &target)
            }
        });
        if let Err(e) = placed {
            if place != target || !matches!(e.kind(), io::ErrorKind::AlreadyExists) {
                let _ = fs::remove_file(&place).or_else(|_| fs::remove_dir(&place));
            }
            return Err(errno_of_io(e));
        }
        let meta = fs::symlink_metadata(&target).map_err(errno_of_io)?;
        let node = Node {
            ino: upper_ino(&target, &meta),
            kind: host_file_type(meta.file_type()),
            parent,
            name: name.into(),
            lower: None,
            lower_tree: None,
            upper: Some(Arc::new(open_path(&target).map_err(errno_of_io)?)),
            deleted: false,
            lower_secs: 0,
        };
        Ok(self.table.acquire(node))
    }

    /// Whether the merged directory at `name` in `dir` (found as `found`) is empty; an
    /// upper directory then loses its whiteouts.
    pub(super) fn empty_dir(
        &self,
        dir: &Node,
        dir_path: &[u8],
        name: &[u8],
        found: Found,
    ) -> Result<(), Errno> {
        let upper = match &found {
            Found::Upper { path, .. } => Some(path.clone()),
            _ => None,
        };
        let node = self
            .node_of(dir, dir_path, name, found)?
            .ok_or(Errno::ENOENT)?;
        if !self.list_at(&node)?.is_empty() {
            return Err(Errno::ENOTEMPTY);
        }
        if let Some(p) = upper {
            self.layers.clear_whiteouts(&p).map_err(errno_of_io)?;
        }
        Ok(())
    }

    /// `unlink` (`want_dir` false) or `rmdir` (`want_dir` true) of `name` in `parent`.
    pub fn remove(&self, parent: u64, name: &[u8], want_dir: bool) -> Result<(), Errno> {
        let _w = self.ns_write();
        let _changes = self.names_change();
        let dir = self.table.get(parent)?;
        let dir_path = self.table.path_of(&dir)?;
        let found = self.resolve(&dir, name)?;
        let is_dir = match &found {
            Found::Upper { meta, .. } => meta.is_dir(),
            Found::Lower(e) => e.kind == Kind::Dir,
            Found::Whiteout | Found::Absent => return Err(Errno::ENOENT),
        };
        match (want_dir, is_dir) {
            (true, false) => return Err(Errno::ENOTDIR),
            (false, true) => return Err(Errno::EISDIR),
            _ => {}
        }
        let (dir, found) = if is_dir {
            (dir, found)
        } else {
            // The directory may have been copied up with the name: asked again.
            self.copy_up_linked_name(&dir, &dir_path, name, &found)?;
            let dir = self.table.get(parent)?;
            let found = self.resolve(&dir, name)?;
            (dir, found)
        };
        let ino = self.ino_of(&dir_path, name, &found);
        let lower_has = self.lower_child(&dir, name)?.is_some();
        let upper = match &found {
            Found::Upper { path, .. } => Some(path.clone()),
            _ => None,
        };
        if is_dir {
            let again = self.resolve(&dir, name)?;
            self.empty_dir(&dir, &dir_path, name, again)?;
        }
        match upper {
            Some(path) if lower_has => self
                .layers
                .replace_by_whiteout(&path, is_dir)
                .map_err(errno_of_io)?,
            Some(path) if is_dir => fs::remove_dir(&path).map_err(errno_of_io)?,
            Some(path) => fs::remove_file(&path).map_err(errno_of_io)?,
            None => {
                let dir = self.copy_up(parent, false)?;
                let dir_fd = dir.upper.as_ref().ok_or(Errno::EIO)?;
                self.layers
                    .whiteout(&fd_path(dir_fd.as_ref()), name)
                    .map_err(errno_of_io)?;
            }
        }
        if let Some(ino) = ino {
            self.name_gone(ino);
        }
        Ok(())
    }

    /// The name of held node `ino` was removed or replaced: a node only in the snapshot
    /// may no longer be copied up.
    pub(super) fn name_gone(&self, ino: u64) {
        self.table.update(ino, |n| {
            if n.upper.is_none() {
                n.deleted = true;
            }
        });
    }

    /// The kind a `mknod` mode asks for.
    pub fn special_kind(mode: u32) -> Result<FileKind, Errno> {
        match mode_file_type(mode) {
            Some(FileKind::Directory | FileKind::Symlink) | None => Err(Errno::EINVAL),
            Some(kind) => Ok(kind),
        }
    }
}
