//! The configuration file (`cowspace::config`): its defaults reach `create` and `sandbox
//! start` on the CLI and on the daemon's socket; the environment and flags override it;
//! `mountctl config` says where each value came from; a bad file is refused by name.

use std::ffi::OsStr;

use serde_json::{Value, json};

use super::base_tree;
use super::support::{WsRoot, require_root};

fn setting<'v>(v: &'v Value, key: &str) -> &'v Value {
    v["settings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["key"] == key)
        .unwrap_or_else(|| panic!("no {key}: {v}"))
}

#[test]
fn configured_defaults_reach_create_and_sandboxes_and_flags_override_them() {
    require_root!();
    let r = WsRoot::new();
    let src = r.t.path("src");
    base_tree(&src);
    let base = r.import(&src, &[]);
    let file = r.t.path("config.toml");
    std::fs::write(
        &file,
        "[create]\nmaterializer = \"fuse\"\n[sandbox]\npids = 77\nmemory = \"96m\"\n",
    )
    .unwrap();
    let env = [("COWSPACE_CONFIG", file.as_os_str())];

    // Where each value comes from.
    let shown = r.t.run_env(["--json", "config"], &env).ok().json();
    let m = setting(&shown, "create.materializer");
    assert_eq!(
        (&m["value"], &m["from"]),
        (&json!("fuse"), &json!(file)),
        "{shown}"
    );
    assert_eq!(setting(&shown, "root")["from"], "flag", "{shown}");
    assert_eq!(setting(&shown, "sandbox.pids")["value"], 77, "{shown}");
    assert_eq!(
        setting(&shown, "create.lower")["from"],
        "default",
        "{shown}"
    );
    let overridden =
        r.t.run_env(
            ["--json", "config"],
            &[env[0], ("COWSPACE_MATERIALIZER", OsStr::new("copy"))],
        )
        .ok()
        .json();
    let m = setting(&overridden, "create.materializer");
    assert_eq!(
        (&m["value"], &m["from"]),
        (&json!("copy"), &json!("$COWSPACE_MATERIALIZER"))
    );

    // create: the file's materializer unless a flag names one.
    let create = |args: &[&str]| {
        let mut all = vec!["--json", "create", base.as_str()];
        all.extend_from_slice(args);
        let v = r.t.run_env(&all, &env).ok().json();
        r.track(v["id"].as_str().unwrap());
        v
    };
    let fuse = create(&["--name", "from-file"]);
    assert_eq!(fuse["materializer"], "fuse", "{fuse}");
    let overlay = create(&["--name", "from-flag", "--materializer", "overlay"]);
    assert_eq!(overlay["materializer"], "overlay", "{overlay}");

    // sandbox start: the file's limits where the flags give none.
    let started =
        r.t.run_env(["--json", "sandbox", "start", "from-flag"], &env)
            .ok()
            .json();
    assert_eq!(started["limits"]["pids"], 77, "{started}");
    assert_eq!(
        started["limits"]["memory_bytes"],
        96 * 1024 * 1024,
        "memory limit not from the file: {started}"
    );
    r.t.run(["sandbox", "stop", "from-flag"]).ok();

    // The daemon reads the file at start: a socket create that names no materializer
    // gets the file's.
    r.t.run_env(["daemon", "start"], &env).ok();
    let sock = r.socket("create", json!({"snapshot": base, "name": "over-socket"}));
    r.track(sock["id"].as_str().unwrap());
    assert_eq!(sock["materializer"], "fuse", "{sock}");
    for ws in ["from-file", "from-flag", "over-socket"] {
        r.t.run(["remove", ws]).ok();
    }
    r.t.run(["daemon", "stop"]).ok();
    r.assert_clean();
}

#[test]
fn a_bad_configuration_is_refused_by_name_before_anything_is_made() {
    let r = WsRoot::new();
    let src = r.t.path("src");
    base_tree(&src);
    let base = r.import(&src, &[]);
    let file = r.t.path("config.toml");
    std::fs::write(&file, "[create]\nmaterialiser = \"fuse\"\n").unwrap();
    let env = [("COWSPACE_CONFIG", file.as_os_str())];
    let err =
        r.t.run_env(["--json", "create", base.as_str()], &env)
            .error(9, "invalid_input");
    let msg = err["message"].as_str().unwrap();
    assert!(
        msg.contains("config.toml") && msg.contains("materialiser"),
        "{msg}"
    );
    assert!(msg.contains("the keys there are"), "{msg}");
    assert_eq!(
        r.t.json(["list"]).ok().json(),
        json!([]),
        "something was made"
    );
    let missing = r.t.path("no-such.toml");
    let err =
        r.t.run_env(
            ["--json", "list"],
            &[("COWSPACE_CONFIG", missing.as_os_str())],
        )
        .error(9, "invalid_input");
    assert!(
        err["message"].as_str().unwrap().contains("COWSPACE_CONFIG"),
        "{err}"
    );
}

#[test]
fn every_sandbox_value_is_checked_when_the_file_is_read() {
    let r = WsRoot::new();
    let file = r.t.path("config.toml");
    for (text, key) in [
        (
            "[sandbox]\nmemory = \"lots\"\n",
            "sandbox.memory = \"lots\"",
        ),
        ("[sandbox]\npids = 1\n", "sandbox.pids = 1"),
        ("[sandbox]\ncpus = 0.0\n", "sandbox.cpus = 0"),
        ("[sandbox]\ncpuset_cpus = \"many\"\n", "sandbox.cpuset_cpus"),
        (
            "[sandbox]\nallow_host = [\"http://x.org\"]\n",
            "sandbox.allow_host",
        ),
        ("[sandbox]\nadd_host = [\"db\"]\n", "sandbox.add_host"),
    ] {
        std::fs::write(&file, text).unwrap();
        let env = [("COWSPACE_CONFIG", file.as_os_str())];
        let err =
            r.t.run_env(["--json", "config"], &env)
                .error(9, "invalid_input");
        let msg = err["message"].as_str().unwrap();
        assert!(
            msg.contains("config.toml") && msg.contains(key),
            "{text:?}: {msg}"
        );
        assert!(
            !msg.contains("--"),
            "{text:?}: no flag the user never gave: {msg}"
        );
    }
    std::fs::write(
        &file,
        "[sandbox]\nnet = \"egress\"\nallow_host = [\"pypi.org\"]\nadd_host = [\"db.internal:10.0.0.5\"]\n",
    )
    .unwrap();
    let env = [("COWSPACE_CONFIG", file.as_os_str())];
    let shown = r.t.run_env(["--json", "config"], &env).ok().json();
    assert_eq!(
        setting(&shown, "sandbox.allow_host")["value"],
        json!(["pypi.org"])
    );
}
