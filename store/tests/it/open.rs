//! A new runtime root opened by many at once: every opener gets the store.

use cowspace_store::{Store, StoreConfig};

/// Threads opening the new root at once.
const OPENERS: usize = 16;

#[test]
fn a_new_root_opened_by_many_at_once_opens_for_all() {
    // Rounds, each on a new root: one round seldom shows a race.
    for _ in 0..10 {
        let tmp = tempfile::tempdir().unwrap();
        drop(Store::init(tmp.path(), StoreConfig::default()).unwrap());
        let barrier = std::sync::Barrier::new(OPENERS);
        let open = || {
            barrier.wait();
            Store::open(tmp.path(), StoreConfig::default()).map(drop)
        };
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..OPENERS).map(|_| s.spawn(open)).collect();
            for h in handles {
                h.join().expect("an opener panicked").expect("open");
            }
        });
    }
}

#[test]
fn a_new_root_is_in_wal_mode_with_nothing_beside_its_index() {
    let tmp = tempfile::tempdir().unwrap();
    drop(Store::init(tmp.path(), StoreConfig::default()).unwrap());
    let store_dir = tmp.path().join("store");
    let conn = rusqlite::Connection::open(store_dir.join("index.db")).unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    drop(conn);
    let names = crate::common::sorted_names(&store_dir);
    let init_files: Vec<_> = names
        .iter()
        .filter(|n| n.to_string_lossy().starts_with("index.db.init"))
        .collect();
    assert!(init_files.is_empty(), "left by init: {init_files:?}");
}

/// A store closed after an import leaves no write-ahead log: the last connection to
/// close is its writer, which copies the log into the index and deletes it. (A log
/// left behind is read again by the next process to open the store, which then copies
/// every page of it into the index once more at its first commit.)
#[test]
fn a_store_closed_after_an_import_leaves_no_write_ahead_log() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir_all(src.join("d")).unwrap();
    for i in 0..200 {
        std::fs::write(src.join(format!("d/f{i}")), format!("{i}\n")).unwrap();
    }
    let root = tmp.path().join("root");
    let store = Store::init(&root, StoreConfig::default()).unwrap();
    let opts = cowspace_store::ImportOptions::new();
    store.import_dir(&src, &opts).unwrap();
    // The reader pool was used (the stat cache, lookups): its connections close too.
    store.import_dir(&src, &opts).unwrap();
    assert!(
        root.join("store/index.db-wal").exists(),
        "no log while open"
    );
    drop(store);
    assert!(
        !root.join("store/index.db-wal").exists(),
        "the write-ahead log outlived the store"
    );
}
