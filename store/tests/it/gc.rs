//! gc keeps what refs, their parent chains, pins and recent snapshots need; removes the
//! rest; rewrites mostly-dead packs; leaves a store that passes fsck.

use crate::common;

use std::fs;

use cowspace_store::gc::GcOptions;
use cowspace_store::{ImportOptions, Store, StoreConfig};

fn tree(dir: &std::path::Path, tag: &str, n: u32) {
    fs::create_dir_all(dir).unwrap();
    for i in 0..n {
        fs::write(
            dir.join(format!("{tag}-{i}.txt")),
            format!("{tag} {i} {}\n", "x".repeat(i as usize * 37)),
        )
        .unwrap();
    }
}

#[test]
fn gc_keeps_what_is_needed_and_removes_the_rest() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::init(&tmp.path().join("root"), StoreConfig::default()).unwrap();
    let (a, b, c, d) = (
        tmp.path().join("a"),
        tmp.path().join("b"),
        tmp.path().join("c"),
        tmp.path().join("d"),
    );
    tree(&a, "a", 50);
    tree(&b, "b", 50);
    tree(&c, "c", 50);
    // d is the larger part of the one pack the first gc merges the four small packs
    // into, so once d goes too that pack is mostly dead.
    tree(&d, "d", 150);
    let mut on_main = ImportOptions::new();
    on_main.ref_name = Some("main".into());
    let sa = store.import_dir(&a, &on_main).unwrap().snapshot;
    let sb = store.import_dir(&b, &on_main).unwrap().snapshot; // parent: sa
    let sc = store
        .import_dir(&c, &ImportOptions::new())
        .unwrap()
        .snapshot; // unreferenced
    let sd = store
        .import_dir(&d, &ImportOptions::new())
        .unwrap()
        .snapshot; // pinned
    store.pin(&sd, "ws-1").unwrap();

    // Within the grace period nothing goes.
    let r = store.gc(GcOptions::default()).unwrap();
    assert!(r.snapshots_removed.is_empty());
    assert_eq!(r.objects_removed, 0);

    let dry = store
        .gc(GcOptions {
            dry_run: true,
            grace_secs: 0,
            wait: false,
        })
        .unwrap();
    assert_eq!(dry.snapshots_removed, vec![sc]);
    assert!(store.snapshot(&sc).is_ok(), "a dry run removes nothing");

    let r = store.gc(NOW).unwrap();
    assert_eq!(r.snapshots_removed, vec![sc]);
    assert!(
        r.objects_removed >= 51,
        "the snapshot, its tree and 50 files: {r:?}"
    );
    assert!(store.snapshot(&sc).is_err());
    let f = store.fsck().unwrap();
    assert!(f.is_clean() && f.orphan_packs.is_empty(), "{f:?}");
    for (snap, src) in [(sa, &a), (sb, &b), (sd, &d)] {
        let out = tmp.path().join(format!("out-{}", snap.short()));
        store.export_dir(&snap, &out).unwrap();
        assert_eq!(common::listing(src), common::listing(&out));
    }

    // Unpinned, d goes too; the pack it was most of is dropped or rewritten.
    store.unpin("ws-1").unwrap();
    let r = store.gc(NOW).unwrap();
    assert_eq!(r.snapshots_removed, vec![sd]);
    assert!(r.packs_removed + r.packs_rewritten >= 1, "{r:?}");
    assert!(store.fsck().unwrap().is_clean());
    // Re-importing d after gc stores its contents again (the stat cache no longer
    // claims them).
    let again = store.import_dir(&d, &ImportOptions::new()).unwrap();
    assert_eq!(again.files_read, 150);
    let out = tmp.path().join("out-d-again");
    store.export_dir(&again.snapshot, &out).unwrap();
    assert_eq!(common::listing(&d), common::listing(&out));
}

#[test]
fn gc_refuses_while_an_import_holds_the_store() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::init(&tmp.path().join("root"), StoreConfig::default()).unwrap();
    let held = cowspace_store::lock::StoreLock::shared(&store).unwrap();
    let err = store.gc(GcOptions::default()).unwrap_err();
    assert_eq!(err.kind(), cowspace_store::ErrorKind::Busy);
    drop(held);
    store.gc(GcOptions::default()).unwrap();
}

