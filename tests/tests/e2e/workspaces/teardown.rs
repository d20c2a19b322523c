//! Removal through the daemon: the workspace leaves its path and the registry before the
//! answer, while the teardown of its mount (evicting what it cached, an overlay's upper
//! sync) finishes on the daemon's teardown thread. Nothing of it may show: not in the
//! mount table, not on disk, not in a new workspace made at the same path at once, and a
//! busy workspace is still refused. Mounts and unmounts of one fuse workspace racing
//! through the daemon leave it mounted once.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use super::base_tree;
use super::support::{KillOnDrop, WsRoot, require_root};

/// One request on a new connection to the root's control socket; the whole answer.
fn request(r: &WsRoot, op: &str, args: Value) -> Value {
    let mut s = UnixStream::connect(r.root().join("run/fsd.sock")).expect("connect");
    let mut line = serde_json::to_vec(&json!({"op": op, "args": args})).unwrap();
    line.push(b'\n');
    s.write_all(&line).unwrap();
    let mut reply = String::new();
    BufReader::new(&s).read_line(&mut reply).unwrap();
    serde_json::from_str(&reply).unwrap_or_else(|e| panic!("{op}: {e}: {reply:?}"))
}

fn create(r: &WsRoot, base: &str, kind: &[(&str, &str)], path: &std::path::Path) -> Value {
    let mut args = json!({"snapshot": base, "path": path.to_str().unwrap()});
    for (k, v) in kind {
        args[*k] = (*v).into();
    }
    let v = request(r, "create", args);
    assert_eq!(v["ok"], true, "{v}");
    let rec = v["result"].clone();
    r.track(rec["id"].as_str().unwrap());
    rec
}

/// A root with the base tree imported and its daemon started, and the workspace path.
fn with_daemon() -> (WsRoot, String, std::path::PathBuf) {
    let r = WsRoot::new();
    let src = r.t.path("src");
    base_tree(&src);
    let base = r.import(&src, &[]);
    r.t.json(["daemon", "start"]).ok();
    let path = r.t.path("ws");
    (r, base, path)
}

