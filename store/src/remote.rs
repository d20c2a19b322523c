//! Objects that live on a remote (an S3-compatible object store shared by many hosts):
//! the remotes a root knows, where each remote object is, snapshots whose file contents
//! are not all here yet (partial), and the lazy fetch that brings a missing chunk in at
//! its first read.
//!
//! The store speaks no network protocol: a [`RemoteFetch`] registered with
//! [`Store::set_fetcher`] reads byte ranges of remote objects, and the store verifies
//! every fetched chunk against its id before it is written to a local pack and used, so
//! a damaged or forged remote object is a `Corrupt` error naming it, never data. A chunk
//! fetched once is a local object from then on: it is never fetched twice by this root.
//!
//! The layout of a remote and the [`SnapshotIndex`] encoding are in
//! `docs/store-format.md` ("Remotes").

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};

use rusqlite::{OptionalExtension, params};
use serde::Serialize;

use crate::codec::{self, Manifest};
use crate::error::{Error, Result};
use crate::id::{ContentId, SnapshotId, TreeId};
use crate::index::{Location, ObjectKind};
use crate::lock::StoreLock;
use crate::pack::{Codec, PACK_MAGIC, RECORD_HEADER_BYTES, record_header};
use crate::snapshot::now_secs;
use crate::store::{Store, verify};
use crate::tree::{Kind, Reader};
use crate::writer::{NewObject, PackWriter};

/// Reads byte ranges of objects on remotes (the network side, outside the store).
pub trait RemoteFetch: Send + Sync {
    /// The bytes of `ranges` of object `key` on remote `remote`, in the order asked.
    /// An error says why in words (the store names the remote and the object).
    fn get_ranges(
        &self,
        remote: &str,
        key: &str,
        ranges: &[Range<u64>],
    ) -> std::result::Result<Vec<Vec<u8>>, String>;
}

/// A remote as recorded in the root (no credentials: those come from the environment).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct RemoteConfig {
    pub name: String,
    /// `s3://BUCKET[/PREFIX]`.
    pub url: String,
    pub endpoint: Option<String>,
    pub region: Option<String>,
    /// The remote used when none is named.
    pub default: bool,
    pub added_at: i64,
}

/// What this root fetched from a remote so far.
#[derive(Debug, Clone, Copy, Serialize, Default, PartialEq, Eq)]
pub struct FetchCounters {
    /// Ranged reads (one per remote object per batch).
    pub requests: u64,
    /// Objects fetched and verified.
    pub objects: u64,
    /// Stored (compressed) bytes fetched.
    pub bytes: u64,
}

/// Where an object is on a remote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteLoc {
    pub remote: String,
    /// The key of the remote pack, below the remote's prefix.
    pub key: String,
    pub offset: u64,
    pub stored_len: u32,
    pub raw_len: u32,
    pub codec: Codec,
}

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
            let h = r
                .take(RECORD_HEADER_BYTES as usize)
                .map_err(|_| bad("a metadata record is cut short"))?;
            let kind = ObjectKind::from_u8(h[0]).ok_or_else(|| bad("unknown object kind"))?;
            let codec = Codec::from_u8(h[1]).ok_or_else(|| bad("unknown codec"))?;
            let stored_len = u32::from_le_bytes(h[4..8].try_into().expect("4"));
            let raw_len = u32::from_le_bytes(h[8..12].try_into().expect("4"));
            let id: [u8; 32] = h[12..44].try_into().expect("32");
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

/// A remote object and the ids (with locations) wanted from it.
type ByObject<'a> = BTreeMap<(&'a str, &'a str), Vec<&'a ([u8; 32], RemoteLoc)>>;

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

/// What a snapshot is made of, for a push.
#[derive(Debug, Default)]
pub struct Closure {
    /// The snapshot, its trees and its manifests.
    pub meta: Vec<([u8; 32], ObjectKind)>,
    /// Every chunk of every file, once.
    pub chunks: Vec<[u8; 32]>,
}

/// The fetcher and the fetches under way, per open store.
#[derive(Default)]
pub(crate) struct LazyState {
    fetcher: RwLock<Option<Arc<dyn RemoteFetch>>>,
    /// Whether the index has any remote object rows (no lookup on reads otherwise).
    any: AtomicBool,
    checked_at: Mutex<Option<std::time::Instant>>,
    inflight: Mutex<HashSet<[u8; 32]>>,
    done: Condvar,
}

