//! The verifiers' vocabulary: what a path must be, collected as findings.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// Collects verifier findings.
#[derive(Default)]
pub(crate) struct Check(pub(crate) Vec<String>);

impl Check {
    pub(crate) fn file(&mut self, dir: &Path, rel: &str, content: &[u8], mode: u32) {
        let p = dir.join(rel);
        match fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_file() => {
                if m.permissions().mode() & 0o7777 != mode {
                    self.0.push(format!(
                        "{rel}: mode {:o}, expected {mode:o}",
                        m.permissions().mode() & 0o7777
                    ));
                }
                if m.len() != content.len() as u64 {
                    self.0.push(format!(
                        "{rel}: size {}, expected {}",
                        m.len(),
                        content.len()
                    ));
                } else if fs::read(&p).map(|c| c != content).unwrap_or(true) {
                    self.0.push(format!("{rel}: content differs"));
                }
            }
            Ok(m) => self
                .0
                .push(format!("{rel}: a {:?}, expected a file", m.file_type())),
            Err(e) => self.0.push(format!("{rel}: {e}")),
        }
    }
    pub(crate) fn text(&mut self, dir: &Path, rel: &str, content: &str) {
        self.file(dir, rel, content.as_bytes(), 0o644);
    }
    pub(crate) fn dir(&mut self, dir: &Path, rel: &str, mode: u32) {
        match fs::symlink_metadata(dir.join(rel)) {
            Ok(m) if m.is_dir() => {
                if m.permissions().mode() & 0o7777 != mode {
                    self.0.push(format!(
                        "{rel}: mode {:o}, expected {mode:o}",
                        m.permissions().mode() & 0o7777
                    ));
                }
            }
            Ok(_) => self.0.push(format!("{rel}: not a directory")),
            Err(e) => self.0.push(format!("{rel}: {e}")),
        }
    }
    pub(crate) fn symlink(&mut self, dir: &Path, rel: &str, target: &str) {
        match fs::read_link(dir.join(rel)) {
            Ok(t) if t == Path::new(target) => {}
            Ok(t) => self
                .0
                .push(format!("{rel}: points to {t:?}, expected {target:?}")),
            Err(e) => self.0.push(format!("{rel}: not a symlink: {e}")),
        }
    }
    pub(crate) fn absent(&mut self, dir: &Path, rel: &str) {
        if fs::symlink_metadata(dir.join(rel)).is_ok() {
            self.0.push(format!("{rel}: exists, expected nothing"));
        }
    }
    /// The names form exactly one hard-link group (same inode), separate from `others`.
    pub(crate) fn linked(&mut self, dir: &Path, names: &[&str]) {
        let inos: Vec<_> = names
            .iter()
            .map(|n| {
                fs::symlink_metadata(dir.join(n))
                    .map(|m| (m.dev(), m.ino()))
                    .ok()
            })
            .collect();
        if inos.iter().any(Option::is_none) || inos.windows(2).any(|w| w[0] != w[1]) {
            self.0.push(format!("{names:?}: not one hard-link group"));
        }
    }
    pub(crate) fn not_linked(&mut self, dir: &Path, a: &str, b: &str) {
        let ia = fs::symlink_metadata(dir.join(a)).map(|m| (m.dev(), m.ino()));
        let ib = fs::symlink_metadata(dir.join(b)).map(|m| (m.dev(), m.ino()));
        if let (Ok(x), Ok(y)) = (ia, ib)
            && x == y
        {
            self.0
                .push(format!("{a} and {b}: the same inode, expected two files"));
        }
    }
    pub(crate) fn done(self) -> Vec<String> {
        self.0
    }
}
