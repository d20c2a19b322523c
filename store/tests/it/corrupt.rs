//! Corrupt data is never served: every read path refuses it, naming the object.

use std::fs;
use std::os::unix::fs::FileExt;

use cowspace_store::{ErrorKind, ImportOptions, Store, StoreConfig};

use crate::common::pack_files as packs;

#[test]
fn a_flipped_byte_is_found_by_fsck_and_refused_by_every_read() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir(&src).unwrap();
    // Incompressible content, so the flipped byte lands in raw chunk bytes.
    let mut x = 88172645463325252u64;
    let data: Vec<u8> = (0..3_000_000u32)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    fs::write(src.join("big.bin"), &data).unwrap();
    fs::write(src.join("small.txt"), "small\n").unwrap();
    let root = tmp.path().join("root");
    let store = Store::init(&root, StoreConfig::default()).unwrap();
    let r = store.import_dir(&src, &ImportOptions::new()).unwrap();
    assert!(store.fsck().unwrap().is_clean());

    let pack = packs(&root)
        .into_iter()
        .max_by_key(|p| fs::metadata(p).unwrap().len())
        .unwrap();
    let mut rw = fs::OpenOptions::new();
    let f = rw.read(true).write(true).open(&pack).unwrap();
    let mut b = [0u8; 1];
    let at = 1_000_000;
    f.read_exact_at(&mut b, at).unwrap();
    b[0] ^= 0x40;
    f.write_all_at(&b, at).unwrap();
    drop(f);

    let store = Store::open(&root, StoreConfig::default()).unwrap();
    let report = store.fsck().unwrap();
    assert!(!report.is_clean());
    assert_eq!(report.corrupt.len(), 1, "{report:?}");
    assert_eq!(report.corrupt[0].what, "chunk");
    // The damaged chunk also makes the file's whole content fail.
    assert!(report.corrupt[0].why.contains("hashes to"), "{report:?}");

    let out = tmp.path().join("out");
    let err = store.export_dir(&r.snapshot, &out).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
    assert!(err.to_string().contains(&report.corrupt[0].id), "{err}");
    assert!(!out.exists(), "nothing half-exported");
    let leftovers: Vec<_> = fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("cowspace-tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let err = store
        .export_tar(&r.snapshot, &tmp.path().join("out.tar"))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
    assert!(!tmp.path().join("out.tar").exists());

    let big = match store.lookup(&r.snapshot, "big.bin").unwrap() {
        cowspace_store::browse::Found::Leaf(e) => e.content().unwrap(),
        _ => panic!("big.bin is a file"),
    };
    let err = store.read_content(&big).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt);
    let err = store.blob_cache().ensure(&big).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt);
    assert!(
        !store.blob_cache().path(&big).exists(),
        "no blob from corrupt content"
    );
    // The undamaged file still reads.
    match store.lookup(&r.snapshot, "small.txt").unwrap() {
        cowspace_store::browse::Found::Leaf(e) => {
            assert_eq!(
                store.read_content(&e.content().unwrap()).unwrap(),
                b"small\n"
            )
        }
        _ => panic!("small.txt is a file"),
    }
}
