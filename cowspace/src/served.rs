//! What the daemon serves a snapshot's files as, in every view, every workspace and every
//! daemon run: stable inode numbers, fixed times, the root's owner. Imports use it to make
//! a checkout's `.git/index` agree with what workspaces show; the FUSE servers number
//! their inodes with it.

use std::path::Path;

use cowspace_store::{Entry, Kind, SnapshotId, TreeId};

use crate::error::{Error, Result};

/// The source a fuse workspace's mount carries: this prefix, then its private directory.
pub const WS_SOURCE_PREFIX: &str = "cowspace:";
/// The FUSE subtype of workspace mounts (`fuse.cowspace-ws` in the mount table).
pub const WS_SUBTYPE: &str = "cowspace-ws";

/// Every served file's mtime = ctime = atime (plus [`time_offset`]).
pub const VIEW_TIME_SECS: u64 = 1_000_000_000;

/// The BLAKE3 derive-key context of inode numbers (part of the view's stable ABI).
pub const INO_CONTEXT: &str = "cowspace view inode v1";

/// Inode numbers stay below this, so kernel overlayfs (xino) can add its layer bits.
pub const INO_LIMIT: u64 = 1 << 48;

/// The mount root's inode number (fixed by FUSE).
pub const ROOT_INO: u64 = 1;

/// Kind codes inside an inode key: the tree encoding's codes (docs/store-format.md).
fn kind_code(kind: Kind) -> u8 {
    match kind {
        Kind::Dir => 1,
        // A hard link is keyed as the file it names.
        Kind::File | Kind::Hardlink => 2,
        Kind::Symlink => 3,
        Kind::Fifo => 5,
        Kind::CharDevice => 6,
        Kind::BlockDevice => 7,
    }
}

/// The bytes an inode number is derived from:
///
/// ```text
/// key := [snapshot id (32), directories only] path 0x00 kind u32le:mode hash(32) data
/// ```
///
/// `path` is the entry's `/`-joined path from the snapshot root (empty for the root). A
/// hard link is keyed by its primary's path, as kind `file`, so every name of a link group
/// has one inode; a file with more than one name has its link count (`u32le`) as data
/// (the primary's own data is empty), because the kernel keeps one link count per inode
/// and the same file may have other names in another snapshot. Directories carry the
/// snapshot id because the kernel allows a directory inode only one parent. A symlink with
/// several names is keyed by an empty path and its link group's key as `hash`, with its
/// target and link count as data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InodeKey(Vec<u8>);

impl InodeKey {
    /// The key of `entry` found at `path` in `snapshot`, a file with one name.
    pub fn of_entry(snapshot: &SnapshotId, path: &[u8], entry: &Entry) -> InodeKey {
        Self::of_linked_entry(snapshot, path, entry, 1)
    }

    /// The key of `entry` found at `path` in `snapshot`, whose file (a regular file or a
    /// hard link) has `nlink` names in the snapshot.
    pub fn of_linked_entry(
        snapshot: &SnapshotId,
        path: &[u8],
        entry: &Entry,
        nlink: u32,
    ) -> InodeKey {
        let links = nlink.to_le_bytes();
        let linked: &[u8] = if nlink > 1 { &links } else { &[] };
        match entry.kind {
            Kind::Dir => Self::build(
                Some(snapshot),
                path,
                Kind::Dir,
                entry.mode,
                &entry.hash,
                &[],
            ),
            Kind::Hardlink => Self::build(
                None,
                &entry.data,
                Kind::File,
                entry.mode,
                &entry.hash,
                linked,
            ),
            Kind::File => Self::build(None, path, Kind::File, entry.mode, &entry.hash, linked),
            // Every name of a multiply-linked symlink: keyed by its group (whose key is
            // derived from the first name's path), not by the name's own path.
            Kind::Symlink if entry.link_group().is_some() => Self::build(
                None,
                b"",
                Kind::Symlink,
                entry.mode,
                &entry.hash,
                &[&entry.data[..], linked].concat(),
            ),
            kind => Self::build(None, path, kind, entry.mode, &entry.hash, &entry.data),
        }
    }

    /// The key of a snapshot's root directory.
    pub fn of_snapshot_root(snapshot: &SnapshotId, root: &TreeId, mode: u32) -> InodeKey {
        Self::build(Some(snapshot), b"", Kind::Dir, mode, root.as_bytes(), &[])
    }

    fn build(
        snapshot: Option<&SnapshotId>,
        path: &[u8],
        kind: Kind,
        mode: u32,
        hash: &[u8; 32],
        data: &[u8],
    ) -> InodeKey {
        let mut k = Vec::with_capacity(32 + path.len() + 1 + 1 + 4 + 32 + data.len());
        if let Some(s) = snapshot {
            k.extend_from_slice(s.as_bytes());
        }
        k.extend_from_slice(path);
        k.push(0);
        k.push(kind_code(kind));
        k.extend_from_slice(&mode.to_le_bytes());
        k.extend_from_slice(hash);
        k.extend_from_slice(data);
        InodeKey(k)
    }

    /// The identity of the key: the full 32-byte derived key (salt 0).
    pub fn digest(&self) -> [u8; 32] {
        blake3::derive_key(INO_CONTEXT, &self.0)
    }

    /// The inode number for this key at `salt` (0 unless a collision forced a rehash).
    pub fn ino(&self, salt: u32) -> u64 {
        let d = if salt == 0 {
            self.digest()
        } else {
            let mut salted = self.0.clone();
            salted.extend_from_slice(&salt.to_le_bytes());
            blake3::derive_key(INO_CONTEXT, &salted)
        };
        ino_from_digest(&d)
    }
}

