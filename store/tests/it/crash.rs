//! Crashes at every write and sync point of the pack backend ([`CrashingPacks`]) during
//! an import, a repack and a gc: after each, the store opens, fsck is clean, and every
//! snapshot the store holds (at least every one reported complete, or still referenced)
//! exports as it was imported.
//!
//! The index, refs and snapshot rows are SQLite transactions on real files, outside the
//! backend: a crash at a point leaves them as the last transaction committed before it.

use crate::common;

use std::fs;
use std::path::{Path, PathBuf};

use common::crashing::CrashingPacks;
use cowspace_store::gc::GcOptions;
use cowspace_store::repack::RepackOptions;
use cowspace_store::{ImportOptions, SnapshotId, Store, StoreConfig};

/// More points than any operation here passes; reaching it means the loop never ends.
const MAX_POINTS: u64 = 10_000;

fn tree(dir: &Path, variant: u8) {
    fs::create_dir_all(dir.join("sub")).unwrap();
    fs::write(dir.join("same.txt"), "in every tree\n").unwrap();
    for i in 0..4u8 {
        let body = vec![i ^ variant; 100 + usize::from(i) * 700];
        fs::write(dir.join("sub").join(format!("f{i}")), body).unwrap();
    }
    let big: Vec<u8> = (0..300_000u32)
        .map(|j| (j.wrapping_mul(2654435761) >> 11) as u8 ^ variant)
        .collect();
    fs::write(dir.join("big"), big).unwrap();
}

fn open(root: &Path, packs: &CrashingPacks) -> Store {
    Store::open_with_backend(root, StoreConfig::default(), packs.backend()).unwrap()
}

/// A new store at `root` on `packs` with `n` imports (each its own pack), on refs `r0`,
/// `r1`, ...: (snapshot, source).
fn imported(root: &Path, packs: &CrashingPacks, tmp: &Path, n: u8) -> Vec<(SnapshotId, PathBuf)> {
    Store::init(root, StoreConfig::default()).unwrap();
    let store = open(root, packs);
    let mut sources = Vec::new();
    for i in 0..n {
        let src = tmp.join(format!("src{i}"));
        tree(&src, i);
        let mut opts = ImportOptions::new();
        opts.ref_name = Some(format!("r{i}"));
        sources.push((store.import_dir(&src, &opts).unwrap().snapshot, src));
    }
    sources
}

/// Every snapshot of the store exports as its source in `sources`, and fsck is clean.
fn check_intact(store: &Store, sources: &[(SnapshotId, PathBuf)], out: &Path, case: &str) {
    let report = store.fsck().unwrap();
    assert!(report.is_clean(), "{case}: {report:?}");
    for id in store.snapshot_ids().unwrap() {
        let (_, src) = sources
            .iter()
            .find(|(s, _)| *s == id)
            .unwrap_or_else(|| panic!("{case}: unknown snapshot {id}"));
        let _ = fs::remove_dir_all(out);
        store.export_dir(&id, out).unwrap();
        assert_eq!(common::listing(src), common::listing(out), "{case}: {id}");
    }
}

/// Runs `op` once per point it passes, crashing there, then once to its end (and crashes
/// after it); `after` checks each boot after a crash, told whether `op` reported success.
/// Returns how many points `op` passes.
fn crash_everywhere<T>(
    root: &Path,
    packs: &CrashingPacks,
    op: impl Fn(&Store) -> cowspace_store::Result<T>,
    after: impl Fn(&Store, Option<&T>, &str),
) -> u64 {
    for n in 0..MAX_POINTS {
        packs.crash_at(packs.points() + n);
        let store = open(root, packs);
        let done = op(&store);
        let crashed = packs.crashed();
        drop(store);
        packs.crash();
        let case = format!("crash at point {n}");
        let store = open(root, packs);
        after(&store, done.as_ref().ok(), &case);
        if !crashed {
            assert!(
                done.is_ok(),
                "no crash at point {n}: the operation completes"
            );
            return n;
        }
    }
    panic!("more than {MAX_POINTS} points");
}

