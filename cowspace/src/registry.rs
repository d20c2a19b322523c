//! The registry: one SQLite record per workspace and its lifecycle, under the runtime root
//! (`registry.db`). Every state change is committed before the action it announces, so a
//! crash between the two leaves a record that `sweep` can see and repair.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
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
    pub materializer: crate::kinds::MaterializerKind,
    /// What the workspace is made from (see [`crate::kinds::LowerKind`]).
    pub lower_kind: crate::kinds::LowerKind,
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
    /// The long-lived sandbox of this workspace while it runs (`sandbox start`): its
    /// status at start (provider, isolation, limits, ports, init pid, uid base,
    /// `host_mount`). `None` for a one-shot `run` and when no sandbox runs.
    #[serde(default)]
    pub sandbox: Option<serde_json::Value>,
    /// An overlay workspace whose overlay keeps its metadata in `trusted.overlay.*` with
    /// `redirect_dir=on` (renamed directories as redirect records; made by this
    /// version); `false` for records of earlier versions (`userxattr`, no redirects).
    #[serde(default)]
    pub overlay_redirects: bool,
    /// The process that made the workspace, or, once it is `cleanup_pending`, the one
    /// removing it. While the status is `creating` or `cleanup_pending`, sweep (and a
    /// daemon starting) leave the workspace to it as long as it lives
    /// ([`Creator::is_alive`]); records of older builds have none and count as
    /// interrupted.
    #[serde(default)]
    pub creator: Option<Creator>,
    /// What the workspace's changes looked like when it was last committed: a digest of
    /// each changed path's identity in its private state (path, kind of change, inode,
    /// size, times, mode), so `remove` tells "nothing since the last commit" without
    /// reading contents (`runtime::changes`). `None`: never committed, or a digest that
    /// could not be trusted (a change within the clock tick of the commit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub committed_fingerprint: Option<String>,
    /// The workspace this one was forked from (`mountctl fork`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// Its disk use and quota (a workspace made with `--disk`), read from the kernel's
    /// counters when `status` or `list` answers; never stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<crate::quota::DiskUse>,
}

impl Record {
    /// The workspace's upper layer in overlay's format (overlay and fuse workspaces).
    pub fn upper_dir(&self) -> PathBuf {
        self.private_dir.join("upper")
    }

    /// Overlay's work directory beside the upper layer.
    pub fn work_dir(&self) -> PathBuf {
        self.private_dir.join("work")
    }

    /// What `create` answers, the same on the CLI (`--json`) and the control socket: the
    /// record, and `elapsed_ms`, the time the create took (the record keeps it as
    /// `create_ms`). Also, until the release after next, `workspace` (= `id`) and `ms`
    /// (= `elapsed_ms`), the keys the CLI used to give.
    pub fn created_json(&self) -> serde_json::Value {
        let mut v = serde_json::json!(self);
        v["elapsed_ms"] = self.create_ms.into();
        v["workspace"] = self.id.clone().into();
        v["ms"] = self.create_ms.into();
        v
    }

    /// What `remove` answers, the same on the CLI and the socket: the final record
    /// (`status: "removed"`), `removed: true` and `elapsed_ms`; also, until the release
    /// after next, `workspace` (= `id`) and `ms` (= `elapsed_ms`).
    pub fn removed_json(&self, elapsed_ms: f64) -> serde_json::Value {
        let mut v = serde_json::json!(self);
        v["removed"] = true.into();
        v["elapsed_ms"] = elapsed_ms.into();
        v["workspace"] = self.id.clone().into();
        v["ms"] = elapsed_ms.into();
        v
    }
}

/// A process, told apart from a later one that reuses its pid: the pid, when it started
/// (clock ticks after boot, `/proc/PID/stat` field 22) and the boot it ran in.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Creator {
    pub pid: i32,
    pub start_ticks: u64,
    pub boot_id: String,
}

use crate::procfs::boot_id;
pub use crate::procfs::{ProcStat, parse_stat as parse_proc_stat};

impl Creator {
    /// The calling process. Read from `/proc` once per process (the daemon asks at every
    /// create and removal); a forked child, with a pid of its own, reads again.
    pub fn current() -> Option<Creator> {
        static CURRENT: Mutex<Option<Creator>> = Mutex::new(None);
        let pid = std::process::id() as i32;
        let mut known = CURRENT.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = known.as_ref().filter(|c| c.pid == pid) {
            return Some(c.clone());
        }
        let c = Creator {
            pid,
            start_ticks: crate::procfs::own_stat()?.start_ticks,
            boot_id: boot_id()?,
        };
        *known = Some(c.clone());
        Some(c)
    }

