//! The workspace's logic, independent of the FUSE wire: resolving names through the
//! upper directory and the snapshot, attributes, listings, copy-up, and the namespace
//! changes (create, link, unlink, rmdir, rename) written in overlay's upper format.

use std::collections::VecDeque;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsStr;
use std::fs::{self, File};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, UNIX_EPOCH};

use cowspace_store::{Entry, Kind, Tree, TreeId};
use fuser::{Errno, FileAttr, FileType, INodeNo, RenameFlags};
use nix::fcntl::AtFlags;
use nix::fcntl::{AT_FDCWD, RenameFlags as HostRename};
use nix::sys::stat::{Mode, SFlag};

use super::layers::{
    Layers, OPAQUE_XATTR, at, fd_path, is_opaque, is_whiteout, join, lower_ino, lower_time_secs,
    open_path, upper_ino,
};
use super::lazy::{Lazy, Pending};
use super::node::{Lower, Node, ROOT_INO, Table};
use crate::view::VIEW_BLKSIZE_BYTES;

/// Decoded snapshot trees kept (cleared when full).
const MAX_CACHED_TREES: usize = 1024;

/// Listings kept for `readdir` (those of the directories read lately).
const MAX_KEPT_LISTINGS: usize = 16;

/// The first cookie an entry can have (`.` and `..` are 1 and 2).
const FIRST_COOKIE: u64 = 3;

/// A name in an upper directory (held open).
type Placed = (Arc<OwnedFd>, Vec<u8>);

/// A hard link of the snapshot to place once its primary name may have been copied: its
/// upper directory (and that directory's held node), name, snapshot path, entry and inode
/// number.
type LinkLater = (Arc<OwnedFd>, Option<u64>, Vec<u8>, Vec<u8>, Entry, u64);

/// Every name of each hard-linked file of the snapshot (sorted), by each of its names;
/// files with one name are not listed.
type Groups = HashMap<Vec<u8>, Vec<Vec<u8>>>;

/// What a name in a directory is.
pub enum Found {
    Upper { path: PathBuf, meta: fs::Metadata },
    Lower(Entry),
    Whiteout,
    Absent,
}

/// What a new name is made as.
pub enum Make<'a> {
    File { mode: u32 },
    Dir { mode: u32 },
    Symlink { target: &'a [u8] },
    Special { mode: u32, rdev: u64 },
    Link { source: Node },
}

/// One entry of a directory listing (its inode number is found when asked for:
/// `readdirplus` looks every entry up anyway).
#[derive(Debug, Clone)]
pub struct Listed {
    pub name: Vec<u8>,
    pub kind: FileType,
}

/// A directory's entries in the order `readdir` hands them out: by cookie, the offset a
/// reader resumes after, which is a function of the name alone ([`name_cookie`]). So a
/// listing read in pieces while the directory changes never shows an entry twice or
/// skips one that was there throughout, whatever changed between two pieces; `telldir`
/// positions stay valid too. (Two names of one directory share a cookie, a 62-bit hash,
/// with a chance of 2^-62 per pair; a reply ending between two such names would make the
/// next one skip the second.)
#[derive(Debug)]
pub struct Listing {
    pub entries: Vec<(u64, Listed)>,
}

impl Listing {
    /// The entries after offset `offset` (`0`, `1` and `2`: from the first).
    pub fn after(&self, offset: u64) -> &[(u64, Listed)] {
        let i = self.entries.partition_point(|(c, _)| *c <= offset);
        &self.entries[i..]
    }
}

/// The `readdir` offset of the entry after `name`: 62 bits of a hash of it, from 3 on.
pub fn name_cookie(name: &[u8]) -> u64 {
    // SipHash with fixed keys: the same for a name throughout the daemon's life, which
    // outlives every reader of its mounts.
    use std::hash::Hasher;
    let mut h = std::hash::DefaultHasher::new();
    h.write(name);
    (h.finish() >> 2).max(FIRST_COOKIE)
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

/// Bumps a counter when dropped: at the end of an operation that changes names.
struct NamesChange<'a>(&'a AtomicU64);

impl Drop for NamesChange<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }
}

