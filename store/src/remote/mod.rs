//! Objects that live on a remote (an S3-compatible object store shared by many hosts):
//! the remotes a root knows, where each remote object is, snapshots whose file contents
//! are not all here yet (partial), and the lazy fetch that brings a missing chunk in at
//! its first read.
//!
//! The store speaks no network protocol: a [`RemoteFetch`] registered with
//! [`Store::set_fetcher`] reads byte ranges of remote objects, and the store verifies
//! every fetched chunk against its id before it is written to a local pack and used, so
//! a damaged or forged remote object is a `Corrupt` error naming it, never data. A chunk
//! fetched once is a local object from then on: it is never fetched twice by this root.
//!
//! The layout of a remote and the [`SnapshotIndex`] encoding are in
//! `docs/store-format.md` ("Remotes").
//!
//! Here: the remotes a root knows and the lazy-fetch state; [`index`] the snapshot
//! index format and what a root records of remote objects; [`fetch`] closures, pulls
//! and lazy fetches.

mod fetch;
mod index;

pub use crate::lazy::RemoteFetch;
pub use fetch::Closure;
pub use index::{IndexChunk, MetaRecord, SnapshotIndex, push_record};

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use rusqlite::{OptionalExtension, params};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::id::SnapshotId;
use crate::pack::Codec;
use crate::snapshot::now_secs;
use crate::store::Store;

/// A remote as recorded in the root (no credentials: those come from the environment).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct RemoteConfig {
    pub name: String,
    /// `s3://BUCKET[/PREFIX]`.
    pub url: String,
    pub endpoint: Option<String>,
    pub region: Option<String>,
    /// The remote used when none is named.
    pub default: bool,
    pub added_at: i64,
}

/// What this root fetched from a remote so far.
#[derive(Debug, Clone, Copy, Serialize, Default, PartialEq, Eq)]
pub struct FetchCounters {
    /// Ranged reads (one per remote object per batch).
    pub requests: u64,
    /// Objects fetched and verified.
    pub objects: u64,
    /// Stored (compressed) bytes fetched.
    pub bytes: u64,
}

/// Where an object is on a remote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteLoc {
    pub remote: String,
    /// The key of the remote pack, below the remote's prefix.
    pub key: String,
    pub offset: u64,
    pub stored_len: u32,
    pub raw_len: u32,
    pub codec: Codec,
}

/// How long a "no remote objects" answer is trusted, in ms.
const RECHECK_MS: u128 = 1000;

/// Ids a lazy fetch asks for in one batch, at most.
const FETCH_BATCH: usize = 4096;
/// Batches a pull fetches at once (each on its own thread, with its own pack).
const PULL_THREADS: usize = 4;

impl Store {
    /// Registers the network side that reads remote objects (see [`RemoteFetch`]).
    pub fn set_fetcher(&self, f: Arc<dyn RemoteFetch>) {
        *self
            .remote
            .fetcher
            .write()
            .unwrap_or_else(|p| p.into_inner()) = Some(f);
    }

    /// Whether any object is known to be on a remote. Once true it stays true for this
    /// open store; a false answer is looked up again after [`RECHECK_MS`] (another
    /// process may have made a remote snapshot known meanwhile).
    pub fn has_remote_objects(&self) -> Result<bool> {
        if self.remote.any.load(Ordering::Acquire) {
            return Ok(true);
        }
        {
            let at = self
                .remote
                .checked_at
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if at.is_some_and(|t| t.elapsed().as_millis() < RECHECK_MS) {
                return Ok(false);
            }
        }
        self.has_remote_objects_now()
    }

    fn has_remote_objects_now(&self) -> Result<bool> {
        let any = self.with_reader(|c| {
            c.query_row("SELECT EXISTS (SELECT 1 FROM remote_objects)", [], |r| {
                r.get::<_, bool>(0)
            })
            .map_err(Error::db("look up remote objects"))
        })?;
        if any {
            self.remote.any.store(true, Ordering::Release);
        }
        *self
            .remote
            .checked_at
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(std::time::Instant::now());
        Ok(any)
    }

