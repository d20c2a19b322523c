//! Workspaces from a developer's git checkout, clean or dirty, under a dirty-state
//! policy:
//!
//! - `refuse` (default): a checkout with uncommitted changes (modified, staged, deleted
//!   or untracked non-ignored files) is refused, and the changes are listed.
//! - `patch`: the clean HEAD commit is imported (no working tree is read) with the
//!   checkout's repository as `.git` (its index included and made to agree with what
//!   workspaces serve, so the workspace is a git work tree with the checkout's branch
//!   and staged changes), and the uncommitted diff of tracked files (`git diff --binary
//!   HEAD`) is applied in the new workspace; the patch is kept as an artifact in the
//!   workspace's private directory and its BLAKE3 recorded. Untracked files are not part
//!   of a patch (they are listed in the record's diagnostics).
//! - `snapshot`: the working tree is imported as it is (with `.git`, untracked files, and
//!   ignored files under the exclusion policy: heavy regenerable artifacts stay out).
//!
//! The workspace's evidence (`Record.policies`) records the commit id, the policy, and the
//! patch's digest or the snapshot's id.

use std::path::{Path, PathBuf};
use std::process::Command;

use cowspace_store::ImportOptions;
use cowspace_store::import::gitdir;
use serde_json::json;

use crate::error::{Error, Result};
use crate::registry::Record;
use crate::runtime::{CreateOptions, Runtime};

/// Uncommitted changes listed in a refusal, at most.
pub const MAX_LISTED_CHANGES: usize = 20;

/// The dirty-state policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dirty {
    Refuse,
    Patch,
    Snapshot,
}

impl Dirty {
    pub fn parse(s: &str) -> Result<Dirty> {
        match s {
            "refuse" => Ok(Dirty::Refuse),
            "patch" => Ok(Dirty::Patch),
            "snapshot" => Ok(Dirty::Snapshot),
            other => Err(Error::Invalid(format!(
                "--dirty {other:?}: choose refuse, patch or snapshot"
            ))),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Dirty::Refuse => "refuse",
            Dirty::Patch => "patch",
            Dirty::Snapshot => "snapshot",
        }
    }
}

