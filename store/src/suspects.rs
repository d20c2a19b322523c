//! The `suspects` table: objects `fsck --repair` quarantined, which the next import that
//! writes the same id replaces (read by `repair`, replaced in the store's commit).

use std::collections::HashSet;

use rusqlite::{Transaction, params};

use crate::error::{Error, Result};
use crate::writer::Row;

/// The ids under suspicion.
pub(crate) fn load(c: &rusqlite::Connection) -> Result<HashSet<[u8; 32]>> {
    let mut stmt = c
        .prepare("SELECT id FROM suspects")
        .map_err(Error::db("list suspects"))?;
    let rows = stmt
        .query_map([], |r| r.get::<_, Vec<u8>>(0))
        .map_err(Error::db("list suspects"))?
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(Error::db("list suspects"))?;
    Ok(rows
        .iter()
        .filter_map(|b| <[u8; 32]>::try_from(b.as_slice()).ok())
        .collect())
}

/// In a commit: rows of the session that rewrite a suspect replace its row (the new copy
/// hashes to the id: it was made from the source's bytes) and clear the suspicion.
pub(crate) fn replace(tx: &Transaction<'_>, rows: &[Row]) -> Result<u64> {
    let suspects = load(tx)?;
    if suspects.is_empty() {
        return Ok(0);
    }
    let mut n = 0;
    for r in rows.iter().filter(|r| suspects.contains(&r.id)) {
        tx.execute(
            "UPDATE objects SET kind = ?2, pack = ?3, offset = ?4, stored_len = ?5,
             raw_len = ?6, codec = ?7, part = ?8 WHERE id = ?1",
            params![
                &r.id[..],
                r.loc.kind as u8,
                r.loc.pack.as_str(),
                r.loc.offset as i64,
                r.loc.stored_len,
                r.loc.raw_len,
                r.loc.codec as u8,
                r.loc.part
            ],
        )
        .map_err(Error::db("rewrite suspect object"))?;
        tx.execute("DELETE FROM suspects WHERE id = ?1", params![&r.id[..]])
            .map_err(Error::db("clear suspect"))?;
        n += 1;
    }
    Ok(n)
}
