//! The read-only snapshot view, mounted for real (root with /dev/fuse; skipped otherwise,
//! except under `CI=true` where a missing privilege fails the run).

use std::collections::BTreeMap;
use std::fs;
use std::io::{ErrorKind, Read};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{Env, can_run};
use cowspace_fsd::view::{ReadMode, VIEW_TIME_SECS, ViewMount, ViewOptions};
use cowspace_store::{Store, StoreConfig};

/// Deterministic incompressible bytes.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Builds the varied tree the view is compared against.
fn varied_tree(root: &Path) {
    let w = |p: &str, data: &[u8], mode: u32| {
        let p = root.join(p);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, data).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
    };
    w("a/b/c/deep.txt", b"deep\n", 0o644);
    w("exec.sh", b"#!/bin/sh\necho hi\n", 0o755);
    w("empty", b"", 0o600);
    w("big.bin", &noise(3 << 20, 7), 0o644);
    w("setgid", b"g", 0o2755);
    w("hard1", b"linked\n", 0o640);
    fs::hard_link(root.join("hard1"), root.join("a/hard2")).unwrap();
    fs::create_dir_all(root.join("empty_dir")).unwrap();
    fs::create_dir_all(root.join("sticky")).unwrap();
    fs::set_permissions(root.join("sticky"), fs::Permissions::from_mode(0o1777)).unwrap();
    std::os::unix::fs::symlink("a/b/c/deep.txt", root.join("link")).unwrap();
    std::os::unix::fs::symlink("../nowhere", root.join("a/dangling")).unwrap();
    w("xattr.txt", b"x", 0o644);
    xattr::set(root.join("xattr.txt"), "user.x", b"value").unwrap();
}

/// Compares `got` (in the view) with `want` (the source), recursively.
fn assert_same_tree(want: &Path, got: &Path) {
    let names = |p: &Path| {
        let mut v: Vec<_> = fs::read_dir(p)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(want), names(got), "names in {}", got.display());
    for name in names(want) {
        let (w, g) = (want.join(&name), got.join(&name));
        let (wm, gm) = (
            fs::symlink_metadata(&w).unwrap(),
            fs::symlink_metadata(&g).unwrap(),
        );
        let what = g.display().to_string();
        assert_eq!(wm.file_type(), gm.file_type(), "{what}");
        assert_eq!(wm.mode() & 0o7777, gm.mode() & 0o7777, "{what}");
        assert_eq!(gm.mtime(), VIEW_TIME_SECS as i64, "{what}");
        assert_eq!(gm.ctime(), VIEW_TIME_SECS as i64, "{what}");
        assert!(gm.ino() >= 2 && gm.ino() < 1 << 48, "{what}");
        if wm.is_dir() {
            // 2 + subdirectories, as the source directory (ext4) counts.
            assert_eq!(gm.nlink(), wm.nlink(), "{what}");
            assert_same_tree(&w, &g);
        } else if wm.file_type().is_symlink() {
            assert_eq!(
                fs::read_link(&w).unwrap(),
                fs::read_link(&g).unwrap(),
                "{what}"
            );
        } else {
            assert_eq!(wm.len(), gm.len(), "{what}");
            assert_eq!(gm.blocks(), wm.len().div_ceil(512), "{what}");
            assert!(
                fs::read(&w).unwrap() == fs::read(&g).unwrap(),
                "{what}: contents"
            );
            let list = |p: &Path| {
                let mut v: Vec<_> = xattr::list(p).unwrap().collect();
                v.sort();
                v
            };
            assert_eq!(list(&w), list(&g), "{what}: xattr names");
            for n in list(&w) {
                assert_eq!(
                    xattr::get(&w, &n).unwrap(),
                    xattr::get(&g, &n).unwrap(),
                    "{what}"
                );
            }
        }
    }
}

/// `path → (ino, mtime)` of every entry below `root`.
fn identities(root: &Path) -> BTreeMap<PathBuf, (u64, i64)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let m = fs::symlink_metadata(&p).unwrap();
            out.insert(
                p.strip_prefix(root).unwrap().to_path_buf(),
                (m.ino(), m.mtime()),
            );
            if m.is_dir() {
                stack.push(p);
            }
        }
    }
    out
}

