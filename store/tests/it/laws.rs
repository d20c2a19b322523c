//! Laws of the store, checked on random inputs.

use crate::common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use cowspace_store::{ImportOptions, Store, StoreConfig};
use proptest::prelude::*;

/// One thing to create in a random tree.
#[derive(Debug, Clone)]
enum Op {
    File {
        dir: usize,
        name: String,
        len: usize,
        seed: u8,
        exec: bool,
    },
    Dir {
        parent: usize,
        name: String,
    },
    Symlink {
        dir: usize,
        name: String,
        target: String,
    },
    Hardlink {
        dir: usize,
        name: String,
        to_file: usize,
    },
}

fn name() -> impl Strategy<Value = String> {
    // Spaces, unicode, dots and dashes; never "." or "..".
    "[a-zA-Z0-9 _.é漢-]{1,16}".prop_filter("not . or ..", |n| n != "." && n != "..")
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..8usize, name(), prop_oneof![3 => 0..200usize, 2 => 0..5000usize, 1 => 200_000..700_000usize], any::<u8>(), any::<bool>())
            .prop_map(|(dir, name, len, seed, exec)| Op::File { dir, name, len, seed, exec }),
        2 => (0..8usize, name()).prop_map(|(parent, name)| Op::Dir { parent, name }),
        1 => (0..8usize, name(), prop_oneof![name(), Just("../x".to_string()), Just("/etc/hostname".to_string())])
            .prop_map(|(dir, name, target)| Op::Symlink { dir, name, target }),
        1 => (0..8usize, name(), 0..8usize).prop_map(|(dir, name, to_file)| Op::Hardlink { dir, name, to_file }),
    ]
}

fn content(len: usize, seed: u8) -> Vec<u8> {
    let mut x = u64::from(seed).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Compressible-ish: a small alphabet.
            b"abcdefgh \n"[(x % 10) as usize]
        })
        .collect()
}

/// Applies the ops under `root`; creations that collide are skipped.
fn build(root: &Path, ops: &[Op]) {
    let mut dirs = vec![root.to_path_buf()];
    let mut files = vec![];
    for op in ops {
        match op {
            Op::Dir { parent, name } => {
                let p = dirs[parent % dirs.len()].join(name);
                if fs::create_dir(&p).is_ok() {
                    dirs.push(p);
                }
            }
            Op::File {
                dir,
                name,
                len,
                seed,
                exec,
            } => {
                let p = dirs[dir % dirs.len()].join(name);
                if fs::symlink_metadata(&p).is_err() {
                    fs::write(&p, content(*len, *seed)).unwrap();
                    let mode = if *exec { 0o755 } else { 0o644 };
                    fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
                    files.push(p);
                }
            }
            Op::Symlink { dir, name, target } => {
                let p = dirs[dir % dirs.len()].join(name);
                let _ = std::os::unix::fs::symlink(target, &p);
            }
            Op::Hardlink { dir, name, to_file } => {
                if !files.is_empty() {
                    let p = dirs[dir % dirs.len()].join(name);
                    let _ = fs::hard_link(&files[to_file % files.len()], &p);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Import then export gives back the same tree: names, kinds, modes, contents,
    /// symlink targets and hard-link counts.
    #[test]
    fn import_export_is_identity(ops in proptest::collection::vec(op(), 0..40), deep in 0..120usize) {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        fs::create_dir(&src).unwrap();
        build(&src, &ops);
        let mut d = src.clone();
        // '+' is outside `name()`'s alphabet: a generated file can never be named like a
        // directory of the chain.
        for i in 0..deep {
            d = d.join(format!("d+{i}"));
        }
        fs::create_dir_all(&d).unwrap();
        let store = Store::init(&tmp.path().join("root"), StoreConfig::default()).unwrap();
        let mut opts = ImportOptions::new();
        opts.default_excludes = false;
        let r = store.import_dir(&src, &opts).unwrap();
        let out = tmp.path().join("out");
        store.export_dir(&r.snapshot, &out).unwrap();
        prop_assert_eq!(common::listing(&src), common::listing(&out));
        // And the export imports to the same root tree.
        let r2 = store.import_dir(&out, &opts).unwrap();
        prop_assert_eq!(r.root, r2.root);
    }

    /// An insertion into a large file stores only the chunks around it.
    #[test]
    fn chunk_boundaries_survive_an_insertion(seed in any::<u8>(), at in 0.0f64..1.0, insert in proptest::collection::vec(any::<u8>(), 1..3000)) {
        let tmp = tempfile::tempdir().unwrap();
        let mut x = u64::from(seed) + 7;
        let data: Vec<u8> = (0..4 * 1024 * 1024).map(|_| {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17; x as u8
        }).collect();
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        fs::create_dir(&a).unwrap();
        fs::create_dir(&b).unwrap();
        fs::write(a.join("big"), &data).unwrap();
        let pos = (at * data.len() as f64) as usize;
        let mut edited = data[..pos].to_vec();
        edited.extend_from_slice(&insert);
        edited.extend_from_slice(&data[pos..]);
        fs::write(b.join("big"), &edited).unwrap();
        let store = Store::init(&tmp.path().join("root"), StoreConfig::default()).unwrap();
        store.import_dir(&a, &ImportOptions::new()).unwrap();
        let r = store.import_dir(&b, &ImportOptions::new()).unwrap();
        // At most the chunk holding the insertion and its neighbours (max chunk 256 KiB),
        // plus the manifest, tree and snapshot.
        prop_assert!(r.new_bytes_raw < 3 * 256 * 1024 + 8192, "{} new bytes of {}", r.new_bytes_raw, edited.len());
    }
}
