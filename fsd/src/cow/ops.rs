//! The writable view of one workspace, independent of the FUSE wire: the state every
//! operation shares (the layers, the held inodes, the namespace and copy-up locks, the
//! decoded snapshot trees, the listings kept) and the listings themselves. The
//! operations are in `resolve.rs` (names and attributes), `copyup.rs`, `namespace.rs`
//! (make and remove) and `rename.rs`.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::filesystem::{Errno, FileKind};
use cowspace_store::{Tree, TreeId};

use super::fdio::{fd_path, open_path};
use super::layers::{Layers, is_opaque};
use super::lazy::Lazy;
use super::listing::{Listed, Listing, Listings, NamesChange, merged};
use super::node::{Node, ROOT_INO, Table};
use crate::filesystem::{errno_of_store, lock};

/// Decoded snapshot trees kept (cleared when full).
const MAX_CACHED_TREES: usize = 1024;

/// Every name of each hard-linked file of the snapshot (sorted), by each of its names;
/// files with one name are not listed.
pub(super) type Groups = HashMap<Vec<u8>, Vec<Vec<u8>>>;

/// The writable view of one workspace.
pub struct Cow {
    pub layers: Layers,
    pub table: Table,
    /// Held for writing by operations that move or delete names (unlink, rmdir, rename),
    /// for reading by everything that resolves paths.
    pub ns: RwLock<()>,
    /// Serialises copy-ups (two would race to rename into one place).
    pub(super) copy: Mutex<()>,
    trees: Mutex<HashMap<TreeId, Arc<Tree>>>,
    /// Large files being copied up (`lazy/`): their I/O goes through the daemon.
    pub lazy: Arc<Lazy>,
    /// Listings lately read, and the count of the changes that make them stale.
    listings: Listings,
    /// The snapshot's hard-link groups, found at the first need (a walk of the snapshot,
    /// only when it has hard links at all).
    pub(super) groups: OnceLock<Arc<Groups>>,
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
            listings: Listings::default(),
            groups: OnceLock::new(),
        }
    }

    /// [`Cow::ns`] held for reading (taken over if a panic poisoned it: every holder
    /// leaves the namespace consistent at each step).
    pub(super) fn ns_read(&self) -> RwLockReadGuard<'_, ()> {
        self.ns.read().unwrap_or_else(|p| p.into_inner())
    }

    /// [`Cow::ns`] held for writing.
    pub(super) fn ns_write(&self) -> RwLockWriteGuard<'_, ()> {
        self.ns.write().unwrap_or_else(|p| p.into_inner())
    }

    /// A change of names or of the upper layer, counted when the guard drops: listings
    /// kept from before it are stale then.
    pub(super) fn names_change(&self) -> NamesChange<'_> {
        self.listings.change()
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
                .map_err(|e| errno_of_store("read tree", &e))?,
        );
        let mut trees = lock(&self.trees);
        if trees.len() >= MAX_CACHED_TREES {
            trees.clear();
        }
        trees.insert(*id, Arc::clone(&t));
        Ok(t)
    }

    /// Directory `dir`'s listing in cookie order: kept from a read since which no name
    /// changed, else taken now.
    pub fn listing(&self, dir: &Node) -> Result<Arc<Listing>, Errno> {
        self.listings.get(dir.ino, || self.list(dir))
    }

    /// The merged listing of directory `dir`, sorted by name.
    pub fn list(&self, dir: &Node) -> Result<Vec<Listed>, Errno> {
        let _r = self.ns_read();
        self.list_at(dir)
    }

    /// [`Cow::list`] under the namespace lock the caller holds.
    pub(super) fn list_at(&self, dir: &Node) -> Result<Vec<Listed>, Errno> {
        let tree = match &dir.lower_tree {
            Some(id) => Some(self.tree(id)?),
            None => None,
        };
        merged(dir.upper.as_deref(), tree.as_deref())
    }

    /// The upper path reaching `node`'s object (it must have one).
    pub fn upper_of(&self, node: &Node) -> Result<PathBuf, Errno> {
        node.upper
            .as_ref()
            .map(|fd| fd_path(fd.as_ref()))
            .ok_or(Errno::EIO)
    }
}

/// The root of a workspace as a node: always in the upper layer.
pub fn root_node(layers: &Layers, root_tree: TreeId) -> io::Result<Node> {
    let up: &Path = &layers.upper;
    Ok(Node {
        ino: ROOT_INO,
        kind: FileKind::Directory,
        parent: ROOT_INO,
        name: Arc::from(&[][..]),
        lower: None,
        lower_tree: (!is_opaque(up)).then(|| Arc::new(root_tree)),
        upper: Some(Arc::new(open_path(up)?)),
        deleted: false,
        lower_secs: 0,
    })
}
