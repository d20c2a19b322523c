//! `commit` of a workspace with nothing changed makes no snapshot: it says "nothing to
//! commit" and gives the snapshot it would have repeated (the base, or the previous
//! capture), unless `--allow-empty`.

use std::path::PathBuf;

use super::base_tree;
use super::support::{WsRoot, require_root};

#[test]
fn commit_with_nothing_changed_gives_the_base_unless_allow_empty() {
    require_root!();
    let r = WsRoot::new();
    let src = r.t.path("src");
    base_tree(&src);
    let base = r.import(&src, &[]);
    for materializer in ["overlay", "fuse", "copy"] {
        let ws = r.create(&base, &["--materializer", materializer]);
        let before = r.t.snapshots().len();

        let v = r.t.json(["commit", &ws.id]).ok().json();
        assert_eq!(v["snapshot"], base.as_str(), "{materializer}: {v}");
        assert_eq!(v["unchanged"], true, "{materializer}: {v}");
        let out = r.t.run(["commit", &ws.id]).ok();
        assert_eq!(out.stdout.trim(), base, "{materializer}: {out:?}");
        assert!(
            out.stderr.contains("nothing to commit"),
            "{materializer}: {out:?}"
        );
        assert_eq!(
            r.t.snapshots().len(),
            before,
            "{materializer}: no snapshot made"
        );
        assert_eq!(r.status(&ws.id)["commits"], serde_json::json!([]));

        // --allow-empty makes one, parented on the base.
        let (empty, v, _) = r.commit(&ws.id, &["--allow-empty", "--message", "mark"]);
        assert_ne!(empty, base, "{materializer}: {v}");
        assert!(v.get("unchanged").is_none(), "{materializer}: {v}");
        assert_eq!(r.t.snapshots().len(), before + 1, "{materializer}");

        // After a change and its capture, nothing changed is that capture.
        std::fs::write(ws.path.join("new.txt"), "new\n").unwrap();
        let (changed, _, _) = r.commit(&ws.id, &[]);
        assert_ne!(changed, empty);
        let v = r.t.json(["commit", &ws.id]).ok().json();
        assert_eq!(v["snapshot"], changed.as_str(), "{materializer}: {v}");
        assert_eq!(v["unchanged"], true, "{materializer}: {v}");
        // With --ref, the ref still ends at the snapshot given.
        let refname = format!("team/{materializer}");
        let v = r.t.json(["commit", &ws.id, "--ref", &refname]).ok().json();
        assert_eq!(v["snapshot"], changed.as_str(), "{materializer}: {v}");
        assert_eq!(r.t.refs()[&refname], changed, "{materializer}");
        assert_eq!(
            r.status(&ws.id)["commits"],
            serde_json::json!([empty, changed]),
            "{materializer}: only real captures are recorded"
        );
        r.remove(&ws.id);
        assert!(!PathBuf::from(&ws.path).join("new.txt").exists());
    }
    r.assert_clean();
}

/// `commit` and `diff` honour the base's recorded exclusion policy: a `.venv` or a
/// `node_modules` a worker makes in the workspace, and a path matching the import's
/// `--exclude`, are left out as the import would leave them out (issue: a venv's 2,781
/// files were captured); `--include-excluded` captures and lists them. Every
/// materializer alike.
#[test]
fn commit_and_diff_leave_out_what_the_base_policy_excludes() {
    require_root!();
    let r = WsRoot::new();
    let src = r.t.path("src");
    base_tree(&src);
    let base = r.import(&src, &["--exclude", "*.log"]);
    let paths = |v: &serde_json::Value| -> Vec<String> {
        v["changes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["path"].as_str().unwrap().to_owned())
            .collect()
    };
    for materializer in ["overlay", "fuse", "copy"] {
        let ws = r.create(&base, &["--materializer", materializer]);
        let d = &ws.path;
        // Only an excluded path changed: nothing to commit, and the note says why.
        cowspace_tests::write_file(&d.join("node_modules/only/x.js"), "x\n");
        let v = r.t.json(["commit", ws.id.as_str()]).ok().json();
        assert_eq!(
            (&v["unchanged"], &v["excluded"]),
            (&true.into(), &1.into()),
            "{materializer}: {v}"
        );
        let out = r.t.run(["commit", ws.id.as_str()]).ok();
        assert!(
            out.stderr.contains("--include-excluded"),
            "{materializer}: {}",
            out.stderr
        );
        for (p, text) in [
            (".venv/lib/python3/site.py", "venv\n"),
            ("web/node_modules/pkg/index.js", "pkg\n"),
            ("web/app.js", "app\n"),
            ("notes.log", "log\n"),
            ("new.txt", "new\n"),
        ] {
            cowspace_tests::write_file(&d.join(p), text);
        }
        let shown = paths(&r.t.json(["diff", ws.id.as_str()]).ok().json());
        for kept in ["web", "web/app.js", "new.txt"] {
            assert!(
                shown.iter().any(|p| p == kept),
                "{materializer}: {kept} in {shown:?}"
            );
        }
        for out in [".venv", "web/node_modules", "notes.log", "node_modules"] {
            assert!(
                !shown
                    .iter()
                    .any(|p| p == out || p.starts_with(&format!("{out}/"))),
                "{materializer}: diff lists {out}: {shown:?}"
            );
        }
        let all = paths(
            &r.t.json(["diff", ws.id.as_str(), "--include-excluded"])
                .ok()
                .json(),
        );
        for p in [
            ".venv/lib/python3/site.py",
            "web/node_modules/pkg/index.js",
            "notes.log",
        ] {
            assert!(
                all.iter().any(|a| a == p),
                "{materializer}: --include-excluded lacks {p}: {all:?}"
            );
        }
        let (snap, v, _) = r.commit(&ws.id, &[]);
        assert_eq!(v["excluded"], 4, "{materializer}: {v}");
        let out = r.t.path(&format!("export-{materializer}"));
        r.t.run(["export", snap.as_str(), out.to_str().unwrap()])
            .ok();
        assert!(
            out.join("web/app.js").is_file() && out.join("new.txt").is_file(),
            "{materializer}"
        );
        for p in [".venv", "web/node_modules", "notes.log"] {
            assert!(
                !out.join(p).exists(),
                "{materializer}: the commit holds {p}"
            );
        }
        let (all_snap, _, _) = r.commit(&ws.id, &["--include-excluded"]);
        let out = r.t.path(&format!("export-all-{materializer}"));
        r.t.run(["export", all_snap.as_str(), out.to_str().unwrap()])
            .ok();
        for p in [
            ".venv/lib/python3/site.py",
            "web/node_modules/pkg/index.js",
            "notes.log",
        ] {
            assert!(
                out.join(p).is_file(),
                "{materializer}: --include-excluded lacks {p}"
            );
        }
        r.remove(&ws.id);
    }
    // Two snapshots' diff takes no --include-excluded (a usage error).
    r.t.run(["diff", base.as_str(), base.as_str(), "--include-excluded"])
        .code(2);
    r.assert_clean();
}
