//! `mountctl fork`: new workspaces holding exactly what a workspace shows at one instant,
//! each independent afterwards; a running sandbox is frozen for the copy.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cowspace_tests::{mountctl_bin, write_file};
use serde_json::Value;

use crate::sandbox::support as sbx;
use crate::workspaces::support::{WsRoot, require_root};

/// A bound against hangs, never a performance threshold.
const WAIT: Duration = Duration::from_secs(120);

fn setup(args: &[&str]) -> (WsRoot, String, PathBuf) {
    sbx::helper();
    let r = WsRoot::new_in(&std::env::temp_dir());
    let src = r.t.path("src");
    write_file(&src.join("keep.txt"), "keep\n");
    write_file(&src.join("modify.txt"), "before\n");
    write_file(&src.join("delete.txt"), "gone soon\n");
    write_file(&src.join("olddir/inside.txt"), "inside\n");
    let snap = r.import(&src, &["--ref", "t/main"]);
    let mut a = vec!["--name", "parent"];
    a.extend_from_slice(args);
    let ws = r.create(&snap, &a);
    (r, ws.id, ws.path)
}

/// The forks a `fork --json` answered: (id, path).
pub(crate) fn forks(v: &Value) -> Vec<(String, PathBuf)> {
    v["forks"]
        .as_array()
        .unwrap_or_else(|| panic!("no forks: {v}"))
        .iter()
        .map(|f| {
            (
                f["id"].as_str().unwrap().to_string(),
                PathBuf::from(f["path"].as_str().unwrap()),
            )
        })
        .collect()
}

/// `diff WS`'s changes as sorted (change, path) pairs.
pub(crate) fn diff_set(r: &WsRoot, ws: &str) -> Vec<(String, String)> {
    let v = r.t.json(["diff", ws]).ok().json();
    let mut out: Vec<(String, String)> = v["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["change"].as_str().unwrap().into(),
                c["path"].as_str().unwrap().into(),
            )
        })
        .collect();
    out.sort();
    out
}

fn changes_of_every_kind(p: &Path) {
    write_file(&p.join("new/deep/file.txt"), "new\n");
    std::fs::write(p.join("modify.txt"), "after\n").unwrap();
    std::fs::remove_file(p.join("delete.txt")).unwrap();
    std::fs::rename(p.join("olddir"), p.join("newdir")).unwrap();
    std::fs::hard_link(p.join("new/deep/file.txt"), p.join("hardlink.txt")).unwrap();
    std::os::unix::fs::symlink("new/deep", p.join("symlink")).unwrap();
    xattr::set(p.join("keep.txt"), "user.note", b"tagged").unwrap();
}

#[test]
fn fork_holds_every_kind_of_change_and_each_side_diverges_alone() {
    require_root!();
    for args in [&["--lower", "native"][..], &["--materializer", "fuse"][..]] {
        let (r, ws, p) = setup(args);
        changes_of_every_kind(&p);
        let before = diff_set(&r, &ws);
        let v = r.t.json(["fork", &ws, "--count", "2"]).ok().json();
        assert_eq!(v["parent"], ws, "{v}");
        let f = forks(&v);
        assert_eq!(f.len(), 2);
        for (id, fp) in &f {
            let st = r.t.json(["status", id]).ok().json();
            assert_eq!(st["parent"], ws, "{st}");
            assert_eq!(
                diff_set(&r, id),
                before,
                "{args:?}: the fork shows what the parent did"
            );
            assert_eq!(
                std::fs::read_to_string(fp.join("modify.txt")).unwrap(),
                "after\n"
            );
            assert!(!fp.join("delete.txt").exists() && !fp.join("olddir").exists());
            assert_eq!(
                std::fs::read_to_string(fp.join("newdir/inside.txt")).unwrap(),
                "inside\n"
            );
            assert_eq!(
                std::fs::read_link(fp.join("symlink")).unwrap(),
                Path::new("new/deep")
            );
            assert_eq!(
                std::fs::metadata(fp.join("hardlink.txt")).unwrap().ino(),
                std::fs::metadata(fp.join("new/deep/file.txt"))
                    .unwrap()
                    .ino(),
                "{args:?}: the hard link is one file in the fork"
            );
            assert_eq!(
                xattr::get(fp.join("keep.txt"), "user.note")
                    .unwrap()
                    .as_deref(),
                Some(&b"tagged"[..])
            );
        }
        // Divergent writes: each keeps its own.
        std::fs::write(p.join("parent-only.txt"), "p").unwrap();
        std::fs::write(f[0].1.join("fork0-only.txt"), "0").unwrap();
        std::fs::write(f[1].1.join("modify.txt"), "fork1\n").unwrap();
        assert!(!f[0].1.join("parent-only.txt").exists() && !p.join("fork0-only.txt").exists());
        assert_eq!(
            std::fs::read_to_string(p.join("modify.txt")).unwrap(),
            "after\n"
        );
        assert_eq!(
            std::fs::read_to_string(f[0].1.join("modify.txt")).unwrap(),
            "after\n"
        );
        let c0 = r.t.json(["commit", &f[0].0]).ok().json();
        let c1 = r.t.json(["commit", &f[1].0]).ok().json();
        assert_ne!(
            c0["snapshot"], c1["snapshot"],
            "the forks' commits differ as written"
        );
        for id in [&ws, &f[0].0, &f[1].0] {
            r.discard(id);
        }
        r.assert_clean();
    }
}

