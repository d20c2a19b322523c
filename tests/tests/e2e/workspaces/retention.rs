//! What a live workspace was made from or committed survives `gc --grace 0`, ref or no
//! ref, and goes once the workspace is removed; a commit without a ref says how long it
//! lives; `gc --dry-run` says what would go and why.

use cowspace_tests::write_file;
use serde_json::Value;

use super::base_tree;
use super::support::{WsRoot, require_root};

/// The snapshot ids `gc --dry-run --grace 0 --json` would remove.
fn would_remove(r: &WsRoot) -> Vec<String> {
    let v = r.t.json(["gc", "--dry-run", "--grace", "0"]).ok().json();
    v["snapshots_removed"]
        .as_array()
        .expect("snapshots_removed")
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn commits_without_a_ref_live_as_long_as_their_workspace() {
    require_root!();
    let r = WsRoot::new();
    let src = r.t.path("src");
    base_tree(&src);
    let base = r.import(&src, &[]);
    let ws = r.create(&base, &["--materializer", "overlay"]);

    write_file(&ws.path.join("first.txt"), "first capture\n");
    let out = r.t.run(["commit", &ws.id, "-m", "first"]).ok();
    let first = out.stdout.trim().to_owned();
    assert!(
        out.stderr.contains("has no ref")
            && out
                .stderr
                .contains(&format!("kept while workspace {}", ws.id)),
        "a commit without a ref says how long it lives: {out:?}"
    );
    write_file(&ws.path.join("second.txt"), "second capture\n");
    let (second, v, _) = r.commit(&ws.id, &[]);
    assert_eq!(v["pinned_by"], ws.id.as_str(), "{v}");
    assert_eq!(v["retention"]["referenced"], false, "{v}");
    assert_eq!(v["retention"]["pinned_by"], ws.id.as_str(), "{v}");
    assert!(v["retention"]["grace_secs_after_removal"].is_i64(), "{v}");

    // While the workspace lives, base and commits stay, exported intact.
    assert!(would_remove(&r).is_empty());
    let v = r.t.json(["gc", "--grace", "0"]).ok().json();
    assert_eq!(v["snapshots_removed"], serde_json::json!([]), "{v}");
    for snap in [&base, &first, &second] {
        let out = r.t.path(&format!("export-{}", &snap[..12]));
        r.t.json(["export", snap, out.to_str().unwrap()]).ok();
    }
    assert!(
        r.t.path(&format!("export-{}", &second[..12]))
            .join("second.txt")
            .is_file()
    );

    // A workspace recorded by a version that pinned nothing but its base keeps them
    // too: the registry says what it holds.
    {
        let store = cowspace::runtime::Runtime::open(r.root()).unwrap();
        store.store().unpin(&ws.id).unwrap();
        assert!(store.store().pins().unwrap().is_empty());
    }
    assert!(would_remove(&r).is_empty());

    // Removed, it holds nothing: base, first and second all go (none has a ref).
    r.remove(&ws.id);
    let gone = would_remove(&r);
    for snap in [&base, &first, &second] {
        assert!(gone.contains(snap), "{snap} should go: {gone:?}");
    }
    let dry = r.t.run(["gc", "--dry-run", "--grace", "0"]).ok();
    assert!(
        dry.stdout.contains(&format!("snapshot {}", &second[..12]))
            && dry.stdout.contains("no ref, pin or workspace leads to it"),
        "the dry run says what would go and why: {dry:?}"
    );
    let v: Value = r.t.json(["gc", "--grace", "0"]).ok().json();
    let why = v["snapshots"][0]["why"].as_str().unwrap_or_default();
    assert!(why.contains("grace"), "{v}");
    let ids = r.t.snapshot_ids();
    assert!(!ids.contains(&first) && !ids.contains(&second), "{ids:?}");
    assert!(
        r.t.run(["fsck"]).ok().stdout.starts_with("ok"),
        "the store is sound after the workspace's snapshots went"
    );
    r.assert_clean();
}

#[test]
fn a_removed_workspaces_late_pin_is_released_by_gc() {
    require_root!();
    let r = WsRoot::new();
    let src = r.t.path("src");
    base_tree(&src);
    let base = r.import(&src, &[]);
    let ws = r.create(&base, &["--materializer", "copy"]);
    r.remove(&ws.id);
    // A commit racing the removal pinned after the removal unpinned.
    {
        let rt = cowspace::runtime::Runtime::open(r.root()).unwrap();
        rt.store().pin(&base.parse().unwrap(), &ws.id).unwrap();
    }
    let v = r.t.json(["gc", "--grace", "0"]).ok().json();
    assert_eq!(v["ended_workspace_pins_released"], 1, "{v}");
    assert_eq!(v["snapshots_removed"], serde_json::json!([base]), "{v}");
    r.assert_clean();
}