#[test]
fn removal_through_the_daemon_after_use_leaves_nothing_and_the_path_is_reusable_at_once() {
    require_root!();
    let (r, base, path) = with_daemon();
    for kind in [
        &[("materializer", "overlay"), ("lower", "view")][..],
        &[("materializer", "overlay"), ("lower", "checkout")],
        &[("materializer", "fuse")],
    ] {
        let rec = create(&r, &base, kind, &path);
        let id = rec["id"].as_str().unwrap().to_string();
        // Use it: read everything, write many files (the teardown has work to do).
        let out = Command::new("sh")
            .arg("-c")
            .arg(
                "find . -type f -exec cat {} + > /dev/null && mkdir many && \
                 for i in $(seq 1 500); do echo $i > many/f$i; done && echo more >> README.md",
            )
            .current_dir(&path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{kind:?}: {out:?}");
        // Refused while the writes are uncommitted; committed, only processes hold it.
        let v = request(&r, "remove", json!({"workspace": id}));
        assert_eq!(v["error"]["kind"], "busy", "{kind:?}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("uncommitted"),
            "{kind:?}: {v}"
        );
        let v = request(&r, "commit", json!({"workspace": id}));
        assert!(v["error"].is_null(), "{kind:?}: {v}");

        // Busy: refused, nothing torn down.
        let busy = KillOnDrop(
            Command::new("sleep")
                .arg("1000")
                .current_dir(&path)
                .stdin(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let v = request(&r, "remove", json!({"workspace": id}));
        assert_eq!(v["error"]["kind"], "busy", "{kind:?}: {v}");
        assert!(r.mounts().contains(&path), "{kind:?}: still mounted");
        assert_eq!(
            std::fs::read_to_string(path.join("many/f500")).unwrap(),
            "500\n",
            "{kind:?}: still served after a refused removal"
        );
        drop(busy);

        let v = request(&r, "remove", json!({"workspace": id}));
        assert_eq!(v["ok"], true, "{kind:?}: {v}");
        assert!(
            !r.mounts().contains(&path),
            "{kind:?}: left in the mount table"
        );
        assert!(!path.exists(), "{kind:?}: the path is left");
        assert!(
            !r.ws_dirs().contains(&id),
            "{kind:?}: private state left: {:?}",
            r.ws_dirs()
        );
        assert_eq!(r.status(&id)["status"], "removed", "{kind:?}");

        // A new workspace at the same path at once: the base, nothing of the old one,
        // and it stays mounted while the old one's teardown finishes.
        let again = create(&r, &base, kind, &path);
        assert!(!path.join("many").exists(), "{kind:?}: the old writes show");
        assert_eq!(
            std::fs::read_to_string(path.join("README.md")).unwrap(),
            "# base\n",
            "{kind:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(r.mounts().contains(&path), "{kind:?}: the new mount went");
        assert_eq!(
            std::fs::read_to_string(path.join("README.md")).unwrap(),
            "# base\n",
            "{kind:?}"
        );
        let v = request(&r, "remove", json!({"workspace": again["id"]}));
        assert_eq!(v["ok"], true, "{kind:?}: {v}");
    }
    // The daemon stops cleanly once its teardowns are done; nothing is left.
    r.t.json(["daemon", "stop"]).ok();
    r.assert_clean();
}

#[test]
fn racing_mounts_and_unmounts_of_one_fuse_workspace_never_stack_or_lose_its_mount() {
    require_root!();
    let (r, base, path) = with_daemon();
    let rec = create(&r, &base, &[("materializer", "fuse")], &path);
    let id = rec["id"].as_str().unwrap().to_string();

    // Eight clients, each alternating unmount and mount requests for the one workspace.
    std::thread::scope(|s| {
        for t in 0..8 {
            let (r, id) = (&r, &id);
            s.spawn(move || {
                for k in 0..12 {
                    let op = if (t + k) % 2 == 0 {
                        "unmount_workspace"
                    } else {
                        "mount_workspace"
                    };
                    let v = request(r, op, json!({"workspace": id}));
                    assert_eq!(v["ok"], true, "{op}: {v}");
                }
            });
        }
    });
    // Served once more: exactly one mount at the path, serving the snapshot.
    let v = request(&r, "mount_workspace", json!({"workspace": id}));
    assert_eq!(v["ok"], true, "{v}");
    let at_path = r.mounts().iter().filter(|m| **m == path).count();
    assert_eq!(at_path, 1, "mounts at the workspace path: {:?}", r.mounts());
    assert_eq!(
        std::fs::read_to_string(path.join("README.md")).unwrap(),
        "# base\n"
    );
    // An answered mount stays: a session ended late must not unmount it.
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(
        r.mounts().contains(&path),
        "the mount went after its answer"
    );
    assert_eq!(
        std::fs::read_to_string(path.join("README.md")).unwrap(),
        "# base\n"
    );

    let v = request(&r, "remove", json!({"workspace": id}));
    assert_eq!(v["ok"], true, "{v}");
    r.t.json(["daemon", "stop"]).ok();
    r.assert_clean();
}

/// After `kill -9` of the daemon its two snapshot views stay mounted, dead ("Transport
/// endpoint is not connected"); `sweep` (and `daemon stop`) detach them when no daemon
/// serves the root, and leave a live daemon's alone.
#[test]
fn sweep_and_daemon_stop_detach_the_views_of_a_killed_daemon() {
    require_root!();
    let views = |r: &WsRoot| -> Vec<std::path::PathBuf> {
        r.mounts()
            .into_iter()
            .filter(|m| m.starts_with(r.root().join("run")))
            .collect()
    };
    for how in ["sweep", "daemon-stop"] {
        let r = WsRoot::new();
        let src = r.t.path("src");
        base_tree(&src);
        let snap = r.import(&src, &["--no-default-excludes"]);
        let ws = r.create(&snap, &["--materializer", "fuse"]);
        assert_eq!(views(&r).len(), 2, "the daemon's views: {:?}", r.mounts());
        // A live daemon's views are not touched.
        r.t.json(["sweep"]).ok();
        assert_eq!(views(&r).len(), 2, "{how}: sweep with a live daemon");
        for pid in r.fsd_pids() {
            super::support::kill9(pid);
        }
        while !r.fsd_pids().is_empty() {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(views(&r).len(), 2, "{how}: dead views left by the kill");
        r.t.json(["remove", ws.id.as_str(), "--force"]).ok();
        if how == "sweep" {
            r.t.json(["sweep"]).ok();
        } else {
            r.t.json(["daemon", "stop", "--force"]).ok();
        }
        assert_eq!(views(&r), Vec::<std::path::PathBuf>::new(), "{how}");
    }
}
