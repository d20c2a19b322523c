//! The blob cache: whole file contents as plain read-only files under
//! `<root>/cache/blobs/<2 hex>/<id>`, shared by every workspace of the host, so the daemon
//! can pass reads through to them and checkouts can hard-link them.
//!
//! Entries are written to a temporary name, made read-only and renamed into place, so a
//! reader never sees a partial blob. The cache is bounded: [`BlobCache::evict`] removes
//! the least recently used entries that nobody holds (a caller-supplied test, plus any
//! entry hard-linked elsewhere, i.e. with more than one link).

use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use rusqlite::params;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::id::ContentId;
use crate::snapshot::now_secs;
use crate::store::Store;

/// Contents a thread of [`BlobCache::ensure_all`] takes at a time.
const ENSURE_RUN: usize = 64;

/// Default bound of the blob cache.
pub const DEFAULT_BLOB_CACHE_MAX_BYTES: u64 = 16 * 1024 * 1024 * 1024;

/// The blob cache of a store.
#[derive(Debug)]
pub struct BlobCache<'s> {
    store: &'s Store,
    dir: PathBuf,
}

/// What an eviction did.
#[derive(Debug, Clone, Copy, Serialize, Default)]
pub struct EvictReport {
    pub removed: u64,
    pub bytes_freed: u64,
    pub held_skipped: u64,
    pub bytes_after: u64,
}

impl Store {
    /// The blob cache under this runtime root.
    pub fn blob_cache(&self) -> BlobCache<'_> {
        BlobCache {
            store: self,
            dir: self.layout.blobs(),
        }
    }
}

