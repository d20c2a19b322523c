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
