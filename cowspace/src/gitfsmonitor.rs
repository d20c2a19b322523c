//! git's fsmonitor hook for workspaces: git asks what changed instead of looking at
//! every file (docs/git.md).
//!
//! An import of a git checkout gives its `.git/index` git's fsmonitor extension with a
//! token of its own (recorded in the snapshot, [`cowspace_store::Snapshot::git_fsmonitor`])
//! and every entry it made agree with the served files marked valid, and names
//! `mountctl git-fsmonitor` as the hook in `.git/config`. git then runs the hook with the
//! index's token and looks only at the paths it answers.
//!
//! A workspace knows what changed since its base: its private state holds every path
//! written, created or deleted, and nothing else (the upper layer of overlay and fuse
//! workspaces; for full-tree workspaces, the entries whose stamp changed). So the
//! answer is that list, and it is right for any token that describes the base or a
//! later state of this workspace:
//! - the import's token, when the base is the import that wrote it;
//! - `cowspace:1:<base id>`, the token this hook gives whenever it cannot vouch for the
//!   one it got (git then checks every file once and keeps the new token).
//!
//! Any other token (another tool's, or an import token in a capture, whose index may
//! describe an older tree) gets the answer "everything may have changed". So does a
//! directory that is not a live workspace the hook can find. Nothing is ever left out:
//! paths under `.git/` are the only ones not named, and git tracks none there.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use cowspace_store::import::gitindex::FSMONITOR_TOKEN_PREFIX;

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

/// The environment variable naming the `mountctl` the hook runs, where it is not the one
/// on `PATH` (a sandbox, a build tree).
pub const MOUNTCTL_ENV: &str = "COWSPACE_MOUNTCTL";

/// The command git runs as the hook (a shell command; git appends the protocol version
/// and the token): `$COWSPACE_MOUNTCTL`, else the `mountctl` on `PATH`. It names no path
/// of this host, so a snapshot, its workspaces and its exports work wherever the program
/// lives. Where no `mountctl` is found it fails without a word and git looks at every
/// file (slower, never wrong).
pub const HOOK_COMMAND: &str = "command -v \"${COWSPACE_MOUNTCTL:-mountctl}\" >/dev/null && \
     exec \"${COWSPACE_MOUNTCTL:-mountctl}\" git-fsmonitor";

/// The command imports name as git's fsmonitor hook ([`HOOK_COMMAND`]).
pub fn hook_command() -> String {
    HOOK_COMMAND.to_string()
}

/// The `mountctl` the hook would run here and now (`$COWSPACE_MOUNTCTL`, else the first
/// on `PATH`), if any.
pub fn hook_program() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(MOUNTCTL_ENV).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.components().count() > 1 {
            p.is_file().then_some(p)
        } else {
            find_on_path(p.as_os_str())
        };
    }
    find_on_path(OsStr::new("mountctl"))
}

fn find_on_path(name: &OsStr) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// The oldest git that reads the fsmonitor extension the import writes (version 2, with
/// a string token); older ones refuse such an index as corrupt.
pub const OLDEST_GIT: (u32, u32) = (2, 26);

