//! A damaged object of each kind (chunk, manifest, tree, snapshot, an index row) is
//! found by fsck, located (the snapshots, refs and paths that need it), quarantined by a
//! repair, and — for contents and trees, whose source still has the bytes — rewritten by
//! a plain re-import of that source, after which fsck is clean and every snapshot exports
//! as imported. Nothing a repair does loses a good object.

use crate::common;

use std::fs;
use std::path::PathBuf;

use cowspace_store::browse::Found;
use cowspace_store::gc::GcOptions;
use cowspace_store::{ImportOptions, SnapshotId, Store, StoreConfig};

struct Fixture {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    src: PathBuf,
    other: PathBuf,
    store: Store,
    snap: SnapshotId,
    other_snap: SnapshotId,
}

/// `src` on ref `main`: a multi-chunk file, a small file, a subdirectory; and another
/// tree sharing nothing with it, on ref `other`. The stat cache records every file (a
/// re-import then reads none unless told to).
fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir_all(src.join("dir")).unwrap();
    fs::write(src.join("big.bin"), common::noise(1, 900 * 1024)).unwrap();
    fs::write(src.join("small.txt"), "small\n").unwrap();
    fs::write(src.join("dir/inner.txt"), "inner\n").unwrap();
    let other = tmp.path().join("other");
    fs::create_dir_all(&other).unwrap();
    fs::write(other.join("unrelated.txt"), "unrelated\n").unwrap();
    // The stat cache records only files whose times are more than a second older than
    // the import (`RACY_MARGIN_NS`); `set_modified` moved the ctime to now.
    std::thread::sleep(std::time::Duration::from_millis(1_100));
    let root = tmp.path().join("root");
    let store = Store::init(&root, StoreConfig::default()).unwrap();
    let mut main = ImportOptions::new();
    main.ref_name = Some("main".into());
    let snap = store.import_dir(&src, &main).unwrap().snapshot;
    let mut o = ImportOptions::new();
    o.ref_name = Some("other".into());
    let other_snap = store.import_dir(&other, &o).unwrap().snapshot;
    assert!(store.fsck().unwrap().is_clean());
    Fixture {
        _tmp: tmp,
        root,
        src,
        other,
        store,
        snap,
        other_snap,
    }
}

impl Fixture {
    fn entry_hash(&self, path: &str) -> [u8; 32] {
        match self.store.lookup(&self.snap, path).unwrap() {
            Found::Leaf(e) => e.hash,
            Found::Dir { entry, .. } => entry.expect("not the root").hash,
        }
    }

    /// Flips a byte in the middle of an object's stored bytes.
    fn flip(&self, id: &[u8; 32]) {
        common::flip_object(&self.store, &self.root, id);
    }

    /// Reopens the store (as a new process would) and checks it, expecting `id` among
    /// the corrupt objects, needed by the main snapshot (ref `main`) at `paths`.
    fn found_and_located(&mut self, id: &[u8; 32], what: &str, paths: &[&str]) {
        self.store = Store::open(&self.root, StoreConfig::default()).unwrap();
        let r = self.store.fsck().unwrap();
        let hexid = hex::encode(id);
        assert!(
            r.corrupt.iter().any(|p| p.id == hexid && p.what == what),
            "{what} {hexid} not found: {r:?}"
        );
        let d = r
            .damage
            .iter()
            .find(|d| d.id == hexid)
            .unwrap_or_else(|| panic!("{hexid} not located: {r:?}"));
        assert_eq!(
            d.needed_by.len(),
            1,
            "only the main snapshot needs it: {d:?}"
        );
        let need = &d.needed_by[0];
        assert_eq!(need.snapshot, self.snap, "{d:?}");
        assert_eq!(need.refs, vec!["main".to_string()], "{d:?}");
        assert_eq!(need.paths, paths, "{d:?}");
    }

    /// `fsck --repair`: the object is quarantined.
    fn repair(&self, id: &[u8; 32]) -> cowspace_store::repair::RepairReport {
        let r = self.store.fsck().unwrap();
        let rep = self.store.repair(&r, false).unwrap();
        assert!(rep.quarantined.contains(&hex::encode(id)), "{rep:?}");
        assert!(self.store.suspects().unwrap().contains(id));
        rep
    }

    /// Every snapshot exports as its source is.
    fn exports_intact(&self) {
        for (snap, src, name) in [
            (self.snap, &self.src, "out-main"),
            (self.other_snap, &self.other, "out-other"),
        ] {
            let out = self.root.parent().unwrap().join(name);
            let _ = fs::remove_dir_all(&out);
            self.store.export_dir(&snap, &out).unwrap();
            assert_eq!(common::listing(src), common::listing(&out), "{name}");
        }
    }

    /// A plain re-import of the source (no file touched) rewrites the object; fsck is
    /// clean, nothing is suspect, a gc loses nothing.
    fn reimport_repairs(&self) {
        let mut main = ImportOptions::new();
        main.ref_name = Some("main".into());
        let again = self.store.import_dir(&self.src, &main).unwrap();
        let r = self.store.fsck().unwrap();
        assert!(r.is_clean(), "{r:?}");
        assert!(r.suspects.is_empty(), "{r:?}");
        self.exports_intact();
        self.store
            .gc(GcOptions {
                dry_run: false,
                grace_secs: 0,
                wait: false,
            })
            .unwrap();
        let r = self.store.fsck().unwrap();
        assert!(r.is_clean() && r.orphan_packs.is_empty(), "{r:?}");
        self.exports_intact();
        let _ = again;
    }
}

