//! Change events of a workspace's tree (`mountctl watch`, the socket's `watch`), for
//! changes made by its sandbox and by the host alike: both write through the one mount
//! at the workspace's path, which inotify watches.
//!
//! Every directory is watched (recursively, those created later too: a new directory's
//! watch is added when its creation is seen, and what it already holds is reported as
//! created). Directories are opened through [`crate::files`]' resolution (within the
//! workspace, never through a worker's symlink out of it) and watched by their
//! descriptor's `/proc/self/fd` name, so no watch is ever placed outside the workspace.
//!
//! Events are coalesced per batch (what arrives within [`COALESCE_MS`] of the first, or
//! until the queue is quiet for [`QUIET_MS`]):
//! one `modified` per path, a move's two halves paired into `renamed`. A queue overflow,
//! or a batch of more than [`MAX_BATCH_EVENTS`], becomes one `rescan` event: the fact of
//! a change is never lost, its detail may be.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use serde::Serialize;

use crate::error::{Error, Result};

/// How long a batch gathers events after its first one.
pub const COALESCE_MS: u64 = 50;
/// How long the queue stays quiet before a begun batch is reported.
pub const QUIET_MS: u64 = 5;
/// Most events one batch reports before it becomes a `rescan`.
pub const MAX_BATCH_EVENTS: usize = 100_000;
/// Most directories watched (the kernel's `max_user_watches` bounds it too).
pub const MAX_WATCHED_DIRS: usize = 500_000;

/// One change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WatchEvent {
    /// `created`, `modified`, `removed`, `renamed`, `rescan`.
    pub event: &'static str,
    /// Relative to the workspace's root.
    pub path: String,
    /// A rename's old path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
}

/// What a [`Watcher`] gives next.
#[derive(Debug)]
pub enum Next {
    /// Events of one batch (possibly none, after a timeout).
    Events(Vec<WatchEvent>),
    /// The watched tree is gone (the workspace was removed or unmounted).
    Ended,
}

/// Watches a workspace's tree below one of its directories.
#[derive(Debug)]
pub struct Watcher {
    ino: OwnedFd,
    dirs: HashMap<i32, PathBuf>,
    files: crate::files::Files,
    top: i32,
}

const MASK: WatchFlags = WatchFlags::CREATE
    .union(WatchFlags::DELETE)
    .union(WatchFlags::MODIFY)
    .union(WatchFlags::CLOSE_WRITE)
    .union(WatchFlags::ATTRIB)
    .union(WatchFlags::MOVED_FROM)
    .union(WatchFlags::MOVED_TO)
    .union(WatchFlags::DELETE_SELF)
    .union(WatchFlags::ONLYDIR);

/// A temporary name of the files API's atomic writes (`crate::files`).
fn is_own_temp(p: &Path) -> bool {
    p.file_name().is_some_and(|n| {
        n.as_bytes()
            .starts_with(crate::files::TEMP_PREFIX.as_bytes())
    })
}

fn text(p: &Path) -> String {
    if p.as_os_str().is_empty() {
        ".".into()
    } else {
        String::from_utf8_lossy(p.as_os_str().as_bytes()).into_owned()
    }
}

