//! Import then export gives back the same tree, byte for byte.

use crate::common;

use std::fs;
use std::os::unix::fs::PermissionsExt;

use common::listing;

use cowspace_store::{ImportOptions, Store, StoreConfig};

#[test]
fn directory_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir_all(src.join("a/b/empty")).unwrap();
    fs::write(src.join("a/hello.txt"), "hello\n").unwrap();
    fs::write(src.join("a/b/run.sh"), "#!/bin/sh\necho hi\n").unwrap();
    fs::set_permissions(src.join("a/b/run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(src.join("empty"), "").unwrap();
    let big: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    fs::write(src.join("big.bin"), &big).unwrap();
    fs::hard_link(src.join("a/hello.txt"), src.join("z-link.txt")).unwrap();
    std::os::unix::fs::symlink("a/hello.txt", src.join("sym")).unwrap();
    std::os::unix::fs::symlink("../../nowhere", src.join("dangling")).unwrap();
    fs::create_dir_all(src.join("node_modules/x")).unwrap();
    fs::write(src.join("node_modules/x/index.js"), "x").unwrap();

    let store = Store::init(&tmp.path().join("root"), StoreConfig::default()).unwrap();
    let r1 = store.import_dir(&src, &ImportOptions::new()).unwrap();
    assert_eq!(r1.excluded, 1, "node_modules is left out by default");
    let out = tmp.path().join("out");
    store.export_dir(&r1.snapshot, &out).unwrap();
    fs::remove_dir_all(src.join("node_modules")).unwrap();
    assert_eq!(listing(&src), listing(&out));

    // Same tree again: same snapshot root, nothing new stored.
    let r2 = store.import_dir(&src, &ImportOptions::new()).unwrap();
    assert_eq!(r1.root, r2.root);
    assert_eq!(
        r2.new_bytes_raw,
        r2.new_bytes_raw.min(1024),
        "only the snapshot object is new"
    );
}
