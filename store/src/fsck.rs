//! fsck: every object read back and checked against its id, and every reference between
//! objects checked to point at something stored.

use std::collections::{HashMap, HashSet};

use serde::Serialize;

use crate::codec::Manifest;
use crate::error::{Error, Result};
use crate::id::{ContentId, SnapshotId, TreeId};
use crate::index::{Location, ObjectKind};
use crate::pack::{Codec, PackId};
use crate::snapshot::Snapshot;
use crate::store::{Store, committed_packs, verify};
use crate::tree::{Kind, Tree};

/// One thing wrong.
#[derive(Debug, Clone, Serialize)]
pub struct Problem {
    /// `chunk`, `manifest`, `tree`, `snapshot`, `ref`, `pack` or `content`.
    pub what: String,
    pub id: String,
    pub why: String,
}

/// Paths listed per damaged object and snapshot (a chunk shared by many files).
pub const MAX_PATHS_LISTED: usize = 100;

/// One damaged object and what needs it.
#[derive(Debug, Clone, Serialize)]
pub struct Damage {
    /// `chunk`, `manifest`, `tree`, `snapshot`, `content` (a manifest whose chunks do
    /// not make its content), `index row`; `missing chunk` etc. for an object named but
    /// not stored.
    pub what: String,
    pub id: String,
    pub why: String,
    pub needed_by: Vec<Need>,
    /// What brings it back.
    pub repair: String,
}

/// A snapshot that needs a damaged object, where.
#[derive(Debug, Clone, Serialize)]
pub struct Need {
    pub snapshot: SnapshotId,
    /// Refs naming this snapshot.
    pub refs: Vec<String>,
    /// Holders (workspaces) pinning it.
    pub pinned_by: Vec<String>,
    /// Root-relative paths that need the object (`.` for the root directory); empty
    /// when the snapshot object itself is damaged. At most [`MAX_PATHS_LISTED`].
    pub paths: Vec<String>,
    /// Whether more paths need it than are listed.
    pub more_paths: bool,
}

/// What fsck found.
#[derive(Debug, Clone, Serialize, Default)]
pub struct FsckReport {
    pub objects_checked: u64,
    pub bytes_checked: u64,
    pub packs_checked: u64,
    /// Contents and chunks of snapshots made known by a remote that are not fetched yet
    /// (not missing: they are read from the remote at first use).
    pub remote_only: u64,
    /// Objects whose bytes do not match their id or cannot be decoded.
    pub corrupt: Vec<Problem>,
    /// References to objects that are not stored.
    pub missing: Vec<Problem>,
    /// Pack files that no committed transaction names (left by a crash; gc removes them).
    pub orphan_packs: Vec<String>,
    /// Where each corrupt or missing object is needed (snapshots, refs, paths) and how
    /// it comes back.
    pub damage: Vec<Damage>,
    /// Objects quarantined by a repair and not yet rewritten by an import.
    pub suspects: Vec<String>,
}

impl FsckReport {
    /// Whether the store is sound (orphan packs are harmless leftovers).
    pub fn is_clean(&self) -> bool {
        self.corrupt.is_empty() && self.missing.is_empty()
    }
}

fn problem(what: &str, id: impl ToString, why: impl Into<String>) -> Problem {
    Problem {
        what: what.into(),
        id: id.to_string(),
        why: why.into(),
    }
}

/// One row of the index's `objects` table: id, kind, pack, offset, stored length, raw
/// length, codec, part.
type IndexRow = (Vec<u8>, u8, String, i64, u32, u32, u8, u32);

/// What fsck read back of the stored objects: each sound id's kind, and the metadata
/// objects decoded.
#[derive(Default)]
struct Objects {
    kinds: HashMap<[u8; 32], ObjectKind>,
    trees: Vec<(TreeId, Tree)>,
    manifests: Vec<(ContentId, Manifest)>,
    snapshots: Vec<(SnapshotId, Snapshot)>,
}

impl Objects {
    /// Whether `id` is stored as one of the kinds `want`.
    fn has(&self, id: &[u8; 32], want: &[ObjectKind]) -> bool {
        self.kinds.get(id).is_some_and(|k| want.contains(k))
    }
}

/// Contents and chunks of snapshots made known by a remote: the ids it holds, and
/// those not fetched yet that fsck met (counted as [`FsckReport::remote_only`]).
struct RemoteOnly {
    ids: HashSet<[u8; 32]>,
    met: HashSet<[u8; 32]>,
}