/// Whether the `git` on `PATH` reads the fsmonitor extension: `Err` says why not.
pub fn git_reads_the_extension() -> std::result::Result<(), String> {
    let out = std::process::Command::new("git")
        .arg("--version")
        .output()
        .map_err(|e| format!("git --version: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let version = parse_git_version(&text).ok_or_else(|| format!("git said {text:?}"))?;
    if version >= OLDEST_GIT {
        Ok(())
    } else {
        Err(format!(
            "git {}.{} is older than {}.{}",
            version.0, version.1, OLDEST_GIT.0, OLDEST_GIT.1
        ))
    }
}

/// `(major, minor)` from `git version 2.47.3` (and vendor suffixes after it).
fn parse_git_version(text: &str) -> Option<(u32, u32)> {
    let v = text.trim().strip_prefix("git version ")?;
    let mut parts = v.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
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

/// Inside a sandbox (`mountctl run`, docs/git.md): the workspace's upper layer, bound
/// read-only, ...
pub const SANDBOX_UPPER_ENV: &str = "COWSPACE_GIT_FSMONITOR_UPPER";
/// ... the tokens this hook may vouch for there, space-separated, its own first ...
pub const SANDBOX_TOKENS_ENV: &str = "COWSPACE_GIT_FSMONITOR_TOKENS";
/// ... and the work tree they describe.
pub const SANDBOX_WORKTREE_ENV: &str = "COWSPACE_GIT_FSMONITOR_WORKTREE";
/// Set (`1`) when the upper layer keeps overlay's metadata in `trusted.overlay.*`
/// (workspaces with redirects), which the sandbox cannot read: the hook then names every
/// directory of the upper layer as a whole (it may be opaque or renamed).
pub const SANDBOX_TRUSTED_ENV: &str = "COWSPACE_GIT_FSMONITOR_TRUSTED_XATTRS";

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

/// For `mountctl run` of the overlay or fuse workspace `rec`: the environment and the read-only
/// binds (`SRC:DST`) that let this hook answer inside the sandbox, where the upper layer
/// is seen at `upper_inside` and the workspace at `worktree`. The hook's program, named
/// by the checkout's config at its host path, is bound there unless it already lies in a
/// system directory the sandbox shows. `None` when a path cannot be given to the helper.
pub fn sandbox_setup(
    rt: &Runtime,
    rec: &Record,
    upper_inside: &str,
    worktree: &str,
) -> Option<(Vec<String>, Vec<String>)> {
    let (_, tokens) = vouched_tokens(rt.store(), rec).ok()?;
    if tokens.iter().any(|t| t.contains(char::is_whitespace)) {
        return None;
    }
    // The helper opens bind sources without following any symlink; the runtime root's
    // own path may hold one (a root given through a link), the upper layer itself is
    // the runtime's directory, not the worker's: resolved here.
    let upper = rec.upper_dir();
    let upper = std::fs::canonicalize(&upper).unwrap_or(upper);
    let upper = upper.to_str().filter(|u| !u.contains(':'))?;
    let mut binds = vec![format!("{upper}:{upper_inside}")];
    let exe = std::env::current_exe().ok()?;
    let exe = exe.to_str().filter(|e| !e.contains(':'))?;
    // The sandbox shows the host's system directories; the helper binds nothing at or
    // under its own (docs/sandbox.md).
    const SHOWN: [&str; 7] = [
        "/usr/", "/bin/", "/sbin/", "/lib/", "/lib32/", "/lib64/", "/libx32/",
    ];
    const RESERVED: [&str; 6] = ["/run/", "/proc/", "/dev/", "/workspace/", "/etc/", "/root/"];
    if RESERVED.iter().any(|d| exe.starts_with(d)) {
        return None;
    }
    if !SHOWN.iter().any(|d| exe.starts_with(d)) {
        binds.push(format!("{exe}:{exe}"));
    }
    let mut env = vec![
        // The helper turns git's fsmonitor off by default (GIT_CONFIG_*): on again.
        "GIT_CONFIG_COUNT=0".to_string(),
        // The hook finds this mountctl, bound at its host path, not on the sandbox's PATH.
        format!("{MOUNTCTL_ENV}={exe}"),
        format!("{SANDBOX_UPPER_ENV}={upper_inside}"),
        format!("{SANDBOX_TOKENS_ENV}={}", tokens.join(" ")),
        format!("{SANDBOX_WORKTREE_ENV}={worktree}"),
    ];
    if rec.materializer == crate::materializer::MaterializerKind::Overlay && rec.overlay_redirects {
        env.push(format!("{SANDBOX_TRUSTED_ENV}=1"));
    }
    Some((env, binds))
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
    fn reads_git_versions() {
        assert_eq!(parse_git_version("git version 2.47.3\n"), Some((2, 47)));
        assert_eq!(
            parse_git_version("git version 2.39.5 (Apple Git-154)"),
            Some((2, 39))
        );
        assert_eq!(parse_git_version("git version 2.25.1"), Some((2, 25)));
        assert_eq!(parse_git_version("nonsense"), None);
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
