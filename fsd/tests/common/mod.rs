//! Shared by fsd's root-only tests: whether they can run, and a guard that leaves nothing.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use cowspace_fsd::runtime::Runtime;

/// Root with /dev/fuse: run. Otherwise print why and skip — except under `CI=true`.
pub fn can_run() -> bool {
    if nix::unistd::geteuid().is_root() && Path::new("/dev/fuse").exists() {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI=true: this test must run (root, /dev/fuse)"
    );
    eprintln!("skipped: needs root and /dev/fuse");
    false
}

/// Removes every workspace of the runtime root, stops its daemon and detaches whatever
/// is still mounted under it (deepest first), even when the test panicked.
pub struct Cleanup(pub PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Ok(rt) = Runtime::open(&self.0) {
            for r in rt.list(false).unwrap_or_default() {
                let _ = rt.remove(&r.id, true);
            }
        }
        let _ = cowspace_fsd::daemon::stop(&self.0, true);
        let mut left: Vec<PathBuf> = cowspace_fsd::mounts::mounts()
            .unwrap_or_default()
            .into_iter()
            .map(|m| m.target)
            .filter(|t| t.starts_with(&self.0))
            .collect();
        left.sort();
        for m in left.iter().rev() {
            let _ = cowspace_fsd::mounts::unmount_lazy(m);
        }
    }
}
