//! Compaction: small packs (many small imports make one each) and packs whose bytes are
//! mostly not named by the index are rewritten into a few full packs.
//!
//! `repack` and `gc` share the plan ([`plan`]) and the copy ([`Store::copy_objects`]).
//! Both run under the exclusive store lock, so no import is between "found stored" and
//! "committed" meanwhile. The order is the commit protocol's: the copies are written to
//! new packs and synced; one transaction records the new packs, points the rows at the
//! copies and forgets the old packs; only then are the old files deleted. A crash before
//! the transaction leaves the new packs as orphans, after it the old ones (both removed
//! by the next gc); fsck is clean at every point. A reader that located an object in an
//! old pack just before its file went finds it gone and looks the object up again
//! ([`crate::Store`]'s reads retry once on a pack that vanished).
//!
//! Every object is decompressed and verified before it is copied; an object that fails
//! is not copied and its pack is kept (so a repack never loses the evidence fsck needs,
//! nor turns a damaged object into a missing one).

use std::collections::{HashMap, HashSet};

use rusqlite::{Transaction, params};
use serde::Serialize;

use crate::codec::{self, Manifest};
use crate::error::{Error, Result};
use crate::group::Grouper;
use crate::id::ContentId;
use crate::index::ObjectKind;
use crate::lock::StoreLock;
use crate::pack::{Codec, PackId};
use crate::snapshot::now_secs;
use crate::store::{Store, committed_packs, verify};
use crate::writer::{NewObject, PackWriter, Pending};

/// A pack gc removes or rewrites (or would), and why.
#[derive(Debug, Clone, Serialize)]
pub struct PackGone {
    pub pack: String,
    /// `remove` (no live object), `rewrite` (its live objects copied to a new pack) or
    /// `remove_orphan` (no committed transaction names it).
    pub action: &'static str,
    /// Bytes of the pack file (committed bytes for a committed pack).
    pub size: u64,
    /// Stored bytes of its objects that stay live (moved when it is rewritten).
    pub live_bytes: u64,
    pub why: String,
}

/// A pack smaller than this is merged with the other small ones.
pub const SMALL_PACK_BYTES: u64 = 16 * 1024 * 1024;
/// Small packs are merged only when there are at least this many (one small pack is as
/// compact as it gets).
pub const MIN_SMALL_PACKS: usize = 2;
/// A pack whose live bytes fall under this fraction of its size is rewritten.
pub const REPACK_LIVE_FRACTION: f64 = 0.5;

/// How to repack.
#[derive(Debug, Clone, Copy, Default)]
pub struct RepackOptions {
    /// Say what would be rewritten, rewrite nothing.
    pub dry_run: bool,
    /// Wait for running imports instead of failing with `Busy`.
    pub wait: bool,
}

/// What a repack did (or would do).
#[derive(Debug, Clone, Serialize, Default)]
pub struct RepackReport {
    pub dry_run: bool,
    pub packs_before: u64,
    pub packs_after: u64,
    /// Bytes of committed packs before and after.
    pub bytes_before: u64,
    pub bytes_after: u64,
    pub objects_moved: u64,
    /// The packs rewritten (or that would be), each with why.
    pub packs: Vec<PackGone>,
    /// Packs kept because an object in them failed verification (`fsck` names it).
    pub kept_damaged: Vec<String>,
}

/// Which packs to drop (no live byte) and which to rewrite (small, or mostly dead), given
/// each pack's committed size and live bytes.
pub(crate) fn plan(
    packs: &[(PackId, u64)],
    live_bytes: &HashMap<PackId, u64>,
) -> (Vec<PackGone>, Vec<PackGone>) {
    let mut drop = Vec::new();
    let mut rewrite = Vec::new();
    let mut small = Vec::new();
    for (pack, size) in packs {
        let lb = live_bytes.get(pack).copied().unwrap_or(0);
        let gone = |action, why: String| PackGone {
            pack: pack.to_string(),
            action,
            size: *size,
            live_bytes: lb,
            why,
        };
        if lb == 0 {
            drop.push(gone("remove", "none of its objects stays live".into()));
        } else if (lb as f64) < (*size as f64) * REPACK_LIVE_FRACTION {
            rewrite.push(gone(
                "rewrite",
                format!(
                    "{}% of its bytes stay live (under {}%)",
                    lb * 100 / (*size).max(1),
                    (REPACK_LIVE_FRACTION * 100.0) as u32
                ),
            ));
        } else if *size < SMALL_PACK_BYTES {
            small.push(gone(
                "rewrite",
                format!(
                    "small ({} bytes, under {} MiB): merged with the other small packs",
                    size,
                    SMALL_PACK_BYTES >> 20
                ),
            ));
        }
    }
    if small.len() >= MIN_SMALL_PACKS {
        rewrite.extend(small);
    }
    (drop, rewrite)
}

