//! What changed in a workspace, in git's terms: the paths the fsmonitor hook
//! ([`crate::gitfsmonitor`]) names for a workspace's changes and the tokens it vouches
//! for, and the `.git/index` a capture keeps ([`capture_index`]). Below the runtime:
//! a commit asks it, the hook (which finds runtimes) answers with it.

use cowspace_store::import::gitindex::FSMONITOR_TOKEN_PREFIX;
use cowspace_store::{Kind, Snapshot, SnapshotId, Store, TreeId};

use crate::error::Result;
use crate::registry::Record;
use crate::upper::{BaseTrees, UpperChange};

/// The base snapshot of `rec` and the tokens this hook vouches for in it: its own
/// (`cowspace:1:<base>`) first, then the one recorded in the base snapshot, if any.
pub(crate) fn vouched_tokens(store: &Store, rec: &Record) -> Result<(Snapshot, Vec<String>)> {
    let base: SnapshotId = rec.snapshot.parse()?;
    let snap = store.snapshot(&base)?;
    let mut tokens = vec![format!("{FSMONITOR_TOKEN_PREFIX}{}", rec.snapshot)];
    tokens.extend(snap.git_fsmonitor.clone());
    Ok((snap, tokens))
}

/// [`paths_of`] `changes`, the base's entries looked up in the store (`root`).
pub(crate) fn named_paths(
    store: &Store,
    root: TreeId,
    changes: &[UpperChange],
) -> Result<Vec<Vec<u8>>> {
    let mut base = BaseTrees::new(store, root);
    paths_of(changes, |p| {
        Ok(base.entry(p)?.is_some_and(|e| e.kind != Kind::Dir))
    })
}

/// For a commit of the overlay or fuse workspace `rec`: the `.git/index` the capture
/// should hold instead of the one git left in the upper layer, and its new token, so git
/// in workspaces of the capture asks them what changed too.
///
/// Only when git wrote that index under a token this hook vouches for in `rec` (its
/// valid entries were right then, and everything changed since is in the upper layer).
/// Then an entry stays valid unless the index marked it dirty or the hook would name it
/// now (git's rules: a name, or everything under a directory); every other entry gets
/// the time 0 ([`cowspace_store::import::gitindex::Rewritten::unracy_unverified`]). The token is new, so it can
/// only be the capture's.
pub fn capture_index(store: &Store, rec: &Record) -> Result<Option<CapturedIndex>> {
    use cowspace_store::import::gitindex;
    use std::os::unix::fs::MetadataExt;
    let upper = rec.upper_dir();
    let index_path = upper.join(".git/index");
    let mode = match std::fs::symlink_metadata(&index_path) {
        Ok(m) if m.is_file() && m.nlink() == 1 => m.mode() & 0o7777,
        _ => return Ok(None),
    };
    let bytes = std::fs::read(&index_path).map_err(crate::error::Error::io("read", &index_path))?;
    let Some((token, dirty)) = gitindex::read_fsmonitor(&bytes) else {
        return Ok(None);
    };
    let (snap, tokens) = vouched_tokens(store, rec)?;
    if !tokens.contains(&token) {
        return Ok(None);
    }
    let named = named_paths(store, snap.root, &crate::upper::changes(&upper)?)?;
    // git takes a name that is no entry as a directory: everything under it.
    let mut exact = std::collections::HashSet::new();
    let mut cones = std::collections::HashSet::new();
    for p in &named {
        match p.strip_suffix(b"/") {
            Some(dir) => {
                cones.insert(dir.to_vec());
            }
            None => {
                exact.insert(p.clone());
                cones.insert(p.clone());
            }
        }
    }
    let under_a_cone = |path: &[u8]| {
        path.iter()
            .enumerate()
            .any(|(i, &b)| b == b'/' && cones.contains(&path[..i]))
    };
    let Some(mut r) = gitindex::rewrite_numbered(&bytes, |i, path, e| {
        let valid = !dirty[i] && !exact.contains(path) && !under_a_cone(path);
        valid.then_some(*e)
    }) else {
        return Ok(None);
    };
    r.unracy_unverified();
    let token = gitindex::new_fsmonitor_token("capture", rec.id.as_bytes());
    Ok(gitindex::with_fsmonitor(&r, &token).map(|bytes| CapturedIndex { bytes, mode, token }))
}

/// What [`capture_index`] gives.
#[derive(Debug)]
pub struct CapturedIndex {
    pub bytes: Vec<u8>,
    /// The permission bits git gave the index.
    pub mode: u32,
    pub token: String,
}

fn under_git_dir(path: &[u8]) -> bool {
    path == b".git" || path.starts_with(b".git/")
}

/// The paths git must look at for `changes`: every changed entry by name (git takes a
/// name it does not track as a directory and looks at everything under it); a
/// directory that hides the base's (opaque) as `dir/` too; a directory that is not
/// opaque only where the base had something else there, since naming it would make
/// git look at everything under it.
pub(crate) fn paths_of(
    changes: &[UpperChange],
    mut base_has_non_dir: impl FnMut(&[u8]) -> Result<bool>,
) -> Result<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    for c in changes {
        match c {
            UpperChange::Whiteout { path }
            | UpperChange::File { path, .. }
            | UpperChange::Symlink { path, .. }
            | UpperChange::Special { path, .. } => {
                if !under_git_dir(path) {
                    out.push(path.clone());
                }
            }
            // A directory renamed from the base: everything under it is new at its path.
            UpperChange::Redirect { path, .. } => {
                if !under_git_dir(path) {
                    out.push(path.clone());
                    let mut cone = path.clone();
                    cone.push(b'/');
                    out.push(cone);
                }
            }
            UpperChange::Dir { path, opaque, .. } => {
                if under_git_dir(path) {
                    continue;
                }
                if *opaque {
                    out.push(path.clone());
                    let mut cone = path.clone();
                    cone.push(b'/');
                    out.push(cone);
                } else if base_has_non_dir(path)? {
                    out.push(path.clone());
                }
            }
        }
    }
    Ok(out)
}
