//! Helpers shared by the store's integration tests.
#![allow(dead_code)]

pub mod crashing;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// A canonical listing of a tree: path, kind, mode, size, content or target, link count.
pub fn listing(root: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        let mut names: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        for n in names {
            let p = dir.join(&n);
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            let m = fs::symlink_metadata(&p).unwrap();
            let mode = m.permissions().mode() & 0o7777;
            if m.is_dir() {
                out.push(format!("d {rel} {mode:o}"));
                walk(root, &p, out);
            } else if m.file_type().is_symlink() {
                out.push(format!(
                    "l {rel} -> {}",
                    fs::read_link(&p).unwrap().display()
                ));
            } else {
                let data = fs::read(&p).unwrap();
                out.push(format!(
                    "f {rel} {mode:o} {} {} nlink={}",
                    data.len(),
                    blake3::hash(&data).to_hex(),
                    m.nlink()
                ));
            }
        }
    }
    let mut out = vec![];
    walk(root, root, &mut out);
    out
}
