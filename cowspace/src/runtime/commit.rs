//! Diff, patch and commit of a workspace.

use super::*;

impl Runtime {
    /// The workspace's changes against its base, read from its private state only.
    pub fn diff(&self, ws: &str) -> Result<Vec<(DiffEntry, Option<PathBuf>)>> {
        self.diff_with(ws, false)
    }

    /// [`Runtime::diff`]; with `include_excluded`, also the new paths the base's recorded
    /// exclusion policy leaves out (a commit leaves them out too, unless told the same).
    pub fn diff_with(
        &self,
        ws: &str,
        include_excluded: bool,
    ) -> Result<Vec<(DiffEntry, Option<PathBuf>)>> {
        let rec = self.usable(ws, "diff")?;
        let base: SnapshotId = rec.snapshot.parse()?;
        let mut changes = self.materializer_of(&rec).diff(&self.cx(&rec))?;
        if let Some(mut filter) = self.change_filter(&base, include_excluded)? {
            let mut failed = None;
            changes.retain(|(c, _)| {
                let dir = c.new_kind == Some(cowspace_store::Kind::Dir);
                match filter.left_out(&self.store, &c.raw_path, dir) {
                    Ok(out) => !out || c.change == cowspace_store::diff::Change::Deleted,
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
        Ok(changes)
    }

    /// The base's recorded exclusion policy as a filter of changes, unless
    /// `include_excluded` (or the policy leaves nothing out).
    pub(crate) fn change_filter(
        &self,
        base: &SnapshotId,
        include_excluded: bool,
    ) -> Result<Option<cowspace_store::import::exclude::ChangeFilter>> {
        if include_excluded {
            return Ok(None);
        }
        let snap = self.store.snapshot(base)?;
        Ok(cowspace_store::import::exclude::ChangeFilter::new(
            &snap.policy,
            snap.root,
        )?)
    }

    /// A unified patch of the workspace's changes.
    pub fn patch(&self, ws: &str) -> Result<String> {
        let changes = self.diff(ws)?;
        upper::patch(&self.store, &changes)
    }

    /// Captures the workspace as a new snapshot (parent: its previous capture, else its
    /// base), optionally moving a ref by compare-and-swap. The workspace stays usable.
    pub fn commit(&self, ws: &str, o: &CommitOptions) -> Result<ImportReport> {
        let rec = self.usable(ws, "commit")?;
        let base: SnapshotId = rec.snapshot.parse()?;
        let previous: SnapshotId = match rec.commits.last() {
            Some(p) => p.parse()?,
            None => base,
        };
        let expect = match (&o.ref_name, &o.expect) {
            (Some(_), Some(e)) => Some(Expect::At(self.store.resolve(e)?)),
            (Some(name), None) => Some(match self.store.get_ref(name)? {
                Some(_) => Expect::At(previous),
                None => Expect::Absent,
            }),
            (None, _) => None,
        };
        let kind = rec.materializer;
        let mat = self.materializers.get(kind);
        let mut ed = self.store.edit(&base)?;
        if let Some(filter) = self.change_filter(&base, o.include_excluded)? {
            ed.exclude_by(filter);
        }
        ed.set_parents(vec![previous]);
        // Pinned with the commit: gc keeps it while the workspace lives.
        ed.pin_for(&rec.id);
        if !o.allow_empty {
            ed.unless_same_as(previous);
        }
        // Read before the capture: a write racing it then makes the digest differ from
        // the workspace's later, never match a state the commit did not take.
        let fingerprint = self.fingerprint(&rec)?.and_then(|f| f.digest);
        mat.capture(&self.cx(&rec), &mut ed)?;
        // git's index, carried on with a token the capture's workspaces vouch for
        // (docs/git.md); read from a file of the private directory, gone after.
        let index_copy = rec.private_dir.join("capture-git-index");
        let _ = fs::remove_file(&index_copy);
        if mat.upper_dir(&rec).is_some()
            && let Some(index) = crate::gitindex::capture_index(&self.store, &rec)
                .unwrap_or_else(|e| {
                    tracing::warn!(workspace = %rec.id, "git's index is captured as git left it: {e}");
                    None
                })
        {
            fs::write(&index_copy, &index.bytes).map_err(Error::io("write", &index_copy))?;
            ed.put_file(b".git/index", index_copy.clone(), index.mode, vec![], None)?;
            ed.set_git_fsmonitor(Some(index.token));
        }
        let report = ed.commit(
            &o.message,
            Source::Workspace { id: rec.id.clone() },
            o.ref_name.as_deref().zip(expect),
        );
        let _ = fs::remove_file(&index_copy);
        let report = report?;
        let id = rec.id.clone();
        let snapshot = report.snapshot.to_hex();
        let unchanged = report.unchanged;
        // One transaction: a sandbox recorded meanwhile is kept.
        self.reg().modify(&id, |r| {
            if !unchanged {
                r.commits.push(snapshot);
                r.updated_at = now();
            }
            // An unchanged commit found the workspace as its last commit holds it.
            if !unchanged || r.commits.last() == Some(&previous.to_hex()) {
                r.committed_fingerprint = fingerprint;
            }
            Ok(())
        })?;
        Ok(report)
    }
}

/// What `commit` answers, the same on the CLI (`--json`) and the control socket: the
/// import report and `retention` (whether a ref holds the snapshot, the workspace that
/// pins it, and how long an unreferenced one outlives that workspace).
pub fn commit_json(r: &ImportReport) -> serde_json::Value {
    let referenced = r.ref_name.is_some();
    let mut v = serde_json::json!(r);
    v["retention"] = serde_json::json!({
        "referenced": referenced,
        "pinned_by": r.pinned_by,
        "grace_secs_after_removal": (!referenced).then_some(cowspace_store::gc::DEFAULT_GC_GRACE_SECS),
    });
    v
}
