//! Trees: directories as sorted entries, canonically encoded and hashed (a Merkle tree).
//!
//! Encoding, version 1 or 2 (all integers little-endian):
//!
//! ```text
//! tree    := "CWTREE" u8:version u32:count entry*count
//! entry   := u16:name_len name u8:kind u32:mode u64:size [32]:hash
//!            u32:data_len data u16:xattr_count xattr*xattr_count
//! xattr   := u16:name_len name u32:value_len value
//! ```
//!
//! Invariants checked on decode (so one tree has exactly one encoding): names are
//! strictly ascending byte strings, non-empty, at most [`MAX_NAME_BYTES`], without `/`
//! or NUL and not `.` or `..`; xattrs are strictly ascending by name; `hash` is all zero
//! for kinds without content; `data` is the symlink target, the hard link's primary path
//! (root-relative, `/`-separated) or a device's 8-byte `rdev`, and empty otherwise; mode
//! holds only permission bits (`0o7777`).
//!
//! Version 2 is written only for a tree holding an entry of kind 8 (a symlink with more
//! than one name: [`Entry::link_group`]), and must hold one; every other tree is
//! version 1, so trees without such links keep the bytes and ids they always had. A
//! version-1 reader refuses a version-2 tree (`unknown tree version 2`); this reader
//! refuses a later version as written by a newer cowspace.

use crate::error::{Error, Result};
use crate::id::{ContentId, ID_BYTES, TreeId};

/// Longest file name accepted (Linux `NAME_MAX`).
pub const MAX_NAME_BYTES: usize = 255;
/// Longest symlink target or hard-link path accepted (Linux `PATH_MAX`).
pub const MAX_TARGET_BYTES: usize = 4096;
/// Most entries in one directory.
pub const MAX_TREE_ENTRIES: usize = 1 << 22;
/// Most xattrs on one entry, and the largest value.
pub const MAX_XATTRS: usize = 256;
pub const MAX_XATTR_VALUE_BYTES: usize = 64 * 1024;

const MAGIC: &[u8; 6] = b"CWTREE";
const VERSION: u8 = 1;
/// The version of a tree holding a linked symlink (kind 8).
const VERSION_LINKED_SYMLINKS: u8 = 2;
/// Kind byte of a symlink with more than one name: an ordinary `symlink` entry whose
/// `hash` is its link group's key ([`Entry::link_group`]).
const KIND_LINKED_SYMLINK: u8 = 8;
/// Derive-key context of a link group's key ([`symlink_group_key`]).
const SYMLINK_GROUP_CONTEXT: &str = "cowspace 2026-12 symlink link group v1";

/// The key every name of a multiply-linked symlink records: derived from the path of the
/// group's first name in depth-first name order (as a file's hard links name their
/// primary), so one set of names has one encoding.
pub fn symlink_group_key(first: &[u8]) -> [u8; ID_BYTES] {
    let mut h = blake3::Hasher::new_derive_key(SYMLINK_GROUP_CONTEXT);
    h.update(first);
    *h.finalize().as_bytes()
}

/// What an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Dir,
    File,
    /// A symbolic link; one with several names (hard links of the symlink itself) has
    /// its link group's key as `hash` ([`Entry::link_group`]).
    Symlink,
    /// A further name of a regular file; `data` is the primary name's path.
    Hardlink,
    Fifo,
    CharDevice,
    BlockDevice,
}

impl Kind {
    fn to_u8(self) -> u8 {
        match self {
            Kind::Dir => 1,
            Kind::File => 2,
            Kind::Symlink => 3,
            Kind::Hardlink => 4,
            Kind::Fifo => 5,
            Kind::CharDevice => 6,
            Kind::BlockDevice => 7,
        }
    }

    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Dir,
            2 => Kind::File,
            3 => Kind::Symlink,
            4 => Kind::Hardlink,
            5 => Kind::Fifo,
            6 => Kind::CharDevice,
            7 => Kind::BlockDevice,
            _ => return None,
        })
    }

    /// A short word for listings and diffs.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Dir => "dir",
            Kind::File => "file",
            Kind::Symlink => "symlink",
            Kind::Hardlink => "hardlink",
            Kind::Fifo => "fifo",
            Kind::CharDevice => "char_device",
            Kind::BlockDevice => "block_device",
        }
    }

    /// Whether entries of this kind carry file content.
    pub fn has_content(self) -> bool {
        matches!(self, Kind::File | Kind::Hardlink)
    }
}

