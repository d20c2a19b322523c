//! The view's logic, independent of the FUSE wire: resolving names to nodes with stable
//! numbers, attributes, directory listings and blob files. `fs.rs` makes it a
//! `FileSystem` for a server; unit tests drive this directly.

use std::collections::HashMap;
use std::fs::File;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use cowspace_store::{ContentId, Entry, Kind, SnapshotId, Store, Tree, TreeId};

use super::inode::{InodeKey, InodeTable, Node, NodeKind, ROOT_INO, child_path};
use crate::filesystem::{Attr, Errno, FileKind, errno_of_blob_io, errno_of_store, lock};

pub use cowspace::served::VIEW_TIME_SECS;

/// Block size reported by `stat` and `statfs`.
pub const VIEW_BLKSIZE_BYTES: u32 = 4096;

/// Decoded trees kept per cache generation (two generations: at most twice this).
const TREE_CACHE_TREES_PER_GEN: usize = 2048;

/// Snapshots whose link counts are kept (cleared when full).
const LINK_COUNT_SNAPSHOTS: usize = 64;

/// The names of each hard-linked file of one snapshot, by its primary's path (files
/// with one name are not listed).
type LinkCounts = HashMap<Vec<u8>, u32>;

/// Where [`LinkCounts`] keeps a multiply-linked symlink's count: its group key after a
/// NUL byte (no path holds one).
fn symlink_slot(group: &[u8; 32]) -> Vec<u8> {
    [&[0u8][..], group].concat()
}

/// Counters of what the kernel asked; shared with [`super::ViewMount::stats`].
#[derive(Debug, Default)]
pub struct Counters {
    pub lookups: AtomicU64,
    pub opens: AtomicU64,
    pub passthrough_opens: AtomicU64,
    pub reads: AtomicU64,
    pub read_bytes: AtomicU64,
    pub xattr_requests: AtomicU64,
    /// Whether the kernel granted FUSE passthrough and the view uses it.
    pub passthrough: AtomicBool,
}

/// A small two-generation cache of decoded trees (bounded; hot trees survive a flip).
#[derive(Default)]
struct TreeCache {
    young: HashMap<TreeId, Arc<Tree>>,
    old: HashMap<TreeId, Arc<Tree>>,
}

impl TreeCache {
    fn get(&mut self, id: &TreeId) -> Option<Arc<Tree>> {
        if let Some(t) = self.young.get(id) {
            return Some(Arc::clone(t));
        }
        let t = self.old.remove(id)?;
        self.insert(*id, Arc::clone(&t));
        Some(t)
    }

    fn insert(&mut self, id: TreeId, t: Arc<Tree>) {
        if self.young.len() >= TREE_CACHE_TREES_PER_GEN {
            self.old = std::mem::take(&mut self.young);
        }
        self.young.insert(id, t);
    }
}

/// The read-only snapshot view over one store.
/// Files at least this large whose content is partly on a remote are read by range
/// ([`ViewCore::remote_chunks`]); smaller ones come whole into the blob cache at open.
pub const RANGE_READ_MIN_BYTES: u64 = 4 * 1024 * 1024;

/// The most a sequential reader of a [`Chunked`] file gets fetched ahead of its reads.
pub const READ_AHEAD_MAX_BYTES: u64 = 4 * 1024 * 1024;

/// The chunks of a file and where each starts, with the read-ahead of a sequential
/// reader: each read that starts where the last one ended doubles the window (up to
/// [`READ_AHEAD_MAX_BYTES`]); any other read closes it (a random reader, git reading
/// objects out of a pack, gets only the chunks it reads).
pub struct Chunked {
    chunks: Vec<(cowspace_store::ChunkId, u32)>,
    starts: Vec<u64>,
    size: u64,
    next: std::sync::atomic::AtomicU64,
    window: std::sync::atomic::AtomicU64,
}

pub struct ViewCore {
    pub store: Arc<Store>,
    pub table: InodeTable,
    pub counters: Counters,
    root: Arc<Node>,
    trees: Mutex<TreeCache>,
    ensured: crate::blobfiles::EnsuredBlobs,
    links: Mutex<HashMap<SnapshotId, Arc<LinkCounts>>>,
    uid: u32,
    gid: u32,
    /// Whether extended attributes are served (off: the plain view, see [`super::plain`]).
    pub xattrs: bool,
}

