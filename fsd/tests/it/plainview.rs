//! The plain view (xattrs off), mounted for real: xattr reads never reach the daemon
//! after the first, kernel overlayfs works over it (copy-ups included), and it serves no
//! snapshot that has xattrs. Root with /dev/fuse; skipped otherwise, except under
//! `CI=true`.

use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use crate::common::{Env, can_run};
use cowspace_fsd::view::{ViewMount, ViewOptions, plain};
use cowspace_store::SnapshotId;

/// Files (in directories of ten) of the tree without xattrs.
const FILES: usize = 60;

/// Imports a tree of [`FILES`] files, with `user.x` on `d0/f0` when `with_xattr`.
fn import_tree(env: &Env, name: &str, with_xattr: bool) -> SnapshotId {
    let src = env.dir(name);
    for i in 0..FILES {
        let d = src.join(format!("d{}", i / 10));
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join(format!("f{}", i % 10)), format!("{name} {i}\n")).unwrap();
    }
    if with_xattr {
        xattr::set(src.join("d0/f0"), "user.x", b"value").unwrap();
    }
    env.import(&src)
}

/// The view at `name`, serving xattrs or not.
fn mount_view(env: &Env, name: &str, xattrs: bool) -> ViewMount {
    env.mount(
        name,
        ViewOptions {
            xattrs,
            ..Default::default()
        },
    )
}

/// An overlay as workspaces mount it; unmounted on drop (before the view's guard, which
/// is declared earlier and so dropped later).
struct Overlay {
    target: PathBuf,
    upper: PathBuf,
}

impl Overlay {
    fn mount(env: &Env, name: &str, lower: &Path) -> Overlay {
        let (upper, work, target) = (
            env.dir(&format!("{name}-upper")),
            env.dir(&format!("{name}-work")),
            env.dir(&format!("{name}-mnt")),
        );
        cowspace::mounts::mount_overlay(lower, &upper, &work, &target, true).unwrap();
        Overlay { target, upper }
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        if nix::mount::umount(&self.target).is_err() {
            let _ = cowspace::mounts::unmount_lazy(&self.target);
        }
    }
}

/// Stats every entry under `dir` (what `git status` or `find` does).
fn stat_walk(dir: &Path) -> usize {
    let mut n = 0;
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let m = fs::symlink_metadata(&p).unwrap();
        n += 1;
        if m.is_dir() {
            n += stat_walk(&p);
        }
    }
    n
}

