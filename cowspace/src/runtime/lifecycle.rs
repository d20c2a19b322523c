//! Removal, sweep (the registry reconciled with the mount table), recovery after a
//! crash, and what a daemon's start means for its workspaces.

use super::*;

impl Runtime {
    /// Unmounts the workspace and deletes its private state. `Busy` while processes use
    /// it, while a long-lived sandbox runs in it, or while it holds changes since its
    /// last commit (or its base), unless `force` (which ends the processes and the
    /// sandbox and throws the changes away). A one-shot sandbox running in it (`mountctl
    /// run`) counts as a user: `force` kills it (its init, then the helper if it lingers).
    pub fn remove(&self, ws: &str, force: bool) -> Result<Record> {
        let mut rec = self.reg().get(ws)?;
        if !force && matches!(rec.status, Status::Active | Status::Stopped) {
            // Refused before any effect: what the user would lose is named.
            if rec.sandbox.is_some() && live_sandbox(&rec).is_some() {
                return Err(Error::Keeps {
                    id: rec.id.clone(),
                    what: "has a sandbox running (removing it would end its processes and \
                           services)"
                        .into(),
                    hint: format!(
                        "`mountctl sandbox stop {ws}` first, or `mountctl remove --force {ws}` \
                         stops it"
                    ),
                });
            }
            if live_sandbox(&rec).is_none() {
                self.refuse_uncommitted(&rec, ws)?;
            }
        }
        // A long-lived sandbox belongs to the workspace: removing it (`force`) stops the
        // sandbox first (a one-shot `run` in progress is a user: busy unless `force`).
        if rec.sandbox.is_some() && !matches!(rec.status, Status::Removed) {
            if live_sandbox(&rec).is_some() {
                self.sandbox_stop(&rec.id)?;
            } else {
                self.forget_sandbox(&rec)?;
            }
            rec = self.reg().get(&rec.id)?;
        }
        if matches!(rec.status, Status::Removed) {
            return Err(Error::NoWorkspace(format!("{ws} (it was removed already)")));
        }
        if let Some(pid) = live_creator(&rec) {
            let (status, op) = if rec.status == Status::Creating {
                (
                    format!("still being created by pid {pid}"),
                    "remove (remove it once its create has returned)",
                )
            } else {
                (
                    format!("being removed by pid {pid}"),
                    "remove (another remove is under way)",
                )
            };
            return Err(Error::WrongState {
                id: rec.id,
                status,
                op,
            });
        }
        let sandbox = live_sandbox(&rec);
        if let Some(helper) = sandbox
            && !force
        {
            return Err(Error::Busy {
                id: rec.id.clone(),
                pids: vec![helper],
            });
        }
        // Recorded before the sandbox is ended: its `mountctl run` then sees the workspace
        // going and does not mount the host's overlay again behind this removal.
        // No scan of every process first: the unmount itself fails with EBUSY while
        // anything uses the workspace, and only then are its users looked up.
        // This process is the remover from here on: sweep leaves the removal to it while
        // it lives, and finishes it once it is gone. A refused removal puts the creator
        // back, so it changes nothing.
        let made_by = std::mem::replace(&mut rec.creator, Creator::current());
        self.reg().set_status(&mut rec, Status::CleanupPending)?;
        if let Some(helper) = sandbox {
            kill_sandbox(helper);
            rec.sandbox_pid = None;
            rec.ports = serde_json::json!({});
        }
        self.finish_removal(&mut rec, force, made_by)?;
        Ok(rec)
    }

