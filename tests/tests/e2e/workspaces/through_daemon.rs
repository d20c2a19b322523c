//! `mountctl create`, `list`, `status` and `remove` go to the root's daemon when one runs
//! (the CLI then opens no database): the daemon is the workspace's creator, a relative
//! `--path` is the caller's, and the answers are those of the in-process path.

use std::process::Command;

use serde_json::Value;

use super::base_tree;
use super::support::{WsRoot, require_root};

fn creator_pid(r: &WsRoot, ws: &str) -> u32 {
    let st = r.status(ws);
    st["creator"]["pid"]
        .as_u64()
        .unwrap_or_else(|| panic!("no creator: {st}")) as u32
}

#[test]
fn the_cli_creates_through_a_running_daemon_and_in_process_without_one() {
    require_root!();
    let r = WsRoot::new();
    let src = r.t.path("src");
    base_tree(&src);
    let base = r.import(&src, &[]);

    // No daemon: this process creates (its pid, gone now, is the creator).
    let alone = r.create(&base, &["--name", "alone", "--lower", "checkout"]);
    assert!(cowspace_tests::fsd_pids_of(r.root()).is_empty());
    let pid = creator_pid(&r, &alone.id);
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "{pid}"
    );

    r.t.run(["daemon", "start"]).ok();
    let daemon = cowspace_tests::fsd_pids_of(r.root());
    assert_eq!(daemon.len(), 1, "{daemon:?}");
    let via = r.create(&base, &["--name", "via-daemon", "--lower", "checkout"]);
    assert_eq!(
        creator_pid(&r, &via.id),
        daemon[0],
        "the daemon did not create it"
    );
    // The same answer shape either way.
    let keys = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    assert_eq!(keys(&alone.json), keys(&via.json));
    // list and status through the daemon show both.
    let listed: Vec<String> =
        r.t.json(["list"])
            .ok()
            .json()
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["id"].as_str().unwrap().to_string())
            .collect();
    assert!(
        listed.contains(&alone.id) && listed.contains(&via.id),
        "{listed:?}"
    );

    // A relative --path is the caller's, not the daemon's working directory.
    let out = Command::new(cowspace_tests::mountctl_bin())
        .current_dir(r.t.scratch())
        .env("COWSPACE_CONFIG", cowspace_tests::empty_config())
        .args([
            "--root",
            r.root().to_str().unwrap(),
            "--json",
            "create",
            &base,
        ])
        .args(["--lower", "checkout", "--path", "relative-ws"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = v["id"].as_str().unwrap().to_string();
    r.track(&id);
    assert_eq!(creator_pid(&r, &id), daemon[0]);
    let want = r.t.scratch().join("relative-ws");
    assert_eq!(v["path"].as_str().unwrap(), want.to_str().unwrap(), "{v}");
    assert!(want.join("README.md").is_file());

    // An error answered by the daemon keeps its kind and exit code.
    r.t.json(["create", "no-such-ref"]).error(3, "not_found");
    for ws in [&alone.id, &via.id, &id] {
        r.t.run(["remove", ws]).ok();
    }
    r.t.run(["daemon", "stop"]).ok();
    r.assert_clean();
}
