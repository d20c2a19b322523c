//! The full-tree materializers (`btrfs`, `reflink`, `copy`) for real: btrfs and xfs
//! (reflink=1) filesystems on loop files, and a plain temporary directory. Root only:
//! skipped with the reason otherwise, except under `CI=true`, where it fails.
//!
//! Everything made is undone in `Drop` even when an assertion fails: workspaces removed,
//! filesystems unmounted (lazily if busy), loop devices detached, files deleted.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use cowspace::error::Error;
use cowspace::materializer::fulltree::{Stamps, changes, stamps_path, tree_dir};
use cowspace::mounts;
use cowspace::runtime::{CommitOptions, CreateOptions, Runtime};
use cowspace_store::diff::Change;
use cowspace_store::{ImportOptions, SnapshotId, Store, StoreConfig, TreeId};

fn can_run() -> bool {
    let why = if !nix::unistd::geteuid().is_root() {
        "not root"
    } else if Command::new("losetup").arg("--version").output().is_err() {
        "no losetup"
    } else {
        return true;
    };
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("full-tree materializer tests need root and loop devices: {why}");
    }
    eprintln!("skipping: full-tree materializer tests need root and loop devices ({why})");
    false
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A filesystem on a loop file (or, for `Plain`, just a temporary directory).
struct TestFs {
    tmp: tempfile::TempDir,
    mnt: PathBuf,
    dev: Option<String>,
}

impl TestFs {
    fn new(kind: &str) -> TestFs {
        let tmp = tempfile::Builder::new()
            .prefix(&format!("cowspace-fulltree-{kind}-"))
            .tempdir()
            .unwrap();
        let mnt = tmp.path().join("mnt");
        fs::create_dir(&mnt).unwrap();
        let mut me = TestFs {
            tmp,
            mnt,
            dev: None,
        };
        if kind == "plain" {
            return me;
        }
        let image = me.tmp.path().join("image");
        run(Command::new("truncate").args(["-s", "512M"]).arg(&image));
        match kind {
            "btrfs" => run(Command::new("mkfs.btrfs").arg("-q").arg(&image)),
            "xfs" => run(Command::new("mkfs.xfs")
                .args(["-q", "-m", "reflink=1"])
                .arg(&image)),
            other => panic!("unknown filesystem {other}"),
        };
        let dev = run(Command::new("losetup").args(["-f", "--show"]).arg(&image));
        me.dev = Some(dev.clone());
        run(Command::new("mount").arg(&dev).arg(&me.mnt));
        me
    }

    fn root(&self) -> PathBuf {
        self.mnt.join("root")
    }
}

impl Drop for TestFs {
    fn drop(&mut self) {
        if let Some(dev) = &self.dev {
            let ok = Command::new("umount")
                .arg(&self.mnt)
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
            }
            let _ = Command::new("losetup").args(["-d", dev]).status();
        }
    }
}

/// A runtime root on a test filesystem; removes its workspaces on drop (before the
/// filesystem goes: fields drop in order).
struct Env {
    rt: Runtime,
    ids: Vec<String>,
    fs: TestFs,
}

impl Env {
    fn new(kind: &str) -> Env {
        let fs = TestFs::new(kind);
        Store::init(&fs.root(), StoreConfig::default()).unwrap();
        let rt = Runtime::open(&fs.root()).unwrap();
        Env {
            rt,
            ids: vec![],
            fs,
        }
    }

    fn import(&self, src: &Path) -> (SnapshotId, TreeId) {
        let o = ImportOptions {
            default_excludes: false,
            ..Default::default()
        };
        let r = self.rt.store().import_dir(src, &o).unwrap();
        (r.snapshot, r.root)
    }

    fn create(&mut self, snap: &SnapshotId, kind: &str) -> cowspace::registry::Record {
        let rec = self
            .rt
            .create(&CreateOptions {
                snapshot: snap.to_hex(),
                materializer: Some(kind.parse().unwrap()),
                ..Default::default()
            })
            .unwrap_or_else(|e| panic!("create {kind}: {e}"));
        self.ids.push(rec.id.clone());
        rec
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        for id in &self.ids {
            let _ = self.rt.remove(id, true);
        }
    }
}