/// How long a "no remote objects" answer is trusted, in ms.
const RECHECK_MS: u128 = 1000;

/// Ids a lazy fetch asks for in one batch, at most.
const FETCH_BATCH: usize = 4096;
/// Batches a pull fetches at once (each on its own thread, with its own pack).
const PULL_THREADS: usize = 4;

impl Store {
    /// Registers the network side that reads remote objects (see [`RemoteFetch`]).
    pub fn set_fetcher(&self, f: Arc<dyn RemoteFetch>) {
        *self
            .remote
            .fetcher
            .write()
            .unwrap_or_else(|p| p.into_inner()) = Some(f);
    }

    /// Whether any object is known to be on a remote. Once true it stays true for this
    /// open store; a false answer is looked up again after [`RECHECK_MS`] (another
    /// process may have made a remote snapshot known meanwhile).
    pub fn has_remote_objects(&self) -> Result<bool> {
        if self.remote.any.load(Ordering::Acquire) {
            return Ok(true);
        }
        {
            let at = self
                .remote
                .checked_at
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if at.is_some_and(|t| t.elapsed().as_millis() < RECHECK_MS) {
                return Ok(false);
            }
        }
        self.has_remote_objects_now()
    }

    fn has_remote_objects_now(&self) -> Result<bool> {
        let any = self.with_reader(|c| {
            c.query_row("SELECT EXISTS (SELECT 1 FROM remote_objects)", [], |r| {
                r.get::<_, bool>(0)
            })
            .map_err(Error::db("look up remote objects"))
        })?;
        if any {
            self.remote.any.store(true, Ordering::Release);
        }
        *self
            .remote
            .checked_at
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(std::time::Instant::now());
        Ok(any)
    }