impl Watcher {
    /// Starts watching `path` (a directory inside the workspace `files` opened) and
    /// everything below it.
    pub fn new(files: crate::files::Files, path: &str) -> Result<Watcher> {
        let rel = crate::files::inside_path(path)?;
        let ino = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK)
            .map_err(|e| Error::io("inotify_init", Path::new("."))(e.into()))?;
        let mut w = Watcher {
            ino,
            dirs: HashMap::new(),
            files,
            top: -1,
        };
        w.top = w.add_tree(&rel, None)?;
        Ok(w)
    }

    /// Watches the directory `rel` and every directory below it; with `created`, also
    /// reports what it holds as created (a directory made after the watch started may
    /// have been filled before its own watch was added). Returns its watch.
    fn add_tree(&mut self, rel: &Path, mut created: Option<&mut Vec<WatchEvent>>) -> Result<i32> {
        let mut stack = vec![rel.to_path_buf()];
        let mut first = -1;
        while let Some(d) = stack.pop() {
            if self.dirs.len() >= MAX_WATCHED_DIRS {
                return Err(Error::Invalid(format!(
                    "more than {MAX_WATCHED_DIRS} directories to watch: watch a smaller one"
                )));
            }
            let fd = match self.files.open_dir(&d) {
                Ok(fd) => fd,
                // Gone again, or not a directory: its removal is reported by its parent.
                Err(_) if first >= 0 => continue,
                Err(e) => return Err(e),
            };
            let proc = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd));
            let wd = inotify::add_watch(&self.ino, proc.as_str(), MASK)
                .map_err(|e| Error::io("watch", d.clone())(e.into()))?;
            if first < 0 {
                first = wd;
            }
            self.dirs.insert(wd, d.clone());
            for entry in self.files.list_rel(&d)? {
                let child = d.join(&entry.0);
                if let Some(ev) = created.as_deref_mut() {
                    ev.push(WatchEvent {
                        event: "created",
                        path: text(&child),
                        from: None,
                    });
                }
                if entry.1 {
                    stack.push(child);
                }
            }
        }
        Ok(first)
    }

    /// Waits up to `timeout` for changes and gives one coalesced batch.
    pub fn next(&mut self, timeout: Duration) -> Result<Next> {
        let mut buf = vec![std::mem::MaybeUninit::<u8>::uninit(); 64 * 1024];
        let mut raw: Vec<(PathBuf, ReadFlags, u32)> = Vec::new();
        let mut overflow = false;
        let mut ended = false;
        let mut deadline = Instant::now() + timeout;
        let mut started = false;
        loop {
            // Once a batch has begun, it ends at its deadline or as soon as the queue has
            // been quiet for QUIET_MS: a lone change is reported at once, a burst whole.
            let mut left = deadline.saturating_duration_since(Instant::now());
            if started {
                left = left.min(Duration::from_millis(QUIET_MS));
            }
            let mut fds = [rustix::event::PollFd::new(
                &self.ino,
                rustix::event::PollFlags::IN,
            )];
            let ts = rustix::event::Timespec {
                tv_sec: left.as_secs() as i64,
                tv_nsec: left.subsec_nanos() as i64,
            };
            match rustix::event::poll(&mut fds, Some(&ts)) {
                Ok(0) => break,
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(Error::io("poll", Path::new("inotify"))(e.into())),
            }
            let mut r = inotify::Reader::new(self.ino.as_fd(), &mut buf);
            loop {
                let ev = match r.next() {
                    Ok(ev) => ev,
                    Err(rustix::io::Errno::AGAIN) => break,
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(e) => return Err(Error::io("read", Path::new("inotify"))(e.into())),
                };
                let flags = ev.events();
                if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
                    overflow = true;
                    continue;
                }
                let Some(dir) = self.dirs.get(&ev.wd()).cloned() else {
                    continue;
                };
                if flags.contains(ReadFlags::IGNORED) || flags.contains(ReadFlags::UNMOUNT) {
                    self.dirs.remove(&ev.wd());
                    if ev.wd() == self.top {
                        ended = true;
                    }
                    continue;
                }
                let path = match ev.file_name() {
                    Some(n) => dir.join(std::ffi::OsStr::from_bytes(n.to_bytes())),
                    None => dir,
                };
                raw.push((path, flags, ev.cookie()));
            }
            if !started && (!raw.is_empty() || overflow) {
                started = true;
                deadline = Instant::now() + Duration::from_millis(COALESCE_MS);
            }
            if ended {
                break;
            }
        }
        // Removed (or unmounted) workspaces send no event while a watch holds them: look.
        if !started && !ended && !self.files.still_there() {
            ended = true;
        }
        let mut out = self.coalesce(raw)?;
        if overflow || out.len() > MAX_BATCH_EVENTS {
            out = vec![WatchEvent {
                event: "rescan",
                path: ".".into(),
                from: None,
            }];
        }
        if ended && out.is_empty() {
            return Ok(Next::Ended);
        }
        Ok(Next::Events(out))
    }

    fn coalesce(&mut self, raw: Vec<(PathBuf, ReadFlags, u32)>) -> Result<Vec<WatchEvent>> {
        let mut out: Vec<WatchEvent> = Vec::new();
        let mut seen_modified: std::collections::HashSet<PathBuf> = Default::default();
        let mut moved_from: HashMap<u32, (usize, PathBuf)> = HashMap::new();
        for (path, flags, cookie) in raw {
            let is_dir = flags.contains(ReadFlags::ISDIR);
            // The files API's temporary names are not reported; their rename into
            // place is (as `modified`).
            if is_own_temp(&path) && !flags.contains(ReadFlags::MOVED_FROM) {
                continue;
            }
            if flags.contains(ReadFlags::MOVED_FROM) {
                moved_from.insert(cookie, (out.len(), path.clone()));
                out.push(WatchEvent {
                    event: "removed",
                    path: text(&path),
                    from: None,
                });
            } else if flags.contains(ReadFlags::MOVED_TO) {
                match moved_from.remove(&cookie) {
                    // The files API's own atomic write: the target was written.
                    Some((i, from)) if is_own_temp(&from) => {
                        out[i] = WatchEvent {
                            event: "modified",
                            path: text(&path),
                            from: None,
                        };
                    }
                    Some((i, from)) => {
                        out[i] = WatchEvent {
                            event: "renamed",
                            path: text(&path),
                            from: Some(text(&from)),
                        };
                        if is_dir {
                            // Its watches keep the old names: take them again.
                            self.rename_watched(&from, &path);
                        }
                    }
                    None => self.created(&path, is_dir, &mut out),
                }
            } else if flags.contains(ReadFlags::CREATE) {
                // A file created and written in one batch is one `created`.
                seen_modified.insert(path.clone());
                self.created(&path, is_dir, &mut out);
            } else if flags.contains(ReadFlags::DELETE) {
                out.push(WatchEvent {
                    event: "removed",
                    path: text(&path),
                    from: None,
                });
            } else if flags
                .intersects(ReadFlags::MODIFY | ReadFlags::CLOSE_WRITE | ReadFlags::ATTRIB)
                && !flags.contains(ReadFlags::DELETE_SELF)
                && seen_modified.insert(path.clone())
            {
                out.push(WatchEvent {
                    event: "modified",
                    path: text(&path),
                    from: None,
                });
            }
        }
        Ok(out)
    }

    /// Reports `path` created; a directory is watched from now on, and what it holds
    /// already is reported created too.
    fn created(&mut self, path: &Path, is_dir: bool, out: &mut Vec<WatchEvent>) {
        out.push(WatchEvent {
            event: "created",
            path: text(path),
            from: None,
        });
        if is_dir {
            // Gone again by now: its removal comes as its own event.
            let _ = self.add_tree(path, Some(out));
        }
    }

    /// After a directory moved within the tree: its watches (and those below) get the
    /// new names.
    fn rename_watched(&mut self, from: &Path, to: &Path) {
        for p in self.dirs.values_mut() {
            if let Ok(rest) = p.strip_prefix(from) {
                *p = to.join(rest);
            }
        }
    }
}
