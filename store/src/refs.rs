//! Refs: mutable names for snapshots, moved only by compare-and-swap.

use rusqlite::{Connection, OptionalExtension, params};

use crate::error::{Error, Result};
use crate::id::SnapshotId;
use crate::index::ObjectKind;
use crate::snapshot::now_secs;
use crate::store::Store;

/// Longest ref name.
pub const MAX_REF_NAME_BYTES: usize = 200;

/// What a ref must hold before it is moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// The ref must not exist yet.
    Absent,
    /// The ref must point here.
    At(SnapshotId),
    /// Whatever it holds (only for callers that read it in the same transaction).
    Any,
}

/// Checks a ref name: `[A-Za-z0-9._-]` segments joined by `/`, no `..`, no empty segment.
pub fn check_ref_name(name: &str) -> Result<()> {
    let bad = |why: &str| {
        Err(Error::Invalid(format!(
            "ref name {} {why}",
            crate::error::shown(name)
        )))
    };
    if name.is_empty() || name.len() > MAX_REF_NAME_BYTES {
        return bad("must have 1 to 200 characters");
    }
    for seg in name.split('/') {
        if seg.is_empty() {
            return bad("has an empty segment");
        }
        if seg == "." || seg == ".." {
            return bad("has a . or .. segment");
        }
        if !seg
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        {
            return bad("may only use letters, digits, '.', '_', '-' and '/'");
        }
    }
    Ok(())
}

pub(crate) fn get(conn: &Connection, name: &str) -> Result<Option<SnapshotId>> {
    let v: Option<Vec<u8>> = conn
        .query_row(
            "SELECT snapshot FROM refs WHERE name = ?1",
            params![name],
            |r| r.get(0),
        )
        .optional()
        .map_err(Error::db("read ref"))?;
    v.map(|b| SnapshotId::from_slice(&b)).transpose()
}

/// Moves `name` to `new` if it holds what `expect` says; call inside a transaction.
pub(crate) fn compare_and_swap(
    conn: &Connection,
    name: &str,
    expect: Expect,
    new: &SnapshotId,
) -> Result<()> {
    check_ref_name(name)?;
    let current = get(conn, name)?;
    let ok = match (expect, current) {
        (Expect::Any, _) => true,
        (Expect::Absent, None) => true,
        (Expect::At(e), Some(c)) => e == c,
        _ => false,
    };
    if !ok {
        return Err(match expect {
            Expect::Absent => Error::RefExists {
                name: name.into(),
                actual: current.map(|c| c.to_hex()).unwrap_or_default(),
            },
            Expect::At(e) => Error::RefConflict {
                name: name.into(),
                expected: e.to_hex(),
                actual: current.map(|c| c.to_hex()),
            },
            Expect::Any => unreachable!(),
        });
    }
    conn.execute(
        "INSERT INTO refs (name, snapshot, updated_at) VALUES (?1, ?2, ?3)
         ON CONFLICT(name) DO UPDATE SET snapshot = excluded.snapshot, updated_at = excluded.updated_at",
        params![name, &new.as_bytes()[..], now_secs()],
    )
    .map_err(Error::db("move ref"))?;
    Ok(())
}

impl Store {
    /// Every ref, sorted by name.
    pub fn refs(&self) -> Result<Vec<(String, SnapshotId)>> {
        self.with_reader(|c| {
            let mut stmt = c
                .prepare("SELECT name, snapshot FROM refs ORDER BY name")
                .map_err(Error::db("list refs"))?;
            let rows = stmt
                .query_map([], |r| {
                    Ok((r.get::<_, String>(0)?, r.get::<_, Vec<u8>>(1)?))
                })
                .map_err(Error::db("list refs"))?
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(Error::db("list refs"))?;
            rows.into_iter()
                .map(|(n, b)| Ok((n, SnapshotId::from_slice(&b)?)))
                .collect()
        })
    }

