//! The stat cache keeps each file's xattrs: a re-import of an unchanged tree reads
//! neither contents nor xattrs and makes the same tree; a changed xattr (which changes
//! the file's ctime) is seen; a row without xattrs, as older programs write them, and a
//! store whose stat cache has no xattrs column still import to the same tree.

use std::fs;
use std::path::Path;

use cowspace_store::{ImportOptions, Store, StoreConfig};

/// A small tree with xattrs on a file and on a directory.
fn make_tree(src: &Path) {
    fs::create_dir_all(src.join("a/b")).unwrap();
    fs::write(src.join("a/b/x"), "x\n").unwrap();
    fs::write(src.join("a/y"), "y\n").unwrap();
    fs::write(src.join("z"), "z\n").unwrap();
    xattr::set(src.join("a/b/x"), "user.one", b"1").unwrap();
    xattr::set(src.join("a/b/x"), "user.two", b"").unwrap();
    xattr::set(src.join("a"), "user.dir", b"d").unwrap();
}

/// Lets the tree's changes grow old enough for the stat cache to record them (a file
/// changed within a second of an import's start is not recorded).
fn settle() {
    std::thread::sleep(std::time::Duration::from_millis(1100));
}

fn import(store: &Store, src: &Path) -> cowspace_store::ImportReport {
    store.import_dir(src, &ImportOptions::new()).unwrap()
}

/// One column of every stat-cache row, in path order.
fn column<T: rusqlite::types::FromSql>(root: &Path, name: &str) -> Vec<T> {
    let conn = rusqlite::Connection::open(root.join("store/index.db")).unwrap();
    let mut st = conn
        .prepare(&format!("SELECT {name} FROM statcache ORDER BY path"))
        .unwrap();
    st.query_map([], |r| r.get(0))
        .unwrap()
        .map(|r| r.unwrap())
        .collect()
}

fn xattrs_column(root: &Path) -> Vec<Option<Vec<u8>>> {
    column(root, "xattrs")
}

#[test]
fn cached_xattrs_give_the_same_tree_and_a_changed_xattr_is_seen() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    make_tree(&src);
    settle();
    let root = tmp.path().join("root");
    let store = Store::init(&root, StoreConfig::default()).unwrap();
    let first = import(&store, &src);
    let column = xattrs_column(&root);
    assert_eq!(column.len(), 3);
    assert!(column.iter().all(Option::is_some), "{column:?}");

    let again = import(&store, &src);
    assert_eq!((again.files_read, again.root), (0, first.root));
    let x = store.tree(&again.root).unwrap();
    let a = x.entries.iter().find(|e| e.name == b"a").unwrap();
    assert_eq!(a.xattrs, vec![(b"user.dir".to_vec(), b"d".to_vec())]);

    // A changed xattr: the ctime moves, the file's row does not match, the change is in.
    xattr::set(src.join("a/b/x"), "user.one", b"changed").unwrap();
    let changed = import(&store, &src);
    assert_ne!(changed.root, first.root);
    assert_eq!(changed.files_read, 1);
    let out = tmp.path().join("out");
    store.export_dir(&changed.snapshot, &out).unwrap();
    assert_eq!(
        xattr::get(out.join("a/b/x"), "user.one").unwrap().unwrap(),
        b"changed"
    );
    // A removed one too.
    settle();
    import(&store, &src);
    xattr::remove(src.join("a/b/x"), "user.two").unwrap();
    let removed = import(&store, &src);
    let out = tmp.path().join("out2");
    store.export_dir(&removed.snapshot, &out).unwrap();
    assert_eq!(xattr::get(out.join("a/b/x"), "user.two").unwrap(), None);
    assert!(xattr::get(out.join("a/b/x"), "user.one").unwrap().is_some());
}

#[test]
fn rows_without_xattrs_and_a_cache_without_the_column_import_the_same_tree() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    make_tree(&src);
    settle();
    let root = tmp.path().join("root");
    let first = {
        let store = Store::init(&root, StoreConfig::default()).unwrap();
        import(&store, &src)
    };
    // Rows as an older program writes them: no xattrs. A hit for the content only, and
    // the rows get their xattrs.
    let conn = rusqlite::Connection::open(root.join("store/index.db")).unwrap();
    conn.execute_batch("UPDATE statcache SET xattrs = NULL")
        .unwrap();
    let store = Store::open(&root, StoreConfig::default()).unwrap();
    let again = import(&store, &src);
    assert_eq!((again.files_read, again.root), (0, first.root));
    assert!(xattrs_column(&root).iter().all(Option::is_some));
    drop(store);

    // A stat cache made before the column: opening adds it, and nothing is read again.
    conn.execute_batch("ALTER TABLE statcache DROP COLUMN xattrs")
        .unwrap();
    let store = Store::open(&root, StoreConfig::default()).unwrap();
    let old = import(&store, &src);
    assert_eq!((old.files_read, old.root), (0, first.root));
    assert!(xattrs_column(&root).iter().all(Option::is_some));
    // (Opening again finds the column there.)
    drop(store);
    Store::open(&root, StoreConfig::default()).unwrap();
}

fn cached_paths(root: &Path) -> Vec<String> {
    column::<Vec<u8>>(root, "path")
        .into_iter()
        .map(|p| String::from_utf8(p).unwrap())
        .collect()
}

/// The rows of files gone from the tree go with the re-import that no longer finds
/// them; every path still there keeps its row, files in directories deep in the tree
/// (listed ahead of the walk) included. A hard-linked file has one row, its first path's
/// (the other paths take their content from it).
#[test]
fn rows_go_with_the_files_gone_and_every_path_still_there_keeps_its_row() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    make_tree(&src);
    for d in 0..40 {
        let deep = src.join(format!("d{d:02}/e/f"));
        fs::create_dir_all(&deep).unwrap();
        fs::write(deep.join("g"), format!("{d}\n")).unwrap();
    }
    fs::hard_link(src.join("z"), src.join("a/z-link")).unwrap();
    settle();
    let root = tmp.path().join("root");
    let store = Store::init(&root, StoreConfig::default()).unwrap();
    let first = import(&store, &src);
    let all = cached_paths(&root);
    assert_eq!(all.len(), 3 + 40, "{all:?}");
    assert!(all.contains(&"z".to_string()), "{all:?}");

    // Unchanged: nothing read, the same tree, every row kept.
    let again = import(&store, &src);
    assert_eq!((again.files_read, again.root), (0, first.root));
    assert_eq!(cached_paths(&root), all);

    // A file and a whole directory gone: their rows go, the rest stay.
    fs::remove_file(src.join("a/y")).unwrap();
    fs::remove_dir_all(src.join("d07")).unwrap();
    let gone = import(&store, &src);
    assert_eq!(gone.files_read, 0);
    let left = cached_paths(&root);
    let expect: Vec<String> = all
        .iter()
        .filter(|p| !["a/y", "d07/e/f/g"].contains(&p.as_str()))
        .cloned()
        .collect();
    assert_eq!(left, expect);
}
