//! Helpers shared by the store's integration tests.
#![allow(dead_code)]

pub mod crashing;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// A canonical listing of a tree: path, kind, mode, size, content or target, link count.
pub fn listing(root: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for n in sorted_names(dir) {
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

/// `len` pseudo-random bytes from `seed` (xorshift): incompressible, and different for
/// every seed.
pub fn noise(seed: u64, len: usize) -> Vec<u8> {
    let step = |x: u64| {
        let x = x ^ (x << 13);
        let x = x ^ (x >> 7);
        x ^ (x << 17)
    };
    let first = step(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    std::iter::successors(Some(first), |&x| Some(step(x)))
        .take(len)
        .map(|x| x as u8)
        .collect()
}

/// The pack files of the store at `root`, sorted.
pub fn pack_files(root: &Path) -> Vec<PathBuf> {
    let mut v: Vec<_> = fs::read_dir(root.join("store/packs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "pack"))
        .collect();
    v.sort();
    v
}

/// The names in directory `dir`, sorted.
pub fn sorted_names(dir: &Path) -> Vec<std::ffi::OsString> {
    let mut names: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    names
}

/// Flips a byte in the middle of object `id`'s stored bytes, in its pack under `root`.
pub fn flip_object(store: &cowspace_store::Store, root: &Path, id: &[u8; 32]) {
    use std::os::unix::fs::FileExt;
    let loc = store.locate(id).unwrap().expect("stored");
    let pack = root
        .join("store/packs")
        .join(format!("{}.pack", loc.pack.as_str()));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&pack)
        .unwrap();
    let at = loc.offset + u64::from(loc.stored_len) / 2;
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).unwrap();
    b[0] ^= 0x5a;
    f.write_all_at(&b, at).unwrap();
}
