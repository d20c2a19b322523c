//! The per-snapshot index object of a remote (its byte format: `docs/store-format.md`,
//! "Remotes") and what a root records of where remote objects are.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use rusqlite::{OptionalExtension, params};

use super::RemoteLoc;
use crate::codec::{self, Manifest};
use crate::error::{Error, Result};
use crate::id::{ContentId, SnapshotId};
use crate::index::{Location, ObjectKind};
use crate::lock::StoreLock;
use crate::pack::{Codec, PACK_MAGIC, RECORD_HEADER_BYTES, parse_record_header, record_header};
use crate::snapshot::now_secs;
use crate::store::{Store, verify};
use crate::tree::Reader;
use crate::writer::{NewObject, PackWriter};

/// The chunk of a snapshot index: where it is on the remote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexChunk {
    pub id: [u8; 32],
    /// Into [`SnapshotIndex::packs`].
    pub pack: u32,
    pub offset: u64,
    pub stored_len: u32,
    pub raw_len: u32,
    pub codec: Codec,
}

/// The per-snapshot index object of a remote: the snapshot's metadata (the snapshot,
/// every tree, every manifest, as pack records) and where each of its chunks is.
/// Reading it is all a host needs to make a workspace of the snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotIndex {
    pub snapshot: SnapshotId,
    /// Keys of the remote packs holding the chunks.
    pub packs: Vec<String>,
    /// A pack ("CWSPACK1" records) of the metadata objects.
    pub meta: Vec<u8>,
    pub chunks: Vec<IndexChunk>,
}

const INDEX_MAGIC: &[u8; 8] = b"CWSINDEX";
const INDEX_VERSION: u8 = 1;
/// Bytes of one chunk entry of an index.
const INDEX_CHUNK_BYTES: usize = 32 + 4 + 8 + 4 + 4 + 1;

impl SnapshotIndex {
    /// The encoding (`docs/store-format.md`): ends with the BLAKE3 of what precedes it.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            64 + self.meta.len() + self.chunks.len() * INDEX_CHUNK_BYTES + self.packs.len() * 80,
        );
        out.extend_from_slice(INDEX_MAGIC);
        out.push(INDEX_VERSION);
        out.extend_from_slice(self.snapshot.as_bytes());
        out.extend_from_slice(&(self.packs.len() as u32).to_le_bytes());
        for p in &self.packs {
            out.extend_from_slice(&(p.len() as u16).to_le_bytes());
            out.extend_from_slice(p.as_bytes());
        }
        out.extend_from_slice(&(self.meta.len() as u64).to_le_bytes());
        out.extend_from_slice(&self.meta);
        out.extend_from_slice(&(self.chunks.len() as u32).to_le_bytes());
        for c in &self.chunks {
            out.extend_from_slice(&c.id);
            out.extend_from_slice(&c.pack.to_le_bytes());
            out.extend_from_slice(&c.offset.to_le_bytes());
            out.extend_from_slice(&c.stored_len.to_le_bytes());
            out.extend_from_slice(&c.raw_len.to_le_bytes());
            out.push(c.codec as u8);
        }
        let sum = blake3::hash(&out);
        out.extend_from_slice(sum.as_bytes());
        out
    }

    /// Decodes an index read from `key`, checking its checksum, that it is the index of
    /// `expect` and that every field is in range.
    pub fn decode(bytes: &[u8], expect: &SnapshotId, key: &str) -> Result<SnapshotIndex> {
        let bad = |why: &str| Error::corrupt("remote index", key, why.to_string());
        if bytes.len() < INDEX_MAGIC.len() + 1 + 32 + 32 {
            return Err(bad("too short"));
        }
        let (body, sum) = bytes.split_at(bytes.len() - 32);
        if blake3::hash(body).as_bytes() != sum {
            return Err(bad("its checksum does not match (damaged or cut short)"));
        }
        let mut r = Reader::new(body);
        let short = |_| bad("cut short");
        if r.take(8).ok() != Some(&INDEX_MAGIC[..]) {
            return Err(bad("not a snapshot index"));
        }
        if r.u8().ok() != Some(INDEX_VERSION) {
            return Err(bad("unknown index version"));
        }
        let snapshot = SnapshotId::from_bytes(r.id().map_err(short)?);
        if &snapshot != expect {
            return Err(bad(&format!("it is the index of {}", snapshot.to_hex())));
        }
        let n = r.u32().map_err(short)?;
        let mut packs = Vec::new();
        for _ in 0..n {
            let len = r.u16().map_err(short)? as usize;
            let k = r.take(len).map_err(short)?;
            packs.push(String::from_utf8(k.to_vec()).map_err(|_| bad("a pack key is not UTF-8"))?);
        }
        let meta_len = r.u64().map_err(short)? as usize;
        let meta = r.take(meta_len).map_err(short)?.to_vec();
        let n = r.u32().map_err(short)?;
        let mut chunks = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let c = (|| {
                Some(IndexChunk {
                    id: r.id().ok()?,
                    pack: r.u32().ok()?,
                    offset: r.u64().ok()?,
                    stored_len: r.u32().ok()?,
                    raw_len: r.u32().ok()?,
                    codec: Codec::from_u8(r.u8().ok()?)?,
                })
            })()
            .ok_or_else(|| bad("a chunk entry is cut short or has an unknown codec"))?;
            // A remote holds every chunk on its own (a push unpacks groups).
            if c.pack as usize >= packs.len()
                || c.raw_len as usize > codec::MAX_OBJECT_BYTES
                || c.codec == Codec::Part
            {
                return Err(bad("a chunk entry is out of range"));
            }
            chunks.push(c);
        }
        if !r.at_end() {
            return Err(bad("stray bytes after the chunk table"));
        }
        Ok(SnapshotIndex {
            snapshot,
            packs,
            meta,
            chunks,
        })
    }

    /// The metadata records: (id, kind, codec, raw_len, stored bytes).
    pub fn meta_records(&self, key: &str) -> Result<Vec<MetaRecord>> {
        let bad = |why: &str| Error::corrupt("remote index", key, why.to_string());
        let b = &self.meta;
        if b.len() < PACK_MAGIC.len() || &b[..PACK_MAGIC.len()] != PACK_MAGIC {
            return Err(bad("its metadata is not a pack"));
        }
        let mut r = Reader::new(&b[PACK_MAGIC.len()..]);
        let mut out = Vec::new();
        while !r.at_end() {
            let h: [u8; RECORD_HEADER_BYTES as usize] = r
                .array()
                .map_err(|_| bad("a metadata record is cut short"))?;
            let (kind, codec, stored_len, raw_len, id) = parse_record_header(&h);
            let kind = ObjectKind::from_u8(kind).ok_or_else(|| bad("unknown object kind"))?;
            let codec = Codec::from_u8(codec).ok_or_else(|| bad("unknown codec"))?;
            let stored = r
                .take(stored_len as usize)
                .map_err(|_| bad("a metadata record is cut short"))?;
            out.push((kind, id, codec, raw_len, stored.to_vec()));
        }
        Ok(out)
    }
}