/// What an entry points at, by its kind ([`Entry::target`]): matched instead of the
/// kind, it hands a directory's subtree id or a file's content id to the arm that uses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Dir(TreeId),
    File(ContentId),
    /// A further name of a file: the same content as its primary (`data`).
    Hardlink(ContentId),
    Symlink,
    Fifo,
    CharDevice,
    BlockDevice,
}

/// One directory entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: Vec<u8>,
    pub kind: Kind,
    /// Permission bits only (`0o7777`).
    pub mode: u32,
    /// Content length for files and hard links, target length for symlinks, 0 otherwise.
    pub size: u64,
    /// Content id (files, hard links), subtree id (directories), link group key (a
    /// symlink with several names, [`Entry::link_group`]); zero otherwise.
    pub hash: [u8; ID_BYTES],
    /// Symlink target, hard-link primary path, or device number (8 bytes LE).
    pub data: Vec<u8>,
    /// Extended attributes, sorted by name.
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Entry {
    /// A symlink entry: mode 0777, the target as data.
    pub(crate) fn symlink(
        name: Vec<u8>,
        target: Vec<u8>,
        xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    ) -> Entry {
        Entry {
            name,
            kind: Kind::Symlink,
            mode: 0o777,
            size: target.len() as u64,
            hash: [0; 32],
            data: target,
            xattrs,
        }
    }

    /// A special file's entry: a device keeps its `rdev` as data, a fifo or socket none.
    pub(crate) fn special(name: Vec<u8>, kind: Kind, mode: u32, rdev: u64) -> Entry {
        Entry {
            name,
            kind,
            mode,
            size: 0,
            hash: [0; 32],
            data: if matches!(kind, Kind::CharDevice | Kind::BlockDevice) {
                rdev.to_le_bytes().to_vec()
            } else {
                vec![]
            },
            xattrs: vec![],
        }
    }

    /// The entry's kind with the id it points at: a directory's subtree and a file's
    /// content come out of the one match on the kind that gives `hash` its meaning.
    pub fn target(&self) -> Target {
        match self.kind {
            Kind::Dir => Target::Dir(TreeId::from_bytes(self.hash)),
            Kind::File => Target::File(ContentId::from_bytes(self.hash)),
            Kind::Hardlink => Target::Hardlink(ContentId::from_bytes(self.hash)),
            Kind::Symlink => Target::Symlink,
            Kind::Fifo => Target::Fifo,
            Kind::CharDevice => Target::CharDevice,
            Kind::BlockDevice => Target::BlockDevice,
        }
    }

    /// The content id of a file or hard link.
    pub fn content(&self) -> Option<ContentId> {
        self.kind
            .has_content()
            .then(|| ContentId::from_bytes(self.hash))
    }

    /// The subtree id of a directory.
    pub fn subtree(&self) -> Option<TreeId> {
        (self.kind == Kind::Dir).then(|| TreeId::from_bytes(self.hash))
    }

    /// The link group of a symlink with several names: every name of one symlink inode
    /// records the same key ([`symlink_group_key`] of the group's first name), and its
    /// target in `data`. `None` for a symlink of one name and any other entry.
    pub fn link_group(&self) -> Option<[u8; ID_BYTES]> {
        (self.kind == Kind::Symlink && self.hash != [0; ID_BYTES]).then_some(self.hash)
    }

    /// The device number of a device node.
    pub fn rdev(&self) -> Option<u64> {
        matches!(self.kind, Kind::CharDevice | Kind::BlockDevice)
            .then(|| u64::from_le_bytes(self.data.as_slice().try_into().unwrap_or([0; 8])))
    }
}

/// A directory: entries sorted by name.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Tree {
    pub entries: Vec<Entry>,
}

/// Checks that `name` may be a directory entry name.
pub fn check_name(name: &[u8]) -> Result<()> {
    let why = if name.is_empty() {
        "is empty"
    } else if name == b"." || name == b".." {
        "is . or .."
    } else if name.len() > MAX_NAME_BYTES {
        "is longer than 255 bytes"
    } else if name.contains(&b'/') {
        "contains /"
    } else if name.contains(&0) {
        "contains a NUL byte"
    } else {
        return Ok(());
    };
    Err(Error::Invalid(format!(
        "file name {:?} {why}",
        String::from_utf8_lossy(name)
    )))
}

