//! One JSON shape per record kind, the same on the CLI (`--json`) and the control socket
//! (docs/control-protocol.md): a workspace record has `id` (never only `workspace`);
//! `create` and `remove` answer the record plus `elapsed_ms` (and, for one release, the
//! old `workspace` and `ms`); every reported elapsed time is `elapsed_ms`; `diff` names
//! the workspace by its id; `status` without `--json` is text.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use super::base_tree;
use super::support::{WsRoot, require_root};

fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"))
        .keys()
        .cloned()
        .collect()
}

/// The keys of a workspace record, as `status --json` gives them.
fn record_keys(r: &WsRoot, ws: &str) -> BTreeSet<String> {
    keys(&r.t.json(["status", ws]).ok().json())
}

/// Wherever an elapsed time is reported, its name is `elapsed_ms` (`ms` is its old name,
/// kept one release with the same value).
#[track_caller]
fn assert_elapsed(what: &str, v: &Value) {
    assert!(
        v["elapsed_ms"].as_f64().is_some_and(|ms| ms >= 0.0),
        "{what}: {v}"
    );
    if !v["ms"].is_null() {
        assert_eq!(
            v["ms"], v["elapsed_ms"],
            "{what}: ms is elapsed_ms's old name"
        );
    }
}

#[test]
fn json_shapes_are_one_per_record_kind_on_the_cli_and_the_socket() {
    require_root!();
    let r = WsRoot::new();
    let src = r.t.path("src");
    base_tree(&src);
    let base = r.import(&src, &[]);
    r.t.run(["daemon", "start"]).ok();

    // create: the record plus elapsed_ms, on both.
    let cli = r.create(&base, &["--name", "cli-one"]).json;
    let sock = r.socket("create", json!({"snapshot": base, "name": "sock-one"}));
    let id = sock["id"].as_str().unwrap().to_owned();
    r.track(&id);
    assert_eq!(keys(&cli), keys(&sock), "create: CLI vs socket");
    let record = record_keys(&r, cli["id"].as_str().unwrap());
    for (what, v) in [("CLI create", &cli), ("socket create", &sock)] {
        assert!(keys(v).is_superset(&record), "{what} is not a record: {v}");
        assert_eq!(
            v["workspace"], v["id"],
            "{what}: workspace is id's old name"
        );
        assert!(
            v["lower"].as_str().is_some_and(|l| l.starts_with('/')),
            "{what}: lower is the lower directory: {v}"
        );
        assert!(v["lower_kind"].is_string(), "{what}: {v}");
        assert_elapsed(what, v);
    }

    // status and list: the record, on both.
    assert_eq!(
        keys(&r.socket("status", json!({"workspace": "cli-one"}))),
        record,
        "socket status"
    );
    for item in r.t.json(["list"]).ok().json().as_array().unwrap() {
        assert_eq!(keys(item), record, "list item");
    }
    for item in r.socket("list", json!({})).as_array().unwrap() {
        assert_eq!(keys(item), record, "socket list item");
    }
    let text = r.t.run(["status", "cli-one"]).ok().stdout;
    assert!(
        serde_json::from_str::<Value>(&text).is_err(),
        "status without --json is JSON:\n{text}"
    );
    assert!(
        text.contains(cli["id"].as_str().unwrap()) && text.contains("cli-one"),
        "{text}"
    );

    // diff: the workspace by its id, whatever it was named by.
    let diff = r.t.json(["diff", "cli-one"]).ok().json();
    assert_eq!(diff["workspace"], cli["id"], "diff names the id: {diff}");
    let sdiff = r.socket("diff", json!({"workspace": "sock-one"}));
    assert_eq!(sdiff["workspace"], id.as_str(), "socket diff: {sdiff}");
    assert_eq!(keys(&diff), keys(&sdiff), "diff: CLI vs socket");

    // commit: one report on both.
    let commit = r.t.json(["commit", "cli-one", "--allow-empty"]).ok().json();
    let scommit = r.socket(
        "commit",
        json!({"workspace": "sock-one", "allow_empty": true}),
    );
    assert_eq!(keys(&commit), keys(&scommit), "commit: CLI vs socket");
    assert_elapsed("commit", &commit);

    // export reports elapsed_ms too.
    let dest = r.t.path("schema-export");
    let export =
        r.t.json(["export", base.as_str(), dest.to_str().unwrap()])
            .ok()
            .json();
    assert_elapsed("export", &export);
    let sdest = r.t.path("schema-export-socket");
    let sexport = r.socket(
        "export",
        json!({"snapshot": base, "dest": sdest.to_str().unwrap()}),
    );
    assert_eq!(keys(&export), keys(&sexport), "export: CLI vs socket");
    assert!(
        sdest.join("README.md").is_file(),
        "the socket's export is not there"
    );

    // The store's operations: the same answers on both.
    for (op, args, cli) in [
        ("snapshots", json!({}), vec!["snapshots"]),
        ("refs", json!({}), vec!["refs"]),
        ("stats", json!({}), vec!["stats"]),
        (
            "show",
            json!({"snapshot": base}),
            vec!["show", base.as_str()],
        ),
        (
            "show",
            json!({"snapshot": base, "path": "src/lib"}),
            vec!["show", base.as_str(), "src/lib"],
        ),
    ] {
        assert_eq!(
            r.socket(op, args),
            r.t.json(cli).ok().json(),
            "{op}: CLI vs socket"
        );
    }
    let set =
        r.t.json(["ref", "set", "schema/cli", base.as_str()])
            .ok()
            .json();
    let sset = r.socket("ref_set", json!({"name": "schema/sock", "snapshot": base}));
    assert_eq!(keys(&set), keys(&sset), "ref set: CLI vs socket");
    let sdel = r.socket("ref_delete", json!({"name": "schema/sock", "expect": base}));
    assert_eq!(sdel, json!({"ref": "schema/sock", "deleted": true}));
    let gc = r.t.json(["gc", "--dry-run"]).ok().json();
    let sgc = r.socket("gc", json!({"dry_run": true}));
    assert_eq!(keys(&gc), keys(&sgc), "gc: CLI vs socket");

    // import: the report, on both (the socket's with the notes mountctl prints).
    let again = r.t.path("src-again");
    base_tree(&again);
    let imported = r.t.json(["import", again.to_str().unwrap()]).ok().json();
    let simported = r.socket("import", json!({"source": again.to_str().unwrap()}));
    let mut cli_keys = keys(&imported);
    cli_keys.insert("notes".into());
    assert_eq!(cli_keys, keys(&simported), "import: CLI vs socket");
    assert_eq!(
        imported["root"], simported["root"],
        "the same tree, the same root"
    );

    // remove: the final record plus removed and elapsed_ms, on both.
    let removed = r.t.json(["remove", "cli-one"]).ok().json();
    let sremoved = r.socket("remove", json!({"workspace": "sock-one"}));
    assert_eq!(keys(&removed), keys(&sremoved), "remove: CLI vs socket");
    for (what, v) in [("CLI remove", &removed), ("socket remove", &sremoved)] {
        assert!(keys(v).is_superset(&record), "{what} is not a record: {v}");
        assert_eq!(v["status"], "removed", "{what}");
        assert_eq!(v["removed"], true, "{what}");
        assert_elapsed(what, v);
    }
    r.t.run(["daemon", "stop"]).ok();
    r.assert_clean();
}
