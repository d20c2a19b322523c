//! Where things are under a runtime root.
//!
//! ```text
//! <root>/store/index.db      SQLite index (WAL)
//! <root>/store/packs/*.pack  append-once pack files
//! <root>/store/lock          flock: imports shared, gc exclusive
//! <root>/cache/blobs/ab/<id> blob cache: whole file contents as plain read-only files
//! <root>/cache/checkouts/    shared checkouts (overlay lowers of hard links)
//! <root>/cache/native/       native lowers (metadata images and their mounts)
//! <root>/cache/subvols/      btrfs base subvolumes
//! <root>/cache/xattrs/       per-snapshot markers: has it any xattr
//! <root>/registry.db         the registry of workspaces (SQLite)
//! <root>/workspaces/<id>/    a workspace's private state
//! <root>/run/                sockets and mount points of the daemon
//! <root>/run/sandbox/        the sandbox helper's state
//! <root>/tmp/                scratch space for atomic writes
//! ```

use std::path::{Path, PathBuf};

/// Paths of one runtime root.
#[derive(Debug, Clone)]
pub struct Layout {
    pub root: PathBuf,
}

impl Layout {
    /// The layout of `root`, made absolute against the current directory: every path
    /// derived from it is recorded (workspace paths in the registry, the daemon's
    /// `--root`, mount points compared with `/proc/self/mountinfo`), so a relative root
    /// must not leak into them.
    pub fn new(root: impl Into<PathBuf>) -> Layout {
        let root = root.into();
        let root = std::path::absolute(&root).unwrap_or(root);
        Layout { root }
    }
    pub fn store_dir(&self) -> PathBuf {
        self.root.join("store")
    }
    pub fn index(&self) -> PathBuf {
        self.root.join("store/index.db")
    }
    pub fn packs(&self) -> PathBuf {
        self.root.join("store/packs")
    }
    pub fn lock(&self) -> PathBuf {
        self.root.join("store/lock")
    }
    pub fn blobs(&self) -> PathBuf {
        self.root.join("cache/blobs")
    }
    pub fn workspaces(&self) -> PathBuf {
        self.root.join("workspaces")
    }
    pub fn run(&self) -> PathBuf {
        self.root.join("run")
    }
    pub fn tmp(&self) -> PathBuf {
        self.root.join("tmp")
    }
    pub fn cache(&self) -> PathBuf {
        self.root.join("cache")
    }
    pub fn checkouts(&self) -> PathBuf {
        self.root.join("cache/checkouts")
    }
    pub fn native(&self) -> PathBuf {
        self.root.join("cache/native")
    }
    pub fn subvols(&self) -> PathBuf {
        self.root.join("cache/subvols")
    }
    pub fn xattr_markers(&self) -> PathBuf {
        self.root.join("cache/xattrs")
    }
    pub fn registry(&self) -> PathBuf {
        self.root.join("registry.db")
    }
    /// The private directory of workspace `id`.
    pub fn workspace(&self, id: &str) -> PathBuf {
        self.workspaces().join(id)
    }
    pub fn daemon_socket(&self) -> PathBuf {
        self.root.join("run/fsd.sock")
    }
    pub fn daemon_log(&self) -> PathBuf {
        self.root.join("run/fsd.log")
    }
    pub fn daemon_lock(&self) -> PathBuf {
        self.root.join("run/fsd.lock")
    }
    pub fn sandbox_state(&self) -> PathBuf {
        self.root.join("run/sandbox")
    }
    /// Where the daemon mounts the full view of every snapshot.
    pub fn view(&self) -> PathBuf {
        self.root.join("run/view")
    }
    /// Where the daemon mounts the plain view (snapshots without xattrs).
    pub fn plain_view(&self) -> PathBuf {
        self.root.join("run/view-plain")
    }
    /// Held shared while a create finds its checkout, exclusively while gc prunes.
    pub fn checkouts_lock(&self) -> PathBuf {
        self.root.join("cache/checkouts.lock")
    }
    /// Every directory `init` creates.
    pub fn dirs(&self) -> Vec<PathBuf> {
        vec![
            self.root.clone(),
            self.store_dir(),
            self.packs(),
            self.cache(),
            self.blobs(),
            self.workspaces(),
            self.run(),
            self.tmp(),
        ]
    }
}

/// The default runtime root: `$COWSPACE_ROOT`, else `/var/lib/cowspace` for root, else
/// `$XDG_DATA_HOME/cowspace` (or `~/.local/share/cowspace`).
pub fn default_root() -> PathBuf {
    if let Some(r) = std::env::var_os("COWSPACE_ROOT").filter(|v| !v.is_empty()) {
        return PathBuf::from(r);
    }
    if is_root() {
        return PathBuf::from("/var/lib/cowspace");
    }
    if let Some(x) = std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        return Path::new(&x).join("cowspace");
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/".into());
    Path::new(&home).join(".local/share/cowspace")
}

fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    // The owner of /proc/self is the effective uid of this process.
    std::fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relative_root_is_made_absolute() {
        let l = Layout::new("some/root");
        assert!(l.root.is_absolute(), "{}", l.root.display());
        assert!(l.root.ends_with("some/root"));
        assert_eq!(
            l.workspaces(),
            std::env::current_dir()
                .unwrap()
                .join("some/root/workspaces")
        );
        assert_eq!(Layout::new("/abs/root").root, Path::new("/abs/root"));
    }
}
