//! What an import and a sandbox need to set the hook up: the command git runs, whether
//! git reads the extension, and the environment and binds that let the hook answer
//! inside a sandbox. Below the runtime.

use std::ffi::OsStr;
use std::path::PathBuf;

use cowspace_store::Store;

use crate::gitindex::vouched_tokens;
use crate::registry::Record;

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

/// For `mountctl run` of the overlay or fuse workspace `rec`: the environment and the read-only
/// binds (`SRC:DST`) that let this hook answer inside the sandbox, where the upper layer
/// is seen at `upper_inside` and the workspace at `worktree`. The hook's program, named
/// by the checkout's config at its host path, is bound there unless it already lies in a
/// system directory the sandbox shows. `None` when a path cannot be given to the helper.
pub fn sandbox_setup(
    store: &Store,
    rec: &Record,
    upper_inside: &str,
    worktree: &str,
) -> Option<(Vec<String>, Vec<String>)> {
    let (_, tokens) = vouched_tokens(store, rec).ok()?;
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
