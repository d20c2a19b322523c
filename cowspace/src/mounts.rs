//! The kernel's mount table and the mount calls cowspace makes (through `nix`'s safe
//! wrappers and `sys`; no `unsafe` here), and the daemon's deferred teardowns.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

use nix::mount::{MntFlags, MsFlags};

use crate::error::{Error, Result};

/// One line of `/proc/self/mountinfo` that matters to us.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub target: PathBuf,
    pub fstype: String,
    pub source: String,
}

/// The current mount table.
pub fn mounts() -> Result<Vec<MountEntry>> {
    let text = sandbox_api::mountinfo::read().map_err(Error::io("read", "/proc/self/mountinfo"))?;
    Ok(sandbox_api::mountinfo::lines(&text)
        .map(|l| MountEntry {
            target: PathBuf::from(l.target),
            fstype: l.fstype.to_string(),
            source: l.source.to_string(),
        })
        .collect())
}

/// Whether something is mounted exactly at `path`.
///
/// Asked of the path itself (`statx`), not of the mount table: reading
/// `/proc/self/mountinfo` costs time in proportion to the mounts there, hundreds with
/// hundreds of workspaces, and every create and removal asks. The table is the answer
/// only where the kernel does not say, or cannot look at the path.
pub fn is_mounted(path: &Path) -> Result<bool> {
    match crate::sys::is_mount_root(path) {
        Ok(Some(root)) => return Ok(root),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => {
            return Ok(false);
        }
        Ok(None) | Err(_) => {}
    }
    Ok(mounts()?.iter().any(|m| m.target == path))
}

/// Mounts an overlay of `lower` with `upper` and `work` at `target`.
pub fn mount_overlay(
    lower: &Path,
    upper: &Path,
    work: &Path,
    target: &Path,
    redirects: bool,
) -> Result<()> {
    mount_overlay_with_data(lower, None, upper, work, target, redirects)
}

