//! The hook's answers: the workspace a query comes from (found through the runtimes)
//! and what changed in it since the token git gave.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use cowspace_store::import::gitindex::FSMONITOR_TOKEN_PREFIX;

use super::setup::{
    SANDBOX_TOKENS_ENV, SANDBOX_TRUSTED_ENV, SANDBOX_UPPER_ENV, SANDBOX_WORKTREE_ENV,
};
use crate::error::Result;
use crate::gitindex::{named_paths, paths_of, vouched_tokens};
use crate::registry::{Record, Status};
use crate::runtime::Runtime;
use crate::upper::UpperChange;

/// What the hook tells git.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The token git keeps for the next query.
    pub token: String,
    /// The paths that may have changed (`dir/` for a whole directory), or `None` for
    /// "everything may have changed".
    pub paths: Option<Vec<Vec<u8>>>,
}

impl Answer {
    /// The hook's output: the token, then the paths, each ending in a NUL.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = self.token.as_bytes().to_vec();
        out.push(0);
        match &self.paths {
            None => out.extend_from_slice(b"/\0"),
            Some(paths) => {
                for p in paths {
                    out.extend_from_slice(p);
                    out.push(0);
                }
            }
        }
        out
    }
}

/// Answers git's query with `token`, asked in the work tree `cwd`. `roots` are runtime
/// roots to look in besides those the workspace's own paths name.
pub fn answer(cwd: &Path, token: &str, roots: &[PathBuf]) -> Answer {
    match find_workspace(cwd, roots) {
        Some((rt, rec)) => match answer_for(&rt, &rec, token) {
            Ok(a) => a,
            Err(e) => {
                tracing::debug!(error = %e, "git-fsmonitor: answering everything");
                everything(Some(&rec))
            }
        },
        None => everything(None),
    }
}

fn everything(rec: Option<&Record>) -> Answer {
    Answer {
        token: match rec {
            Some(r) => format!("{FSMONITOR_TOKEN_PREFIX}{}", r.snapshot),
            None => format!("{FSMONITOR_TOKEN_PREFIX}unknown"),
        },
        paths: None,
    }
}

fn answer_for(rt: &Runtime, rec: &Record, token: &str) -> Result<Answer> {
    let (snap, tokens) = vouched_tokens(rt.store(), rec)?;
    if !tokens.iter().any(|t| t == token) {
        return Ok(everything(Some(rec)));
    }
    let changes = rt
        .materializers()
        .get(rec.materializer)
        .changes(&crate::materializer::WorkspaceCtx::new(rt.store(), rec))?;
    Ok(Answer {
        token: token.to_string(),
        paths: Some(named_paths(rt.store(), snap.root, &changes)?),
    })
}

/// The answer inside a sandbox, where the registry and the store are out of sight and
/// `mountctl run` said (in the environment) where the overlay workspace's upper layer
/// is and which tokens describe its base. `None` outside one.
pub fn answer_in_sandbox(cwd: &Path, token: &str) -> Option<Answer> {
    let upper = std::env::var_os(SANDBOX_UPPER_ENV)?;
    let tokens = std::env::var(SANDBOX_TOKENS_ENV).ok()?;
    let worktree = std::env::var_os(SANDBOX_WORKTREE_ENV)?;
    let accepted: Vec<&str> = tokens.split_whitespace().collect();
    let own = accepted.first().map_or_else(
        || format!("{FSMONITOR_TOKEN_PREFIX}unknown"),
        |t| t.to_string(),
    );
    let here = std::fs::canonicalize(cwd).ok() == std::fs::canonicalize(&worktree).ok();
    let everything = Answer {
        token: own,
        paths: None,
    };
    if !here || !accepted.contains(&token) {
        return Some(everything);
    }
    // In overlay's upper format a directory made where the base had a file or symlink
    // is always opaque (overlayfs marks it; so does the fuse workspace, `cow/ops.rs`), so
    // no other directory needs naming.
    // Inside, `trusted.overlay.*` (opaque directories, redirects of renamed ones) cannot
    // be read: every directory of the upper layer is then named as a whole, as if it hid
    // or replaced the base's.
    let unreadable = std::env::var_os(SANDBOX_TRUSTED_ENV).is_some();
    let listed = crate::upper::changes(Path::new(&upper)).and_then(|mut changes| {
        if unreadable {
            for c in &mut changes {
                if let UpperChange::Dir { path, opaque, .. } = c
                    && !path.is_empty()
                {
                    *opaque = true;
                }
            }
        }
        paths_of(&changes, |_| Ok(false))
    });
    Some(match listed {
        Ok(paths) => Answer {
            token: token.to_string(),
            paths: Some(paths),
        },
        Err(e) => {
            tracing::debug!(error = %e, "git-fsmonitor: answering everything");
            everything
        }
    })
}