/// Objects copied into new packs, and the packs that must stay (an object in them did
/// not verify).
pub(crate) struct Copied {
    pub pending: Pending,
    pub damaged: HashSet<PackId>,
}

impl Store {
    /// Rewrites small and mostly-dead packs (see the module doc).
    pub fn repack(&self, opts: RepackOptions) -> Result<RepackReport> {
        let _lock = StoreLock::exclusive(self, opts.wait)?;
        let packs = self.with_reader(committed_packs)?;
        let rows = self.pack_rows()?;
        let mut live: HashMap<PackId, u64> = HashMap::new();
        for (_, pack, n) in &rows {
            *live.entry(pack.clone()).or_default() += n;
        }
        let (_, rewrite) = plan(&packs, &live);
        let mut report = RepackReport {
            dry_run: opts.dry_run,
            packs_before: packs.len() as u64,
            bytes_before: packs.iter().map(|(_, s)| s).sum(),
            ..Default::default()
        };
        let chosen: HashSet<PackId> = rewrite
            .iter()
            .filter_map(|g| PackId::parse(&g.pack))
            .collect();
        report.packs = rewrite;
        if opts.dry_run || chosen.is_empty() {
            report.packs_after = report.packs_before;
            report.bytes_after = report.bytes_before;
            return Ok(report);
        }
        let ids = rows
            .iter()
            .filter(|(_, p, _)| chosen.contains(p))
            .map(|(id, _, _)| *id);
        let copied = self.copy_objects(ids)?;
        report.objects_moved = copied.pending.rows.len() as u64;
        let forget: Vec<PackId> = chosen
            .iter()
            .filter(|p| !copied.damaged.contains(*p))
            .cloned()
            .collect();
        report.kept_damaged = copied.damaged.iter().map(|p| p.to_string()).collect();
        {
            let mut conn = self.db();
            let tx = conn.transaction().map_err(Error::db("begin repack"))?;
            record_moves(&tx, &copied.pending)?;
            for p in &forget {
                tx.execute("DELETE FROM packs WHERE id = ?1", params![p.as_str()])
                    .map_err(Error::db("forget pack"))?;
            }
            tx.commit().map_err(Error::db("commit repack"))?;
        }
        self.remove_pack_files(&forget)?;
        let after = self.with_reader(committed_packs)?;
        report.packs_after = after.len() as u64;
        report.bytes_after = after.iter().map(|(_, s)| s).sum();
        Ok(report)
    }

    /// Every indexed object: (id, pack, stored bytes). A group's stored bytes are shared
    /// out among its members, so what a pack's live rows add up to is what stays live.
    pub(crate) fn pack_rows(&self) -> Result<Vec<([u8; 32], PackId, u64)>> {
        let rows = self.with_reader(|c| {
            let mut stmt = c
                .prepare("SELECT id, pack, offset, stored_len, codec FROM objects")
                .map_err(Error::db("list objects"))?;
            stmt.query_map([], |r| {
                Ok((
                    r.get::<_, Vec<u8>>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, i64>(2)?,
                    r.get::<_, i64>(3)?,
                    r.get::<_, u8>(4)?,
                ))
            })
            .map_err(Error::db("list objects"))?
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(Error::db("list objects"))
        })?;
        let part = Codec::Part as u8;
        let mut members: HashMap<(&str, i64), u64> = HashMap::new();
        for (_, p, off, _, codec) in &rows {
            if *codec == part {
                *members.entry((p.as_str(), *off)).or_default() += 1;
            }
        }
        Ok(rows
            .iter()
            .filter_map(|(id, p, off, n, codec)| {
                let n = *n as u64;
                let share = match *codec == part {
                    true => {
                        n / members
                            .get(&(p.as_str(), *off))
                            .copied()
                            .unwrap_or(1)
                            .max(1)
                    }
                    false => n,
                };
                Some((
                    <[u8; 32]>::try_from(id.as_slice()).ok()?,
                    PackId::parse(p)?,
                    share,
                ))
            })
            .collect())
    }

