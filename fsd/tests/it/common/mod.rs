//! Shared by fsd's root-only tests: whether they can run, and a guard that leaves nothing.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cowspace::runtime::Runtime;
use cowspace_fsd::view::{ViewMount, ViewOptions};
use cowspace_store::{ImportOptions, SnapshotId, Store, StoreConfig};

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
        let _ = cowspace::daemon::stop(&self.0, true);
        let mut left: Vec<PathBuf> = cowspace::mounts::mounts()
            .unwrap_or_default()
            .into_iter()
            .map(|m| m.target)
            .filter(|t| t.starts_with(&self.0))
            .collect();
        left.sort();
        for m in left.iter().rev() {
            let _ = cowspace::mounts::unmount_lazy(m);
        }
    }
}

/// A temporary store, source trees and mount points for the view's tests; removed at the
/// end (mounts first: each is dropped before the directory goes).
pub struct Env {
    pub tmp: tempfile::TempDir,
    pub store: Arc<Store>,
}

impl Env {
    pub fn new(prefix: &str) -> Env {
        let tmp = tempfile::Builder::new().prefix(prefix).tempdir().unwrap();
        let store = Store::init(&tmp.path().join("root"), StoreConfig::default()).unwrap();
        Env {
            tmp,
            store: Arc::new(store),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.tmp.path().join(name)
    }

    pub fn dir(&self, name: &str) -> PathBuf {
        let p = self.path(name);
        fs::create_dir_all(&p).unwrap();
        p
    }

    pub fn import(&self, src: &Path) -> SnapshotId {
        self.store
            .import_dir(src, &ImportOptions::new())
            .unwrap()
            .snapshot
    }

    pub fn mount(&self, name: &str, opts: ViewOptions) -> ViewMount {
        ViewMount::mount(Arc::clone(&self.store), &self.dir(name), opts).unwrap()
    }
}
