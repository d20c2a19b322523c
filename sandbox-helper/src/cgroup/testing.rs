//! A temporary directory standing for a cgroup mount, for the controllers' file-level
//! tests: plain files read back what was written, as the kernel's do for values it
//! does not round.

use std::fs;
use std::path::PathBuf;

use super::{GroupDir, PARENT_DIR, Version};

/// `ROOT/cowspace/w.1`, empty, for one version.
pub struct Fixture {
    _tmp: tempfile::TempDir,
    parent: PathBuf,
    leaf: PathBuf,
    version: Version,
}

impl Fixture {
    pub fn new(version: Version) -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let parent = tmp.path().join(PARENT_DIR);
        let leaf = parent.join("w.1");
        fs::create_dir_all(&leaf).unwrap();
        Fixture {
            _tmp: tmp,
            parent,
            leaf,
            version,
        }
    }

    /// The group directory as a controller sees it.
    pub fn dir(&self) -> GroupDir<'_> {
        GroupDir {
            path: &self.leaf,
            parent: &self.parent,
            version: self.version,
        }
    }

    /// Creates `name` in the group directory with `contents` (a file the kernel offers).
    pub fn offer(&self, name: &str, contents: &str) {
        fs::write(self.leaf.join(name), contents).unwrap();
    }

    /// Creates `name` in the parent directory with `contents`.
    pub fn offer_in_parent(&self, name: &str, contents: &str) {
        fs::write(self.parent.join(name), contents).unwrap();
    }

    /// The contents of `name` in the group directory.
    pub fn read(&self, name: &str) -> String {
        fs::read_to_string(self.leaf.join(name)).unwrap()
    }

    /// The names of the files in the group directory, sorted.
    pub fn files(&self) -> Vec<String> {
        let mut out: Vec<String> = fs::read_dir(&self.leaf)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        out.sort();
        out
    }
}
