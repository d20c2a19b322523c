//! What a workspace holds that a snapshot does not: `diff WS SNAP` (the workspace against
//! any snapshot, its last commit say), and what changed since the last commit, which
//! `status` counts and `remove` refuses to throw away without `--force`.
//!
//! Both cost what changed. The workspace's changes against its base (read from its
//! private state, as `diff WS` reads them) are merged with the store's diff of the base
//! and the other snapshot (a Merkle diff: what differs between the two trees): a path in
//! neither list is the base's on both sides.
//!
//! `remove` first compares a fingerprint: at `commit`, the identity (inode, size, times,
//! mode) in the private state of each changed path the commit takes is recorded as one
//! digest in the workspace's record ([`Record::committed_fingerprint`]); the same digest
//! at `remove` means nothing changed since, with no content read. Any other digest (or
//! none: never committed, or a write within the clock tick of the commit) is settled by
//! the merged diff against the last commit, contents compared.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;

use cowspace_store::diff::Change;
use cowspace_store::{Entry, Kind};

use super::*;
use crate::materializer::ChangesLiveIn;
use crate::upper::UpperChange;

/// What changed in a workspace since its last commit (or since its base, never
/// committed): `status` shows it, `remove` refuses while `paths` is not 0.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Uncommitted {
    /// The snapshot compared with: the workspace's last commit, else its base.
    pub since: String,
    /// Whether `since` is a commit of the workspace (else its base).
    pub committed: bool,
    /// How many paths differ from `since` (what `diff WS SINCE` lists).
    pub paths: usize,
}

impl Runtime {
    /// The changes from snapshot or ref `snap` to what workspace `ws` shows now (`diff WS
    /// SNAP`); with `snap` the workspace's base, [`Runtime::diff_with`]. Paths the base's
    /// exclusion policy leaves out are left out on both sides unless `include_excluded`.
    pub fn diff_against(
        &self,
        ws: &str,
        snap: &str,
        include_excluded: bool,
    ) -> Result<Vec<(DiffEntry, Option<PathBuf>)>> {
        let rec = self.usable(ws, "diff")?;
        let target = self.store.resolve(snap)?;
        self.diff_rec_against(&rec, &target, include_excluded)
    }

    fn diff_rec_against(
        &self,
        rec: &Record,
        target: &SnapshotId,
        include_excluded: bool,
    ) -> Result<Vec<(DiffEntry, Option<PathBuf>)>> {
        let base: SnapshotId = rec.snapshot.parse()?;
        let ours = self.diff_with(&rec.id, include_excluded)?;
        if *target == base {
            return Ok(ours);
        }
        let theirs = self.store.diff_snapshots(&base, target)?;
        let mut merged = merge(ours, theirs);
        if let Some(mut filter) = self.change_filter(&base, include_excluded)? {
            let mut failed = None;
            merged.retain(|(c, _)| {
                let dir = c.new_kind == Some(Kind::Dir) || c.old_kind == Some(Kind::Dir);
                match filter.left_out(&self.store, &c.raw_path, dir) {
                    Ok(out) => !out,
                    Err(e) => {
                        failed.get_or_insert(e);
                        true
                    }
                }
            });
            if let Some(e) = failed {
                return Err(e.into());
            }
        }
        Ok(merged)
    }

    /// What changed in workspace `ws` since its last commit (or its base).
    pub fn uncommitted(&self, ws: &str) -> Result<Uncommitted> {
        let rec = self.usable(ws, "status")?;
        self.uncommitted_of(&rec)
    }

    pub(crate) fn uncommitted_of(&self, rec: &Record) -> Result<Uncommitted> {
        let (since, committed) = match rec.commits.last() {
            Some(c) => (c.clone(), true),
            None => (rec.snapshot.clone(), false),
        };
        let none = Uncommitted {
            since: since.clone(),
            committed,
            paths: 0,
        };
        // The cheap answers first: nothing in the private state at all, or exactly
        // what it held at the last commit.
        if let Some(fp) = self.fingerprint(rec)? {
            if fp.changes == 0 && !committed {
                return Ok(none);
            }
            if committed && rec.committed_fingerprint.as_deref() == fp.digest.as_deref() {
                return Ok(none);
            }
        }
        let target: SnapshotId = since.parse()?;
        let paths = self.diff_rec_against(rec, &target, false)?.len();
        Ok(Uncommitted { paths, ..none })
    }

