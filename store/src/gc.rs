//! Garbage collection: removes what no ref (with its parent chain), no pin and no recent
//! snapshot needs, and rewrites packs that became mostly garbage.
//!
//! Runs under the exclusive store lock, so no import is between "found stored" and
//! "committed". Crash safety follows the same order as writing: new packs are synced
//! before the transaction that points rows at them; files of dropped packs are deleted
//! only after the transaction that forgets them has committed (a crash in between leaves
//! orphan files, removed by the next gc).

use std::collections::{HashMap, HashSet};

use rusqlite::params;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::id::{ContentId, SnapshotId, TreeId};
use crate::index::{self, ObjectKind};
use crate::lock::StoreLock;
use crate::pack::PackId;
use crate::repack;
use crate::snapshot::now_secs;
use crate::store::{Store, committed_packs};
use crate::tree::Target;

/// Unreferenced snapshots younger than this survive gc (a runtime may be about to pin
/// or name a snapshot it just imported).
pub const DEFAULT_GC_GRACE_SECS: i64 = 3600;
pub use crate::repack::{PackGone, REPACK_LIVE_FRACTION};

/// How to collect.
#[derive(Debug, Clone, Copy)]
pub struct GcOptions {
    pub dry_run: bool,
    /// Keep unreferenced snapshots created less than this many seconds ago.
    pub grace_secs: i64,
    /// Wait for running imports instead of failing with `Busy`.
    pub wait: bool,
}

impl Default for GcOptions {
    fn default() -> Self {
        GcOptions {
            dry_run: false,
            grace_secs: DEFAULT_GC_GRACE_SECS,
            wait: false,
        }
    }
}

/// A snapshot a workspace holds though no pin names it (recorded by a version that
/// pinned only a workspace's base): gc keeps it and what it needs, as it keeps pins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub snapshot: SnapshotId,
    /// Who holds it (a workspace id).
    pub holder: String,
}

/// A snapshot gc removes (or would remove), and why.
#[derive(Debug, Clone, Serialize)]
pub struct SnapshotGone {
    pub snapshot: SnapshotId,
    pub created_at: i64,
    pub source: crate::snapshot::Source,
    pub message: String,
    pub why: String,
}

/// What gc removed (or would remove, in a dry run).
#[derive(Debug, Clone, Serialize, Default)]
pub struct GcReport {
    pub dry_run: bool,
    pub snapshots_removed: Vec<SnapshotId>,
    /// Each removed snapshot with what it was and why it goes.
    pub snapshots: Vec<SnapshotGone>,
    /// Each removed or rewritten pack with why.
    pub packs: Vec<PackGone>,
    pub objects_removed: u64,
    pub bytes_freed: u64,
    pub packs_removed: u64,
    pub packs_rewritten: u64,
    pub orphan_packs_removed: u64,
    /// Files of packs whose writer was killed while it created them (`<id>.pack.new`).
    pub unnamed_packs_removed: u64,
    pub blobs_removed: u64,
}

impl Store {
    /// Pins a snapshot for `holder` (a workspace): gc keeps it and all it needs.
    ///
    /// Pins are written without waiting for a disk flush (WAL, `synchronous=NORMAL` for
    /// this statement): they must survive a crash of a process, and the workspaces they
    /// protect do not survive a power loss anyway.
    pub fn pin(&self, snapshot: &SnapshotId, holder: &str) -> Result<()> {
        self.relaxed_write(
            "pin snapshot",
            "INSERT OR IGNORE INTO pins (snapshot, holder, created_at) VALUES (?1, ?2, ?3)",
            params![&snapshot.as_bytes()[..], holder, now_secs()],
        )
    }

