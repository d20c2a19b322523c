//! Lazy copy-up in fuse workspaces: a large file written for the first time is placed at
//! full size at once and filled from the blob cache in the background or on demand. The
//! daemon here waits an hour before each background batch (`COWSPACE_COPYUP_PAUSE_MS`),
//! so every operation below meets a copy-up in progress (the record xattr proves it),
//! and each must show exactly the file a plain directory would: appends, writes in the
//! middle, reads, truncates, renames, unlinks of open files, a commit, and a daemon
//! killed with `kill -9` before `recover`. Each runs in both open modes of the daemon
//! (`--fuse-open-mode`): `cached` (copy-up at the first write, I/O by inode) and
//! `passthrough` (copy-up at an open for writing).

use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cowspace_tests::{mountctl_bin, noise, run_program};

use super::support::{WsRoot, alive, kill9, require_root};

/// The record of a copy-up in progress on an upper file (`fsd/src/cow/lazy.rs`).
const COPYUP_XATTR: &str = "trusted.cowspace.copyup";
/// Bigger than the lazy copy-up threshold (8 MiB), not a whole number of 1 MiB blocks.
const BIG_BYTES: usize = 12 * 1024 * 1024 + 4321;

fn upper_of(r: &WsRoot, ws: &str, name: &str) -> PathBuf {
    r.root()
        .join("workspaces")
        .join(ws)
        .join("upper")
        .join(name)
}

fn pending(path: &Path) -> bool {
    matches!(xattr::get(path, COPYUP_XATTR), Ok(Some(_)))
}

/// Starts the daemon of `r` with background copies held back, answering opens in `mode`.
fn start_paused_daemon(r: &WsRoot, mode: &str) {
    let root = r.root().as_os_str();
    run_program(
        &mountctl_bin(),
        [
            OsStr::new("--root"),
            root,
            OsStr::new("daemon"),
            OsStr::new("start"),
        ],
        &[
            ("COWSPACE_COPYUP_PAUSE_MS", OsStr::new("3600000")),
            ("COWSPACE_FUSE_OPEN_MODE", OsStr::new(mode)),
        ],
    )
    .ok();
}

fn write_at(path: &Path, off: u64, data: &[u8], model: &mut Vec<u8>) {
    let f = OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(data, off).unwrap();
    let end = off as usize + data.len();
    if model.len() < end {
        model.resize(end, 0);
    }
    model[off as usize..end].copy_from_slice(data);
}

fn append(path: &Path, data: &[u8], model: &mut Vec<u8>) {
    let mut f = OpenOptions::new().append(true).open(path).unwrap();
    f.write_all(data).unwrap();
    model.extend_from_slice(data);
}

#[track_caller]
fn assert_content(path: &Path, want: &[u8], what: &str) {
    let got = std::fs::read(path).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        got.len() == want.len(),
        "{what}: {} bytes, want {}",
        got.len(),
        want.len()
    );
    let first = got.iter().zip(want).position(|(a, b)| a != b);
    assert!(first.is_none(), "{what}: differs first at byte {first:?}");
}

/// A base with four large files (distinct contents) and a small one.
fn base(r: &WsRoot) -> (String, Vec<Vec<u8>>) {
    let src = r.t.path("src");
    std::fs::create_dir_all(&src).unwrap();
    let mut contents = Vec::new();
    for i in 0..4u64 {
        let data = noise(100 + i, BIG_BYTES);
        std::fs::write(src.join(format!("big{i}")), &data).unwrap();
        contents.push(data);
    }
    std::fs::write(src.join("small"), "small\n").unwrap();
    (r.import(&src, &[]), contents)
}

#[test]
fn fuse_copy_up_in_progress_shows_and_commits_exactly_the_written_files() {
    require_root!();
    in_progress("cached");
}

#[test]
fn fuse_copy_up_in_progress_with_passthrough_opens() {
    require_root!();
    in_progress("passthrough");
}