impl ViewCore {
    pub fn new(store: Arc<Store>, uid: u32, gid: u32, xattrs: bool) -> ViewCore {
        ViewCore {
            xattrs,
            store,
            table: InodeTable::default(),
            counters: Counters::default(),
            root: Arc::new(Node::root()),
            trees: Mutex::new(TreeCache::default()),
            ensured: Default::default(),
            links: Mutex::new(HashMap::new()),
            uid,
            gid,
        }
    }

    /// The link counts of `snapshot`'s hard-linked files, found once per snapshot by
    /// walking its trees (only when it has hard links at all). Kernel overlayfs needs
    /// the true count: a file it believes has one name keeps its lower inode number when
    /// copied up, while a new link to the copy gets the upper one, and a rename between
    /// the two names then fails with `ESTALE`.
    fn link_counts(&self, snapshot: &SnapshotId) -> Result<Arc<LinkCounts>, Errno> {
        if let Some(l) = self
            .links
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(snapshot)
        {
            return Ok(Arc::clone(l));
        }
        let snap = self
            .store
            .snapshot(snapshot)
            .map_err(|e| errno_of_store("read snapshot", &e))?;
        let mut counts = LinkCounts::new();
        if snap.counts.hardlinks > 0 {
            let mut stack = vec![(snap.root, Vec::new())];
            while let Some((id, path)) = stack.pop() {
                let tree = self
                    .store
                    .tree(&id)
                    .map_err(|e| errno_of_store("read tree", &e))?;
                for e in &tree.entries {
                    match e.kind {
                        Kind::Dir => {
                            stack.push((TreeId::from_bytes(e.hash), child_path(&path, &e.name)))
                        }
                        Kind::Hardlink => *counts.entry(e.data.clone()).or_insert(1) += 1,
                        Kind::Symlink => {
                            if let Some(g) = e.link_group() {
                                *counts.entry(symlink_slot(&g)).or_insert(0) += 1;
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
        let counts = Arc::new(counts);
        let mut links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        if links.len() >= LINK_COUNT_SNAPSHOTS {
            links.clear();
        }
        links.insert(*snapshot, Arc::clone(&counts));
        Ok(counts)
    }

    /// The node of `ino`: the root, or one the kernel holds. `ESTALE` otherwise (the
    /// kernel never names an inode it was not given or has forgotten).
    pub fn node(&self, ino: u64) -> Result<Arc<Node>, Errno> {
        if ino == ROOT_INO {
            return Ok(Arc::clone(&self.root));
        }
        self.table.get(ino).ok_or_else(|| {
            tracing::warn!(ino, "request for an inode the view does not hold");
            Errno::from_i32(nix::libc::ESTALE)
        })
    }

    /// Resolves `name` in `parent`, taking one lookup on the result. `Ok(None)` is a
    /// definite absence inside a snapshot, which the kernel may cache as long as it likes.
    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Option<Arc<Node>>, Errno> {
        self.counters.lookups.fetch_add(1, Ordering::Relaxed);
        let dir = self.node(parent)?;
        match &dir.kind {
            NodeKind::Root => self.lookup_snapshot(name).map(Some),
            NodeKind::Dir { .. } => {
                let tree = self.tree(&dir)?;
                let Ok(i) = tree
                    .entries
                    .binary_search_by(|e| e.name.as_slice().cmp(name))
                else {
                    return Ok(None);
                };
                self.acquire_child(&dir, &tree.entries[i]).map(Some)
            }
            _ => Err(Errno::ENOTDIR),
        }
    }

    /// `<snapshot-hex>` under the mount root: the snapshot's root directory.
    fn lookup_snapshot(&self, name: &[u8]) -> Result<Arc<Node>, Errno> {
        // Only the canonical spelling, so a directory never gets two names (aliases).
        let id: SnapshotId = std::str::from_utf8(name)
            .ok()
            .and_then(|s| s.parse().ok())
            .filter(|id: &SnapshotId| id.to_hex().as_bytes() == name)
            .ok_or(Errno::ENOENT)?;
        // The plain view drops xattrs: only snapshots recorded as having none are in it.
        if !self.xattrs && super::plain::recorded(&self.store, &id) != Some(false) {
            return Err(Errno::ENOENT);
        }
        let snap = self
            .store
            .snapshot(&id)
            .map_err(|e| errno_of_store("lookup snapshot", &e))?;
        let mode = snap.root_mode & 0o7777;
        let key = InodeKey::of_snapshot_root(&id, &snap.root, mode);
        let nlink = self.dir_links(&snap.root)?;
        self.table
            .acquire(&key, |ino, digest| Node {
                ino,
                digest,
                kind: NodeKind::Dir {
                    snapshot: id,
                    tree: snap.root,
                    path: Vec::new(),
                    parent: ROOT_INO,
                },
                mode,
                size: 0,
                nlink,
                xattrs: snap.root_xattrs.clone(),
                time_offset: 0,
            })
            .map_err(|_| Errno::EIO)
    }

    /// The link count of the snapshot directory whose tree is `id`: 2 + its
    /// subdirectories, as on a disk filesystem (`find` without `-noleaf` relies on it).
    fn dir_links(&self, id: &TreeId) -> Result<u32, Errno> {
        let t = self.tree_of(id)?;
        Ok(2 + t.entries.iter().filter(|e| e.kind == Kind::Dir).count() as u32)
    }

    /// The decoded tree of a snapshot directory.
    pub fn tree(&self, dir: &Node) -> Result<Arc<Tree>, Errno> {
        let NodeKind::Dir { tree: id, .. } = &dir.kind else {
            return Err(Errno::ENOTDIR);
        };
        self.tree_of(id)
    }

    /// The decoded tree `id`, from the cache or read now (and kept).
    fn tree_of(&self, id: &TreeId) -> Result<Arc<Tree>, Errno> {
        if let Some(t) = lock(&self.trees).get(id) {
            return Ok(t);
        }
        let t = Arc::new(
            self.store
                .tree(id)
                .map_err(|e| errno_of_store("read tree", &e))?,
        );
        lock(&self.trees).insert(*id, Arc::clone(&t));
        Ok(t)
    }

    /// The snapshot, path, link count and key of `entry` in `dir`.
    fn child_key(
        &self,
        dir: &Node,
        entry: &Entry,
    ) -> Result<(SnapshotId, Vec<u8>, u32, InodeKey), Errno> {
        let NodeKind::Dir { snapshot, path, .. } = &dir.kind else {
            unreachable!("entries are only listed in snapshot directories")
        };
        if !self.xattrs && !entry.xattrs.is_empty() {
            // The snapshot's marker said it has none: a wrong marker, never served.
            tracing::error!(snapshot = %snapshot.to_hex(), "an entry with xattrs in the plain view");
            return Err(Errno::EIO);
        }
        let path = child_path(path, &entry.name);
        let nlink = match entry.kind {
            Kind::File => self.link_counts(snapshot)?.get(&path).copied().unwrap_or(1),
            Kind::Hardlink => self
                .link_counts(snapshot)?
                .get(&entry.data)
                .copied()
                .unwrap_or(1),
            Kind::Symlink => match entry.link_group() {
                Some(g) => self
                    .link_counts(snapshot)?
                    .get(&symlink_slot(&g))
                    .copied()
                    .unwrap_or(1),
                None => 1,
            },
            _ => 1,
        };
        let key = InodeKey::of_linked_entry(snapshot, &path, entry, nlink);
        Ok((*snapshot, path, nlink, key))
    }

    /// Takes one lookup on the node of `entry` in `dir`.
    pub fn acquire_child(&self, dir: &Node, entry: &Entry) -> Result<Arc<Node>, Errno> {
        let (snapshot, path, nlink, key) = self.child_key(dir, entry)?;
        let dir_links = match entry.subtree() {
            Some(id) if entry.kind == Kind::Dir => Some(self.dir_links(&id)?),
            _ => None,
        };
        self.table
            .acquire(&key, |ino, digest| {
                let mut n = Node::of_entry(ino, digest, &snapshot, &path, dir.ino, entry, nlink);
                if let Some(l) = dir_links {
                    n.nlink = l;
                }
                n
            })
            .map_err(|_| {
                tracing::error!(ino = key.ino(0), "no free inode number after rehashing");
                Errno::EIO
            })
    }

    /// The number `entry` in `dir` has (or would get), without taking a lookup.
    pub fn peek_child(&self, dir: &Node, entry: &Entry) -> Result<u64, Errno> {
        let (_, _, _, key) = self.child_key(dir, entry)?;
        Ok(self.table.peek(&key))
    }

    /// Drops `n` lookups of `ino` (the root is never forgotten).
    pub fn forget(&self, ino: u64, n: u64) {
        if ino != ROOT_INO {
            self.table.forget(ino, n);
        }
    }

    /// The attributes of a node: a function of the node and the configured owner only.
    pub fn attr(&self, node: &Node) -> Attr {
        let t = UNIX_EPOCH + Duration::from_secs(VIEW_TIME_SECS + node.time_offset);
        let (kind, rdev) = match &node.kind {
            NodeKind::Root | NodeKind::Dir { .. } => (FileKind::Directory, 0),
            NodeKind::File { .. } => (FileKind::RegularFile, 0),
            NodeKind::Symlink { .. } => (FileKind::Symlink, 0),
            NodeKind::Fifo => (FileKind::NamedPipe, 0),
            NodeKind::CharDevice { rdev } => (FileKind::CharDevice, *rdev),
            NodeKind::BlockDevice { rdev } => (FileKind::BlockDevice, *rdev),
        };
        Attr {
            ino: node.ino,
            size: node.size,
            blocks: node.size.div_ceil(512),
            atime: t,
            mtime: t,
            ctime: t,
            kind,
            perm: (node.mode & 0o7777) as u16,
            nlink: match node.kind {
                // The mount root: the snapshots are not counted.
                NodeKind::Root => 2,
                _ => node.nlink,
            },
            uid: self.uid,
            gid: self.gid,
            // glibc's dev_t keeps the kernel's 32-bit encoding in its low bits for every
            // major < 4096 and minor < 2^20, which is what FUSE carries.
            rdev: rdev as u32,
            blksize: VIEW_BLKSIZE_BYTES,
        }
    }

    /// Opens the blob-cache file of `content` for reading, materialising it first if this
    /// daemon has not yet. A blob file is complete and verified whenever it exists
    /// (it appears by rename), so a known one is opened directly.
    pub fn open_blob(&self, content: &ContentId) -> Result<File, Errno> {
        use crate::blobfiles::OpenBlobError;
        self.ensured
            .open(&self.store, content, None)
            .map_err(|e| match e {
                OpenBlobError::Store(e) => errno_of_store("materialise blob", &e),
                OpenBlobError::Io(e) => errno_of_blob_io("open blob", e),
            })
    }

    /// The chunks of a large file whose content is still partly on a remote: its reads
    /// are served from the chunks they cover, fetched as read, instead of bringing the
    /// whole file into the blob cache at its open. `None` for everything else.
    pub fn remote_chunks(&self, content: &ContentId) -> Result<Option<Arc<Chunked>>, Errno> {
        // The common case, a root with no remote: nothing to look up.
        if !self.store.has_remote_objects().unwrap_or(false) {
            return Ok(None);
        }
        let chunks = self
            .store
            .content_chunks(content)
            .map_err(|e| errno_of_store("read manifest", &e))?;
        let size: u64 = chunks.iter().map(|(_, n)| u64::from(*n)).sum();
        if size < RANGE_READ_MIN_BYTES
            || !self
                .store
                .has_remote_only(&chunks)
                .map_err(|e| errno_of_store("look up chunks", &e))?
        {
            return Ok(None);
        }
        let mut starts = Vec::with_capacity(chunks.len());
        let mut at = 0u64;
        for (_, n) in &chunks {
            starts.push(at);
            at += u64::from(*n);
        }
        Ok(Some(Arc::new(Chunked {
            chunks,
            starts,
            size,
            next: u64::MAX.into(),
            window: 0.into(),
        })))
    }

    /// Reads `size` bytes at `offset` of a [`Chunked`] file: the chunks covering the
    /// range are fetched in one batch, each verified against its id.
    pub fn read_chunked(&self, c: &Chunked, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        if offset >= c.size {
            return Ok(Vec::new());
        }
        use std::sync::atomic::Ordering::Relaxed;
        let end = (offset + u64::from(size)).min(c.size);
        let window = if c.next.swap(end, Relaxed) == offset {
            let w = (c.window.load(Relaxed) * 2).clamp(256 * 1024, READ_AHEAD_MAX_BYTES);
            c.window.store(w, Relaxed);
            w
        } else {
            c.window.store(0, Relaxed);
            0
        };
        let first = c.starts.partition_point(|s| *s <= offset) - 1;
        let last = c.starts.partition_point(|s| *s < end);
        let ahead = c
            .starts
            .partition_point(|s| *s < (end + window).min(c.size));
        let ids: Vec<[u8; 32]> = c.chunks[first..ahead.max(last)]
            .iter()
            .map(|(id, _)| *id.as_bytes())
            .collect();
        self.store
            .fetch_objects(&ids)
            .map_err(|e| errno_of_store("fetch chunks", &e))?;
        let mut out = Vec::with_capacity((end - offset) as usize);
        for i in first..last {
            let data = self
                .store
                .chunk(&c.chunks[i].0)
                .map_err(|e| errno_of_store("read chunk", &e))?;
            let (s, e) = (c.starts[i], c.starts[i] + data.len() as u64);
            let from = offset.max(s) - s;
            let to = end.min(e) - s;
            out.extend_from_slice(&data[from as usize..to as usize]);
        }
        Ok(out)
    }

    /// Whether a time is the view's fixed time (for tests).
    #[cfg(test)]
    pub fn is_view_time(t: std::time::SystemTime) -> bool {
        t == UNIX_EPOCH + Duration::from_secs(VIEW_TIME_SECS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cowspace_store::{ImportOptions, StoreConfig};

    fn store_with(files: &[(&str, &str)]) -> (tempfile::TempDir, Arc<Store>, SnapshotId) {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        for (p, c) in files {
            let p = src.join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, c).unwrap();
        }
        std::fs::create_dir_all(&src).unwrap();
        let store = Store::init(&tmp.path().join("root"), StoreConfig::default()).unwrap();
        let r = store.import_dir(&src, &ImportOptions::new()).unwrap();
        (tmp, Arc::new(store), r.snapshot)
    }

    #[test]
    fn lookups_resolve_lazily_and_forget_empties_the_table() {
        let (_tmp, store, snap) = store_with(&[("a/b.txt", "hello"), ("c", "x")]);
        let core = ViewCore::new(store, 0, 0, true);
        assert_eq!(
            core.table.len(),
            0,
            "nothing is loaded before the kernel asks"
        );
        let root = core
            .lookup(ROOT_INO, snap.to_hex().as_bytes())
            .unwrap()
            .unwrap();
        let a = core.lookup(root.ino, b"a").unwrap().unwrap();
        let b = core.lookup(a.ino, b"b.txt").unwrap().unwrap();
        assert!(core.lookup(a.ino, b"nope").unwrap().is_none());
        assert_eq!(core.lookup(b.ino, b"x").unwrap_err(), Errno::ENOTDIR);
        let attr = core.attr(&b);
        assert_eq!(attr.size, 5);
        assert!(ViewCore::is_view_time(attr.mtime));
        assert_eq!(core.table.len(), 3);
        for n in [&b, &a, &root] {
            core.forget(n.ino, 1);
        }
        assert_eq!(core.table.len(), 0);
    }

    #[test]
    fn unknown_and_malformed_snapshots_are_enoent() {
        let (_tmp, store, snap) = store_with(&[("a", "1")]);
        let core = ViewCore::new(store, 0, 0, true);
        let zero = "0".repeat(64);
        for name in [zero.as_str(), "abc", "", &snap.to_hex().to_uppercase()] {
            assert_eq!(
                core.lookup(ROOT_INO, name.as_bytes()).unwrap_err(),
                Errno::ENOENT
            );
        }
    }

    #[test]
    fn numbers_do_not_depend_on_the_daemon_instance() {
        let (_tmp, store, snap) = store_with(&[("d/f", "same")]);
        let ino = |core: &ViewCore| {
            let r = core
                .lookup(ROOT_INO, snap.to_hex().as_bytes())
                .unwrap()
                .unwrap();
            let d = core.lookup(r.ino, b"d").unwrap().unwrap();
            let f = core.lookup(d.ino, b"f").unwrap().unwrap();
            (r.ino, d.ino, f.ino)
        };
        let a = ino(&ViewCore::new(Arc::clone(&store), 0, 0, true));
        let b = ino(&ViewCore::new(store, 1, 1, true));
        assert_eq!(a, b);
    }

    #[test]
    fn a_blob_is_opened_from_the_cache() {
        use std::io::Read;
        let (_tmp, store, snap) = store_with(&[("f", "contents")]);
        let core = ViewCore::new(store, 0, 0, true);
        let r = core
            .lookup(ROOT_INO, snap.to_hex().as_bytes())
            .unwrap()
            .unwrap();
        let f = core.lookup(r.ino, b"f").unwrap().unwrap();
        let NodeKind::File { content } = &f.kind else {
            panic!()
        };
        for _ in 0..2 {
            let mut s = String::new();
            core.open_blob(content)
                .unwrap()
                .read_to_string(&mut s)
                .unwrap();
            assert_eq!(s, "contents");
        }
    }
}