/// gc with no grace. It waits for the store lock: a child process another test of this
/// binary starts (`git`) holds a copy of every descriptor between its fork and its exec.
const NOW: GcOptions = GcOptions {
    dry_run: false,
    grace_secs: 0,
    wait: true,
};

#[test]
fn an_edit_pinned_for_a_holder_survives_gc_until_the_holder_unpins() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::init(&tmp.path().join("root"), StoreConfig::default()).unwrap();
    let src = tmp.path().join("src");
    tree(&src, "s", 5);
    let base = store
        .import_dir(&src, &ImportOptions::new())
        .unwrap()
        .snapshot;
    let extra = tmp.path().join("extra.txt");
    fs::write(&extra, "added by an edit\n").unwrap();
    let mut ed = store.edit(&base).unwrap();
    ed.put_file(b"extra.txt", extra, 0o644, vec![], None)
        .unwrap();
    ed.pin_for("ws-7");
    let r = ed
        .commit(
            "edit",
            cowspace_store::snapshot::Source::Workspace { id: "ws-7".into() },
            None,
        )
        .unwrap();
    assert_eq!(r.pinned_by.as_deref(), Some("ws-7"));
    assert!(store.pins().unwrap().contains(&(r.snapshot, "ws-7".into())));

    // The edit (pinned) and its parent, the base (its chain), stay.
    let g = store.gc(NOW).unwrap();
    assert!(g.snapshots_removed.is_empty(), "{g:?}");
    store.unpin("ws-7").unwrap();
    let g = store
        .gc(GcOptions {
            dry_run: true,
            ..NOW
        })
        .unwrap();
    assert_eq!(g.snapshots_removed.len(), 2, "{g:?}");
    assert!(g.snapshots.iter().all(|s| s.why.contains("grace")), "{g:?}");
    assert!(g.packs.iter().all(|p| p.action == "remove"), "{g:?}");
    assert!(!g.packs.is_empty());

    // Held (as the registry says a workspace holds it), it stays without a pin.
    let held = [cowspace_store::gc::Held {
        snapshot: r.snapshot,
        holder: "ws-7".into(),
    }];
    assert!(
        store
            .gc_holding(NOW, &held)
            .unwrap()
            .snapshots_removed
            .is_empty()
    );
    let g = store.gc(NOW).unwrap();
    assert_eq!(g.snapshots_removed.len(), 2, "{g:?}");
    assert!(store.snapshot(&r.snapshot).is_err());
    assert!(store.fsck().unwrap().is_clean());
}

/// A lock this process released is free for gc even while another thread is starting
/// child processes, each of which holds a copy of every descriptor between its fork and
/// its exec (the CI failure of `repack_refuses_while_an_import_holds_the_store`).
#[test]
fn a_released_lock_is_free_for_gc_while_children_are_being_started() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::init(&tmp.path().join("root"), StoreConfig::default()).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let uid = std::os::unix::fs::MetadataExt::uid(&fs::metadata("/proc/self").unwrap());
    let spawner = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut started = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // Setting the uid (to our own) makes std fork and exec rather than
                // posix_spawn, as a helper start does: the widest window there is.
                std::os::unix::process::CommandExt::uid(
                    &mut std::process::Command::new("true"),
                    uid,
                )
                .status()
                .unwrap();
                started += 1;
            }
            started
        })
    };
    let mut busy = 0;
    for _ in 0..2000 {
        let held = cowspace_store::lock::StoreLock::shared(&store).unwrap();
        drop(held);
        match cowspace_store::lock::StoreLock::exclusive(&store, false) {
            Ok(_) => {}
            Err(e) if e.kind() == cowspace_store::ErrorKind::Busy => busy += 1,
            Err(e) => panic!("{e}"),
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let started = spawner.join().unwrap();
    assert!(started > 0, "the spawner started no child");
    assert_eq!(
        busy, 0,
        "a released lock was reported busy {busy} times in 2000"
    );
}
