//! Which view serves a `--lower view` workspace: a snapshot without any xattrs is served
//! by the plain view (`run/view-plain`, no xattr round trips), one with xattrs by the
//! full view (`run/view`), which shows them; a commit keeps them, and a commit that adds
//! the first xattr moves the next workspace to the full view. `import` records which
//! (`cache/xattrs/<snapshot>`); a snapshot without a record is walked at its first
//! workspace.

use std::path::{Path, PathBuf};

use cowspace_tests::write_file;

use super::support::{WsRoot, require_root};

/// The lower directory recorded for `ws`.
fn lower_of(r: &WsRoot, ws: &str) -> PathBuf {
    PathBuf::from(r.status(ws)["lower"].as_str().expect("status lower"))
}

/// The view (`view` or `view-plain`) a lower path lies in.
fn view_of(r: &WsRoot, lower: &Path) -> String {
    let rel = lower
        .strip_prefix(r.root().join("run"))
        .unwrap_or_else(|_| panic!("{} is not under run/", lower.display()));
    rel.components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy()
        .into_owned()
}

fn get(p: &Path, name: &str) -> Option<Vec<u8>> {
    xattr::get(p, name).unwrap_or_else(|e| panic!("getxattr {} {name}: {e}", p.display()))
}

fn tree(dir: &Path, tag: &str) {
    write_file(&dir.join("a/one.txt"), format!("{tag} one\n"));
    write_file(&dir.join("a/b/two.txt"), format!("{tag} two\n"));
    write_file(&dir.join("three.txt"), format!("{tag} three\n"));
}

#[test]
fn a_snapshot_with_xattrs_keeps_them_and_one_without_uses_the_plain_view() {
    require_root!();
    let r = WsRoot::new();

    // Without xattrs: the plain view, and the answer recorded under cache/.
    let plain_src = r.t.path("plain");
    tree(&plain_src, "plain");
    let plain_snap = r.import(&plain_src, &[]);
    let marker = r.root().join("cache/xattrs").join(&plain_snap);
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "none\n");
    // A snapshot not yet recorded is walked by its first workspace.
    std::fs::remove_file(&marker).unwrap();
    let ws = r.create(&plain_snap, &["--lower", "view"]);
    let lower = lower_of(&r, &ws.id);
    assert_eq!(view_of(&r, &lower), "view-plain");
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "none\n");
    assert_eq!(
        std::fs::read_to_string(ws.path.join("a/b/two.txt")).unwrap(),
        "plain two\n"
    );
    // Unmodified entries there have no xattrs to read: the lower filesystem says it
    // supports none (EOPNOTSUPP, as a filesystem without xattrs does).
    let e = xattr::list(ws.path.join("a/one.txt"))
        .map(|_| ())
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EOPNOTSUPP), "{e}");
    // A second workspace of it uses the plain view too; both see their own writes.
    let ws2 = r.create(&plain_snap, &["--lower", "view"]);
    assert_eq!(view_of(&r, &lower_of(&r, &ws2.id)), "view-plain");
    std::fs::write(ws.path.join("a/one.txt"), "edited\n").unwrap();
    assert_eq!(
        std::fs::read_to_string(ws2.path.join("a/one.txt")).unwrap(),
        "plain one\n"
    );
    // The first xattr, added in the workspace, is committed; the commit's workspaces
    // are served by the full view, which shows it.
    xattr::set(ws.path.join("a/one.txt"), "user.added", b"later").unwrap();
    let (added_snap, _, _) = r.commit(&ws.id, &[]);
    let ws3 = r.create(&added_snap, &["--lower", "view"]);
    assert_eq!(view_of(&r, &lower_of(&r, &ws3.id)), "view");
    assert_eq!(
        get(&ws3.path.join("a/one.txt"), "user.added"),
        Some(b"later".to_vec())
    );
    assert_eq!(
        std::fs::read_to_string(ws3.path.join("a/one.txt")).unwrap(),
        "edited\n"
    );

    // With xattrs (on a file, a directory and a file left alone): the full view.
    let x_src = r.t.path("withx");
    tree(&x_src, "withx");
    xattr::set(x_src.join("a/one.txt"), "user.color", b"blue").unwrap();
    xattr::set(x_src.join("a/b"), "user.dir", b"d").unwrap();
    xattr::set(x_src.join("three.txt"), "user.kept", b"k").unwrap();
    let x_snap = r.import(&x_src, &[]);
    let wx = r.create(&x_snap, &["--lower", "view"]);
    assert_eq!(view_of(&r, &lower_of(&r, &wx.id)), "view");
    assert_eq!(
        std::fs::read_to_string(r.root().join("cache/xattrs").join(&x_snap)).unwrap(),
        "some\n"
    );
    assert_eq!(
        get(&wx.path.join("a/one.txt"), "user.color"),
        Some(b"blue".to_vec())
    );
    assert_eq!(get(&wx.path.join("a/b"), "user.dir"), Some(b"d".to_vec()));
    // A copy-up keeps the lower file's xattrs; a commit keeps them all.
    std::fs::write(wx.path.join("a/one.txt"), "edited with x\n").unwrap();
    assert_eq!(
        get(&wx.path.join("a/one.txt"), "user.color"),
        Some(b"blue".to_vec())
    );
    let (x_commit, _, _) = r.commit(&wx.id, &[]);
    let wy = r.create(&x_commit, &["--lower", "view"]);
    assert_eq!(view_of(&r, &lower_of(&r, &wy.id)), "view");
    assert_eq!(
        std::fs::read_to_string(wy.path.join("a/one.txt")).unwrap(),
        "edited with x\n"
    );
    assert_eq!(
        get(&wy.path.join("a/one.txt"), "user.color"),
        Some(b"blue".to_vec())
    );
    assert_eq!(get(&wy.path.join("a/b"), "user.dir"), Some(b"d".to_vec()));
    assert_eq!(
        get(&wy.path.join("three.txt"), "user.kept"),
        Some(b"k".to_vec())
    );
    // The plain view does not show the snapshot with xattrs at all.
    assert!(!r.root().join("run/view-plain").join(&x_snap).exists());

    // A daemon restart stops every view workspace, and recover mounts each on its view.
    r.t.run(["daemon", "stop", "--force"]).ok();
    for w in [&ws, &wy] {
        r.t.json(["recover", w.id.as_str()]).ok();
    }
    assert_eq!(
        std::fs::read_to_string(ws.path.join("a/one.txt")).unwrap(),
        "edited\n"
    );
    assert_eq!(
        get(&wy.path.join("three.txt"), "user.kept"),
        Some(b"k".to_vec())
    );

    for w in [&ws, &ws2, &ws3, &wx, &wy] {
        r.remove(&w.id);
    }
    r.assert_clean();
}