impl Store {
    /// Checks every object and reference. Reading goes through the same verified paths as
    /// every other read, so what fsck accepts is what export and the daemon will serve.
    pub fn fsck(&self) -> Result<FsckReport> {
        let mut report = FsckReport::default();
        let (rows, packs) = self.with_reader(|c| Ok((index_rows(c)?, committed_packs(c)?)))?;
        self.check_packs(&packs, &mut report);
        let objects = self.check_objects(rows, &mut report);
        let (ids, from_remote) = self.remote_ids()?;
        let mut remote = RemoteOnly {
            ids,
            met: HashSet::new(),
        };
        self.check_manifests(&objects, &mut remote, &mut report);
        check_trees(&objects, &mut remote, &mut report);
        check_snapshots(&objects, &from_remote, &mut report);
        self.check_names(&objects, &mut report)?;
        report.remote_only = remote.met.len() as u64;
        report.suspects = self.suspects()?.iter().map(hex::encode).collect();
        report.suspects.sort();
        if !report.is_clean() {
            report.damage = self.locate_damage(&report)?;
        }
        Ok(report)
    }

    /// Packs: present and at least as long as recorded; those no transaction committed
    /// are listed as orphans.
    fn check_packs(&self, packs: &[(PackId, u64)], report: &mut FsckReport) {
        for (pack, size) in packs {
            report.packs_checked += 1;
            match self.backend.len(pack) {
                Ok(n) if n >= *size => {}
                Ok(n) => report.corrupt.push(problem(
                    "pack",
                    pack,
                    format!("{n} bytes on disk, {size} committed (truncated)"),
                )),
                Err(e) => report
                    .corrupt
                    .push(problem("pack", pack, format!("unreadable: {e}"))),
            }
        }
        let committed: HashSet<&PackId> = packs.iter().map(|(p, _)| p).collect();
        if let Ok(all) = self.backend.list() {
            report.orphan_packs = all
                .iter()
                .filter(|p| !committed.contains(p))
                .map(|p| p.to_string())
                .collect();
        }
    }

    /// Objects: read, decompress, verify; trees, manifests and snapshots decoded.
    fn check_objects(&self, rows: Vec<IndexRow>, report: &mut FsckReport) -> Objects {
        let mut out = Objects {
            kinds: HashMap::with_capacity(rows.len()),
            ..Default::default()
        };
        for (id, kind, pack, offset, stored_len, raw_len, codec, part) in rows {
            let Ok(id) = <[u8; 32]>::try_from(id.as_slice()) else {
                report
                    .corrupt
                    .push(problem("index row", hex::encode(&id), "id is not 32 bytes"));
                continue;
            };
            let hexid = hex::encode(id);
            let (Some(kind), Some(pack), Some(codec)) = (
                ObjectKind::from_u8(kind),
                PackId::parse(&pack),
                Codec::from_u8(codec),
            ) else {
                report
                    .corrupt
                    .push(problem("index row", &hexid, "unknown kind, pack or codec"));
                continue;
            };
            out.kinds.insert(id, kind);
            let loc = Location {
                kind,
                pack,
                offset: offset as u64,
                stored_len,
                raw_len,
                codec,
                part,
            };
            report.objects_checked += 1;
            report.bytes_checked += u64::from(raw_len);
            let data = match self.read_located(&id, &loc).and_then(|d| {
                verify(kind, &id, &d)?;
                Ok(d)
            }) {
                Ok(d) => d,
                Err(e) => {
                    report
                        .corrupt
                        .push(problem(kind.as_str(), &hexid, short_why(&e)));
                    continue;
                }
            };
            let decoded = match kind {
                ObjectKind::Tree => {
                    let tid = TreeId::from_bytes(id);
                    Tree::decode(&tid, &data).map(|t| out.trees.push((tid, t)))
                }
                ObjectKind::Manifest => {
                    let cid = ContentId::from_bytes(id);
                    Manifest::decode(&cid, &data).map(|m| out.manifests.push((cid, m)))
                }
                ObjectKind::Snapshot => {
                    let sid = SnapshotId::from_bytes(id);
                    Snapshot::decode(&sid, &data).map(|s| out.snapshots.push((sid, s)))
                }
                ObjectKind::Chunk => Ok(()),
            };
            if let Err(e) = decoded {
                report
                    .corrupt
                    .push(problem(kind.as_str(), &hexid, short_why(&e)));
            }
        }
        out
    }

