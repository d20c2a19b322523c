//! Import: making a snapshot from a directory, a git revision or a tar archive.

pub(crate) mod builder;
pub mod dir;
pub mod exclude;
pub mod git;
pub mod gitdir;
pub mod gitindex;
// Git's object readers are the crate's leaves (the ingest workers read with them too).
pub(crate) use crate::{gitloose, gitpack};
mod gitplan;
mod prefetch;
mod refresh;
pub mod tar;

use std::sync::Arc;
use std::time::Instant;

use rusqlite::Transaction;
use serde::Serialize;

use crate::error::Result;
use crate::id::SnapshotId;
use crate::index::ObjectKind;
use crate::ingest::{FileContent, Ingest};
use crate::refs::{self, Expect};
use crate::snapshot::{Counts, Policy, SNAPSHOT_VERSION, Snapshot, Source, now_secs};
use crate::store::Store;

use builder::Builder;

/// Progress of a long import, for progress bars.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    pub files_done: u64,
    pub files_total: u64,
    pub bytes_done: u64,
}

/// A progress callback.
pub type ProgressFn = Arc<dyn Fn(Progress) + Send + Sync>;

/// What a workspace will serve for the file `entry` at `path` (`/`-joined from the
/// root): used to make an imported `.git/index` agree with it (see [`gitindex`]).
pub type ServedIdentityFn =
    Arc<dyn Fn(&[u8], &crate::tree::Entry) -> gitindex::ServedStat + Send + Sync>;

/// How to import.
#[derive(Clone, Default)]
pub struct ImportOptions {
    /// Move this ref to the new snapshot (compare-and-swap from its value at the start;
    /// the ref's snapshot becomes the new snapshot's parent).
    pub ref_name: Option<String>,
    pub message: String,
    /// Apply the default exclusions of heavy regenerable artifacts.
    pub default_excludes: bool,
    /// Extra exclusion patterns.
    pub excludes: Vec<String>,
    /// Accept character and block device nodes (refused by default).
    pub allow_devices: bool,
    /// Accept tar symlinks whose target is absolute or climbs out of the root
    /// (refused by default: extracting the snapshot would point outside it).
    pub allow_external_symlinks: bool,
    pub progress: Option<ProgressFn>,
    /// When set, a directory import of a git checkout rewrites the stat data of the
    /// `.git/index` entries git trusted on the source to what workspaces will serve.
    pub served_identity: Option<ServedIdentityFn>,
    /// With `served_identity`: the command git runs as its fsmonitor hook in workspaces
    /// of the snapshot (`core.fsmonitor`). The import then also gives the `.git/index` an
    /// fsmonitor extension marking the entries it rewrote as valid, and adds the hook to
    /// `.git/config`, so git asks cowspace what changed instead of looking at every file
    /// (docs/git.md). Left alone when the repository configures an fsmonitor itself.
    pub git_fsmonitor: Option<String>,
}

impl std::fmt::Debug for ImportOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImportOptions")
            .field("ref_name", &self.ref_name)
            .field("message", &self.message)
            .field("default_excludes", &self.default_excludes)
            .field("excludes", &self.excludes)
            .field("allow_devices", &self.allow_devices)
            .field("allow_external_symlinks", &self.allow_external_symlinks)
            .finish()
    }
}

impl ImportOptions {
    /// Defaults as on the command line: default exclusions on.
    pub fn new() -> ImportOptions {
        ImportOptions {
            default_excludes: true,
            ..Default::default()
        }
    }
}

/// What an import did.
#[derive(Debug, Clone, Serialize)]
pub struct ImportReport {
    pub snapshot: SnapshotId,
    pub root: crate::id::TreeId,
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub bytes: u64,
    pub excluded: u64,
    /// Files whose contents were read (the rest came from the stat cache).
    pub files_read: u64,
    pub objects_written: u64,
    pub new_bytes_stored: u64,
    pub new_bytes_raw: u64,
    #[serde(rename = "ref", skip_serializing_if = "Option::is_none")]
    pub ref_name: Option<String>,
    pub parents: Vec<SnapshotId>,
    pub elapsed_ms: f64,
    /// Things left out with a reason (sockets, submodules).
    pub warnings: Vec<String>,
    /// A commit that found nothing changed ([`crate::Editor::unless_same_as`]): no
    /// snapshot was made and `snapshot` is the one it would have repeated.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub unchanged: bool,
    /// The holder (a workspace) the snapshot was pinned for in the same transaction
    /// ([`crate::Editor::pin_for`]): gc keeps it while that pin lasts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pinned_by: Option<String>,
    /// Chunks an interrupted import had stored that this one took over (not
    /// compressed again; see [`crate::adopt`]). Absent when none.
    #[serde(skip_serializing_if = "crate::adopt::Adopted::is_none")]
    pub resumed: crate::adopt::Adopted,
    /// Whether any entry of the snapshot (or its root) has an extended attribute, when
    /// the import saw every entry (it wrote every tree); `None` when not known.
    #[serde(skip)]
    pub has_xattrs: Option<bool>,
}

