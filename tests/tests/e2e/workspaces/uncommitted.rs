//! What a workspace holds that its last commit does not (issue 40): `remove` without
//! `--force` refuses (busy, 5) to throw it away, naming how many paths and the commands
//! that keep or drop them; `status` counts them; `diff WS SNAP` lists the workspace's
//! changes against any snapshot, its last commit say. The same for every materializer.

use super::base_tree;
use super::support::{WsRoot, require_root};

fn changes(v: &serde_json::Value) -> Vec<String> {
    v["changes"]
        .as_array()
        .unwrap_or_else(|| panic!("no changes: {v}"))
        .iter()
        .map(|c| {
            format!(
                "{} {}",
                c["change"].as_str().unwrap(),
                c["path"].as_str().unwrap()
            )
        })
        .collect()
}

/// What `status` says changed since the last commit: (paths, whether it was committed).
fn since(r: &WsRoot, ws: &str) -> (u64, bool) {
    let out = r.t.run(["status", ws]).ok();
    let line = out
        .stdout
        .lines()
        .find(|l| l.starts_with("changes "))
        .unwrap_or_else(|| panic!("no changes line: {out:?}"));
    let n = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    (n, line.contains("its last commit"))
}

#[test]
fn remove_refuses_uncommitted_changes_until_they_are_committed_or_forced() {
    require_root!();
    let r = WsRoot::new();
    let src = r.t.path("src");
    base_tree(&src);
    let base = r.import(&src, &[]);
    for materializer in ["overlay", "fuse", "copy"] {
        // Untouched: removed at once.
        let ws = r.create(&base, &["--materializer", materializer]);
        assert_eq!(since(&r, &ws.id), (0, false), "{materializer}");
        r.remove(&ws.id);

        let ws = r.create(&base, &["--materializer", materializer]);
        std::fs::write(ws.path.join("new.txt"), "new\n").unwrap();
        std::fs::remove_file(ws.path.join("README.md")).unwrap();
        assert_eq!(since(&r, &ws.id), (2, false), "{materializer}");
        let err = r.t.json(["remove", &ws.id]).error(5, "busy");
        let (m, hint) = (
            err["message"].as_str().unwrap(),
            err["hint"].as_str().unwrap(),
        );
        assert!(
            m.contains("uncommitted") && m.contains("2 paths"),
            "{materializer}: {err}"
        );
        assert!(
            hint.contains(&format!("mountctl commit {}", ws.id)) && hint.contains("--force"),
            "{materializer}: {err}"
        );
        assert!(
            ws.path.join("new.txt").exists(),
            "{materializer}: nothing was removed"
        );

        // Committed: nothing is lost, so it goes; until then, a later change refuses again.
        let (first, _, _) = r.commit(&ws.id, &[]);
        assert_eq!(since(&r, &ws.id), (0, true), "{materializer}");
        std::fs::write(ws.path.join("new.txt"), "newer\n").unwrap();
        std::fs::write(ws.path.join("another.txt"), "x\n").unwrap();
        assert_eq!(since(&r, &ws.id), (2, true), "{materializer}");
        let err = r.t.json(["remove", &ws.id]).error(5, "busy");
        assert!(
            err["message"].as_str().unwrap().contains("last commit"),
            "{materializer}: {err}"
        );
        // The workspace against its last commit: only what changed since.
        let v = r.t.json(["diff", &ws.id, &first]).ok().json();
        assert_eq!(
            changes(&v),
            ["added another.txt", "modified new.txt"],
            "{materializer}: {v}"
        );
        assert_eq!(v["from"], first.as_str(), "{materializer}: {v}");
        // Back as committed (same bytes, new times): nothing uncommitted after all.
        std::fs::write(ws.path.join("new.txt"), "new\n").unwrap();
        std::fs::remove_file(ws.path.join("another.txt")).unwrap();
        assert_eq!(since(&r, &ws.id), (0, true), "{materializer}");
        std::fs::write(ws.path.join("another.txt"), "x\n").unwrap();
        r.t.json(["remove", "--force", &ws.id]).ok();
        assert!(
            !ws.path.join("new.txt").exists(),
            "{materializer}: forced away"
        );
    }
}