    /// The digest of the identity of every change of `rec` that a commit takes (its
    /// paths as its materializer lists them, each one's `lstat` in the private state),
    /// and how many there are. `None` for a materializer whose changes are not files
    /// of the private state; `digest` is `None` when a change is as new as the clock
    /// (a write in the same tick could leave every field equal).
    pub(crate) fn fingerprint(&self, rec: &Record) -> Result<Option<Fingerprint>> {
        let mat = self.materializer_of(rec);
        let dir = match mat.changes_live_in() {
            ChangesLiveIn::Upper => rec.upper_dir(),
            ChangesLiveIn::FullTree => materializer::fulltree::tree_dir(rec),
            ChangesLiveIn::Own => return Ok(None),
        };
        if !dir.exists() {
            return Ok(None);
        }
        let changes = mat.changes(&self.cx(rec))?;
        let base: SnapshotId = rec.snapshot.parse()?;
        let mut filter = self.change_filter(&base, false)?;
        let mut h = blake3::Hasher::new();
        let mut count = 0usize;
        let mut newest_ns = i64::MIN;
        for c in &changes {
            let (path, tag): (&[u8], u8) = match c {
                UpperChange::Whiteout { path } => (path, 0),
                UpperChange::Dir { path, .. } => (path, 1),
                UpperChange::File { path, .. } => (path, 2),
                UpperChange::Symlink { path, .. } => (path, 3),
                UpperChange::Redirect { path, origin } => {
                    h.update(&(origin.len() as u64).to_le_bytes());
                    h.update(origin);
                    (path, 4)
                }
                UpperChange::Special { path, .. } => (path, 5),
            };
            // A deletion is always taken; a new path the policy leaves out never is.
            if matches!(tag, 1..=3 | 5)
                && let Some(f) = filter.as_mut()
                && f.left_out(&self.store, path, tag == 1)?
            {
                continue;
            }
            count += 1;
            h.update(&[tag]);
            h.update(&(path.len() as u64).to_le_bytes());
            h.update(path);
            let host = if path.is_empty() {
                dir.clone()
            } else {
                dir.join(OsStr::from_bytes(path))
            };
            match fs::symlink_metadata(&host) {
                Ok(m) => {
                    let mtime_ns = m.mtime() * 1_000_000_000 + m.mtime_nsec();
                    let ctime_ns = m.ctime() * 1_000_000_000 + m.ctime_nsec();
                    newest_ns = newest_ns.max(mtime_ns).max(ctime_ns);
                    for v in [m.ino(), m.size(), mtime_ns as u64, ctime_ns as u64] {
                        h.update(&v.to_le_bytes());
                    }
                    h.update(&m.mode().to_le_bytes());
                }
                Err(_) => {
                    h.update(&[0xff]);
                }
            }
        }
        let digest = (newest_ns < clock_ns(&rec.private_dir)?)
            .then(|| hex::encode(&h.finalize().as_bytes()[..16]));
        Ok(Some(Fingerprint {
            digest,
            changes: count,
        }))
    }

    /// `remove` without `--force`: refused while the workspace holds changes its last
    /// commit (or its base) does not.
    pub(crate) fn refuse_uncommitted(&self, rec: &Record, ws: &str) -> Result<()> {
        let u = self.uncommitted_of(rec)?;
        if u.paths == 0 {
            return Ok(());
        }
        let paths = if u.paths == 1 {
            "path differs"
        } else {
            "paths differ"
        };
        let what = if u.committed {
            format!(
                "has uncommitted changes: {} {paths} from its last commit {}",
                u.paths,
                &u.since[..12]
            )
        } else {
            format!(
                "has uncommitted changes: {} {paths} from its base {} (never committed)",
                u.paths,
                &u.since[..12]
            )
        };
        Err(Error::Keeps {
            id: rec.id.clone(),
            what,
            hint: format!(
                "`mountctl diff {ws} {}` lists them; `mountctl commit {ws}` keeps them, \
                 `mountctl remove --force {ws}` throws them away",
                &u.since[..12]
            ),
        })
    }
}

/// A digest of a workspace's changes ([`Runtime::fingerprint`]).
pub(crate) struct Fingerprint {
    pub digest: Option<String>,
    pub changes: usize,
}

/// The filesystem's clock at `dir` now: the mtime of a file made there (the times a
/// write gets are this clock's, which ticks coarser than the system's). A workspace at
/// its disk quota ([`crate::quota`]) has no room for the file: its parent, on the same
/// filesystem and outside the quota, is asked then.
fn clock_ns(dir: &Path) -> Result<i64> {
    let probe = |dir: &Path| {
        let probe = dir.join(format!(".clock.{}", crate::tmpname::unique("tmp")));
        let made = fs::File::create(&probe)
            .and_then(|f| f.metadata())
            .map_err(Error::io("create (to read the clock)", &probe));
        let _ = fs::remove_file(&probe);
        made
    };
    let m = match (probe(dir), dir.parent()) {
        (Err(Error::Io { source, .. }), Some(parent))
            if matches!(source.raw_os_error(), Some(libc::EDQUOT | libc::ENOSPC)) =>
        {
            probe(parent)?
        }
        (made, _) => made?,
    };
    Ok(m.mtime() * 1_000_000_000 + m.mtime_nsec())
}

