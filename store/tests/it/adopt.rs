//! An import takes over the chunks of a pack an interrupted import left: only complete,
//! sound chunk records, only from a pack no writer holds; the result passes fsck and
//! exports as the source is.

use crate::common;

use std::fs;
use std::path::Path;

use cowspace_store::{ImportOptions, Store, StoreConfig};

fn source(dir: &Path) {
    fs::create_dir_all(dir).unwrap();
    for i in 0..20u64 {
        fs::write(dir.join(format!("f{i}.bin")), common::noise(i + 1, 20_000)).unwrap();
    }
}

/// The one pack file of a root.
fn the_pack(root: &Path) -> std::path::PathBuf {
    let packs: Vec<_> = fs::read_dir(root.join("store/packs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(packs.len(), 1, "{packs:?}");
    packs[0].clone()
}

#[test]
fn an_import_takes_over_the_complete_chunks_of_a_cut_short_orphan_pack() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    source(&src);
    // What a killed import leaves: its pack, cut short in the middle of a record, that
    // no index row names (made here by an import into another root).
    let donor = Store::init(&tmp.path().join("donor"), StoreConfig::default()).unwrap();
    donor.import_dir(&src, &ImportOptions::new()).unwrap();
    let pack = the_pack(&tmp.path().join("donor"));
    let bytes = fs::read(&pack).unwrap();
    let root = tmp.path().join("root");
    let store = Store::init(&root, StoreConfig::default()).unwrap();
    let orphan = root.join("store/packs").join(pack.file_name().unwrap());
    fs::write(&orphan, &bytes[..bytes.len() / 2 + 7]).unwrap();
    let f = store.fsck().unwrap();
    assert_eq!(f.orphan_packs.len(), 1, "{f:?}");

    // A writer still holds it: nothing is taken.
    let held = fs::File::open(&orphan).unwrap();
    held.lock().unwrap();
    let r = store.import_dir(&src, &ImportOptions::new()).unwrap();
    assert!(r.resumed.is_none(), "{r:?}");
    drop(held);
    drop(store);

    let root2 = tmp.path().join("root2");
    let store = Store::init(&root2, StoreConfig::default()).unwrap();
    let orphan = root2.join("store/packs").join(pack.file_name().unwrap());
    fs::write(&orphan, &bytes[..bytes.len() / 2 + 7]).unwrap();
    let mut on_main = ImportOptions::new();
    on_main.ref_name = Some("main".into());
    let r = store.import_dir(&src, &on_main).unwrap();
    assert!(r.resumed.chunks >= 5, "about half the 20 chunks: {r:?}");
    assert!(r.resumed.chunks < 20, "{r:?}");
    assert_eq!(r.resumed.packs, 1);
    assert_eq!(
        r.objects_written as usize,
        20 - r.resumed.chunks as usize + 2,
        "the chunks not taken over, the tree and the snapshot: {r:?}"
    );
    let f = store.fsck().unwrap();
    assert!(f.is_clean() && f.orphan_packs.is_empty(), "{f:?}");
    let out = tmp.path().join("out");
    store.export_dir(&r.snapshot, &out).unwrap();
    assert_eq!(common::listing(&src), common::listing(&out));

    // The cut-short pack is committed with the size of its complete records; gc keeps
    // what the snapshot (on ref main) needs.
    store
        .gc(cowspace_store::gc::GcOptions {
            dry_run: false,
            grace_secs: 0,
            wait: true,
        })
        .unwrap();
    assert!(store.fsck().unwrap().is_clean());
    let out = tmp.path().join("out2");
    store.export_dir(&r.snapshot, &out).unwrap();
    assert_eq!(common::listing(&src), common::listing(&out));
}