/// The live workspace whose path is `cwd`, looked up in the runtime root its path or
/// its overlay mount names (by id), then in `roots` (by path).
fn find_workspace(cwd: &Path, roots: &[PathBuf]) -> Option<(Runtime, Record)> {
    let cwd = std::fs::canonicalize(cwd).ok()?;
    // (root, workspace id) from a path <root>/workspaces/<id>/<leaf>.
    let named = |p: &Path| -> Option<(PathBuf, Option<String>)> {
        let id = p.parent()?;
        let root = id.parent()?.parent()?;
        Some((
            root.to_path_buf(),
            Some(id.file_name()?.to_str()?.to_string()),
        ))
    };
    let mut candidates: Vec<(PathBuf, Option<String>)> = Vec::new();
    // The default workspace path: <root>/workspaces/<id>/mnt.
    if cwd.file_name() == Some(OsStr::new("mnt"))
        && let Some(c) = named(&cwd)
    {
        candidates.push(c);
    }
    // An overlay or fuse workspace anywhere: the mount table names a path in its
    // private directory, <root>/workspaces/<id>.
    if let Some(c) = private_path(&cwd).as_deref().and_then(named) {
        candidates.push(c);
    }
    candidates.extend(roots.iter().map(|r| (r.clone(), None)));
    let is_it = |r: &Record| {
        r.status == Status::Active && std::fs::canonicalize(&r.path).ok().as_ref() == Some(&cwd)
    };
    for (root, id) in candidates {
        if !cowspace_store::layout::Layout::new(root.as_path())
            .registry()
            .is_file()
        {
            continue;
        }
        let Ok(rt) = Runtime::open(&root) else {
            continue;
        };
        let found = match id {
            Some(id) => rt.status(&id).ok().filter(is_it),
            None => rt.list(false).ok().and_then(|l| l.into_iter().find(is_it)),
        };
        if let Some(rec) = found {
            return Some((rt, rec));
        }
    }
    None
}

/// A path inside the private directory of the workspace mounted at `target`, from
/// `/proc/self/mountinfo`: an overlay's `upperdir`, a fuse workspace's source, or the
/// tree a full-tree workspace's bind mount shows.
fn private_path(target: &Path) -> Option<PathBuf> {
    let text = sandbox_api::mountinfo::read().ok()?;
    private_path_in(&text, target)
}

fn private_path_in(mountinfo: &str, target: &Path) -> Option<PathBuf> {
    use sandbox_api::mountinfo::{lines, unescape};
    // The last mount at the path is the one on top.
    let l = lines(mountinfo)
        .rev()
        .find(|l| l.target.as_bytes() == target.as_os_str().as_bytes())?;
    if l.fstype == "overlay" {
        let upper = l
            .superopts
            .split(',')
            .find_map(|o| o.strip_prefix("upperdir="))?;
        return Some(PathBuf::from(unescape(upper)));
    }
    if l.fstype == format!("fuse.{}", crate::served::WS_SUBTYPE) {
        let private = l.source.strip_prefix(crate::served::WS_SOURCE_PREFIX)?;
        return Some(PathBuf::from(unescape(private)).join("upper"));
    }
    // A full-tree workspace: a bind mount of <root>/workspaces/<id>/tree. Its root
    // field is that path within its filesystem, which is mounted whole elsewhere.
    let fs_mount = lines(mountinfo).find(|m| m.dev == l.dev && m.root == "/")?;
    let tree = Path::new(&fs_mount.target).join(l.root.trim_start_matches('/'));
    (tree.file_name() == Some(OsStr::new("tree"))).then_some(tree)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_private_directory_in_the_mount_table() {
        let table = "\
36 25 0:32 / /r/ws/a rw - overlay cowspace rw,lowerdir=/r/run/view-plain/s,upperdir=/r/workspaces/ws-1/upper,workdir=/r/workspaces/ws-1/work,userxattr
37 25 0:33 / /r/ws/b rw,nosuid - fuse.cowspace-ws cowspace:/r/work\\040spaces/ws-2 rw,user_id=0
38 25 0:34 / /r/ws/c rw - fuse.other cowspace:/x rw
";
        assert_eq!(
            private_path_in(table, Path::new("/r/ws/a")),
            Some(PathBuf::from("/r/workspaces/ws-1/upper"))
        );
        assert_eq!(
            private_path_in(table, Path::new("/r/ws/b")),
            Some(PathBuf::from("/r/work spaces/ws-2/upper"))
        );
        assert_eq!(private_path_in(table, Path::new("/r/ws/c")), None);
        assert_eq!(private_path_in(table, Path::new("/r/ws/d")), None);
        // A full-tree workspace bound from a filesystem mounted at /mnt/loop.
        let binds = "\
20 1 8:0 / / rw - ext4 /dev/vda rw
40 1 7:1 / /mnt/loop rw - btrfs /dev/loop1 rw
41 1 7:1 /root/workspaces/ws-3/tree /r/ws/e rw - btrfs /dev/loop1 rw
42 1 8:0 /r/workspaces/ws-4/tree /r/ws/f rw - ext4 /dev/vda rw
43 1 8:0 /r/other /r/ws/g rw - ext4 /dev/vda rw
";
        assert_eq!(
            private_path_in(binds, Path::new("/r/ws/e")),
            Some(PathBuf::from("/mnt/loop/root/workspaces/ws-3/tree"))
        );
        assert_eq!(
            private_path_in(binds, Path::new("/r/ws/f")),
            Some(PathBuf::from("/r/workspaces/ws-4/tree"))
        );
        assert_eq!(private_path_in(binds, Path::new("/r/ws/g")), None);
    }

    #[test]
    fn encodes_token_then_paths_or_everything() {
        let a = Answer {
            token: "t".into(),
            paths: Some(vec![b"a/b".to_vec(), b"c/".to_vec()]),
        };
        assert_eq!(a.encode(), b"t\0a/b\0c/\0");
        let all = Answer {
            token: "t".into(),
            paths: None,
        };
        assert_eq!(all.encode(), b"t\0/\0");
    }

    #[test]
    fn a_directory_that_is_no_workspace_is_answered_everything() {
        let dir = tempfile::tempdir().unwrap();
        let a = answer(
            dir.path(),
            "cowspace:1:import:x",
            &[dir.path().to_path_buf()],
        );
        assert_eq!(a.paths, None);
        assert!(a.token.starts_with(FSMONITOR_TOKEN_PREFIX));
    }
}
