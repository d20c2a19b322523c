//! The ingest pipeline's concurrent paths — file batches, chunks of one large file
//! compressed by every worker, xattrs read by the workers, index lookups skipped for an
//! empty store — store exactly what one worker stores.

use crate::common;

use std::fs;
use std::path::Path;

use common::listing;

use cowspace_store::browse::Found;
use cowspace_store::codec::{CDC_AVG_BYTES, CDC_MAX_BYTES, CDC_MIN_BYTES};
use cowspace_store::{ChunkId, ContentId, ImportOptions, ImportReport, Store, StoreConfig};

/// Deterministic bytes: text-like runs (compressible) mixed with noise.
fn bytes(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2654435761) | 1;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        if x.is_multiple_of(4) {
            out.extend_from_slice(b"fn main() { println!(\"hello\"); }\n");
        } else {
            out.extend_from_slice(&x.to_le_bytes());
        }
    }
    out.truncate(len);
    out
}

/// Large files sharing blocks (so chunks repeat across files), many small files (more
/// than one batch), files right at the one-chunk limit, empty files, an xattr or two.
/// Returns whether xattrs could be set here.
fn make_tree(src: &Path) -> bool {
    fs::create_dir_all(src.join("big")).unwrap();
    let shared = bytes(900_000, 7);
    let mut a = bytes(2_000_000, 1);
    a.extend_from_slice(&shared);
    let mut b = shared.clone();
    b.extend_from_slice(&bytes(1_500_000, 2));
    fs::write(src.join("big/a.bin"), &a).unwrap();
    fs::write(src.join("big/b.bin"), &b).unwrap();
    fs::write(src.join("big/a-copy.bin"), &a).unwrap();
    fs::write(src.join("big/limit.bin"), bytes(256 * 1024, 3)).unwrap();
    fs::write(src.join("big/limit+1.bin"), bytes(256 * 1024 + 1, 4)).unwrap();
    for d in 0..7 {
        let dir = src.join(format!("src/d{d}/inner"));
        fs::create_dir_all(&dir).unwrap();
        for f in 0..25 {
            let n = (d * 25 + f) as u32;
            // Every 10th file repeats another one's bytes.
            let data = bytes(50 + (n as usize * 997) % 30_000, n % 10 * (n / 10 % 2));
            fs::write(dir.join(format!("f{f}.rs")), data).unwrap();
        }
        fs::write(dir.join("empty"), b"").unwrap();
    }
    xattr::set(
        src.join("src/d3/inner/f4.rs"),
        "user.cowspace-test",
        b"small",
    )
    .is_ok()
        && xattr::set(src.join("big/b.bin"), "user.cowspace-test", b"large").is_ok()
}

fn import(root: &Path, src: &Path, workers: usize) -> (Store, ImportReport) {
    let config = StoreConfig {
        workers,
        ..StoreConfig::default()
    };
    let store = Store::init(root, config).unwrap();
    let report = store.import_dir(src, &ImportOptions::new()).unwrap();
    (store, report)
}

fn leaf(store: &Store, r: &ImportReport, path: &str) -> cowspace_store::Entry {
    match store.lookup(&r.snapshot, path).unwrap() {
        Found::Leaf(e) => e,
        Found::Dir { .. } => panic!("{path} is a directory"),
    }
}