    /// What a ref points at.
    pub fn get_ref(&self, name: &str) -> Result<Option<SnapshotId>> {
        check_ref_name(name)?;
        self.with_reader(|c| get(c, name))
    }

    /// Moves a ref with compare-and-swap. The snapshot must exist.
    pub fn set_ref(&self, name: &str, new: &SnapshotId, expect: Expect) -> Result<()> {
        check_ref_name(name)?;
        let mut conn = self.db();
        let tx = conn.transaction().map_err(Error::db("begin ref move"))?;
        match crate::index::locate(&tx, new.as_bytes())? {
            Some(loc) if loc.kind == ObjectKind::Snapshot => {}
            _ => return Err(Error::not_found("snapshot", new.to_hex())),
        }
        compare_and_swap(&tx, name, expect, new)?;
        tx.commit().map_err(Error::db("commit ref move"))
    }

    /// Deletes a ref with compare-and-swap.
    pub fn delete_ref(&self, name: &str, expect: SnapshotId) -> Result<()> {
        check_ref_name(name)?;
        let mut conn = self.db();
        let tx = conn.transaction().map_err(Error::db("begin ref delete"))?;
        match get(&tx, name)? {
            None => return Err(Error::not_found("ref", crate::error::shown_bare(name))),
            Some(c) if c != expect => {
                return Err(Error::RefConflict {
                    name: name.into(),
                    expected: expect.to_hex(),
                    actual: Some(c.to_hex()),
                });
            }
            Some(_) => {}
        }
        tx.execute("DELETE FROM refs WHERE name = ?1", params![name])
            .map_err(Error::db("delete ref"))?;
        tx.commit().map_err(Error::db("commit ref delete"))
    }

    /// Resolves a user's word for a snapshot: a ref name, a full id, or a unique hex
    /// prefix of at least 6 digits.
    pub fn resolve(&self, spec: &str) -> Result<SnapshotId> {
        let is_hex = !spec.is_empty() && spec.bytes().all(|b| b.is_ascii_hexdigit());
        let ref_name_ok = check_ref_name(spec).is_ok();
        if !ref_name_ok && !is_hex {
            // Nothing could ever have this name: malformed input, not a missing object.
            return Err(Error::Invalid(format!(
                "{} is neither a snapshot id nor a valid ref name",
                crate::error::shown(spec)
            )));
        }
        if ref_name_ok && let Some(id) = self.with_reader(|c| get(c, spec))? {
            return Ok(id);
        }
        if is_hex && spec.len() == 64 {
            let id: SnapshotId = spec.to_ascii_lowercase().parse()?;
            return match self.locate(id.as_bytes())? {
                Some(l) if l.kind == ObjectKind::Snapshot => Ok(id),
                _ => Err(Error::not_found(
                    "snapshot or ref",
                    crate::error::shown_bare(spec),
                )),
            };
        }
        if is_hex && spec.len() >= MIN_PREFIX_HEX {
            let prefix = spec.to_ascii_lowercase();
            let matches: Vec<SnapshotId> = self
                .snapshot_ids()?
                .into_iter()
                .filter(|id| id.to_hex().starts_with(&prefix))
                .collect();
            return match matches.as_slice() {
                [one] => Ok(*one),
                [] => Err(Error::not_found(
                    "snapshot or ref",
                    crate::error::shown_bare(spec),
                )),
                _ => Err(Error::Ambiguous(spec.into())),
            };
        }
        Err(Error::not_found(
            "snapshot or ref",
            crate::error::shown_bare(spec),
        ))
    }
}

pub use crate::error::MIN_PREFIX_HEX;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ref_names() {
        for ok in ["main", "myrepo/main", "a.b_c-d/e"] {
            check_ref_name(ok).unwrap();
        }
        for bad in ["", "a//b", "/a", "a/", "a/../b", "a b", "é"] {
            assert!(check_ref_name(bad).is_err(), "{bad:?}");
        }
    }
}
