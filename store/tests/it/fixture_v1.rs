//! A store written by the first code that writes format 1 as it is today
//! (`tests/fixtures/v1`, see its README) opens with today's code: fsck is clean, the
//! refs and snapshots are as written, and every snapshot exports as the tree that was
//! imported, file by file.

use std::fs;
use std::path::{Path, PathBuf};

use cowspace_store::{SnapshotId, Store, StoreConfig};

use crate::common;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1")
}

/// Unpacks the fixture's store (`root.tar.zst`, a tar of the root as the first release
/// left it) into `dir`, giving `dir/root`.
fn unpack(dir: &Path) {
    let file = fs::File::open(fixture().join("root.tar.zst")).unwrap();
    let tar = zstd::Decoder::new(file).unwrap();
    tar::Archive::new(tar).unpack(dir).unwrap();
}

/// `snapshots.txt`: (name, snapshot, parent, message) per line.
fn recorded() -> Vec<(String, SnapshotId, Option<SnapshotId>, String)> {
    let text = fs::read_to_string(fixture().join("snapshots.txt")).unwrap();
    text.lines()
        .map(|l| {
            let mut f = l.splitn(4, ' ');
            let (name, id, parent, message) = (
                f.next().unwrap(),
                f.next().unwrap(),
                f.next().unwrap(),
                f.next().unwrap(),
            );
            let parent = (parent != "-").then(|| parent.parse().unwrap());
            (name.into(), id.parse().unwrap(), parent, message.into())
        })
        .collect()
}

#[test]
fn a_store_of_the_first_release_reads_back_as_it_was_written() {
    let tmp = tempfile::tempdir().unwrap();
    // Opening may add the tables later versions of format 1 keep: only in this copy.
    unpack(tmp.path());
    let root = tmp.path().join("root");
    let store = Store::open(&root, StoreConfig::default()).unwrap();
    let version: String = rusqlite::Connection::open(root.join("store/index.db"))
        .unwrap()
        .query_row(
            "SELECT value FROM meta WHERE key = 'format_version'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(version, "2", "opening upgrades the store to format 2");
    let report = store.fsck().unwrap();
    assert!(
        report.is_clean() && report.orphan_packs.is_empty(),
        "{report:?}"
    );

    let snaps = recorded();
    assert_eq!(snaps.len(), 2);
    let mut ids: Vec<SnapshotId> = snaps.iter().map(|s| s.1).collect();
    ids.sort();
    let mut held = store.snapshot_ids().unwrap();
    held.sort();
    assert_eq!(held, ids);
    assert_eq!(store.get_ref("main").unwrap(), Some(snaps[1].1));
    for (name, id, parent, message) in &snaps {
        let snap = store.snapshot(id).unwrap();
        assert_eq!(&snap.message, message, "{name}");
        assert_eq!(
            snap.parents,
            parent.iter().copied().collect::<Vec<_>>(),
            "{name}"
        );
        let out = tmp.path().join(name);
        store.export_dir(id, &out).unwrap();
        let expected = fs::read_to_string(fixture().join(format!("expected/{name}.txt"))).unwrap();
        let got = common::listing(&out).join("\n") + "\n";
        assert_eq!(got, expected, "{name}");
    }

    // The contents themselves, as the first release was given them.
    let first = tmp.path().join("first");
    let second = tmp.path().join("second");
    assert_eq!(
        fs::read_to_string(first.join("README.md")).unwrap(),
        "hello from format 1\n"
    );
    assert_eq!(
        fs::read_to_string(second.join("README.md")).unwrap(),
        "hello again\n"
    );
    assert_eq!(
        xattr::get(first.join("README.md"), "user.fixture").unwrap(),
        Some(b"format 1".to_vec())
    );
    assert_eq!(
        fs::read(first.join("zeros.bin")).unwrap(),
        vec![0u8; 1 << 20]
    );
    assert_eq!(
        fs::read_link(first.join("link")).unwrap(),
        Path::new("README.md")
    );
    assert!(!second.join("empty").exists() && first.join("empty").is_file());
    assert_eq!(
        fs::read_to_string(second.join("sub/new.txt")).unwrap(),
        "new in the second\n"
    );

    // The upgraded store takes groups beside its format-1 records.
    let more = tmp.path().join("more");
    fs::create_dir(&more).unwrap();
    for i in 0..50 {
        fs::write(
            more.join(format!("{i}.txt")),
            format!("{i}\n").repeat(i + 1),
        )
        .unwrap();
    }
    let r = store
        .import_dir(&more, &cowspace_store::ImportOptions::new())
        .unwrap();
    assert!(store.fsck().unwrap().is_clean());
    let out = tmp.path().join("more-out");
    store.export_dir(&r.snapshot, &out).unwrap();
    assert_eq!(common::listing(&more), common::listing(&out));
    drop(store);
    // Opened again, as format 2 now, it reads the same.
    let again = Store::open(&root, StoreConfig::default()).unwrap();
    again
        .export_dir(&snaps[0].1, &tmp.path().join("first-again"))
        .unwrap();
    assert_eq!(
        common::listing(&tmp.path().join("first")),
        common::listing(&tmp.path().join("first-again"))
    );
}
