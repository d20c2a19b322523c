//! Groups: small chunks compressed together in one zstd frame, so they share the context
//! a solid archive gives its small files (compressed one by one, the Linux tree's small
//! files took 1.31× the bytes of `tar | zstd -3`).
//!
//! A group is one pack record of kind [`GROUP_KIND`](crate::pack::GROUP_KIND) (codec
//! zstd, id the BLAKE3 of its raw bytes):
//!
//! ```text
//! raw := u32:count (u32:len)*count member_bytes*
//! ```
//!
//! Two kinds of group are written: small chunks (each at most [`GROUP_MEMBER_MAX_BYTES`],
//! from any files a worker reads) until they reach [`GROUP_BYTES`], so reading a small
//! file decompresses at most about 96 KiB; and runs of the new chunks of one large file,
//! up to [`RUN_BYTES`] (reading in such a file decompresses at most about 1.25 MiB). A
//! member's index row points at the group's record (`offset`, `stored_len`), with codec
//! [`Codec::Part`] and `part`, the member's offset in the raw bytes. Member ids
//! are not in the record: a chunk's id is the hash of its bytes, so adoption and checks
//! compute them.
//!
//! Reads keep the last few groups decompressed on each thread ([`read_part`]): the
//! members of a group are usually read close together (a directory's files, a
//! workspace's checkout, `fsck` in pack order), and decompress it once.

use std::cell::RefCell;
use std::sync::Arc;

use crate::codec;
use crate::error::{Error, Result};
use crate::index::ObjectKind;
use crate::pack::{Codec, PackId};
use crate::writer::{Member, NewObject};

/// Chunks up to this size are grouped with other small chunks.
pub const GROUP_MEMBER_MAX_BYTES: usize = 32 * 1024;
/// A group of small chunks is closed once its members hold this many bytes.
pub const GROUP_BYTES: usize = 64 * 1024;
/// The new chunks of one large file are grouped in runs of this many bytes (its chunks
/// are at most 256 KiB): a large file's chunks compressed one by one lose the context
/// the file has across them (the Linux tree's files over 256 KiB: 35.3 MiB in 64 KiB
/// pieces, 24.6 MiB in 1 MiB pieces).
pub const RUN_BYTES: usize = 1024 * 1024;
/// The largest raw group a reader accepts (members, table and slack), so a damaged
/// frame header cannot make a reader allocate much.
const MAX_GROUP_RAW_BYTES: usize = 2 * 1024 * 1024;

/// Chunks waiting to be compressed as one group, by one worker.
pub(crate) struct Grouper {
    members: Vec<([u8; 32], Vec<u8>)>,
    bytes: usize,
    /// The group is full at this many bytes.
    limit: usize,
}

impl Default for Grouper {
    /// A grouper of small chunks.
    fn default() -> Grouper {
        Grouper::new(GROUP_BYTES)
    }
}

impl Grouper {
    pub fn new(limit: usize) -> Grouper {
        Grouper {
            members: Vec::new(),
            bytes: 0,
            limit,
        }
    }

    /// Whether an object of this kind and size goes into a group.
    pub fn takes(kind: ObjectKind, len: usize) -> bool {
        kind == ObjectKind::Chunk && len <= GROUP_MEMBER_MAX_BYTES
    }

    /// Adds a chunk; true when the group is full (then [`Grouper::take`] it).
    pub fn push(&mut self, id: [u8; 32], data: Vec<u8>) -> bool {
        self.bytes += data.len();
        self.members.push((id, data));
        self.bytes >= self.limit
    }

