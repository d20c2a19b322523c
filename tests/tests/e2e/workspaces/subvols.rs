//! `gc` deletes the btrfs base subvolumes no live workspace uses (they are made once per
//! snapshot, at its first btrfs workspace), keeps the ones in use, and a later create
//! builds a deleted one again. On a btrfs loop filesystem.

use cowspace_tests::{LoopFs, LoopKind};

use super::base_tree;
use super::support::{WsRoot, require_root};

#[test]
fn gc_deletes_unused_btrfs_bases_and_keeps_used_ones() {
    require_root!();
    let fs = match LoopFs::new(LoopKind::Btrfs) {
        Ok(fs) => fs,
        Err(why) if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("a btrfs loop filesystem under CI=true: {why}")
        }
        Err(why) => {
            eprintln!("SKIPPED: a btrfs loop filesystem: {why}");
            return;
        }
    };
    let r = WsRoot::new_in(fs.mnt());
    let src = r.t.path("src");
    base_tree(&src);
    let a = r.import(&src, &[]);
    std::fs::write(src.join("added.txt"), "another snapshot\n").unwrap();
    let b = r.import(&src, &[]);
    let bases = r.root().join("cache/subvols");

    let wa = r.create(&a, &["--materializer", "btrfs"]);
    let wb = r.create(&b, &["--materializer", "btrfs"]);
    assert!(bases.join(&a).is_dir() && bases.join(&b).is_dir());

    // Both in use: nothing goes.
    let gc = r.t.json(["gc"]).ok().json();
    assert_eq!(gc["subvolumes_removed"], 0, "{gc}");
    // b's workspace gone: its base goes, a's stays (and its workspace works).
    r.remove(&wb.id);
    let gc = r.t.json(["gc"]).ok().json();
    assert_eq!(gc["subvolumes_removed"], 1, "{gc}");
    assert!(!bases.join(&b).exists() && !bases.join(format!("{b}.stamps")).exists());
    assert!(bases.join(&a).is_dir());
    assert!(wa.path.join("added.txt").symlink_metadata().is_err());
    // A new workspace of b builds its base again.
    let wb2 = r.create(&b, &["--materializer", "btrfs"]);
    assert_eq!(
        std::fs::read_to_string(wb2.path.join("added.txt")).unwrap(),
        "another snapshot\n"
    );
    r.remove(&wa.id);
    r.remove(&wb2.id);
    r.assert_clean();
}
