//! A symlink with several names (`ln -P`): imports, edits and tar archives keep it one
//! inode, exports make it again with `linkat`, fsck and gc leave it sound, and trees
//! without one keep their version-1 encoding.

use std::fs;
use std::os::unix::fs::{MetadataExt, symlink};
use std::path::Path;

use cowspace_store::gc::GcOptions;
use cowspace_store::tree::{Tree, symlink_group_key};
use cowspace_store::{Expect, ImportOptions, SnapshotId, Source, Store, StoreConfig, TreeId};

/// The entry at `path` of a snapshot.
fn entry(store: &Store, snap: &SnapshotId, path: &str) -> cowspace_store::Entry {
    let mut tree = store.tree(&store.snapshot(snap).unwrap().root).unwrap();
    let comps: Vec<&str> = path.split('/').collect();
    for (i, c) in comps.iter().enumerate() {
        let e = tree
            .get(c.as_bytes())
            .unwrap_or_else(|| panic!("no {path}"))
            .clone();
        if i + 1 == comps.len() {
            return e;
        }
        tree = store.tree(&e.subtree().unwrap()).unwrap();
    }
    unreachable!()
}

/// The encoding version byte of a tree.
fn version(store: &Store, id: &TreeId) -> u8 {
    store.tree(id).unwrap().encode()[6]
}

/// (ino, nlink) of a name, not following it.
fn inode(p: &Path) -> (u64, u64) {
    let m = fs::symlink_metadata(p).unwrap();
    assert!(m.file_type().is_symlink(), "{} is no symlink", p.display());
    (m.ino(), m.nlink())
}

fn source(dir: &Path) {
    fs::create_dir_all(dir.join("d")).unwrap();
    fs::create_dir_all(dir.join("plain")).unwrap();
    fs::write(dir.join("file"), "x\n").unwrap();
    symlink("file", dir.join("a")).unwrap();
    // link(2) of the symlink itself (`ln -P`): std's hard_link does not follow it.
    fs::hard_link(dir.join("a"), dir.join("d/b")).unwrap();
    symlink("file", dir.join("c")).unwrap();
    symlink("../file", dir.join("plain/s")).unwrap();
}

#[test]
fn an_imported_symlink_with_two_names_exports_as_one_inode() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    source(&src);
    assert_eq!(inode(&src.join("a")), inode(&src.join("d/b")));
    let store = Store::init(&tmp.path().join("root"), StoreConfig::default()).unwrap();
    let mut opts = ImportOptions::new();
    opts.ref_name = Some("main".into());
    let r = store.import_dir(&src, &opts).unwrap();
    let snap = store.snapshot(&r.snapshot).unwrap();
    assert_eq!((snap.counts.symlinks, snap.counts.hardlinks), (3, 1));

    let (a, b, c) = (
        entry(&store, &r.snapshot, "a"),
        entry(&store, &r.snapshot, "d/b"),
        entry(&store, &r.snapshot, "c"),
    );
    assert_eq!(a.link_group(), Some(symlink_group_key(b"a")));
    assert_eq!(b.link_group(), a.link_group());
    assert_eq!(
        (a.data.as_slice(), b.data.as_slice()),
        (&b"file"[..], &b"file"[..])
    );
    assert_eq!(c.link_group(), None);
    // Only the trees holding a name of it are version 2.
    assert_eq!(version(&store, &snap.root), 2);
    let d = entry(&store, &r.snapshot, "d").subtree().unwrap();
    assert_eq!(version(&store, &d), 2);
    let plain = entry(&store, &r.snapshot, "plain").subtree().unwrap();
    assert_eq!(version(&store, &plain), 1);

    let out = tmp.path().join("out");
    store.export_dir(&r.snapshot, &out).unwrap();
    let (ia, na) = inode(&out.join("a"));
    assert_eq!((ia, na), inode(&out.join("d/b")), "one inode, two names");
    assert_eq!(na, 2);
    assert_eq!(inode(&out.join("c")).1, 1);
    assert_eq!(fs::read_link(out.join("d/b")).unwrap(), Path::new("file"));

    // The export imports as the same tree; fsck is clean; gc keeps it.
    let again = store.import_dir(&out, &ImportOptions::new()).unwrap();
    assert_eq!(again.root, r.root);
    assert!(store.fsck().unwrap().is_clean());
    store
        .gc(GcOptions {
            grace_secs: 0,
            ..Default::default()
        })
        .unwrap();
    assert!(store.fsck().unwrap().is_clean());
    let out2 = tmp.path().join("out2");
    store.export_dir(&r.snapshot, &out2).unwrap();
    assert_eq!(inode(&out2.join("a")).1, 2);
}

