//! The inodes the kernel holds in one workspace, with their lookup counts, and nothing
//! else: the table shrinks as the kernel forgets (see the lifetime rules in `mod.rs`).

use std::collections::HashMap;
use std::collections::hash_map::Entry as MapEntry;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::filesystem::{Errno, FileKind};
use cowspace_store::{Entry, Kind, TreeId};

/// The mount root's inode number (fixed by FUSE).
pub const ROOT_INO: u64 = 1;

/// Longest chain of parents walked to make a path (deeper is a loop: a bug).
const MAX_DEPTH: usize = 4096;

/// One inode of the workspace.
#[derive(Clone, Debug)]
pub struct Node {
    pub ino: u64,
    pub kind: FileKind,
    /// Where the node was last seen: its directory and name. Directories have exactly
    /// one; a hard-linked file keeps the last name it was reached by (its operations go
    /// through `upper`, never through this name).
    pub parent: u64,
    /// Shared, not copied, by the clones every operation takes.
    pub name: Arc<[u8]>,
    /// The snapshot entry the node shows while it has no upper object.
    pub lower: Option<Lower>,
    /// Directories: the snapshot directory merged beneath (none when opaque or new).
    /// (Behind a pointer: most nodes are files, which have none.)
    pub lower_tree: Option<Arc<TreeId>>,
    /// The upper object (an `O_PATH` descriptor), once there is one.
    pub upper: Option<Arc<OwnedFd>>,
    /// A snapshot-only node whose name was deleted: it may no longer be copied up.
    pub deleted: bool,
    /// Snapshot entries: the time they are served with (seconds since the epoch).
    pub lower_secs: u64,
}

/// A snapshot entry as a node keeps it: what attributes and reads need, in place; the
/// rest (a symlink's target, a device number, a hard link's path, xattrs), which few
/// entries have, behind a pointer. (A copy of the whole entry per node was half of a
/// fuse workspace's memory after a walk.)
#[derive(Clone, Debug)]
pub struct Lower {
    pub kind: Kind,
    /// Permission bits (`0o7777`).
    pub mode: u32,
    pub size: u64,
    /// Content id (files, hard links), subtree id (directories) or link group key (a
    /// symlink with several names).
    pub hash: [u8; 32],
    /// The whole entry, when it has data or xattrs.
    rest: Option<Arc<Entry>>,
}

impl Lower {
    pub fn of(e: Entry) -> Lower {
        Lower {
            kind: e.kind,
            mode: e.mode,
            size: e.size,
            hash: e.hash,
            rest: (!e.data.is_empty() || !e.xattrs.is_empty()).then(|| Arc::new(e)),
        }
    }

    /// Symlink target, hard-link primary path, or device number.
    pub fn data(&self) -> &[u8] {
        self.rest.as_deref().map_or(&[], |e| &e.data)
    }

    /// The link group of a symlink with several names ([`Entry::link_group`]).
    pub fn link_group(&self) -> Option<[u8; 32]> {
        (self.kind == Kind::Symlink && self.hash != [0; 32]).then_some(self.hash)
    }

    /// Extended attributes, sorted by name.
    pub fn xattrs(&self) -> &[(Vec<u8>, Vec<u8>)] {
        self.rest.as_deref().map_or(&[], |e| &e.xattrs)
    }

    /// The device number of a device node.
    pub fn rdev(&self) -> Option<u64> {
        self.rest.as_deref().and_then(Entry::rdev)
    }

    /// The whole entry, named `name`.
    pub fn entry(&self, name: &[u8]) -> Entry {
        match &self.rest {
            Some(e) => Entry {
                name: name.to_vec(),
                ..(**e).clone()
            },
            None => Entry {
                name: name.to_vec(),
                kind: self.kind,
                mode: self.mode,
                size: self.size,
                hash: self.hash,
                data: Vec::new(),
                xattrs: Vec::new(),
            },
        }
    }
}

struct Slot {
    node: Node,
    lookups: u64,
}

/// Inode number -> node, for the inodes the kernel holds (the root always). Slots are
/// boxed: the map then keeps two words per bucket, its spare buckets included.
pub struct Table {
    map: Mutex<HashMap<u64, Box<Slot>>>,
}

