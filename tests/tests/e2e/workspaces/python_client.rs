//! The Python example client (`docs/examples/cowspace_client.py`, standard library only)
//! against a real daemon: its demo imports a tree with progress events, creates a
//! workspace, writes a file, diffs, commits and removes it, and lists what the store
//! holds; the socket's answers are the CLI's `--json` answers.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use super::base_tree;
use super::support::{WsRoot, require_root};

#[test]
fn python_client_demo_creates_diffs_commits_and_removes() {
    require_root!();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/examples/cowspace_client.py");
    assert!(script.is_file(), "{} is missing", script.display());
    let r = WsRoot::new();
    let src = r.t.path("src");
    base_tree(&src);
    // A large enough tree that the import reports progress at least once.
    for i in 0..2000 {
        let dir = src.join(format!("many/{}", i % 20));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("f{i}")), format!("file {i}\n")).unwrap();
    }
    r.t.json(["daemon", "start"]).ok();

    let out = Command::new("python3")
        .arg(&script)
        .arg(r.root())
        .arg(&src)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Whatever happened, the guard removes a workspace the demo left.
    if let Ok(v) = serde_json::from_str::<Value>(&stdout)
        && let Some(id) = v["workspace"].as_str()
    {
        r.track(id);
    }
    assert!(
        out.status.success(),
        "demo failed\nstdout: {stdout}\nstderr: {stderr}"
    );
    let v: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("demo output is not JSON ({e}): {stdout}"));

    assert_eq!(v["ping"]["pong"], true, "{v}");
    // The import over the socket: its report, progress events, the ref it set.
    let base = v["base"].as_str().expect("imported snapshot").to_string();
    assert!(
        v["import"]["files"].as_u64().unwrap() > 2000,
        "{}",
        v["import"]
    );
    let events = v["progress_events"].as_array().expect("events");
    assert!(!events.is_empty(), "no progress event: {v}");
    let last = events.last().unwrap();
    assert_eq!(last["event"], "progress", "{last}");
    assert!(last["files_done"].as_u64().unwrap() <= last["files_total"].as_u64().unwrap());
    let id = v["workspace"].as_str().expect("workspace id");
    assert_eq!(
        v["diff"],
        serde_json::json!([{"path": "hello-from-python.txt", "change": "added", "new_kind": "file"}]),
        "{v}"
    );
    let snap = v["snapshot"].as_str().expect("snapshot");
    let show =
        r.t.json(["show", snap, "hello-from-python.txt"])
            .ok()
            .json();
    assert_eq!(
        show["entry"]["size"],
        "hello from python\n".len() as u64,
        "{show}"
    );
    assert_eq!(show["meta"]["parents"], serde_json::json!([base]), "{show}");
    // One JSON shape: what the socket answered is what `--json` prints.
    assert_eq!(v["show"], show, "show over the socket and the CLI differ");
    assert_eq!(v["refs"], r.t.json(["refs"]).ok().json(), "refs differ");
    assert_eq!(v["refs"]["python/demo"], base.as_str(), "{}", v["refs"]);
    assert_eq!(
        v["snapshots"],
        r.t.json(["snapshots"]).ok().json(),
        "snapshots differ"
    );
    assert_eq!(v["stats"], r.t.json(["stats"]).ok().json(), "stats differ");
    let gc = r.t.json(["gc", "--dry-run"]).ok().json();
    assert_eq!(
        v["gc_dry_run"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        gc.as_object().unwrap().keys().collect::<Vec<_>>(),
        "gc answers differ in shape"
    );
    assert!(
        v["listed"].as_array().unwrap().iter().any(|w| w == id),
        "{v}"
    );
    // The demo runs as root here: a long-lived sandbox, two execs, a missing command.
    assert_eq!(v["exec_write"], 0, "{v}");
    assert_eq!(v["exec_read"], 0, "{v}");
    assert_eq!(v["exec_stdout"], "from-exec\n", "{v}");
    assert_eq!(v["exec_missing"], 127, "{v}");
    assert_eq!(v["sandbox_stop"]["stopped"], true, "{v}");
    assert_eq!(v["removed"]["status"], "removed", "{v}");
    assert_eq!(v["error"]["kind"], "not_found", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no-such-workspace")
    );
    assert_eq!(r.status(id)["status"], "removed");
    assert!(!Path::new(v["path"].as_str().unwrap()).exists());
    assert_eq!(r.t.json(["list"]).ok().json(), serde_json::json!([]));
    r.assert_clean();
}

/// The Rust example of docs/api.md, as the docs run it: the example binary beside `fsd`.
#[test]
fn the_rust_example_runs_as_documented() {
    require_root!();
    // `cargo test` builds the examples beside the binaries (target/<profile>/examples).
    let exe = std::env::current_exe().unwrap();
    let mut dir = exe.parent().unwrap();
    if dir.ends_with("deps") {
        dir = dir.parent().unwrap();
    }
    let example = dir.join("examples/workspace");
    if !example.is_file() {
        let ok = Command::new(env!("CARGO"))
            .args([
                "build",
                "-p",
                "cowspace-fsd",
                "-p",
                "cowspace",
                "--bins",
                "--examples",
            ])
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            ok,
            "cargo build -p cowspace-fsd -p cowspace --bins --examples failed"
        );
    }
    let r = WsRoot::new();
    let src = r.t.path("src");
    base_tree(&src);
    let root = r.t.path("example-root");
    let out = Command::new(&example)
        .arg(&root)
        .arg(&src)
        .output()
        .expect("run the example");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.contains("removed ws-"), "{stdout}");
    let _ = Command::new(cowspace_tests::mountctl_bin())
        .arg("--root")
        .arg(&root)
        .args(["daemon", "stop", "--force"])
        .output();
}
