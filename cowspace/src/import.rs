//! Imports as a runtime makes them: a directory, a tar archive or a git revision becomes a
//! snapshot whose git checkout agrees with what workspaces serve (so the first `git status`
//! in a new workspace reads no file) and asks the workspace what changed (git's
//! fsmonitor hook, docs/git.md).

use std::path::Path;

use cowspace_store::{ImportOptions, ImportReport, Store, StoreConfig};

use crate::error::Result;

/// What to import, and how.
pub struct ImportRequest<'a> {
    /// A directory, a tar archive, or (with `git_rev`) a git repository.
    pub source: &'a Path,
    /// Import this revision of the repository at `source` instead of a tree on disk.
    pub git_rev: Option<&'a str>,
    /// The store's import options (ref, message, excludes, progress, ...); the served
    /// identity and the fsmonitor hook are set here.
    pub options: ImportOptions,
    /// The store's settings for this import (compression level, workers).
    pub config: StoreConfig,
    /// Give git checkouts the fsmonitor hook.
    pub git_fsmonitor: bool,
}

/// What an import made, and what the caller should tell its user.
pub struct Imported {
    pub report: ImportReport,
    /// Notes and warnings, one line each (`note: …`, `warning: …`).
    pub notes: Vec<String>,
}

/// Imports into the runtime root `root` (see the module docs).
pub fn import(root: &Path, req: ImportRequest<'_>) -> Result<Imported> {
    let store = Store::open(root, req.config)?;
    let mut opts = req.options;
    let mut notes = Vec::new();
    opts.served_identity = Some(crate::served::served_identity(root)?);
    // The hook matters only to workspaces of a checkout (a directory holding `.git`):
    // of a git revision, a tar or another directory, nothing is said about it.
    let checkout = req.git_rev.is_none() && req.source.join(".git").exists();
    if req.git_fsmonitor {
        match crate::gitfsmonitor::git_reads_the_extension() {
            Ok(()) => {
                opts.git_fsmonitor = Some(crate::gitfsmonitor::hook_command());
                if checkout && crate::gitfsmonitor::hook_program().is_none() {
                    notes.push(format!(
                        "note: git's fsmonitor hook runs the `mountctl` on PATH (or ${}), and \
                         none is found here: until one is, git in workspaces looks at every \
                         file (docs/git.md)",
                        crate::gitfsmonitor::MOUNTCTL_ENV
                    ));
                }
            }
            Err(why) if checkout => notes.push(format!(
                "note: git in workspaces will look at every file ({why}; docs/git.md)"
            )),
            Err(_) => {}
        }
    }
    let report = if let Some(rev) = req.git_rev {
        store.import_git(req.source, rev, &opts)
    } else if req.source.is_file() && cowspace_store::import::tar::has_tar_name(req.source) {
        // Any other file is refused by the directory import, which says what names a
        // tar archive needs (a README parsed as a tar gives a garbled error).
        store.import_tar(req.source, &opts)
    } else {
        store.import_dir(req.source, &opts)
    }?;
    // Whether the snapshot has any xattr is recorded now, while its trees are fresh, so
    // its first workspace does not walk them to pick its view. A failure only leaves
    // that walk to the first workspace.
    match report.has_xattrs {
        // (The import wrote every tree: no walk of them is needed.)
        Some(has) => crate::plain::record_import(&store, &report.snapshot, has),
        None => {
            let _ = crate::plain::has_xattrs(&store, &report.snapshot);
        }
    }
    notes.extend(report.warnings.iter().map(|w| format!("warning: {w}")));
    Ok(Imported { report, notes })
}