/// `2 + (first 8 bytes LE mod (2^48 - 2))`: never 0 (invalid) or 1 (the mount root).
fn ino_from_digest(d: &[u8; 32]) -> u64 {
    let [b0, b1, b2, b3, b4, b5, b6, b7, ..] = *d;
    2 + u64::from_le_bytes([b0, b1, b2, b3, b4, b5, b6, b7]) % (INO_LIMIT - 2)
}

/// What a node is, with what its operations need.
/// A git index (`.git/index`, at any depth) is served one second later than everything
/// else: git treats entries whose mtime is not older than the index file as "racily
/// clean" and re-reads them, which would make every first `git status` re-hash the tree.
pub fn time_offset(path: &[u8]) -> u64 {
    u64::from(path == b".git/index" || path.ends_with(b"/.git/index"))
}

/// The identity function imports use for a runtime root (`root`, whose owner the view
/// serves files as): [`served_file_stat`] with that owner.
pub fn served_identity(root: &Path) -> Result<cowspace_store::import::ServedIdentityFn> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(root).map_err(Error::io("stat", root))?;
    let (uid, gid) = (meta.uid(), meta.gid());
    Ok(std::sync::Arc::new(move |p: &[u8], e: &Entry| {
        served_file_stat(p, e, uid, gid)
    }))
}

/// The mtime (= ctime = atime) the view serves a file at `path` with.
pub fn served_time_secs(path: &[u8]) -> u64 {
    VIEW_TIME_SECS + time_offset(path)
}

/// What the view serves for the non-directory `entry` at `path` (`/`-joined from the
/// snapshot root), in every snapshot and daemon run (barring an inode collision, which
/// is logged): its inode number and times, and the owner `uid`/`gid`. A file with more
/// than one name (hard links) gets another number in the view (its link count is part of
/// its key), so git re-reads such a file once.
pub fn served_file_stat(
    path: &[u8],
    entry: &Entry,
    uid: u32,
    gid: u32,
) -> cowspace_store::import::gitindex::ServedStat {
    // A file's key does not involve the snapshot (only directories' do).
    let any_snapshot = SnapshotId::from_bytes([0; 32]);
    let ino = InodeKey::of_entry(&any_snapshot, path, entry).ino(0);
    let t = served_time_secs(path) as u32;
    cowspace_store::import::gitindex::ServedStat {
        ino,
        mtime_s: t,
        ctime_s: t,
        uid,
        gid,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, mode: u32, hash: u8) -> Entry {
        Entry {
            name: name.as_bytes().to_vec(),
            kind: Kind::File,
            mode,
            size: 3,
            hash: [hash; 32],
            data: Vec::new(),
            xattrs: Vec::new(),
        }
    }

    fn snap(b: u8) -> SnapshotId {
        SnapshotId::from_bytes([b; 32])
    }

    #[test]
    fn numbers_are_pinned_by_the_formula() {
        // The formula is an ABI across daemon restarts: recompute it by hand.
        let e = file("a", 0o644, 7);
        let mut k = b"dir/a\0\x02".to_vec();
        k.extend_from_slice(&0o644u32.to_le_bytes());
        k.extend_from_slice(&[7; 32]);
        let d = blake3::derive_key("cowspace view inode v1", &k);
        let want = 2 + u64::from_le_bytes(d[..8].try_into().unwrap()) % ((1 << 48) - 2);
        assert_eq!(InodeKey::of_entry(&snap(1), b"dir/a", &e).ino(0), want);
    }

    #[test]
    fn files_ignore_the_snapshot_and_directories_do_not() {
        let e = file("a", 0o644, 7);
        assert_eq!(
            InodeKey::of_entry(&snap(1), b"a", &e),
            InodeKey::of_entry(&snap(2), b"a", &e)
        );
        let mut d = file("d", 0o755, 9);
        d.kind = Kind::Dir;
        assert_ne!(
            InodeKey::of_entry(&snap(1), b"d", &d),
            InodeKey::of_entry(&snap(2), b"d", &d)
        );
        // Path, mode and content each change the number.
        let k = InodeKey::of_entry(&snap(1), b"a", &e).ino(0);
        assert_ne!(k, InodeKey::of_entry(&snap(1), b"b", &e).ino(0));
        assert_ne!(
            k,
            InodeKey::of_entry(&snap(1), b"a", &file("a", 0o755, 7)).ino(0)
        );
        assert_ne!(
            k,
            InodeKey::of_entry(&snap(1), b"a", &file("a", 0o644, 8)).ino(0)
        );
    }

    #[test]
    fn a_hard_link_is_keyed_as_its_primary() {
        let primary = file("a", 0o644, 7);
        let mut link = file("b", 0o644, 7);
        link.kind = Kind::Hardlink;
        link.data = b"x/a".to_vec();
        assert_eq!(
            InodeKey::of_entry(&snap(1), b"x/a", &primary),
            InodeKey::of_entry(&snap(1), b"y/b", &link)
        );
    }

    #[test]
    fn numbers_stay_in_range() {
        for i in 0..10_000u32 {
            let e = file(&i.to_string(), 0o644, (i % 251) as u8);
            let ino = InodeKey::of_entry(&snap(1), &i.to_le_bytes(), &e).ino(i % 3);
            assert!((2..INO_LIMIT).contains(&ino), "{ino}");
        }
    }
}