#[test]
fn diff_of_a_workspace_against_any_snapshot_composes_both_sides() {
    require_root!();
    let r = WsRoot::new();
    let src = r.t.path("src");
    base_tree(&src);
    let base = r.import(&src, &[]);
    // Another snapshot: README changed, data/log.txt gone, other.txt new.
    let other_src = r.t.path("other");
    base_tree(&other_src);
    std::fs::write(other_src.join("README.md"), "# other\n").unwrap();
    std::fs::remove_file(other_src.join("data/log.txt")).unwrap();
    std::fs::write(other_src.join("other.txt"), "o\n").unwrap();
    let other = r.import(&other_src, &["--ref", "team/other"]);
    let ws = r.create(&base, &["--materializer", "overlay"]);
    // The workspace makes README as the other snapshot has it, and adds mine.txt.
    std::fs::write(ws.path.join("README.md"), "# other\n").unwrap();
    std::fs::write(ws.path.join("mine.txt"), "m\n").unwrap();
    let v = r.t.json(["diff", &ws.id, "team/other"]).ok().json();
    assert_eq!(
        changes(&v),
        ["added data/log.txt", "added mine.txt", "deleted other.txt"],
        "{v}"
    );
    assert_eq!(v["from"], other.as_str());
    // Against its own base: `diff WS`.
    let one = r.t.json(["diff", &ws.id]).ok().json();
    let two = r.t.json(["diff", &ws.id, &base]).ok().json();
    assert_eq!(changes(&one), changes(&two));
    // Text, and a patch of a file on the snapshot's side only.
    let out = r.t.run(["diff", &ws.id, "team/other", "--patch"]).ok();
    assert!(out.stdout.contains("+line 1"), "{out:?}");
    // Two snapshots still compare as before; a name that is neither says so.
    let v = r.t.json(["diff", &base, &other]).ok().json();
    assert_eq!(v["to"], other.as_str());
    let err = r.t.json(["diff", "nosuch", &base]).error(3, "not_found");
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("neither a workspace"),
        "{err}"
    );
    r.t.json(["remove", "--force", &ws.id]).ok();
}

#[test]
fn remove_refuses_while_a_long_lived_sandbox_runs() {
    require_root!();
    let r = WsRoot::new();
    let src = r.t.path("src");
    base_tree(&src);
    let base = r.import(&src, &[]);
    let ws = r.create(&base, &["--name", "kept"]);
    r.t.json(["sandbox", "start", "kept"]).ok();
    let err = r.t.json(["remove", "kept"]).error(5, "busy");
    let (m, hint) = (
        err["message"].as_str().unwrap(),
        err["hint"].as_str().unwrap(),
    );
    assert!(m.contains("sandbox running"), "{err}");
    assert!(
        hint.contains("mountctl sandbox stop kept") && hint.contains("--force"),
        "{err}"
    );
    let st = r.t.json(["sandbox", "status", "kept"]).ok().json();
    assert_eq!(st["state"], "running", "the sandbox was left alone: {st}");
    // Stopped, nothing changed: removed without --force.
    let v = r.t.json(["sandbox", "stop", "kept"]).ok().json();
    assert_eq!(v["was_running"], true, "{v}");
    r.remove(&ws.id);

    // --force stops a running sandbox, its background processes with it, and removes.
    let ws = r.create(&base, &["--name", "forced"]);
    r.t.json(["sandbox", "start", "forced"]).ok();
    r.t.json([
        "exec",
        "forced",
        "--",
        "sh",
        "-c",
        "sleep 600 >/dev/null 2>&1 &",
    ])
    .ok();
    let st = r.t.json(["sandbox", "status", "forced"]).ok().json();
    let init = st["init_pid"].as_i64().unwrap_or(0);
    assert!(init > 0, "{st}");
    let err = r.t.json(["remove", "forced"]).error(5, "busy");
    assert!(
        err["message"].as_str().unwrap().contains("sandbox running"),
        "{err}"
    );
    r.t.json(["remove", "--force", "forced"]).ok();
    assert!(!ws.path.exists(), "the workspace is gone");
    assert!(
        !std::path::Path::new(&format!("/proc/{init}")).exists(),
        "the sandbox's init {init} still runs"
    );
    r.t.json(["sandbox", "status", "forced"])
        .error(3, "not_found");
    r.assert_clean();
}