    pub(crate) fn finish_removal(
        &self,
        rec: &mut Record,
        force: bool,
        made_by: Option<crate::registry::Creator>,
    ) -> Result<()> {
        let mat = self.materializer_of(rec);
        if let Err(e) = mat.unmount_for_removal(&self.cx(rec), force) {
            // Still mounted: back to active, as it was, so nothing is half-removed.
            if matches!(e, Error::Busy { .. }) {
                rec.creator = made_by;
                self.reg().set_status(rec, Status::Active)?;
            }
            return Err(e);
        }
        // A resume racing this removal may have mounted it again: unmount once more.
        // EINVAL is "not a mount point" here: the unmount above showed this process may
        // unmount at this path.
        if !matches!(
            crate::mounts::unmount(&rec.path),
            Err(nix::Error::EINVAL | nix::Error::ENOENT)
        ) {
            mat.unmount(&self.cx(rec), force)?;
        }
        if !rec.path.starts_with(&rec.private_dir) {
            let _ = fs::remove_dir(&rec.path);
        }
        checkout::remove_tree(&rec.private_dir);
        if rec.private_dir.exists() {
            return Err(Error::Io {
                step: "remove private state",
                path: rec.private_dir.clone(),
                source: std::io::Error::other("still present"),
            });
        }
        self.store.unpin(&rec.id)?;
        if let Ok(snap) = rec.snapshot.parse() {
            crate::remote::unpin(&self.store, &snap, &rec.id);
        }
        self.reg().set_status(rec, Status::Removed)?;
        self.release_native(rec)
    }

    /// After the workspace `rec` went: the mount of its native lower's image goes too
    /// once no live workspace uses it ([`crate::native::release`]).
    pub(crate) fn release_native(&self, rec: &Record) -> Result<()> {
        if rec.lower_kind != LowerKind::Native {
            return Ok(());
        }
        crate::native::release(&rec.lower, || {
            let workspaces = self.reg().live_using(&rec.snapshot, LowerKind::Native)?;
            // Or a running sandbox's root (`crate::sandbox_image`).
            Ok(workspaces > 0
                || self.images_in_use()?.contains(&rec.snapshot)
                || self.image_named(&rec.snapshot)?)
        })
    }

    /// Whether the daemon serves workspace `rec` (its view lower, or the workspace
    /// itself): such a workspace stops when the daemon does.
    pub fn daemon_serves(&self, rec: &Record) -> bool {
        rec.lower_kind == LowerKind::View || self.materializer_of(rec).served_by_daemon()
    }

    /// Called by a daemon that just mounted a new snapshot view: overlays still mounted on
    /// an earlier daemon's view hold a dead FUSE connection, so they are detached and
    /// marked `stopped` (their written data is intact; `recover` mounts them again).
    ///
    /// To be called before the new view is mounted: until then no create can mount an
    /// overlay on a view, so every active one found here is on the earlier daemon's.
    /// Workspaces still `creating` are their creators' (see [`Runtime::sweep`]).
    pub fn daemon_started(&self) -> Result<Vec<String>> {
        let records = self.reg().list(false)?;
        let mut stopped = Vec::new();
        for rec in records {
            // Fuse workspaces were served by the earlier daemon itself.
            let served = self.daemon_serves(&rec);
            if rec.status != Status::Active || !served {
                continue;
            }
            if crate::mounts::is_mounted(&rec.path)? {
                crate::mounts::unmount_lazy(&rec.path)?;
            }
            let why = format!(
                "{}: the daemon serving its lower restarted; `mountctl recover {}` remounts it",
                now(),
                rec.id
            );
            if self.set_status_if(&rec, Status::Active, Status::Stopped, why)? {
                stopped.push(rec.id);
            }
        }
        Ok(stopped)
    }

    /// Moves `rec` from `from` to `to` (adding `why` to its diagnostics) in one registry
    /// transaction, unless another process changed its status since it was read: `false`
    /// then, and the record is left as that process made it.
    pub(crate) fn set_status_if(
        &self,
        rec: &Record,
        from: Status,
        to: Status,
        why: String,
    ) -> Result<bool> {
        self.reg().modify(&rec.id, |r| {
            if r.status != from {
                return Ok(false);
            }
            r.diagnostics.push(why);
            r.status = to;
            if matches!(to, Status::Stopped | Status::Removed) {
                r.stopped_at = Some(now());
            }
            Ok(true)
        })
    }