fn errno(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

#[test]
fn the_plain_view_answers_xattr_reads_without_the_daemon() {
    if !can_run() {
        return;
    }
    let env = Env::new("cowspace-plainview-test-");
    let snap = import_tree(&env, "src", false);
    assert!(!plain::has_xattrs(&env.store, &snap).unwrap());
    let view = mount_view(&env, "plain", false);
    let top = view.mountpoint().join(snap.to_hex());

    let before = view.stats().xattr_requests;
    for i in 0..FILES {
        let f = top.join(format!("d{}/f{}", i / 10, i % 10));
        let e = xattr::get(&f, "user.overlay.metacopy").unwrap_err();
        assert_eq!(errno(&e), libc::EOPNOTSUPP, "getxattr {}: {e}", f.display());
        let e = xattr::list(&f).map(|_| ()).unwrap_err();
        assert_eq!(
            errno(&e),
            libc::EOPNOTSUPP,
            "listxattr {}: {e}",
            f.display()
        );
    }
    // The first of each reached the daemon (answered ENOSYS); the kernel asked no more.
    let asked = view.stats().xattr_requests - before;
    assert!(asked <= 2, "{asked} xattr requests reached the daemon");
    drop(view);
}

#[test]
fn overlayfs_over_the_plain_view_walks_and_copies_up_without_xattr_round_trips() {
    if !can_run() {
        return;
    }
    let env = Env::new("cowspace-plainview-test-");
    let snap = import_tree(&env, "src", false);
    assert!(!plain::has_xattrs(&env.store, &snap).unwrap());
    let full = mount_view(&env, "full", true);
    let plain = mount_view(&env, "plain", false);

    // A fresh overlay over the full view asks it for xattrs entry by entry.
    let before = full.stats().xattr_requests;
    let over_full = Overlay::mount(&env, "a", &full.mountpoint().join(snap.to_hex()));
    let entries = stat_walk(&over_full.target);
    assert_eq!(entries, FILES + FILES / 10);
    let asked_full = full.stats().xattr_requests - before;
    assert!(
        asked_full >= FILES as u64,
        "the full view was asked {asked_full} times for {entries} entries"
    );
    drop(over_full);

    // Over the plain view, two fresh overlays in a row ask at most once per request kind.
    let before = plain.stats().xattr_requests;
    for name in ["b", "c"] {
        let ws = Overlay::mount(&env, name, &plain.mountpoint().join(snap.to_hex()));
        assert_eq!(stat_walk(&ws.target), entries);
        assert_eq!(
            fs::read_to_string(ws.target.join("d3/f7")).unwrap(),
            "src 37\n"
        );
        // Copy-ups: a write to a file, a chmod, a new file in a lower directory, a
        // deletion, and an xattr set on a copied-up file (it lands in the upper layer).
        fs::write(ws.target.join("d0/f1"), "edited\n").unwrap();
        let f2 = ws.target.join("d0/f2");
        fs::set_permissions(&f2, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        fs::write(ws.target.join("d1/new"), "new\n").unwrap();
        fs::remove_file(ws.target.join("d2/f0")).unwrap();
        xattr::set(ws.target.join("d0/f1"), "user.added", b"1").unwrap();
        fs::rename(ws.target.join("d4/f4"), ws.target.join("d5/moved")).unwrap();

        assert_eq!(
            fs::read_to_string(ws.upper.join("d0/f1")).unwrap(),
            "edited\n"
        );
        assert_eq!(
            xattr::get(ws.upper.join("d0/f1"), "user.added").unwrap(),
            Some(b"1".to_vec())
        );
        assert_eq!(
            fs::read_to_string(ws.upper.join("d0/f2")).unwrap(),
            "src 2\n"
        );
        assert_eq!(
            fs::read_to_string(ws.upper.join("d1/new")).unwrap(),
            "new\n"
        );
        assert_eq!(
            fs::read_to_string(ws.target.join("d5/moved")).unwrap(),
            "src 44\n"
        );
        assert_eq!(
            fs::metadata(ws.target.join("d2/f0")).unwrap_err().kind(),
            ErrorKind::NotFound
        );
        assert_eq!(stat_walk(&ws.target), entries);
    }
    let asked_plain = plain.stats().xattr_requests - before;
    assert!(
        asked_plain <= 2,
        "{asked_plain} xattr requests reached the plain view"
    );
    // The lower layer is untouched.
    let lower = plain.mountpoint().join(snap.to_hex());
    assert_eq!(fs::read_to_string(lower.join("d0/f1")).unwrap(), "src 1\n");
    drop(plain);
    drop(full);
}

#[test]
fn the_plain_view_serves_no_snapshot_with_xattrs_nor_an_unknown_one() {
    if !can_run() {
        return;
    }
    let env = Env::new("cowspace-plainview-test-");
    let with = import_tree(&env, "with", true);
    let unknown = import_tree(&env, "unknown", false);
    assert!(plain::has_xattrs(&env.store, &with).unwrap());
    assert_eq!(plain::recorded(&env.store, &unknown), None);
    let full = mount_view(&env, "full", true);
    let plain_view = mount_view(&env, "plain", false);

    for snap in [&with, &unknown] {
        let e = fs::metadata(plain_view.mountpoint().join(snap.to_hex())).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound, "{}", snap.to_hex());
    }
    // The full view serves both, xattrs included.
    let f = full.mountpoint().join(with.to_hex()).join("d0/f0");
    assert_eq!(xattr::get(&f, "user.x").unwrap(), Some(b"value".to_vec()));
    assert!(full.mountpoint().join(unknown.to_hex()).join("d0").is_dir());

    // Once recorded as having none, the unknown one appears in the plain view.
    assert!(!plain::has_xattrs(&env.store, &unknown).unwrap());
    assert!(
        plain_view
            .mountpoint()
            .join(unknown.to_hex())
            .join("d0")
            .is_dir()
    );

    // A marker that lies (says none for a snapshot with xattrs) is refused entry by
    // entry, never served without its xattrs.
    fs::write(plain::marker_path(&env.store, &with), "none\n").unwrap();
    let top = plain_view.mountpoint().join(with.to_hex());
    let e = fs::metadata(top.join("d0/f0")).unwrap_err();
    assert_eq!(errno(&e), libc::EIO, "{e}");
    assert_eq!(fs::read_to_string(top.join("d0/f1")).unwrap(), "with 1\n");
    drop(plain_view);
    drop(full);
}
