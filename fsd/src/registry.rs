//! The registry: one SQLite record per workspace and its lifecycle, under the runtime root
//! (`registry.db`). Every state change is committed before the action it announces, so a
//! crash between the two leaves a record that `sweep` can see and repair.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Lifecycle of a workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Being made; a crash here is finished off by sweep.
    Creating,
    /// Mounted and usable.
    Active,
    /// Its mount is gone (daemon crash, reboot); data intact; `recover` brings it back.
    Stopped,
    /// Being removed; sweep finishes the job.
    CleanupPending,
    /// Gone; the record stays as evidence.
    Removed,
    /// Creation failed; nothing of it remains but the record.
    Failed,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Creating => "creating",
            Status::Active => "active",
            Status::Stopped => "stopped",
            Status::CleanupPending => "cleanup_pending",
            Status::Removed => "removed",
            Status::Failed => "failed",
        }
    }
}

/// Everything recorded about one workspace (its evidence).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Record {
    pub id: String,
    pub name: Option<String>,
    pub worker: Option<String>,
    /// The base snapshot (full hex).
    pub snapshot: String,
    pub materializer: String,
    /// `view` (the daemon's read-only snapshot view), `checkout` (hard links into the
    /// blob cache; overlay's, and what `reflink` and `copy` copy) or `subvolume` (the
    /// read-only btrfs subvolume `btrfs` snapshots).
    pub lower_kind: String,
    pub lower: PathBuf,
    /// Where the worker sees the workspace.
    pub path: PathBuf,
    /// The workspace's private directory (upper, work, scratch).
    pub private_dir: PathBuf,
    pub status: Status,
    pub created_at: i64,
    pub updated_at: i64,
    pub stopped_at: Option<i64>,
    /// Source commit, exclusion and dirty-state policies, as JSON.
    pub policies: serde_json::Value,
    pub diagnostics: Vec<String>,
    /// Published ports: internal -> host.
    pub ports: serde_json::Value,
    /// Snapshots captured from this workspace, oldest first.
    pub commits: Vec<String>,
    /// Milliseconds `create` took.
    pub create_ms: f64,
    /// The host pid of the `sandbox-helper` running a command in this workspace
    /// (`mountctl run`), while it runs. At most one sandbox per workspace; `remove`
    /// refuses (busy) while it lives, `remove --force` ends it. A pid left by a crashed
    /// `mountctl` counts only while it is still a `sandbox-helper` of this workspace.
    #[serde(default)]
    pub sandbox_pid: Option<i32>,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS workspaces (
    id TEXT PRIMARY KEY,
    name TEXT,
    record TEXT NOT NULL,
    status TEXT NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS workspaces_live_name ON workspaces (name)
    WHERE name IS NOT NULL AND status NOT IN ('removed', 'failed');
";

/// How long a registry connection waits for another writer.
pub const REGISTRY_BUSY_TIMEOUT_MS: u64 = 30_000;

/// The registry database.
#[derive(Debug)]
pub struct Registry {
    conn: Connection,
}

/// Seconds since the epoch.
pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

impl Registry {
    /// Opens (creating if needed) the registry of a runtime root.
    pub fn open(root: &Path) -> Result<Registry> {
        let path = root.join("registry.db");
        let conn = Connection::open(&path).map_err(Error::reg("open"))?;
        conn.busy_timeout(Duration::from_millis(REGISTRY_BUSY_TIMEOUT_MS))
            .map_err(Error::reg("set busy timeout"))?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(Error::reg("enable WAL"))?;
        // NORMAL in WAL mode: a committed state change survives a crash of any process
        // (what the registry must survive: its mounts die with the machine anyway), and
        // creating a workspace does not wait for a disk flush.
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(Error::reg("set synchronous"))?;
        conn.execute_batch(SCHEMA)
            .map_err(Error::reg("create schema"))?;
        Ok(Registry { conn })
    }

    /// Records a new workspace (status `creating`). A live workspace of the same name is
    /// refused.
    pub fn insert(&self, r: &Record) -> Result<()> {
        let json = serde_json::to_string(r).expect("record serialises");
        match self.conn.execute(
            "INSERT INTO workspaces (id, name, record, status) VALUES (?1, ?2, ?3, ?4)",
            params![r.id, r.name, json, r.status.as_str()],
        ) {
            Ok(_) => Ok(()),
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::ConstraintViolation =>
            {
                Err(Error::NameTaken(
                    r.name.clone().unwrap_or_else(|| r.id.clone()),
                ))
            }
            Err(e) => Err(Error::reg("record workspace")(e)),
        }
    }

    /// Writes a changed record.
    pub fn update(&self, r: &Record) -> Result<()> {
        let json = serde_json::to_string(r).expect("record serialises");
        let n = self
            .conn
            .execute(
                "UPDATE workspaces SET record = ?2, status = ?3 WHERE id = ?1",
                params![r.id, json, r.status.as_str()],
            )
            .map_err(Error::reg("update workspace"))?;
        if n == 0 {
            return Err(Error::NoWorkspace(r.id.clone()));
        }
        Ok(())
    }

    /// Reads the record of `id`, lets `change` edit it, and writes it back, in one
    /// immediate transaction (no other writer in between, from any process).
    pub fn modify<T>(
        &mut self,
        id: &str,
        change: impl FnOnce(&mut Record) -> Result<T>,
    ) -> Result<T> {
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(Error::reg("begin"))?;
        let json: String = tx
            .query_row(
                "SELECT record FROM workspaces WHERE id = ?1",
                params![id],
                |row| row.get(0),
            )
            .optional()
            .map_err(Error::reg("look up workspace"))?
            .ok_or_else(|| Error::NoWorkspace(id.to_string()))?;
        let mut r: Record = serde_json::from_str(&json)
            .map_err(|e| Error::Invalid(format!("registry record of {id} is unreadable: {e}")))?;
        let out = change(&mut r)?;
        r.updated_at = now();
        let json = serde_json::to_string(&r).expect("record serialises");
        tx.execute(
            "UPDATE workspaces SET record = ?2, status = ?3 WHERE id = ?1",
            params![r.id, json, r.status.as_str()],
        )
        .map_err(Error::reg("update workspace"))?;
        tx.commit().map_err(Error::reg("commit"))?;
        Ok(out)
    }

    /// Sets a record's status (with the time) and saves it.
    pub fn set_status(&self, r: &mut Record, status: Status) -> Result<()> {
        r.status = status;
        r.updated_at = now();
        if matches!(status, Status::Stopped | Status::Removed) {
            r.stopped_at = Some(r.updated_at);
        }
        self.update(r)
    }

    /// Finds a workspace by id or live name.
    pub fn get(&self, id_or_name: &str) -> Result<Record> {
        let json: Option<String> = self
            .conn
            .query_row(
                "SELECT record FROM workspaces WHERE id = ?1
                 OR (name = ?1 AND status NOT IN ('removed', 'failed'))
                 ORDER BY (id = ?1) DESC LIMIT 1",
                params![id_or_name],
                |row| row.get(0),
            )
            .optional()
            .map_err(Error::reg("look up workspace"))?;
        let json = json.ok_or_else(|| Error::NoWorkspace(id_or_name.to_string()))?;
        serde_json::from_str(&json).map_err(|e| {
            Error::Invalid(format!(
                "registry record of {id_or_name} is unreadable: {e}"
            ))
        })
    }

    /// Every workspace record; `all` includes removed and failed ones.
    pub fn list(&self, all: bool) -> Result<Vec<Record>> {
        let mut stmt = self
            .conn
            .prepare("SELECT record FROM workspaces ORDER BY rowid")
            .map_err(Error::reg("list workspaces"))?;
        let rows = stmt
            .query_map([], |row| row.get::<_, String>(0))
            .map_err(Error::reg("list workspaces"))?
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(Error::reg("list workspaces"))?;
        let mut out = Vec::new();
        for json in rows {
            let r: Record = serde_json::from_str(&json)
                .map_err(|e| Error::Invalid(format!("unreadable registry record: {e}")))?;
            if all || !matches!(r.status, Status::Removed | Status::Failed) {
                out.push(r);
            }
        }
        Ok(out)
    }

    /// Paths of the runtime root's workspaces directory, for sweeps.
    pub fn known_private_dirs(&self) -> Result<Vec<PathBuf>> {
        Ok(self
            .list(false)?
            .into_iter()
            .map(|r| r.private_dir)
            .collect())
    }
}
