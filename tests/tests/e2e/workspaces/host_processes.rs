//! Host processes and a long-lived sandbox: one that enters the workspace while the
//! sandbox runs is in the sandbox's shared mount, which `sandbox stop` can only detach;
//! the stop names it (pid and command) and says what to do, and one that left before
//! the stop is not named.

use std::process::{Command, Stdio};

use super::base_tree;
use super::support::{KillOnDrop, WsRoot, require_root};

#[test]
fn sandbox_stop_names_host_processes_still_in_its_mount() {
    require_root!();
    let r = WsRoot::new();
    let src = r.t.path("src");
    base_tree(&src);
    let base = r.import(&src, &[]);
    let ws = r.create(&base, &["--name", "watched", "--materializer", "overlay"]);
    r.t.json(["sandbox", "start", "watched"]).ok();
    // A host process (a file watcher, say) that makes the workspace its working
    // directory while the sandbox runs, and one that comes and goes.
    let stays = KillOnDrop(
        Command::new("sleep")
            .arg("600")
            .current_dir(&ws.path)
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let gone = Command::new("true")
        .current_dir(ws.path.join("src"))
        .status()
        .unwrap();
    assert!(gone.success());

    let out = r.t.json(["sandbox", "stop", "watched"]).ok();
    let v = out.json();
    assert_eq!(v["was_running"], true, "{v}");
    let listed = v["host_processes"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "{v}");
    assert_eq!(listed[0]["pid"], stays.0.id(), "{v}");
    assert_eq!(listed[0]["command"], "sleep", "{v}");
    assert!(
        out.stderr.contains(&format!("{} (sleep)", stays.0.id()))
            && out.stderr.contains("cd` out and back in"),
        "{}",
        out.stderr
    );
    drop(stays);

    // With no host process in it, a stop names none and says nothing of it.
    r.t.json(["sandbox", "start", "watched"]).ok();
    let out = r.t.json(["sandbox", "stop", "watched"]).ok();
    assert_eq!(out.json()["host_processes"], serde_json::json!([]));
    assert!(!out.stderr.contains("host processes"), "{}", out.stderr);
    r.remove(&ws.id);
    r.assert_clean();
}