#[test]
fn fork_of_a_running_sandbox_holds_a_prefix_of_its_writes_with_no_torn_file() {
    require_root!();
    let (r, ws, _) = setup(&[]);
    r.t.json(["sandbox", "start", &ws]).ok();
    // Inside: numbered files, each written whole (64 KiB of its own number) then renamed.
    let writer = "cd /workspace && mkdir -p seq && i=0; while true; do i=$((i+1)); \
                  head -c 65536 /dev/zero | tr '\\0' \"$((i % 10))\" > seq/.t && mv seq/.t seq/$i; done";
    let mut w = Command::new(mountctl_bin())
        .arg("--root")
        .arg(r.root())
        .args(["exec", &ws, "--", "sh", "-c", writer])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let v = r.t.json(["fork", &ws, "--name", "snap"]).ok().json();
    assert!(
        v["frozen_ms"].as_f64().unwrap() > 0.0,
        "the sandbox was frozen: {v}"
    );
    eprintln!("fork of a running sandbox: frozen {} ms", v["frozen_ms"]);
    let (_, fp) = forks(&v).remove(0);
    let mut nums: Vec<u64> = std::fs::read_dir(fp.join("seq"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    nums.sort();
    assert!(!nums.is_empty(), "nothing was written before the fork");
    assert_eq!(
        nums,
        (1..=nums.len() as u64).collect::<Vec<_>>(),
        "a prefix of the sequence"
    );
    for n in &nums {
        let b = std::fs::read(fp.join("seq").join(n.to_string())).unwrap();
        let want = b'0' + (n % 10) as u8;
        assert!(
            b.len() == 65536 && b.iter().all(|&c| c == want),
            "file {n} is torn"
        );
    }
    // The parent goes on after the fork (thawed).
    let t = Instant::now();
    let count = || {
        std::fs::read_dir(
            r.t.json(["status", &ws]).ok().json()["path"]
                .as_str()
                .unwrap()
                .to_string()
                + "/seq",
        )
        .unwrap()
        .count()
    };
    let after_fork = count();
    while count() <= after_fork {
        assert!(t.elapsed() < WAIT, "the parent's sandbox stayed frozen");
        std::thread::sleep(Duration::from_millis(50));
    }
    let st = r.t.json(["sandbox", "status", &ws]).ok().json();
    assert_eq!(st["state"], "running", "{st}");
    w.kill().ok();
    w.wait().ok();
    r.t.json(["sandbox", "stop", &ws]).ok();
    r.discard(&ws);
    r.discard("snap");
    r.assert_clean();
}

#[test]
fn fork_with_sandbox_starts_each_with_the_parents_controls() {
    require_root!();
    let (r, ws, _) = setup(&[]);
    r.t.json(["sandbox", "start", &ws, "--net", "loopback", "--pids", "64"])
        .ok();
    let v = r.t.json(["fork", &ws, "--sandbox"]).ok().json();
    let (id, _) = forks(&v).remove(0);
    let st = r.t.json(["sandbox", "status", &id]).ok().json();
    assert_eq!(st["net"], "loopback", "{st}");
    assert_eq!(st["limits"]["pids"], 64, "{st}");
    for w in [&ws, &id] {
        r.t.json(["sandbox", "stop", w]).ok();
        r.discard(w);
    }
    r.assert_clean();
}

#[test]
fn fork_bad_input_is_refused_and_nothing_is_left() {
    require_root!();
    let (r, ws, _) = setup(&[]);
    r.t.run(["fork", &ws, "--count", "0"]).code(9);
    r.t.run(["fork", &ws, "--count", "65"]).code(9);
    r.t.run(["fork", "nosuch"]).code(3);
    r.t.run(["fork", &ws, "--sandbox"]).code(9);
    // A name taken: refused, and no fork left behind.
    r.t.run(["fork", &ws, "--name", "parent"]).code(4);
    let listed = r.t.json(["list"]).ok().json();
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    r.discard(&ws);
    r.t.run(["fork", &ws]).code(3);
    r.assert_clean();
}