fn chunk_of_big(f: &Fixture) -> [u8; 32] {
    let content = cowspace_store::ContentId::from_bytes(f.entry_hash("big.bin"));
    let chunks = f.store.content_chunks(&content).unwrap();
    assert!(chunks.len() > 1, "big.bin is several chunks");
    *chunks[1].0.as_bytes()
}

#[test]
fn a_corrupt_chunk_is_located_quarantined_and_rewritten_by_a_reimport() {
    let mut f = fixture();
    let id = chunk_of_big(&f);
    f.flip(&id);
    f.found_and_located(&id, "chunk", &["big.bin"]);

    // Without a repair, a re-import dedups against the damaged chunk (its stat-cache
    // row says the file is unchanged) and the store stays damaged.
    f.store.import_dir(&f.src, &ImportOptions::new()).unwrap();
    assert!(!f.store.fsck().unwrap().is_clean());

    let rep = f.repair(&id);
    assert_eq!(rep.stat_cache_rows_dropped, 1, "big.bin's row: {rep:?}");
    f.reimport_repairs();
}

#[test]
fn a_small_files_corrupt_chunk_is_located_at_its_path_and_rewritten() {
    let mut f = fixture();
    let id = f.entry_hash("dir/inner.txt");
    f.flip(&id);
    f.found_and_located(&id, "chunk", &["dir/inner.txt"]);
    f.repair(&id);
    f.reimport_repairs();
}

#[test]
fn a_corrupt_manifest_is_located_quarantined_and_rewritten_by_a_reimport() {
    let mut f = fixture();
    let id = f.entry_hash("big.bin");
    assert_eq!(
        f.store.locate(&id).unwrap().unwrap().kind,
        cowspace_store::index::ObjectKind::Manifest
    );
    f.flip(&id);
    f.found_and_located(&id, "manifest", &["big.bin"]);
    f.repair(&id);
    f.reimport_repairs();
}

#[test]
fn a_corrupt_tree_is_located_quarantined_and_rewritten_by_a_reimport() {
    let mut f = fixture();
    let id = f.entry_hash("dir");
    f.flip(&id);
    f.found_and_located(&id, "tree", &["dir"]);
    f.repair(&id);
    f.reimport_repairs();
}

#[test]
fn a_corrupt_index_row_is_located_quarantined_and_rewritten_by_a_reimport() {
    let mut f = fixture();
    // small.txt's row points at the bytes of dir/inner.txt (same length, other hash).
    let id = f.entry_hash("small.txt");
    let elsewhere = f
        .store
        .locate(&f.entry_hash("dir/inner.txt"))
        .unwrap()
        .unwrap();
    {
        let db = rusqlite::Connection::open(f.root.join("store/index.db")).unwrap();
        let n = db
            .execute(
                "UPDATE objects SET pack = ?2, offset = ?3 WHERE id = ?1",
                rusqlite::params![&id[..], elsewhere.pack.as_str(), elsewhere.offset as i64],
            )
            .unwrap();
        assert_eq!(n, 1);
    }
    f.found_and_located(&id, "chunk", &["small.txt"]);
    f.repair(&id);
    f.reimport_repairs();
}

#[test]
fn a_corrupt_snapshot_is_located_at_its_refs_and_the_repair_says_what_to_do() {
    let mut f = fixture();
    let id = *f.snap.as_bytes();
    f.flip(&id);
    f.found_and_located(&id, "snapshot", &[]);
    let r = f.store.fsck().unwrap();
    let d = r.damage.iter().find(|d| d.id == hex::encode(id)).unwrap();
    assert!(d.repair.contains("ref"), "{d:?}");
    f.repair(&id);
    // gc refuses while a snapshot cannot be read (what it needs is unknown), rather
    // than delete what only it needs; the other snapshot is untouched.
    let err = f
        .store
        .gc(GcOptions {
            dry_run: false,
            grace_secs: 0,
            wait: false,
        })
        .unwrap_err();
    assert_eq!(err.kind(), cowspace_store::ErrorKind::Corrupt, "{err}");
    let out = f.root.parent().unwrap().join("out-other");
    f.store.export_dir(&f.other_snap, &out).unwrap();
    assert_eq!(common::listing(&f.other), common::listing(&out));
    assert_eq!(
        f.store.suspects().unwrap().into_iter().collect::<Vec<_>>(),
        vec![id]
    );
}

#[test]
fn a_store_without_the_suspects_table_opens_and_repairs() {
    // Format 1 as written before repairs existed: no `suspects` table.
    let mut f = fixture();
    drop(std::mem::replace(
        &mut f.store,
        Store::open(&f.root, StoreConfig::default()).unwrap(),
    ));
    {
        let db = rusqlite::Connection::open(f.root.join("store/index.db")).unwrap();
        db.execute_batch("DROP TABLE suspects").unwrap();
    }
    let id = f.entry_hash("small.txt");
    f.flip(&id);
    f.found_and_located(&id, "chunk", &["small.txt"]);
    f.repair(&id);
    f.reimport_repairs();
}