/// The writable view of one workspace.
pub struct Cow {
    pub layers: Layers,
    pub table: Table,
    /// Held for writing by operations that move or delete names (unlink, rmdir, rename),
    /// for reading by everything that resolves paths.
    pub ns: RwLock<()>,
    /// Serialises copy-ups (two would race to rename into one place).
    copy: Mutex<()>,
    trees: Mutex<HashMap<TreeId, Arc<Tree>>>,
    /// Large files being copied up (`lazy.rs`): their I/O goes through the daemon.
    pub lazy: Arc<Lazy>,
    /// Counts the operations that changed names or the upper layer (make, remove, rename,
    /// copy-up), counted when each ends: a listing kept from before one is stale.
    names_changed: AtomicU64,
    /// Listings lately read, with the count they were taken at (newest first).
    listings: Mutex<VecDeque<(u64, u64, Arc<Listing>)>>,
    /// The snapshot's hard-link groups, found at the first need (a walk of the snapshot,
    /// only when it has hard links at all).
    groups: std::sync::OnceLock<Arc<Groups>>,
}

pub fn errno(e: io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

fn nix_errno(e: nix::Error) -> Errno {
    Errno::from_i32(e as i32)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub fn file_type_of(ft: fs::FileType) -> FileType {
    if ft.is_dir() {
        FileType::Directory
    } else if ft.is_symlink() {
        FileType::Symlink
    } else if ft.is_fifo() {
        FileType::NamedPipe
    } else if ft.is_char_device() {
        FileType::CharDevice
    } else if ft.is_block_device() {
        FileType::BlockDevice
    } else if ft.is_socket() {
        FileType::Socket
    } else {
        FileType::RegularFile
    }
}

fn kind_type(k: Kind) -> FileType {
    match k {
        Kind::Dir => FileType::Directory,
        Kind::File | Kind::Hardlink => FileType::RegularFile,
        Kind::Symlink => FileType::Symlink,
        Kind::Fifo => FileType::NamedPipe,
        Kind::CharDevice => FileType::CharDevice,
        Kind::BlockDevice => FileType::BlockDevice,
    }
}

fn sflag(kind: FileType) -> SFlag {
    match kind {
        FileType::Directory => SFlag::S_IFDIR,
        FileType::Symlink => SFlag::S_IFLNK,
        FileType::NamedPipe => SFlag::S_IFIFO,
        FileType::CharDevice => SFlag::S_IFCHR,
        FileType::BlockDevice => SFlag::S_IFBLK,
        FileType::Socket => SFlag::S_IFSOCK,
        FileType::RegularFile => SFlag::S_IFREG,
    }
}

fn time(secs: i64, nsecs: i64) -> std::time::SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsecs as u32)
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()) + Duration::from_nanos(nsecs as u64)
    }
}

/// Attributes of an upper object, served with inode number `ino`.
pub fn attr_of_stat(ino: u64, st: &nix::sys::stat::FileStat) -> FileAttr {
    let kind = match SFlag::from_bits_truncate(st.st_mode & libc::S_IFMT) {
        SFlag::S_IFDIR => FileType::Directory,
        SFlag::S_IFLNK => FileType::Symlink,
        SFlag::S_IFIFO => FileType::NamedPipe,
        SFlag::S_IFCHR => FileType::CharDevice,
        SFlag::S_IFBLK => FileType::BlockDevice,
        SFlag::S_IFSOCK => FileType::Socket,
        _ => FileType::RegularFile,
    };
    FileAttr {
        ino: INodeNo(ino),
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        atime: time(st.st_atime, st.st_atime_nsec),
        mtime: time(st.st_mtime, st.st_mtime_nsec),
        ctime: time(st.st_ctime, st.st_ctime_nsec),
        crtime: time(st.st_ctime, st.st_ctime_nsec),
        kind,
        perm: (st.st_mode & 0o7777) as u16,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: st.st_rdev as u32,
        blksize: st.st_blksize as u32,
        flags: 0,
    }
}

impl Cow {
    pub fn new(layers: Layers, root: Node) -> Cow {
        Cow {
            layers,
            table: Table::new(root),
            ns: RwLock::new(()),
            copy: Mutex::new(()),
            trees: Mutex::new(HashMap::new()),
            lazy: Arc::new(Lazy::new()),
            names_changed: AtomicU64::new(0),
            listings: Mutex::new(VecDeque::new()),
            groups: std::sync::OnceLock::new(),
        }
    }

