//! The [`Store`]: opening a runtime root, reading objects (always verified), and committing
//! what a write session produced.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use rusqlite::{Connection, Transaction, params};

use crate::codec::{self, Manifest};
use crate::error::{Error, Result};
use crate::id::{ChunkId, ContentId, SnapshotId, TreeId};
use crate::index::{self, Location, ObjectKind};
use crate::layout::Layout;
use crate::pack::{self, Codec, LocalPacks, PackBackend, PackId};
use crate::snapshot::Snapshot;
use crate::tree::Tree;
use crate::writer::Pending;

/// Connections kept for readers.
const MAX_IDLE_READERS: usize = 16;
/// SQLite page cache of the writer connection, in KiB (SQLite's default is 2 MiB). A
/// cold import commits ~100,000 object and stat-cache rows in one transaction; with the
/// default cache SQLite spills dirty pages to the WAL many times over before the commit.
const WRITER_CACHE_KIB: i64 = 64 * 1024;
/// Import workers beyond one per core. A worker that waits (for the pack writer, for
/// the walk's next batch, for a page) would otherwise leave its core idle; measured on
/// 2 cores, 4 workers import the Linux tree 5-10% faster than 2.
const EXTRA_WORKERS: usize = 2;

/// Settings of an open store.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// zstd level for new objects (1-19).
    pub zstd_level: i32,
    /// Hashing/compression threads for imports (0 = one per core plus
    /// `EXTRA_WORKERS`, 2).
    pub workers: usize,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            zstd_level: codec::DEFAULT_ZSTD_LEVEL,
            workers: 0,
        }
    }
}

impl StoreConfig {
    pub(crate) fn worker_count(&self) -> usize {
        if self.workers > 0 {
            return self.workers;
        }
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
            + EXTRA_WORKERS
    }
}

/// An open store in a runtime root.
pub struct Store {
    pub(crate) layout: Layout,
    pub(crate) config: StoreConfig,
    pub(crate) backend: Arc<dyn PackBackend>,
    /// Closed before the writer (fields drop in order): the last connection to close
    /// checkpoints the WAL and deletes it, and only a writer can. Were a read-only one
    /// last, the WAL would stay, and the next process to open the store would rebuild
    /// its index with nothing marked copied, and copy (and sync) every frame of it into
    /// the database again at its first commit: a whole cold import's worth of pages.
    readers: Mutex<Vec<Connection>>,
    pub(crate) db: Mutex<Connection>,
    pub(crate) remote: crate::lazy::LazyState,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("root", &self.layout.root)
            .finish()
    }
}

impl Store {
    /// Creates a runtime root (refuses if one is there) and opens it.
    pub fn init(root: &Path, config: StoreConfig) -> Result<Store> {
        let layout = Layout::new(root);
        if layout.index().exists() {
            return Err(Error::RootExists(root.to_path_buf()));
        }
        for d in layout.dirs() {
            fs::create_dir_all(&d).map_err(Error::io("create directory", &d))?;
        }
        // The index is created under a temporary name and renamed into place, so a crash
        // during init leaves no half-made root that `open` would accept. It stays in WAL
        // mode (closing the only connection checkpoints and deletes `index.db.init-wal`),
        // so the processes that open the new root first need not switch the journal mode.
        let tmp = layout.store_dir().join("index.db.init");
        for stale in ["", "-wal", "-shm"] {
            let _ = fs::remove_file(layout.store_dir().join(format!("index.db.init{stale}")));
        }
        {
            let conn = index::create(&tmp)?;
            conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
                .map_err(Error::db("checkpoint new index"))?;
        }
        for side in ["-wal", "-shm"] {
            let p = layout.store_dir().join(format!("index.db.init{side}"));
            if p.exists() {
                return Err(Error::io("close new index", &p)(std::io::Error::other(
                    "still present after the last connection closed",
                )));
            }
        }
        fs::rename(&tmp, layout.index()).map_err(Error::io("create index", layout.index()))?;
        pack::sync_dir(&layout.store_dir()).map_err(Error::io("sync", layout.store_dir()))?;
        Store::open(root, config)
    }

    /// Opens an existing runtime root.
    pub fn open(root: &Path, config: StoreConfig) -> Result<Store> {
        let layout = Layout::new(root);
        if !layout.index().is_file() {
            return Err(Error::RootMissing(root.to_path_buf()));
        }
        let backend: Arc<dyn PackBackend> = Arc::new(LocalPacks::new(layout.packs()));
        Store::open_with_backend(root, config, backend)
    }

