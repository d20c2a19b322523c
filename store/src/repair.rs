//! Damage: where a corrupt or missing object is needed (snapshots, refs, pins, paths),
//! and its repair.
//!
//! A repair never rewrites or deletes an object. It *quarantines*: each corrupt object
//! is recorded in the `suspects` table, and the stat-cache and git-blob rows that lead
//! to content needing it are dropped, so the next import of a source that still has the
//! bytes reads them again. An import treats a suspect as not stored: it writes the bytes
//! it read (whose hash is the id, by construction) to a new pack, and its commit points
//! the object's row at the new copy and clears the suspicion, in the import's own
//! transaction. The damaged copy is then garbage in its pack, which gc reclaims like any
//! other. An object that is sound again when fsck looks (a pack put back from a backup)
//! is cleared by the next repair.

use std::collections::{HashMap, HashSet};

use rusqlite::params;
use serde::Serialize;

use crate::error::{Error, Result};
pub use crate::fsck::{Damage, MAX_PATHS_LISTED, Need};
use crate::fsck::{FsckReport, Problem};
use crate::id::{ContentId, TreeId};
use crate::index::ObjectKind;
use crate::lock::StoreLock;
use crate::snapshot::now_secs;
use crate::store::Store;
use crate::tree::Kind;

/// What `fsck --repair` did.
#[derive(Debug, Clone, Serialize, Default)]
pub struct RepairReport {
    /// Objects recorded as suspect by this repair.
    pub quarantined: Vec<String>,
    /// Suspects that verify again, no longer suspect.
    pub cleared: Vec<String>,
    /// Suspects still recorded (this repair's and earlier ones').
    pub suspects: Vec<String>,
    pub stat_cache_rows_dropped: u64,
    pub git_blob_rows_dropped: u64,
}

/// How an object of `what` comes back.
fn advice(what: &str) -> String {
    match what {
        "snapshot" => "an import cannot make this snapshot again (it records when it was made): \
                       import its source anew and move its refs there (`mountctl ref set`), \
                       or delete them"
            .into(),
        _ => "quarantined by `fsck --repair`: import any source that still has these paths \
              (the same directory, git revision or tar); the import rewrites the object"
            .into(),
    }
}

/// The object id a problem names, when it names one that could be stored.
fn object_id(p: &Problem) -> Option<[u8; 32]> {
    let bytes = hex::decode(&p.id).ok()?;
    <[u8; 32]>::try_from(bytes.as_slice()).ok()
}

impl Store {
    /// The ids recorded as suspect.
    pub fn suspects(&self) -> Result<HashSet<[u8; 32]>> {
        self.with_reader(crate::suspects::load)
    }

    /// Where each damaged object of `report` is needed.
    pub fn locate_damage(&self, report: &FsckReport) -> Result<Vec<Damage>> {
        let problems = report.corrupt.iter().chain(report.missing.iter());
        let mut damage: Vec<Damage> = Vec::new();
        let mut bad: HashMap<[u8; 32], Vec<usize>> = HashMap::new();
        for (n, p) in problems.enumerate() {
            let missing = n >= report.corrupt.len();
            let Some(id) = object_id(p) else { continue };
            let what = if missing {
                format!("missing {}", p.what)
            } else {
                p.what.clone()
            };
            bad.entry(id).or_default().push(damage.len());
            damage.push(Damage {
                repair: advice(&p.what),
                what,
                id: p.id.clone(),
                why: p.why.clone(),
                needed_by: Vec::new(),
            });
        }
        if damage.is_empty() {
            return Ok(damage);
        }
        let refs = self.refs()?;
        let pins = self.pins()?;
        let mut walker = Walker {
            store: self,
            bad: &bad,
            trees: HashMap::new(),
            contents: HashMap::new(),
        };
        for sid in self.snapshot_ids()? {
            let mut found: HashMap<usize, Vec<String>> = HashMap::new();
            if let Some(ds) = bad.get(sid.as_bytes()) {
                for d in ds {
                    found.entry(*d).or_default();
                }
            } else if let Ok(s) = self.snapshot(&sid) {
                for (d, path) in walker.tree(&s.root)? {
                    found.entry(d).or_default().push(path);
                }
            }
            for (d, mut paths) in found {
                paths.sort();
                paths.dedup();
                let more_paths = paths.len() > MAX_PATHS_LISTED;
                paths.truncate(MAX_PATHS_LISTED);
                damage[d].needed_by.push(Need {
                    snapshot: sid,
                    refs: refs
                        .iter()
                        .filter(|(_, s)| *s == sid)
                        .map(|(n, _)| n.clone())
                        .collect(),
                    pinned_by: pins
                        .iter()
                        .filter(|(s, _)| *s == sid)
                        .map(|(_, h)| h.clone())
                        .collect(),
                    paths,
                    more_paths,
                });
            }
        }
        for d in &mut damage {
            d.needed_by.sort_by_key(|n| n.snapshot);
        }
        Ok(damage)
    }

