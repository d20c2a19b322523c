//! Adopting what an interrupted import left: the chunks in its orphan packs.
//!
//! An import killed before its commit leaves pack files no index row names. Each pack is
//! held by its writer from its creation until its commit ended ([`PackBackend::claim_orphan`]:
//! an exclusive `flock` on local files), so a pack nobody holds and the index does not
//! name was left by a writer that is gone. An import starting (under the shared store
//! lock, so no gc runs) claims such packs, syncs them, reads their records front to
//! back, verifies every chunk (decompressed and hashed) and commits the chunks the
//! index lacks, with the pack (its size: the end of its last complete record), in one
//! transaction. The import then finds those chunks stored and compresses none of them
//! again. Trees, manifests and snapshots are not adopted (what they name may be in a
//! pack that did not survive): they are cheap to make again, and like every byte of an
//! adopted pack that no row names, they are garbage that gc reclaims. A chunk adopted
//! but not used by the import's snapshot is unreferenced: the next gc removes it.
//!
//! [`PackBackend::claim_orphan`]: crate::pack::PackBackend::claim_orphan

use std::collections::HashSet;

use serde::Serialize;

use crate::codec;
use crate::error::{Error, Result};
use crate::id::ChunkId;
use crate::index::{self, Location, ObjectKind};
use crate::pack::{
    Codec, GROUP_KIND, PACK_MAGIC, PackHold, PackId, RECORD_HEADER_BYTES, parse_record_header,
};
use crate::store::{Store, committed_packs};
use crate::writer::{Holds, Pending, Row, stored_bytes};

/// Orphan packs one import looks at, at most (the rest wait for the next import or gc).
pub const MAX_PACKS_ADOPTED: usize = 64;

/// What an import took over from interrupted ones.
#[derive(Debug, Clone, Copy, Serialize, Default, PartialEq, Eq)]
pub struct Adopted {
    pub packs: u64,
    pub chunks: u64,
    /// Stored (compressed) bytes of those chunks.
    pub bytes: u64,
}

impl Adopted {
    pub fn is_none(&self) -> bool {
        self.chunks == 0
    }
}

impl Store {
    /// Pack files no committed transaction names, with their sizes: what interrupted
    /// (or still running) writers left.
    pub fn unrecorded_packs(&self) -> Result<Vec<(PackId, u64)>> {
        let committed: HashSet<PackId> = self
            .with_reader(committed_packs)?
            .into_iter()
            .map(|(p, _)| p)
            .collect();
        let listed = self
            .backend
            .list()
            .map_err(Error::io("list packs", self.layout.packs()))?;
        Ok(listed
            .into_iter()
            .filter(|p| !committed.contains(p))
            .map(|p| {
                let n = self.backend.len(&p).unwrap_or(0);
                (p, n)
            })
            .collect())
    }

    /// Adopts the chunks of orphan packs no writer holds (see the module doc). To be
    /// called under the shared store lock.
    pub(crate) fn adopt_orphans(&self) -> Result<Adopted> {
        let mut out = Adopted::default();
        let listed = match self.backend.list() {
            Ok(l) => l,
            Err(_) => return Ok(out),
        };
        let committed: HashSet<PackId> = self
            .with_reader(committed_packs)?
            .into_iter()
            .map(|(p, _)| p)
            .collect();
        let orphans: Vec<PackId> = listed
            .into_iter()
            .filter(|p| !committed.contains(p))
            .take(MAX_PACKS_ADOPTED)
            .collect();
        for pack in orphans {
            let Ok(Some(hold)) = self.backend.claim_orphan(&pack) else {
                continue;
            };
            // Its writer may have committed it between the listing and the claim.
            let known = self.with_reader(|c| {
                c.query_row(
                    "SELECT EXISTS (SELECT 1 FROM packs WHERE id = ?1)",
                    [pack.as_str()],
                    |r| r.get::<_, bool>(0),
                )
                .map_err(Error::db("look up pack"))
            })?;
            if known {
                continue;
            }
            if let Some((n, bytes)) = self.adopt_one(&pack, hold)? {
                out.packs += 1;
                out.chunks += n;
                out.bytes += bytes;
            }
        }
        Ok(out)
    }

