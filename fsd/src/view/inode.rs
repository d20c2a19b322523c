//! Stable inode numbers and the table of inodes the kernel currently holds.
//!
//! An inode number is a pure function of what an entry *is* (see [`InodeKey`]), so the
//! same file gets the same number in every mount of the view, across daemon restarts,
//! and in every snapshot that holds it unchanged at the same path. The table only maps
//! numbers the kernel has been told about (and not yet forgotten) to their nodes.

use std::collections::HashMap;
use std::collections::hash_map::Entry as MapEntry;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use cowspace_store::{ContentId, Entry, Kind, SnapshotId, TreeId};

pub use cowspace::served::{INO_CONTEXT, INO_LIMIT, InodeKey, ROOT_INO, time_offset};

/// How many salted rehashes are tried before a collision is given up on. Reaching it
/// needs ~64 distinct live entries on one 48-bit number: a bug, not bad luck.
const MAX_INO_SALTS: u32 = 64;

/// What a node is, with what its operations need.
#[derive(Debug, Clone)]
pub enum NodeKind {
    /// The mount root: snapshots appear under it by id.
    Root,
    /// A directory of a snapshot; `path` is from the snapshot root (empty for the root).
    Dir {
        snapshot: SnapshotId,
        tree: TreeId,
        path: Vec<u8>,
        parent: u64,
    },
    File {
        content: ContentId,
    },
    Symlink {
        target: Vec<u8>,
    },
    Fifo,
    CharDevice {
        rdev: u64,
    },
    BlockDevice {
        rdev: u64,
    },
}

/// One inode of the view. Immutable: snapshots never change.
#[derive(Debug)]
pub struct Node {
    pub ino: u64,
    /// The key's identity, to tell a collision from a second lookup of the same entry.
    pub digest: [u8; 32],
    pub kind: NodeKind,
    /// Permission bits (`0o7777`).
    pub mode: u32,
    pub size: u64,
    /// Names of a regular file in its snapshot (hard links); 1 for other non-directories.
    pub nlink: u32,
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// Seconds added to the view's fixed time: 1 for a git index (see [`time_offset`]).
    pub time_offset: u64,
}

impl Node {
    /// The mount root.
    pub fn root() -> Node {
        Node {
            ino: ROOT_INO,
            digest: [0; 32],
            kind: NodeKind::Root,
            mode: 0o555,
            size: 0,
            nlink: 1,
            xattrs: Vec::new(),
            time_offset: 0,
        }
    }

    /// The node of `entry`, found at `path` in `snapshot` in the directory `parent`; a
    /// file (or symlink) with `nlink` names there.
    pub fn of_entry(
        ino: u64,
        digest: [u8; 32],
        snapshot: &SnapshotId,
        path: &[u8],
        parent: u64,
        entry: &Entry,
        nlink: u32,
    ) -> Node {
        let kind = match entry.kind {
            Kind::Dir => NodeKind::Dir {
                snapshot: *snapshot,
                tree: TreeId::from_bytes(entry.hash),
                path: path.to_vec(),
                parent,
            },
            Kind::File | Kind::Hardlink => NodeKind::File {
                content: ContentId::from_bytes(entry.hash),
            },
            Kind::Symlink => NodeKind::Symlink {
                target: entry.data.clone(),
            },
            Kind::Fifo => NodeKind::Fifo,
            Kind::CharDevice => NodeKind::CharDevice {
                rdev: entry.rdev().unwrap_or(0),
            },
            Kind::BlockDevice => NodeKind::BlockDevice {
                rdev: entry.rdev().unwrap_or(0),
            },
        };
        Node {
            ino,
            digest,
            kind,
            mode: entry.mode & 0o7777,
            size: entry.size,
            // Files and symlinks may have several names.
            nlink: if entry.kind.has_content() || entry.kind == Kind::Symlink {
                nlink
            } else {
                1
            },
            xattrs: entry.xattrs.clone(),
            time_offset: if entry.kind.has_content() {
                time_offset(path)
            } else {
                0
            },
        }
    }
}

pub use cowspace_store::tree::join_path as child_path;

struct Slot {
    node: Arc<Node>,
    /// Lookups the kernel holds: +1 per entry replied, -n per forget.
    lookups: u64,
}

/// The nodes the kernel holds, by inode number. The root is not in it (never forgotten).
#[derive(Default)]
pub struct InodeTable {
    map: Mutex<HashMap<u64, Slot>>,
    collisions: AtomicU64,
}

/// Failure to place a key: too many collisions (a bug, reported as EIO).
#[derive(Debug)]
pub struct SaltsExhausted;

