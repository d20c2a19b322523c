//! Walking a tree: counts, a content hash that identifies it, the list of regular
//! files, and the disk a directory really adds.

use std::collections::HashMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

/// What a tree holds; `tree_hash` changes with any name, kind, executable bit,
/// symlink target or byte of content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeStats {
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub executables: u64,
    /// Sum of regular file sizes ("logical bytes").
    pub bytes: u64,
    pub max_depth: u64,
    pub tree_hash: String,
}

/// Visits every entry below `root` in a fixed order (names sorted bytewise),
/// calling `f(relative_path, metadata)`. Does not follow symlinks.
pub fn visit(
    root: &Path,
    f: &mut dyn FnMut(&Path, &std::fs::Metadata) -> Result<()>,
) -> Result<()> {
    fn go(
        root: &Path,
        rel: &mut PathBuf,
        f: &mut dyn FnMut(&Path, &std::fs::Metadata) -> Result<()>,
    ) -> Result<()> {
        crate::cancel::check()?;
        let dir = root.join(&*rel);
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<std::io::Result<_>>()
            .with_context(|| format!("reading {}", dir.display()))?;
        names.sort_by(|a, b| a.as_encoded_bytes().cmp(b.as_encoded_bytes()));
        for name in names {
            rel.push(&name);
            let full = root.join(&*rel);
            let md = std::fs::symlink_metadata(&full)
                .with_context(|| format!("stat {}", full.display()))?;
            f(rel, &md)?;
            if md.is_dir() {
                go(root, rel, f)?;
            }
            rel.pop();
        }
        Ok(())
    }
    go(root, &mut PathBuf::new(), f)
}

/// Counts and hashes the tree (reads every file).
pub fn tree_stats(root: &Path) -> Result<TreeStats> {
    let mut h = blake3::Hasher::new();
    let mut s = TreeStats {
        files: 0,
        dirs: 0,
        symlinks: 0,
        executables: 0,
        bytes: 0,
        max_depth: 0,
        tree_hash: String::new(),
    };
    visit(root, &mut |rel, md| {
        let path_bytes = rel.as_os_str().as_encoded_bytes();
        s.max_depth = s.max_depth.max(rel.components().count() as u64);
        let ft = md.file_type();
        if ft.is_dir() {
            s.dirs += 1;
            h.update(b"D");
            h.update(path_bytes);
            h.update(&[0]);
        } else if ft.is_symlink() {
            s.symlinks += 1;
            let target = std::fs::read_link(root.join(rel))?;
            h.update(b"L");
            h.update(path_bytes);
            h.update(&[0]);
            h.update(target.as_os_str().as_encoded_bytes());
            h.update(&[0]);
        } else if ft.is_file() {
            s.files += 1;
            s.bytes += md.len();
            let exec = md.permissions().mode() & 0o111 != 0;
            s.executables += u64::from(exec);
            let mut fh = blake3::Hasher::new();
            let full = root.join(rel);
            fh.update_reader(
                std::fs::File::open(&full).with_context(|| format!("open {}", full.display()))?,
            )
            .with_context(|| format!("reading {}", full.display()))?;
            h.update(if exec { b"X" } else { b"F" });
            h.update(path_bytes);
            h.update(&[0]);
            h.update(&md.len().to_le_bytes());
            h.update(fh.finalize().as_bytes());
        } else {
            h.update(b"O");
            h.update(path_bytes);
            h.update(&[0]);
        }
        Ok(())
    })?;
    s.tree_hash = h.finalize().to_hex().to_string();
    Ok(s)
}

/// Relative paths of all regular files, in walk order.
pub fn regular_files(root: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    visit(root, &mut |rel, md| {
        if md.is_file() {
            out.push(rel.to_path_buf());
        }
        Ok(())
    })?;
    Ok(out)
}

/// Reads every regular file once (brings the tree into the page cache).
pub fn read_all(root: &Path) -> Result<u64> {
    let mut total = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    visit(root, &mut |rel, md| {
        if md.is_file() {
            use std::io::Read;
            let mut f = std::fs::File::open(root.join(rel))?;
            loop {
                let n = f.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                total += n as u64;
            }
        }
        Ok(())
    })?;
    Ok(total)
}

/// Bytes of disk the directory adds: allocated blocks of every inode below it,
/// except files with other hard links outside it (those cost nothing new, as with
/// `git clone --local`). Each inode is counted once.
pub fn disk_added(root: &Path) -> Result<u64> {
    if !root.exists() {
        return Ok(0);
    }
    let mut seen: HashMap<(u64, u64), (u64, u64)> = HashMap::new(); // inode -> (links seen, nlink)
    let mut total = 0u64;
    let top = std::fs::symlink_metadata(root)?;
    total += top.blocks() * 512;
    visit(root, &mut |_, md| {
        let blocks = md.blocks() * 512;
        if md.nlink() > 1 && !md.is_dir() {
            let e = seen.entry((md.dev(), md.ino())).or_insert((0, md.nlink()));
            e.0 += 1;
            if e.0 == e.1 {
                total += blocks; // every link is inside: the tree owns it
            }
        } else {
            total += blocks;
        }
        Ok(())
    })?;
    Ok(total)
}

/// Apparent size of everything below `root` (sum of `st_size` of files).
pub fn apparent_bytes(root: &Path) -> Result<u64> {
    let md = std::fs::symlink_metadata(root)?;
    if !md.is_dir() {
        return Ok(md.len());
    }
    let mut total = 0;
    visit(root, &mut |_, md| {
        if md.is_file() {
            total += md.len();
        }
        Ok(())
    })?;
    Ok(total)
}
