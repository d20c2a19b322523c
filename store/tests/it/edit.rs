//! Editing a snapshot gives the same tree as importing the edited directory, and rewrites
//! only the directories on the changed paths.

use std::fs;
use std::os::unix::fs::PermissionsExt;

use cowspace_store::{Expect, ImportOptions, Source, Store, StoreConfig};

#[test]
fn edits_match_an_import_of_the_edited_tree() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    for d in ["a/b/c", "keep/deep/er", "gone/x", "opaque/old", "linkdir"] {
        fs::create_dir_all(src.join(d)).unwrap();
    }
    for (f, body) in [
        ("a/b/c/file.txt", "one\n"),
        ("a/top.txt", "top\n"),
        ("keep/deep/er/same.txt", "same\n"),
        ("gone/x/y.txt", "y\n"),
        ("opaque/old/z.txt", "z\n"),
        ("opaque/old2.txt", "z2\n"),
        ("linkdir/primary", "linked\n"),
    ] {
        fs::write(src.join(f), body).unwrap();
    }
    fs::hard_link(src.join("linkdir/primary"), src.join("linkdir/second")).unwrap();
    let store = Store::init(&tmp.path().join("root"), StoreConfig::default()).unwrap();
    let mut opts = ImportOptions::new();
    opts.ref_name = Some("main".into());
    let base = store.import_dir(&src, &opts).unwrap();

    // The same changes on disk (to import for comparison) and through the editor.
    let host = tmp.path().join("host");
    fs::create_dir_all(&host).unwrap();
    fs::write(host.join("new.txt"), "new\n").unwrap();
    fs::write(host.join("changed.txt"), "two\n").unwrap();

    fs::write(src.join("a/b/c/file.txt"), "two\n").unwrap();
    fs::write(src.join("a/b/new.txt"), "new\n").unwrap();
    fs::remove_dir_all(src.join("gone")).unwrap();
    fs::remove_dir_all(src.join("opaque")).unwrap();
    fs::create_dir(src.join("opaque")).unwrap();
    fs::write(src.join("opaque/new.txt"), "new\n").unwrap();
    fs::set_permissions(src.join("a/top.txt"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(src.join("keep"), fs::Permissions::from_mode(0o700)).unwrap();
    fs::remove_file(src.join("linkdir/primary")).unwrap();
    std::os::unix::fs::symlink("a/top.txt", src.join("link")).unwrap();

    let mut ed = store.edit(&base.snapshot).unwrap();
    ed.put_file(
        b"a/b/c/file.txt",
        host.join("changed.txt"),
        0o644,
        vec![],
        None,
    )
    .unwrap();
    ed.put_file(b"a/b/new.txt", host.join("new.txt"), 0o644, vec![], None)
        .unwrap();
    ed.delete(b"gone").unwrap();
    ed.clear_dir(b"opaque", 0o755, vec![]).unwrap();
    ed.put_file(b"opaque/new.txt", host.join("new.txt"), 0o644, vec![], None)
        .unwrap();
    let top = ed.base_entry(b"a/top.txt").unwrap().unwrap();
    ed.put_stored_file(
        b"a/top.txt",
        cowspace_store::FileContent {
            id: top.content().unwrap(),
            size: top.size,
        },
        0o755,
        vec![],
    )
    .unwrap();
    ed.put_dir(b"keep", 0o700, vec![]).unwrap();
    ed.delete(b"linkdir/primary").unwrap();
    ed.put_symlink(b"link", b"a/top.txt".to_vec(), vec![])
        .unwrap();
    let edited = ed
        .commit(
            "edit",
            Source::Workspace {
                id: "ws-test".into(),
            },
            Some(("main", Expect::At(base.snapshot))),
        )
        .unwrap();
    assert_eq!(edited.parents, vec![base.snapshot]);
    assert_eq!(store.get_ref("main").unwrap(), Some(edited.snapshot));
    assert_eq!(edited.files_read, 3);

    let mut plain = ImportOptions::new();
    plain.default_excludes = false;
    let reimport = store.import_dir(&src, &plain).unwrap();
    assert_eq!(
        edited.root, reimport.root,
        "the edit equals an import of the edited tree"
    );
    let snap = store.snapshot(&edited.snapshot).unwrap();
    let expect = store.snapshot(&reimport.snapshot).unwrap();
    assert_eq!(snap.counts.files, expect.counts.files);
    assert_eq!(snap.counts.dirs, expect.counts.dirs);
    assert_eq!(snap.counts.bytes, expect.counts.bytes);
    assert_eq!(snap.counts.symlinks, expect.counts.symlinks);

    // Only the directories on changed paths are new: `keep/deep` kept its tree.
    let changes = store
        .diff_snapshots(&base.snapshot, &edited.snapshot)
        .unwrap();
    assert!(
        changes.iter().all(|c| !c.path.starts_with("keep/")),
        "{changes:?}"
    );

    // A stale expectation moves nothing and stores no snapshot.
    let before = store.snapshot_ids().unwrap().len();
    let ed = store.edit(&base.snapshot).unwrap();
    let err = ed
        .commit(
            "stale",
            Source::Workspace {
                id: "ws-test".into(),
            },
            Some(("main", Expect::At(base.snapshot))),
        )
        .unwrap_err();
    assert_eq!(err.kind(), cowspace_store::ErrorKind::Conflict);
    assert_eq!(store.snapshot_ids().unwrap().len(), before);
}

/// Directories moved by `rebase_dir` (an overlay's renamed directories) keep the hard
/// links inside and across them, and each group's primary is again its first name in
/// depth-first order: the edit equals an import of the moved tree.
#[test]
fn rebased_directories_keep_their_hard_links_and_primaries_come_first() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    for d in ["a/sub", "b"] {
        fs::create_dir_all(src.join(d)).unwrap();
    }
    fs::write(src.join("a/first"), "linked\n").unwrap();
    fs::hard_link(src.join("a/first"), src.join("a/sub/second")).unwrap();
    fs::hard_link(src.join("a/first"), src.join("b/third")).unwrap();
    fs::write(src.join("a/sub/plain"), "plain\n").unwrap();
    let store = Store::init(&tmp.path().join("root"), StoreConfig::default()).unwrap();
    let base = store.import_dir(&src, &ImportOptions::new()).unwrap();

    // mv a z/moved (the primary now sorts after b/third); mv z/moved/sub c.
    fs::create_dir(src.join("z")).unwrap();
    fs::rename(src.join("a"), src.join("z/moved")).unwrap();
    fs::rename(src.join("z/moved/sub"), src.join("c")).unwrap();
    let mut ed = store.edit(&base.snapshot).unwrap();
    ed.delete(b"a").unwrap();
    ed.put_dir(b"z", 0o755, vec![]).unwrap();
    ed.put_dir(b"z/moved", 0o755, vec![]).unwrap();
    ed.rebase_dir(b"z/moved", b"a").unwrap();
    ed.delete(b"z/moved/sub").unwrap();
    ed.put_dir(b"c", 0o755, vec![]).unwrap();
    ed.rebase_dir(b"c", b"a/sub").unwrap();
    assert!(
        ed.rebase_dir(b"nope", b"a/first").is_err(),
        "not a directory"
    );
    let edited = ed
        .commit(
            "moves",
            Source::Workspace {
                id: "ws-test".into(),
            },
            None,
        )
        .unwrap();
    let mut plain = ImportOptions::new();
    plain.default_excludes = false;
    let reimport = store.import_dir(&src, &plain).unwrap();
    assert_eq!(
        edited.root, reimport.root,
        "the edit equals an import of the moved tree"
    );
    let (got, want) = (
        store.snapshot(&edited.snapshot).unwrap().counts,
        store.snapshot(&reimport.snapshot).unwrap().counts,
    );
    assert_eq!(
        (got.files, got.dirs, got.bytes, got.hardlinks),
        (want.files, want.dirs, want.bytes, want.hardlinks),
        "counts of the moved tree"
    );
    let out = tmp.path().join("export");
    store.export_dir(&edited.snapshot, &out).unwrap();
    use std::os::unix::fs::MetadataExt;
    let ino = |p: &str| fs::metadata(out.join(p)).unwrap().ino();
    assert_eq!(ino("b/third"), ino("z/moved/first"));
    assert_eq!(ino("b/third"), ino("c/second"));
}