    /// Whether some of `chunks` is only on a remote (no lookups when no object is).
    pub fn has_remote_only(&self, chunks: &[(crate::id::ChunkId, u32)]) -> Result<bool> {
        if !self.has_remote_objects()? {
            return Ok(false);
        }
        for (c, _) in chunks {
            if !self.contains(c.as_bytes())? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The remotes this root knows, the default first.
    pub fn remotes(&self) -> Result<Vec<RemoteConfig>> {
        self.with_reader(|c| {
            let mut st = c
                .prepare(
                    "SELECT name, url, endpoint, region, is_default, added_at FROM remotes \
                     ORDER BY is_default DESC, name",
                )
                .map_err(Error::db("list remotes"))?;
            st.query_map([], |r| {
                Ok(RemoteConfig {
                    name: r.get(0)?,
                    url: r.get(1)?,
                    endpoint: r.get(2)?,
                    region: r.get(3)?,
                    default: r.get(4)?,
                    added_at: r.get(5)?,
                })
            })
            .map_err(Error::db("list remotes"))?
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(Error::db("list remotes"))
        })
    }

    /// A remote by name, or the default one for `None`.
    pub fn remote(&self, name: Option<&str>) -> Result<RemoteConfig> {
        let all = self.remotes()?;
        match name {
            Some(n) => all
                .into_iter()
                .find(|r| r.name == n)
                .ok_or_else(|| Error::not_found("remote", crate::error::shown_bare(n))),
            None => all.into_iter().next().ok_or(Error::NoRemote),
        }
    }

    /// Records a remote (the first one becomes the default).
    pub fn add_remote(&self, r: &RemoteConfig) -> Result<RemoteConfig> {
        crate::refs::check_ref_name(&r.name).map_err(|_| {
            Error::Invalid(format!(
                "remote name {:?}: use letters, digits, '.', '_' or '-'",
                r.name
            ))
        })?;
        if r.name.contains('/') {
            return Err(Error::Invalid(format!(
                "remote name {:?}: no '/' (refs fetched from it are named NAME/REF)",
                r.name
            )));
        }
        let conn = self.db();
        let exists: bool = conn
            .query_row(
                "SELECT EXISTS (SELECT 1 FROM remotes WHERE name = ?1)",
                [&r.name],
                |x| x.get(0),
            )
            .map_err(Error::db("look up remote"))?;
        if exists {
            return Err(Error::DestinationExists {
                what: "remote",
                path: r.name.clone().into(),
            });
        }
        let first: bool = conn
            .query_row("SELECT NOT EXISTS (SELECT 1 FROM remotes)", [], |x| {
                x.get(0)
            })
            .map_err(Error::db("look up remotes"))?;
        let now = now_secs();
        conn.execute(
            "INSERT INTO remotes (name, url, endpoint, region, is_default, added_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![r.name, r.url, r.endpoint, r.region, first, now],
        )
        .map_err(Error::db("record remote"))?;
        Ok(RemoteConfig {
            default: first,
            added_at: now,
            ..r.clone()
        })
    }

    /// Forgets a remote. Refused while a snapshot here still needs objects only it has.
    pub fn remove_remote(&self, name: &str) -> Result<()> {
        self.remote(Some(name))?;
        let mut conn = self.db();
        let tx = conn.transaction().map_err(Error::db("begin"))?;
        let partial: Vec<Vec<u8>> = {
            let mut st = tx
                .prepare("SELECT snapshot FROM remote_snapshots WHERE remote = ?1 AND partial")
                .map_err(Error::db("list partial snapshots"))?;
            st.query_map([name], |r| r.get(0))
                .map_err(Error::db("list partial snapshots"))?
                .collect::<std::result::Result<_, _>>()
                .map_err(Error::db("list partial snapshots"))?
        };
        if let Some(s) = partial.first() {
            return Err(Error::Busy(format!(
                "snapshot {} (and {} more) still reads file contents from remote {name}: \
                 `mountctl pull` it first, or remove its workspaces and run `mountctl gc`",
                hex::encode(s),
                partial.len() - 1
            )));
        }
        tx.execute("DELETE FROM remote_objects WHERE remote = ?1", [name])
            .map_err(Error::db("forget remote objects"))?;
        tx.execute("DELETE FROM remote_stats WHERE remote = ?1", [name])
            .map_err(Error::db("forget remote"))?;
        let was_default: bool = tx
            .query_row(
                "SELECT is_default FROM remotes WHERE name = ?1",
                [name],
                |r| r.get(0),
            )
            .map_err(Error::db("look up remote"))?;
        tx.execute("DELETE FROM remotes WHERE name = ?1", [name])
            .map_err(Error::db("forget remote"))?;
        if was_default {
            tx.execute(
                "UPDATE remotes SET is_default = 1 WHERE name = (SELECT name FROM remotes ORDER BY name LIMIT 1)",
                [],
            )
            .map_err(Error::db("choose default remote"))?;
        }
        tx.commit().map_err(Error::db("commit"))?;
        Ok(())
    }

    /// Every id a remote holds for this root, and the snapshots read from a remote.
    pub(crate) fn remote_ids(&self) -> Result<(HashSet<[u8; 32]>, HashSet<SnapshotId>)> {
        self.with_reader(|c| {
            let ids = |sql: &str| -> Result<Vec<[u8; 32]>> {
                let mut st = c.prepare(sql).map_err(Error::db("list remote objects"))?;
                let rows = st
                    .query_map([], |r| r.get::<_, Vec<u8>>(0))
                    .map_err(Error::db("list remote objects"))?
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(Error::db("list remote objects"))?;
                Ok(rows
                    .iter()
                    .filter_map(|b| <[u8; 32]>::try_from(b.as_slice()).ok())
                    .collect())
            };
            let objects = ids("SELECT id FROM remote_objects")?.into_iter().collect();
            let snaps = ids("SELECT snapshot FROM remote_snapshots")?
                .into_iter()
                .map(SnapshotId::from_bytes)
                .collect();
            Ok((objects, snaps))
        })
    }

    /// What this root fetched from `remote`.
    pub fn fetch_counters(&self, remote: &str) -> Result<FetchCounters> {
        self.with_reader(|c| {
            c.query_row(
                "SELECT requests, objects, bytes FROM remote_stats WHERE remote = ?1",
                [remote],
                |r| {
                    Ok(FetchCounters {
                        requests: r.get::<_, i64>(0)? as u64,
                        objects: r.get::<_, i64>(1)? as u64,
                        bytes: r.get::<_, i64>(2)? as u64,
                    })
                },
            )
            .optional()
            .map_err(Error::db("read fetch counters"))
            .map(Option::unwrap_or_default)
        })
    }

    /// Whether some file content of `snapshot` is still only on a remote.
    pub fn is_partial(&self, snapshot: &SnapshotId) -> Result<Option<String>> {
        self.with_reader(|c| {
            c.query_row(
                "SELECT remote FROM remote_snapshots WHERE snapshot = ?1 AND partial",
                [&snapshot.as_bytes()[..]],
                |r| r.get(0),
            )
            .optional()
            .map_err(Error::db("look up partial snapshot"))
        })
    }

    /// The remote a snapshot was read from, if it was.
    pub fn remote_of(&self, snapshot: &SnapshotId) -> Result<Option<String>> {
        self.with_reader(|c| {
            c.query_row(
                "SELECT remote FROM remote_snapshots WHERE snapshot = ?1",
                [&snapshot.as_bytes()[..]],
                |r| r.get(0),
            )
            .optional()
            .map_err(Error::db("look up remote snapshot"))
        })
    }
}
