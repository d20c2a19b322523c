//! Copy-up: a snapshot entry given an upper object (its directories first), keeping its
//! inode number, mode, xattrs and times; a file with several names in the snapshot linked
//! at each of them; a directory filled with everything of the snapshot beneath it before
//! a rename; and opens of upper files, which copy up what they would write.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::filesystem::Errno;
use cowspace_store::{Entry, Kind, TreeId};
use nix::fcntl::AT_FDCWD;

use super::fdio::{at, fd_path, open_path};
use super::layers::{Source, is_opaque, is_whiteout, join, lower_ino, upper_ino};
use super::lazy::Pending;
use super::node::{Node, ROOT_INO};
use super::ops::Cow;
use super::resolve::Found;
use crate::filesystem::{errno_of_io, errno_of_nix, lock};

/// A name in an upper directory (held open).
type Placed = (Arc<OwnedFd>, Vec<u8>);

/// A hard link of the snapshot to place once its primary name may have been copied.
struct LinkLater {
    /// Its upper directory, and that directory's held node.
    dir: Arc<OwnedFd>,
    dir_ino: Option<u64>,
    name: Vec<u8>,
    /// Its path in the snapshot, entry and inode number.
    rel: Vec<u8>,
    entry: Entry,
    ino: u64,
}

impl Cow {
    /// Gives node `ino` an upper object (copy-up), its directories first. `empty`: a
    /// file's content is not copied (it is about to be truncated).
    pub fn copy_up(&self, ino: u64, empty: bool) -> Result<Node, Errno> {
        let node = self.table.get(ino)?;
        if node.upper.is_some() {
            return Ok(node);
        }
        let _g = lock(&self.copy);
        self.copy_up_locked(ino, empty)
    }

    /// [`Cow::copy_up`] under the copy-up lock, which the caller holds.
    pub(super) fn copy_up_locked(&self, ino: u64, empty: bool) -> Result<Node, Errno> {
        let _changes = self.names_change();
        let node = self.table.get(ino)?;
        if node.upper.is_some() {
            return Ok(node);
        }
        if node.deleted {
            return Err(Errno::ENOENT);
        }
        let entry = node.lower.as_ref().ok_or(Errno::EIO)?.entry(&node.name);
        let parent = self.copy_up_locked(node.parent, false)?;
        let parent_fd = parent.upper.as_ref().ok_or(Errno::EIO)?;
        let target = at(parent_fd.as_ref(), &node.name);
        // Copied already: a rename copies a whole directory up while lookups go on, so a
        // node can be made from the snapshot just before its copy is placed. (Any other
        // object at a snapshot node's name would have replaced it, and replacing marks
        // the node deleted.)
        if let Ok(m) = fs::symlink_metadata(&target)
            && !is_whiteout(&m)
        {
            let fd = Arc::new(open_path(&target).map_err(errno_of_io)?);
            self.table.update(ino, |n| n.upper = Some(Arc::clone(&fd)));
            return self.table.get(ino);
        }
        let rel = self.table.path_of(&node)?;
        let src = Source {
            rel: &rel,
            entry: &entry,
            ino,
        };
        let path = self.copy_up_entry(target, src, empty).map_err(|e| {
            tracing::warn!(path = %String::from_utf8_lossy(&rel), error = %e, "copy-up failed");
            errno_of_io(e)
        })?;
        let fd = Arc::new(open_path(&path).map_err(errno_of_io)?);
        self.table.update(ino, |n| n.upper = Some(Arc::clone(&fd)));
        self.table.get(ino)
    }

    /// [`Layers::copy_up_dir`] of a directory, else [`Cow::copy_up_leaf`] (`empty`: a
    /// file's content is not copied).
    pub(super) fn copy_up_entry(
        &self,
        target: PathBuf,
        src: Source<'_>,
        empty: bool,
    ) -> io::Result<PathBuf> {
        if src.entry.kind == Kind::Dir {
            self.layers.copy_up_dir(target, src)
        } else {
            self.copy_up_leaf(target, src, empty)
        }
    }

    /// [`Cow::copy_up_entry`] (all of a file's content) of `name` in held directory
    /// `dir_ino`, whose held node then learns the copy ([`Cow::note_copied`]). Called
    /// under the copy-up lock.
    fn copy_up_noted(
        &self,
        dir_ino: Option<u64>,
        name: &[u8],
        target: PathBuf,
        src: Source<'_>,
    ) -> Result<PathBuf, Errno> {
        let placed = self
            .copy_up_entry(target, src, false)
            .map_err(errno_of_io)?;
        self.note_copied(dir_ino, name, src.ino, &placed)?;
        Ok(placed)
    }

