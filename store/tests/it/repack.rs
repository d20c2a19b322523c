//! Compaction: many tiny imports make many packs; `repack` (and `gc`) merge them into
//! few, every snapshot exporting as imported and fsck clean; a reader whose object moved
//! between its lookup and its read still reads it; a running import keeps repack out.

use crate::common;

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use cowspace_store::gc::GcOptions;
use cowspace_store::pack::{LocalPacks, PackBackend, PackId, PackSink};
use cowspace_store::repack::RepackOptions;
use cowspace_store::{ErrorKind, ImportOptions, SnapshotId, Store, StoreConfig};

/// Tiny imports, each its own pack.
const TINY_IMPORTS: usize = 40;

/// `TINY_IMPORTS` imports of a small tree that changes one file each time, all on ref
/// `main`: (snapshot, a copy of the source as imported).
fn tiny_imports(store: &Store, tmp: &Path) -> Vec<(SnapshotId, PathBuf)> {
    let src = tmp.join("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("same.txt"), "the same in every import\n").unwrap();
    let mut out = Vec::new();
    for i in 0..TINY_IMPORTS {
        fs::write(src.join("n.txt"), format!("import {i}\n")).unwrap();
        let mut o = ImportOptions::new();
        o.ref_name = Some("main".into());
        let snap = store.import_dir(&src, &o).unwrap().snapshot;
        let copy = tmp.join(format!("copy-{i}"));
        fs::create_dir_all(&copy).unwrap();
        for f in ["same.txt", "n.txt"] {
            fs::copy(src.join(f), copy.join(f)).unwrap();
        }
        out.push((snap, copy));
    }
    out
}

fn exports_intact(store: &Store, snaps: &[(SnapshotId, PathBuf)], tmp: &Path, tag: &str) {
    for (i, (snap, copy)) in snaps.iter().enumerate() {
        let out = tmp.join(format!("out-{tag}-{i}"));
        store.export_dir(snap, &out).unwrap();
        assert_eq!(common::listing(copy), common::listing(&out), "{tag} {i}");
    }
}

#[test]
fn repack_merges_the_packs_of_many_tiny_imports() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let store = Store::init(&root, StoreConfig::default()).unwrap();
    let snaps = tiny_imports(&store, tmp.path());
    assert_eq!(common::pack_files(&root).len(), TINY_IMPORTS);

    let dry = store
        .repack(RepackOptions {
            dry_run: true,
            wait: false,
        })
        .unwrap();
    assert_eq!(dry.packs.len(), TINY_IMPORTS, "{dry:?}");
    assert!(dry.packs.iter().all(|p| p.why.contains("small")), "{dry:?}");
    assert_eq!(
        common::pack_files(&root).len(),
        TINY_IMPORTS,
        "a dry run rewrites nothing"
    );

    let r = store.repack(RepackOptions::default()).unwrap();
    assert_eq!(r.packs_before, TINY_IMPORTS as u64, "{r:?}");
    assert_eq!(r.packs_after, 1, "{r:?}");
    assert!(r.bytes_after <= r.bytes_before, "{r:?}");
    assert!(r.kept_damaged.is_empty());
    assert_eq!(
        common::pack_files(&root).len(),
        1,
        "the old pack files are gone"
    );
    let f = store.fsck().unwrap();
    assert!(f.is_clean() && f.orphan_packs.is_empty(), "{f:?}");
    exports_intact(&store, &snaps, tmp.path(), "repack");

    // Once compact, a repack has nothing to do.
    let again = store.repack(RepackOptions::default()).unwrap();
    assert!(again.packs.is_empty(), "{again:?}");
    assert_eq!(again.objects_moved, 0);
}

#[test]
fn gc_merges_small_packs_too() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let store = Store::init(&root, StoreConfig::default()).unwrap();
    let snaps = tiny_imports(&store, tmp.path());
    let r = store.gc(GcOptions::default()).unwrap();
    assert_eq!(r.packs_rewritten, TINY_IMPORTS as u64, "{r:?}");
    assert_eq!(common::pack_files(&root).len(), 1);
    assert!(store.fsck().unwrap().is_clean());
    exports_intact(&store, &snaps, tmp.path(), "gc");
}

#[test]
fn repack_refuses_while_an_import_holds_the_store() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::init(&tmp.path().join("root"), StoreConfig::default()).unwrap();
    let held = cowspace_store::lock::StoreLock::shared(&store).unwrap();
    let err = store.repack(RepackOptions::default()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Busy);
    drop(held);
    store.repack(RepackOptions::default()).unwrap();
}

/// Local packs, with a hook run once, at the first read, before the read itself.
struct HookedPacks {
    inner: LocalPacks,
    hook: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl PackBackend for HookedPacks {
    fn create(&self, pack: &PackId) -> io::Result<Box<dyn PackSink>> {
        self.inner.create(pack)
    }
    fn read_at(&self, pack: &PackId, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let hook = self.hook.lock().unwrap().take();
        if let Some(h) = hook {
            h();
        }
        self.inner.read_at(pack, offset, buf)
    }
    fn len(&self, pack: &PackId) -> io::Result<u64> {
        self.inner.len(pack)
    }
    fn remove(&self, pack: &PackId) -> io::Result<()> {
        self.inner.remove(pack)
    }
    fn list(&self) -> io::Result<Vec<PackId>> {
        self.inner.list()
    }
    fn sync_dir(&self) -> io::Result<()> {
        self.inner.sync_dir()
    }
    fn location(&self, pack: &PackId) -> String {
        self.inner.location(pack)
    }
}

#[test]
fn a_reader_whose_object_moved_after_its_lookup_reads_it_where_it_is_now() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let store = Store::init(&root, StoreConfig::default()).unwrap();
    let snaps = tiny_imports(&store, tmp.path());
    drop(store);