    /// Quarantines what `report` found corrupt and clears suspects that verify again,
    /// under the exclusive store lock (`wait`: wait for running imports, else `Busy`).
    pub fn repair(&self, report: &FsckReport, wait: bool) -> Result<RepairReport> {
        let _lock = StoreLock::exclusive(self, wait)?;
        let mut out = RepairReport::default();
        let corrupt: Vec<([u8; 32], &Problem)> = report
            .corrupt
            .iter()
            .filter_map(|p| Some((object_id(p)?, p)))
            .collect();
        let corrupt_ids: HashSet<[u8; 32]> = corrupt.iter().map(|(id, _)| *id).collect();
        // Contents leading to a corrupt object: itself, or a manifest naming it.
        let mut contents: HashSet<[u8; 32]> = corrupt_ids.clone();
        contents.extend(self.manifests_naming(&corrupt_ids)?);
        let before = self.suspects()?;
        let mut conn = self.db();
        let tx = conn.transaction().map_err(Error::db("begin repair"))?;
        for (id, p) in &corrupt {
            let n = tx
                .execute(
                    "INSERT OR IGNORE INTO suspects (id, kind, why, found_at) VALUES (?1, ?2, ?3, ?4)",
                    params![&id[..], p.what, p.why, now_secs()],
                )
                .map_err(Error::db("quarantine object"))?;
            if n > 0 {
                out.quarantined.push(hex::encode(id));
            }
        }
        for id in before.iter().filter(|id| !corrupt_ids.contains(*id)) {
            tx.execute("DELETE FROM suspects WHERE id = ?1", params![&id[..]])
                .map_err(Error::db("clear suspect"))?;
            out.cleared.push(hex::encode(id));
        }
        for id in &contents {
            out.stat_cache_rows_dropped +=
                tx.execute("DELETE FROM statcache WHERE content = ?1", params![&id[..]])
                    .map_err(Error::db("drop stat cache rows"))? as u64;
            out.git_blob_rows_dropped +=
                tx.execute("DELETE FROM gitblobs WHERE content = ?1", params![&id[..]])
                    .map_err(Error::db("drop git blob rows"))? as u64;
        }
        out.suspects = crate::suspects::load(&tx)?
            .iter()
            .map(hex::encode)
            .collect();
        out.suspects.sort();
        tx.commit().map_err(Error::db("commit repair"))?;
        Ok(out)
    }

    /// The readable manifests that name any of `chunks`.
    fn manifests_naming(&self, chunks: &HashSet<[u8; 32]>) -> Result<Vec<[u8; 32]>> {
        let ids: Vec<Vec<u8>> = self.with_reader(|c| {
            let mut stmt = c
                .prepare("SELECT id FROM objects WHERE kind = ?1")
                .map_err(Error::db("list manifests"))?;
            stmt.query_map(params![ObjectKind::Manifest as u8], |r| r.get(0))
                .map_err(Error::db("list manifests"))?
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(Error::db("list manifests"))
        })?;
        let mut out = Vec::new();
        for id in ids {
            let Ok(id) = <[u8; 32]>::try_from(id.as_slice()) else {
                continue;
            };
            if let Ok(named) = self.content_chunks(&ContentId::from_bytes(id))
                && named.iter().any(|(c, _)| chunks.contains(c.as_bytes()))
            {
                out.push(id);
            }
        }
        Ok(out)
    }
}

/// Finds the paths under trees that need a bad object, each tree and content once.
struct Walker<'a> {
    store: &'a Store,
    bad: &'a HashMap<[u8; 32], Vec<usize>>,
    /// Tree → (damage, path relative to the tree) beneath it.
    trees: HashMap<TreeId, Vec<(usize, String)>>,
    /// Content → damages it needs.
    contents: HashMap<[u8; 32], Vec<usize>>,
}

impl Walker<'_> {
    fn tree(&mut self, id: &TreeId) -> Result<Vec<(usize, String)>> {
        if let Some(v) = self.trees.get(id) {
            return Ok(v.clone());
        }
        let mut out = Vec::new();
        if let Some(ds) = self.bad.get(id.as_bytes()) {
            out.extend(ds.iter().map(|d| (*d, ".".to_string())));
        } else if let Ok(tree) = self.store.tree(id) {
            for e in &tree.entries {
                let name = String::from_utf8_lossy(&e.name).into_owned();
                match e.kind {
                    Kind::Dir => {
                        for (d, sub) in self.tree(&TreeId::from_bytes(e.hash))? {
                            let p = if sub == "." {
                                name.clone()
                            } else {
                                format!("{name}/{sub}")
                            };
                            out.push((d, p));
                        }
                    }
                    Kind::File | Kind::Hardlink => {
                        for d in self.content(&e.hash) {
                            out.push((d, name.clone()));
                        }
                    }
                    _ => {}
                }
            }
        }
        self.trees.insert(*id, out.clone());
        Ok(out)
    }

    fn content(&mut self, id: &[u8; 32]) -> Vec<usize> {
        if let Some(v) = self.contents.get(id) {
            return v.clone();
        }
        let mut out: Vec<usize> = self.bad.get(id).cloned().unwrap_or_default();
        if out.is_empty()
            && let Ok(chunks) = self.store.content_chunks(&ContentId::from_bytes(*id))
            && chunks.len() > 1
        {
            for (c, _) in chunks {
                out.extend(self.bad.get(c.as_bytes()).into_iter().flatten());
            }
        }
        self.contents.insert(*id, out.clone());
        out
    }
}