/// [`mount_overlay`] with a data-only lower layer `data` below `lower` (`lowerdir=L::D`,
/// Linux 6.16+ without metacopy): `lower`'s regular files that carry an overlay
/// redirect xattr read their bytes from the file of `data` it names (the native lower,
/// [`crate::native`]).
pub fn mount_overlay_with_data(
    lower: &Path,
    data: Option<&Path>,
    upper: &Path,
    work: &Path,
    target: &Path,
    redirects: bool,
) -> Result<()> {
    for p in [lower, upper, work].into_iter().chain(data) {
        let s = p.as_os_str().to_string_lossy();
        if s.contains(',') || s.contains(':') || s.contains('\\') {
            return Err(Error::Invalid(format!(
                "{} contains ',', ':' or '\\', which overlay mount options cannot carry",
                p.display()
            )));
        }
    }
    // `redirects` (workspaces made by this version): `trusted.overlay.*` xattrs and
    // `redirect_dir=on`, so renaming a directory of the base is one rename (a redirect
    // record in the upper layer, which diff, commit and the fsmonitor hook follow,
    // `crate::upper`); only possible because every overlay of the workspace, the shared
    // one of a sandbox included, is mounted in the initial user namespace.
    // Otherwise (workspaces of earlier versions): `userxattr,redirect_dir=nofollow`,
    // where renaming a base directory returns EXDEV and tools copy it. index=off,
    // metacopy=off keep copy-ups whole files either way.
    let policy = if redirects {
        "redirect_dir=on,index=off,metacopy=off"
    } else {
        "userxattr,redirect_dir=nofollow,index=off,metacopy=off"
    };
    let lowers = match data {
        Some(d) => format!("{}::{}", lower.display(), d.display()),
        None => lower.display().to_string(),
    };
    let opts = format!(
        "lowerdir={lowers},upperdir={},workdir={},{policy}",
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

/// Unmounts `target` as [`unmount`] does (busy when processes use it), but first takes a
/// detached clone of the mount, returned, which keeps the superblock alive: the teardown
/// — evicting every inode the mount made, an overlay's sync of its upper layer — then
/// happens when the clone is closed, not in this call. The clone is a mount of its own,
/// so it does not make `target` busy; on an error it is closed with the original still
/// mounted, which tears nothing down. `None`: no clone could be taken (`open_tree` needs
/// Linux 5.2 and `CAP_SYS_ADMIN`), and the unmount was a plain one.
pub fn unmount_keeping_superblock(
    target: &Path,
) -> std::result::Result<Option<OwnedFd>, nix::Error> {
    let clone = crate::sys::open_tree_clone(target).ok();
    unmount(target)?;
    Ok(clone)
}

/// Aborts the FUSE connection of the filesystem on device `dev` (through the fusectl
/// filesystem; mounted first when `mount_fusectl` and it is not there). Every request
/// then fails and the serving threads end, whatever still holds the superblock. Whether
/// it was aborted.
pub fn abort_fuse_connection(dev: u64, mount_fusectl: bool) -> bool {
    let minor = nix::sys::stat::minor(dev);
    let conns = Path::new("/sys/fs/fuse/connections");
    if mount_fusectl && !conns.join(minor.to_string()).exists() {
        let _ = nix::mount::mount(
            Some("fusectl"),
            conns,
            Some("fusectl"),
            MsFlags::empty(),
            None::<&str>,
        );
    }
    let abort = conns.join(minor.to_string()).join("abort");
    match std::fs::write(&abort, "1") {
        Ok(()) => {
            tracing::debug!(connection = minor, "aborted a FUSE connection");
            true
        }
        Err(e) => {
            tracing::debug!(path = %abort.display(), "cannot abort a FUSE connection: {e}");
            false
        }
    }
}

/// How long a deferred teardown waits before it starts (see [`start_deferred_teardowns`]).
const TEARDOWN_DELAY_MS: u64 = 10;

/// How long the teardown queue stays empty before the heap is trimmed
/// ([`crate::sys::trim_heap`]).
const TRIM_AFTER_QUIET_MS: u64 = 1_000;

/// Teardowns queued beyond which they no longer wait for idle CPUs.
const MAX_IDLE_BACKLOG: usize = 16;

/// Set while the daemon waits for every teardown ([`drain_deferred`]).
static DRAINING: AtomicBool = AtomicBool::new(false);

/// Work the daemon does after answering: the teardown of unmounted workspaces.
/// A teardown, with when it was queued.
type Job = (std::time::Instant, Box<dyn FnOnce() + Send>);

struct Deferred {
    jobs: Mutex<Sender<Job>>,
    /// Jobs queued and not finished yet.
    pending: Arc<(Mutex<usize>, Condvar)>,
}

static DEFERRED: OnceLock<Deferred> = OnceLock::new();

/// Makes this process run deferred teardowns on a thread of their own (the daemon, which
/// lives on after answering; [`drain_deferred`] before it exits). Elsewhere [`defer`]
/// runs the job at once.
pub fn start_deferred_teardowns() {
    DEFERRED.get_or_init(|| {
        let (tx, rx) = channel::<Job>();
        let pending = Arc::new((Mutex::new(0usize), Condvar::new()));
        let p = Arc::clone(&pending);
        let spawned = std::thread::Builder::new()
            .name("teardown".into())
            .spawn(move || {
                let mut idle = false;
                // Whether a teardown ran since the heap was last trimmed.
                let mut owed_trim = false;
                loop {
                    let next = if owed_trim {
                        rx.recv_timeout(Duration::from_millis(TRIM_AFTER_QUIET_MS))
                    } else {
                        rx.recv().map_err(|_| RecvTimeoutError::Disconnected)
                    };
                    let (queued, job) = match next {
                        Ok(j) => j,
                        Err(RecvTimeoutError::Timeout) => {
                            // The teardowns are over for now: give what they freed back
                            // (the heap otherwise keeps the freed pages of every thread's
                            // arena; small workspaces do not trim when they go).
                            crate::sys::trim_heap();
                            owed_trim = false;
                            continue;
                        }
                        Err(RecvTimeoutError::Disconnected) => break,
                    };
                    // After the removal that queued it has answered (its last steps
                    // take a millisecond or two); a job that waited behind others that
                    // long already starts at once (a sleep per job held the queue to
                    // 100 teardowns a second, fewer than a loop of removals makes).
                    let due = queued + Duration::from_millis(TEARDOWN_DELAY_MS);
                    let now = std::time::Instant::now();
                    if due > now {
                        std::thread::sleep(due - now);
                    }
                    // A teardown (the kernel freeing a workspace's inodes and pages: 0.4 s
                    // of CPU after a full read of the Linux tree) runs when nothing else
                    // wants a CPU: at full priority it slowed the creates and removals
                    // that followed a large removal 1-5x on a 2-CPU host. Not when they
                    // pile up, nor when the daemon waits for them to exit.
                    let backlog = *p.0.lock().unwrap_or_else(|e| e.into_inner());
                    let want_idle = backlog <= MAX_IDLE_BACKLOG && !DRAINING.load(Ordering::SeqCst);
                    if want_idle != idle {
                        match crate::sys::idle_priority(want_idle) {
                            Ok(()) => idle = want_idle,
                            Err(e) => tracing::debug!(error = %e, "teardown priority unchanged"),
                        }
                    }
                    job();
                    owed_trim = true;
                    let (n, done) = &*p;
                    *n.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
                    done.notify_all();
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "no teardown thread: removals tear down at once");
        }
        Deferred {
            jobs: Mutex::new(tx),
            pending,
        }
    });
}

/// Whether [`defer`] runs jobs later (this process started deferred teardowns).
pub fn deferring() -> bool {
    DEFERRED.get().is_some()
}

/// Runs `job` on the teardown thread, or now when there is none.
pub fn defer(job: impl FnOnce() + Send + 'static) {
    let Some(d) = DEFERRED.get() else {
        return job();
    };
    *d.pending.0.lock().unwrap_or_else(|e| e.into_inner()) += 1;
    let sent = d
        .jobs
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((std::time::Instant::now(), Box::new(job)));
    if let Err(std::sync::mpsc::SendError((_, job))) = sent {
        // The thread is gone (it could not start): do it here.
        *d.pending.0.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
        job();
    }
}

/// Waits until every deferred teardown has finished (the daemon, before it unmounts its
/// views and exits: an overlay's clone still holds its lower layer).
pub fn drain_deferred() {
    let Some(d) = DEFERRED.get() else {
        return;
    };
    DRAINING.store(true, Ordering::SeqCst);
    let (n, done) = &*d.pending;
    let mut left = n.lock().unwrap_or_else(|e| e.into_inner());
    while *left > 0 {
        left = done.wait(left).unwrap_or_else(|e| e.into_inner());
    }
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

/// `PF_EXITING` in `/proc/PID/stat`'s flags (field 9): the task is in `exit(2)`,
/// letting go of its files, mappings and working directory.
const PF_EXITING: u64 = 0x4;

/// Whether process `pid` is on its way out: gone, a zombie, or exiting (what it still
/// holds it lets go of without anyone's help).
pub fn is_exiting(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat_says_exiting(&stat),
        Err(_) => true,
    }
}

/// [`is_exiting`] of a `/proc/PID/stat` line; an unreadable line is not exiting (the
/// process is then counted as a user).
fn stat_says_exiting(stat: &str) -> bool {
    crate::procfs::parse_stat(stat).is_some_and(|s| s.is_zombie() || s.flags & PF_EXITING != 0)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exiting_tasks_are_told_from_live_ones() {
        // Field 9 is the flags; 0x4 is PF_EXITING.
        let live = "123 (sh) S 1 123 123 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 555 0 0";
        let exiting = "123 (sh) D 1 123 123 0 -1 4194564 100 0 0 0 1 2 0 0 20 0 1 0 555 0 0";
        let zombie = "123 (a) b) (c) Z 1 123 123 0 -1 4194560 1 0 0 0 1 2 0 0 20 0 1 0 5 0 0";
        assert!(!stat_says_exiting(live));
        assert!(stat_says_exiting(exiting));
        assert!(stat_says_exiting(zombie));
        assert!(!stat_says_exiting("garbage"));
        assert!(!is_exiting(std::process::id() as i32));
        assert!(is_exiting(i32::MAX), "no such process");
    }

    #[test]
    fn is_mounted_answers_for_the_path_itself() {
        // The kernel answers for the path (Linux 5.8+), without the mount table.
        assert_eq!(
            crate::sys::is_mount_root(Path::new("/proc")).unwrap(),
            Some(true)
        );
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(crate::sys::is_mount_root(tmp.path()).unwrap(), Some(false));
        // Mount roots on every Linux host this runs on.
        assert!(is_mounted(Path::new("/")).unwrap());
        assert!(is_mounted(Path::new("/proc")).unwrap());
        let dir = tempfile::tempdir().unwrap();
        assert!(!is_mounted(dir.path()).unwrap());
        assert!(!is_mounted(&dir.path().join("missing")).unwrap());
        // Below a file: not a directory, so nothing is mounted there.
        std::fs::write(dir.path().join("f"), b"").unwrap();
        assert!(!is_mounted(&dir.path().join("f/x")).unwrap());
        // A symlink to a mount root is not one itself (the mount table lists no such path).
        std::os::unix::fs::symlink("/proc", dir.path().join("l")).unwrap();
        assert!(!is_mounted(&dir.path().join("l")).unwrap());
        // Every path the mount table lists that is not covered by a later mount agrees.
        let table = mounts().unwrap();
        for (i, m) in table.iter().enumerate() {
            let covered = table[i + 1..]
                .iter()
                .any(|later| m.target.starts_with(&later.target));
            if !covered && m.target.is_dir() {
                assert!(is_mounted(&m.target).unwrap(), "{}", m.target.display());
            }
        }
    }
}