    /// What was added, uncompressed (to be compressed elsewhere, by [`compress`]).
    pub fn take_raw(&mut self) -> Vec<([u8; 32], Vec<u8>)> {
        self.bytes = 0;
        std::mem::take(&mut self.members)
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Compresses what was added (see [`compress`]).
    pub fn take(&mut self, compressor: &mut zstd::bulk::Compressor<'_>) -> Vec<NewObject> {
        compress(self.take_raw(), compressor)
    }
}

/// Compresses chunks as one group record, or each on its own when there is only one or
/// compressing them together does not pay.
pub(crate) fn compress(
    members: Vec<([u8; 32], Vec<u8>)>,
    compressor: &mut zstd::bulk::Compressor<'_>,
) -> Vec<NewObject> {
    if members.len() > 1 {
        let raw = encode(members.iter().map(|(_, d)| d.as_slice()));
        let (id, raw_len) = (*blake3::hash(&raw).as_bytes(), raw.len() as u32);
        if let (Codec::Zstd, stored) = codec::compress(compressor, raw) {
            let mut part = (4 + 4 * members.len()) as u32;
            let parts = members
                .iter()
                .map(|(id, d)| {
                    let m = Member {
                        id: *id,
                        len: d.len() as u32,
                        part,
                    };
                    part += d.len() as u32;
                    m
                })
                .collect();
            return vec![NewObject {
                id,
                kind: ObjectKind::Chunk,
                codec: Codec::Zstd,
                raw_len,
                stored,
                members: parts,
            }];
        }
    }
    members
        .into_iter()
        .map(|(id, data)| {
            let raw_len = data.len() as u32;
            let (codec, stored) = codec::compress(compressor, data);
            NewObject {
                id,
                kind: ObjectKind::Chunk,
                codec,
                raw_len,
                stored,
                members: Vec::new(),
            }
        })
        .collect()
}

/// The raw bytes of a group of these members.
pub(crate) fn encode<'a>(members: impl ExactSizeIterator<Item = &'a [u8]> + Clone) -> Vec<u8> {
    let n = members.len();
    let total: usize = members.clone().map(<[u8]>::len).sum();
    let mut raw = Vec::with_capacity(4 + 4 * n + total);
    raw.extend_from_slice(&(n as u32).to_le_bytes());
    for m in members.clone() {
        raw.extend_from_slice(&(m.len() as u32).to_le_bytes());
    }
    for m in members {
        raw.extend_from_slice(m);
    }
    raw
}

/// A group's members: (offset in `raw`, length) each, checked against its table.
pub(crate) fn members(raw: &[u8]) -> Option<Vec<(u32, u32)>> {
    let n = u32::from_le_bytes(raw.get(..4)?.try_into().ok()?) as usize;
    let table = 4usize.checked_add(n.checked_mul(4)?)?;
    let lens = raw.get(4..table)?;
    let mut at = table;
    let mut out = Vec::with_capacity(n);
    for l in lens.chunks_exact(4) {
        let len = u32::from_le_bytes(l.try_into().ok()?) as usize;
        out.push((at as u32, len as u32));
        at = at.checked_add(len)?;
    }
    (at == raw.len()).then_some(out)
}

/// Decompresses a group record's stored bytes, checking its table.
pub(crate) fn decompress(stored: Vec<u8>, what: &str) -> Result<Vec<u8>> {
    let bad = |why: String| Error::corrupt("group", what, why);
    let size = zstd::zstd_safe::get_frame_content_size(&stored)
        .map_err(|_| bad("not a zstd frame".into()))?
        .ok_or_else(|| bad("its frame does not say its size".into()))?;
    if size > MAX_GROUP_RAW_BYTES as u64 {
        return Err(bad(format!("its frame says {size} bytes")));
    }
    let raw = codec::decompress(Codec::Zstd, stored, size as usize, what)?;
    if members(&raw).is_none() {
        return Err(bad("its member table does not match its bytes".into()));
    }
    Ok(raw)
}

/// Groups decompressed last on this thread, newest first: (pack, offset of the stored
/// bytes) and the raw bytes. A few, not one: readers on several threads take a
/// snapshot's files in turns, and an import's workers interleave their groups.
type Recent = std::collections::VecDeque<((PackId, u64), Arc<Vec<u8>>)>;
const RECENT_GROUPS: usize = 4;

thread_local! {
    static RECENT: RefCell<Recent> = const { RefCell::new(Recent::new()) };
}

