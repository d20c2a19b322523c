//! Renames in a workspace: a name moved (a directory with snapshot content beneath is
//! first copied up with all of it, since the upper format has no redirects) or two names
//! exchanged.

use std::fs;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use crate::filesystem::{Errno, FileKind, RenameFlags};
use cowspace_store::{Entry, Kind, TreeId};
use nix::fcntl::{AT_FDCWD, RenameFlags as HostRename};

use super::fdio::{at, open_path};
use super::layers::{OPAQUE_XATTR, Source, is_whiteout, join};
use super::node::Node;
use super::ops::Cow;
use super::resolve::Found;
use crate::filesystem::{NAME_MAX_BYTES, errno_of_io, errno_of_nix, lock};

/// A name a rename moves, as it is now.
struct Side {
    /// The number it is served with.
    ino: u64,
    is_dir: bool,
    /// Its snapshot entry, while it has no upper object.
    lower: Option<Entry>,
    /// A directory's snapshot directory merged beneath it: copied up whole before it
    /// moves.
    tree: Option<Arc<TreeId>>,
    /// Its path from the workspace root.
    rel: Vec<u8>,
}

impl Cow {
    /// `rename(parent/name, newparent/newname)`. A directory that has snapshot content
    /// beneath is first copied up with all of it ([`Cow::fill_from_snapshot`], under the
    /// namespace's read lock: [`Cow::fill_for_rename`]), then renamed under the write lock
    /// as a directory made in the workspace is (overlayfs without redirects refuses with
    /// `EXDEV`, and `git mv` then fails); `RENAME_EXCHANGE` swaps the two names
    /// ([`Cow::exchange`]); `RENAME_WHITEOUT` is refused with `EINVAL`.
    pub fn rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        if flags.bits() == libc::RENAME_EXCHANGE {
            return self.exchange(parent, name, newparent, newname);
        }
        let noreplace = flags.bits() & libc::RENAME_NOREPLACE != 0;
        if flags.bits() & !libc::RENAME_NOREPLACE != 0 {
            return Err(Errno::EINVAL);
        }
        if newname.len() > NAME_MAX_BYTES as usize {
            return Err(Errno::from_i32(libc::ENAMETOOLONG));
        }
        let filled = self.fill_for_rename(parent, name, newparent, newname)?;
        let _w = self.ns_write();
        let _changes = self.names_change();
        let dir = self.table.get(parent)?;
        let dir_path = self.table.path_of(&dir)?;
        let src = self.side(&dir, &dir_path, name)?.ok_or(Errno::ENOENT)?;
        let ndir = self.table.get(newparent)?;
        let ndir_path = self.table.path_of(&ndir)?;
        let dst = self.resolve(&ndir, newname)?;
        let dst_ino = self.ino_of(&ndir_path, newname, &dst);
        if dst_ino == Some(src.ino) {
            // Two names of one file (or the same name): nothing to do.
            return Ok(());
        }
        match &dst {
            Found::Upper { .. } | Found::Lower(_) => {
                if noreplace {
                    return Err(Errno::EEXIST);
                }
                let dst_is_dir = match &dst {
                    Found::Upper { meta, .. } => meta.is_dir(),
                    Found::Lower(e) => e.kind == Kind::Dir,
                    _ => false,
                };
                match (src.is_dir, dst_is_dir) {
                    (true, false) => return Err(Errno::ENOTDIR),
                    (false, true) => return Err(Errno::EISDIR),
                    (true, true) => self.empty_dir(&ndir, &ndir_path, newname, dst)?,
                    (false, false) => self.copy_up_linked_name(&ndir, &ndir_path, newname, &dst)?,
                }
            }
            Found::Whiteout if src.is_dir => {
                // A whiteout is only found in a directory with an upper object.
                let nfd = ndir.upper.as_ref().ok_or(Errno::EIO)?;
                fs::remove_file(at(nfd.as_ref(), newname)).map_err(errno_of_io)?;
            }
            _ => {}
        }
        // The source in the upper layer, and both directories.
        let (dir_up, ndir_up) =
            self.copy_up_sides(parent, newparent, [Some((name, &src)), None])?;
        if let Some(tree) = &src.tree
            && filled != Some(src.ino)
        {
            // Not copied by `fill_for_rename` (not held then, or another directory has
            // its name now). Once copied, a directory stays whole: the snapshot does not
            // change, and what comes beneath it since is in the upper layer. Nothing else
            // copies now (copy-ups need the namespace too).
            let fd = open_path(&at(dir_up.as_ref(), name)).map_err(errno_of_io)?;
            self.fill_from_snapshot(Arc::new(fd), None, &src.rel, tree)?;
        }
        let from = at(dir_up.as_ref(), name);
        let to = at(ndir_up.as_ref(), newname);
        let mut host = HostRename::empty();
        if self.lower_child(&dir, name)?.is_some() {
            host |= HostRename::RENAME_WHITEOUT;
        }
        if noreplace {
            host |= HostRename::RENAME_NOREPLACE;
        }
        nix::fcntl::renameat2(AT_FDCWD, &from, AT_FDCWD, &to, host).map_err(errno_of_nix)?;
        if src.is_dir && self.lower_child(&ndir, newname)?.is_some() {
            xattr::set(&to, OPAQUE_XATTR, b"y").map_err(errno_of_io)?;
        }
        self.moved(src.ino, newparent, newname);
        self.settle(&src)?;
        if let Some(d) = dst_ino {
            self.name_gone(d);
        }
        Ok(())
    }

    /// `renameat2(RENAME_EXCHANGE)`: `parent/name` and `newparent/newname` (both must
    /// exist) swap places. Each side is first made independent of where it is in the
    /// snapshot: a snapshot entry is copied up (a file with all its names:
    /// [`Cow::link_group`]), a directory with snapshot content beneath is copied up with
    /// all of it ([`Cow::fill_from_snapshot`]). The two upper objects are then exchanged
    /// on the host, and a directory that lands where the snapshot has an entry is made
    /// opaque, so the upper layer reads (in the workspace, in diff and commit) as exactly
    /// the swapped pair. No whiteout is needed: both names stay. All under the
    /// namespace's write lock (exchanges are rare; a rename fills beforehand instead).
    fn exchange(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
    ) -> Result<(), Errno> {
        if newname.len() > NAME_MAX_BYTES as usize {
            return Err(Errno::from_i32(libc::ENAMETOOLONG));
        }
        let _w = self.ns_write();
        let _changes = self.names_change();
        let side = |dir_ino: u64, name: &[u8]| -> Result<Side, Errno> {
            let dir = self.table.get(dir_ino)?;
            let dir_path = self.table.path_of(&dir)?;
            self.side(&dir, &dir_path, name)?.ok_or(Errno::ENOENT)
        };
        let a = side(parent, name)?;
        let b = side(newparent, newname)?;
        if a.ino == b.ino {
            // The same file (two names of it, or one name twice): nothing changes.
            return Ok(());
        }
        let (dir_up, ndir_up) =
            self.copy_up_sides(parent, newparent, [Some((name, &a)), Some((newname, &b))])?;
        for (up, nm, s) in [(&dir_up, name, &a), (&ndir_up, newname, &b)] {
            if let Some(tree) = &s.tree {
                let fd = open_path(&at(up.as_ref(), nm)).map_err(errno_of_io)?;
                let held = self.table.find(s.ino).map(|n| n.ino);
                self.fill_from_snapshot(Arc::new(fd), held, &s.rel, tree)?;
            }
        }
        let from = at(dir_up.as_ref(), name);
        let to = at(ndir_up.as_ref(), newname);
        nix::fcntl::renameat2(AT_FDCWD, &from, AT_FDCWD, &to, HostRename::RENAME_EXCHANGE)
            .map_err(errno_of_nix)?;
        let dir = self.table.get(parent)?;
        let ndir = self.table.get(newparent)?;
        if a.is_dir && self.lower_child(&ndir, newname)?.is_some() {
            xattr::set(&to, OPAQUE_XATTR, b"y").map_err(errno_of_io)?;
        }
        if b.is_dir && self.lower_child(&dir, name)?.is_some() {
            xattr::set(&from, OPAQUE_XATTR, b"y").map_err(errno_of_io)?;
        }
        self.moved(a.ino, newparent, newname);
        self.moved(b.ino, parent, name);
        for s in [&a, &b] {
            self.settle(s)?;
        }
        Ok(())
    }

    /// Before a rename, under the namespace's read lock (reads, writes and creates go on
    /// meanwhile): when `name` in `parent` is a held directory with snapshot content
    /// beneath, copies it up with all of it ([`Cow::fill_from_snapshot`]). The rename,
    /// under the write lock, then finds nothing left to copy. Gives the directory's number
    /// when it did. Nothing is copied for a rename bound to fail on its target (a file, or
    /// a directory that is not empty).
    fn fill_for_rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
    ) -> Result<Option<u64>, Errno> {
        let _r = self.ns_read();
        let ndir = self.table.get(newparent)?;
        let ndir_path = self.table.path_of(&ndir)?;
        let dst = self.resolve(&ndir, newname)?;
        let refused = match &dst {
            Found::Upper { meta, .. } if !meta.is_dir() => true,
            Found::Lower(e) if e.kind != Kind::Dir => true,
            Found::Upper { .. } | Found::Lower(_) => self
                .node_of(&ndir, &ndir_path, newname, dst)?
                .map(|n| self.list_at(&n))
                .transpose()?
                .is_some_and(|names| !names.is_empty()),
            Found::Whiteout | Found::Absent => false,
        };
        if refused {
            return Ok(None);
        }
        let _changes = self.names_change();
        let dir = self.table.get(parent)?;
        let dir_path = self.table.path_of(&dir)?;
        let Some(Side {
            ino,
            tree: Some(tree),
            rel,
            ..
        }) = self.side(&dir, &dir_path, name)?
        else {
            return Ok(None);
        };
        if self.table.find(ino).is_none() {
            // Not held (the kernel holds what it renames): the rename itself copies.
            return Ok(None);
        }
        let up = self.copy_up(ino, false)?;
        let fd = up.upper.ok_or(Errno::EIO)?;
        self.fill_from_snapshot(fd, Some(ino), &rel, &tree)?;
        Ok(Some(ino))
    }

    /// What `name` in directory `dir` (at `dir_path`) is, as a side of a rename (`None`:
    /// no such name).
    fn side(&self, dir: &Node, dir_path: &[u8], name: &[u8]) -> Result<Option<Side>, Errno> {
        let found = self.resolve(dir, name)?;
        let Some(ino) = self.ino_of(dir_path, name, &found) else {
            return Ok(None);
        };
        let lower = match &found {
            Found::Lower(e) => Some(e.clone()),
            _ => None,
        };
        let Some(node) = self.node_of(dir, dir_path, name, found)? else {
            return Ok(None);
        };
        let is_dir = node.kind == FileKind::Directory;
        Ok(Some(Side {
            ino,
            is_dir,
            lower,
            tree: node.lower_tree.filter(|_| is_dir),
            rel: join(dir_path, name),
        }))
    }

    /// Under the copy-up lock: both directories copied up, then each side (one at a name
    /// in `parent`, one in `newparent`; either may be left out) still a snapshot entry
    /// copied up in its directory, its held node learning the copy. Gives the upper
    /// directories of `parent` and `newparent`.
    fn copy_up_sides(
        &self,
        parent: u64,
        newparent: u64,
        sides: [Option<(&[u8], &Side)>; 2],
    ) -> Result<(Arc<OwnedFd>, Arc<OwnedFd>), Errno> {
        let _g = lock(&self.copy);
        let dir = self.copy_up_locked(parent, false)?;
        let ndir = self.copy_up_locked(newparent, false)?;
        let dir_up = dir.upper.ok_or(Errno::EIO)?;
        let ndir_up = ndir.upper.ok_or(Errno::EIO)?;
        for (up, side) in [(&dir_up, sides[0]), (&ndir_up, sides[1])] {
            let Some((
                name,
                Side {
                    ino,
                    lower: Some(entry),
                    rel,
                    ..
                },
            )) = side
            else {
                continue;
            };
            let target = at(up.as_ref(), name);
            let src = Source {
                rel,
                entry,
                ino: *ino,
            };
            // Else placed meanwhile as a name of a linked file copied up just now.
            if !fs::symlink_metadata(&target).is_ok_and(|m| !is_whiteout(&m)) {
                self.copy_up_entry(target.clone(), src, false)
                    .map_err(errno_of_io)?;
            }
            let fd = Arc::new(open_path(&target).map_err(errno_of_io)?);
            self.table.update(*ino, |n| {
                if n.upper.is_none() {
                    n.upper = Some(fd);
                }
            });
        }
        Ok((dir_up, ndir_up))
    }

    /// Held node `ino` is `name` in `parent` now.
    fn moved(&self, ino: u64, parent: u64, name: &[u8]) {
        self.table.update(ino, |n| {
            n.parent = parent;
            n.name = name.into();
        });
    }

    /// After a side that was a directory with snapshot content beneath moved (copied up
    /// whole before): it merges no snapshot directory any more, and the held nodes beneath
    /// learn their upper objects.
    fn settle(&self, side: &Side) -> Result<(), Errno> {
        if side.tree.is_some() {
            self.table.update(side.ino, |n| n.lower_tree = None);
            self.refresh_beneath(side.ino)?;
        }
        Ok(())
    }
}
