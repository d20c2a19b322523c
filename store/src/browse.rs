//! Looking paths up in snapshots, and store-wide figures.

use serde::Serialize;

use crate::error::{Error, Result};
use crate::id::SnapshotId;
use crate::index::ObjectKind;
use crate::store::Store;
use crate::tree::{Entry, Kind, Tree};

/// What a path names in a snapshot.
#[derive(Debug, Clone)]
pub enum Found {
    /// A directory (the root, or an entry of kind `Dir`) with its entries.
    Dir { entry: Option<Entry>, tree: Tree },
    /// Anything else.
    Leaf(Entry),
}

/// An entry as shown to people and scripts.
#[derive(Debug, Clone, Serialize)]
pub struct EntryView {
    pub name: String,
    pub kind: Kind,
    /// Permission bits in octal.
    pub mode: String,
    pub size: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub xattrs: Vec<String>,
}

impl From<&Entry> for EntryView {
    fn from(e: &Entry) -> EntryView {
        EntryView {
            name: String::from_utf8_lossy(&e.name).into_owned(),
            kind: e.kind,
            mode: format!("{:04o}", e.mode),
            size: e.size,
            id: matches!(e.kind, Kind::Dir | Kind::File | Kind::Hardlink)
                .then(|| hex::encode(e.hash)),
            target: matches!(e.kind, Kind::Symlink | Kind::Hardlink)
                .then(|| String::from_utf8_lossy(&e.data).into_owned()),
            xattrs: e
                .xattrs
                .iter()
                .map(|(k, _)| String::from_utf8_lossy(k).into_owned())
                .collect(),
        }
    }
}

/// Store-wide figures (`mountctl stats`).
#[derive(Debug, Clone, Serialize)]
pub struct Stats {
    pub snapshots: u64,
    pub refs: u64,
    pub packs: u64,
    pub chunks: u64,
    pub manifests: u64,
    pub trees: u64,
    /// Sum of file bytes over every snapshot: what a full copy per snapshot would take.
    pub logical_bytes: u64,
    /// Bytes of distinct chunk contents, uncompressed.
    pub unique_bytes: u64,
    /// Bytes of all objects as stored (compressed) in packs.
    pub stored_bytes: u64,
    /// Bytes of pack files on disk (stored bytes plus record headers and orphans).
    pub pack_file_bytes: u64,
    /// logical_bytes / unique_bytes.
    pub dedup_ratio: f64,
    /// unique chunk bytes / their stored bytes.
    pub compression_ratio: f64,
    /// logical_bytes / stored_bytes.
    pub overall_ratio: f64,
}

impl Store {
    /// Finds `path` (`/`-separated, relative to the snapshot root; empty for the root).
    pub fn lookup(&self, snapshot: &SnapshotId, path: &str) -> Result<Found> {
        let snap = self.snapshot(snapshot)?;
        let mut tree = self.tree(&snap.root)?;
        let mut entry: Option<Entry> = None;
        let comps: Vec<&str> = path
            .split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .collect();
        for (i, c) in comps.iter().enumerate() {
            let e = tree.get(c.as_bytes()).cloned().ok_or_else(|| {
                Error::not_found("path", format!("{path} in {}", snapshot.short()))
            })?;
            if let Some(sub) = e.subtree() {
                tree = self.tree(&sub)?;
                entry = Some(e);
            } else if i + 1 == comps.len() {
                return Ok(Found::Leaf(e));
            } else {
                return Err(Error::not_found(
                    "path",
                    format!("{path} in {}", snapshot.short()),
                ));
            }
        }
        Ok(Found::Dir { entry, tree })
    }

    /// Figures about the whole store.
    pub fn stats(&self) -> Result<Stats> {
        let snaps = self.snapshots()?;
        let logical_bytes: u64 = snaps.iter().map(|(_, s)| s.counts.bytes).sum();
        let refs = self.refs()?.len() as u64;
        let (by_kind, packs) = self.with_reader(|c| {
            let mut stmt = c
                .prepare(
                    "SELECT kind, COUNT(*), COALESCE(SUM(raw_len), 0),
                     COALESCE(SUM(CASE WHEN codec = 2 THEN 0 ELSE stored_len END), 0)
                     FROM objects GROUP BY kind",
                )
                .map_err(Error::db("count objects"))?;
            let rows = stmt
                .query_map([], |r| {
                    Ok((
                        r.get::<_, u8>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, i64>(2)?,
                        r.get::<_, i64>(3)?,
                    ))
                })
                .map_err(Error::db("count objects"))?
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(Error::db("count objects"))?;
            // Group members share their group's stored bytes: counted once per group.
            let grouped: i64 = c
                .query_row(
                    "SELECT COALESCE(SUM(stored_len), 0) FROM
                     (SELECT DISTINCT pack, offset, stored_len FROM objects WHERE codec = 2)",
                    [],
                    |r| r.get(0),
                )
                .map_err(Error::db("count objects"))?;
            let rows = rows
                .into_iter()
                .map(|(k, n, raw, stored)| match ObjectKind::from_u8(k) {
                    Some(ObjectKind::Chunk) => (k, n, raw, stored + grouped),
                    _ => (k, n, raw, stored),
                })
                .collect::<Vec<_>>();
            Ok((rows, crate::store::committed_packs(c)?))
        })?;
        let mut s = Stats {
            snapshots: snaps.len() as u64,
            refs,
            packs: packs.len() as u64,
            chunks: 0,
            manifests: 0,
            trees: 0,
            logical_bytes,
            unique_bytes: 0,
            stored_bytes: 0,
            pack_file_bytes: packs.iter().map(|(_, n)| n).sum(),
            dedup_ratio: 0.0,
            compression_ratio: 0.0,
            overall_ratio: 0.0,
        };
        let mut chunk_stored = 0u64;
        for (kind, n, raw, stored) in by_kind {
            s.stored_bytes += stored as u64;
            match ObjectKind::from_u8(kind) {
                Some(ObjectKind::Chunk) => {
                    s.chunks = n as u64;
                    s.unique_bytes = raw as u64;
                    chunk_stored = stored as u64;
                }
                Some(ObjectKind::Manifest) => s.manifests = n as u64,
                Some(ObjectKind::Tree) => s.trees = n as u64,
                _ => {}
            }
        }
        let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        s.dedup_ratio = ratio(s.logical_bytes, s.unique_bytes);
        s.compression_ratio = ratio(s.unique_bytes, chunk_stored);
        s.overall_ratio = ratio(s.logical_bytes, s.stored_bytes);
        Ok(s)
    }
}