impl Tree {
    /// Sorts entries by name (the canonical order).
    pub fn sort(&mut self) {
        self.entries.sort_by(|a, b| a.name.cmp(&b.name));
        for e in &mut self.entries {
            e.xattrs.sort();
        }
    }

    /// Finds an entry by name.
    pub fn get(&self, name: &[u8]) -> Option<&Entry> {
        self.entries
            .binary_search_by(|e| e.name.as_slice().cmp(name))
            .ok()
            .map(|i| &self.entries[i])
    }

    /// The canonical encoding. The entries must be valid and sorted (see [`Tree::sort`]).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + self.entries.len() * 64);
        out.extend_from_slice(MAGIC);
        let linked = self.entries.iter().any(|e| e.link_group().is_some());
        out.push(if linked {
            VERSION_LINKED_SYMLINKS
        } else {
            VERSION
        });
        out.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        for e in &self.entries {
            debug_assert!(check_name(&e.name).is_ok());
            out.extend_from_slice(&(e.name.len() as u16).to_le_bytes());
            out.extend_from_slice(&e.name);
            out.push(if e.link_group().is_some() {
                KIND_LINKED_SYMLINK
            } else {
                e.kind.to_u8()
            });
            out.extend_from_slice(&e.mode.to_le_bytes());
            out.extend_from_slice(&e.size.to_le_bytes());
            out.extend_from_slice(&e.hash);
            out.extend_from_slice(&(e.data.len() as u32).to_le_bytes());
            out.extend_from_slice(&e.data);
            out.extend_from_slice(&(e.xattrs.len() as u16).to_le_bytes());
            for (k, v) in &e.xattrs {
                out.extend_from_slice(&(k.len() as u16).to_le_bytes());
                out.extend_from_slice(k);
                out.extend_from_slice(&(v.len() as u32).to_le_bytes());
                out.extend_from_slice(v);
            }
        }
        out
    }

    /// Encodes and hashes.
    pub fn encode_with_id(&self) -> (TreeId, Vec<u8>) {
        let bytes = self.encode();
        (TreeId::of_encoding(&bytes), bytes)
    }

    /// Decodes and checks every invariant of the format.
    pub fn decode(id: &TreeId, bytes: &[u8]) -> Result<Tree> {
        let bad = |why: String| Error::corrupt("tree", id, why);
        let mut r = Reader { bytes, pos: 0 };
        if r.take(6).map_err(&bad)? != MAGIC {
            return Err(bad("bad magic".into()));
        }
        let version = r.u8().map_err(&bad)?;
        if version > VERSION_LINKED_SYMLINKS {
            return Err(Error::Unsupported(format!(
                "tree {} has encoding version {version}, written by a newer cowspace (this \
                 one reads versions 1 and 2): upgrade cowspace to read this snapshot",
                id.short()
            )));
        }
        if version < VERSION {
            return Err(bad(format!("unknown tree version {version}")));
        }
        let mut linked = false;
        let count = r.u32().map_err(&bad)? as usize;
        if count > MAX_TREE_ENTRIES {
            return Err(bad(format!("{count} entries is over the limit")));
        }
        let mut entries: Vec<Entry> = Vec::with_capacity(count.min(4096));
        for _ in 0..count {
            let name_len = r.u16().map_err(&bad)? as usize;
            let name = r.take(name_len).map_err(&bad)?.to_vec();
            check_name(&name).map_err(|e| bad(e.to_string()))?;
            if let Some(prev) = entries.last()
                && prev.name >= name
            {
                return Err(bad("entries are not strictly sorted".into()));
            }
            let kind_byte = r.u8().map_err(&bad)?;
            let kind = match kind_byte {
                KIND_LINKED_SYMLINK if version >= VERSION_LINKED_SYMLINKS => {
                    linked = true;
                    Kind::Symlink
                }
                _ => Kind::from_u8(kind_byte)
                    .ok_or_else(|| bad(format!("unknown kind {kind_byte} (version {version})")))?,
            };
            let linked_symlink = kind_byte == KIND_LINKED_SYMLINK;
            let mode = r.u32().map_err(&bad)?;
            if mode & !0o7777 != 0 {
                return Err(bad(format!("mode {mode:o} has bits beyond 07777")));
            }
            let size = r.u64().map_err(&bad)?;
            let hash: [u8; ID_BYTES] = r.array().map_err(&bad)?;
            let data_len = r.u32().map_err(&bad)? as usize;
            if data_len > MAX_TARGET_BYTES {
                return Err(bad("entry data over the limit".into()));
            }
            let data = r.take(data_len).map_err(&bad)?.to_vec();
            let has_hash = matches!(kind, Kind::Dir | Kind::File | Kind::Hardlink);
            if !has_hash && !linked_symlink && hash != [0; ID_BYTES] {
                return Err(bad(format!("{} entry with a hash", kind.as_str())));
            }
            if linked_symlink && hash == [0; ID_BYTES] {
                return Err(bad("linked symlink entry without a link group".into()));
            }
            let data_ok = match kind {
                Kind::Symlink | Kind::Hardlink => !data.is_empty(),
                Kind::CharDevice | Kind::BlockDevice => data.len() == 8,
                _ => data.is_empty(),
            };
            if !data_ok {
                return Err(bad(format!("{} entry with malformed data", kind.as_str())));
            }
            let nx = r.u16().map_err(&bad)? as usize;
            if nx > MAX_XATTRS {
                return Err(bad("too many xattrs".into()));
            }
            let mut xattrs: Vec<(Vec<u8>, Vec<u8>)> = Vec::with_capacity(nx);
            for _ in 0..nx {
                let kl = r.u16().map_err(&bad)? as usize;
                let k = r.take(kl).map_err(&bad)?.to_vec();
                let vl = r.u32().map_err(&bad)? as usize;
                if vl > MAX_XATTR_VALUE_BYTES {
                    return Err(bad("xattr value over the limit".into()));
                }
                let v = r.take(vl).map_err(&bad)?.to_vec();
                if let Some((pk, _)) = xattrs.last()
                    && *pk >= k
                {
                    return Err(bad("xattrs are not strictly sorted".into()));
                }
                xattrs.push((k, v));
            }
            entries.push(Entry {
                name,
                kind,
                mode,
                size,
                hash,
                data,
                xattrs,
            });
        }
        if r.pos != bytes.len() {
            return Err(bad("trailing bytes".into()));
        }
        if version == VERSION_LINKED_SYMLINKS && !linked {
            return Err(bad("version 2 tree without a linked symlink".into()));
        }
        Ok(Tree { entries })
    }
}

