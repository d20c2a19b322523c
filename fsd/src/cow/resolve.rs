//! Names and attributes of a workspace: what a name in a directory is (an upper entry,
//! a whiteout, a snapshot entry, nothing), the node it is served as, lookups, and the
//! attributes of upper objects and of snapshot entries (with the link counts of the
//! snapshot's hard-link groups).

use std::fs;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use crate::filesystem::{Attr, Errno, FileKind};
use cowspace_store::{Entry, Kind, Tree, TreeId};

use super::fdio::{at, fd_path, open_path};
use super::layers::{is_opaque, is_whiteout, join, lower_ino, lower_time_secs, upper_ino};
use super::node::{Lower, Node};
use super::ops::{Cow, Groups};
use crate::filesystem::{
    attr_of_stat, errno_of_io, errno_of_nix, errno_of_store, host_file_type, kind_file_type,
};
use crate::view::VIEW_BLKSIZE_BYTES;

/// What a name in a directory is.
pub enum Found {
    Upper { path: PathBuf, meta: fs::Metadata },
    Lower(Entry),
    Whiteout,
    Absent,
}

/// Lookups in one directory ([`Cow::lookups_in`]).
pub struct LookupsIn<'a> {
    cow: &'a Cow,
    dir: &'a Node,
    dir_path: Vec<u8>,
    tree: Option<Arc<Tree>>,
    _ns: std::sync::RwLockReadGuard<'a, ()>,
}

impl LookupsIn<'_> {
    /// `name` in the directory, taking one lookup on the result.
    pub fn lookup(&self, name: &[u8]) -> Result<Option<Node>, Errno> {
        let found = self.cow.resolve_in(self.dir, self.tree.as_deref(), name)?;
        Ok(self
            .cow
            .node_of(self.dir, &self.dir_path, name, found)?
            .map(|n| self.cow.table.acquire(n)))
    }
}

impl Cow {
    /// The snapshot's hard-link groups ([`Groups`]).
    pub(super) fn groups(&self) -> Result<Arc<Groups>, Errno> {
        if let Some(g) = self.groups.get() {
            return Ok(Arc::clone(g));
        }
        let store = &self.layers.store;
        let snap = store
            .snapshot(&self.layers.snapshot)
            .map_err(|e| errno_of_store("read snapshot", &e))?;
        let mut groups = Groups::new();
        if snap.counts.hardlinks > 0 {
            let mut stack = vec![(snap.root, Vec::new())];
            while let Some((id, path)) = stack.pop() {
                for e in &self.tree(&id)?.entries {
                    let p = join(&path, &e.name);
                    match e.kind {
                        Kind::Dir => stack.push((TreeId::from_bytes(e.hash), p)),
                        Kind::Hardlink => groups
                            .entry(e.data.clone())
                            .or_insert_with(|| vec![e.data.clone()])
                            .push(p),
                        // The names of a symlink with several, gathered by its group key
                        // (after a NUL byte, which no path holds).
                        Kind::Symlink => {
                            if let Some(g) = e.link_group() {
                                groups.entry([&[0u8][..], &g].concat()).or_default().push(p);
                            }
                        }
                        _ => {}
                    }
                }
            }
            // Every name finds its group (a node made from the primary's entry may have
            // been reached by another name since).
            let mut all = Groups::new();
            for (_, mut names) in groups {
                names.sort();
                for n in &names {
                    all.insert(n.clone(), names.clone());
                }
            }
            groups = all;
        }
        Ok(Arc::clone(self.groups.get_or_init(|| Arc::new(groups))))
    }

    /// Every name in the snapshot of the file at `rel` (a `file` or `hardlink` entry of
    /// kind `kind`, whose data is `data`, or a symlink), when it has more than one.
    pub(super) fn link_names(
        &self,
        rel: &[u8],
        kind: Kind,
        data: &[u8],
    ) -> Result<Vec<Vec<u8>>, Errno> {
        let primary = match kind {
            Kind::File | Kind::Symlink => rel,
            Kind::Hardlink => data,
            _ => return Ok(Vec::new()),
        };
        Ok(self.groups()?.get(primary).cloned().unwrap_or_default())
    }

