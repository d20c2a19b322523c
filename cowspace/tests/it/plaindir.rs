//! The runtime's whole workspace life (create, change, diff, commit, unmount and mount
//! again, remove) through the `PlainDir` double: no root, no mount, no daemon.

use std::fs;
use std::path::Path;
use std::sync::Arc;

use cowspace::materializer::plaindir::PlainDir;
use cowspace::materializer::{MaterializerKind, Materializers};
use cowspace::registry::Status;
use cowspace::runtime::{CommitOptions, CreateOptions, Runtime};
use cowspace_store::diff::Change;
use cowspace_store::{ImportOptions, SnapshotId, Store, StoreConfig};

fn runtime(root: &Path) -> (Runtime, SnapshotId) {
    Store::init(root, StoreConfig::default()).unwrap();
    let src = root.with_extension("src");
    fs::create_dir_all(src.join("dir")).unwrap();
    fs::write(src.join("keep.txt"), "kept\n").unwrap();
    fs::write(src.join("dir/edit.txt"), "before\n").unwrap();
    fs::write(src.join("gone.txt"), "to delete\n").unwrap();
    let store = Store::open(root, StoreConfig::default()).unwrap();
    let snap = store
        .import_dir(&src, &ImportOptions::new())
        .unwrap()
        .snapshot;
    let table = Materializers::standard().with(Arc::new(PlainDir(MaterializerKind::Copy)));
    (Runtime::open_with(root, table).unwrap(), snap)
}

fn create(rt: &Runtime, snap: &SnapshotId) -> cowspace::registry::Record {
    rt.create(&CreateOptions {
        snapshot: snap.to_hex(),
        materializer: Some("copy".parse().unwrap()),
        ..Default::default()
    })
    .unwrap()
}

#[test]
fn a_workspace_lives_and_commits_through_the_double() {
    let tmp = tempfile::tempdir().unwrap();
    let (rt, snap) = runtime(&tmp.path().join("root"));
    let rec = create(&rt, &snap);
    assert_eq!(rec.status, Status::Active);
    assert_eq!(rec.materializer, MaterializerKind::Copy);
    assert_eq!(
        fs::read_to_string(rec.path.join("keep.txt")).unwrap(),
        "kept\n"
    );

    // Nothing changed yet: the diff is empty (an unchanged tree, though read whole).
    assert!(rt.diff(&rec.id).unwrap().is_empty());

    fs::write(rec.path.join("dir/edit.txt"), "after\n").unwrap();
    fs::remove_file(rec.path.join("gone.txt")).unwrap();
    fs::write(rec.path.join("new.txt"), "new\n").unwrap();
    let mut diff: Vec<(String, Change)> = rt
        .diff(&rec.id)
        .unwrap()
        .into_iter()
        .map(|(d, _)| (d.path, d.change))
        .collect();
    diff.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        diff,
        vec![
            ("dir/edit.txt".to_string(), Change::Modified),
            ("gone.txt".to_string(), Change::Deleted),
            ("new.txt".to_string(), Change::Added),
        ]
    );

    let report = rt
        .commit(
            &rec.id,
            &CommitOptions {
                ref_name: Some("main".into()),
                ..Default::default()
            },
        )
        .unwrap();
    // The commit holds exactly what the workspace showed.
    let out = tmp.path().join("export");
    rt.store().export_dir(&report.snapshot, &out).unwrap();
    assert_eq!(
        fs::read_to_string(out.join("dir/edit.txt")).unwrap(),
        "after\n"
    );
    assert_eq!(fs::read_to_string(out.join("new.txt")).unwrap(), "new\n");
    assert_eq!(fs::read_to_string(out.join("keep.txt")).unwrap(), "kept\n");
    assert!(!out.join("gone.txt").exists());
    assert_eq!(rt.store().resolve("main").unwrap(), report.snapshot);
    // The commit is pinned while the workspace lives.
    assert_eq!(
        rt.status(&rec.id).unwrap().commits,
        vec![report.snapshot.to_hex()]
    );

    rt.remove(&rec.id, false).unwrap();
    assert!(!rec.private_dir.exists());
    assert!(rt.list(false).unwrap().iter().all(|r| r.id != rec.id));
}

#[test]
fn the_double_keeps_its_state_across_an_unmount_and_recover() {
    let tmp = tempfile::tempdir().unwrap();
    let (rt, snap) = runtime(&tmp.path().join("root"));
    let rec = create(&rt, &snap);
    fs::write(rec.path.join("new.txt"), "written\n").unwrap();
    let m = rt.materializers().get(MaterializerKind::Copy);
    m.unmount(
        &cowspace::materializer::WorkspaceCtx::new(rt.store(), &rec),
        false,
    )
    .unwrap();
    assert!(!rec.path.exists());
    // Sweep sees the workspace gone from its path and stops it; recover brings it back.
    let report = rt.sweep().unwrap();
    assert_eq!(report.stopped, vec![rec.id.clone()], "{report:?}");
    assert_eq!(rt.status(&rec.id).unwrap().status, Status::Stopped);
    rt.recover(&rec.id).unwrap();
    assert_eq!(
        fs::read_to_string(rec.path.join("new.txt")).unwrap(),
        "written\n"
    );
    assert_eq!(rt.diff(&rec.id).unwrap().len(), 1);
    // Never committed: removing it would lose new.txt, so only `force` does.
    let e = rt.remove(&rec.id, false).unwrap_err();
    assert_eq!(e.kind(), cowspace::error::ErrorKind::Busy, "{e}");
    assert!(e.to_string().contains("1 path differs"), "{e}");
    assert_eq!(rt.uncommitted(&rec.id).unwrap().paths, 1);
    assert!(rec.path.join("new.txt").exists(), "nothing removed");
    rt.remove(&rec.id, true).unwrap();
}

#[test]
fn a_kind_the_table_does_not_replace_is_still_the_real_one() {
    let tmp = tempfile::tempdir().unwrap();
    let (rt, _) = runtime(&tmp.path().join("root"));
    assert_eq!(
        rt.materializers().get(MaterializerKind::Overlay).kind(),
        MaterializerKind::Overlay
    );
    // The double answers for its kind only.
    assert!(
        rt.materializers()
            .get(MaterializerKind::Copy)
            .probe(rt.store())
            .is_ok()
    );
}