/// Reads little-endian fields off a byte string front to back (trees, remote indexes).
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes, pos: 0 }
    }
    /// Whether every byte was read.
    pub(crate) fn at_end(&self) -> bool {
        self.pos == self.bytes.len()
    }
    pub(crate) fn id(&mut self) -> std::result::Result<[u8; 32], String> {
        self.array()
    }
    /// The next `N` bytes as an array (the length proven by the type, not checked twice).
    pub(crate) fn array<const N: usize>(&mut self) -> std::result::Result<[u8; N], String> {
        let (head, _) = self.bytes[self.pos..]
            .split_first_chunk::<N>()
            .ok_or_else(|| "truncated".to_string())?;
        self.pos += N;
        Ok(*head)
    }
    pub(crate) fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], String> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| "truncated".to_string())?;
        let s = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    pub(crate) fn u8(&mut self) -> std::result::Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    pub(crate) fn u16(&mut self) -> std::result::Result<u16, String> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    pub(crate) fn u32(&mut self) -> std::result::Result<u32, String> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub(crate) fn u64(&mut self) -> std::result::Result<u64, String> {
        Ok(u64::from_le_bytes(self.array()?))
    }
}

/// `parent/name`, or `name` at the root (`parent` empty): how every path inside a
/// snapshot is spelled (`/`-separated, no leading slash).
pub fn join_path(parent: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(parent.len() + 1 + name.len());
    if !parent.is_empty() {
        p.extend_from_slice(parent);
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn file(name: &str, mode: u32) -> Entry {
        Entry {
            name: name.as_bytes().to_vec(),
            kind: Kind::File,
            mode,
            size: 3,
            hash: *ContentId::of(b"abc").as_bytes(),
            data: vec![],
            xattrs: vec![],
        }
    }

    #[test]
    fn round_trip() {
        let mut t = Tree {
            entries: vec![file("b", 0o644), file("a", 0o755)],
        };
        t.entries.push(Entry {
            name: b"l".to_vec(),
            kind: Kind::Symlink,
            mode: 0o777,
            size: 1,
            hash: [0; 32],
            data: b"a".to_vec(),
            xattrs: vec![
                (b"user.b".to_vec(), b"2".to_vec()),
                (b"user.a".to_vec(), vec![]),
            ],
        });
        t.sort();
        let (id, bytes) = t.encode_with_id();
        assert_eq!(Tree::decode(&id, &bytes).unwrap(), t);
    }

    #[test]
    fn decode_rejects_unsorted_and_bad_names() {
        let t = Tree {
            entries: vec![file("b", 0o644), file("a", 0o644)],
        };
        let (id, bytes) = t.encode_with_id();
        assert!(Tree::decode(&id, &bytes).is_err());
        for bad in [&b""[..], b".", b"..", b"a/b", b"a\0b"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }

    fn linked(name: &str, first: &str) -> Entry {
        let mut e = Entry::symlink(name.as_bytes().to_vec(), b"target".to_vec(), vec![]);
        e.hash = symlink_group_key(first.as_bytes());
        e
    }

    #[test]
    fn linked_symlinks_raise_the_version_of_their_tree_only() {
        let plain = Tree {
            entries: vec![Entry::symlink(b"a".to_vec(), b"t".to_vec(), vec![])],
        };
        assert_eq!(plain.encode()[6], 1);
        let t = Tree {
            entries: vec![linked("a", "a"), linked("b", "a"), file("c", 0o644)],
        };
        let (id, bytes) = t.encode_with_id();
        assert_eq!(bytes[6], 2);
        let back = Tree::decode(&id, &bytes).unwrap();
        assert_eq!(back, t);
        assert_eq!(back.entries[0].kind, Kind::Symlink);
        assert_eq!(back.entries[1].link_group(), Some(symlink_group_key(b"a")));
        assert_eq!(back.entries[2].link_group(), None);
    }

    #[test]
    fn linked_symlink_versions_are_strict() {
        // Kind 8 in a version-1 tree.
        let t = Tree {
            entries: vec![linked("a", "a")],
        };
        let mut bytes = t.encode();
        bytes[6] = 1;
        let id = TreeId::of_encoding(&bytes);
        assert!(
            Tree::decode(&id, &bytes)
                .unwrap_err()
                .to_string()
                .contains("unknown kind 8")
        );
        // Version 2 without a linked symlink.
        let mut bytes = Tree {
            entries: vec![file("a", 0o644)],
        }
        .encode();
        bytes[6] = 2;
        let id = TreeId::of_encoding(&bytes);
        assert!(Tree::decode(&id, &bytes).is_err());
        // A later version: refused as a newer program's, naming the fix.
        let mut bytes = t.encode();
        bytes[6] = 3;
        let id = TreeId::of_encoding(&bytes);
        let err = Tree::decode(&id, &bytes).unwrap_err();
        assert_eq!(err.kind(), crate::error::ErrorKind::Unsupported);
        assert!(err.to_string().contains("upgrade cowspace"), "{err}");
    }

    proptest! {
        /// The same set of entries gives the same id whatever order they were added in.
        #[test]
        fn canonical_whatever_the_order(names in proptest::collection::btree_set("[a-z0-9 ._é-]{1,12}", 1..20), seed in any::<u64>()) {
            let names: Vec<String> = names.into_iter().filter(|n| n != "." && n != "..").collect();
            let mut a = Tree { entries: names.iter().map(|n| file(n, 0o644)).collect() };
            let mut b = a.clone();
            // A deterministic shuffle from the seed.
            let len = b.entries.len();
            for i in 0..len {
                let j = ((seed.wrapping_mul(6364136223846793005).wrapping_add(i as u64)) % len as u64) as usize;
                b.entries.swap(i, j);
            }
            a.sort();
            b.sort();
            prop_assert_eq!(a.encode_with_id().0, b.encode_with_id().0);
            let (id, bytes) = a.encode_with_id();
            prop_assert_eq!(Tree::decode(&id, &bytes).unwrap(), a);
        }
    }
}
