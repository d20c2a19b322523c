//! The SQLite index: where every object lives, which packs count, refs, pins, the stat
//! cache and the blob cache's bookkeeping.
//!
//! Opened in WAL mode with `synchronous=FULL`: a transaction that returned is durable.
//! Writers hold the connection behind the store's mutex; import workers open their own
//! read-only connections (WAL lets them read while a writer works).

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, OptionalExtension, params};

use crate::error::{Error, Result};
use crate::pack::{Codec, PackId};

/// The on-disk format version this build reads and writes.
pub const FORMAT_VERSION: u32 = 2;
/// The earlier version this build opens, upgrading it in place (format 2 added group
/// records and the `objects.part` column; a format-1 store is a valid format-2 store
/// once the column is there).
pub const UPGRADABLE_FORMAT_VERSION: u32 = 1;
/// How long a connection waits for another writer before giving up.
pub const DB_BUSY_TIMEOUT_MS: u64 = 30_000;

/// Object kinds as stored in the index and in pack record headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ObjectKind {
    Chunk = 1,
    Manifest = 2,
    Tree = 3,
    Snapshot = 4,
}

impl ObjectKind {
    pub fn from_u8(b: u8) -> Option<ObjectKind> {
        Some(match b {
            1 => ObjectKind::Chunk,
            2 => ObjectKind::Manifest,
            3 => ObjectKind::Tree,
            4 => ObjectKind::Snapshot,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ObjectKind::Chunk => "chunk",
            ObjectKind::Manifest => "manifest",
            ObjectKind::Tree => "tree",
            ObjectKind::Snapshot => "snapshot",
        }
    }
}

/// Where an object's bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    pub kind: ObjectKind,
    pub pack: PackId,
    pub offset: u64,
    pub stored_len: u32,
    pub raw_len: u32,
    pub codec: Codec,
    /// For [`Codec::Part`]: where the object starts in its group's raw bytes; 0 otherwise.
    pub part: u32,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS packs (
    id TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS objects (
    id BLOB PRIMARY KEY,
    kind INTEGER NOT NULL,
    pack TEXT NOT NULL,
    offset INTEGER NOT NULL,
    stored_len INTEGER NOT NULL,
    raw_len INTEGER NOT NULL,
    codec INTEGER NOT NULL,
    part INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS objects_by_pack ON objects (pack);
CREATE INDEX IF NOT EXISTS objects_by_kind ON objects (kind);
CREATE TABLE IF NOT EXISTS refs (
    name TEXT PRIMARY KEY,
    snapshot BLOB NOT NULL,
    updated_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS pins (
    snapshot BLOB NOT NULL,
    holder TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (snapshot, holder)
);
CREATE TABLE IF NOT EXISTS statcache (
    root TEXT NOT NULL,
    path BLOB NOT NULL,
    dev INTEGER NOT NULL,
    ino INTEGER NOT NULL,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    ctime_ns INTEGER NOT NULL,
    content BLOB NOT NULL,
    xattrs BLOB,
    PRIMARY KEY (root, path)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS blobcache (
    id BLOB PRIMARY KEY,
    size INTEGER NOT NULL,
    last_used INTEGER NOT NULL
) WITHOUT ROWID;
";

/// Tables added to format 1 since its first stores: `open` makes them where missing
/// (older programs leave them alone).
const ADDED_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS gitblobs (
    oid BLOB PRIMARY KEY,
    content BLOB NOT NULL,
    size INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS gitlinks (
    oid BLOB PRIMARY KEY,
    target BLOB NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS remotes (
    name TEXT PRIMARY KEY,
    url TEXT NOT NULL,
    endpoint TEXT,
    region TEXT,
    is_default INTEGER NOT NULL,
    added_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS remote_objects (
    id BLOB NOT NULL,
    remote TEXT NOT NULL,
    pack TEXT NOT NULL,
    offset INTEGER NOT NULL,
    stored_len INTEGER NOT NULL,
    raw_len INTEGER NOT NULL,
    codec INTEGER NOT NULL,
    PRIMARY KEY (id, remote)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS remote_snapshots (
    snapshot BLOB PRIMARY KEY,
    remote TEXT NOT NULL,
    registered_at INTEGER NOT NULL,
    partial INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS remote_stats (
    remote TEXT PRIMARY KEY,
    requests INTEGER NOT NULL,
    objects INTEGER NOT NULL,
    bytes INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS suspects (
    id BLOB PRIMARY KEY,
    kind TEXT NOT NULL,
    why TEXT NOT NULL,
    found_at INTEGER NOT NULL
) WITHOUT ROWID;
";

/// How long [`enable_wal`] keeps retrying a journal-mode switch another connection blocks.
pub const WAL_SWITCH_RETRY_MS: u64 = DB_BUSY_TIMEOUT_MS;
/// The pause between two attempts of [`enable_wal`].
const WAL_SWITCH_PAUSE_MS: u64 = 2;

/// Puts a database in WAL mode (persistent: stored in the file). SQLite does not call the
/// busy handler while it switches the journal mode (two connections switching at once
/// would deadlock), so a fresh database opened by several processes at once answers
/// `SQLITE_BUSY` to all but one: the switch is retried for up to [`WAL_SWITCH_RETRY_MS`].
/// A database in WAL mode already takes no lock that could be refused here.
pub fn enable_wal(conn: &Connection) -> rusqlite::Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_millis(WAL_SWITCH_RETRY_MS);
    loop {
        let mode = conn
            .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get::<_, String>(0));
        match mode {
            Ok(m) if m.eq_ignore_ascii_case("wal") => return Ok(()),
            // Another connection's transaction kept the old mode: not switched yet.
            Ok(_) if std::time::Instant::now() < deadline => {}
            Ok(m) => {
                return Err(rusqlite::Error::SqliteFailure(
                    rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
                    Some(format!("journal mode stayed {m:?}")),
                ));
            }
            Err(rusqlite::Error::SqliteFailure(e, _))
                if matches!(
                    e.code,
                    rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
                ) && std::time::Instant::now() < deadline => {}
            Err(e) => return Err(e),
        }
        std::thread::sleep(Duration::from_millis(WAL_SWITCH_PAUSE_MS));
    }
}

fn configure(conn: &Connection) -> Result<()> {
    conn.busy_timeout(Duration::from_millis(DB_BUSY_TIMEOUT_MS))
        .map_err(Error::db("set busy timeout"))?;
    enable_wal(conn).map_err(Error::db("enable WAL"))?;
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(Error::db("set synchronous"))?;
    Ok(())
}

/// Creates the index of a new store.
pub fn create(path: &Path) -> Result<Connection> {
    let conn = Connection::open(path).map_err(Error::db("create index"))?;
    configure(&conn)?;
    conn.execute_batch(SCHEMA)
        .map_err(Error::db("create schema"))?;
    conn.execute_batch(ADDED_SCHEMA)
        .map_err(Error::db("create schema"))?;
    conn.execute(
        "INSERT OR REPLACE INTO meta (key, value) VALUES ('format_version', ?1)",
        params![FORMAT_VERSION.to_string()],
    )
    .map_err(Error::db("record format version"))?;
    Ok(conn)
}

/// Opens the index of an existing store for writing, checking the format version.
pub fn open(path: &Path) -> Result<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(Error::db("open index"))?;
    configure(&conn)?;
    let version: Option<String> = conn
        .query_row(
            "SELECT value FROM meta WHERE key = 'format_version'",
            [],
            |r| r.get(0),
        )
        .optional()
        .map_err(Error::db("read format version"))?;
    match version {
        Some(v) if v == FORMAT_VERSION.to_string() => {
            conn.execute_batch(ADDED_SCHEMA)
                .map_err(Error::db("add tables to the schema"))?;
            add_xattrs_column(&conn)?;
            Ok(conn)
        }
        Some(v) if v == UPGRADABLE_FORMAT_VERSION.to_string() => {
            conn.execute_batch(ADDED_SCHEMA)
                .map_err(Error::db("add tables to the schema"))?;
            add_xattrs_column(&conn)?;
            upgrade_to_groups(&conn)?;
            Ok(conn)
        }
        found => Err(Error::FormatVersion {
            path: path.to_path_buf(),
            found: found.unwrap_or_else(|| "none".into()),
            supported: FORMAT_VERSION,
        }),
    }
}

/// Upgrades a format-1 index to format 2: the `part` column, then the version, in one
/// immediate transaction (two programs opening the store at once: the second finds the
/// column there and only rewrites the version). A program of format 1 refuses the store
/// from then on, as it must: it could not read group records.
fn upgrade_to_groups(conn: &Connection) -> Result<()> {
    let step = "upgrade the index to format 2";
    let tx = rusqlite::Transaction::new_unchecked(conn, rusqlite::TransactionBehavior::Immediate)
        .map_err(Error::db(step))?;
    let has: bool = tx
        .query_row(
            "SELECT EXISTS (SELECT 1 FROM pragma_table_info('objects') WHERE name = 'part')",
            [],
            |r| r.get(0),
        )
        .map_err(Error::db(step))?;
    if !has {
        tx.execute_batch("ALTER TABLE objects ADD COLUMN part INTEGER NOT NULL DEFAULT 0")
            .map_err(Error::db(step))?;
    }
    tx.execute(
        "UPDATE meta SET value = ?1 WHERE key = 'format_version'",
        params![FORMAT_VERSION.to_string()],
    )
    .map_err(Error::db(step))?;
    tx.commit().map_err(Error::db(step))
}

/// Page cache of a reader connection, in KiB.
const READER_CACHE_KIB: i64 = 256;

/// Opens a second connection for reading only (import workers, concurrent readers).
pub fn open_reader(path: &Path) -> Result<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(Error::db("open index for reading"))?;
    conn.busy_timeout(Duration::from_millis(DB_BUSY_TIMEOUT_MS))
        .map_err(Error::db("set busy timeout"))?;
    // Readers look objects up by id (a few pages each, which the OS caches anyway); a
    // daemon keeps up to 16 of them idle, each with SQLite's default 2 MiB cache.
    conn.pragma_update(None, "cache_size", -READER_CACHE_KIB)
        .map_err(Error::db("set reader cache size"))?;
    Ok(conn)
}

/// Looks an object up.
pub fn locate(conn: &Connection, id: &[u8; 32]) -> Result<Option<Location>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT kind, pack, offset, stored_len, raw_len, codec, part FROM objects WHERE id = ?1",
        )
        .map_err(Error::db("prepare object lookup"))?;
    let row = stmt
        .query_row(params![&id[..]], |r| {
            Ok((
                r.get::<_, u8>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, u64>(2)?,
                r.get::<_, u32>(3)?,
                r.get::<_, u32>(4)?,
                r.get::<_, u8>(5)?,
                r.get::<_, u32>(6)?,
            ))
        })
        .optional()
        .map_err(Error::db("look up object"))?;
    let Some((kind, pack, offset, stored_len, raw_len, codec, part)) = row else {
        return Ok(None);
    };
    let hexid = hex::encode(id);
    let kind = ObjectKind::from_u8(kind)
        .ok_or_else(|| Error::corrupt("index row", &hexid, format!("unknown kind {kind}")))?;
    let pack = PackId::parse(&pack)
        .ok_or_else(|| Error::corrupt("index row", &hexid, format!("bad pack name {pack:?}")))?;
    let codec = Codec::from_u8(codec)
        .ok_or_else(|| Error::corrupt("index row", &hexid, format!("unknown codec {codec}")))?;
    Ok(Some(Location {
        kind,
        pack,
        offset,
        stored_len,
        raw_len,
        codec,
        part,
    }))
}

/// Whether the index holds any object.
pub fn has_objects(conn: &Connection) -> Result<bool> {
    conn.query_row("SELECT EXISTS (SELECT 1 FROM objects)", [], |r| r.get(0))
        .map_err(Error::db("look up objects"))
}

/// Whether an object is in the index.
pub fn contains(conn: &Connection, id: &[u8; 32]) -> Result<bool> {
    let mut stmt = conn
        .prepare_cached("SELECT 1 FROM objects WHERE id = ?1")
        .map_err(Error::db("prepare object lookup"))?;
    stmt.exists(params![&id[..]])
        .map_err(Error::db("look up object"))
}

/// Adds the `xattrs` column to a stat cache made before it (idempotent; two programs
/// opening at once may both try, and one finds it added).
pub(crate) fn add_xattrs_column(conn: &Connection) -> Result<()> {
    let has = |conn: &Connection| -> Result<bool> {
        let mut stmt = conn
            .prepare("SELECT 1 FROM pragma_table_info('statcache') WHERE name = 'xattrs'")
            .map_err(Error::db("read stat cache columns"))?;
        stmt.exists([])
            .map_err(Error::db("read stat cache columns"))
    };
    if has(conn)? {
        return Ok(());
    }
    match conn.execute_batch("ALTER TABLE statcache ADD COLUMN xattrs BLOB") {
        Ok(()) => Ok(()),
        Err(_) if has(conn)? => Ok(()),
        Err(e) => Err(Error::db("add the stat cache's xattrs column")(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Connections switching one database to WAL at once.
    const OPENERS: usize = 16;

    /// `OPENERS` threads open `path` at once, each on its own connection, and switch it
    /// to WAL with `switch`; every one's result.
    fn switch_all_at_once(
        path: &Path,
        switch: fn(&Connection) -> rusqlite::Result<()>,
    ) -> Vec<rusqlite::Result<()>> {
        let barrier = std::sync::Barrier::new(OPENERS);
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..OPENERS)
                .map(|_| {
                    s.spawn(|| {
                        let conn = Connection::open(path).unwrap();
                        conn.busy_timeout(Duration::from_millis(DB_BUSY_TIMEOUT_MS))
                            .unwrap();
                        barrier.wait();
                        switch(&conn)?;
                        conn.execute_batch(SCHEMA)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn a_fresh_database_switched_to_wal_by_many_at_once_switches_for_all() {
        // Rounds, each on a new file: one round seldom shows the race.
        for _ in 0..20 {
            let t = tempfile::tempdir().unwrap();
            let path = t.path().join("index.db");
            for r in switch_all_at_once(&path, enable_wal) {
                r.expect("switch to WAL");
            }
            let conn = Connection::open(&path).unwrap();
            let mode: String = conn
                .query_row("PRAGMA journal_mode", [], |r| r.get(0))
                .unwrap();
            assert_eq!(mode, "wal");
        }
    }
}
