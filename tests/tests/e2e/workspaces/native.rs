//! The native lower (`--lower native`, what `auto` picks where the host mounts it): an
//! overlay over a per-snapshot EROFS metadata image with the blob cache as a data-only
//! layer. No daemon is in its read path: the daemon killed, its workspaces keep reading
//! and writing. `gc` never takes a blob or an image from under a create, even racing it;
//! a blob deleted by hand makes reads of its files fail, never show other bytes, and
//! `fsck` names it and `--repair` writes it again; and
//! the image's mount leaves with the last workspace that used it.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use super::base_tree;
use super::support::{WsRoot, alive, kill9, require_root};
use cowspace_tests::Node;

/// Every file's bytes under `dir`, read through the workspace (panics on an error).
fn read_all(dir: &Path) -> usize {
    let mut n = 0;
    for e in walk(dir) {
        if e.is_file() && !e.is_symlink() {
            std::fs::read(&e).unwrap_or_else(|err| panic!("read {}: {err}", e.display()));
            n += 1;
        }
    }
    n
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() && !p.is_symlink() {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out
}

#[test]
fn auto_picks_the_native_lower_and_its_workspaces_need_no_daemon() {
    require_root!();
    let r = WsRoot::new();
    let src = r.t.path("src");
    base_tree(&src);
    let base = r.import(&src, &["--ref", "base"]);
    let ws = r.create(&base, &[]);
    let st = r.status(&ws.id);
    assert_eq!(st["lower_kind"], "native", "{st}");
    assert_eq!(
        r.fsd_pids(),
        Vec::<u32>::new(),
        "a native create starts no daemon"
    );
    let doctor = r.t.json(["doctor"]).ok().json();
    assert_eq!(doctor["lower"]["auto"], "native", "{doctor}");

    // A daemon of the root (a fuse workspace's), killed: the native workspace reads,
    // writes and commits on.
    let fuse = r.create(&base, &["--materializer", "fuse"]);
    let fsd = r.fsd_pids();
    assert_eq!(fsd.len(), 1, "{fsd:?}");
    kill9(fsd[0]);
    while alive(fsd[0]) {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(
        cowspace_tests::scan_tree(&ws.path)
            .into_iter()
            .filter(|(_, n)| matches!(n, Node::File { .. }))
            .count(),
        read_all(&ws.path),
    );
    assert_eq!(
        std::fs::read(ws.path.join("README.md")).unwrap(),
        std::fs::read(src.join("README.md")).unwrap()
    );
    std::fs::write(ws.path.join("after-the-crash.txt"), "written\n").unwrap();
    let (snap, _, _) = r.commit(&ws.id, &[]);
    let out = r.t.path("export");
    r.t.run(["export", &snap, out.to_str().unwrap()]).ok();
    assert_eq!(
        std::fs::read_to_string(out.join("after-the-crash.txt")).unwrap(),
        "written\n"
    );
    r.t.run(["remove", "--force", &fuse.id]).ok();
    r.remove(&ws.id);
    // The image's mount left with its last workspace.
    let native = r.root().join("cache/native");
    let left: Vec<_> = r
        .mounts()
        .into_iter()
        .filter(|m| m.starts_with(&native))
        .collect();
    assert!(
        left.is_empty(),
        "mounts left after the last workspace: {left:?}"
    );
    r.t.run(["gc", "--grace", "0"]).ok();
    let images: Vec<_> = std::fs::read_dir(r.root().join("cache/native"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    assert!(images.is_empty(), "gc prunes the unused image: {images:?}");
    r.assert_clean();
}

#[test]
fn gc_racing_creates_never_takes_a_blob_or_image_from_a_workspace() {
    require_root!();
    let r = WsRoot::new();
    let src = r.t.path("src");
    base_tree(&src);
    let base = r.import(&src, &["--ref", "base"]);
    let stop = AtomicBool::new(false);
    // Stops the gc loop however the creates end (a failed assertion included).
    struct Stop<'a>(&'a AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    std::thread::scope(|s| {
        let gc = s.spawn(|| {
            let mut runs = 0;
            while !stop.load(Ordering::Relaxed) {
                // Everything evictable goes: only what workspaces hold may stay.
                r.t.run(["gc", "--grace", "0", "--blob-cache-max", "0"])
                    .ok();
                runs += 1;
            }
            runs
        });
        let stopping = Stop(&stop);
        for round in 0..12 {
            let ws = r.create(&base, &["--lower", "native"]);
            let files = read_all(&ws.path);
            assert!(files > 10, "round {round}: {files} files");
            // A second workspace of the same image while gc runs.
            let other = r.create(&base, &["--lower", "native"]);
            read_all(&other.path);
            r.remove(&other.id);
            read_all(&ws.path);
            r.remove(&ws.id);
        }
        drop(stopping);
        let runs = gc.join().unwrap();
        assert!(runs > 0, "gc ran during the creates");
    });
    r.assert_clean();
}

#[test]
fn a_blob_deleted_by_hand_fails_reads_never_gives_other_bytes() {
    require_root!();
    let r = WsRoot::new();
    let src = r.t.path("src");
    std::fs::create_dir_all(&src).unwrap();
    // Larger than what the image carries inline: read through a blob.
    std::fs::write(src.join("one.txt"), "the first file\n".repeat(400)).unwrap();
    std::fs::write(src.join("two.txt"), "the second file\n".repeat(400)).unwrap();
    let base = r.import(&src, &["--ref", "base"]);
    let ws = r.create(&base, &["--lower", "native"]);
    let id = r.t.json(["show", &base, "one.txt"]).ok().json()["entry"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let blob = r.root().join("cache/blobs").join(&id[..2]).join(&id);
    assert!(blob.is_file(), "{}", blob.display());
    std::fs::remove_file(&blob).unwrap();
    let got = std::fs::read(ws.path.join("one.txt"));
    assert!(got.is_err(), "a read without its blob gave {got:?}");
    assert_eq!(
        std::fs::read_to_string(ws.path.join("two.txt")).unwrap(),
        "the second file\n".repeat(400)
    );
    // fsck names it (exit 8); --repair writes it again and the workspace reads on.
    let out = r.t.json(["fsck"]);
    assert_eq!(out.code, 8, "{out:?}");
    let v = out.json();
    assert_eq!(v["native_missing"][0]["content"], id.as_str(), "{v}");
    assert!(out.stderr.contains(&id), "{}", out.stderr);
    r.t.json(["fsck", "--repair"]).ok();
    r.t.json(["fsck"]).ok();
    assert_eq!(
        std::fs::read_to_string(ws.path.join("one.txt")).unwrap(),
        "the first file\n".repeat(400)
    );
    r.remove(&ws.id);
    // gc prunes the unused image; the next create builds it again with its blobs.
    r.t.run(["gc", "--grace", "0"]).ok();
    let again = r.create(&base, &["--lower", "native"]);
    assert_eq!(
        std::fs::read_to_string(again.path.join("one.txt")).unwrap(),
        "the first file\n".repeat(400)
    );
    r.remove(&again.id);
    r.assert_clean();
}

#[test]
fn recover_mounts_the_image_again_after_a_reboot() {
    require_root!();
    let r = WsRoot::new();
    let src = r.t.path("src");
    base_tree(&src);
    let base = r.import(&src, &["--ref", "base"]);
    let ws = r.create(&base, &["--lower", "native"]);
    std::fs::write(ws.path.join("written.txt"), "before\n").unwrap();
    // What a reboot leaves: neither the workspace's overlay nor the image is mounted.
    let meta = std::path::PathBuf::from(r.status(&ws.id)["lower"].as_str().unwrap());
    for m in [&ws.path, &meta] {
        let st = std::process::Command::new("umount")
            .arg(m)
            .status()
            .unwrap();
        assert!(st.success(), "umount {}", m.display());
    }
    r.t.run(["sweep"]).ok();
    r.t.run(["recover", &ws.id]).ok();
    assert_eq!(
        std::fs::read_to_string(ws.path.join("written.txt")).unwrap(),
        "before\n"
    );
    assert_eq!(
        std::fs::read(ws.path.join("README.md")).unwrap(),
        std::fs::read(src.join("README.md")).unwrap()
    );
    r.discard(&ws.id);
    r.assert_clean();
}

#[test]
fn a_large_snapshot_without_an_image_gets_the_view_while_the_daemon_builds_it() {
    require_root!();
    let r = WsRoot::new();
    let src = r.t.path("src");
    base_tree(&src);
    let base = r.import(&src, &["--ref", "base"]);
    // Every snapshot counts as large here: auto must not build the image in the create.
    let root = r.root().to_str().unwrap().to_owned();
    let eager = std::ffi::OsStr::new("0");
    let auto = || {
        let out = cowspace_tests::run_program(
            &cowspace_tests::mountctl_bin(),
            ["--root", &root, "--json", "create", &base],
            &[("COWSPACE_NATIVE_EAGER_FILES", eager)],
        )
        .ok();
        let v = out.json();
        let id = v["id"]
            .as_str()
            .or(v["workspace"].as_str())
            .unwrap()
            .to_owned();
        r.track(&id);
        id
    };
    let first = auto();
    assert_eq!(r.status(&first)["lower_kind"], "view");
    // The daemon that serves the view builds the image; later creates find it.
    let image = r
        .root()
        .join("cache/native")
        .join(&base)
        .join("image.erofs");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !image.is_file() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(image.is_file(), "the daemon built {}", image.display());
    let second = auto();
    let st = r.status(&second);
    assert_eq!(st["lower_kind"], "native", "{st}");
    let path = std::path::PathBuf::from(st["path"].as_str().unwrap());
    assert_eq!(
        std::fs::read(path.join("README.md")).unwrap(),
        std::fs::read(src.join("README.md")).unwrap()
    );
    r.remove(&second);
    r.remove(&first);
    r.assert_clean();
}