fn write(p: &Path, data: &[u8]) {
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, data).unwrap();
}

/// The base tree every case starts from.
fn make_source(dir: &Path) {
    write(&dir.join("a/b/file1"), b"one\n");
    write(&dir.join("a/del.txt"), b"delete me\n");
    write(&dir.join("a/old.txt"), b"old name\n");
    write(&dir.join("a/keep.txt"), b"kept\n");
    write(&dir.join("bin/tool"), b"#!/bin/sh\necho tool\n");
    fs::set_permissions(dir.join("bin/tool"), fs::Permissions::from_mode(0o755)).unwrap();
    write(&dir.join("gone/x.txt"), b"x\n");
    write(&dir.join("gone/y/z.txt"), b"z\n");
    write(&dir.join("empty.txt"), b"");
    fs::create_dir_all(dir.join("emptydir")).unwrap();
    write(&dir.join("hl1"), b"linked\n");
    fs::hard_link(dir.join("hl1"), dir.join("hl2")).unwrap();
    symlink("a/keep.txt", dir.join("link")).unwrap();
    write(&dir.join("big.bin"), &vec![7u8; 3 << 20]);
    for i in 0..200 {
        write(
            &dir.join(format!("many/f{i:04}")),
            format!("file {i}\n").as_bytes(),
        );
    }
    xattr::set(dir.join("a/keep.txt"), "user.note", b"kept").unwrap();
}

/// Changes made in a workspace, and the diff they must give.
fn modify(ws: &Path) -> BTreeSet<(String, String)> {
    write(&ws.join("new.txt"), b"new\n");
    write(&ws.join("a/b/file1"), b"one, changed\n");
    fs::remove_file(ws.join("a/del.txt")).unwrap();
    fs::rename(ws.join("a/old.txt"), ws.join("a/renamed.txt")).unwrap();
    fs::set_permissions(ws.join("bin/tool"), fs::Permissions::from_mode(0o700)).unwrap();
    symlink("a/b/file1", ws.join("link2")).unwrap();
    write(&ws.join("newdir/sub/f"), b"deep\n");
    fs::remove_dir_all(ws.join("gone")).unwrap();
    fs::remove_dir(ws.join("emptydir")).unwrap();
    write(&ws.join("emptydir"), b"now a file\n");
    // Same bytes again: a new stamp, no change.
    write(&ws.join("many/f0001"), b"file 1\n");
    use Change::*;
    [
        ("new.txt", Added),
        ("a/b/file1", Modified),
        ("a/del.txt", Deleted),
        ("a/old.txt", Deleted),
        ("a/renamed.txt", Added),
        ("bin/tool", Modified),
        ("link2", Added),
        ("newdir", Added),
        ("newdir/sub", Added),
        ("newdir/sub/f", Added),
        ("gone", Deleted),
        ("gone/x.txt", Deleted),
        ("gone/y", Deleted),
        ("gone/y/z.txt", Deleted),
        ("emptydir", TypeChanged),
    ]
    .into_iter()
    .map(|(p, c)| (p.to_string(), format!("{c:?}")))
    .collect()
}

fn diff_set(env: &Env, id: &str) -> BTreeSet<(String, String)> {
    env.rt
        .diff(id)
        .unwrap()
        .into_iter()
        .map(|(d, _)| (d.path, format!("{:?}", d.change)))
        .collect()
}

/// Paths the stamp walk reads (changed stamps) right now.
fn read_paths(env: &Env, rec: &cowspace::registry::Record) -> Vec<String> {
    let stamps = Stamps::load(&stamps_path(rec)).unwrap();
    let base: SnapshotId = rec.snapshot.parse().unwrap();
    changes(env.rt.store(), &base, &tree_dir(rec), &stamps)
        .unwrap()
        .into_iter()
        .map(|c| format!("{c:?}"))
        .collect()
}

