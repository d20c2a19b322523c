//! A checkout's `.git/index` made to agree with what workspaces serve: the entries git
//! trusted on the source get the stat data a workspace will show for them, so the first
//! `git status` in a workspace reads no file (see [`crate::import::gitindex`]).

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::import::gitindex;

/// The git files of the tree's `.git`: where its index is read from, and its config's
/// text as the snapshot holds it.
pub(crate) struct GitFiles {
    pub index: PathBuf,
    pub config: String,
}

/// A checkout's index made to agree with what workspaces serve ([`refreshed_index`]).
pub(crate) struct RefreshedIndex {
    /// The new `.git/index`.
    pub index: Vec<u8>,
    /// The new `.git/config` text, when the fsmonitor hook was added to it.
    pub config: Option<String>,
    /// The fsmonitor token the index carries, if any.
    pub token: Option<String>,
}

/// The checkout's index (at `git.index`) with the entries git trusted on the source (the
/// work tree `src`) carrying the stat data workspaces will serve for the snapshot's entry
/// at their path (`entry_at`, in the form [`crate::import::gitindex::served_entry`] and
/// `served_symlink` make); with a `hook`, also an fsmonitor extension marking them
/// valid, and `.git/config` (`git.config`, a plain file of the tree when
/// `config_in_tree`) naming the hook. `None` when nothing is to be rewritten: no
/// readable index, a SHA-256 repository, or no entry trusted.
pub(crate) fn refreshed_index(
    src: &Path,
    git: &GitFiles,
    config_in_tree: bool,
    served: &crate::import::ServedIdentityFn,
    hook: Option<&str>,
    entry_at: impl Fn(&[Vec<u8>]) -> Option<crate::tree::Entry>,
) -> Option<RefreshedIndex> {
    let config = &git.config;
    if config.contains("sha256") {
        return None; // SHA-256 repositories keep their index as it is.
    }
    let bytes = fs::read(&git.index).ok()?;
    let meta = fs::symlink_metadata(&git.index).ok()?;
    let index_mtime = (meta.mtime() as u32, meta.mtime_nsec() as u32);
    let mut trusted = 0u64;
    let rewritten = gitindex::rewrite_marking(&bytes, |path, e| {
        if !gitindex::trusted_on_source(
            &src.join(std::ffi::OsStr::from_bytes(path)),
            e,
            index_mtime,
        ) {
            return None;
        }
        let comps: Vec<Vec<u8>> = path.split(|&b| b == b'/').map(|c| c.to_vec()).collect();
        let entry = entry_at(&comps)?;
        let s = served(path, &entry);
        trusted += 1;
        Some(gitindex::EntryStat {
            ctime_s: s.ctime_s,
            ctime_ns: 0,
            mtime_s: s.mtime_s,
            mtime_ns: 0,
            dev: 0,
            ino: s.ino as u32,
            mode: e.mode,
            uid: s.uid,
            gid: s.gid,
            size: e.size,
        })
    });
    let mut rewritten = rewritten?;
    if trusted == 0 {
        return None;
    }
    rewritten.unracy_unverified();
    // The fsmonitor hook, unless the repository has its own (or its config is not a
    // plain file of the tree).
    let hooked = match hook {
        Some(cmd) if !config.to_ascii_lowercase().contains("fsmonitor") && config_in_tree => {
            let token = gitindex::new_fsmonitor_token("import", src.as_os_str().as_bytes());
            gitindex::with_fsmonitor(&rewritten, &token).map(|index| (cmd, token, index))
        }
        _ => None,
    };
    let r = match hooked {
        Some((cmd, token, index)) => {
            let mut text = config.clone();
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&gitindex::fsmonitor_config(cmd));
            RefreshedIndex {
                index,
                config: Some(text),
                token: Some(token),
            }
        }
        None => RefreshedIndex {
            index: rewritten.bytes,
            config: None,
            token: None,
        },
    };
    tracing::debug!(
        entries = trusted,
        fsmonitor = r.token.is_some(),
        "rewrote .git/index stat data for workspaces"
    );
    Some(r)
}