    /// Manifests: chunks present, and the whole hashes to the content id (checked only
    /// when every chunk is sound, so one damaged chunk is reported once).
    fn check_manifests(&self, objects: &Objects, remote: &mut RemoteOnly, report: &mut FsckReport) {
        let bad: HashSet<String> = report.corrupt.iter().map(|p| p.id.clone()).collect();
        for (cid, m) in &objects.manifests {
            let mut ok = true;
            for (chunk, _) in &m.chunks {
                if bad.contains(&chunk.to_hex()) {
                    ok = false;
                } else if !objects.has(chunk.as_bytes(), &[ObjectKind::Chunk])
                    && remote.ids.contains(chunk.as_bytes())
                {
                    remote.met.insert(*chunk.as_bytes());
                    ok = false;
                } else if !objects.has(chunk.as_bytes(), &[ObjectKind::Chunk]) {
                    // Either the chunk's row is gone or the manifest's bytes are wrong
                    // (a flipped byte in a chunk id decodes fine): the manifest cannot
                    // give its content, and a re-import rewrites both once it is
                    // quarantined.
                    report.corrupt.push(problem(
                        "manifest",
                        cid,
                        format!("names chunk {chunk}, which is not stored"),
                    ));
                    ok = false;
                    break;
                }
            }
            if ok && let Err(e) = self.write_content(cid, &mut std::io::sink()) {
                report.corrupt.push(problem("content", cid, short_why(&e)));
            }
        }
    }

    /// Refs and pins: their snapshots present. Read after the listing of the objects, so
    /// a commit that finished meanwhile names a snapshot the listing could not hold: one
    /// the index holds now is no missing one (it is checked by the next fsck).
    fn check_names(&self, objects: &Objects, report: &mut FsckReport) -> Result<()> {
        let written_since = |sid: &SnapshotId| {
            self.locate(sid.as_bytes())
                .is_ok_and(|l| l.is_some_and(|l| l.kind == ObjectKind::Snapshot))
        };
        let present = |sid: &SnapshotId| {
            objects.has(sid.as_bytes(), &[ObjectKind::Snapshot]) || written_since(sid)
        };
        for (name, sid) in self.refs()? {
            if !present(&sid) {
                report
                    .missing
                    .push(problem("snapshot", sid, format!("named by ref {name}")));
            }
        }
        for (sid, holder) in self.pins()? {
            if !present(&sid) {
                report
                    .missing
                    .push(problem("snapshot", sid, format!("pinned by {holder}")));
            }
        }
        Ok(())
    }
}

/// Every row of the index's `objects` table, by pack and offset.
fn index_rows(c: &rusqlite::Connection) -> Result<Vec<IndexRow>> {
    let mut stmt = c
        .prepare(
            "SELECT id, kind, pack, offset, stored_len, raw_len, codec, part FROM objects
             ORDER BY pack, offset",
        )
        .map_err(Error::db("list objects"))?;
    stmt.query_map([], |r| {
        Ok((
            r.get::<_, Vec<u8>>(0)?,
            r.get::<_, u8>(1)?,
            r.get::<_, String>(2)?,
            r.get::<_, i64>(3)?,
            r.get::<_, u32>(4)?,
            r.get::<_, u32>(5)?,
            r.get::<_, u8>(6)?,
            r.get::<_, u32>(7)?,
        ))
    })
    .map_err(Error::db("list objects"))?
    .collect::<std::result::Result<Vec<_>, _>>()
    .map_err(Error::db("list objects"))
}

/// Trees: every content and subtree present.
fn check_trees(objects: &Objects, remote: &mut RemoteOnly, report: &mut FsckReport) {
    let content_kinds = [ObjectKind::Chunk, ObjectKind::Manifest];
    for (tid, t) in &objects.trees {
        for e in &t.entries {
            let name = String::from_utf8_lossy(&e.name);
            match e.kind {
                Kind::Dir if !objects.has(&e.hash, &[ObjectKind::Tree]) => {
                    report.missing.push(problem(
                        "tree",
                        hex::encode(e.hash),
                        format!("subtree {name:?} of tree {tid}"),
                    ))
                }
                Kind::File | Kind::Hardlink
                    if !objects.has(&e.hash, &content_kinds) && remote.ids.contains(&e.hash) =>
                {
                    remote.met.insert(e.hash);
                }
                Kind::File | Kind::Hardlink if !objects.has(&e.hash, &content_kinds) => {
                    report.missing.push(problem(
                        "content",
                        hex::encode(e.hash),
                        format!("file {name:?} of tree {tid}"),
                    ))
                }
                _ => {}
            }
        }
    }
}

/// Snapshots: root and parents present (a snapshot read from a remote comes without its
/// history: its parents may be absent).
fn check_snapshots(objects: &Objects, from_remote: &HashSet<SnapshotId>, report: &mut FsckReport) {
    for (sid, s) in &objects.snapshots {
        if !objects.has(s.root.as_bytes(), &[ObjectKind::Tree]) {
            report
                .missing
                .push(problem("tree", s.root, format!("root of snapshot {sid}")));
        }
        for p in &s.parents {
            if !objects.has(p.as_bytes(), &[ObjectKind::Snapshot]) && !from_remote.contains(sid) {
                report
                    .missing
                    .push(problem("snapshot", p, format!("parent of snapshot {sid}")));
            }
        }
    }
}

fn short_why(e: &Error) -> String {
    match e {
        Error::Corrupt { why, .. } => why.clone(),
        other => other.to_string(),
    }
}