    /// [`Layers::copy_up_leaf`], a copy-up still in progress registered before anything
    /// can open the file.
    pub(super) fn copy_up_leaf(
        &self,
        target: PathBuf,
        src: Source<'_>,
        empty: bool,
    ) -> io::Result<PathBuf> {
        let (path, pending) = self.layers.copy_up_leaf(target, src, empty)?;
        if let Some(p) = pending {
            self.lazy.add(Arc::new(p))?;
        }
        self.link_group(src.rel, src.entry, &path)
            .map_err(|e| io::Error::from_raw_os_error(e.code()))?;
        Ok(path)
    }

    /// Places a hard link of the just copied-up file `src` at every other name its
    /// snapshot entry (at `rel`) has, copying up their directories (which keep their
    /// times), so the names stay one file in the upper layer as in the snapshot: the
    /// upper layer is the only truth (commits, restarts). Names deleted or replaced in
    /// the upper layer, or under an opaque directory, are left alone. Called under the
    /// copy-up lock.
    fn link_group(&self, rel: &[u8], entry: &Entry, src: &Path) -> Result<(), Errno> {
        for other in self.link_names(rel, entry.kind, &entry.data)? {
            if other != rel {
                self.place_link(&other, src)?;
            }
        }
        Ok(())
    }

    /// One name of [`Cow::link_group`].
    fn place_link(&self, rel: &[u8], src: &Path) -> Result<(), Errno> {
        let comps: Vec<&[u8]> = rel.split(|&b| b == b'/').collect();
        let Some((name, dirs)) = comps.split_last() else {
            return Ok(());
        };
        let root = self.table.get(ROOT_INO)?;
        let mut fd = root.upper.clone().ok_or(Errno::EIO)?;
        let Some(mut tree) = root
            .lower_tree
            .as_deref()
            .map(|t| self.tree(t))
            .transpose()?
        else {
            return Ok(());
        };
        let mut held = Some(ROOT_INO);
        let mut path = Vec::new();
        for c in dirs {
            let child = join(&path, c);
            let Some(e) = tree
                .entries
                .binary_search_by(|e| e.name.as_slice().cmp(c))
                .ok()
                .map(|i| tree.entries[i].clone())
                .filter(|e| e.kind == Kind::Dir)
            else {
                return Ok(());
            };
            let target = at(fd.as_ref(), c);
            let ino = match fs::symlink_metadata(&target) {
                Ok(m) if m.is_dir() && !is_opaque(&target) => upper_ino(&target, &m),
                Ok(_) => return Ok(()),
                Err(err) if err.kind() == io::ErrorKind::NotFound => {
                    let ino = lower_ino(&self.layers.snapshot, &child, &e);
                    let src = Source {
                        rel: &child,
                        entry: &e,
                        ino,
                    };
                    self.copy_up_noted(held, c, target.clone(), src)?;
                    ino
                }
                Err(err) => return Err(errno_of_io(err)),
            };
            held = held.and_then(|d| {
                self.table
                    .find(ino)
                    .filter(|n| n.parent == d && *n.name == **c)
                    .map(|n| n.ino)
            });
            fd = Arc::new(open_path(&target).map_err(errno_of_io)?);
            tree = self.tree(&e.subtree().ok_or(Errno::EIO)?)?;
            path = child;
        }
        let target = at(fd.as_ref(), name);
        match fs::symlink_metadata(&target) {
            Err(err) if err.kind() == io::ErrorKind::NotFound => {}
            _ => return Ok(()),
        }
        if tree
            .entries
            .binary_search_by(|e| e.name.as_slice().cmp(name))
            .is_err()
        {
            return Ok(());
        }
        // The directory keeps the time it is served with.
        let dir = fd_path(fd.as_ref());
        let dmeta = fs::metadata(&dir).map_err(errno_of_io)?;
        fs::hard_link(src, &target).map_err(errno_of_io)?;
        let times = [
            nix::sys::time::TimeSpec::new(dmeta.atime(), dmeta.atime_nsec()),
            nix::sys::time::TimeSpec::new(dmeta.mtime(), dmeta.mtime_nsec()),
        ];
        nix::sys::stat::utimensat(
            AT_FDCWD,
            &dir,
            &times[0],
            &times[1],
            nix::sys::stat::UtimensatFlags::FollowSymlink,
        )
        .map_err(errno_of_nix)?;
        Ok(())
    }