    /// The number of names a snapshot file (entry of `kind` with `data`) has, for a node
    /// that has no upper object yet. Every change to a name of a linked file copies the
    /// whole group up first, so the snapshot's count is the true one.
    fn lower_nlink(&self, node: &Node, lower: &Lower) -> Result<u32, Errno> {
        let names = match lower.kind {
            Kind::Hardlink => self.link_names(&[], lower.kind, lower.data())?,
            Kind::File | Kind::Symlink if self.groups()?.is_empty() => return Ok(1),
            Kind::Symlink if lower.link_group().is_none() => return Ok(1),
            Kind::File | Kind::Symlink => {
                let rel = self.table.path_of(node)?;
                self.link_names(&rel, lower.kind, &[])?
            }
            _ => return Ok(1),
        };
        Ok(names.len().max(1) as u32)
    }

    /// The snapshot entry `name` merged beneath directory `dir`.
    pub fn lower_child(&self, dir: &Node, name: &[u8]) -> Result<Option<Entry>, Errno> {
        let Some(id) = &dir.lower_tree else {
            return Ok(None);
        };
        let t = self.tree(id)?;
        Ok(t.entries
            .binary_search_by(|e| e.name.as_slice().cmp(name))
            .ok()
            .map(|i| t.entries[i].clone()))
    }

    /// What `name` is in directory `dir`. An upper entry's path goes through the
    /// directory's descriptor (valid while `dir` is held).
    pub fn resolve(&self, dir: &Node, name: &[u8]) -> Result<Found, Errno> {
        let tree = match &dir.lower_tree {
            Some(id) if dir.kind == FileKind::Directory => Some(self.tree(id)?),
            _ => None,
        };
        self.resolve_in(dir, tree.as_deref(), name)
    }

    /// [`Cow::resolve`] with the directory's snapshot tree (`dir.lower_tree`) at hand.
    pub(super) fn resolve_in(
        &self,
        dir: &Node,
        tree: Option<&Tree>,
        name: &[u8],
    ) -> Result<Found, Errno> {
        if dir.kind != FileKind::Directory {
            return Err(Errno::ENOTDIR);
        }
        if let Some(dfd) = &dir.upper {
            let up = at(dfd.as_ref(), name);
            match fs::symlink_metadata(&up) {
                Ok(m) if is_whiteout(&m) => return Ok(Found::Whiteout),
                Ok(meta) => return Ok(Found::Upper { path: up, meta }),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {}
                Err(e) => return Err(errno_of_io(e)),
            }
        }
        let lower = tree.and_then(|t| {
            t.entries
                .binary_search_by(|e| e.name.as_slice().cmp(name))
                .ok()
                .map(|i| t.entries[i].clone())
        });
        Ok(match lower {
            Some(e) => Found::Lower(e),
            None => Found::Absent,
        })
    }

    /// The node `found` at `name` in `dir` would be (not yet held).
    pub fn node_of(
        &self,
        dir: &Node,
        dir_path: &[u8],
        name: &[u8],
        found: Found,
    ) -> Result<Option<Node>, Errno> {
        let rel = join(dir_path, name);
        Ok(Some(match found {
            Found::Whiteout | Found::Absent => return Ok(None),
            Found::Upper { path, meta } => {
                let kind = host_file_type(meta.file_type());
                let lower_tree = if kind == FileKind::Directory && !is_opaque(&path) {
                    self.lower_child(dir, name)?
                        .filter(|e| e.kind == Kind::Dir)
                        .and_then(|e| e.subtree())
                        .map(Arc::new)
                } else {
                    None
                };
                Node {
                    ino: upper_ino(&path, &meta),
                    kind,
                    parent: dir.ino,
                    name: name.into(),
                    lower: None,
                    lower_tree,
                    upper: Some(Arc::new(open_path(&path).map_err(errno_of_io)?)),
                    deleted: false,
                    lower_secs: 0,
                }
            }
            Found::Lower(e) => Node {
                ino: lower_ino(&self.layers.snapshot, &rel, &e),
                kind: kind_file_type(e.kind),
                parent: dir.ino,
                name: name.into(),
                lower_tree: e.subtree().filter(|_| e.kind == Kind::Dir).map(Arc::new),
                lower_secs: lower_time_secs(&rel, &e),
                lower: Some(Lower::of(e)),
                upper: None,
                deleted: false,
            },
        }))
    }

    /// Resolves names of one held directory, each as [`Cow::lookup`] does, with the
    /// directory's path and snapshot tree found once (`readdirplus`). Holds the namespace
    /// lock while it lives.
    pub fn lookups_in<'a>(&'a self, dir: &'a Node) -> Result<LookupsIn<'a>, Errno> {
        let guard = self.ns_read();
        let dir_path = self.table.path_of(dir)?;
        let tree = match &dir.lower_tree {
            Some(id) if dir.kind == FileKind::Directory => Some(self.tree(id)?),
            _ => None,
        };
        Ok(LookupsIn {
            cow: self,
            dir,
            dir_path,
            tree,
            _ns: guard,
        })
    }