    // The reader's first pack read comes after its lookup; the repack (another opener
    // of the root, as another process) runs in between and deletes the pack it found.
    let repack_root = root.clone();
    let backend = Arc::new(HookedPacks {
        inner: LocalPacks::new(root.join("store/packs")),
        hook: Mutex::new(Some(Box::new(move || {
            let other = Store::open(&repack_root, StoreConfig::default()).unwrap();
            let r = other.repack(RepackOptions::default()).unwrap();
            assert_eq!(r.packs_after, 1, "{r:?}");
        }))),
    });
    let reader = Store::open_with_backend(&root, StoreConfig::default(), backend).unwrap();
    let (snap, copy) = &snaps[0];
    let out = tmp.path().join("out-moved");
    reader.export_dir(snap, &out).unwrap();
    assert_eq!(common::listing(copy), common::listing(&out));
    assert_eq!(common::pack_files(&root).len(), 1, "the repack ran");
    exports_intact(&reader, &snaps, tmp.path(), "after");
}

#[test]
fn gc_removes_a_pack_file_its_writer_left_unnamed() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let store = Store::init(&root, StoreConfig::default()).unwrap();
    // What a writer killed between creating its new pack and naming it leaves.
    let unnamed = root.join("store/packs/0123456789abcdef.pack.new");
    fs::write(&unnamed, b"").unwrap();
    // Waiting for the store lock: a child another test starts (`git`) holds a copy of
    // every descriptor between its fork and its exec.
    let wait = GcOptions {
        wait: true,
        ..GcOptions::default()
    };
    let r = store.gc(wait).unwrap();
    assert_eq!(r.unnamed_packs_removed, 1, "{r:?}");
    assert!(!unnamed.exists());
    // One a live writer holds (locked) stays.
    let held = fs::File::create(&unnamed).unwrap();
    held.lock().unwrap();
    let r = store.gc(wait).unwrap();
    assert_eq!(r.unnamed_packs_removed, 0, "{r:?}");
    assert!(unnamed.exists());
}

/// Pack files of `root` this process holds open that are deleted.
fn deleted_packs_held(root: &Path) -> Vec<String> {
    let packs = root.join("store/packs").display().to_string();
    fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| fs::read_link(e.ok()?.path()).ok())
        .map(|t| t.display().to_string())
        .filter(|t| t.starts_with(&packs) && t.ends_with("(deleted)"))
        .collect()
}

#[test]
fn a_reader_lets_go_of_the_packs_a_repack_elsewhere_deleted() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let store = Store::init(&root, StoreConfig::default()).unwrap();
    let snaps = tiny_imports(&store, tmp.path());
    drop(store);
    let reader = Store::open(&root, StoreConfig::default()).unwrap();
    // Every pack read once: the reader holds them all open.
    exports_intact(&reader, &snaps, tmp.path(), "before");
    Store::open(&root, StoreConfig::default())
        .unwrap()
        .repack(RepackOptions::default())
        .unwrap();
    assert!(
        !deleted_packs_held(&root).is_empty(),
        "the reader holds the old packs"
    );
    // Its next read opens the new pack and lets the deleted ones go.
    exports_intact(&reader, &snaps[..1], tmp.path(), "after");
    assert_eq!(deleted_packs_held(&root), Vec::<String>::new());
}

/// A repack never copies an object it could not verify, nor drops the pack holding it:
/// that pack stays (named in `kept_damaged`), fsck still names the object, and every
/// other snapshot exports as imported from the merged packs.
#[test]
fn repack_keeps_a_pack_holding_an_object_it_cannot_verify() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let store = Store::init(&root, StoreConfig::default()).unwrap();
    let mut snaps = tiny_imports(&store, tmp.path());
    // Damage the one object only the fifth import stored: its `n.txt`.
    let (bad_snap, _) = snaps.remove(5);
    let id = match store.lookup(&bad_snap, "n.txt").unwrap() {
        cowspace_store::browse::Found::Leaf(e) => e.hash,
        other => panic!("n.txt is not a file: {other:?}"),
    };
    let loc = store.locate(&id).unwrap().expect("stored");
    let pack = root
        .join("store/packs")
        .join(format!("{}.pack", loc.pack.as_str()));
    common::flip_object(&store, &root, &id);

    let r = store.repack(RepackOptions::default()).unwrap();
    assert_eq!(r.kept_damaged, vec![loc.pack.as_str().to_string()], "{r:?}");
    assert!(pack.is_file(), "the damaged object's pack was removed");
    let f = store.fsck().unwrap();
    assert!(
        f.corrupt.iter().any(|p| p.id == hex::encode(id)),
        "fsck no longer names the damaged object: {f:?}"
    );
    exports_intact(&store, &snaps, tmp.path(), "around-damage");
}
