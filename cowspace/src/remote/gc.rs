//! Remote gc: a mark and a sweep at least a grace period apart, safe against pushes from
//! other hosts running meanwhile (`docs/store-format.md`, "Remote gc").
//!
//! Roots are the snapshots remote refs and pins name; what their indexes name (the index
//! objects and the packs) is reachable. Each run:
//! 1. deletes, for every mark older than the grace period, the keys it names that are
//!    still unreachable now, then the mark;
//! 2. writes a new mark naming what is unreachable now and no younger mark names.
//!
//! A push never reuses a pack a mark names (it uploads the chunks again) and gives up
//! before writing its index when it has run for half the grace period, so a pack a push
//! relies on is either reachable by the time a sweep looks, or was never in a mark the
//! push could have missed.

use std::collections::HashSet;

use cowspace_store::remote::SnapshotIndex;
use cowspace_store::{SnapshotId, Store};
use serde::{Deserialize, Serialize};

use super::{GC_GRACE_SECS, index_key, read_ref};
use crate::error::{Error, Result};

/// A gc mark object's body.
#[derive(Debug, Serialize, Deserialize)]
pub struct Mark {
    pub created_at: i64,
    pub keys: Vec<String>,
}

/// What a remote gc did (or, with `dry_run`, would do).
#[derive(Debug, Serialize, Default)]
pub struct RemoteGcReport {
    pub remote: String,
    pub dry_run: bool,
    pub grace_secs: i64,
    /// Snapshots kept because a ref or a pin names them.
    pub roots: Vec<String>,
    pub refs: u64,
    pub pins: u64,
    pub packs: u64,
    pub indexes: u64,
    /// Keys unreachable now.
    pub unreachable: Vec<String>,
    /// Keys deleted by this run (unreachable in a mark older than the grace, and now).
    pub deleted: Vec<String>,
    pub bytes_deleted: u64,
    /// Keys this run's mark names (deleted by a run at least the grace period later).
    pub marked: u64,
}

fn now() -> i64 {
    cowspace_store::snapshot::now_secs()
}

/// `remote gc [NAME] [--dry-run] [--grace SECS]`.
pub fn gc(
    store: &Store,
    remote: Option<&str>,
    dry_run: bool,
    grace_secs: Option<i64>,
) -> Result<RemoteGcReport> {
    let c = super::client(store, remote)?;
    let grace = grace_secs.unwrap_or(GC_GRACE_SECS).max(0);
    let mut report = RemoteGcReport {
        remote: c.name.clone(),
        dry_run,
        grace_secs: grace,
        ..Default::default()
    };
    let listed = c.list("")?;
    let mut roots: HashSet<SnapshotId> = HashSet::new();
    let mut candidates: Vec<(String, u64)> = Vec::new();
    let mut marks: Vec<(String, Mark)> = Vec::new();
    for (key, size, _) in &listed {
        if let Some(name) = key.strip_prefix("refs/") {
            report.refs += 1;
            if let Some((s, _)) = read_ref(&c, name)? {
                roots.insert(s);
            }
        } else if let Some(rest) = key.strip_prefix("pins/") {
            report.pins += 1;
            if let Some((snap, _)) = rest.split_once('/')
                && let Ok(s) = snap.parse::<SnapshotId>()
            {
                roots.insert(s);
            }
        } else if key.starts_with("packs/") {
            report.packs += 1;
            candidates.push((key.clone(), *size));
        } else if key.starts_with("snapshots/") {
            report.indexes += 1;
            candidates.push((key.clone(), *size));
        } else if key.starts_with("gc/marks/")
            && let Some((b, _)) = c.get(key)?
            && let Ok(m) = serde_json::from_slice::<Mark>(&b)
        {
            marks.push((key.clone(), m));
        }
    }
    let mut reachable: HashSet<String> = HashSet::new();
    for s in &roots {
        let key = index_key(s);
        reachable.insert(key.clone());
        // A root whose index is not (yet) there protects nothing more.
        let Some((bytes, _)) = c.get(&key)? else {
            continue;
        };
        let index = SnapshotIndex::decode(&bytes, s, &key)?;
        reachable.extend(index.packs);
    }
    let mut rs: Vec<String> = roots.iter().map(SnapshotId::to_hex).collect();
    rs.sort();
    report.roots = rs;
    let unreachable: Vec<(String, u64)> = candidates
        .into_iter()
        .filter(|(k, _)| !reachable.contains(k))
        .collect();
    report.unreachable = unreachable.iter().map(|(k, _)| k.clone()).collect();
    let unreachable_set: HashSet<&str> = unreachable.iter().map(|(k, _)| k.as_str()).collect();
    let size_of = |k: &str| {
        unreachable
            .iter()
            .find(|(x, _)| x == k)
            .map_or(0, |(_, n)| *n)
    };

    // 1. Sweep the marks old enough.
    let cutoff = now() - grace;
    let mut still_marked: HashSet<String> = HashSet::new();
    for (key, m) in &marks {
        if m.created_at > cutoff {
            still_marked.extend(m.keys.iter().cloned());
            continue;
        }
        for k in &m.keys {
            if unreachable_set.contains(k.as_str()) && !report.deleted.contains(k) {
                report.bytes_deleted += size_of(k);
                report.deleted.push(k.clone());
                if !dry_run {
                    c.delete(k)?;
                }
            }
        }
        if !dry_run {
            c.delete(key)?;
        }
    }
    // 2. Mark what is unreachable now and not waiting in a younger mark.
    let deleted: HashSet<&String> = report.deleted.iter().collect();
    let new: Vec<String> = unreachable
        .iter()
        .map(|(k, _)| k)
        .filter(|k| !still_marked.contains(*k) && !deleted.contains(k))
        .cloned()
        .collect();
    report.marked = new.len() as u64;
    if !new.is_empty() && !dry_run {
        let t = now();
        let body = serde_json::to_vec(&Mark {
            created_at: t,
            keys: new,
        })
        .map_err(|e| Error::Invalid(format!("the gc mark cannot be encoded: {e}")))?;
        let key = format!("gc/marks/{t}-{}.json", &blake3::hash(&body).to_hex()[..12]);
        c.put_new(&key, body)?;
    }
    Ok(report)
}
