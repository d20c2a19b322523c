//! The kernel's mount table and the mount calls cowspace makes (through `nix`'s safe
//! wrappers; no `unsafe` here).

use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags};

use crate::error::{Error, Result};

/// One line of `/proc/self/mountinfo` that matters to us.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub target: PathBuf,
    pub fstype: String,
    pub source: String,
}

fn unescape(s: &str) -> String {
    // mountinfo escapes space, tab, newline and backslash as \ooo (octal).
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 4 <= b.len()
            && let Some(v) = std::str::from_utf8(&b[i + 1..i + 4])
                .ok()
                .and_then(|o| u8::from_str_radix(o, 8).ok())
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The current mount table.
pub fn mounts() -> Result<Vec<MountEntry>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(Error::io("read", "/proc/self/mountinfo"))?;
    let mut out = Vec::new();
    for line in text.lines() {
        // id parent maj:min root target options [optional...] - fstype source superopts
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let target = left.split(' ').nth(4).unwrap_or("");
        let mut r = right.split(' ');
        let fstype = r.next().unwrap_or("").to_string();
        let source = r.next().unwrap_or("").to_string();
        out.push(MountEntry {
            target: PathBuf::from(unescape(target)),
            fstype,
            source,
        });
    }
    Ok(out)
}

/// Whether something is mounted exactly at `path`.
pub fn is_mounted(path: &Path) -> Result<bool> {
    Ok(mounts()?.iter().any(|m| m.target == path))
}

/// Mounts an overlay of `lower` with `upper` and `work` at `target`.
pub fn mount_overlay(lower: &Path, upper: &Path, work: &Path, target: &Path) -> Result<()> {
    for p in [lower, upper, work] {
        let s = p.as_os_str().to_string_lossy();
        if s.contains(',') || s.contains(':') || s.contains('\\') {
            return Err(Error::Invalid(format!(
                "{} contains ',', ':' or '\\', which overlay mount options cannot carry",
                p.display()
            )));
        }
    }
    // redirect_dir=nofollow: renaming a directory of the base returns EXDEV (tools fall
    // back to copying), so the upper layer stays a plain description of the changes;
    // index=off, metacopy=off likewise keep copy-ups whole files. userxattr: opaque
    // directories are marked `user.overlay.opaque`, which the overlay the sandbox mounts
    // over the same upper inside its user namespace can read and write too
    // (`trusted.*` needs CAP_SYS_ADMIN in the initial namespace; docs/sandbox.md).
    let opts = format!(
        "lowerdir={},upperdir={},workdir={},userxattr,redirect_dir=nofollow,index=off,metacopy=off",
        lower.display(),
        upper.display(),
        work.display()
    );
    nix::mount::mount(
        Some("cowspace"),
        target,
        Some("overlay"),
        MsFlags::MS_NOATIME,
        Some(opts.as_str()),
    )
    .map_err(|source| Error::Mount {
        target: target.to_path_buf(),
        source,
    })
}

/// Bind-mounts the directory `source` at `target` (a full-tree workspace shown at its
/// path, so its path is a mount point like an overlay workspace's).
pub fn mount_bind(source: &Path, target: &Path) -> Result<()> {
    nix::mount::mount(
        Some(source),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|source| Error::Mount {
        target: target.to_path_buf(),
        source,
    })
}

/// Unmounts `target`; EBUSY is reported as such (nothing forced).
pub fn unmount(target: &Path) -> std::result::Result<(), nix::Error> {
    nix::mount::umount2(target, MntFlags::empty())
}

/// Detaches `target` even while busy (it disappears once unused).
pub fn unmount_lazy(target: &Path) -> Result<()> {
    match nix::mount::umount2(target, MntFlags::MNT_DETACH) {
        Ok(()) | Err(nix::Error::EINVAL) | Err(nix::Error::ENOENT) => Ok(()),
        Err(source) => Err(Error::Unmount {
            target: target.to_path_buf(),
            source,
        }),
    }
}

/// Processes whose cwd, root, open files or mappings are under `dir`.
pub fn users_of(dir: &Path) -> Vec<i32> {
    let mut pids = Vec::new();
    let me = std::process::id() as i32;
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let base = e.path();
        let under = |p: PathBuf| {
            std::fs::read_link(p)
                .map(|t| t.starts_with(dir))
                .unwrap_or(false)
        };
        let mut uses = under(base.join("cwd")) || under(base.join("root"));
        if !uses && let Ok(fds) = std::fs::read_dir(base.join("fd")) {
            uses = fds.flatten().any(|fd| under(fd.path()));
        }
        if !uses && let Ok(maps) = std::fs::read_to_string(base.join("maps")) {
            let d = dir.to_string_lossy();
            uses = maps.lines().any(|l| {
                l.split_whitespace()
                    .nth(5)
                    .is_some_and(|p| p.starts_with(d.as_ref()))
            });
        }
        if uses {
            pids.push(pid);
        }
    }
    pids
}