/// The base's exclusion policy applied by the editor (`commit`'s default): new paths it
/// excludes, or under a directory it excludes, are left out (a directory counted once);
/// what the base holds under such a name (a directory the import kept) is captured.
#[test]
fn an_exclusion_filter_leaves_out_new_excluded_paths_only() {
    use cowspace_store::import::exclude::ChangeFilter;
    use cowspace_store::snapshot::Policy;
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir_all(src.join("build")).unwrap();
    fs::write(src.join("build/kept.sh"), "kept\n").unwrap();
    let store = Store::init(&tmp.path().join("root"), StoreConfig::default()).unwrap();
    let mut opts = ImportOptions::new();
    opts.default_excludes = false;
    let base = store.import_dir(&src, &opts).unwrap();
    let host = tmp.path().join("host");
    fs::create_dir_all(&host).unwrap();
    fs::write(host.join("f"), "f\n").unwrap();
    let policy = Policy {
        default_excludes: true,
        excludes: vec!["*.log".into()],
        dirty: None,
    };
    let mut ed = store.edit(&base.snapshot).unwrap();
    ed.exclude_by(ChangeFilter::new(&policy, base.root).unwrap().unwrap());
    for dir in ["dist", "dist/sub", "build/node_modules"] {
        ed.put_dir(dir.as_bytes(), 0o755, vec![]).unwrap();
    }
    for file in [
        "dist/sub/x.js",
        "build/new.sh",
        "build/node_modules/m.js",
        "a.log",
        "b.txt",
    ] {
        ed.put_file(file.as_bytes(), host.join("f"), 0o644, vec![], None)
            .unwrap();
    }
    // Kept under an excluded name: it is in the base.
    ed.put_file(b"build/kept.sh", host.join("f"), 0o755, vec![], None)
        .unwrap();
    assert_eq!(ed.left_out(), 3, "dist, build/node_modules, a.log");
    let r = ed
        .commit("", Source::Workspace { id: "t".into() }, None)
        .unwrap();
    let out = tmp.path().join("out");
    store.export_dir(&r.snapshot, &out).unwrap();
    for kept in ["build/new.sh", "build/kept.sh", "b.txt"] {
        assert!(out.join(kept).is_file(), "{kept}");
    }
    for gone in ["dist", "build/node_modules", "a.log"] {
        assert!(!out.join(gone).exists(), "{gone}");
    }
    assert_eq!(
        fs::metadata(out.join("build/kept.sh"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o755
    );
    // A policy that excludes nothing gives no filter.
    assert!(
        ChangeFilter::new(&Policy::default(), base.root)
            .unwrap()
            .is_none()
    );
}
