//! Ctrl-C handling and the RAII guards that undo what a run created.
//!
//! The first SIGINT/SIGTERM only sets a flag: the run notices it between steps
//! ([`check`]), returns an error, and every guard on the way out removes what it
//! made (mounts first, then directories). A second SIGINT ends the process at once (a
//! second Ctrl-C); SIGTERM never does: `timeout` and other supervisors deliver it twice
//! at once (to the process, then to its process group), and an exit at the second one
//! would leave the run's mounts, daemons and sandboxes behind (SIGKILL is the way to
//! end a run without its cleanup).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result, bail};

static INTERRUPTED: OnceLock<Arc<AtomicBool>> = OnceLock::new();

/// Installs the handlers (idempotent). Safe to call in tests.
pub fn install() -> Result<()> {
    let flag = INTERRUPTED.get_or_init(|| Arc::new(AtomicBool::new(false)));
    // A second SIGINT while the flag is already set terminates immediately.
    signal_hook::flag::register_conditional_shutdown(
        signal_hook::consts::SIGINT,
        130,
        Arc::clone(flag),
    )
    .context("registering the signal handler (conditional shutdown)")?;
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(flag))
            .context("registering the signal handler (flag)")?;
    }
    Ok(())
}

/// True once SIGINT or SIGTERM arrived.
pub fn interrupted() -> bool {
    INTERRUPTED.get().is_some_and(|f| f.load(Ordering::SeqCst))
}

/// Fails with an "interrupted" error once a signal arrived; called between steps.
pub fn check() -> Result<()> {
    if interrupted() {
        bail!(Interrupted);
    }
    Ok(())
}

/// The error a run returns when it was interrupted; `main` maps it to exit code 130.
#[derive(Debug)]
pub struct Interrupted;

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("interrupted; cleaned up")
    }
}

impl std::error::Error for Interrupted {}

/// A directory this run created; removed (recursively) on drop unless kept.
/// Any mount below it is detached first so removal never descends into a mount.
#[derive(Debug)]
pub struct DirGuard {
    path: PathBuf,
    keep: bool,
}

impl DirGuard {
    /// Creates `path` (and parents) and guards it. Fails if it already exists.
    pub fn create(path: PathBuf) -> Result<Self> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::create_dir(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Self { path, keep: false })
    }

    /// Guards an existing path (e.g. one made by a child process).
    pub fn adopt(path: PathBuf) -> Self {
        Self { path, keep: false }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Keeps the directory (e.g. a finished cache entry after its rename).
    pub fn keep(mut self) -> PathBuf {
        self.keep = true;
        std::mem::take(&mut self.path)
    }

    /// Removes now and reports errors (drop only logs them).
    pub fn remove(mut self) -> Result<()> {
        self.keep = true;
        remove_tree(&self.path)
    }
}

impl Drop for DirGuard {
    fn drop(&mut self) {
        if !self.keep
            && let Err(e) = remove_tree(&self.path)
        {
            eprintln!("bench: cleanup of {} failed: {e:#}", self.path.display());
        }
    }
}

/// Unmounts every mount at or below `path` (deepest first), then removes it.
pub fn remove_tree(path: &Path) -> Result<()> {
    unmount_below(path)?;
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("stat {}", path.display())),
        Ok(m) if m.is_dir() => {
            std::fs::remove_dir_all(path).with_context(|| format!("removing {}", path.display()))
        }
        Ok(_) => std::fs::remove_file(path).with_context(|| format!("removing {}", path.display())),
    }
}

/// Mount points at or below `path`, deepest first, from /proc/self/mountinfo.
pub fn mounts_below(path: &Path) -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape_mountinfo)
        .map(PathBuf::from)
        .filter(|m| m.starts_with(path))
        .collect();
    found.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    found.dedup();
    found
}

fn unescape_mountinfo(s: &str) -> String {
    // mountinfo escapes space, tab, newline and backslash as \ooo.
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 4 <= b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = b[i + 1..i + 4]
                .iter()
                .fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
            out.push(u8::try_from(v).unwrap_or(b'?'));
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn unmount_below(path: &Path) -> Result<()> {
    for m in mounts_below(path) {
        nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH)
            .with_context(|| format!("unmounting {}", m.display()))?;
    }
    Ok(())
}

/// A mount this run made; detached on drop.
#[derive(Debug)]
pub struct MountGuard {
    target: PathBuf,
    active: bool,
}

impl MountGuard {
    pub fn new(target: PathBuf) -> Self {
        Self {
            target,
            active: true,
        }
    }

    /// Unmounts now (timed by callers as teardown) and reports errors.
    pub fn unmount(mut self) -> Result<()> {
        self.active = false;
        nix::mount::umount2(&self.target, nix::mount::MntFlags::empty())
            .with_context(|| format!("unmounting {}", self.target.display()))
    }
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        if self.active
            && let Err(e) = nix::mount::umount2(&self.target, nix::mount::MntFlags::MNT_DETACH)
        {
            eprintln!("bench: unmounting {} failed: {e}", self.target.display());
        }
    }
}

/// Removes leftovers of earlier runs that died without cleaning up (`run-<pid>`
/// directories whose process is gone), including mounts below them.
pub fn sweep_stale_runs(work: &Path) -> Result<()> {
    let Ok(rd) = std::fs::read_dir(work) else {
        return Ok(());
    };
    for entry in rd.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix("run-").and_then(|r| r.split('-').next()) else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            eprintln!("bench: removing leftover {}", entry.path().display());
            remove_tree(&entry.path())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_unescape() {
        assert_eq!(unescape_mountinfo("/a\\040b"), "/a b");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
    }

    #[test]
    fn dir_guard_removes_on_drop() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("x");
        {
            let g = DirGuard::create(p.clone()).unwrap();
            std::fs::write(g.path().join("f"), b"1").unwrap();
        }
        assert!(!p.exists());
    }
}
