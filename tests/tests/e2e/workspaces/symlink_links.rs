//! A hard link of a symlink itself (`ln -P`, `link(2)` on the symlink) in a workspace of
//! every materializer: the workspace shows one inode with two names, the commit records
//! them as one symlink with two names, its export makes them again with `linkat`, and a
//! new workspace of the commit shows one inode with two names.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use cowspace_tests::write_file;

use super::support::{WsRoot, require_root};

/// The materializers (and lowers) checked. (Overlay over the native lower shows a
/// snapshot's linked symlink as two symlinks: docs/CONFORMANCE.md.)
const KINDS: [&[&str]; 5] = [
    &["--materializer", "overlay", "--lower", "native"],
    &["--materializer", "overlay", "--lower", "view"],
    &["--materializer", "overlay", "--lower", "checkout"],
    &["--materializer", "fuse"],
    &["--materializer", "copy"],
];

/// (ino, nlink) of a name that must be a symlink to `file`, not followed.
#[track_caller]
fn symlink_inode(p: &Path, what: &str) -> (u64, u64) {
    let m = fs::symlink_metadata(p).unwrap_or_else(|e| panic!("{what}: {}: {e}", p.display()));
    assert!(
        m.file_type().is_symlink(),
        "{what}: {} is no symlink",
        p.display()
    );
    assert_eq!(
        fs::read_link(p).unwrap(),
        Path::new("file"),
        "{what}: target of {}",
        p.display()
    );
    (m.ino(), m.nlink())
}

/// Both names (`s` and `second`) are one inode with two links.
#[track_caller]
fn one_inode_two_names(dir: &Path, second: &str, what: &str) {
    let (a, na) = symlink_inode(&dir.join("s"), what);
    let (b, nb) = symlink_inode(&dir.join(second), what);
    assert_eq!(a, b, "{what}: s and {second} are one inode");
    assert_eq!((na, nb), (2, 2), "{what}: link counts");
    // The plain symlink beside them is its own inode.
    let (c, nc) = symlink_inode(&dir.join("other"), what);
    assert_ne!(c, a, "{what}: other");
    assert_eq!(nc, 1, "{what}: other's link count");
}

#[test]
fn a_hard_link_of_a_symlink_is_committed_as_one_symlink_with_two_names() {
    require_root!();
    let r = WsRoot::new();
    let src = r.t.path("src");
    write_file(&src.join("file"), "content\n");
    write_file(&src.join("d/keep"), "keep\n");
    std::os::unix::fs::symlink("file", src.join("s")).unwrap();
    std::os::unix::fs::symlink("file", src.join("other")).unwrap();
    let base = r.import(&src, &[]);
    for kind in KINDS {
        let what = kind.join(" ");
        let ws = r.create(&base, kind);
        // link(2) of the symlink itself: std's hard_link does not follow it.
        fs::hard_link(ws.path.join("s"), ws.path.join("d/s2"))
            .unwrap_or_else(|e| panic!("{what}: ln -P: {e}"));
        one_inode_two_names(&ws.path, "d/s2", &format!("{what}, workspace"));

        let (snap, _, _) = r.commit(&ws.id, &[]);
        let out = r.t.path(&format!("export-{}", kind.join("-")));
        r.t.run(["export", snap.as_str(), out.to_str().unwrap()])
            .ok();
        one_inode_two_names(&out, "d/s2", &format!("{what}, export"));

        let again = r.create(&snap, kind);
        one_inode_two_names(
            &again.path,
            "d/s2",
            &format!("{what}, workspace of the commit"),
        );
        // A change elsewhere, and a rename of the directory holding the second name,
        // keep them one symlink in the next commit.
        write_file(&again.path.join("d/keep"), "changed\n");
        fs::rename(again.path.join("d"), again.path.join("e"))
            .unwrap_or_else(|e| panic!("{what}: rename d: {e}"));
        one_inode_two_names(&again.path, "e/s2", &format!("{what}, after the rename"));
        let (next, _, _) = r.commit(&again.id, &[]);
        let out = r.t.path(&format!("export-next-{}", kind.join("-")));
        r.t.run(["export", next.as_str(), out.to_str().unwrap()])
            .ok();
        one_inode_two_names(&out, "e/s2", &format!("{what}, export of the next commit"));
        assert_eq!(
            fs::read(out.join("e/keep")).unwrap(),
            b"changed\n",
            "{what}"
        );
        r.remove(&again.id);
        r.remove(&ws.id);
    }
}
