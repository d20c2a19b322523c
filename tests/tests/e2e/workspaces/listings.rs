//! Directory listings of a workspace read in pieces while the directory changes: every
//! name there throughout shows exactly once, a name that comes and goes at most once,
//! and a `telldir` position still resumes where it was — on every materializer that
//! serves a mount (overlay on both lowers, fuse).

// `opendir`/`readdir`/`telldir`/`seekdir` of the C library: std has no directory positions.
#![allow(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use super::support::{WsRoot, require_root};

/// Names in the snapshot's directory.
const LOWER: usize = 1500;
/// Of those, every `DELETED_EVERY`th is deleted in the workspace.
const DELETED_EVERY: usize = 7;
/// Names added in the workspace before the reads.
const UPPER: usize = 400;
/// Full reads of the directory while another thread changes it.
const READS: usize = 12;

const MATERIALIZERS: [&[&str]; 3] = [
    &["--materializer", "overlay", "--lower", "view"],
    &["--materializer", "overlay", "--lower", "checkout"],
    &["--materializer", "fuse"],
];

/// An open directory stream (`opendir`), closed on drop.
struct DirStream(*mut libc::DIR);

impl DirStream {
    fn open(path: &Path) -> DirStream {
        let c = CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: `c` is a valid C string; the result is checked.
        let d = unsafe { libc::opendir(c.as_ptr()) };
        assert!(
            !d.is_null(),
            "opendir {path:?}: {}",
            std::io::Error::last_os_error()
        );
        DirStream(d)
    }

    /// The next name, `None` at the end.
    fn next(&mut self) -> Option<String> {
        // SAFETY: `self.0` is an open stream; errno is cleared to tell the end from an
        // error.
        unsafe {
            *libc::__errno_location() = 0;
            let e = libc::readdir64(self.0);
            if e.is_null() {
                let err = std::io::Error::last_os_error();
                assert_eq!(err.raw_os_error(), Some(0), "readdir: {err}");
                return None;
            }
            Some(
                CStr::from_ptr((*e).d_name.as_ptr())
                    .to_string_lossy()
                    .into_owned(),
            )
        }
    }

    fn tell(&mut self) -> libc::c_long {
        // SAFETY: `self.0` is an open stream.
        unsafe { libc::telldir(self.0) }
    }

    fn seek(&mut self, pos: libc::c_long) {
        // SAFETY: `self.0` is an open stream and `pos` came from `telldir` on it.
        unsafe { libc::seekdir(self.0, pos) }
    }
}

impl Drop for DirStream {
    fn drop(&mut self) {
        // SAFETY: `self.0` is an open stream, closed once.
        unsafe { libc::closedir(self.0) };
    }
}

/// How many times each name was read in one pass over `dir` (`.` and `..` left out),
/// pausing every 64 names so the other thread's changes land between the pieces the
/// kernel asks for.
fn read_counts(dir: &Path) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    let mut d = DirStream::open(dir);
    let mut n = 0;
    while let Some(name) = d.next() {
        if name != "." && name != ".." {
            *counts.entry(name).or_insert(0) += 1;
        }
        n += 1;
        if n % 64 == 0 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    counts
}

#[test]
fn listings_read_while_the_directory_changes_show_each_name_once() {
    require_root!();
    let r = WsRoot::new();
    let src = r.t.path("src");
    std::fs::create_dir_all(src.join("big")).unwrap();
    for i in 0..LOWER {
        std::fs::write(src.join(format!("big/lower-{i:05}")), format!("{i}\n")).unwrap();
    }
    let base = r.import(&src, &[]);

    for args in MATERIALIZERS {
        let ws = r.create(&base, args);
        let big = ws.path.join("big");
        let mut stable = BTreeSet::new();
        for i in 0..LOWER {
            let name = format!("lower-{i:05}");
            if i % DELETED_EVERY == 0 {
                std::fs::remove_file(big.join(&name)).unwrap();
            } else {
                stable.insert(name);
            }
        }
        for i in 0..UPPER {
            let name = format!("upper-{i:05}");
            std::fs::write(big.join(&name), "new\n").unwrap();
            stable.insert(name);
        }

        let done = AtomicBool::new(false);
        let passes = std::thread::scope(|s| {
            let churn = s.spawn(|| {
                // Names that come and go, and a renamed one, while the reads run.
                let mut k = 0u64;
                while !done.load(Ordering::Relaxed) {
                    let a = big.join(format!("churn-{:03}", k % 200));
                    let b = big.join(format!("churn-{:03}", (k + 100) % 200));
                    std::fs::write(&a, "x").unwrap();
                    let _ = std::fs::remove_file(&b);
                    let _ = std::fs::rename(&a, big.join(format!("moved-{:03}", k % 50)));
                    k += 1;
                }
                k
            });
            let passes: Vec<_> = (0..READS).map(|_| read_counts(&big)).collect();
            done.store(true, Ordering::Relaxed);
            let changes = churn.join().unwrap();
            assert!(changes > 0, "no change ran during the reads");
            passes
        });

        for (p, counts) in passes.iter().enumerate() {
            for name in &stable {
                assert_eq!(
                    counts.get(name).copied(),
                    Some(1),
                    "{args:?}: pass {p}: {name} (there throughout) read {:?} times",
                    counts.get(name)
                );
            }
            for (name, n) in counts {
                assert!(
                    stable.contains(name)
                        || name.starts_with("churn-")
                        || name.starts_with("moved-"),
                    "{args:?}: pass {p}: {name} was never in the directory"
                );
                assert_eq!(*n, 1, "{args:?}: pass {p}: {name} read {n} times");
            }
        }

        // Quiet now: a telldir position resumes where it was.
        let mut d = DirStream::open(&big);
        let mut first = Vec::new();
        for _ in 0..LOWER / 2 {
            first.push(d.next().expect("half the names"));
        }
        let pos = d.tell();
        let rest: Vec<String> = std::iter::from_fn(|| d.next()).collect();
        d.seek(pos);
        let again: Vec<String> = std::iter::from_fn(|| d.next()).collect();
        assert_eq!(rest, again, "{args:?}: seekdir to a telldir position");
        let all: BTreeSet<String> = first.iter().chain(&rest).cloned().collect();
        assert_eq!(
            all.len(),
            first.len() + rest.len(),
            "{args:?}: a quiet listing repeats a name"
        );
        drop(d);
        r.discard(&ws.id);
    }
    r.assert_clean();
}