#[test]
fn a_tar_hard_link_to_a_symlink_is_one_more_name_of_it() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    source(&src);
    let store = Store::init(&tmp.path().join("root"), StoreConfig::default()).unwrap();
    let r = store.import_dir(&src, &ImportOptions::new()).unwrap();
    let tar = tmp.path().join("t.tar");
    store.export_tar(&r.snapshot, &tar).unwrap();
    let t = store.import_tar(&tar, &ImportOptions::new()).unwrap();
    assert_eq!(
        t.root, r.root,
        "the archive holds the link as a tar hard link"
    );
    // GNU tar extracts it with link(2): one inode again.
    let x = tmp.path().join("x");
    fs::create_dir(&x).unwrap();
    let st = std::process::Command::new("tar")
        .arg("-xf")
        .arg(&tar)
        .arg("-C")
        .arg(&x)
        .status()
        .expect("run tar");
    assert!(st.success());
    assert_eq!(inode(&x.join("a")), inode(&x.join("d/b")));
    // An archive GNU tar made of the directory: the same tree.
    let gnu = tmp.path().join("gnu.tar");
    let st = std::process::Command::new("tar")
        .arg("-cf")
        .arg(&gnu)
        .arg("-C")
        .arg(&src)
        .arg(".")
        .status()
        .expect("run tar");
    assert!(st.success());
    let g = store.import_tar(&gnu, &ImportOptions::new()).unwrap();
    assert_eq!(g.root, r.root, "GNU tar's hard link to a symlink");
}

fn commit(ed: cowspace_store::Editor<'_>) -> SnapshotId {
    ed.commit(
        "edit",
        Source::Workspace { id: "ws".into() },
        Some(("main", Expect::Any)),
    )
    .unwrap()
    .snapshot
}

#[test]
fn edits_form_and_break_symlink_groups_as_an_import_would() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir_all(src.join("d")).unwrap();
    symlink("t", src.join("a")).unwrap();
    fs::write(src.join("f"), "f\n").unwrap();
    let store = Store::init(&tmp.path().join("root"), StoreConfig::default()).unwrap();
    let mut opts = ImportOptions::new();
    opts.ref_name = Some("main".into());
    let base = store.import_dir(&src, &opts).unwrap();
    assert_eq!(version(&store, &base.root), 1);

    // `ln -P a d/b` in a workspace: both names put with one link.
    let mut ed = store.edit(&base.snapshot).unwrap();
    ed.put_linked_symlink(b"a", b"t".to_vec(), vec![], Some(7))
        .unwrap();
    ed.put_linked_symlink(b"d/b", b"t".to_vec(), vec![], Some(7))
        .unwrap();
    let linked = commit(ed);
    fs::hard_link(src.join("a"), src.join("d/b")).unwrap();
    let imported = store.import_dir(&src, &ImportOptions::new()).unwrap();
    assert_eq!(store.snapshot(&linked).unwrap().root, imported.root);
    assert_eq!(store.snapshot(&linked).unwrap().counts.hardlinks, 1);

    // A change elsewhere keeps the group as it is.
    let mut ed = store.edit(&linked).unwrap();
    ed.put_bytes(b"g", b"g\n", 0o644).unwrap();
    let other = commit(ed);
    assert_eq!(
        entry(&store, &other, "d/b").link_group(),
        Some(symlink_group_key(b"a"))
    );

    // Removing the first name: the other is a symlink of one name again, version 1.
    let mut ed = store.edit(&linked).unwrap();
    ed.delete(b"a").unwrap();
    let alone = commit(ed);
    let s = store.snapshot(&alone).unwrap();
    assert_eq!(entry(&store, &alone, "d/b").link_group(), None);
    assert_eq!((s.counts.symlinks, s.counts.hardlinks), (1, 0));
    assert_eq!(version(&store, &s.root), 1);
    assert_eq!(
        version(&store, &entry(&store, &alone, "d").subtree().unwrap()),
        1
    );

    // Three names, then the first removed: the group's key follows its new first name.
    let mut ed = store.edit(&linked).unwrap();
    ed.put_linked_symlink(b"a", b"t".to_vec(), vec![], Some(9))
        .unwrap();
    ed.put_linked_symlink(b"d/b", b"t".to_vec(), vec![], Some(9))
        .unwrap();
    ed.put_linked_symlink(b"d/c", b"t".to_vec(), vec![], Some(9))
        .unwrap();
    let three = commit(ed);
    let mut ed = store.edit(&three).unwrap();
    ed.delete(b"a").unwrap();
    let two = commit(ed);
    assert_eq!(
        entry(&store, &two, "d/c").link_group(),
        Some(symlink_group_key(b"d/b"))
    );
    let s = store.snapshot(&two).unwrap();
    assert_eq!((s.counts.symlinks, s.counts.hardlinks), (1, 1));
    assert!(store.fsck().unwrap().is_clean());
}

#[test]
fn a_newer_tree_version_is_refused_naming_the_fix() {
    // What this reader says of a tree a later cowspace wrote.
    let mut bytes = Tree::default().encode();
    bytes[6] = 9;
    let id = TreeId::of_encoding(&bytes);
    let err = Tree::decode(&id, &bytes).unwrap_err();
    assert_eq!(err.kind(), cowspace_store::ErrorKind::Unsupported);
    assert!(err.to_string().contains("upgrade cowspace"), "{err}");
}
