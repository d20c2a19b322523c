//! The stat cache: (device, inode, size, mtime, ctime) of each imported file, keyed by
//! source root and path, mapped to its content id — git's index trick, so re-importing an
//! unchanged tree reads no file contents.
//!
//! A file changed within [`RACY_MARGIN_NS`] of an import's start is not recorded (its
//! timestamps could repeat after a later change within the same clock tick), so a hit is
//! trustworthy. `gc` removes rows whose content it deletes, so every row names a stored
//! object.
//!
//! A row also keeps the file's recorded xattrs (`xattrs`, [`encode_xattrs`]), so a hit
//! costs no `llistxattr` either: setting or removing an xattr changes the file's ctime,
//! which is in the stamp. A row without them (`NULL`: written by an older program, or
//! by a path that did not read them) is a hit for the content only; its xattrs are read
//! from the file.

use std::cell::Cell;

use rusqlite::{Connection, params};

use crate::error::{Error, Result};
use crate::id::ContentId;
use crate::xattrs::Xattrs;

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

/// What the cache knows of one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cached {
    pub stamp: Stamp,
    pub content: ContentId,
    /// Its recorded xattrs, sorted; `None` when the row does not say.
    pub xattrs: Option<Xattrs>,
    /// Set by an import whose walk found the path (so the rows not seen, the files
    /// gone, are found without a second set of every path walked).
    pub seen: Cell<bool>,
}

/// The cached stamps of one source root (a fast hash: the keys are paths of the
/// walked tree, one lookup per file of a re-import).
pub type Entries = rustc_hash::FxHashMap<Vec<u8>, Cached>;

/// The paths of `entries` no walk marked [`Cached::seen`].
pub fn unseen(entries: &Entries) -> Vec<Vec<u8>> {
    entries
        .iter()
        .filter(|(_, c)| !c.seen.get())
        .map(|(p, _)| p.clone())
        .collect()
}

/// One row to record: path, stamp, content and (when read) xattrs.
pub type Row = (Vec<u8>, Stamp, ContentId, Option<Xattrs>);

/// Longest xattr list a row keeps; a longer one is not kept (read from the file).
pub const MAX_CACHED_XATTR_BYTES: usize = 64 * 1024;

/// Encodes xattrs for the `xattrs` column: per pair, the name's length (u32 LE), the
/// name, the value's length (u32 LE), the value. No xattrs: zero bytes (not `NULL`).
pub fn encode_xattrs(x: &Xattrs) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in x {
        out.extend_from_slice(&(name.len() as u32).to_le_bytes());
        out.extend_from_slice(name);
        out.extend_from_slice(&(value.len() as u32).to_le_bytes());
        out.extend_from_slice(value);
    }
    out
}

/// Decodes [`encode_xattrs`]; `None` for bytes it did not make (the row then does not
/// say, and the file's xattrs are read).
pub fn decode_xattrs(mut b: &[u8]) -> Option<Xattrs> {
    fn field<'a>(b: &mut &'a [u8]) -> Option<&'a [u8]> {
        let (len, rest) = b.split_first_chunk::<4>()?;
        let len = u32::from_le_bytes(*len) as usize;
        if rest.len() < len {
            return None;
        }
        let (f, rest) = rest.split_at(len);
        *b = rest;
        Some(f)
    }
    let mut out = Vec::new();
    while !b.is_empty() {
        let name = field(&mut b)?.to_vec();
        let value = field(&mut b)?.to_vec();
        out.push((name, value));
    }
    // Sorted and unique, as they were recorded.
    out.windows(2).all(|w| w[0].0 < w[1].0).then_some(out)
}

/// Loads every entry of `root`.
pub fn load(conn: &Connection, root: &str) -> Result<Entries> {
    let mut stmt = conn
        .prepare(
            "SELECT path, dev, ino, size, mtime_ns, ctime_ns, content, xattrs FROM statcache WHERE root = ?1",
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
                r.get::<_, Option<Vec<u8>>>(7)?,
            ))
        })
        .map_err(Error::db("read stat cache"))?;
    let mut out = Entries::default();
    for row in rows {
        let (path, stamp, content, xattrs) = row.map_err(Error::db("read stat cache"))?;
        let cached = Cached {
            stamp,
            content: ContentId::from_slice(&content)?,
            xattrs: xattrs.and_then(|x| decode_xattrs(&x)),
            seen: Cell::new(false),
        };
        out.insert(path, cached);
    }
    Ok(out)
}

/// Records new stamps and forgets paths that are gone; call inside the import's commit.
pub fn apply(conn: &Connection, root: &str, upserts: &[Row], deletes: &[Vec<u8>]) -> Result<()> {
    // Key order (root, path): appends to the B-tree rather than random inserts.
    let mut order: Vec<(&Row, Option<Vec<u8>>)> = upserts
        .iter()
        .map(|r| {
            let x = r.3.as_ref().map(encode_xattrs);
            (r, x.filter(|x| x.len() <= MAX_CACHED_XATTR_BYTES))
        })
        .collect();
    order.sort_unstable_by(|a, b| a.0.0.cmp(&b.0.0));
    crate::store::insert_many(
        conn,
        "INSERT OR REPLACE INTO statcache (root, path, dev, ino, size, mtime_ns, ctime_ns, content, xattrs)",
        9,
        &order,
        |st, i, ((path, s, id, _), x)| {
            st.raw_bind_parameter(i, root)?;
            st.raw_bind_parameter(i + 1, path)?;
            st.raw_bind_parameter(i + 2, s.dev as i64)?;
            st.raw_bind_parameter(i + 3, s.ino as i64)?;
            st.raw_bind_parameter(i + 4, s.size as i64)?;
            st.raw_bind_parameter(i + 5, s.mtime_ns)?;
            st.raw_bind_parameter(i + 6, s.ctime_ns)?;
            st.raw_bind_parameter(i + 7, &id.as_bytes()[..])?;
            st.raw_bind_parameter(i + 8, x.as_deref())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xattrs_encode_and_decode_back_and_anything_else_says_nothing() {
        let none: Xattrs = vec![];
        assert_eq!(encode_xattrs(&none), Vec::<u8>::new());
        assert_eq!(decode_xattrs(&[]), Some(none));
        let some: Xattrs = vec![
            (b"security.capability".to_vec(), vec![1, 2, 3]),
            (b"user.a".to_vec(), vec![]),
            (b"user.b".to_vec(), b"v".to_vec()),
        ];
        let enc = encode_xattrs(&some);
        assert_eq!(decode_xattrs(&enc), Some(some.clone()));
        // Cut short: nothing, or (cut between two pairs) the pairs before the cut.
        for cut in 1..enc.len() {
            if let Some(got) = decode_xattrs(&enc[..cut]) {
                assert!(
                    got.len() < some.len() && some.starts_with(&got),
                    "cut at {cut}"
                );
            }
        }
        // Not sorted, or a name twice: not what was recorded.
        let unsorted: Xattrs = vec![some[1].clone(), some[0].clone()];
        assert_eq!(decode_xattrs(&encode_xattrs(&unsorted)), None);
        let twice: Xattrs = vec![some[1].clone(), some[1].clone()];
        assert_eq!(decode_xattrs(&encode_xattrs(&twice)), None);
    }
}