    /// Commits the new, sound chunks of one held orphan pack: (chunks, stored bytes), or
    /// `None` when it holds none.
    fn adopt_one(&self, pack: &PackId, hold: Box<dyn PackHold>) -> Result<Option<(u64, u64)>> {
        let loc = self.backend.location(pack);
        let len = self
            .backend
            .len(pack)
            .map_err(Error::io("read orphan pack", &loc))?;
        let mut magic = [0u8; PACK_MAGIC.len()];
        if len < magic.len() as u64
            || self.backend.read_at(pack, 0, &mut magic).is_err()
            || &magic != PACK_MAGIC
        {
            return Ok(None);
        }
        hold.sync().map_err(Error::io("sync orphan pack", &loc))?;
        let mut rows = Vec::new();
        let mut at = magic.len() as u64;
        let mut end = at;
        let mut seen = HashSet::new();
        let conn = index::open_reader(&self.layout.index())?;
        while at + RECORD_HEADER_BYTES <= len {
            let mut h = [0u8; RECORD_HEADER_BYTES as usize];
            if self.backend.read_at(pack, at, &mut h).is_err() {
                break;
            }
            let (kind_byte, codec_byte, stored_len, raw_len, id) = parse_record_header(&h);
            let group = kind_byte == GROUP_KIND;
            let kind = match group {
                true => Some(ObjectKind::Chunk),
                false => ObjectKind::from_u8(kind_byte),
            };
            let (Some(kind), Some(codec)) = (kind, Codec::from_u8(codec_byte)) else {
                break;
            };
            let offset = at + RECORD_HEADER_BYTES;
            if offset + u64::from(stored_len) > len
                || raw_len as usize > codec::MAX_OBJECT_BYTES
                || codec == Codec::Part
            {
                break;
            }
            at = offset + u64::from(stored_len);
            end = at;
            if group {
                let mut stored = vec![0u8; stored_len as usize];
                if self.backend.read_at(pack, offset, &mut stored).is_err() {
                    break;
                }
                let raw = crate::group::decompress(stored, &hex::encode(id))
                    .ok()
                    .filter(|raw| blake3::hash(raw).as_bytes() == &id);
                let Some(raw) = raw else {
                    end = offset - RECORD_HEADER_BYTES;
                    break;
                };
                for (part, n) in crate::group::members(&raw).unwrap_or_default() {
                    let id = *ChunkId::of(&raw[part as usize..(part + n) as usize]).as_bytes();
                    if !seen.insert(id) || index::contains(&conn, &id)? {
                        continue;
                    }
                    let loc = Location {
                        kind,
                        pack: pack.clone(),
                        offset,
                        stored_len,
                        raw_len: n,
                        codec: Codec::Part,
                        part,
                    };
                    rows.push(Row { id, loc });
                }
                continue;
            }
            if kind != ObjectKind::Chunk || !seen.insert(id) || index::contains(&conn, &id)? {
                continue;
            }
            let mut stored = vec![0u8; stored_len as usize];
            if self.backend.read_at(pack, offset, &mut stored).is_err() {
                break;
            }
            let sound = codec::decompress(codec, stored, raw_len as usize, &hex::encode(id))
                .is_ok_and(|raw| ChunkId::of(&raw).as_bytes() == &id);
            if !sound {
                // What follows was written after a damaged record: not trusted either.
                end = offset - RECORD_HEADER_BYTES;
                break;
            }
            let loc = Location {
                kind,
                pack: pack.clone(),
                offset,
                stored_len,
                raw_len,
                codec,
                part: 0,
            };
            rows.push(Row { id, loc });
        }
        rows.retain(|r| r.loc.offset + u64::from(r.loc.stored_len) <= end);
        if rows.is_empty() {
            return Ok(None);
        }
        self.backend
            .sync_dir()
            .map_err(Error::io("sync pack directory", self.layout.packs()))?;
        let n = rows.len() as u64;
        let bytes = stored_bytes(&rows);
        self.commit(
            Pending {
                packs: vec![(pack.clone(), end)],
                rows,
                holds: Holds(vec![hold]),
            },
            |_| Ok(()),
        )?;
        Ok(Some((n, bytes)))
    }
}