/// One metadata record of an index: kind, id, codec, raw length, stored bytes.
pub type MetaRecord = (ObjectKind, [u8; 32], Codec, u32, Vec<u8>);

/// Appends one pack record to `out` (a remote pack or an index's metadata).
pub fn push_record(
    out: &mut Vec<u8>,
    kind: ObjectKind,
    loc: &Location,
    id: &[u8; 32],
    stored: &[u8],
) {
    out.extend_from_slice(&record_header(
        kind as u8,
        loc.codec,
        stored.len() as u32,
        loc.raw_len,
        id,
    ));
    out.extend_from_slice(stored);
}

impl Store {
    /// Where each of `ids` is on `remote`, as far as this root knows.
    pub fn remote_locations(
        &self,
        remote: &str,
        ids: &[[u8; 32]],
    ) -> Result<HashMap<[u8; 32], RemoteLoc>> {
        self.with_reader(|c| {
            let mut st = c
                .prepare_cached(
                    "SELECT pack, offset, stored_len, raw_len, codec FROM remote_objects \
                     WHERE id = ?1 AND remote = ?2",
                )
                .map_err(Error::db("look up remote objects"))?;
            let mut out = HashMap::new();
            for id in ids {
                let row = st
                    .query_row(params![&id[..], remote], |r| {
                        Ok((
                            r.get::<_, String>(0)?,
                            r.get::<_, i64>(1)?,
                            r.get::<_, u32>(2)?,
                            r.get::<_, u32>(3)?,
                            r.get::<_, u8>(4)?,
                        ))
                    })
                    .optional()
                    .map_err(Error::db("look up remote objects"))?;
                if let Some((key, offset, stored_len, raw_len, codec)) = row {
                    out.insert(
                        *id,
                        RemoteLoc {
                            remote: remote.into(),
                            key,
                            offset: offset as u64,
                            stored_len,
                            raw_len,
                            codec: Codec::from_u8(codec).unwrap_or(Codec::Raw),
                        },
                    );
                }
            }
            Ok(out)
        })
    }

    /// Records where objects are on `remote` (after a push wrote them there).
    pub fn record_remote_objects(
        &self,
        remote: &str,
        rows: &[([u8; 32], RemoteLoc)],
    ) -> Result<()> {
        let mut conn = self.db();
        let tx = conn.transaction().map_err(Error::db("begin"))?;
        insert_remote_rows(&tx, remote, rows)?;
        tx.commit().map_err(Error::db("commit remote objects"))?;
        self.remote.any.store(true, Ordering::Release);
        Ok(())
    }