fn git(dir: &Path, args: &[&str]) -> Result<Vec<u8>> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "core.quotepath=off", "--no-pager"])
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("LC_ALL", "C")
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .env_remove("GIT_INDEX_FILE")
        .output()
        .map_err(|e| Error::Invalid(format!("cannot run git: {e} (install git)")))?;
    if !out.status.success() {
        return Err(Error::Invalid(format!(
            "{} is not a usable git checkout: git {}: {}",
            dir.display(),
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(out.stdout)
}

/// The uncommitted changes of a checkout, as `git status --porcelain` lines.
pub fn uncommitted(dir: &Path) -> Result<Vec<String>> {
    let out = git(
        dir,
        &["status", "--porcelain=v1", "-z", "--untracked-files=normal"],
    )?;
    Ok(out
        .split(|&b| b == 0)
        .filter(|l| l.len() > 3)
        .map(|l| String::from_utf8_lossy(l).into_owned())
        .collect())
}

impl Runtime {
    /// Creates a workspace of the git checkout `dir` under the dirty-state policy.
    /// `o.snapshot` is ignored (the snapshot is made from the checkout).
    pub fn create_from_git(&self, dir: &Path, policy: Dirty, o: &CreateOptions) -> Result<Record> {
        let top = PathBuf::from(
            String::from_utf8_lossy(&git(dir, &["rev-parse", "--show-toplevel"])?)
                .trim()
                .to_string(),
        );
        let commit =
            String::from_utf8_lossy(&git(&top, &["rev-parse", "--verify", "HEAD^{commit}"])?)
                .trim()
                .to_string();
        let changes = uncommitted(&top)?;
        let store = self.store();
        let mut evidence = json!({
            "from_git": top.display().to_string(),
            "commit": commit,
            "dirty": policy.as_str(),
            "uncommitted": changes.len(),
        });
        let mut patch: Option<Vec<u8>> = None;
        let snapshot = match policy {
            Dirty::Refuse => {
                if !changes.is_empty() {
                    let mut list: Vec<String> =
                        changes.iter().take(MAX_LISTED_CHANGES).cloned().collect();
                    if changes.len() > MAX_LISTED_CHANGES {
                        list.push(format!(
                            "... and {} more",
                            changes.len() - MAX_LISTED_CHANGES
                        ));
                    }
                    return Err(Error::Invalid(format!(
                        "{} has {} uncommitted changes (--dirty refuse): {}; pass --dirty patch or --dirty snapshot",
                        top.display(),
                        changes.len(),
                        list.join(", ")
                    )));
                }
                let mut opts = ImportOptions::new();
                opts.message = format!("clean checkout of {commit}");
                opts.served_identity = Some(crate::served::served_identity(store.root())?);
                opts.git_fsmonitor = crate::gitfsmonitor::git_reads_the_extension()
                    .ok()
                    .map(|()| crate::gitfsmonitor::hook_command());
                store.import_dir(&top, &opts)?.snapshot
            }
            Dirty::Snapshot => {
                let mut opts = ImportOptions::new();
                opts.message = format!("working tree of {} at {commit}", top.display());
                opts.served_identity = Some(crate::served::served_identity(store.root())?);
                opts.git_fsmonitor = crate::gitfsmonitor::git_reads_the_extension()
                    .ok()
                    .map(|()| crate::gitfsmonitor::hook_command());
                let id = store.import_dir(&top, &opts)?.snapshot;
                evidence["snapshot_of_working_tree"] = json!(id);
                id
            }
            Dirty::Patch => {
                let diff = git(
                    &top,
                    &["diff", "--binary", "--no-color", "--no-ext-diff", "HEAD"],
                )?;
                evidence["patch_blake3"] = json!(blake3::hash(&diff).to_hex().to_string());
                evidence["patch_bytes"] = json!(diff.len());
                let untracked: Vec<&String> =
                    changes.iter().filter(|c| c.starts_with("??")).collect();
                evidence["untracked_not_in_patch"] = json!(untracked.len());
                patch = Some(diff);
                let mut opts = ImportOptions::new();
                opts.message = format!("HEAD {commit} of {}", top.display());
                let head = store.import_git(&top, &commit, &opts)?.snapshot;
                // A git work tree: the checkout's repository (with its index) as `.git`.
                match gitdir::repository_of(&top)? {
                    Some(repo) => {
                        let mut opts = ImportOptions::new();
                        opts.message =
                            format!("HEAD {commit} of {} with its repository", top.display());
                        opts.served_identity = Some(crate::served::served_identity(store.root())?);
                        opts.git_fsmonitor = crate::gitfsmonitor::git_reads_the_extension()
                            .ok()
                            .map(|()| crate::gitfsmonitor::hook_command());
                        store.with_repository(&head, &top, &repo, &opts)?.snapshot
                    }
                    None => head,
                }
            }
        };
        let rec = self.create(&CreateOptions {
            snapshot: snapshot.to_hex(),
            ..o.clone()
        })?;
        if let Some(diff) = patch {
            let artifact = rec.private_dir.join("dirty.patch");
            let applied = (|| -> Result<()> {
                std::fs::write(&artifact, &diff).map_err(Error::io("write", &artifact))?;
                if diff.is_empty() {
                    return Ok(());
                }
                let out = Command::new("git")
                    .current_dir(&rec.path)
                    .args(["apply", "--binary", "--whitespace=nowarn"])
                    .arg(&artifact)
                    .env("GIT_CONFIG_NOSYSTEM", "1")
                    .env(
                        "GIT_CEILING_DIRECTORIES",
                        rec.path.parent().unwrap_or(&rec.path),
                    )
                    .output()
                    .map_err(|e| Error::Invalid(format!("cannot run git apply: {e}")))?;
                if !out.status.success() {
                    return Err(Error::Invalid(format!(
                        "the uncommitted diff does not apply to HEAD: {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    )));
                }
                Ok(())
            })();
            if let Err(e) = applied {
                let _ = self.remove(&rec.id, true);
                return Err(e);
            }
            evidence["patch_artifact"] = json!(artifact);
        }
        self.record_evidence(&rec.id, evidence)
    }
}