    /// Whether some of `chunks` is only on a remote (no lookups when no object is).
    pub fn has_remote_only(&self, chunks: &[(crate::id::ChunkId, u32)]) -> Result<bool> {
        if !self.has_remote_objects()? {
            return Ok(false);
        }
        for (c, _) in chunks {
            if !self.contains(c.as_bytes())? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The remotes this root knows, the default first.
    pub fn remotes(&self) -> Result<Vec<RemoteConfig>> {
        self.with_reader(|c| {
            let mut st = c
                .prepare(
                    "SELECT name, url, endpoint, region, is_default, added_at FROM remotes \
                     ORDER BY is_default DESC, name",
                )
                .map_err(Error::db("list remotes"))?;
            st.query_map([], |r| {
                Ok(RemoteConfig {
                    name: r.get(0)?,
                    url: r.get(1)?,
                    endpoint: r.get(2)?,
                    region: r.get(3)?,
                    default: r.get(4)?,
                    added_at: r.get(5)?,
                })
            })
            .map_err(Error::db("list remotes"))?
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(Error::db("list remotes"))
        })
    }

    /// A remote by name, or the default one for `None`.
    pub fn remote(&self, name: Option<&str>) -> Result<RemoteConfig> {
        let all = self.remotes()?;
        match name {
            Some(n) => all
                .into_iter()
                .find(|r| r.name == n)
                .ok_or_else(|| Error::not_found("remote", crate::error::shown_bare(n))),
            None => all.into_iter().next().ok_or(Error::NoRemote),
        }
    }

    /// Records a remote (the first one becomes the default).
    pub fn add_remote(&self, r: &RemoteConfig) -> Result<RemoteConfig> {
        crate::refs::check_ref_name(&r.name).map_err(|_| {
            Error::Invalid(format!(
                "remote name {:?}: use letters, digits, '.', '_' or '-'",
                r.name
            ))
        })?;
        if r.name.contains('/') {
            return Err(Error::Invalid(format!(
                "remote name {:?}: no '/' (refs fetched from it are named NAME/REF)",
                r.name
            )));
        }
        let conn = self.db();
        let exists: bool = conn
            .query_row(
                "SELECT EXISTS (SELECT 1 FROM remotes WHERE name = ?1)",
                [&r.name],
                |x| x.get(0),
            )
            .map_err(Error::db("look up remote"))?;
        if exists {
            return Err(Error::DestinationExists {
                what: "remote",
                path: r.name.clone().into(),
            });
        }
        let first: bool = conn
            .query_row("SELECT NOT EXISTS (SELECT 1 FROM remotes)", [], |x| {
                x.get(0)
            })
            .map_err(Error::db("look up remotes"))?;
        let now = now_secs();
        conn.execute(
            "INSERT INTO remotes (name, url, endpoint, region, is_default, added_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![r.name, r.url, r.endpoint, r.region, first, now],
        )
        .map_err(Error::db("record remote"))?;
        Ok(RemoteConfig {
            default: first,
            added_at: now,
            ..r.clone()
        })
    }

    /// Forgets a remote. Refused while a snapshot here still needs objects only it has.
    pub fn remove_remote(&self, name: &str) -> Result<()> {
        self.remote(Some(name))?;
        let mut conn = self.db();
        let tx = conn.transaction().map_err(Error::db("begin"))?;
        let partial: Vec<Vec<u8>> = {
            let mut st = tx
                .prepare("SELECT snapshot FROM remote_snapshots WHERE remote = ?1 AND partial")
                .map_err(Error::db("list partial snapshots"))?;
            st.query_map([name], |r| r.get(0))
                .map_err(Error::db("list partial snapshots"))?
                .collect::<std::result::Result<_, _>>()
                .map_err(Error::db("list partial snapshots"))?
        };
        if let Some(s) = partial.first() {
            return Err(Error::Busy(format!(
                "snapshot {} (and {} more) still reads file contents from remote {name}: \
                 `mountctl pull` it first, or remove its workspaces and run `mountctl gc`",
                hex::encode(s),
                partial.len() - 1
            )));
        }
        tx.execute("DELETE FROM remote_objects WHERE remote = ?1", [name])
            .map_err(Error::db("forget remote objects"))?;
        tx.execute("DELETE FROM remote_stats WHERE remote = ?1", [name])
            .map_err(Error::db("forget remote"))?;
        let was_default: bool = tx
            .query_row(
                "SELECT is_default FROM remotes WHERE name = ?1",
                [name],
                |r| r.get(0),
            )
            .map_err(Error::db("look up remote"))?;
        tx.execute("DELETE FROM remotes WHERE name = ?1", [name])
            .map_err(Error::db("forget remote"))?;
        if was_default {
            tx.execute(
                "UPDATE remotes SET is_default = 1 WHERE name = (SELECT name FROM remotes ORDER BY name LIMIT 1)",
                [],
            )
            .map_err(Error::db("choose default remote"))?;
        }
        tx.commit().map_err(Error::db("commit"))?;
        Ok(())
    }

    /// Every id a remote holds for this root, and the snapshots read from a remote.
    pub(crate) fn remote_ids(&self) -> Result<(HashSet<[u8; 32]>, HashSet<SnapshotId>)> {
        self.with_reader(|c| {
            let ids = |sql: &str| -> Result<Vec<[u8; 32]>> {
                let mut st = c.prepare(sql).map_err(Error::db("list remote objects"))?;
                let rows = st
                    .query_map([], |r| r.get::<_, Vec<u8>>(0))
                    .map_err(Error::db("list remote objects"))?
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(Error::db("list remote objects"))?;
                Ok(rows
                    .iter()
                    .filter_map(|b| <[u8; 32]>::try_from(b.as_slice()).ok())
                    .collect())
            };
            let objects = ids("SELECT id FROM remote_objects")?.into_iter().collect();
            let snaps = ids("SELECT snapshot FROM remote_snapshots")?
                .into_iter()
                .map(SnapshotId::from_bytes)
                .collect();
            Ok((objects, snaps))
        })
    }

    /// What this root fetched from `remote`.
    pub fn fetch_counters(&self, remote: &str) -> Result<FetchCounters> {
        self.with_reader(|c| {
            c.query_row(
                "SELECT requests, objects, bytes FROM remote_stats WHERE remote = ?1",
                [remote],
                |r| {
                    Ok(FetchCounters {
                        requests: r.get::<_, i64>(0)? as u64,
                        objects: r.get::<_, i64>(1)? as u64,
                        bytes: r.get::<_, i64>(2)? as u64,
                    })
                },
            )
            .optional()
            .map_err(Error::db("read fetch counters"))
            .map(Option::unwrap_or_default)
        })
    }

    /// Whether some file content of `snapshot` is still only on a remote.
    pub fn is_partial(&self, snapshot: &SnapshotId) -> Result<Option<String>> {
        self.with_reader(|c| {
            c.query_row(
                "SELECT remote FROM remote_snapshots WHERE snapshot = ?1 AND partial",
                [&snapshot.as_bytes()[..]],
                |r| r.get(0),
            )
            .optional()
            .map_err(Error::db("look up partial snapshot"))
        })
    }

    /// The remote a snapshot was read from, if it was.
    pub fn remote_of(&self, snapshot: &SnapshotId) -> Result<Option<String>> {
        self.with_reader(|c| {
            c.query_row(
                "SELECT remote FROM remote_snapshots WHERE snapshot = ?1",
                [&snapshot.as_bytes()[..]],
                |r| r.get(0),
            )
            .optional()
            .map_err(Error::db("look up remote snapshot"))
        })
    }

    /// Brings in those of `ids` only a remote has (see `fetch_missing`).
    pub fn fetch_objects(&self, ids: &[[u8; 32]]) -> Result<FetchCounters> {
        let mut total = FetchCounters::default();
        for batch in ids.chunks(FETCH_BATCH) {
            let got = self.fetch_missing(batch)?;
            total.requests += got.requests;
            total.objects += got.objects;
            total.bytes += got.bytes;
        }
        Ok(total)
    }

    /// The snapshot, its trees, manifests and chunks (metadata must be here).
    pub fn closure(&self, snapshot: &SnapshotId) -> Result<Closure> {
        let snap = self.snapshot(snapshot)?;
        let mut out = Closure::default();
        out.meta.push((*snapshot.as_bytes(), ObjectKind::Snapshot));
        let mut seen: HashSet<[u8; 32]> = HashSet::new();
        let mut stack: Vec<TreeId> = vec![snap.root];
        while let Some(t) = stack.pop() {
            if !seen.insert(*t.as_bytes()) {
                continue;
            }
            out.meta.push((*t.as_bytes(), ObjectKind::Tree));
            for e in &self.tree(&t)?.entries {
                match e.kind {
                    Kind::Dir => stack.push(e.subtree().expect("dir")),
                    Kind::File | Kind::Hardlink if seen.insert(e.hash) => {
                        let id = ContentId::from_bytes(e.hash);
                        match self.locate(&e.hash)? {
                            Some(l) if l.kind == ObjectKind::Manifest => {
                                out.meta.push((e.hash, ObjectKind::Manifest));
                                let bytes = self.read_object(&e.hash, ObjectKind::Manifest)?;
                                for (c, _) in Manifest::decode(&id, &bytes)?.chunks {
                                    if seen.insert(*c.as_bytes()) {
                                        out.chunks.push(*c.as_bytes());
                                    }
                                }
                            }
                            _ => out.chunks.push(e.hash),
                        }
                    }
                    _ => {}
                }
            }
        }
        Ok(out)
    }

    /// An object's location here and its stored (compressed) bytes, as in its pack. A
    /// member of a group is given on its own (compressed again, its location saying so):
    /// a remote holds every chunk on its own, so a lazy read fetches only its own bytes.
    pub fn stored_object(&self, id: &[u8; 32]) -> Result<Option<(Location, Vec<u8>)>> {
        let Some(loc) = self.locate(id)? else {
            return Ok(None);
        };
        if loc.codec == Codec::Part {
            let raw = self.read_located(id, &loc)?;
            verify(loc.kind, id, &raw)?;
            let (codec, stored) =
                codec::with_compressor(self.config.zstd_level, |c| codec::compress(c, raw))?;
            let loc = Location {
                stored_len: stored.len() as u32,
                codec,
                part: 0,
                ..loc
            };
            return Ok(Some((loc, stored)));
        }
        let mut stored = vec![0u8; loc.stored_len as usize];
        self.backend
            .read_at(&loc.pack, loc.offset, &mut stored)
            .map_err(Error::io("read pack", self.backend.location(&loc.pack)))?;
        // What goes to a remote is checked first: a damaged local object is not spread.
        let raw = codec::decompress(
            loc.codec,
            stored.clone(),
            loc.raw_len as usize,
            &hex::encode(id),
        )?;
        verify(loc.kind, id, &raw)?;
        Ok(Some((loc, stored)))
    }

    /// [`Store::stored_object`] of many objects, in order, on every core (each takes a
    /// contiguous part, so the members of one group mostly go to one thread and their
    /// group is decompressed once); the first object not stored is an error.
    pub fn stored_objects(&self, ids: &[[u8; 32]]) -> Result<Vec<(Location, Vec<u8>)>> {
        let threads = self.config.worker_count().clamp(1, ids.len().max(1));
        let per = ids.len().div_ceil(threads).max(1);
        std::thread::scope(|s| {
            let parts: Vec<_> = ids
                .chunks(per)
                .map(|part| {
                    s.spawn(move || {
                        part.iter()
                            .map(|id| {
                                self.stored_object(id)?.ok_or_else(|| Error::NotFound {
                                    what: "chunk",
                                    name: hex::encode(id),
                                })
                            })
                            .collect::<Result<Vec<_>>>()
                    })
                })
                .collect();
            let mut out = Vec::with_capacity(ids.len());
            for p in parts {
                out.extend(p.join().map_err(|_| {
                    Error::Invalid("a thread reading objects for a push panicked".into())
                })??);
            }
            Ok(out)
        })
    }

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

    /// Fetches every chunk of `snapshot` that is not here yet (a full pull) and marks it
    /// complete. Returns what was fetched.
    pub fn fetch_snapshot(&self, snapshot: &SnapshotId) -> Result<FetchCounters> {
        let closure = self.closure(snapshot)?;
        let mut missing = Vec::new();
        for c in &closure.chunks {
            if !self.contains(c)? {
                missing.push(*c);
            }
        }
        // Batches on several threads: one waits for its ranges while another
        // decompresses and hashes what it got (each batch is its own pack and commit).
        let batches: Vec<&[[u8; 32]]> = missing.chunks(FETCH_BATCH).collect();
        let next = std::sync::atomic::AtomicUsize::new(0);
        let threads = PULL_THREADS.min(batches.len()).max(1);
        let results: Vec<Result<FetchCounters>> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads)
                .map(|_| {
                    scope.spawn(|| -> Result<FetchCounters> {
                        let mut t = FetchCounters::default();
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            let Some(batch) = batches.get(i) else {
                                return Ok(t);
                            };
                            let got = self.fetch_missing(batch).inspect_err(|_| {
                                // The others stop at their next batch.
                                next.store(batches.len(), Ordering::Relaxed);
                            })?;
                            t.requests += got.requests;
                            t.objects += got.objects;
                            t.bytes += got.bytes;
                        }
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        let mut total = FetchCounters::default();
        for r in results {
            let got = r?;
            total.requests += got.requests;
            total.objects += got.objects;
            total.bytes += got.bytes;
        }
        for c in &closure.chunks {
            if !self.contains(c)? {
                return Err(Error::not_found(
                    "chunk",
                    format!(
                        "{} of snapshot {} (on no remote this root knows)",
                        hex::encode(c),
                        snapshot.to_hex()
                    ),
                ));
            }
        }
        self.db()
            .execute(
                "UPDATE remote_snapshots SET partial = 0 WHERE snapshot = ?1",
                [&snapshot.as_bytes()[..]],
            )
            .map_err(Error::db("mark snapshot complete"))?;
        Ok(total)
    }

    /// Brings in those of `ids` that are only on a remote: fetched by ranges (grouped by
    /// remote pack), verified, written to a new local pack and committed. Ids that are
    /// stored, or on no remote, are left alone (the caller's lookup then reports them).
    /// Concurrent callers wanting the same ids wait for one fetch.
    pub(crate) fn fetch_missing(&self, ids: &[[u8; 32]]) -> Result<FetchCounters> {
        // Only on a miss: looked up every time (a snapshot may have become known since).
        if ids.is_empty()
            || !(self.remote.any.load(Ordering::Acquire) || self.has_remote_objects_now()?)
        {
            return Ok(FetchCounters::default());
        }
        let Some(fetcher) = self
            .remote
            .fetcher
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        else {
            return Ok(FetchCounters::default());
        };
        let mut total = FetchCounters::default();
        // Twice at most: a second round takes over what another caller failed to fetch.
        for _ in 0..2 {
            let wanted = self.remote_rows_missing(ids)?;
            if wanted.is_empty() {
                break;
            }
            let (mine, others) = {
                let mut inflight = self
                    .remote
                    .inflight
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                let mut mine = Vec::new();
                let mut others = Vec::new();
                for (id, loc) in wanted {
                    if inflight.insert(id) {
                        mine.push((id, loc));
                    } else {
                        others.push(id);
                    }
                }
                (mine, others)
            };
            let result = self.fetch_rows(fetcher.as_ref(), &mine);
            {
                let mut inflight = self
                    .remote
                    .inflight
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                for (id, _) in &mine {
                    inflight.remove(id);
                }
                self.remote.done.notify_all();
            }
            let got = result?;
            total.requests += got.requests;
            total.objects += got.objects;
            total.bytes += got.bytes;
            if others.is_empty() {
                break;
            }
            let mut inflight = self
                .remote
                .inflight
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            while others.iter().any(|id| inflight.contains(id)) {
                inflight = self
                    .remote
                    .done
                    .wait(inflight)
                    .unwrap_or_else(|p| p.into_inner());
            }
        }
        Ok(total)
    }

    /// Of `ids`, those not stored here that a remote has, with one location each.
    fn remote_rows_missing(&self, ids: &[[u8; 32]]) -> Result<Vec<([u8; 32], RemoteLoc)>> {
        self.with_reader(|c| {
            let mut here = c
                .prepare_cached("SELECT EXISTS (SELECT 1 FROM objects WHERE id = ?1)")
                .map_err(Error::db("look up object"))?;
            let mut remote = c
                .prepare_cached(
                    "SELECT remote, pack, offset, stored_len, raw_len, codec FROM remote_objects \
                     WHERE id = ?1 ORDER BY remote LIMIT 1",
                )
                .map_err(Error::db("look up remote objects"))?;
            let mut out = Vec::new();
            let mut seen = HashSet::new();
            for id in ids {
                if !seen.insert(*id)
                    || here
                        .query_row([&id[..]], |r| r.get::<_, bool>(0))
                        .map_err(Error::db("look up object"))?
                {
                    continue;
                }
                let row = remote
                    .query_row([&id[..]], |r| {
                        Ok(RemoteLoc {
                            remote: r.get(0)?,
                            key: r.get(1)?,
                            offset: r.get::<_, i64>(2)? as u64,
                            stored_len: r.get(3)?,
                            raw_len: r.get(4)?,
                            codec: Codec::from_u8(r.get(5)?).unwrap_or(Codec::Raw),
                        })
                    })
                    .optional()
                    .map_err(Error::db("look up remote objects"))?;
                if let Some(loc) = row {
                    out.push((*id, loc));
                }
            }
            Ok(out)
        })
    }

    fn fetch_rows(
        &self,
        fetcher: &dyn RemoteFetch,
        rows: &[([u8; 32], RemoteLoc)],
    ) -> Result<FetchCounters> {
        if rows.is_empty() {
            return Ok(FetchCounters::default());
        }
        let mut by_object: ByObject<'_> = BTreeMap::new();
        for r in rows {
            by_object
                .entry((r.1.remote.as_str(), r.1.key.as_str()))
                .or_default()
                .push(r);
        }
        let _lock = StoreLock::shared(self)?;
        let mut writer = PackWriter::new(self.backend.clone());
        let mut counts: BTreeMap<&str, FetchCounters> = BTreeMap::new();
        let made = (|| -> Result<()> {
            for ((remote, key), group) in &by_object {
                let ranges: Vec<Range<u64>> = group
                    .iter()
                    .map(|(_, l)| l.offset..l.offset + u64::from(l.stored_len))
                    .collect();
                let got =
                    fetcher
                        .get_ranges(remote, key, &ranges)
                        .map_err(|why| Error::Remote {
                            remote: remote.to_string(),
                            object: key.to_string(),
                            why,
                        })?;
                if got.len() != group.len() {
                    return Err(Error::Remote {
                        remote: remote.to_string(),
                        object: key.to_string(),
                        why: format!("{} ranges asked, {} answered", group.len(), got.len()),
                    });
                }
                let c = counts.entry(remote).or_default();
                c.requests += 1;
                for ((id, loc), stored) in group.iter().map(|r| (&r.0, &r.1)).zip(got) {
                    let hexid = hex::encode(id);
                    let where_ = || {
                        format!(
                            "fetched from remote {} object {key} at {}",
                            loc.remote, loc.offset
                        )
                    };
                    if stored.len() != loc.stored_len as usize {
                        return Err(Error::corrupt(
                            "chunk",
                            &hexid,
                            format!(
                                "{}: {} bytes, not {}",
                                where_(),
                                stored.len(),
                                loc.stored_len
                            ),
                        ));
                    }
                    let raw =
                        codec::decompress(loc.codec, stored.clone(), loc.raw_len as usize, &hexid)
                            .map_err(|_| {
                                Error::corrupt(
                                    "chunk",
                                    &hexid,
                                    format!("{}: does not decompress; not used", where_()),
                                )
                            })?;
                    if crate::id::ChunkId::of(&raw).as_bytes() != id {
                        return Err(Error::corrupt(
                            "chunk",
                            &hexid,
                            format!("{}: its bytes do not hash to its id; not used", where_()),
                        ));
                    }
                    c.objects += 1;
                    c.bytes += stored.len() as u64;
                    writer.add(NewObject {
                        id: *id,
                        kind: ObjectKind::Chunk,
                        codec: loc.codec,
                        raw_len: loc.raw_len,
                        stored,
                        members: Vec::new(),
                    })?;
                }
            }
            Ok(())
        })();
        if let Err(e) = made {
            writer.abort();
            // What was fetched and verified before the error is kept only by the next
            // fetch; counters count what is committed.
            return Err(e);
        }
        let pending = writer.finish()?;
        let mut total = FetchCounters::default();
        for c in counts.values() {
            total.requests += c.requests;
            total.objects += c.objects;
            total.bytes += c.bytes;
        }
        self.commit(pending, move |tx| {
            for (remote, c) in &counts {
                tx.execute(
                    "INSERT INTO remote_stats (remote, requests, objects, bytes) VALUES (?1, ?2, ?3, ?4) \
                     ON CONFLICT (remote) DO UPDATE SET requests = requests + ?2, \
                     objects = objects + ?3, bytes = bytes + ?4",
                    params![remote, c.requests as i64, c.objects as i64, c.bytes as i64],
                )
                .map_err(Error::db("count fetches"))?;
            }
            Ok(())
        })?;
        Ok(total)
    }

    /// Drops remote rows of objects no live snapshot needs (`live`: gc's mark), and the
    /// partial marks of snapshots that are gone. In gc's transaction.
    pub(crate) fn prune_remote_rows(
        tx: &rusqlite::Transaction<'_>,
        live: &HashSet<[u8; 32]>,
    ) -> Result<u64> {
        let ids: Vec<Vec<u8>> = {
            let mut st = tx
                .prepare("SELECT DISTINCT id FROM remote_objects")
                .map_err(Error::db("list remote objects"))?;
            st.query_map([], |r| r.get(0))
                .map_err(Error::db("list remote objects"))?
                .collect::<std::result::Result<_, _>>()
                .map_err(Error::db("list remote objects"))?
        };
        let mut n = 0;
        for id in ids {
            let Ok(a) = <[u8; 32]>::try_from(id.as_slice()) else {
                continue;
            };
            if !live.contains(&a) {
                n += tx
                    .execute("DELETE FROM remote_objects WHERE id = ?1", [&id])
                    .map_err(Error::db("forget remote object"))? as u64;
            }
        }
        tx.execute(
            "DELETE FROM remote_snapshots WHERE snapshot NOT IN (SELECT id FROM objects)",
            [],
        )
        .map_err(Error::db("prune partial snapshots"))?;
        Ok(n)
    }
}

fn insert_remote_rows(
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