/// The changes from snapshot T to a workspace W, from W's changes against their common
/// base B (`ours`, with the host path of new contents) and T's (`theirs`): at each path
/// either list names, W shows `ours`'s new entry if it names the path, else B's; T shows
/// `theirs`'s, else B's.
fn merge(
    ours: Vec<(DiffEntry, Option<PathBuf>)>,
    theirs: Vec<DiffEntry>,
) -> Vec<(DiffEntry, Option<PathBuf>)> {
    let mut at: BTreeMap<Vec<u8>, Sides> = BTreeMap::new();
    for (d, host) in ours {
        let slot = at.entry(d.raw_path.clone()).or_default();
        slot.ours = Some((d.new, host));
        slot.base = d.old;
    }
    for d in theirs {
        let slot = at.entry(d.raw_path.clone()).or_default();
        slot.theirs = Some(d.new);
        if slot.ours.is_none() {
            slot.base = d.old;
        }
    }
    let mut out = Vec::new();
    for (path, Sides { ours, theirs, base }) in at {
        let (w, host) = match ours {
            Some((e, h)) => (e, h),
            None => (base.clone(), None),
        };
        let t = match theirs {
            Some(e) => e,
            None => base,
        };
        let change = match (&t, &w) {
            (None, None) => continue,
            (None, Some(_)) => Change::Added,
            (Some(_), None) => Change::Deleted,
            (Some(a), Some(b)) if family(a.kind) != family(b.kind) => Change::TypeChanged,
            (Some(a), Some(b)) if same(a, b) => continue,
            (Some(_), Some(_)) => Change::Modified,
        };
        out.push((
            DiffEntry {
                path: String::from_utf8_lossy(&path).into_owned(),
                change,
                old_kind: t.as_ref().map(|e| e.kind),
                new_kind: w.as_ref().map(|e| e.kind),
                raw_path: path,
                old: t,
                new: w,
            },
            host,
        ));
    }
    out
}

/// One path of [`merge`]: the workspace's new entry with its host path, T's new entry,
/// and the base's entry, as far as the two lists name them.
#[derive(Default)]
struct Sides {
    ours: Option<(Option<Entry>, Option<PathBuf>)>,
    theirs: Option<Option<Entry>>,
    base: Option<Entry>,
}

fn family(k: Kind) -> Kind {
    if k == Kind::Hardlink { Kind::File } else { k }
}

/// Whether two entries of the same kind hold the same thing. A directory's children are
/// compared at their own paths; a hard link's primary path is not its content.
fn same(a: &Entry, b: &Entry) -> bool {
    a.mode == b.mode
        && a.xattrs == b.xattrs
        && match family(a.kind) {
            Kind::Dir => true,
            Kind::File => a.size == b.size && a.hash == b.hash,
            _ => a.data == b.data,
        }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, content: &[u8]) -> Entry {
        Entry {
            name: name.as_bytes().to_vec(),
            kind: Kind::File,
            mode: 0o644,
            size: content.len() as u64,
            hash: *blake3::hash(content).as_bytes(),
            data: vec![],
            xattrs: vec![],
        }
    }

    fn d(path: &str, change: Change, old: Option<Entry>, new: Option<Entry>) -> DiffEntry {
        DiffEntry {
            path: path.into(),
            change,
            old_kind: old.as_ref().map(|e| e.kind),
            new_kind: new.as_ref().map(|e| e.kind),
            raw_path: path.as_bytes().to_vec(),
            old,
            new,
        }
    }

    fn listed(v: &[(DiffEntry, Option<PathBuf>)]) -> Vec<String> {
        v.iter()
            .map(|(c, _)| format!("{} {}", c.change.letter(), c.path))
            .collect()
    }

    #[test]
    fn a_workspace_against_its_commit_lists_only_what_changed_since() {
        let (b, c, w) = (file("a", b"base"), file("a", b"commit"), file("a", b"more"));
        // Base -> commit changed a and added n; base -> workspace: a (again), n, x.
        let theirs = vec![
            d("a", Change::Modified, Some(b.clone()), Some(c.clone())),
            d("n", Change::Added, None, Some(file("n", b"new"))),
            d("gone", Change::Deleted, Some(file("gone", b"g")), None),
        ];
        let ours = vec![
            (
                d("a", Change::Modified, Some(b.clone()), Some(c.clone())),
                None,
            ),
            (d("n", Change::Added, None, Some(file("n", b"new"))), None),
            (
                d("gone", Change::Deleted, Some(file("gone", b"g")), None),
                None,
            ),
        ];
        assert!(
            merge(ours.clone(), theirs.clone()).is_empty(),
            "as committed"
        );
        let mut more = ours;
        more[0].0.new = Some(w);
        more.push((d("x", Change::Added, None, Some(file("x", b"x"))), None));
        assert_eq!(listed(&merge(more, theirs.clone())), ["M a", "A x"]);
        // Back to the base for every path: the commit's changes come out reversed.
        assert_eq!(listed(&merge(vec![], theirs)), ["M a", "A gone", "D n"]);
    }
}