    /// Every pin: (snapshot, holder).
    pub fn pins(&self) -> Result<Vec<(SnapshotId, String)>> {
        self.with_reader(|c| {
            let mut stmt = c
                .prepare("SELECT snapshot, holder FROM pins ORDER BY holder, created_at")
                .map_err(Error::db("list pins"))?;
            let rows = stmt
                .query_map([], |r| {
                    Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, String>(1)?))
                })
                .map_err(Error::db("list pins"))?
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(Error::db("list pins"))?;
            rows.into_iter()
                .map(|(s, h)| Ok((SnapshotId::from_slice(&s)?, h)))
                .collect()
        })
    }

    /// Removes every pin of `holder` (same durability as [`Store::pin`]).
    pub fn unpin(&self, holder: &str) -> Result<()> {
        self.relaxed_write(
            "unpin",
            "DELETE FROM pins WHERE holder = ?1",
            params![holder],
        )
    }

    pub(crate) fn relaxed_write(
        &self,
        step: &'static str,
        sql: &str,
        p: impl rusqlite::Params,
    ) -> Result<()> {
        let db = self.db();
        db.pragma_update(None, "synchronous", "NORMAL")
            .map_err(Error::db("relax sync"))?;
        let r = db.execute(sql, p).map_err(Error::db(step));
        db.pragma_update(None, "synchronous", "FULL")
            .map_err(Error::db("restore sync"))?;
        r.map(|_| ())
    }

    /// Collects garbage.
    pub fn gc(&self, opts: GcOptions) -> Result<GcReport> {
        self.gc_holding(opts, &[])
    }

    /// Collects garbage, keeping `held` (and what it needs) as if pinned.
    pub fn gc_holding(&self, opts: GcOptions, held: &[Held]) -> Result<GcReport> {
        let _lock = StoreLock::exclusive(self, opts.wait)?;
        let mut report = GcReport {
            dry_run: opts.dry_run,
            ..Default::default()
        };

        // 1. Live snapshots: refs, pins, recent ones, and their parent chains.
        let all = self.snapshots()?;
        let by_id: HashMap<SnapshotId, &crate::snapshot::Snapshot> =
            all.iter().map(|(id, s)| (*id, s)).collect();
        let mut roots: Vec<SnapshotId> = self.refs()?.into_iter().map(|(_, s)| s).collect();
        roots.extend(self.pinned()?);
        roots.extend(held.iter().map(|h| h.snapshot));
        let cutoff = now_secs() - opts.grace_secs;
        roots.extend(
            all.iter()
                .filter(|(_, s)| s.created_at > cutoff)
                .map(|(id, _)| *id),
        );
        let mut live_snaps: HashSet<SnapshotId> = HashSet::new();
        while let Some(id) = roots.pop() {
            if live_snaps.insert(id)
                && let Some(s) = by_id.get(&id)
            {
                roots.extend(s.parents.iter().copied());
            }
        }

        // 2. Live objects.
        let mut live: HashSet<[u8; 32]> = HashSet::new();
        let mut seen_trees: HashSet<TreeId> = HashSet::new();
        for id in &live_snaps {
            let Some(s) = by_id.get(id) else { continue };
            live.insert(*id.as_bytes());
            self.mark_tree(&s.root, &mut live, &mut seen_trees)?;
        }
        for (id, s) in all.iter().filter(|(id, _)| !live_snaps.contains(id)) {
            report.snapshots_removed.push(*id);
            report.snapshots.push(SnapshotGone {
                snapshot: *id,
                created_at: s.created_at,
                source: s.source.clone(),
                message: s.message.clone(),
                why: format!(
                    "no ref, pin or workspace leads to it, and it was made {} ago (grace {})",
                    age(now_secs() - s.created_at),
                    age(opts.grace_secs)
                ),
            });
        }

        // 3. What each pack holds.
        let rows = self.pack_rows()?;
        let packs = self.with_reader(committed_packs)?;
        let mut live_bytes: HashMap<PackId, u64> = HashMap::new();
        let mut dead: Vec<[u8; 32]> = Vec::new();
        for (id, pack, n) in &rows {
            if live.contains(id) {
                *live_bytes.entry(pack.clone()).or_default() += n;
            } else {
                dead.push(*id);
                report.bytes_freed += n;
            }
        }
        report.objects_removed = dead.len() as u64;
        let (drop_plan, rewrite_plan) = repack::plan(&packs, &live_bytes);
        let parse = |v: &[PackGone]| -> Vec<PackId> {
            v.iter().filter_map(|g| PackId::parse(&g.pack)).collect()
        };
        let drop_packs = parse(&drop_plan);
        let rewrite = parse(&rewrite_plan);
        report.packs_removed = drop_packs.len() as u64;
        report.packs_rewritten = rewrite.len() as u64;
        report.packs.extend(drop_plan);
        report.packs.extend(rewrite_plan);
        let committed: HashSet<&PackId> = packs.iter().map(|(p, _)| p).collect();
        let orphans: Vec<PackId> = self
            .backend
            .list()
            .map_err(Error::io("list packs", self.layout.packs()))?
            .into_iter()
            .filter(|p| !committed.contains(p))
            .collect();
        report.orphan_packs_removed = orphans.len() as u64;
        for p in &orphans {
            report.packs.push(PackGone {
                pack: p.to_string(),
                action: "remove_orphan",
                size: self.backend.len(p).unwrap_or(0),
                live_bytes: 0,
                why: "no committed transaction names it (left by an interrupted write)".into(),
            });
        }
        if opts.dry_run {
            return Ok(report);
        }

        // 4. Copy the live objects of the packs to rewrite into new packs (verified,
        // synced); a pack holding an object that does not verify is kept.
        let rewrite_set: HashSet<&PackId> = rewrite.iter().collect();
        let copied = self.copy_objects(
            rows.iter()
                .filter(|(id, pack, _)| rewrite_set.contains(pack) && live.contains(id))
                .map(|(id, _, _)| *id),
        )?;
        let forget: Vec<PackId> = drop_packs
            .iter()
            .chain(rewrite.iter().filter(|p| !copied.damaged.contains(*p)))
            .cloned()
            .collect();

        // 5. One transaction: forget the dead, move the copied, drop emptied packs.
        {
            let mut conn = self.db();
            let tx = conn.transaction().map_err(Error::db("begin gc"))?;
            for id in &dead {
                tx.execute("DELETE FROM objects WHERE id = ?1", params![&id[..]])
                    .map_err(Error::db("delete object"))?;
            }
            repack::record_moves(&tx, &copied.pending)?;
            for p in &forget {
                tx.execute("DELETE FROM packs WHERE id = ?1", params![p.as_str()])
                    .map_err(Error::db("forget pack"))?;
            }
            // Stat cache rows must name stored content; snapshots' pins are kept.
            tx.execute(
                "DELETE FROM statcache WHERE content NOT IN (SELECT id FROM objects)",
                [],
            )
            .map_err(Error::db("prune stat cache"))?;
            tx.execute(
                "DELETE FROM gitblobs WHERE content NOT IN (SELECT id FROM objects)",
                [],
            )
            .map_err(Error::db("prune git blob ids"))?;
            Store::prune_remote_rows(&tx, &live)?;
            tx.execute(
                "DELETE FROM suspects WHERE id NOT IN (SELECT id FROM objects)",
                [],
            )
            .map_err(Error::db("prune suspects"))?;
            tx.commit().map_err(Error::db("commit gc"))?;
        }

        // 6. Only now delete files.
        let files: Vec<PackId> = forget.into_iter().chain(orphans).collect();
        self.remove_pack_files(&files)?;
        report.unnamed_packs_removed = self
            .backend
            .remove_unnamed()
            .map_err(Error::io("remove unnamed packs", self.layout.packs()))?;
        report.blobs_removed = self.blob_cache().remove_unstored()?;
        Ok(report)
    }

    /// The pins' snapshots.
    fn pinned(&self) -> Result<Vec<SnapshotId>> {
        self.with_reader(|c| {
            let mut stmt = c
                .prepare("SELECT DISTINCT snapshot FROM pins")
                .map_err(Error::db("list pins"))?;
            let rows = stmt
                .query_map([], |r| r.get::<_, Vec<u8>>(0))
                .map_err(Error::db("list pins"))?
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(Error::db("list pins"))?;
            rows.iter().map(|b| SnapshotId::from_slice(b)).collect()
        })
    }

    fn mark_tree(
        &self,
        id: &TreeId,
        live: &mut HashSet<[u8; 32]>,
        seen: &mut HashSet<TreeId>,
    ) -> Result<()> {
        if !seen.insert(*id) {
            return Ok(());
        }
        live.insert(*id.as_bytes());
        let tree = self.tree(id)?;
        for e in &tree.entries {
            match e.target() {
                Target::Dir(sub) => self.mark_tree(&sub, live, seen)?,
                Target::File(c) | Target::Hardlink(c) if live.insert(e.hash) => {
                    self.mark_content(&c, live)?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn mark_content(&self, id: &ContentId, live: &mut HashSet<[u8; 32]>) -> Result<()> {
        let loc = self.with_reader(|c| index::locate(c, id.as_bytes()))?;
        if let Some(loc) = loc
            && loc.kind == ObjectKind::Manifest
        {
            for (chunk, _) in self.content_chunks(id)? {
                live.insert(*chunk.as_bytes());
            }
        }
        Ok(())
    }
}

/// Pins `snapshot` for `holder` inside a transaction (a commit's own).
pub(crate) fn pin_in(
    tx: &rusqlite::Transaction<'_>,
    snapshot: &SnapshotId,
    holder: &str,
) -> Result<()> {
    tx.execute(
        "INSERT OR IGNORE INTO pins (snapshot, holder, created_at) VALUES (?1, ?2, ?3)",
        params![&snapshot.as_bytes()[..], holder, now_secs()],
    )
    .map_err(Error::db("pin snapshot"))?;
    Ok(())
}

/// A duration in seconds for people: `45 s`, `12 min`, `3 h`, `2 d`.
pub fn age(secs: i64) -> String {
    let s = secs.max(0);
    match s {
        0..120 => format!("{s} s"),
        120..7_200 => format!("{} min", s / 60),
        7_200..172_800 => format!("{} h", s / 3_600),
        _ => format!("{} d", s / 86_400),
    }
}