    /// Whether this process still runs: the liveness rule applied to what `/proc` shows
    /// now.
    pub fn is_alive(&self) -> bool {
        self.alive_as(boot_id().as_deref(), crate::procfs::stat(self.pid))
    }

    /// The liveness rule: alive only in the same boot, with a process of that pid that
    /// started at the same tick and has not exited (a zombie has: it waits only to be
    /// reaped). A pid reused by a later process started later, so it does not count.
    pub fn alive_as(&self, boot_id: Option<&str>, stat: Option<ProcStat>) -> bool {
        match (boot_id, stat) {
            (Some(boot), Some(st)) => {
                boot == self.boot_id
                    && st.start_ticks == self.start_ticks
                    && !matches!(st.state, 'Z' | 'X')
            }
            _ => false,
        }
    }
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
/// A record as the registry stores it: JSON (a failure is a value SQLite cannot be given).
fn encode(r: &Record) -> Result<String> {
    serde_json::to_string(r).map_err(|e| {
        Error::reg("encode workspace record")(rusqlite::Error::ToSqlConversionFailure(Box::new(e)))
    })
}

pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

impl Registry {
    /// Opens (creating if needed) the registry of a runtime root.
    pub fn open(root: &Path) -> Result<Registry> {
        let path = cowspace_store::layout::Layout::new(root).registry();
        if !path.exists() {
            Registry::create(root, &path)?;
        }
        let conn = Registry::connect(&path)?;
        // A registry of an older build may not be in WAL mode yet.
        cowspace_store::index::enable_wal(&conn).map_err(Error::reg("enable WAL"))?;
        conn.execute_batch(SCHEMA)
            .map_err(Error::reg("create schema"))?;
        Ok(Registry { conn })
    }

    /// A connection that waits for other writers (set before any statement runs).
    fn connect(path: &Path) -> Result<Connection> {
        let conn = Connection::open(path).map_err(Error::reg("open"))?;
        conn.busy_timeout(Duration::from_millis(REGISTRY_BUSY_TIMEOUT_MS))
            .map_err(Error::reg("set busy timeout"))?;
        // NORMAL in WAL mode: a committed state change survives a crash of any process
        // (what the registry must survive: its mounts die with the machine anyway), and
        // creating a workspace does not wait for a disk flush.
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(Error::reg("set synchronous"))?;
        Ok(conn)
    }

    /// Makes a new registry whole (WAL mode, schema) under a name of this process and
    /// links it into place, so every process that opens `path` finds it in WAL mode: the
    /// first ones to open a fresh root at once never race to switch the journal mode. The
    /// loser of two creators keeps the winner's.
    fn create(root: &Path, path: &Path) -> Result<()> {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = root.join(format!("registry.db.new-{}-{n}", std::process::id()));
        let sides =
            |p: &Path| ["-wal", "-shm"].map(|s| PathBuf::from(format!("{}{s}", p.display())));
        let remove_tmp = || {
            let _ = std::fs::remove_file(&tmp);
            for side in sides(&tmp) {
                let _ = std::fs::remove_file(side);
            }
        };
        remove_tmp();
        let made = (|| -> Result<()> {
            let conn = Registry::connect(&tmp)?;
            cowspace_store::index::enable_wal(&conn).map_err(Error::reg("enable WAL"))?;
            conn.execute_batch(SCHEMA)
                .map_err(Error::reg("create schema"))?;
            conn.close()
                .map_err(|(_, e)| Error::reg("close new registry")(e))?;
            // Closing the only connection checkpointed and deleted the WAL file.
            if let Some(side) = sides(&tmp).into_iter().find(|p| p.exists()) {
                return Err(Error::Io {
                    step: "close new registry",
                    path: side,
                    source: std::io::Error::other("still present after the last connection closed"),
                });
            }
            match std::fs::hard_link(&tmp, path) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
                Err(e) => Err(Error::io("create", path)(e)),
            }
        })();
        remove_tmp();
        made
    }