#[test]
fn any_number_of_workers_stores_the_same_snapshot() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let has_xattrs = make_tree(&src);

    let (one, r1) = import(&tmp.path().join("root-1"), &src, 1);
    for workers in [2, 4, 8] {
        let (store, r) = import(&tmp.path().join(format!("root-{workers}")), &src, workers);
        assert_eq!(r.root, r1.root, "{workers} workers: another tree");
        assert_eq!(r.objects_written, r1.objects_written, "{workers} workers");
        assert_eq!(r.new_bytes_raw, r1.new_bytes_raw, "{workers} workers");
        let fsck = store.fsck().unwrap();
        assert!(
            fsck.corrupt.is_empty() && fsck.missing.is_empty(),
            "{fsck:?}"
        );
        assert!(fsck.orphan_packs.is_empty(), "{fsck:?}");
        for name in ["big/a.bin", "big/b.bin", "big/limit+1.bin"] {
            let id = ContentId::from_bytes(leaf(&one, &r1, name).hash);
            assert_eq!(
                store.content_chunks(&id).unwrap(),
                one.content_chunks(&id).unwrap(),
                "{workers} workers: {name}"
            );
        }
        let out = tmp.path().join(format!("out-{workers}"));
        store.export_dir(&r.snapshot, &out).unwrap();
        assert_eq!(listing(&src), listing(&out));
    }

    // A multi-chunk file: content id = BLAKE3 of the whole, chunks = FastCDC's cuts, each
    // named by its own BLAKE3, and a repeated file or chunk stored once.
    for name in ["a.bin", "b.bin", "limit+1.bin"] {
        let data = fs::read(src.join("big").join(name)).unwrap();
        let e = leaf(&one, &r1, &format!("big/{name}"));
        let id = ContentId::from_bytes(e.hash);
        assert_eq!(e.hash, *blake3::hash(&data).as_bytes(), "{name}");
        let expected: Vec<(ChunkId, u32)> =
            fastcdc::v2020::FastCDC::new(&data, CDC_MIN_BYTES, CDC_AVG_BYTES, CDC_MAX_BYTES)
                .map(|c| {
                    let bytes = &data[c.offset..c.offset + c.length];
                    (ChunkId::of(bytes), c.length as u32)
                })
                .collect();
        assert!(expected.len() > 1, "{name} is one chunk");
        assert_eq!(one.content_chunks(&id).unwrap(), expected, "{name}");
        assert_eq!(one.read_content(&id).unwrap(), data, "{name}");
    }
    let limit = leaf(&one, &r1, "big/limit.bin");
    assert_eq!(
        one.content_chunks(&ContentId::from_bytes(limit.hash))
            .unwrap()
            .len(),
        1
    );
    let stats = one.stats().unwrap();
    assert!(stats.dedup_ratio > 1.0, "{stats:?}");

    if has_xattrs {
        let small = leaf(&one, &r1, "src/d3/inner/f4.rs");
        let large = leaf(&one, &r1, "big/b.bin");
        assert_eq!(
            small.xattrs,
            vec![(b"user.cowspace-test".to_vec(), b"small".to_vec())]
        );
        assert_eq!(
            large.xattrs,
            vec![(b"user.cowspace-test".to_vec(), b"large".to_vec())]
        );
    }
}

#[test]
fn a_store_holding_objects_is_asked_before_writing() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    make_tree(&src);
    for workers in [1, 3] {
        let (store, first) = import(&tmp.path().join(format!("root-{workers}")), &src, workers);
        // Another path to the same files: the stat cache does not know it, so every file
        // is read again, and every object is found in the index.
        let other = tmp.path().join(format!("other-{workers}"));
        fs::create_dir_all(&other).unwrap();
        copy_tree(&src, &other);
        let again = store.import_dir(&other, &ImportOptions::new()).unwrap();
        assert_eq!(again.root, first.root);
        assert_eq!(again.files_read, first.files_read);
        assert_eq!(again.objects_written, 1, "only the new snapshot is written");
        let fsck = store.fsck().unwrap();
        assert!(
            fsck.corrupt.is_empty() && fsck.missing.is_empty(),
            "{fsck:?}"
        );
    }
}

fn copy_tree(from: &Path, to: &Path) {
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let (src, dst) = (e.path(), to.join(e.file_name()));
        if e.file_type().unwrap().is_dir() {
            fs::create_dir_all(&dst).unwrap();
            copy_tree(&src, &dst);
        } else {
            fs::copy(&src, &dst).unwrap();
            if let Ok(names) = xattr::list(&src) {
                for n in names {
                    if let Ok(Some(v)) = xattr::get(&src, &n) {
                        let _ = xattr::set(&dst, &n, &v);
                    }
                }
            }
        }
    }
}