    /// Copies objects, verified, into new synced packs (not yet recorded).
    /// Members of groups are grouped again, with the other live members copied.
    pub(crate) fn copy_objects(&self, ids: impl Iterator<Item = [u8; 32]>) -> Result<Copied> {
        let mut writer = PackWriter::new(self.backend.clone());
        let mut damaged = HashSet::new();
        let mut group = Grouper::default();
        for id in ids {
            let loc = self
                .locate(&id)?
                .ok_or_else(|| Error::not_found("object", hex::encode(id)))?;
            if loc.codec == Codec::Part {
                let raw = self
                    .read_located(&id, &loc)
                    .and_then(|raw| verify(loc.kind, &id, &raw).map(|()| raw));
                let Ok(raw) = raw else {
                    damaged.insert(loc.pack.clone());
                    continue;
                };
                if group.push(id, raw)
                    && let Err(e) = self.add_group(&mut writer, &mut group)
                {
                    writer.abort();
                    return Err(e);
                }
                continue;
            }
            let mut stored = vec![0u8; loc.stored_len as usize];
            let sound = self
                .backend
                .read_at(&loc.pack, loc.offset, &mut stored)
                .is_ok()
                && crate::codec::decompress(
                    loc.codec,
                    stored.clone(),
                    loc.raw_len as usize,
                    &hex::encode(id),
                )
                .and_then(|raw| match loc.kind {
                    ObjectKind::Manifest => {
                        Manifest::decode(&ContentId::from_bytes(id), &raw).map(|_| ())
                    }
                    kind => verify(kind, &id, &raw),
                })
                .is_ok();
            if !sound {
                damaged.insert(loc.pack.clone());
                continue;
            }
            let obj = NewObject {
                id,
                kind: loc.kind,
                codec: loc.codec,
                raw_len: loc.raw_len,
                stored,
                members: Vec::new(),
            };
            if let Err(e) = writer.add(obj) {
                writer.abort();
                return Err(e);
            }
        }
        if let Err(e) = self.add_group(&mut writer, &mut group) {
            writer.abort();
            return Err(e);
        }
        Ok(Copied {
            pending: writer.finish()?,
            damaged,
        })
    }

    /// Compresses the gathered members and hands them to the writer.
    fn add_group(&self, writer: &mut PackWriter, group: &mut Grouper) -> Result<()> {
        if group.is_empty() {
            return Ok(());
        }
        let objs = codec::with_compressor(self.config.zstd_level, |c| group.take(c))?;
        objs.into_iter().try_for_each(|o| writer.add(o))
    }

    /// Deletes pack files the index no longer names, then syncs their directory.
    pub(crate) fn remove_pack_files(&self, packs: &[PackId]) -> Result<()> {
        for p in packs {
            self.backend
                .remove(p)
                .map_err(Error::io("remove pack", self.backend.location(p)))?;
        }
        self.backend
            .sync_dir()
            .map_err(Error::io("sync pack directory", self.layout.packs()))
    }
}

/// In a transaction: records the new packs and points the copied objects' rows at them.
pub(crate) fn record_moves(tx: &Transaction<'_>, moved: &Pending) -> Result<()> {
    for (p, size) in &moved.packs {
        tx.execute(
            "INSERT INTO packs (id, size, created_at) VALUES (?1, ?2, ?3)",
            params![p.as_str(), *size as i64, now_secs()],
        )
        .map_err(Error::db("record pack"))?;
    }
    for r in &moved.rows {
        tx.execute(
            "UPDATE objects SET pack = ?2, offset = ?3, stored_len = ?4, codec = ?5, part = ?6
             WHERE id = ?1",
            params![
                &r.id[..],
                r.loc.pack.as_str(),
                r.loc.offset as i64,
                r.loc.stored_len,
                r.loc.codec as u8,
                r.loc.part
            ],
        )
        .map_err(Error::db("move object"))?;
    }
    Ok(())
}