    /// Makes the snapshot of `index` (read from `remote`) known here: its metadata
    /// objects are verified and stored, and each chunk not stored here is recorded as on
    /// the remote, to be fetched at its first read. Returns whether some content is
    /// still remote (the snapshot is partial).
    pub fn register_index(&self, remote: &str, key: &str, index: &SnapshotIndex) -> Result<bool> {
        let _lock = StoreLock::shared(self)?;
        let mut writer = PackWriter::new(self.backend.clone());
        let mut snapshot_seen = false;
        for (kind, id, codec, raw_len, stored) in index.meta_records(key)? {
            let hexid = hex::encode(id);
            let raw = codec::decompress(codec, stored.clone(), raw_len as usize, &hexid).map_err(
                |_| {
                    Error::corrupt(
                        kind.as_str(),
                        &hexid,
                        format!("in remote index {key}: does not decompress"),
                    )
                },
            )?;
            match kind {
                ObjectKind::Manifest => {
                    Manifest::decode(&ContentId::from_bytes(id), &raw)?;
                }
                ObjectKind::Chunk => {
                    return Err(Error::corrupt(
                        "remote index",
                        key,
                        "holds a chunk among its metadata",
                    ));
                }
                _ => verify(kind, &id, &raw).map_err(|e| match e {
                    Error::Corrupt { what, id, why } => Error::Corrupt {
                        what,
                        id,
                        why: format!("in remote index {key}: {why}"),
                    },
                    e => e,
                })?,
            }
            if kind == ObjectKind::Snapshot && id == *index.snapshot.as_bytes() {
                snapshot_seen = true;
            }
            if self.contains(&id)? {
                continue;
            }
            writer.add(NewObject {
                id,
                kind,
                codec,
                raw_len,
                stored,
                members: Vec::new(),
            })?;
        }
        if !snapshot_seen {
            return Err(Error::corrupt(
                "remote index",
                key,
                "does not hold its snapshot",
            ));
        }
        let rows: Vec<([u8; 32], RemoteLoc)> = index
            .chunks
            .iter()
            .map(|c| {
                (
                    c.id,
                    RemoteLoc {
                        remote: remote.into(),
                        key: index.packs[c.pack as usize].clone(),
                        offset: c.offset,
                        stored_len: c.stored_len,
                        raw_len: c.raw_len,
                        codec: c.codec,
                    },
                )
            })
            .collect();
        let mut missing = false;
        for c in &index.chunks {
            if !self.contains(&c.id)? {
                missing = true;
                break;
            }
        }
        let pending = writer.finish()?;
        let snap = *index.snapshot.as_bytes();
        self.commit(pending, |tx| {
            insert_remote_rows(tx, remote, &rows)?;
            {
                tx.execute(
                    "INSERT OR REPLACE INTO remote_snapshots (snapshot, remote, registered_at, partial) VALUES (?1, ?2, ?3, ?4)",
                    params![&snap[..], remote, now_secs(), missing],
                )
                .map_err(Error::db("record partial snapshot"))?;
            }
            Ok(())
        })?;
        self.remote.any.store(true, Ordering::Release);
        Ok(missing)
    }
}

pub(super) fn insert_remote_rows(
    tx: &rusqlite::Connection,
    remote: &str,
    rows: &[([u8; 32], RemoteLoc)],
) -> Result<()> {
    let mut sorted: Vec<&([u8; 32], RemoteLoc)> = rows.iter().collect();
    sorted.sort_unstable_by_key(|r| r.0);
    crate::store::insert_many(
        tx,
        "INSERT OR REPLACE INTO remote_objects (id, remote, pack, offset, stored_len, raw_len, codec)",
        7,
        &sorted,
        |st, i, (id, l)| {
            st.raw_bind_parameter(i, &id[..])?;
            st.raw_bind_parameter(i + 1, remote)?;
            st.raw_bind_parameter(i + 2, l.key.as_str())?;
            st.raw_bind_parameter(i + 3, l.offset as i64)?;
            st.raw_bind_parameter(i + 4, l.stored_len)?;
            st.raw_bind_parameter(i + 5, l.raw_len)?;
            st.raw_bind_parameter(i + 6, l.codec as u8)
        },
    )
    .map_err(Error::db("record remote objects"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_round_trips_and_detects_damage() {
        let snap = SnapshotId::from_bytes([7; 32]);
        let idx = SnapshotIndex {
            snapshot: snap,
            packs: vec!["packs/ab/abcd.pack".into()],
            meta: PACK_MAGIC.to_vec(),
            chunks: vec![IndexChunk {
                id: [1; 32],
                pack: 0,
                offset: 8,
                stored_len: 10,
                raw_len: 20,
                codec: Codec::Zstd,
            }],
        };
        let b = idx.encode();
        assert_eq!(SnapshotIndex::decode(&b, &snap, "k").unwrap(), idx);
        for at in [0, 9, 50, b.len() - 40, b.len() - 1] {
            let mut bad = b.clone();
            bad[at] ^= 1;
            let e = SnapshotIndex::decode(&bad, &snap, "k").unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::Corrupt, "{e}");
        }
        let e = SnapshotIndex::decode(&b[..b.len() - 3], &snap, "k").unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Corrupt);
        let other = SnapshotId::from_bytes([8; 32]);
        assert!(SnapshotIndex::decode(&b, &other, "k").is_err());
    }
}
