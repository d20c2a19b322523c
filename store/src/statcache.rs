//! The stat cache: (device, inode, size, mtime, ctime) of each imported file, keyed by
//! source root and path, mapped to its content id — git's index trick, so re-importing an
//! unchanged tree reads no file contents.
//!
//! A file changed within [`RACY_MARGIN_NS`] of an import's start is not recorded (its
//! timestamps could repeat after a later change within the same clock tick), so a hit is
//! trustworthy. `gc` removes rows whose content it deletes, so every row names a stored
//! object.

use std::collections::HashMap;

use rusqlite::{Connection, params};

use crate::error::{Error, Result};
use crate::id::ContentId;

/// Files modified less than this long before an import started are re-read next time.
pub const RACY_MARGIN_NS: i64 = 1_000_000_000;

/// What was known of a file when it was last imported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

impl Stamp {
    pub fn of(meta: &std::fs::Metadata) -> Stamp {
        use std::os::unix::fs::MetadataExt;
        Stamp {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
            ctime_ns: meta.ctime() * 1_000_000_000 + meta.ctime_nsec(),
        }
    }

    /// Whether a change to the file could go unseen (see [`RACY_MARGIN_NS`]).
    pub fn is_racy(&self, import_started_ns: i64) -> bool {
        self.mtime_ns.max(self.ctime_ns) >= import_started_ns - RACY_MARGIN_NS
    }
}

/// The cached stamps of one source root.
pub type Entries = HashMap<Vec<u8>, (Stamp, ContentId)>;

/// Loads every entry of `root`.
pub fn load(conn: &Connection, root: &str) -> Result<Entries> {
    let mut stmt = conn
        .prepare(
            "SELECT path, dev, ino, size, mtime_ns, ctime_ns, content FROM statcache WHERE root = ?1",
        )
        .map_err(Error::db("read stat cache"))?;
    let rows = stmt
        .query_map(params![root], |r| {
            Ok((
                r.get::<_, Vec<u8>>(0)?,
                Stamp {
                    dev: r.get::<_, i64>(1)? as u64,
                    ino: r.get::<_, i64>(2)? as u64,
                    size: r.get::<_, i64>(3)? as u64,
                    mtime_ns: r.get(4)?,
                    ctime_ns: r.get(5)?,
                },
                r.get::<_, Vec<u8>>(6)?,
            ))
        })
        .map_err(Error::db("read stat cache"))?;
    let mut out = HashMap::new();
    for row in rows {
        let (path, stamp, content) = row.map_err(Error::db("read stat cache"))?;
        out.insert(path, (stamp, ContentId::from_slice(&content)?));
    }
    Ok(out)
}

/// Records new stamps and forgets paths that are gone; call inside the import's commit.
pub fn apply(
    conn: &Connection,
    root: &str,
    upserts: &[(Vec<u8>, Stamp, ContentId)],
    deletes: &[Vec<u8>],
) -> Result<()> {
    // Key order (root, path): appends to the B-tree rather than random inserts.
    let mut order: Vec<&(Vec<u8>, Stamp, ContentId)> = upserts.iter().collect();
    order.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    crate::store::insert_many(
        conn,
        "INSERT OR REPLACE INTO statcache (root, path, dev, ino, size, mtime_ns, ctime_ns, content)",
        8,
        &order,
        |st, i, (path, s, id)| {
            st.raw_bind_parameter(i, root)?;
            st.raw_bind_parameter(i + 1, path)?;
            st.raw_bind_parameter(i + 2, s.dev as i64)?;
            st.raw_bind_parameter(i + 3, s.ino as i64)?;
            st.raw_bind_parameter(i + 4, s.size as i64)?;
            st.raw_bind_parameter(i + 5, s.mtime_ns)?;
            st.raw_bind_parameter(i + 6, s.ctime_ns)?;
            st.raw_bind_parameter(i + 7, &id.as_bytes()[..])
        },
    )
    .map_err(Error::db("update stat cache"))?;
    let mut del = conn
        .prepare_cached("DELETE FROM statcache WHERE root = ?1 AND path = ?2")
        .map_err(Error::db("prepare stat cache delete"))?;
    for path in deletes {
        del.execute(params![root, path])
            .map_err(Error::db("update stat cache"))?;
    }
    Ok(())
}