fn errno(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

/// An overlay mounted over the view; unmounted on drop (before the view's guard, which
/// is declared earlier and so dropped later).
struct Overlay(PathBuf);

impl Overlay {
    /// Mounts kernel overlayfs at `target` over `lower` with cowspace's options (fresh
    /// `upper` and `work` directories of `env`); unmounted on drop.
    fn mount(env: &Env, lower: &Path, target: &Path) -> Overlay {
        let status = Command::new("mount")
            .args(["-t", "overlay", "overlay", "-o"])
            .arg(format!(
                "lowerdir={},upperdir={},workdir={},userxattr,redirect_dir=nofollow,index=off,metacopy=off",
                lower.display(),
                env.dir("upper").display(),
                env.dir("work").display()
            ))
            .arg(target)
            .status()
            .unwrap();
        assert!(status.success(), "mount -t overlay over the view: {status}");
        Overlay(target.to_path_buf())
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        if nix::mount::umount(&self.0).is_err() {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

#[test]
fn the_view_shows_the_imported_tree() {
    if !can_run() {
        return;
    }
    let env = Env::new("cowspace-view-test-");
    let src = env.dir("src");
    varied_tree(&src);
    let snap = env.import(&src);
    let view = env.mount("mnt", ViewOptions::default());
    let top = view.mountpoint().join(snap.to_hex());
    assert_same_tree(&src, &top);

    let meta = |p: &str| fs::symlink_metadata(top.join(p)).unwrap();
    assert_eq!(
        meta("hard1").ino(),
        meta("a/hard2").ino(),
        "one inode per link group"
    );
    assert_ne!(meta("hard1").ino(), meta("exec.sh").ino());
    let root_owner = fs::metadata(env.store.root()).unwrap();
    assert_eq!(
        (meta("exec.sh").uid(), meta("exec.sh").gid()),
        (root_owner.uid(), root_owner.gid())
    );
    // The mount root lists nothing but resolves snapshots.
    assert_eq!(fs::read_dir(view.mountpoint()).unwrap().count(), 0);
    assert!(fs::metadata(&top).unwrap().is_dir());
    view.unmount().unwrap();
}

#[test]
fn every_write_is_erofs() {
    if !can_run() {
        return;
    }
    let env = Env::new("cowspace-view-test-");
    let src = env.dir("src");
    varied_tree(&src);
    let snap = env.import(&src);
    let view = env.mount("mnt", ViewOptions::default());
    let top = view.mountpoint().join(snap.to_hex());
    let erofs = |r: std::io::Result<()>, what: &str| {
        let e = r.expect_err(what);
        assert_eq!(errno(&e), libc::EROFS, "{what}: {e}");
    };
    erofs(fs::File::create(top.join("new")).map(drop), "create");
    erofs(
        fs::OpenOptions::new()
            .write(true)
            .open(top.join("exec.sh"))
            .map(drop),
        "open for writing",
    );
    erofs(fs::remove_file(top.join("exec.sh")), "unlink");
    erofs(fs::create_dir(top.join("d")), "mkdir");
    erofs(
        fs::set_permissions(top.join("exec.sh"), fs::Permissions::from_mode(0o700)),
        "chmod",
    );
    erofs(fs::rename(top.join("exec.sh"), top.join("x")), "rename");
    erofs(xattr::set(top.join("exec.sh"), "user.y", b"1"), "setxattr");
    assert_eq!(
        fs::read(top.join("exec.sh")).unwrap(),
        b"#!/bin/sh\necho hi\n"
    );
}

#[test]
fn identities_are_stable_across_mounts_and_snapshots() {
    if !can_run() {
        return;
    }
    let env = Env::new("cowspace-view-test-");
    let src = env.dir("src");
    varied_tree(&src);
    let snap = env.import(&src);
    let first = {
        let view = env.mount("mnt", ViewOptions::default());
        let ids = identities(&view.mountpoint().join(snap.to_hex()));
        view.unmount().unwrap();
        ids
    };
    // A fresh store handle and a fresh daemon: the same numbers.
    let store = Arc::new(Store::open(env.store.root(), StoreConfig::default()).unwrap());
    let view = ViewMount::mount(store, &env.dir("mnt"), ViewOptions::default()).unwrap();
    assert_eq!(first, identities(&view.mountpoint().join(snap.to_hex())));
    assert!(
        first
            .values()
            .all(|(_, mtime)| *mtime == VIEW_TIME_SECS as i64)
    );

    // A second snapshot sharing most files at the same paths.
    fs::write(src.join("exec.sh"), b"#!/bin/sh\necho changed\n").unwrap();
    fs::write(src.join("added"), b"new").unwrap();
    let snap2 = env.import(&src);
    assert_ne!(snap, snap2);
    let second = identities(&view.mountpoint().join(snap2.to_hex()));
    let ino = |ids: &BTreeMap<PathBuf, (u64, i64)>, p: &str| ids[Path::new(p)].0;
    for shared in [
        "big.bin",
        "a/b/c/deep.txt",
        "hard1",
        "a/hard2",
        "link",
        "empty",
    ] {
        assert_eq!(ino(&first, shared), ino(&second, shared), "{shared}");
    }
    assert_ne!(
        ino(&first, "exec.sh"),
        ino(&second, "exec.sh"),
        "changed content"
    );
    // Directories belong to one snapshot each.
    assert_ne!(ino(&first, "a"), ino(&second, "a"));
}

#[test]
fn overlayfs_accepts_the_view_as_its_lower_layer() {
    if !can_run() {
        return;
    }
    let env = Env::new("cowspace-view-test-");
    let src = env.dir("src");
    varied_tree(&src);
    let snap = env.import(&src);
    let view = env.mount("mnt", ViewOptions::default());
    let lower = view.mountpoint().join(snap.to_hex());
    let target = env.dir("ws");
    let overlay = Overlay::mount(&env, &lower, &target);
    let upper = env.path("upper");

    assert_eq!(fs::read(target.join("a/b/c/deep.txt")).unwrap(), b"deep\n");
    assert_eq!(fs::read(target.join("big.bin")).unwrap(), noise(3 << 20, 7));
    fs::write(target.join("exec.sh"), b"edited").unwrap();
    fs::write(target.join("a/new.txt"), b"new").unwrap();
    assert_eq!(fs::read(upper.join("exec.sh")).unwrap(), b"edited");
    assert_eq!(fs::read(upper.join("a/new.txt")).unwrap(), b"new");
    assert_eq!(
        fs::read(lower.join("exec.sh")).unwrap(),
        b"#!/bin/sh\necho hi\n"
    );
    drop(overlay);
    view.unmount().unwrap();
}

#[test]
fn hard_links_have_one_inode_and_their_true_link_count() {
    if !can_run() {
        return;
    }
    let env = Env::new("cowspace-view-test-");
    let src = env.dir("src");
    fs::create_dir_all(src.join("d")).unwrap();
    fs::write(src.join("a"), b"linked\n").unwrap();
    fs::hard_link(src.join("a"), src.join("d/b")).unwrap();
    fs::write(src.join("single"), b"one name\n").unwrap();
    let linked = env.import(&src);
    fs::remove_file(src.join("d/b")).unwrap();
    let unlinked = env.import(&src);
    let view = env.mount("mnt", ViewOptions::default());
    let top = view.mountpoint().join(linked.to_hex());
    let (a, b) = (
        fs::metadata(top.join("a")).unwrap(),
        fs::metadata(top.join("d/b")).unwrap(),
    );
    assert_eq!((a.ino(), a.nlink()), (b.ino(), 2));
    assert_eq!(fs::metadata(top.join("single")).unwrap().nlink(), 1);
    // The same file with one name in another snapshot is another inode: the kernel keeps
    // one link count per inode.
    let alone = fs::metadata(view.mountpoint().join(unlinked.to_hex()).join("a")).unwrap();
    assert_eq!(alone.nlink(), 1);
    assert_ne!(alone.ino(), a.ino());

    // overlayfs over the view treats the pair as the hard links they are: linking one
    // name anew and renaming the names onto each other works as over a plain directory
    // (with a link count of 1 overlayfs kept the lower number for the copied-up name and
    // gave the new link the upper one, and the renames failed with ESTALE).
    let ws = env.dir("ws");
    let _overlay = Overlay::mount(&env, &top, &ws);
    fs::hard_link(ws.join("a"), ws.join("c")).unwrap();
    fs::rename(ws.join("c"), ws.join("a")).unwrap();
    fs::rename(ws.join("a"), ws.join("c")).unwrap();
    let (a, c) = (
        fs::metadata(ws.join("a")).unwrap(),
        fs::metadata(ws.join("c")).unwrap(),
    );
    assert_eq!(a.ino(), c.ino());
    assert_eq!(fs::read(ws.join("d/b")).unwrap(), b"linked\n");
}

#[test]
fn passthrough_reads_bypass_the_daemon() {
    if !can_run() {
        return;
    }
    let env = Env::new("cowspace-view-test-");
    let src = env.dir("src");
    varied_tree(&src);
    let snap = env.import(&src);
    let want = noise(3 << 20, 7);

    let pt = ViewOptions {
        read_mode: ReadMode::Passthrough,
        ..ViewOptions::default()
    };
    let view = env.mount("pt", pt);
    assert!(view.passthrough(), "this kernel offers FUSE passthrough");
    let p = view.mountpoint().join(snap.to_hex()).join("big.bin");
    assert!(fs::read(&p).unwrap() == want);
    // Twice at once: one backing file shared by both opens.
    let (mut f1, mut f2) = (fs::File::open(&p).unwrap(), fs::File::open(&p).unwrap());
    let (mut b1, mut b2) = (Vec::new(), Vec::new());
    f1.read_to_end(&mut b1).unwrap();
    f2.read_to_end(&mut b2).unwrap();
    assert!(b1 == want && b2 == want);
    let s = view.stats();
    assert_eq!(s.reads, 0, "{s:?}");
    assert!(s.passthrough_opens >= 3, "{s:?}");

    let opts = ViewOptions {
        read_mode: ReadMode::Served,
        ..ViewOptions::default()
    };
    let plain = env.mount("plain", opts);
    assert!(!plain.passthrough());
    let p = plain.mountpoint().join(snap.to_hex()).join("big.bin");
    assert!(fs::read(&p).unwrap() == want);
    let s = plain.stats();
    assert!(s.reads > 0 && s.read_bytes >= want.len() as u64, "{s:?}");
    assert_eq!(s.passthrough_opens, 0, "{s:?}");
}

#[test]
fn cached_mode_asks_the_daemon_to_open_once_and_keeps_pages_across_opens() {
    if !can_run() {
        return;
    }
    let env = Env::new("cowspace-view-test-");
    let src = env.dir("src");
    varied_tree(&src);
    let snap = env.import(&src);
    let want = noise(3 << 20, 7);

    let view = env.mount("cached", ViewOptions::default());
    assert!(!view.passthrough(), "{:?}", view.stats());
    let top = view.mountpoint().join(snap.to_hex());
    let ids = identities(&top);
    // Every file opened and read, twice: one open request in all (answered "not
    // implemented", which the kernel remembers for the connection).
    for _ in 0..2 {
        for p in ids.keys().filter(|p| top.join(p).is_file()) {
            fs::read(top.join(p)).unwrap();
        }
    }
    assert!(fs::read(top.join("big.bin")).unwrap() == want);
    let s = view.stats();
    assert_eq!(s.opens, 1, "{s:?}");
    assert!(s.reads > 0 && s.read_bytes >= want.len() as u64, "{s:?}");
    // The pages stay cached across opens: reading again asks the daemon for nothing.
    fs::read(top.join("big.bin")).unwrap();
    assert_eq!(view.stats().reads, s.reads, "{:?}", view.stats());
    // Listings too are served by inode, without directory handles.
    let again = identities(&top);
    assert_eq!(ids, again);
}

#[test]
fn unknown_snapshots_are_enoent_and_corrupt_data_is_eio() {
    if !can_run() {
        return;
    }
    let env = Env::new("cowspace-view-test-");
    let src = env.dir("src");
    fs::write(src.join("big.bin"), noise(3_000_000, 88172645463325252)).unwrap();
    fs::write(src.join("small.txt"), "small\n").unwrap();
    let snap = env.import(&src);

    // Flip one byte inside the big file's chunks (as store/tests/corrupt.rs does).
    let pack = fs::read_dir(env.store.root().join("store/packs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "pack"))
        .max_by_key(|p| fs::metadata(p).unwrap().len())
        .unwrap();
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&pack)
        .unwrap();
    let mut b = [0u8; 1];
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut b, 1_000_000).unwrap();
    b[0] ^= 0x40;
    std::os::unix::fs::FileExt::write_all_at(&f, &b, 1_000_000).unwrap();
    drop(f);

    let view = env.mount("mnt", ViewOptions::default());
    let mnt = view.mountpoint();
    for name in ["0".repeat(64), "nope".into(), snap.to_hex().to_uppercase()] {
        let e = fs::metadata(mnt.join(&name)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound, "{name}");
    }
    let top = mnt.join(snap.to_hex());
    assert_eq!(fs::read(top.join("small.txt")).unwrap(), b"small\n");
    let err = match fs::File::open(top.join("big.bin")) {
        Err(e) => e,
        Ok(mut f) => f.read_to_end(&mut Vec::new()).unwrap_err(),
    };
    assert_eq!(errno(&err), libc::EIO, "{err}");
    let missing = fs::metadata(top.join("no-such-file")).unwrap_err();
    assert_eq!(missing.kind(), ErrorKind::NotFound);
}

#[test]
fn dropping_caches_forgets_inodes() {
    if !can_run() {
        return;
    }
    let env = Env::new("cowspace-view-test-");
    let src = env.dir("src");
    for d in 0..10 {
        for f in 0..30 {
            let p = src.join(format!("d{d}/f{f}"));
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, format!("{d}/{f}")).unwrap();
        }
    }
    let snap = env.import(&src);
    let view = env.mount("mnt", ViewOptions::default());
    let ids = identities(&view.mountpoint().join(snap.to_hex()));
    assert_eq!(ids.len(), 310);
    let held = view.stats().inodes;
    assert!(held >= 310, "{:?}", view.stats());

    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
        std::thread::sleep(Duration::from_millis(100));
        // Every lookup given (lookup and readdirplus alike) comes back: nothing leaks.
        if view.stats().inodes == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "inodes still held: {:?}",
            view.stats()
        );
    }
    // Everything is found again after being forgotten, with the same numbers.
    assert_eq!(ids, identities(&view.mountpoint().join(snap.to_hex())));
}

#[test]
fn fifos_and_special_bits_are_served() {
    if !can_run() {
        return;
    }
    let env = Env::new("cowspace-view-test-");
    let src = env.dir("src");
    nix::unistd::mkfifo(
        &src.join("pipe"),
        nix::sys::stat::Mode::from_bits_truncate(0o640),
    )
    .unwrap();
    let snap = env.import(&src);
    let view = env.mount("mnt", ViewOptions::default());
    let m = fs::symlink_metadata(view.mountpoint().join(snap.to_hex()).join("pipe")).unwrap();
    assert!(m.file_type().is_fifo());
    assert_eq!(m.mode() & 0o7777, 0o640);
}

/// Reads `p` to the end with 1 MiB reads; returns seconds.
fn time_read(p: &Path) -> f64 {
    let mut f = fs::File::open(p).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let t = Instant::now();
    while f.read(&mut buf).unwrap() > 0 {}
    t.elapsed().as_secs_f64()
}

fn drop_page_cache() {
    // Dirty pages (a file just written) are not dropped: write them back first.
    nix::unistd::sync();
    fs::write("/proc/sys/vm/drop_caches", "1").unwrap();
}

/// Figures for the docs, not a check: `cargo test -p cowspace-fsd --release --test it view
/// -- --ignored --nocapture read_speed`.
#[test]
#[ignore = "benchmark; run by hand"]
fn read_speed_of_a_100_mib_file() {
    if !can_run() {
        return;
    }
    const MIB: usize = 1 << 20;
    let env = Env::new("cowspace-view-test-");
    let src = env.dir("src");
    fs::write(src.join("big.bin"), noise(100 * MIB, 3)).unwrap();
    let snap = env.import(&src);
    let pt = env.mount(
        "pt",
        ViewOptions {
            read_mode: ReadMode::Passthrough,
            ..ViewOptions::default()
        },
    );
    let plain = env.mount(
        "plain",
        ViewOptions {
            read_mode: ReadMode::Served,
            ..ViewOptions::default()
        },
    );
    let cached = env.mount("cached", ViewOptions::default());
    let pt_file = pt.mountpoint().join(snap.to_hex()).join("big.bin");
    let t = Instant::now();
    drop(fs::File::open(&pt_file).unwrap());
    println!(
        "first open (blob cache materialised): {:.3} s",
        t.elapsed().as_secs_f64()
    );
    let _overlay = Overlay::mount(&env, &pt.mountpoint().join(snap.to_hex()), &env.dir("ws"));
    let cases = [
        ("ext4 (source file)", src.join("big.bin")),
        ("view, passthrough", pt_file.clone()),
        (
            "view, daemon reads",
            plain.mountpoint().join(snap.to_hex()).join("big.bin"),
        ),
        (
            "view, cached (no opens)",
            cached.mountpoint().join(snap.to_hex()).join("big.bin"),
        ),
        (
            "overlay over view (passthrough)",
            env.path("ws").join("big.bin"),
        ),
    ];
    const RUNS: usize = 5;
    let mut cold = vec![Vec::new(); cases.len()];
    let mut warm = vec![Vec::new(); cases.len()];
    for _ in 0..RUNS {
        for (i, (_, p)) in cases.iter().enumerate() {
            drop_page_cache();
            cold[i].push(time_read(p));
            warm[i].push(time_read(p));
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    };
    println!("| read of a 100 MiB file | cold (s) | cold MiB/s | warm (s) | warm MiB/s |");
    println!("| --- | --- | --- | --- | --- |");
    for (i, (name, _)) in cases.iter().enumerate() {
        let (c, w) = (median(&mut cold[i]), median(&mut warm[i]));
        println!(
            "| {name} | {c:.3} | {:.0} | {w:.3} | {:.0} |",
            100.0 / c,
            100.0 / w
        );
    }
    println!("{:?}\n{:?}", pt.stats(), plain.stats());
}

/// Figures for the docs, not a check: a stat walk of 20,000 files.
#[test]
#[ignore = "benchmark; run by hand"]
fn stat_walk_speed() {
    if !can_run() {
        return;
    }
    let env = Env::new("cowspace-view-test-");
    let src = env.dir("src");
    for d in 0..200 {
        let dir = src.join(format!("dir{d:03}"));
        fs::create_dir_all(&dir).unwrap();
        for f in 0..100 {
            fs::write(dir.join(format!("file{f:03}.txt")), format!("{d} {f}\n")).unwrap();
        }
    }
    let snap = env.import(&src);
    let time = |p: &Path| {
        let t = Instant::now();
        let n = identities(p).len();
        (t.elapsed().as_secs_f64(), n)
    };
    time(&src);
    let (ext4, n) = time(&src);
    let view = env.mount("mnt", ViewOptions::default());
    let top = view.mountpoint().join(snap.to_hex());
    let (first, n2) = time(&top);
    let (second, _) = time(&top);
    assert_eq!(n, n2);
    println!("| stat walk of {n} entries | seconds |");
    println!("| --- | --- |");
    println!("| ext4, warm | {ext4:.3} |");
    println!("| view, first walk (fresh mount) | {first:.3} |");
    println!("| view, second walk | {second:.3} |");
    println!("{:?}", view.stats());
}

#[test]
fn a_busy_view_is_detached_lazily_and_leaves_no_mount() {
    if !can_run() {
        return;
    }
    let env = Env::new("cowspace-view-test-");
    let src = env.dir("src");
    fs::write(src.join("f"), b"still readable").unwrap();
    let snap = env.import(&src);
    let view = env.mount("mnt", ViewOptions::default());
    let mnt = view.mountpoint().to_path_buf();
    let mut open = fs::File::open(mnt.join(snap.to_hex()).join("f")).unwrap();
    let err = view.unmount().unwrap_err();
    assert!(err.to_string().contains("detached lazily"), "{err}");
    let mounted = |p: &Path| {
        fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .any(|l| l.split(' ').nth(4) == Some(p.to_str().unwrap()))
    };
    assert!(!mounted(&mnt), "the path is free at once");
    let mut s = String::new();
    open.read_to_string(&mut s).unwrap();
    assert_eq!(
        s, "still readable",
        "open files keep working after the detach"
    );
}