    /// Before a name of a hard-linked snapshot file is deleted or replaced: the file is
    /// copied up with all its names ([`Cow::link_group`]), so the other names stay (and
    /// count) as one file. `found` is what `name` in `dir` is.
    pub(super) fn copy_up_linked_name(
        &self,
        dir: &Node,
        dir_path: &[u8],
        name: &[u8],
        found: &Found,
    ) -> Result<(), Errno> {
        let Found::Lower(e) = found else {
            return Ok(());
        };
        let rel = join(dir_path, name);
        if self.link_names(&rel, e.kind, &e.data)?.len() < 2 {
            return Ok(());
        }
        let ino = lower_ino(&self.layers.snapshot, &rel, e);
        let _g = lock(&self.copy);
        let up = self.copy_up_locked(dir.ino, false)?;
        let dfd = up.upper.ok_or(Errno::EIO)?;
        let target = at(dfd.as_ref(), name);
        if fs::symlink_metadata(&target).is_ok() {
            return Ok(());
        }
        let path = self
            .copy_up_leaf(
                target,
                Source {
                    rel: &rel,
                    entry: e,
                    ino,
                },
                false,
            )
            .map_err(errno_of_io)?;
        let fd = Arc::new(open_path(&path).map_err(errno_of_io)?);
        self.table.update(ino, |n| {
            if n.upper.is_none() {
                n.upper = Some(fd);
            }
        });
        Ok(())
    }

    /// Copies into the upper directory `dir` (at `rel`; its snapshot directory is `tree`;
    /// `dir_ino` its node when held) every entry of the snapshot still merged there,
    /// recursively, each keeping its inode number, mode, xattrs and times: afterwards
    /// nothing beneath `dir` depends on where it is in the snapshot, so it can be renamed.
    /// Names deleted or replaced in the upper layer stay as they are. Each object is copied
    /// up as a single copy-up is, under the copy-up lock (a crash leaves a merged directory
    /// that shows the same), and a held node learns its copy at once, so a copy-up of it
    /// meanwhile finds it done. A hard link of the snapshot whose primary name is copied
    /// here too becomes a link of that copy. Time and space grow with the tree (files are
    /// reflinked where the filesystem can, large ones copied lazily).
    pub(super) fn fill_from_snapshot(
        &self,
        dir: Arc<OwnedFd>,
        dir_ino: Option<u64>,
        rel: &[u8],
        tree: &TreeId,
    ) -> Result<(), Errno> {
        let mut files = HashMap::new();
        let mut links = Vec::new();
        self.fill_dir(&dir, dir_ino, rel, tree, &mut files, &mut links)?;
        for LinkLater {
            dir,
            dir_ino,
            name,
            rel,
            entry,
            ino,
        } in links
        {
            let _g = lock(&self.copy);
            let target = at(dir.as_ref(), &name);
            if fs::symlink_metadata(&target).is_ok() {
                continue;
            }
            match files.get(entry.data.as_slice()) {
                Some((pdir, pname)) => {
                    fs::hard_link(at(&**pdir, pname), &target).map_err(errno_of_io)?
                }
                // Its primary name is elsewhere: a copy of its own, as `mv` makes.
                None => {
                    self.copy_up_leaf(
                        target.clone(),
                        Source {
                            rel: &rel,
                            entry: &entry,
                            ino,
                        },
                        false,
                    )
                    .map_err(errno_of_io)?;
                }
            }
            self.note_copied(dir_ino, &name, ino, &target)?;
        }
        Ok(())
    }