/// A group member's bytes: from this thread's recent groups when its group is one of
/// them, otherwise from `stored()` (the group record's stored bytes), decompressed and
/// kept. Unverified, like every `read_located`.
pub(crate) fn read_part(
    pack: &PackId,
    offset: u64,
    part: u32,
    raw_len: u32,
    what: &str,
    stored: impl FnOnce() -> Result<Vec<u8>>,
) -> Result<Vec<u8>> {
    let hit = RECENT.with(|r| {
        r.borrow()
            .iter()
            .find(|((p, o), _)| p == pack && *o == offset)
            .map(|(_, raw)| raw.clone())
    });
    let raw = match hit {
        Some(raw) => raw,
        None => {
            let raw = Arc::new(decompress(stored()?, what)?);
            RECENT.with(|r| {
                let mut r = r.borrow_mut();
                r.truncate(RECENT_GROUPS - 1);
                r.push_front(((pack.clone(), offset), raw.clone()));
            });
            raw
        }
    };
    let (start, end) = (part as usize, part as usize + raw_len as usize);
    raw.get(start..end).map(<[u8]>::to_vec).ok_or_else(|| {
        Error::corrupt(
            "chunk",
            what,
            format!(
                "bytes {start}..{end} are outside its group of {}",
                raw.len()
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compressor() -> zstd::bulk::Compressor<'static> {
        zstd::bulk::Compressor::new(3).unwrap()
    }

    #[test]
    fn a_group_gives_back_each_member_at_its_part() {
        let mut g = Grouper::default();
        let data: Vec<Vec<u8>> = (0..5u8)
            .map(|i| {
                format!("fn f{i}() {{ println!(\"{i}\"); }}\n")
                    .repeat(40)
                    .into_bytes()
            })
            .collect();
        for d in &data {
            g.push(*blake3::hash(d).as_bytes(), d.clone());
        }
        let out = g.take(&mut compressor());
        assert_eq!(out.len(), 1, "five compressible chunks make one group");
        let rec = &out[0];
        assert_eq!(rec.members.len(), 5);
        let raw = decompress(rec.stored.clone(), "test").unwrap();
        assert_eq!(blake3::hash(&raw).as_bytes(), &rec.id);
        let pack = PackId::generate();
        for (m, d) in rec.members.iter().zip(&data) {
            let got = read_part(&pack, 44, m.part, m.len, "test", || Ok(rec.stored.clone()));
            assert_eq!(&got.unwrap(), d);
        }
        assert_eq!(
            members(&raw).unwrap(),
            rec.members
                .iter()
                .map(|m| (m.part, m.len))
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn one_chunk_or_incompressible_chunks_are_stored_on_their_own() {
        let mut g = Grouper::default();
        g.push([1; 32], b"only one".to_vec());
        let out = g.take(&mut compressor());
        assert_eq!(out.len(), 1);
        assert!(out[0].members.is_empty());
        let mut noise = Vec::new();
        let mut x = 0x2545f4914f6cdd1du64;
        for _ in 0..2 {
            let d: Vec<u8> = (0..4096)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            noise.push(d);
        }
        for (i, d) in noise.iter().enumerate() {
            g.push([i as u8; 32], d.clone());
        }
        let out = g.take(&mut compressor());
        assert_eq!(out.len(), 2);
        assert!(
            out.iter()
                .all(|o| o.members.is_empty() && o.codec == Codec::Raw)
        );
        assert!(g.is_empty());
    }

    #[test]
    fn a_damaged_table_or_frame_is_corrupt() {
        let raw = encode([&b"ab"[..], &b"cd"[..]].into_iter());
        assert_eq!(members(&raw).unwrap(), vec![(12, 2), (14, 2)]);
        let mut short = raw.clone();
        short.pop();
        assert!(members(&short).is_none());
        let mut lying = raw.clone();
        lying[0] = 9;
        assert!(members(&lying).is_none());
        assert!(decompress(b"not zstd at all".to_vec(), "x").is_err());
        let frame = zstd::bulk::compress(&short, 3).unwrap();
        assert!(decompress(frame, "x").is_err());
    }
}