impl InodeTable {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Slot>> {
        // A panic while holding the lock leaves the map consistent (single inserts and
        // removes), so a poisoned lock is still usable.
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The node of `ino`, if the kernel holds it.
    pub fn get(&self, ino: u64) -> Option<Arc<Node>> {
        self.lock().get(&ino).map(|s| Arc::clone(&s.node))
    }

    /// The number `key` has or would get now, without taking a lookup (for readdir).
    pub fn peek(&self, key: &InodeKey) -> u64 {
        let digest = key.digest();
        let map = self.lock();
        for salt in 0..MAX_INO_SALTS {
            let ino = key.ino(salt);
            match map.get(&ino) {
                Some(slot) if slot.node.digest != digest => continue,
                _ => return ino,
            }
        }
        key.ino(0)
    }

    /// Takes one lookup on the node of `key`, making it with `make(ino, digest)` when the
    /// kernel does not hold it yet.
    pub fn acquire(
        &self,
        key: &InodeKey,
        make: impl FnOnce(u64, [u8; 32]) -> Node,
    ) -> Result<Arc<Node>, SaltsExhausted> {
        let digest = key.digest();
        let mut map = self.lock();
        for salt in 0..MAX_INO_SALTS {
            let ino = key.ino(salt);
            match map.entry(ino) {
                MapEntry::Occupied(mut o) => {
                    let slot = o.get_mut();
                    if slot.node.digest == digest {
                        slot.lookups += 1;
                        return Ok(Arc::clone(&slot.node));
                    }
                    self.collisions.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        ino,
                        salt,
                        "inode number collision between different entries; rehashing with a salt"
                    );
                }
                MapEntry::Vacant(v) => {
                    let node = Arc::new(make(ino, digest));
                    debug_assert_eq!(node.ino, ino);
                    v.insert(Slot {
                        node: Arc::clone(&node),
                        lookups: 1,
                    });
                    return Ok(node);
                }
            }
        }
        Err(SaltsExhausted)
    }

    /// Drops `n` lookups of `ino`; the node leaves the table at zero.
    pub fn forget(&self, ino: u64, n: u64) {
        let mut map = self.lock();
        if let MapEntry::Occupied(mut o) = map.entry(ino) {
            let slot = o.get_mut();
            if slot.lookups <= n {
                if slot.lookups < n {
                    tracing::warn!(
                        ino,
                        held = slot.lookups,
                        n,
                        "forget of more lookups than given"
                    );
                }
                o.remove();
            } else {
                slot.lookups -= n;
            }
        }
    }

    /// Inodes held (the root not counted).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Collisions met so far (each one rehashed).
    pub fn collisions(&self) -> u64 {
        self.collisions.load(Ordering::Relaxed)
    }

    /// Lookups held on `ino` (0 when absent).
    #[cfg(test)]
    pub fn lookups(&self, ino: u64) -> u64 {
        self.lock().get(&ino).map_or(0, |s| s.lookups)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key of its own for each `n` (the table does not care what it keys).
    fn key(n: u8) -> InodeKey {
        InodeKey::of_snapshot_root(
            &SnapshotId::from_bytes([n; 32]),
            &TreeId::from_bytes([n; 32]),
            0o755,
        )
    }

    fn make(ino: u64, digest: [u8; 32]) -> Node {
        Node {
            ino,
            digest,
            kind: NodeKind::Fifo,
            mode: 0o644,
            size: 0,
            nlink: 1,
            xattrs: Vec::new(),
            time_offset: 0,
        }
    }

    #[test]
    fn lookups_are_counted_and_forget_drops_at_zero() {
        let t = InodeTable::default();
        let k = key(1);
        let n = t.acquire(&k, make).unwrap();
        assert_eq!(t.acquire(&k, make).unwrap().ino, n.ino);
        assert_eq!(t.lookups(n.ino), 2);
        assert_eq!(t.peek(&k), n.ino);
        t.forget(n.ino, 1);
        assert_eq!(t.len(), 1);
        t.forget(n.ino, 1);
        assert_eq!(t.len(), 0);
        assert!(t.get(n.ino).is_none());
        t.forget(n.ino, 1); // forgetting the unknown is harmless
    }

    #[test]
    fn a_collision_is_rehashed_with_a_salt() {
        let t = InodeTable::default();
        let k1 = key(1);
        let k2 = key(2);
        t.acquire(&k1, make).unwrap();
        // Occupy k2's salt-0 number with a node of another identity.
        t.lock().insert(
            k2.ino(0),
            Slot {
                node: Arc::new(make(k2.ino(0), [0xee; 32])),
                lookups: 1,
            },
        );
        let n = t.acquire(&k2, make).unwrap();
        assert_eq!(n.ino, k2.ino(1));
        assert_eq!(t.peek(&k2), k2.ino(1));
        assert_eq!(t.collisions(), 1);
    }
}
