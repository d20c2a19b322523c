//! What a snapshot is made of (for a push), and fetching what only a remote has: a
//! full pull and the lazy fetch of a chunk at its first read.

use std::collections::{BTreeMap, HashSet};
use std::ops::Range;
use std::sync::atomic::Ordering;

use rusqlite::{OptionalExtension, params};

use super::{FETCH_BATCH, FetchCounters, PULL_THREADS, RemoteFetch, RemoteLoc};
use crate::codec::{self, Manifest};
use crate::error::{Error, Result};
use crate::id::{SnapshotId, TreeId};
use crate::index::{Location, ObjectKind};
use crate::lock::StoreLock;
use crate::pack::Codec;
use crate::store::{Store, verify};
use crate::tree::Target;
use crate::writer::{NewObject, PackWriter};

/// A remote object and the ids (with locations) wanted from it.
type ByObject<'a> = BTreeMap<(&'a str, &'a str), Vec<&'a ([u8; 32], RemoteLoc)>>;

/// What a snapshot is made of, for a push.
#[derive(Debug, Default)]
pub struct Closure {
    /// The snapshot, its trees and its manifests.
    pub meta: Vec<([u8; 32], ObjectKind)>,
    /// Every chunk of every file, once.
    pub chunks: Vec<[u8; 32]>,
}

impl Store {
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
                match e.target() {
                    Target::Dir(sub) => stack.push(sub),
                    Target::File(id) | Target::Hardlink(id) if seen.insert(e.hash) => {
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