    /// Records a new workspace (status `creating`). A live workspace of the same name is
    /// refused.
    pub fn insert(&self, r: &Record) -> Result<()> {
        let json = encode(r)?;
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
        let json = encode(r)?;
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
        let json = encode(&r)?;
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

    /// How many live workspaces (neither removed nor failed) are of `snapshot` on the
    /// lower kind `lower_kind`.
    pub fn live_using(&self, snapshot: &str, lower_kind: crate::kinds::LowerKind) -> Result<u64> {
        self.conn
            .query_row(
                "SELECT COUNT(*) FROM workspaces WHERE status NOT IN ('removed', 'failed')
                 AND json_extract(record, '$.snapshot') = ?1
                 AND json_extract(record, '$.lower_kind') = ?2",
                rusqlite::params![snapshot, lower_kind.as_str()],
                |row| row.get::<_, i64>(0),
            )
            .map(|n| n as u64)
            .map_err(Error::reg("count workspaces of a snapshot"))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Threads opening the registry of `root` at once.
    const OPENERS: usize = 16;

    fn open_all_at_once(root: &Path) {
        let barrier = std::sync::Barrier::new(OPENERS);
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..OPENERS)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        Registry::open(root).map(|_| ())
                    })
                })
                .collect();
            for h in handles {
                h.join().expect("an opener panicked").expect("open");
            }
        });
        let reg = Registry::open(root).unwrap();
        let mode: String = reg
            .conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        let names: Vec<String> = std::fs::read_dir(root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".new-"))
            .collect();
        assert!(names.is_empty(), "temporary registries left: {names:?}");
    }

    #[test]
    fn a_fresh_registry_opened_by_many_at_once_opens_for_all() {
        // Rounds, each on a new root: one round seldom shows a race.
        for _ in 0..10 {
            let t = tempfile::tempdir().unwrap();
            open_all_at_once(t.path());
        }
    }

    #[test]
    fn an_older_registry_not_in_wal_mode_opened_by_many_at_once_opens_for_all() {
        let t = tempfile::tempdir().unwrap();
        let conn = Connection::open(t.path().join("registry.db")).unwrap();
        conn.execute_batch(SCHEMA).unwrap();
        let mode: String = conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "delete");
        drop(conn);
        open_all_at_once(t.path());
    }

    fn stat_line(comm: &str, state: char, start: u64) -> String {
        // Fields 3..=21, then the start time (22), then the rest.
        let middle = "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18";
        format!("4242 ({comm}) {state} {middle} {start} 25 26\n")
    }

    #[test]
    fn proc_stat_is_parsed_after_the_last_parenthesis_of_the_name() {
        for comm in ["mountctl", "a (b) c", ") ) x", ""] {
            assert_eq!(
                parse_proc_stat(&stat_line(comm, 'S', 98765)),
                Some(ProcStat {
                    state: 'S',
                    flags: 6,
                    start_ticks: 98765
                }),
                "{comm:?}"
            );
        }
        assert_eq!(parse_proc_stat("4242 (x) S 1 2"), None);
        assert_eq!(parse_proc_stat(""), None);
    }

    #[test]
    fn a_creator_lives_only_as_the_same_process_in_the_same_boot() {
        let c = Creator {
            pid: 4242,
            start_ticks: 1000,
            boot_id: "boot-a".into(),
        };
        let st = |state, start_ticks| {
            Some(ProcStat {
                state,
                flags: 0,
                start_ticks,
            })
        };
        assert!(c.alive_as(Some("boot-a"), st('S', 1000)));
        assert!(c.alive_as(Some("boot-a"), st('R', 1000)));
        assert!(c.alive_as(Some("boot-a"), st('D', 1000)));
        // Exited (not yet reaped), gone, its pid reused, another boot, unknown boot.
        assert!(!c.alive_as(Some("boot-a"), st('Z', 1000)));
        assert!(!c.alive_as(Some("boot-a"), None));
        assert!(!c.alive_as(Some("boot-a"), st('S', 1001)));
        assert!(!c.alive_as(Some("boot-b"), st('S', 1000)));
        assert!(!c.alive_as(None, st('S', 1000)));
    }

    #[test]
    fn the_current_process_is_alive_and_a_reaped_child_is_not() {
        let me = Creator::current().expect("/proc readable");
        assert_eq!(me.pid, std::process::id() as i32);
        assert!(me.is_alive());
        let reused = Creator {
            start_ticks: me.start_ticks + 1,
            ..me.clone()
        };
        assert!(!reused.is_alive());
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let child_creator = Creator {
            pid: child.id() as i32,
            ..me
        };
        child.wait().unwrap();
        assert!(!child_creator.is_alive());
    }

    #[test]
    fn records_without_a_creator_still_read() {
        let json = r#"{"id":"ws-1","name":null,"worker":null,"snapshot":"00","materializer":"overlay",
            "lower_kind":"checkout","lower":"/l","path":"/p","private_dir":"/d","status":"creating",
            "created_at":1,"updated_at":1,"stopped_at":null,"policies":{},"diagnostics":[],
            "ports":{},"commits":[],"create_ms":0.0}"#;
        let r: Record = serde_json::from_str(json).unwrap();
        assert_eq!(r.creator, None);
        assert_eq!(r.sandbox_pid, None);
    }
}