impl Table {
    pub fn new(root: Node) -> Table {
        let mut map = HashMap::new();
        map.insert(
            ROOT_INO,
            Box::new(Slot {
                node: root,
                lookups: 1,
            }),
        );
        Table {
            map: Mutex::new(map),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Box<Slot>>> {
        // Every critical section is a single insert, update or remove.
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The node of `ino`; `ESTALE` when the kernel does not hold it.
    pub fn get(&self, ino: u64) -> Result<Node, Errno> {
        self.lock()
            .get(&ino)
            .map(|s| s.node.clone())
            .ok_or(Errno::from_i32(libc::ESTALE))
    }

    /// The node of `ino` if held.
    pub fn find(&self, ino: u64) -> Option<Node> {
        self.lock().get(&ino).map(|s| s.node.clone())
    }

    /// Takes one lookup on `node` (by its number). A node already held keeps its state
    /// but learns the name it was reached by and an upper object it did not know.
    pub fn acquire(&self, node: Node) -> Node {
        let mut map = self.lock();
        match map.entry(node.ino) {
            MapEntry::Occupied(mut o) => {
                let slot = o.get_mut();
                slot.lookups += 1;
                let held = &mut slot.node;
                if held.kind != node.kind {
                    // The number now names another object (a number reused by the upper
                    // filesystem after the old one was deleted): the new one wins.
                    *held = node;
                } else {
                    held.parent = node.parent;
                    held.name = node.name;
                    if held.upper.is_none() && node.upper.is_some() {
                        held.upper = node.upper;
                        held.deleted = false;
                    }
                }
                held.clone()
            }
            MapEntry::Vacant(v) => {
                v.insert(Box::new(Slot {
                    node: node.clone(),
                    lookups: 1,
                }));
                node
            }
        }
    }

    /// Changes the held node `ino` (nothing when not held).
    pub fn update(&self, ino: u64, f: impl FnOnce(&mut Node)) {
        if let Some(s) = self.lock().get_mut(&ino) {
            f(&mut s.node);
        }
    }

    /// Drops `n` lookups of `ino`; at zero the node leaves the table (never the root).
    pub fn forget(&self, ino: u64, n: u64) {
        if ino == ROOT_INO {
            return;
        }
        let mut map = self.lock();
        if let MapEntry::Occupied(mut o) = map.entry(ino) {
            if o.get().lookups <= n {
                o.remove();
            } else {
                o.get_mut().lookups -= n;
            }
        }
    }

    /// The held nodes beneath directory `ino` (not `ino` itself), each after its parent.
    pub fn beneath(&self, ino: u64) -> Vec<Node> {
        let map = self.lock();
        let mut found: Vec<(usize, Node)> = Vec::new();
        for slot in map.values() {
            let mut cur = &slot.node;
            for depth in 0..MAX_DEPTH {
                if cur.ino == ROOT_INO {
                    break;
                }
                if cur.parent == ino {
                    found.push((depth, slot.node.clone()));
                    break;
                }
                cur = match map.get(&cur.parent) {
                    Some(s) => &s.node,
                    None => break,
                };
            }
        }
        found.sort_by_key(|(depth, _)| *depth);
        found.into_iter().map(|(_, n)| n).collect()
    }

    /// Inodes held, the root included (never 0).
    pub fn held(&self) -> usize {
        self.lock().len()
    }

    /// The path of `node` from the workspace root (`/`-joined; empty for the root).
    pub fn path_of(&self, node: &Node) -> Result<Vec<u8>, Errno> {
        let map = self.lock();
        let mut parts: Vec<&[u8]> = Vec::new();
        let mut cur = node;
        for _ in 0..MAX_DEPTH {
            if cur.ino == ROOT_INO {
                let mut p = Vec::new();
                for (i, part) in parts.iter().rev().enumerate() {
                    if i > 0 {
                        p.push(b'/');
                    }
                    p.extend_from_slice(part);
                }
                return Ok(p);
            }
            parts.push(&cur.name[..]);
            cur = match map.get(&cur.parent) {
                Some(s) => &s.node,
                None => {
                    tracing::warn!(ino = node.ino, "a parent of a held inode is not held");
                    return Err(Errno::from_i32(libc::ESTALE));
                }
            };
        }
        tracing::error!(ino = node.ino, "parent chain too deep (a loop?)");
        Err(Errno::EIO)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(ino: u64, parent: u64, name: &str, kind: FileKind) -> Node {
        Node {
            ino,
            kind,
            parent,
            name: name.as_bytes().into(),
            lower: None,
            lower_tree: None,
            upper: None,
            deleted: false,
            lower_secs: 0,
        }
    }

    #[test]
    fn lookups_count_and_paths_follow_parents() {
        let t = Table::new(node(ROOT_INO, ROOT_INO, "", FileKind::Directory));
        t.acquire(node(2, ROOT_INO, "a", FileKind::Directory));
        t.acquire(node(3, 2, "b", FileKind::RegularFile));
        t.acquire(node(3, 2, "c", FileKind::RegularFile));
        let n = t.get(3).unwrap();
        assert_eq!(t.path_of(&n).unwrap(), b"a/c");
        assert_eq!(t.path_of(&t.get(ROOT_INO).unwrap()).unwrap(), b"");
        t.forget(3, 1);
        assert!(t.find(3).is_some());
        t.forget(3, 1);
        assert!(t.find(3).is_none());
        assert_eq!(t.get(3).unwrap_err(), Errno::from_i32(libc::ESTALE));
        t.forget(ROOT_INO, 100);
        assert_eq!(t.held(), 2);
    }

    #[test]
    fn beneath_gives_descendants_parents_first() {
        let t = Table::new(node(ROOT_INO, ROOT_INO, "", FileKind::Directory));
        t.acquire(node(4, 3, "f", FileKind::RegularFile));
        t.acquire(node(3, 2, "sub", FileKind::Directory));
        t.acquire(node(2, ROOT_INO, "d", FileKind::Directory));
        t.acquire(node(5, ROOT_INO, "other", FileKind::RegularFile));
        let inos: Vec<u64> = t.beneath(2).iter().map(|n| n.ino).collect();
        assert_eq!(inos, [3, 4]);
        assert!(t.beneath(4).is_empty());
        let mut all: Vec<u64> = t.beneath(ROOT_INO).iter().map(|n| n.ino).collect();
        all.sort();
        assert_eq!(all, [2, 3, 4, 5]);
    }

    #[test]
    fn a_reused_number_of_another_kind_replaces_the_node() {
        let t = Table::new(node(ROOT_INO, ROOT_INO, "", FileKind::Directory));
        t.acquire(node(5, ROOT_INO, "x", FileKind::RegularFile));
        let n = t.acquire(node(5, ROOT_INO, "y", FileKind::Directory));
        assert_eq!(n.kind, FileKind::Directory);
        assert_eq!(&*t.get(5).unwrap().name, b"y");
    }
}