/// The whole life of one workspace of `kind` on `env`.
fn lifecycle(env: &mut Env, kind: &str, lower_kind: &str) {
    let src = env.fs.tmp.path().join(format!("src-{kind}"));
    make_source(&src);
    let (base, _) = env.import(&src);
    let rec = env.create(&base, kind);
    assert_eq!(rec.materializer.as_str(), kind);
    assert_eq!(rec.lower_kind.as_str(), lower_kind);
    assert!(
        mounts::is_mounted(&rec.path).unwrap(),
        "{kind}: not mounted"
    );
    let ws = rec.path.clone();
    assert_eq!(fs::read(ws.join("a/b/file1")).unwrap(), b"one\n");
    assert_eq!(
        xattr::get(ws.join("a/keep.txt"), "user.note").unwrap(),
        Some(b"kept".to_vec())
    );
    // A fresh workspace: nothing changed, nothing read.
    assert!(diff_set(env, &rec.id).is_empty(), "{kind}: fresh diff");
    assert!(
        read_paths(env, &rec).is_empty(),
        "{kind}: a fresh workspace's walk read {:?}",
        read_paths(env, &rec)
    );

    let want = modify(&ws);
    assert_eq!(diff_set(env, &rec.id), want, "{kind}: diff");
    // Only changed entries are read: none of the 199 untouched files of many/.
    let read = read_paths(env, &rec);
    assert!(
        read.iter()
            .all(|c| !c.contains("many/f0000") && !c.contains("big.bin")),
        "{kind}: the walk read unchanged files: {read:?}"
    );
    assert!(read.len() < 20, "{kind}: {} entries read", read.len());

    let committed = env.rt.commit(&rec.id, &CommitOptions::default()).unwrap();
    let (_, direct) = env.import(&ws);
    assert_eq!(
        committed.root, direct,
        "{kind}: commit differs from an import"
    );

    // Still usable: more changes, another commit.
    write(&ws.join("after.txt"), b"after commit\n");
    let mut want2 = want.clone();
    want2.insert(("after.txt".into(), format!("{:?}", Change::Added)));
    assert_eq!(diff_set(env, &rec.id), want2, "{kind}: diff after commit");
    let again = env.rt.commit(&rec.id, &CommitOptions::default()).unwrap();
    let (_, direct) = env.import(&ws);
    assert_eq!(again.root, direct, "{kind}: second commit");

    let private = rec.private_dir.clone();
    env.rt.remove(&rec.id, false).unwrap();
    env.ids.retain(|i| *i != rec.id);
    assert!(!mounts::is_mounted(&ws).unwrap(), "{kind}: still mounted");
    assert!(!private.exists(), "{kind}: {} left", private.display());
    assert!(!ws.exists(), "{kind}: {} left", ws.display());
}

fn subvolumes(mnt: &Path) -> Vec<String> {
    run(Command::new("btrfs")
        .args(["subvolume", "list", "-o"])
        .arg(mnt))
    .lines()
    .map(|l| l.rsplit(' ').next().unwrap_or("").to_string())
    .filter(|l| !l.is_empty())
    .collect()
}

fn assert_unsupported(env: &mut Env, snap: &SnapshotId, kind: &str) {
    match env.rt.create(&CreateOptions {
        snapshot: snap.to_hex(),
        materializer: Some(kind.parse().unwrap()),
        ..Default::default()
    }) {
        Err(e @ Error::Unsupported { .. }) => {
            assert!(e.to_string().len() > 40, "no reason given: {e}");
            eprintln!("{kind} refused as expected: {e}");
        }
        Err(e) => panic!("{kind}: expected Unsupported, got {e}"),
        Ok(rec) => {
            env.ids.push(rec.id);
            panic!("{kind} was accepted where it cannot work");
        }
    }
}

#[test]
fn btrfs_root_runs_btrfs_reflink_and_copy() {
    if !can_run() {
        return;
    }
    let mut env = Env::new("btrfs");
    lifecycle(&mut env, "btrfs", "subvolume");
    lifecycle(&mut env, "reflink", "checkout");
    lifecycle(&mut env, "copy", "checkout");
    // Only the base subvolume is left (no workspace snapshot).
    let subs = subvolumes(&env.fs.mnt);
    assert_eq!(subs.len(), 1, "subvolumes left: {subs:?}");
    assert!(subs[0].starts_with("root/cache/subvols/"), "{subs:?}");
}