/// What a session wrote and read, for its report.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wrote {
    pub files_read: u64,
    pub objects_written: u64,
    pub new_bytes_stored: u64,
    pub new_bytes_raw: u64,
    pub started: Instant,
}

impl Wrote {
    /// What `pending` (the session's synced packs, about to be committed) holds.
    pub fn of(pending: &crate::writer::Pending, files_read: u64, started: Instant) -> Wrote {
        Wrote {
            files_read,
            objects_written: pending.rows.len() as u64,
            new_bytes_stored: pending.stored_bytes(),
            new_bytes_raw: pending.rows.iter().map(|r| u64::from(r.loc.raw_len)).sum(),
            started,
        }
    }
}

impl ImportReport {
    /// The report of a session that made (or kept) `snap` as `snapshot`, moving
    /// `ref_name`; no warnings, pin or resumed chunks.
    pub(crate) fn new(
        snapshot: SnapshotId,
        snap: Snapshot,
        ref_name: Option<String>,
        wrote: Wrote,
    ) -> ImportReport {
        ImportReport {
            snapshot,
            root: snap.root,
            files: snap.counts.files,
            dirs: snap.counts.dirs,
            symlinks: snap.counts.symlinks,
            bytes: snap.counts.bytes,
            excluded: snap.counts.excluded,
            files_read: wrote.files_read,
            objects_written: wrote.objects_written,
            new_bytes_stored: wrote.new_bytes_stored,
            new_bytes_raw: wrote.new_bytes_raw,
            ref_name,
            parents: snap.parents,
            elapsed_ms: wrote.started.elapsed().as_secs_f64() * 1e3,
            warnings: vec![],
            unchanged: false,
            pinned_by: None,
            resumed: Default::default(),
            has_xattrs: None,
        }
    }
}

/// The shared tail of every import: trees, snapshot object, one commit.
pub(crate) struct Finish<'a> {
    pub builder: Builder,
    pub slots: Vec<Option<FileContent>>,
    pub source: Source,
    pub policy: Policy,
    pub excluded: u64,
    pub files_read: u64,
    pub warnings: Vec<String>,
    pub started: Instant,
    pub opts: &'a ImportOptions,
    /// The fsmonitor token given to the tree's `.git/index`, if any.
    pub git_fsmonitor: Option<String>,
    /// What this import took over from interrupted ones.
    pub resumed: crate::adopt::Adopted,
}

impl Finish<'_> {
    pub fn run(
        self,
        store: &Store,
        mut ingest: Ingest<'_>,
        extra: impl FnOnce(&Transaction<'_>) -> Result<()>,
    ) -> Result<ImportReport> {
        let (root, root_mode, mut counts, has_xattrs) =
            self.builder.write(&mut ingest, &self.slots)?;
        counts.excluded = self.excluded;
        let parent = match &self.opts.ref_name {
            Some(name) => store.get_ref(name)?,
            None => None,
        };
        let snap = Snapshot {
            version: SNAPSHOT_VERSION,
            root,
            root_mode,
            parents: parent.into_iter().collect(),
            created_at: now_secs(),
            message: self.opts.message.clone(),
            source: self.source,
            policy: self.policy,
            counts,
            git_fsmonitor: self.git_fsmonitor,
            root_xattrs: self.builder.root_xattrs().to_vec(),
        };
        let (id, bytes) = snap.encode_with_id()?;
        ingest.put_owned(ObjectKind::Snapshot, *id.as_bytes(), bytes)?;
        let pending = ingest.finish()?;
        let wrote = Wrote::of(&pending, self.files_read, self.started);
        let ref_name = self.opts.ref_name.clone();
        // On failure the session's packs stay as orphans (no committed row names them):
        // removing them here could race an ambiguous commit; gc removes them safely.
        store.commit(pending, |tx| {
            if let Some(name) = &ref_name {
                let expect = parent.map(Expect::At).unwrap_or(Expect::Absent);
                refs::compare_and_swap(tx, name, expect, &id)?;
            }
            extra(tx)
        })?;
        Ok(ImportReport {
            warnings: self.warnings,
            resumed: self.resumed,
            has_xattrs: Some(has_xattrs),
            ..ImportReport::new(id, snap, ref_name, wrote)
        })
    }
}

/// Counts of a snapshot, re-exported for reports.
pub type SnapshotCounts = Counts;