fn in_progress(mode: &str) {
    let r = WsRoot::new();
    let (base, mut models) = base(&r);
    start_paused_daemon(&r, mode);
    let ws = r.create(&base, &["--materializer", "fuse"]);
    let p = |n: &str| ws.path.join(n);

    // The one-byte append: placed at full size, copied later.
    append(&p("big0"), b"!", &mut models[0]);
    assert!(
        pending(&upper_of(&r, &ws.id, "big0")),
        "big0 is copied lazily"
    );
    assert_content(
        &p("big0"),
        &models[0],
        "big0 after the append (read mid-copy)",
    );
    // A write in the middle, across a block edge, then a read through one open.
    write_at(
        &p("big0"),
        (1 << 20) - 3,
        b"across the edge",
        &mut models[0],
    );
    {
        let mut f = File::open(p("big0")).unwrap();
        f.seek(SeekFrom::Start((1 << 20) - 10)).unwrap();
        let mut buf = vec![0u8; 40];
        f.read_exact(&mut buf).unwrap();
        assert_eq!(buf, models[0][(1 << 20) - 10..(1 << 20) + 30]);
    }
    assert_content(&p("big0"), &models[0], "big0 after a write in the middle");

    // A truncate during the copy, then an extension: zeros, never the old bytes.
    write_at(&p("big1"), 5, b"x", &mut models[1]);
    assert!(pending(&upper_of(&r, &ws.id, "big1")));
    let f = OpenOptions::new().write(true).open(p("big1")).unwrap();
    f.set_len(3 * 1024 * 1024 + 7).unwrap();
    models[1].truncate(3 * 1024 * 1024 + 7);
    f.set_len(9 * 1024 * 1024).unwrap();
    models[1].resize(9 * 1024 * 1024, 0);
    drop(f);
    assert_content(&p("big1"), &models[1], "big1 after truncate and extension");

    // A rename during the copy: the copy follows the file.
    write_at(
        &p("big2"),
        7 * 1024 * 1024,
        b"renamed later",
        &mut models[2],
    );
    assert!(pending(&upper_of(&r, &ws.id, "big2")));
    std::fs::rename(p("big2"), p("big2-renamed")).unwrap();
    assert!(pending(&upper_of(&r, &ws.id, "big2-renamed")));
    assert_content(&p("big2-renamed"), &models[2], "big2 renamed mid-copy");

    // An unlink during the copy, with the file still open: the open sees the file.
    let mut gone = models[3].clone();
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(p("big3"))
        .unwrap();
    f.write_all_at(b"open", 11 * 1024 * 1024).unwrap();
    gone[11 * 1024 * 1024..11 * 1024 * 1024 + 4].copy_from_slice(b"open");
    std::fs::remove_file(p("big3")).unwrap();
    let mut all = Vec::new();
    (&f).read_to_end(&mut all).unwrap();
    assert!(all == gone, "the unlinked open file reads as written");
    drop(f);

    // A commit during the copy finishes it first and records exactly the files.
    let (snap, _, _) = r.commit(&ws.id, &[]);
    for name in ["big0", "big1", "big2-renamed"] {
        assert!(
            !pending(&upper_of(&r, &ws.id, name)),
            "{name} finished by the commit"
        );
    }
    let out = r.t.path("export");
    r.t.run(["export", &snap, out.to_str().unwrap()]).ok();
    assert_content(&out.join("big0"), &models[0], "committed big0");
    assert_content(&out.join("big1"), &models[1], "committed big1");
    assert_content(
        &out.join("big2-renamed"),
        &models[2],
        "committed big2-renamed",
    );
    assert!(!out.join("big2").exists() && !out.join("big3").exists());
    // And the workspace still shows the same (now passed through).
    assert_content(&p("big0"), &models[0], "big0 after the commit");
    r.remove(&ws.id);
    r.assert_clean();
}

#[test]
fn fuse_copy_up_cut_by_a_daemon_kill_is_finished_by_recover() {
    require_root!();
    cut_by_kill("cached");
}

#[test]
fn fuse_copy_up_cut_by_a_daemon_kill_with_passthrough_opens() {
    require_root!();
    cut_by_kill("passthrough");
}

/// The daemon `recover` starts answers opens in the default mode.
fn cut_by_kill(mode: &str) {
    let r = WsRoot::new();
    let (base, mut models) = base(&r);
    start_paused_daemon(&r, mode);
    let ws = r.create(&base, &["--materializer", "fuse"]);
    let p = |n: &str| ws.path.join(n);
    write_at(
        &p("big0"),
        6 * 1024 * 1024 + 1,
        b"before the kill",
        &mut models[0],
    );
    append(&p("big0"), b"tail", &mut models[0]);
    write_at(&p("big1"), 0, b"head", &mut models[1]);
    let f = OpenOptions::new().write(true).open(p("big1")).unwrap();
    f.set_len(2 * 1024 * 1024 + 1).unwrap();
    drop(f);
    models[1].truncate(2 * 1024 * 1024 + 1);
    assert!(pending(&upper_of(&r, &ws.id, "big0")));
    assert!(pending(&upper_of(&r, &ws.id, "big1")));

    let fsd = r.fsd_pids();
    assert_eq!(fsd.len(), 1, "{fsd:?}");
    kill9(fsd[0]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(fsd[0]) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!alive(fsd[0]), "the daemon survived kill -9");
    r.t.json(["sweep"]).ok();
    // This daemon copies without waiting.
    let rec = r.t.json(["recover", &ws.id]).ok().json();
    assert_eq!(rec["status"], "active", "{rec}");
    assert_content(&p("big0"), &models[0], "big0 after recover");
    assert_content(&p("big1"), &models[1], "big1 after recover");
    let (snap, _, _) = r.commit(&ws.id, &[]);
    assert!(!pending(&upper_of(&r, &ws.id, "big0")));
    let out = r.t.path("export");
    r.t.run(["export", &snap, out.to_str().unwrap()]).ok();
    assert_content(&out.join("big0"), &models[0], "committed big0");
    assert_content(&out.join("big1"), &models[1], "committed big1");
    assert_content(
        &out.join("big2"),
        &models[2],
        "committed big2 (never copied up)",
    );
    r.remove(&ws.id);
    r.assert_clean();
}