#[test]
fn xfs_root_runs_reflink_and_copy_but_not_btrfs() {
    if !can_run() {
        return;
    }
    let mut env = Env::new("xfs");
    lifecycle(&mut env, "reflink", "checkout");
    lifecycle(&mut env, "copy", "checkout");
    let src = env.fs.tmp.path().join("src-refused");
    write(&src.join("f"), b"f\n");
    let (snap, _) = env.import(&src);
    assert_unsupported(&mut env, &snap, "btrfs");
}

#[test]
fn plain_root_runs_copy_only() {
    if !can_run() {
        return;
    }
    let mut env = Env::new("plain");
    lifecycle(&mut env, "copy", "checkout");
    let src = env.fs.tmp.path().join("src-refused");
    write(&src.join("f"), b"f\n");
    let (snap, _) = env.import(&src);
    assert_unsupported(&mut env, &snap, "btrfs");
    if !is_cloning(&env.fs.root()) {
        assert_unsupported(&mut env, &snap, "reflink");
    }
}

/// Whether the plain temp dir's filesystem happens to clone (then reflink works there).
fn is_cloning(root: &Path) -> bool {
    let t = nix::sys::statfs::statfs(root).unwrap().filesystem_type();
    t == nix::sys::statfs::BTRFS_SUPER_MAGIC || t == nix::sys::statfs::XFS_SUPER_MAGIC
}

/// Create times on a 20,000-file tree (release build; run with `--ignored --nocapture`).
#[test]
#[ignore]
fn create_times_20k_files() {
    if !can_run() {
        return;
    }
    const FILES: usize = 20_000;
    const RUNS: usize = 20;
    let mut env = Env::new("btrfs");
    let mut xfs = Env::new("xfs");
    let src = env.fs.tmp.path().join("src-20k");
    for i in 0..FILES {
        write(
            &src.join(format!("d{:03}/e{:02}/f{i:05}.txt", i / 200, (i / 20) % 10)),
            format!("file {i} {}\n", "x".repeat(i % 300)).as_bytes(),
        );
    }
    let (snap, _) = env.import(&src);
    let (xsnap, _) = xfs.import(&src);
    let mut rows = Vec::new();
    for (on_xfs, kind, lower, label) in [
        (false, "btrfs", None, "btrfs (btrfs root)"),
        (false, "reflink", None, "reflink (btrfs root)"),
        (false, "copy", None, "copy (btrfs root)"),
        (
            false,
            "overlay",
            Some("checkout"),
            "overlay, checkout lower (btrfs root)",
        ),
        (true, "reflink", None, "reflink (xfs root)"),
        (true, "copy", None, "copy (xfs root)"),
    ] {
        let (e, s) = if on_xfs {
            (&mut xfs, xsnap)
        } else {
            (&mut env, snap)
        };
        let mut create_ms = Vec::new();
        let mut remove_ms = Vec::new();
        // One warm-up: builds the checkout (and subvolume) once.
        for i in 0..=RUNS {
            let t = Instant::now();
            let rec =
                e.rt.create(&CreateOptions {
                    snapshot: s.to_hex(),
                    materializer: Some(kind.parse().unwrap()),
                    lower: lower.map(|l| l.parse().unwrap()),
                    ..Default::default()
                })
                .unwrap();
            let c = t.elapsed().as_secs_f64() * 1e3;
            e.ids.push(rec.id.clone());
            let t = Instant::now();
            e.rt.remove(&rec.id, false).unwrap();
            let r = t.elapsed().as_secs_f64() * 1e3;
            e.ids.retain(|x| *x != rec.id);
            if i > 0 {
                create_ms.push(c);
                remove_ms.push(r);
            }
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        rows.push(format!(
            "| {label} | {:.1} | {:.1} |",
            median(&mut create_ms),
            median(&mut remove_ms)
        ));
    }
    println!("| materializer | create ms (median of {RUNS}) | remove ms |");
    println!("| --- | --- | --- |");
    for r in rows {
        println!("{r}");
    }
}