impl BlobCache<'_> {
    /// Where the blob of `id` lives (whether or not it is there yet).
    pub fn path(&self, id: &ContentId) -> PathBuf {
        self.dir_of(id).join(id.to_hex())
    }

    /// The directory [`BlobCache::path`] puts the blob of `id` in (by its first two hex
    /// digits).
    fn dir_of(&self, id: &ContentId) -> PathBuf {
        self.dir.join(&id.to_hex()[..2])
    }

    /// Makes sure the blob of `id` exists, writing it from the store if needed, and
    /// returns its path. The content is verified while it is written.
    pub fn ensure(&self, id: &ContentId) -> Result<PathBuf> {
        let path = self.path(id);
        let size = match fs::metadata(&path) {
            Ok(m) => Some(m.len()),
            Err(_) => None,
        };
        let expected = self
            .store
            .content_chunks(id)?
            .iter()
            .map(|(_, n)| u64::from(*n))
            .sum();
        if size == Some(expected) {
            self.touch(id, expected)?;
            return Ok(path);
        }
        self.write_blob(id, &path)?;
        self.touch(id, expected)?;
        Ok(path)
    }

    /// [`BlobCache::ensure`] for many contents at once, given with their sizes (best in
    /// the order they were imported): a blob of the right size is taken as present
    /// (blobs appear by rename, whole); the missing ones are written on `threads` threads;
    /// the use of all is recorded in one transaction. For the preparation of a whole
    /// snapshot's blobs.
    pub fn ensure_all(&self, items: &[(ContentId, u64)], threads: usize) -> Result<()> {
        let next = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            let workers: Vec<_> = (0..threads.max(1))
                .map(|_| {
                    s.spawn(|| -> Result<()> {
                        loop {
                            // A run of neighbours at a time: contents stored together
                            // (a group, `cowspace_store` format 2) are then read by one
                            // thread, which decompresses their group once.
                            let i = next.fetch_add(ENSURE_RUN, Ordering::Relaxed);
                            let Some(run) = items.get(i..(i + ENSURE_RUN).min(items.len())) else {
                                return Ok(());
                            };
                            for (id, size) in run {
                                let path = self.path(id);
                                if fs::metadata(&path).map(|m| m.len()).ok() != Some(*size) {
                                    self.write_blob(id, &path)?;
                                }
                            }
                        }
                    })
                })
                .collect();
            for w in workers {
                w.join()
                    .unwrap_or_else(|_| Err(Error::Invalid("a blob writer panicked".into())))?;
            }
            Ok(())
        })?;
        let mut db = self.store.db();
        db.pragma_update(None, "synchronous", "NORMAL")
            .map_err(Error::db("relax sync"))?;
        let recorded = (|| {
            let tx = db.transaction().map_err(Error::db("record blobs"))?;
            {
                let mut stmt = tx
                    .prepare(
                        "INSERT INTO blobcache (id, size, last_used) VALUES (?1, ?2, ?3)
                         ON CONFLICT(id) DO UPDATE SET last_used = excluded.last_used",
                    )
                    .map_err(Error::db("record blobs"))?;
                let now = now_secs();
                for (id, size) in items {
                    stmt.execute(params![&id.as_bytes()[..], *size as i64, now])
                        .map_err(Error::db("record blobs"))?;
                }
            }
            tx.commit().map_err(Error::db("record blobs"))
        })();
        db.pragma_update(None, "synchronous", "FULL")
            .map_err(Error::db("restore sync"))?;
        recorded
    }

    /// Writes the blob of `id` at `path` from the store (verified), by temporary file
    /// and rename.
    fn write_blob(&self, id: &ContentId, path: &std::path::Path) -> Result<()> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let parent = &self.dir_of(id);
        fs::create_dir_all(parent).map_err(Error::io("create directory", parent))?;
        let tmp = parent.join(format!(
            ".tmp-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let result = (|| {
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)
                .map_err(Error::io("create blob", &tmp))?;
            let mut w = std::io::BufWriter::new(&mut f);
            self.store.write_content(id, &mut w)?;
            w.flush().map_err(Error::io("write blob", &tmp))?;
            drop(w);
            f.set_permissions(fs::Permissions::from_mode(0o444))
                .map_err(Error::io("chmod blob", &tmp))?;
            fs::rename(&tmp, path).map_err(Error::io("rename blob into place", path))
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result
    }

    /// Records use of a blob (for eviction order). Written without waiting for a disk
    /// flush: the time is a hint, and this runs on the daemon's open path.
    fn touch(&self, id: &ContentId, size: u64) -> Result<()> {
        self.store.relaxed_write(
            "record blob",
            "INSERT INTO blobcache (id, size, last_used) VALUES (?1, ?2, ?3)
             ON CONFLICT(id) DO UPDATE SET last_used = excluded.last_used",
            params![&id.as_bytes()[..], size as i64, now_secs()],
        )
    }

    /// Entries and bytes in the cache.
    pub fn usage(&self) -> Result<(u64, u64)> {
        self.store.with_reader(|c| {
            c.query_row(
                "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM blobcache",
                [],
                |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64)),
            )
            .map_err(Error::db("measure blob cache"))
        })
    }

    fn remove_entry(&self, id: &ContentId) -> Result<()> {
        let path = self.path(id);
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io("remove blob", &path)(e)),
        }
        self.store
            .db()
            .execute(
                "DELETE FROM blobcache WHERE id = ?1",
                params![&id.as_bytes()[..]],
            )
            .map_err(Error::db("forget blob"))?;
        Ok(())
    }

    fn entries_by_age(&self) -> Result<Vec<(ContentId, u64)>> {
        self.store.with_reader(|c| {
            let mut stmt = c
                .prepare("SELECT id, size FROM blobcache ORDER BY last_used, id")
                .map_err(Error::db("list blobs"))?;
            let rows = stmt
                .query_map([], |r| Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, i64>(1)?)))
                .map_err(Error::db("list blobs"))?
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(Error::db("list blobs"))?;
            rows.into_iter()
                .map(|(b, n)| Ok((ContentId::from_slice(&b)?, n as u64)))
                .collect()
        })
    }

    /// Removes least recently used entries until the cache holds at most `max_bytes`,
    /// skipping entries `held` says are in use and entries linked elsewhere.
    pub fn evict(&self, max_bytes: u64, held: &dyn Fn(&ContentId) -> bool) -> Result<EvictReport> {
        let (_, mut total) = self.usage()?;
        let mut report = EvictReport::default();
        for (id, size) in self.entries_by_age()? {
            if total <= max_bytes {
                break;
            }
            let linked = fs::metadata(self.path(&id))
                .map(|m| m.nlink() > 1)
                .unwrap_or(false);
            if held(&id) || linked {
                report.held_skipped += 1;
                continue;
            }
            self.remove_entry(&id)?;
            total -= size;
            report.removed += 1;
            report.bytes_freed += size;
        }
        report.bytes_after = total;
        Ok(report)
    }

    /// Removes entries whose content is no longer stored (after gc) and nobody links.
    pub fn remove_unstored(&self) -> Result<u64> {
        let mut n = 0;
        for (id, _) in self.entries_by_age()? {
            let linked = fs::metadata(self.path(&id))
                .map(|m| m.nlink() > 1)
                .unwrap_or(false);
            if !linked && !self.store.contains(id.as_bytes())? {
                self.remove_entry(&id)?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// Removes per-mode variants (`<id>.m<mode>`, made for checkouts) that no checkout
    /// links any more. Returns how many were removed.
    pub fn remove_unlinked_variants(&self) -> Result<u64> {
        let mut n = 0;
        let Ok(shards) = fs::read_dir(&self.dir) else {
            return Ok(0);
        };
        for shard in shards.flatten() {
            let Ok(files) = fs::read_dir(shard.path()) else {
                continue;
            };
            for f in files.flatten() {
                let name = f.file_name();
                if !name.to_string_lossy().contains(".m") {
                    continue;
                }
                let unlinked = f.metadata().map(|m| m.nlink() == 1).unwrap_or(false);
                if unlinked {
                    fs::remove_file(f.path())
                        .map_err(Error::io("remove blob variant", f.path()))?;
                    n += 1;
                }
            }
        }
        Ok(n)
    }
}