    /// The snapshot's hard-link groups ([`Groups`]).
    fn groups(&self) -> Result<Arc<Groups>, Errno> {
        if let Some(g) = self.groups.get() {
            return Ok(Arc::clone(g));
        }
        let store = &self.layers.store;
        let snap = store
            .snapshot(&self.layers.snapshot)
            .map_err(|e| crate::view::errno_of("read snapshot", &e))?;
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
    /// kind `kind`, whose data is `data`), when it has more than one.
    fn link_names(&self, rel: &[u8], kind: Kind, data: &[u8]) -> Result<Vec<Vec<u8>>, Errno> {
        let primary = match kind {
            Kind::File => rel,
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
            Kind::File if self.groups()?.is_empty() => return Ok(1),
            Kind::File => {
                let rel = self.table.path_of(node)?;
                self.link_names(&rel, lower.kind, &[])?
            }
            _ => return Ok(1),
        };
        Ok(names.len().max(1) as u32)
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
                    let placed = self
                        .layers
                        .copy_up_dir(target.clone(), &child, &e, ino)
                        .map_err(errno)?;
                    self.note_copied(held, c, ino, &placed)?;
                    ino
                }
                Err(err) => return Err(errno(err)),
            };
            held = held.and_then(|d| {
                self.table
                    .find(ino)
                    .filter(|n| n.parent == d && *n.name == **c)
                    .map(|n| n.ino)
            });
            fd = Arc::new(open_path(&target).map_err(errno)?);
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
        let dmeta = fs::metadata(&dir).map_err(errno)?;
        fs::hard_link(src, &target).map_err(errno)?;
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
        .map_err(nix_errno)?;
        Ok(())
    }

    /// Before a name of a hard-linked snapshot file is deleted or replaced: the file is
    /// copied up with all its names ([`Cow::link_group`]), so the other names stay (and
    /// count) as one file. `found` is what `name` in `dir` is.
    fn copy_up_linked_name(
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
            .copy_up_leaf(target, &rel, e, ino, false)
            .map_err(errno)?;
        let fd = Arc::new(open_path(&path).map_err(errno)?);
        self.table.update(ino, |n| {
            if n.upper.is_none() {
                n.upper = Some(fd);
            }
        });
        Ok(())
    }

    fn names_change(&self) -> NamesChange<'_> {
        NamesChange(&self.names_changed)
    }

    /// Directory `dir`'s listing in cookie order: kept from a read since which no name
    /// changed, else taken now.
    pub fn listing(&self, dir: &Node) -> Result<Arc<Listing>, Errno> {
        // Read before listing: a change that ends while the listing is taken makes it
        // stale at once.
        let count = self.names_changed.load(Ordering::Acquire);
        let kept = lock(&self.listings)
            .iter()
            .find(|(ino, c, _)| *ino == dir.ino && *c == count)
            .map(|(_, _, l)| Arc::clone(l));
        if let Some(l) = kept {
            return Ok(l);
        }
        let mut entries: Vec<(u64, Listed)> = self
            .list(dir)?
            .into_iter()
            .map(|e| (name_cookie(&e.name), e))
            .collect();
        entries.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.name.cmp(&b.1.name)));
        let listing = Arc::new(Listing { entries });
        let mut kept = lock(&self.listings);
        kept.retain(|(ino, c, _)| *ino != dir.ino && *c == count);
        kept.truncate(MAX_KEPT_LISTINGS - 1);
        kept.push_front((dir.ino, count, Arc::clone(&listing)));
        Ok(listing)
    }

    /// The decoded snapshot tree `id`.
    pub fn tree(&self, id: &TreeId) -> Result<Arc<Tree>, Errno> {
        if let Some(t) = lock(&self.trees).get(id) {
            return Ok(Arc::clone(t));
        }
        let t = Arc::new(
            self.layers
                .store
                .tree(id)
                .map_err(|e| crate::view::errno_of("read tree", &e))?,
        );
        let mut trees = lock(&self.trees);
        if trees.len() >= MAX_CACHED_TREES {
            trees.clear();
        }
        trees.insert(*id, Arc::clone(&t));
        Ok(t)
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
            Some(id) if dir.kind == FileType::Directory => Some(self.tree(id)?),
            _ => None,
        };
        self.resolve_in(dir, tree.as_deref(), name)
    }

    /// [`Cow::resolve`] with the directory's snapshot tree (`dir.lower_tree`) at hand.
    fn resolve_in(&self, dir: &Node, tree: Option<&Tree>, name: &[u8]) -> Result<Found, Errno> {
        if dir.kind != FileType::Directory {
            return Err(Errno::ENOTDIR);
        }
        if let Some(dfd) = &dir.upper {
            let up = at(dfd.as_ref(), name);
            match fs::symlink_metadata(&up) {
                Ok(m) if is_whiteout(&m) => return Ok(Found::Whiteout),
                Ok(meta) => return Ok(Found::Upper { path: up, meta }),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {}
                Err(e) => return Err(errno(e)),
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
                let kind = file_type_of(meta.file_type());
                let lower_tree = if kind == FileType::Directory && !is_opaque(&path) {
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
                    upper: Some(Arc::new(open_path(&path).map_err(errno)?)),
                    deleted: false,
                    lower_secs: 0,
                }
            }
            Found::Lower(e) => Node {
                ino: lower_ino(&self.layers.snapshot, &rel, &e),
                kind: kind_type(e.kind),
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
        let guard = self.ns.read().unwrap_or_else(|p| p.into_inner());
        let dir_path = self.table.path_of(dir)?;
        let tree = match &dir.lower_tree {
            Some(id) if dir.kind == FileType::Directory => Some(self.tree(id)?),
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
        let _r = self.ns.read().unwrap_or_else(|p| p.into_inner());
        let dir = self.table.get(parent)?;
        let dir_path = self.table.path_of(&dir)?;
        let found = self.resolve(&dir, name)?;
        Ok(self
            .node_of(&dir, &dir_path, name, found)?
            .map(|n| self.table.acquire(n)))
    }

    /// The attributes of a node.
    pub fn attr(&self, node: &Node) -> Result<FileAttr, Errno> {
        if let Some(fd) = &node.upper {
            let st = nix::sys::stat::fstat(fd.as_fd()).map_err(nix_errno)?;
            return Ok(attr_of_stat(node.ino, &st));
        }
        let e = node.lower.as_ref().ok_or(Errno::EIO)?;
        let t = UNIX_EPOCH + Duration::from_secs(node.lower_secs);
        let dir = e.kind == Kind::Dir;
        Ok(FileAttr {
            ino: INodeNo(node.ino),
            size: if dir { 0 } else { e.size },
            blocks: e.size.div_ceil(512),
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            kind: kind_type(e.kind),
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
            flags: 0,
        })
    }

    /// The merged listing of directory `dir`, sorted by name.
    pub fn list(&self, dir: &Node) -> Result<Vec<Listed>, Errno> {
        let _r = self.ns.read().unwrap_or_else(|p| p.into_inner());
        self.list_at(dir)
    }

    fn list_at(&self, dir: &Node) -> Result<Vec<Listed>, Errno> {
        let mut out: BTreeMap<Vec<u8>, FileType> = BTreeMap::new();
        let mut whiteouts = HashSet::new();
        if let Some(dfd) = &dir.upper {
            let up = fd_path(dfd.as_ref());
            let rd = match fs::read_dir(&up) {
                Ok(rd) => Some(rd),
                Err(e) if e.kind() == io::ErrorKind::NotFound => None,
                Err(e) => return Err(errno(e)),
            };
            for e in rd.into_iter().flatten() {
                let e = e.map_err(errno)?;
                let name = e.file_name().as_bytes().to_vec();
                let ft = match e.file_type() {
                    Ok(ft) => ft,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(errno(e)),
                };
                // Only a character device can be a whiteout: the others need no stat.
                if ft.is_char_device() {
                    match fs::symlink_metadata(e.path()) {
                        Ok(m) if is_whiteout(&m) => {
                            whiteouts.insert(name);
                            continue;
                        }
                        Ok(_) => {}
                        Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                        Err(e) => return Err(errno(e)),
                    }
                }
                out.insert(name, file_type_of(ft));
            }
        }
        if let Some(id) = &dir.lower_tree {
            for e in &self.tree(id)?.entries {
                if out.contains_key(&e.name) || whiteouts.contains(&e.name) {
                    continue;
                }
                out.insert(e.name.clone(), kind_type(e.kind));
            }
        }
        Ok(out
            .into_iter()
            .map(|(name, kind)| Listed { name, kind })
            .collect())
    }

    /// The inode number of `name` in directory `dir` as it is now (`None`: gone).
    pub fn ino_at(&self, dir: &Node, dir_path: &[u8], name: &[u8]) -> Result<Option<u64>, Errno> {
        let found = self.resolve(dir, name)?;
        Ok(self.ino_of(dir_path, name, &found))
    }

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

    fn copy_up_locked(&self, ino: u64, empty: bool) -> Result<Node, Errno> {
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
            let fd = Arc::new(open_path(&target).map_err(errno)?);
            self.table.update(ino, |n| n.upper = Some(Arc::clone(&fd)));
            return self.table.get(ino);
        }
        let rel = self.table.path_of(&node)?;
        let placed = if entry.kind == Kind::Dir {
            self.layers.copy_up_dir(target, &rel, &entry, ino)
        } else {
            self.copy_up_leaf(target, &rel, &entry, ino, empty)
        };
        let path = placed.map_err(|e| {
            tracing::warn!(path = %String::from_utf8_lossy(&rel), error = %e, "copy-up failed");
            errno(e)
        })?;
        let fd = Arc::new(open_path(&path).map_err(errno)?);
        self.table.update(ino, |n| n.upper = Some(Arc::clone(&fd)));
        self.table.get(ino)
    }

    /// [`Layers::copy_up_leaf`], a copy-up still in progress registered before anything
    /// can open the file.
    fn copy_up_leaf(
        &self,
        target: PathBuf,
        rel: &[u8],
        entry: &Entry,
        ino: u64,
        empty: bool,
    ) -> io::Result<PathBuf> {
        let (path, pending) = self.layers.copy_up_leaf(target, rel, entry, ino, empty)?;
        if let Some(p) = pending {
            self.lazy.add(Arc::new(p))?;
        }
        self.link_group(rel, entry, &path)
            .map_err(|e| io::Error::from_raw_os_error(e.code()))?;
        Ok(path)
    }

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
        if name.len() > 255 {
            return Err(Errno::from_i32(libc::ENAMETOOLONG));
        }
        let _r = self.ns.read().unwrap_or_else(|p| p.into_inner());
        let _changes = self.names_change();
        let dir = self.copy_up(parent, false)?;
        let dir_fd = dir.upper.as_ref().ok_or(Errno::EIO)?;
        let target = at(dir_fd.as_ref(), name);
        let over_whiteout = match self.resolve(&dir, name)? {
            Found::Whiteout => true,
            Found::Absent => false,
            Found::Upper { .. } | Found::Lower(_) => return Err(Errno::EEXIST),
        };
        let dmeta = fs::metadata(fd_path(dir_fd.as_ref())).map_err(errno)?;
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
            return Err(errno(e));
        }
        let meta = fs::symlink_metadata(&target).map_err(errno)?;
        let node = Node {
            ino: upper_ino(&target, &meta),
            kind: file_type_of(meta.file_type()),
            parent,
            name: name.into(),
            lower: None,
            lower_tree: None,
            upper: Some(Arc::new(open_path(&target).map_err(errno)?)),
            deleted: false,
            lower_secs: 0,
        };
        Ok(self.table.acquire(node))
    }

    /// Whether the merged directory at `name` in `dir` (found as `found`) is empty; an
    /// upper directory then loses its whiteouts.
    fn empty_dir(
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
            self.layers.clear_whiteouts(&p).map_err(errno)?;
        }
        Ok(())
    }

    /// The number a found entry is served with (to find its held node).
    fn ino_of(&self, dir_path: &[u8], name: &[u8], found: &Found) -> Option<u64> {
        match found {
            Found::Upper { path, meta } => Some(upper_ino(path, meta)),
            Found::Lower(e) => Some(lower_ino(&self.layers.snapshot, &join(dir_path, name), e)),
            _ => None,
        }
    }

    /// `unlink` (`dir` false) or `rmdir` (`dir` true) of `name` in `parent`.
    pub fn remove(&self, parent: u64, name: &[u8], want_dir: bool) -> Result<(), Errno> {
        let _w = self.ns.write().unwrap_or_else(|p| p.into_inner());
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
                .map_err(errno)?,
            Some(path) if is_dir => fs::remove_dir(&path).map_err(errno)?,
            Some(path) => fs::remove_file(&path).map_err(errno)?,
            None => {
                let dir = self.copy_up(parent, false)?;
                let dir_fd = dir.upper.as_ref().ok_or(Errno::EIO)?;
                self.layers
                    .whiteout(&fd_path(dir_fd.as_ref()), name)
                    .map_err(errno)?;
            }
        }
        if let Some(ino) = ino {
            self.table.update(ino, |n| {
                if n.upper.is_none() {
                    n.deleted = true;
                }
            });
        }
        Ok(())
    }

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
        if newname.len() > 255 {
            return Err(Errno::from_i32(libc::ENAMETOOLONG));
        }
        let filled = self.fill_for_rename(parent, name, newparent, newname)?;
        let _w = self.ns.write().unwrap_or_else(|p| p.into_inner());
        let _changes = self.names_change();
        let dir = self.table.get(parent)?;
        let dir_path = self.table.path_of(&dir)?;
        let src = self.resolve(&dir, name)?;
        let src_ino = self.ino_of(&dir_path, name, &src).ok_or(Errno::ENOENT)?;
        let src_lower = match &src {
            Found::Lower(e) => Some(e.clone()),
            _ => None,
        };
        let src_node = self
            .node_of(&dir, &dir_path, name, src)?
            .ok_or(Errno::ENOENT)?;
        let src_is_dir = src_node.kind == FileType::Directory;
        // A directory with snapshot content beneath is copied up whole first (below).
        let src_tree = src_node.lower_tree.clone().filter(|_| src_is_dir);
        let ndir = self.table.get(newparent)?;
        let ndir_path = self.table.path_of(&ndir)?;
        let dst = self.resolve(&ndir, newname)?;
        let dst_ino = self.ino_of(&ndir_path, newname, &dst);
        if dst_ino == Some(src_ino) {
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
                match (src_is_dir, dst_is_dir) {
                    (true, false) => return Err(Errno::ENOTDIR),
                    (false, true) => return Err(Errno::EISDIR),
                    (true, true) => self.empty_dir(&ndir, &ndir_path, newname, dst)?,
                    (false, false) => self.copy_up_linked_name(&ndir, &ndir_path, newname, &dst)?,
                }
            }
            Found::Whiteout if src_is_dir => {
                // A whiteout is only found in a directory with an upper object.
                let nfd = ndir.upper.as_ref().ok_or(Errno::EIO)?;
                fs::remove_file(at(nfd.as_ref(), newname)).map_err(errno)?;
            }
            _ => {}
        }
        let rel = join(&dir_path, name);
        // The source in the upper layer, and both directories.
        let (dir_up, ndir_up) = {
            let _g = lock(&self.copy);
            let dir = self.copy_up_locked(parent, false)?;
            let ndir = self.copy_up_locked(newparent, false)?;
            let dir_up = dir.upper.ok_or(Errno::EIO)?;
            let ndir_up = ndir.upper.ok_or(Errno::EIO)?;
            if let Some(entry) = &src_lower {
                let target = at(dir_up.as_ref(), name);
                let path = if src_is_dir {
                    self.layers.copy_up_dir(target, &rel, entry, src_ino)
                } else {
                    self.copy_up_leaf(target, &rel, entry, src_ino, false)
                }
                .map_err(errno)?;
                let fd = Arc::new(open_path(&path).map_err(errno)?);
                self.table.update(src_ino, |n| n.upper = Some(fd));
            }
            (dir_up, ndir_up)
        };
        if let Some(tree) = &src_tree
            && filled != Some(src_ino)
        {
            // Not copied by `fill_for_rename` (not held then, or another directory has
            // its name now). Once copied, a directory stays whole: the snapshot does not
            // change, and what comes beneath it since is in the upper layer. Nothing else
            // copies now (copy-ups need the namespace too).
            let fd = open_path(&at(dir_up.as_ref(), name)).map_err(errno)?;
            self.fill_from_snapshot(Arc::new(fd), None, &rel, tree)?;
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
        nix::fcntl::renameat2(AT_FDCWD, &from, AT_FDCWD, &to, host).map_err(nix_errno)?;
        if src_is_dir && self.lower_child(&ndir, newname)?.is_some() {
            xattr::set(&to, OPAQUE_XATTR, b"y").map_err(errno)?;
        }
        self.table.update(src_ino, |n| {
            n.parent = newparent;
            n.name = newname.into();
        });
        if src_tree.is_some() {
            self.table.update(src_ino, |n| n.lower_tree = None);
            self.refresh_beneath(src_ino)?;
        }
        if let Some(d) = dst_ino {
            self.table.update(d, |n| {
                if n.upper.is_none() {
                    n.deleted = true;
                }
            });
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
        if newname.len() > 255 {
            return Err(Errno::from_i32(libc::ENAMETOOLONG));
        }
        let _w = self.ns.write().unwrap_or_else(|p| p.into_inner());
        let _changes = self.names_change();
        // Each side: its number, whether it is a directory, its snapshot entry (when not
        // copied up yet) and the snapshot directory merged beneath it.
        let side = |dir_ino: u64, name: &[u8]| -> Result<_, Errno> {
            let dir = self.table.get(dir_ino)?;
            let dir_path = self.table.path_of(&dir)?;
            let found = self.resolve(&dir, name)?;
            let ino = self.ino_of(&dir_path, name, &found).ok_or(Errno::ENOENT)?;
            let lower = match &found {
                Found::Lower(e) => Some(e.clone()),
                _ => None,
            };
            let node = self
                .node_of(&dir, &dir_path, name, found)?
                .ok_or(Errno::ENOENT)?;
            let is_dir = node.kind == FileType::Directory;
            let tree = node.lower_tree.clone().filter(|_| is_dir);
            Ok((ino, is_dir, lower, tree, join(&dir_path, name)))
        };
        let (a_ino, a_dir, a_lower, a_tree, a_rel) = side(parent, name)?;
        let (b_ino, b_dir, b_lower, b_tree, b_rel) = side(newparent, newname)?;
        if a_ino == b_ino {
            // The same file (two names of it, or one name twice): nothing changes.
            return Ok(());
        }
        let (dir_up, ndir_up) = {
            let _g = lock(&self.copy);
            let dir = self.copy_up_locked(parent, false)?;
            let ndir = self.copy_up_locked(newparent, false)?;
            let dir_up = dir.upper.ok_or(Errno::EIO)?;
            let ndir_up = ndir.upper.ok_or(Errno::EIO)?;
            for (up, nm, lower, ino, is_dir, rel) in [
                (&dir_up, name, &a_lower, a_ino, a_dir, &a_rel),
                (&ndir_up, newname, &b_lower, b_ino, b_dir, &b_rel),
            ] {
                let Some(entry) = lower else {
                    continue;
                };
                let target = at(up.as_ref(), nm);
                if fs::symlink_metadata(&target).is_ok_and(|m| !is_whiteout(&m)) {
                    // Placed meanwhile as a name of a linked file copied up just now.
                } else if is_dir {
                    self.layers
                        .copy_up_dir(target.clone(), rel, entry, ino)
                        .map_err(errno)?;
                } else {
                    self.copy_up_leaf(target.clone(), rel, entry, ino, false)
                        .map_err(errno)?;
                }
                let fd = Arc::new(open_path(&target).map_err(errno)?);
                self.table.update(ino, |n| {
                    if n.upper.is_none() {
                        n.upper = Some(fd);
                    }
                });
            }
            (dir_up, ndir_up)
        };
        for (up, nm, tree, ino, rel) in [
            (&dir_up, name, &a_tree, a_ino, &a_rel),
            (&ndir_up, newname, &b_tree, b_ino, &b_rel),
        ] {
            if let Some(tree) = tree {
                let fd = open_path(&at(up.as_ref(), nm)).map_err(errno)?;
                let held = self.table.find(ino).map(|n| n.ino);
                self.fill_from_snapshot(Arc::new(fd), held, rel, tree)?;
            }
        }
        let from = at(dir_up.as_ref(), name);
        let to = at(ndir_up.as_ref(), newname);
        nix::fcntl::renameat2(AT_FDCWD, &from, AT_FDCWD, &to, HostRename::RENAME_EXCHANGE)
            .map_err(nix_errno)?;
        let dir = self.table.get(parent)?;
        let ndir = self.table.get(newparent)?;
        if a_dir && self.lower_child(&ndir, newname)?.is_some() {
            xattr::set(&to, OPAQUE_XATTR, b"y").map_err(errno)?;
        }
        if b_dir && self.lower_child(&dir, name)?.is_some() {
            xattr::set(&from, OPAQUE_XATTR, b"y").map_err(errno)?;
        }
        self.table.update(a_ino, |n| {
            n.parent = newparent;
            n.name = newname.into();
        });
        self.table.update(b_ino, |n| {
            n.parent = parent;
            n.name = name.into();
        });
        for (tree, ino) in [(&a_tree, a_ino), (&b_tree, b_ino)] {
            if tree.is_some() {
                self.table.update(ino, |n| n.lower_tree = None);
                self.refresh_beneath(ino)?;
            }
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
        let _r = self.ns.read().unwrap_or_else(|p| p.into_inner());
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
        let found = self.resolve(&dir, name)?;
        let Some(ino) = self.ino_of(&dir_path, name, &found) else {
            return Ok(None);
        };
        let Some(node) = self.node_of(&dir, &dir_path, name, found)? else {
            return Ok(None);
        };
        let Some(tree) = node
            .lower_tree
            .clone()
            .filter(|_| node.kind == FileType::Directory)
        else {
            return Ok(None);
        };
        if self.table.find(ino).is_none() {
            // Not held (the kernel holds what it renames): the rename itself copies.
            return Ok(None);
        }
        let up = self.copy_up(ino, false)?;
        let fd = up.upper.ok_or(Errno::EIO)?;
        self.fill_from_snapshot(fd, Some(ino), &join(&dir_path, name), &tree)?;
        Ok(Some(ino))
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
    fn fill_from_snapshot(
        &self,
        dir: Arc<OwnedFd>,
        dir_ino: Option<u64>,
        rel: &[u8],
        tree: &TreeId,
    ) -> Result<(), Errno> {
        let mut files = HashMap::new();
        let mut links = Vec::new();
        self.fill_dir(&dir, dir_ino, rel, tree, &mut files, &mut links)?;
        for (dir, dir_ino, name, rel, entry, ino) in links {
            let _g = lock(&self.copy);
            let target = at(dir.as_ref(), &name);
            if fs::symlink_metadata(&target).is_ok() {
                continue;
            }
            match files.get(entry.data.as_slice()) {
                Some((pdir, pname)) => fs::hard_link(at(&**pdir, pname), &target).map_err(errno)?,
                // Its primary name is elsewhere: a copy of its own, as `mv` makes.
                None => {
                    self.copy_up_leaf(target.clone(), &rel, &entry, ino, false)
                        .map_err(errno)?;
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
                            let placed = self
                                .layers
                                .copy_up_dir(target.clone(), &child, e, ino)
                                .map_err(errno)?;
                            self.note_copied(dir_ino, &e.name, ino, &placed)?;
                            Some((placed, ino))
                        }
                        Kind::Hardlink => {
                            links.push((
                                Arc::clone(dir),
                                dir_ino,
                                e.name.clone(),
                                child.clone(),
                                e.clone(),
                                ino,
                            ));
                            None
                        }
                        _ => {
                            let placed = self
                                .copy_up_leaf(target.clone(), &child, e, ino, false)
                                .map_err(errno)?;
                            self.note_copied(dir_ino, &e.name, ino, &placed)?;
                            if e.kind == Kind::File {
                                files.insert(child.clone(), (Arc::clone(dir), e.name.clone()));
                            }
                            None
                        }
                    },
                    Err(err) => return Err(errno(err)),
                }
            };
            if let (Some((path, sub_ino)), Some(sub)) = (beneath, e.subtree()) {
                let fd = Arc::new(open_path(&path).map_err(errno)?);
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
            let fd = Arc::new(open_path(path).map_err(errno)?);
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
    fn refresh_beneath(&self, ino: u64) -> Result<(), Errno> {
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
                    let fd = Arc::new(open_path(&path).map_err(errno)?);
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
            let _r = self.ns.read().unwrap_or_else(|p| p.into_inner());
            self.copy_up(node.ino, flags & libc::O_TRUNC != 0)?
        } else {
            node.clone()
        };
        let fd = node.upper.as_ref().ok_or(Errno::EIO)?;
        let pending = self.lazy.get(fd.as_ref());
        if let Some(p) = &pending
            && flags & libc::O_TRUNC != 0
        {
            p.truncate(0).map_err(errno)?;
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
            .map_err(errno)?;
        Ok((node, f, pending))
    }

    /// The upper path reaching `node`'s object (it must have one).
    pub fn upper_of(&self, node: &Node) -> Result<PathBuf, Errno> {
        node.upper
            .as_ref()
            .map(|fd| fd_path(fd.as_ref()))
            .ok_or(Errno::EIO)
    }

    /// The kind a `mknod` mode asks for.
    pub fn special_kind(mode: u32) -> Result<FileType, Errno> {
        Ok(match SFlag::from_bits_truncate(mode & libc::S_IFMT) {
            SFlag::S_IFIFO => FileType::NamedPipe,
            SFlag::S_IFCHR => FileType::CharDevice,
            SFlag::S_IFBLK => FileType::BlockDevice,
            SFlag::S_IFSOCK => FileType::Socket,
            SFlag::S_IFREG => FileType::RegularFile,
            _ => return Err(Errno::EINVAL),
        })
    }

    /// Checks `path` is where the root's node says.
    pub fn is_root(ino: u64) -> bool {
        ino == ROOT_INO
    }

    /// `S_IF*` of a kind (for tests and mknod).
    pub fn ifmt(kind: FileType) -> u32 {
        sflag(kind).bits()
    }

    /// Whether `path` exists in the upper layer (tests).
    #[cfg(test)]
    pub fn in_upper(&self, rel: &[u8]) -> bool {
        self.layers.upper_path(rel).symlink_metadata().is_ok()
    }
}

/// The root of a workspace as a node: always in the upper layer.
pub fn root_node(layers: &Layers, root_tree: TreeId) -> io::Result<Node> {
    let up: &Path = &layers.upper;
    Ok(Node {
        ino: ROOT_INO,
        kind: FileType::Directory,
        parent: ROOT_INO,
        name: Arc::from(&[][..]),
        lower: None,
        lower_tree: (!is_opaque(up)).then(|| Arc::new(root_tree)),
        upper: Some(Arc::new(open_path(up)?)),
        deleted: false,
        lower_secs: 0,
    })
}