    /// Reconciles the registry with the mount table and the disk. A workspace still
    /// `creating` is finished off (as `failed`) only when its creator is gone
    /// ([`live_creator`]); a live creator is left to finish it.
    ///
    /// Creates and removes run concurrently, so the order of the reads matters: a create
    /// records its workspace before it makes anything, hence records are read before the
    /// mount table (an `active` record's mount was made before the table was read) and
    /// the disk before the live records (a directory seen on disk has its record by then).
    /// Each change of status is made only if no other process changed it since.
    pub fn sweep(&self) -> Result<SweepReport> {
        let mut report = SweepReport::default();
        // Bind first: a registry guard held by the loop would deadlock the updates below.
        let records = self.reg().list(false)?;
        let mounts = crate::mounts::mounts()?;
        let mounted = |p: &Path| mounts.iter().any(|m| m.target == p);
        for rec in records {
            if rec.sandbox.is_some() && live_sandbox(&rec).is_none() {
                // Its host mount is the workspace's own again afterwards: the mount table
                // read above predates that, so this record's checks end here.
                // Reaped after the host's own overlay is back: the helper finds the
                // upper layer (and the dead sandbox's work directory beside it) from it.
                match self.forget_sandbox(&rec) {
                    Ok(()) => report.sandboxes_cleared.push(rec.id.clone()),
                    Err(e) => {
                        tracing::warn!(workspace = %rec.id, "clearing its dead sandbox: {e}")
                    }
                }
                self.reap_dead_sandboxes(&rec.path);
                continue;
            }
            match rec.status {
                Status::Creating if live_creator(&rec).is_some() => {
                    report.creating.push(rec.id.clone());
                }
                Status::CleanupPending if live_creator(&rec).is_some() => {
                    report.removing.push(rec.id.clone());
                }
                Status::Creating | Status::CleanupPending => {
                    let st = if rec.status == Status::Creating {
                        Status::Failed
                    } else {
                        Status::Removed
                    };
                    // Claimed first (the creator is gone, so only another sweep or a
                    // remove can move it meanwhile), then the effects, then recorded.
                    let claimed = self.reg().modify(&rec.id, |r| {
                        Ok(r.status == rec.status && live_creator(r).is_none())
                    })?;
                    if !claimed {
                        continue;
                    }
                    let _ = crate::mounts::unmount_lazy(&rec.path);
                    if !rec.path.starts_with(&rec.private_dir) {
                        let _ = fs::remove_dir(&rec.path);
                    }
                    checkout::remove_tree(&rec.private_dir);
                    let _ = self.store.unpin(&rec.id);
                    let why = "an interrupted create or remove was finished by sweep".to_string();
                    if self.set_status_if(&rec, rec.status, st, why)? {
                        report.finished.push(rec.id.clone());
                    }
                }
                Status::Active => {
                    // A fuse workspace is its own lower: its mount answers or is dead.
                    let lower_ok = lower_alive(&rec.lower)
                        && (!self.materializer_of(&rec).served_by_daemon()
                            || lower_alive(&rec.path));
                    if !mounted(&rec.path) || !lower_ok {
                        if mounted(&rec.path) {
                            let _ = crate::mounts::unmount_lazy(&rec.path);
                        }
                        let why = format!(
                            "sweep at {}: {}; its written data is kept, `mountctl recover {}` remounts it",
                            now(),
                            if lower_ok {
                                "the mount vanished"
                            } else {
                                "its lower layer is gone (daemon stopped?)"
                            },
                            rec.id
                        );
                        if self.set_status_if(&rec, Status::Active, Status::Stopped, why)? {
                            report.stopped.push(rec.id.clone());
                        }
                    }
                }
                _ => {}
            }
        }
        // Leftovers: overlay mounts and directories under workspaces/ no live record owns.
        let ws_dir = self.store.layout().workspaces();
        let on_disk: Vec<PathBuf> = fs::read_dir(&ws_dir)
            .map(|rd| rd.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        let live: std::collections::HashSet<PathBuf> = self
            .reg()
            .list(false)?
            .into_iter()
            .map(|r| r.private_dir)
            .collect();
        // A mount under workspaces/ belongs to the private directory `workspaces/<id>` it
        // is in (one set lookup per mount: sweeps with a thousand workspaces alive).
        let owner = |t: &Path| -> Option<PathBuf> {
            let rest = t.strip_prefix(&ws_dir).ok()?;
            rest.components().next().map(|c| ws_dir.join(c.as_os_str()))
        };
        for m in &mounts {
            if owner(&m.target).is_some_and(|d| !live.contains(&d)) {
                let _ = crate::mounts::unmount_lazy(&m.target);
                report
                    .leftovers_removed
                    .push(m.target.display().to_string());
            }
        }
        for p in on_disk {
            if !live.contains(&p) {
                let _ = crate::mounts::unmount_lazy(&p.join("mnt"));
                checkout::remove_tree(&p);
                report.leftovers_removed.push(p.display().to_string());
            }
        }
        // The snapshot views of a daemon that is gone (killed).
        for v in crate::daemon::detach_dead_views(&self.store.layout().root) {
            report.leftovers_removed.push(v.display().to_string());
        }
        // Metadata mounts of images no ref names any more (`crate::image::held`).
        for s in self.release_unheld_images()? {
            report
                .leftovers_removed
                .push(format!("image {s} (metadata mount)"));
        }
        Ok(report)
    }

    /// Mounts a stopped workspace again with everything that had been written.
    pub fn recover(&self, ws: &str) -> Result<Record> {
        self.recover_report(ws).map(|(rec, _)| rec)
    }

    /// [`Runtime::recover`], and whether it did anything: `false` for a workspace that
    /// was active, mounted and its lower alive (nothing to recover).
    pub fn recover_report(&self, ws: &str) -> Result<(Record, bool)> {
        let mut rec = self.reg().get(ws)?;
        let mat = self.materializer_of(&rec);
        if rec.status == Status::Active
            && mat.is_mounted(&self.cx(&rec))?
            && lower_alive(&rec.lower)
        {
            return Ok((rec, false));
        }
        if !matches!(rec.status, Status::Active | Status::Stopped) {
            return Err(Error::WrongState {
                id: rec.id,
                status: rec.status.as_str().into(),
                op: "recover",
            });
        }
        if mat.is_mounted(&self.cx(&rec))? {
            crate::mounts::unmount_lazy(&rec.path)?;
        }
        let snapshot: SnapshotId = rec.snapshot.parse()?;
        if rec.lower_kind == LowerKind::View {
            crate::daemon::ensure_running(self.store.root())?;
        }
        let _shared = if rec.lower_kind == LowerKind::Native {
            Some(crate::native::ensure(&self.store, &snapshot)?)
        } else {
            if rec.lower_kind != LowerKind::View && rec.lower_kind != materializer::fuse::LOWER_KIND
            {
                checkout::ensure_checkout(&self.store, &snapshot)?;
            }
            None
        };
        // Overlay needs an empty work directory after an unclean stop.
        let work = rec.work_dir();
        let quota = crate::quota::DiskQuota::of(&rec.policies);
        crate::quota::with_headroom(&rec.private_dir, quota.as_ref(), || {
            checkout::remove_tree(&work);
            mat.mount(&self.cx(&rec))
        })?;
        rec.diagnostics.push(format!("recovered at {}", now()));
        self.reg().set_status(&mut rec, Status::Active)?;
        Ok((rec, true))
    }
}

/// The pid of the process still creating or removing `rec`: its status is `creating` or
/// `cleanup_pending` and its recorded creator (the remover, once `cleanup_pending`)
/// runs (the same process, not a later one given its pid). A record without a creator
/// (written by an older build) has none.
pub fn live_creator(rec: &Record) -> Option<i32> {
    let c = rec.creator.as_ref()?;
    (matches!(rec.status, Status::Creating | Status::CleanupPending) && c.is_alive())
        .then_some(c.pid)
}