#[test]
fn a_crash_at_any_point_of_an_import_keeps_every_snapshot_reported_complete() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    Store::init(&root, StoreConfig::default()).unwrap();
    let (a, b, out) = (
        tmp.path().join("a"),
        tmp.path().join("b"),
        tmp.path().join("out"),
    );
    tree(&a, 1);
    tree(&b, 2);
    let packs = CrashingPacks::new();
    let mut opts = ImportOptions::new();
    opts.ref_name = Some("main".into());

    let first = crash_everywhere(
        &root,
        &packs,
        |store| store.import_dir(&a, &opts),
        |store, done, case| {
            let sources: Vec<_> = done.iter().map(|r| (r.snapshot, a.clone())).collect();
            let ids: Vec<_> = sources.iter().map(|(id, _)| *id).collect();
            assert_eq!(store.snapshot_ids().unwrap(), ids, "{case}");
            assert_eq!(
                store.get_ref("main").unwrap(),
                ids.first().copied(),
                "{case}"
            );
            check_intact(store, &sources, &out, case);
        },
    );
    let store = open(&root, &packs);
    let first_id = store.get_ref("main").unwrap().unwrap();
    drop(store);
    let second = crash_everywhere(
        &root,
        &packs,
        |store| store.import_dir(&b, &opts),
        |store, done, case| {
            let mut sources = vec![(first_id, a.clone())];
            if let Some(r) = done {
                assert!(
                    store.snapshot_ids().unwrap().contains(&r.snapshot),
                    "{case}"
                );
                assert_eq!(store.get_ref("main").unwrap(), Some(r.snapshot), "{case}");
                sources.push((r.snapshot, b.clone()));
            } else {
                assert_eq!(store.snapshot_ids().unwrap(), vec![first_id], "{case}");
                assert_eq!(store.get_ref("main").unwrap(), Some(first_id), "{case}");
            }
            check_intact(store, &sources, &out, case);
        },
    );
    // Every object of a tree is a create/write/sync point or more: the loops above went
    // through the whole write path, not just its first steps.
    assert!(first > 10 && second > 10, "{first} and {second} points");
}

#[test]
fn a_crash_at_any_point_of_a_repack_keeps_every_snapshot() {
    let tmp = tempfile::tempdir().unwrap();
    let (root, packs) = (tmp.path().join("root"), CrashingPacks::new());
    let sources = imported(&root, &packs, tmp.path(), 4);
    let out = tmp.path().join("out");
    let wait = RepackOptions {
        wait: true,
        ..RepackOptions::default()
    };
    let points = crash_everywhere(
        &root,
        &packs,
        |store| store.repack(wait),
        |store, _, case| {
            assert_eq!(store.snapshot_ids().unwrap().len(), sources.len(), "{case}");
            check_intact(store, &sources, &out, case);
        },
    );
    assert!(points > 0, "repack wrote nothing");
}

#[test]
fn a_crash_at_any_point_of_a_gc_keeps_every_referenced_snapshot() {
    let tmp = tempfile::tempdir().unwrap();
    let (root, packs) = (tmp.path().join("root"), CrashingPacks::new());
    let sources = imported(&root, &packs, tmp.path(), 3);
    // The middle snapshot becomes garbage: its pack goes, the others' are kept or
    // rewritten.
    open(&root, &packs).delete_ref("r1", sources[1].0).unwrap();
    let kept = [sources[0].0, sources[2].0];
    let out = tmp.path().join("out");
    let points = crash_everywhere(
        &root,
        &packs,
        |store| {
            store.gc(GcOptions {
                grace_secs: 0,
                wait: true,
                ..GcOptions::default()
            })
        },
        |store, done, case| {
            let ids = store.snapshot_ids().unwrap();
            assert!(kept.iter().all(|k| ids.contains(k)), "{case}: {ids:?}");
            if done.is_some() {
                assert_eq!(ids.len(), kept.len(), "{case}: {ids:?}");
            }
            check_intact(store, &sources, &out, case);
        },
    );
    assert!(points > 0, "gc removed nothing");
}