    /// One directory of [`Cow::fill_from_snapshot`]: copied files are recorded in `files`
    /// (by snapshot path), hard links of the snapshot left in `links` for the end.
    fn fill_dir(
        &self,
        dir: &Arc<OwnedFd>,
        dir_ino: Option<u64>,
        rel: &[u8],
        tree: &TreeId,
        files: &mut HashMap<Vec<u8>, Placed>,
        links: &mut Vec<LinkLater>,
    ) -> Result<(), Errno> {
        let t = self.tree(tree)?;
        for e in &t.entries {
            let child = join(rel, &e.name);
            let target = at(dir.as_ref(), &e.name);
            let ino = lower_ino(&self.layers.snapshot, &child, e);
            let src = Source {
                rel: &child,
                entry: e,
                ino,
            };
            // Looked at and copied under the copy-up lock; a directory is then filled
            // without it.
            let beneath = {
                let _g = lock(&self.copy);
                match fs::symlink_metadata(&target) {
                    Ok(m) if is_whiteout(&m) => None,
                    Ok(m) if m.is_dir() => {
                        // Copied up before (or made over a snapshot file): what the
                        // snapshot has beneath is merged only when it is not opaque.
                        if e.subtree().is_some() && !is_opaque(&target) {
                            let held = upper_ino(&target, &m);
                            Some((target.clone(), held))
                        } else {
                            None
                        }
                    }
                    Ok(_) => None,
                    Err(err) if err.kind() == io::ErrorKind::NotFound => match e.kind {
                        Kind::Dir => {
                            let placed = self.copy_up_noted(dir_ino, &e.name, target, src)?;
                            Some((placed, ino))
                        }
                        Kind::Hardlink => {
                            links.push(LinkLater {
                                dir: Arc::clone(dir),
                                dir_ino,
                                name: e.name.clone(),
                                rel: child.clone(),
                                entry: e.clone(),
                                ino,
                            });
                            None
                        }
                        _ => {
                            self.copy_up_noted(dir_ino, &e.name, target, src)?;
                            if e.kind == Kind::File {
                                files.insert(child.clone(), (Arc::clone(dir), e.name.clone()));
                            }
                            None
                        }
                    },
                    Err(err) => return Err(errno_of_io(err)),
                }
            };
            if let (Some((path, sub_ino)), Some(sub)) = (beneath, e.subtree()) {
                let fd = Arc::new(open_path(&path).map_err(errno_of_io)?);
                let held = dir_ino.and_then(|d| {
                    self.table
                        .find(sub_ino)
                        .filter(|n| n.parent == d && *n.name == *e.name)
                        .map(|n| n.ino)
                });
                self.fill_dir(&fd, held, &child, &sub, files, links)?;
            }
        }
        Ok(())
    }

    /// `name` in held directory `dir_ino` was just copied up to `path` (as number `ino`):
    /// its held node, if any, learns the copy. Called under the copy-up lock.
    fn note_copied(
        &self,
        dir_ino: Option<u64>,
        name: &[u8],
        ino: u64,
        path: &Path,
    ) -> Result<(), Errno> {
        let Some(d) = dir_ino else {
            return Ok(());
        };
        let held = self
            .table
            .find(ino)
            .is_some_and(|n| n.parent == d && *n.name == *name && n.upper.is_none());
        if held {
            let fd = Arc::new(open_path(path).map_err(errno_of_io)?);
            self.table.update(ino, |n| {
                if n.upper.is_none() {
                    n.upper = Some(fd);
                }
            });
        }
        Ok(())
    }

    /// After [`Cow::fill_from_snapshot`] of directory `ino` and its rename: the held nodes
    /// beneath it learn their upper objects and merge no snapshot directory any more.
    pub(super) fn refresh_beneath(&self, ino: u64) -> Result<(), Errno> {
        for d in self.table.beneath(ino) {
            if d.deleted {
                continue;
            }
            let Ok(parent) = self.table.get(d.parent) else {
                continue;
            };
            let Some(pfd) = &parent.upper else {
                continue;
            };
            let path = at(pfd.as_ref(), &d.name);
            match fs::symlink_metadata(&path) {
                Ok(m) if !is_whiteout(&m) => {
                    let fd = Arc::new(open_path(&path).map_err(errno_of_io)?);
                    self.table.update(d.ino, |n| {
                        if n.upper.is_none() {
                            n.upper = Some(fd);
                        }
                        n.lower_tree = None;
                    });
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// An upper file of `node` opened with `flags` (copying it up first when it would be
    /// written), and its copy-up when that is still in progress (then every read and
    /// write of the open goes through it).
    pub fn open_upper(
        &self,
        node: &Node,
        mut flags: i32,
    ) -> Result<(Node, File, Option<Arc<Pending>>), Errno> {
        let write = flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
        let node = if node.upper.is_none() && write {
            let _r = self.ns_read();
            self.copy_up(node.ino, flags & libc::O_TRUNC != 0)?
        } else {
            node.clone()
        };
        let fd = node.upper.as_ref().ok_or(Errno::EIO)?;
        let pending = self.lazy.get(fd.as_ref());
        if let Some(p) = &pending
            && flags & libc::O_TRUNC != 0
        {
            p.truncate(0).map_err(errno_of_io)?;
            flags &= !libc::O_TRUNC;
        }
        let keep = libc::O_ACCMODE
            | libc::O_APPEND
            | libc::O_TRUNC
            | libc::O_SYNC
            | libc::O_DSYNC
            | libc::O_DIRECT
            | libc::O_NOATIME;
        let f = fs::OpenOptions::new()
            .read(flags & libc::O_ACCMODE != libc::O_WRONLY)
            .write(flags & libc::O_ACCMODE != libc::O_RDONLY)
            .custom_flags((flags & keep & !libc::O_ACCMODE) | libc::O_CLOEXEC)
            .open(fd_path(fd.as_ref()))
            .map_err(errno_of_io)?;
        Ok((node, f, pending))
    }
}