    /// Opens with another pack backend (fault injection in tests, remote stores later).
    pub fn open_with_backend(
        root: &Path,
        config: StoreConfig,
        backend: Arc<dyn PackBackend>,
    ) -> Result<Store> {
        let layout = Layout::new(root);
        if !layout.index().is_file() {
            return Err(Error::RootMissing(root.to_path_buf()));
        }
        let conn = index::open(&layout.index())?;
        conn.pragma_update(None, "cache_size", -WRITER_CACHE_KIB)
            .map_err(Error::db("set cache size"))?;
        Ok(Store {
            layout,
            config,
            backend,
            db: Mutex::new(conn),
            readers: Mutex::new(Vec::new()),
            remote: Default::default(),
        })
    }

    /// The runtime root.
    pub fn root(&self) -> &Path {
        &self.layout.root
    }

    /// Paths under the runtime root.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub(crate) fn db(&self) -> MutexGuard<'_, Connection> {
        self.db.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` with a reader connection from the pool.
    pub(crate) fn with_reader<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let conn = self.readers.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let conn = match conn {
            Some(c) => c,
            None => index::open_reader(&self.layout.index())?,
        };
        let out = f(&conn);
        let mut pool = self.readers.lock().unwrap_or_else(|p| p.into_inner());
        if pool.len() < MAX_IDLE_READERS {
            pool.push(conn);
        }
        out
    }

    /// Where an object is, if stored.
    pub fn locate(&self, id: &[u8; 32]) -> Result<Option<Location>> {
        self.with_reader(|c| index::locate(c, id))
    }

    /// Where an object is; one only on a remote is fetched first (see
    /// [`crate::remote`]).
    pub(crate) fn locate_or_fetch(&self, id: &[u8; 32]) -> Result<Option<Location>> {
        if let Some(l) = self.locate(id)? {
            return Ok(Some(l));
        }
        self.fetch_missing(&[*id])?;
        self.locate(id)
    }

    /// Fetches, in one batch, those of a content's chunks that are only on a remote.
    pub(crate) fn prefetch(&self, chunks: &[(ChunkId, u32)]) -> Result<()> {
        if chunks.len() > 1 {
            let ids: Vec<[u8; 32]> = chunks.iter().map(|(c, _)| *c.as_bytes()).collect();
            self.fetch_missing(&ids)?;
        }
        Ok(())
    }

    /// Whether an object (chunk, manifest, tree or snapshot) is stored.
    pub fn contains(&self, id: &[u8; 32]) -> Result<bool> {
        self.with_reader(|c| index::contains(c, id))
    }

    /// Reads and decompresses an object's bytes from its pack, unverified.
    pub(crate) fn read_located(&self, id: &[u8; 32], loc: &Location) -> Result<Vec<u8>> {
        if loc.codec == Codec::Part {
            let hexid = hex::encode(id);
            return crate::group::read_part(
                &loc.pack,
                loc.offset,
                loc.part,
                loc.raw_len,
                &hexid,
                || self.read_stored(id, loc),
            );
        }
        let stored = self.read_stored(id, loc)?;
        codec::decompress(loc.codec, stored, loc.raw_len as usize, &hex::encode(id))
    }

    /// The stored bytes `loc` names (a group member's: its group's).
    pub(crate) fn read_stored(&self, id: &[u8; 32], loc: &Location) -> Result<Vec<u8>> {
        let hexid = hex::encode(id);
        let mut stored = vec![0u8; loc.stored_len as usize];
        self.backend
            .read_at(&loc.pack, loc.offset, &mut stored)
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    Error::corrupt(
                        loc.kind.as_str(),
                        &hexid,
                        format!("pack {} is truncated", loc.pack),
                    )
                } else {
                    Error::Io {
                        step: "read pack",
                        path: PathBuf::from(self.backend.location(&loc.pack)),
                        source: e,
                    }
                }
            })?;
        Ok(stored)
    }

    /// Reads an object where `loc` (just looked up) says it is. When its pack is gone, a
    /// gc or repack moved the object and deleted the pack after the lookup: it is looked
    /// up once more and read where it is now.
    fn read_indexed(&self, id: &[u8; 32], loc: Location) -> Result<(Location, Vec<u8>)> {
        match self.read_located(id, &loc) {
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                let again = self.locate(id)?;
                match again {
                    Some(now) if now != loc => {
                        let data = self.read_located(id, &now)?;
                        Ok((now, data))
                    }
                    _ => Err(Error::Io {
                        step: "read pack",
                        path: PathBuf::from(self.backend.location(&loc.pack)),
                        source,
                    }),
                }
            }
            r => r.map(|d| (loc, d)),
        }
    }

    /// Reads an object of the expected kind and verifies it against its id.
    pub(crate) fn read_object(&self, id: &[u8; 32], kind: ObjectKind) -> Result<Vec<u8>> {
        let hexid = hex::encode(id);
        let loc = self
            .locate_or_fetch(id)?
            .ok_or_else(|| Error::not_found(kind.as_str(), hexid.clone()))?;
        if loc.kind != kind {
            return Err(Error::not_found(kind.as_str(), hexid));
        }
        let (_, data) = self.read_indexed(id, loc)?;
        verify(kind, id, &data)?;
        Ok(data)
    }

    /// Reads and decodes a tree.
    pub fn tree(&self, id: &TreeId) -> Result<Tree> {
        let bytes = self.read_object(id.as_bytes(), ObjectKind::Tree)?;
        Tree::decode(id, &bytes)
    }

    /// Reads and decodes a snapshot.
    pub fn snapshot(&self, id: &SnapshotId) -> Result<Snapshot> {
        let bytes = self.read_object(id.as_bytes(), ObjectKind::Snapshot)?;
        Snapshot::decode(id, &bytes)
    }

    /// The chunks of a file's content, in order (one chunk for small files).
    pub fn content_chunks(&self, id: &ContentId) -> Result<Vec<(ChunkId, u32)>> {
        let loc = self
            .locate_or_fetch(id.as_bytes())?
            .ok_or_else(|| Error::not_found("content", id.to_hex()))?;
        match loc.kind {
            ObjectKind::Chunk => Ok(vec![(ChunkId::from_bytes(*id.as_bytes()), loc.raw_len)]),
            ObjectKind::Manifest => {
                let (_, bytes) = self.read_indexed(id.as_bytes(), loc)?;
                Ok(Manifest::decode(id, &bytes)?.chunks)
            }
            _ => Err(Error::not_found("content", id.to_hex())),
        }
    }

    /// Reads a chunk, verified.
    pub fn chunk(&self, id: &ChunkId) -> Result<Vec<u8>> {
        self.read_object(id.as_bytes(), ObjectKind::Chunk)
    }

    /// Writes a file's whole content to `out`, verifying every chunk and the whole.
    /// Returns the number of bytes written.
    pub fn write_content(&self, id: &ContentId, out: &mut dyn Write) -> Result<u64> {
        let chunks = self.content_chunks(id)?;
        self.prefetch(&chunks)?;
        let mut hasher = (chunks.len() > 1).then(blake3::Hasher::new);
        let mut total = 0u64;
        for (cid, len) in &chunks {
            let data = self.chunk(cid)?;
            if data.len() != *len as usize {
                return Err(Error::corrupt("manifest", id, "a chunk's length differs"));
            }
            if let Some(h) = hasher.as_mut() {
                h.update(&data);
            }
            out.write_all(&data)
                .map_err(Error::io("write content of", id.to_hex()))?;
            total += data.len() as u64;
        }
        if let Some(h) = hasher
            && h.finalize().as_bytes() != id.as_bytes()
        {
            return Err(Error::corrupt(
                "content",
                id,
                "the chunks do not hash to the content id",
            ));
        }
        Ok(total)
    }

    /// Reads a file's whole content into memory (verified).
    pub fn read_content(&self, id: &ContentId) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.write_content(id, &mut out)?;
        Ok(out)
    }

    /// Makes a write session's packs count: records them and their objects in one
    /// transaction, together with whatever `extra` writes (snapshot refs, stat cache).
    /// The packs were synced by the writer, so a committed row never names missing bytes.
    pub(crate) fn commit<T>(
        &self,
        mut pending: Pending,
        extra: impl FnOnce(&Transaction<'_>) -> Result<T>,
    ) -> Result<T> {
        // Rows in key order: the B-tree inserts then append to the same few pages
        // instead of touching a random page per row (ids are uniformly distributed).
        pending.rows.sort_unstable_by_key(|r| r.id);
        let mut conn = self.db();
        let tx = conn.transaction().map_err(Error::db("begin commit"))?;
        {
            let now = crate::snapshot::now_secs();
            let mut add_pack = tx
                .prepare_cached("INSERT INTO packs (id, size, created_at) VALUES (?1, ?2, ?3)")
                .map_err(Error::db("prepare pack insert"))?;
            for (pack, size) in &pending.packs {
                add_pack
                    .execute(params![pack.as_str(), *size as i64, now])
                    .map_err(Error::db("record pack"))?;
            }
            insert_many(
                &tx,
                "INSERT OR IGNORE INTO objects (id, kind, pack, offset, stored_len, raw_len, codec, part)",
                8,
                &pending.rows,
                |st, i, r| {
                    st.raw_bind_parameter(i, &r.id[..])?;
                    st.raw_bind_parameter(i + 1, r.loc.kind as u8)?;
                    st.raw_bind_parameter(i + 2, r.loc.pack.as_str())?;
                    st.raw_bind_parameter(i + 3, r.loc.offset as i64)?;
                    st.raw_bind_parameter(i + 4, r.loc.stored_len)?;
                    st.raw_bind_parameter(i + 5, r.loc.raw_len)?;
                    st.raw_bind_parameter(i + 6, r.loc.codec as u8)?;
                    st.raw_bind_parameter(i + 7, r.loc.part)
                },
            )
            .map_err(Error::db("record objects"))?;
            crate::suspects::replace(&tx, &pending.rows)?;
        }
        let out = extra(&tx)?;
        tx.commit().map_err(Error::db("commit"))?;
        Ok(out)
    }

    /// Every stored snapshot id, newest first.
    pub fn snapshot_ids(&self) -> Result<Vec<SnapshotId>> {
        self.with_reader(|c| {
            let mut stmt = c
                .prepare("SELECT id FROM objects WHERE kind = ?1")
                .map_err(Error::db("list snapshots"))?;
            let ids = stmt
                .query_map(params![ObjectKind::Snapshot as u8], |r| {
                    r.get::<_, Vec<u8>>(0)
                })
                .map_err(Error::db("list snapshots"))?
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(Error::db("list snapshots"))?;
            ids.iter().map(|b| SnapshotId::from_slice(b)).collect()
        })
    }

    /// Every snapshot with its metadata, newest first.
    pub fn snapshots(&self) -> Result<Vec<(SnapshotId, Snapshot)>> {
        let mut out = Vec::new();
        for id in self.snapshot_ids()? {
            out.push((id, self.snapshot(&id)?));
        }
        out.sort_by(|a, b| b.1.created_at.cmp(&a.1.created_at).then(a.0.cmp(&b.0)));
        Ok(out)
    }
}

/// Rows per multi-row `INSERT` of a commit: one statement execution per 64 rows instead
/// of per row (64 × 8 parameters stays far below SQLite's limit of 32,766).
const ROWS_PER_INSERT: usize = 64;

/// Inserts `rows` with `head` (`INSERT ... INTO t (cols)`) and `width` parameters per
/// row, bound by `bind(statement, first parameter index, row)`.
pub(crate) fn insert_many<R>(
    conn: &Connection,
    head: &str,
    width: usize,
    rows: &[R],
    bind: impl Fn(&mut rusqlite::Statement<'_>, usize, &R) -> rusqlite::Result<()>,
) -> rusqlite::Result<()> {
    let one = format!("({})", vec!["?"; width].join(","));
    let mut single = conn.prepare_cached(&format!("{head} VALUES {one}"))?;
    let mut groups = rows.chunks_exact(ROWS_PER_INSERT);
    if groups.len() > 0 {
        let values = vec![one.as_str(); ROWS_PER_INSERT].join(",");
        let mut many = conn.prepare_cached(&format!("{head} VALUES {values}"))?;
        for group in &mut groups {
            for (k, r) in group.iter().enumerate() {
                bind(&mut many, k * width + 1, r)?;
            }
            many.raw_execute()?;
        }
    }
    for r in groups.remainder() {
        bind(&mut single, 1, r)?;
        single.raw_execute()?;
    }
    Ok(())
}

/// Checks object bytes against their id, by kind. Manifests are checked when their
/// content is read (the id is the hash of the whole content).
pub(crate) fn verify(kind: ObjectKind, id: &[u8; 32], data: &[u8]) -> Result<()> {
    let actual = match kind {
        ObjectKind::Chunk => *ChunkId::of(data).as_bytes(),
        ObjectKind::Tree => *TreeId::of_encoding(data).as_bytes(),
        ObjectKind::Snapshot => *SnapshotId::of_encoding(data).as_bytes(),
        ObjectKind::Manifest => return Ok(()),
    };
    if &actual != id {
        return Err(Error::corrupt(
            kind.as_str(),
            hex::encode(id),
            format!("content hashes to {}", hex::encode(actual)),
        ));
    }
    Ok(())
}

/// A pack named by a committed index transaction (for fsck and gc).
pub(crate) fn committed_packs(conn: &Connection) -> Result<Vec<(PackId, u64)>> {
    let mut stmt = conn
        .prepare("SELECT id, size FROM packs")
        .map_err(Error::db("list packs"))?;
    let rows = stmt
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
        .map_err(Error::db("list packs"))?
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(Error::db("list packs"))?;
    rows.into_iter()
        .map(|(id, size)| {
            PackId::parse(&id)
                .map(|p| (p, size as u64))
                .ok_or_else(|| Error::corrupt("index row", &id, "bad pack name"))
        })
        .collect()
}