    /// Resolves `name` in `parent`, taking one lookup on the result.
    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Option<Node>, Errno> {
        let _r = self.ns_read();
        let dir = self.table.get(parent)?;
        let dir_path = self.table.path_of(&dir)?;
        let found = self.resolve(&dir, name)?;
        Ok(self
            .node_of(&dir, &dir_path, name, found)?
            .map(|n| self.table.acquire(n)))
    }

    /// The attributes of a node.
    pub fn attr(&self, node: &Node) -> Result<Attr, Errno> {
        if let Some(fd) = &node.upper {
            let st = nix::sys::stat::fstat(fd.as_fd()).map_err(errno_of_nix)?;
            let mut attr = attr_of_stat(node.ino, &st);
            if let Some(tree) = node.lower_tree.as_deref()
                && node.kind == FileKind::Directory
            {
                attr.nlink = self.merged_dir_links(fd, tree, attr.nlink)?;
            }
            return Ok(attr);
        }
        let e = node.lower.as_ref().ok_or(Errno::EIO)?;
        let t = UNIX_EPOCH + Duration::from_secs(node.lower_secs);
        let dir = e.kind == Kind::Dir;
        Ok(Attr {
            ino: node.ino,
            size: if dir { 0 } else { e.size },
            blocks: e.size.div_ceil(512),
            atime: t,
            mtime: t,
            ctime: t,
            kind: kind_file_type(e.kind),
            perm: if e.kind == Kind::Symlink {
                0o777
            } else {
                (e.mode & 0o7777) as u16
            },
            nlink: if dir {
                // 2 + subdirectories, as a directory of a disk filesystem counts.
                let t = self.tree(&TreeId::from_bytes(e.hash))?;
                2 + t.entries.iter().filter(|c| c.kind == Kind::Dir).count() as u32
            } else {
                self.lower_nlink(node, e)?
            },
            uid: self.layers.uid,
            gid: self.layers.gid,
            rdev: e.rdev().unwrap_or(0) as u32,
            blksize: VIEW_BLKSIZE_BYTES,
        })
    }

    /// The link count of a directory merged over snapshot directory `tree`, whose upper
    /// directory (held as `fd`) counts `upper`: 2 + its subdirectories, as a directory of
    /// a disk filesystem counts (`find` without `-noleaf` skips the `stat` of every
    /// entry of a directory whose count says it has no subdirectory left): the upper
    /// directory's own, and the snapshot's that no upper name or whiteout hides. The
    /// upper listing is read only when the snapshot directory has subdirectories. An
    /// upper count below 2 (the filesystem does not count, as ext4 past 65,000
    /// subdirectories) is passed on.
    fn merged_dir_links(&self, fd: &OwnedFd, tree: &TreeId, upper: u32) -> Result<u32, Errno> {
        let t = self.tree(tree)?;
        let mut lower: Vec<&[u8]> = t
            .entries
            .iter()
            .filter(|e| e.kind == Kind::Dir)
            .map(|e| e.name.as_slice())
            .collect();
        if upper < 2 || lower.is_empty() {
            return Ok(upper);
        }
        for e in fs::read_dir(fd_path(fd)).map_err(errno_of_io)? {
            let name = e.map_err(errno_of_io)?.file_name();
            if let Ok(i) = lower.binary_search(&name.as_bytes()) {
                lower.remove(i);
            }
        }
        Ok(upper.saturating_add(lower.len() as u32))
    }

    /// The inode number of `name` in directory `dir` as it is now (`None`: gone).
    pub fn ino_at(&self, dir: &Node, dir_path: &[u8], name: &[u8]) -> Result<Option<u64>, Errno> {
        let found = self.resolve(dir, name)?;
        Ok(self.ino_of(dir_path, name, &found))
    }

    /// The number a found entry is served with (to find its held node).
    pub(super) fn ino_of(&self, dir_path: &[u8], name: &[u8], found: &Found) -> Option<u64> {
        match found {
            Found::Upper { path, meta } => Some(upper_ino(path, meta)),
            Found::Lower(e) => Some(lower_ino(&self.layers.snapshot, &join(dir_path, name), e)),
            _ => None,
        }
    }
}
