//! `bench run --quick` end to end: a real run on a small synthetic corpus, with
//! every available method, checked for a complete, honest record and no leftovers.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

const BENCH: &str = env!("CARGO_BIN_EXE_bench");

fn methods(run: &Value, section: &str) -> Vec<Value> {
    run["sections"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == section)
        .unwrap_or_else(|| panic!("section {section} missing"))["methods"]
        .as_array()
        .unwrap()
        .clone()
}

fn method<'a>(ms: &'a [Value], id: &str) -> &'a Value {
    ms.iter()
        .find(|m| m["id"] == id)
        .unwrap_or_else(|| panic!("method {id} missing"))
}

fn mounts_below(p: &Path) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(1).map(str::to_string))
        .filter(|m| Path::new(m).starts_with(p))
        .collect()
}

#[test]
fn quick_run_end_to_end() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, work, out) = (
        tmp.path().join("cache"),
        tmp.path().join("work"),
        tmp.path().join("out"),
    );
    let status = Command::new(BENCH)
        .args(["run", "--quick"])
        .arg("--cache")
        .arg(&cache)
        .arg("--work")
        .arg(&work)
        .arg("--out")
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success(), "bench run --quick failed: {status}");

    let json = std::fs::read_dir(&out)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "json"))
        .expect("a run JSON");
    let run: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(run["schema"], "cowspace-bench/1");
    assert_eq!(run["settings"]["runs"], 3);
    assert!(
        run["reproduce"]
            .as_str()
            .unwrap()
            .starts_with("bench run --corpus synthetic --files 2000")
    );
    assert!(run["machine"]["cores"].as_u64().unwrap() >= 1);
    assert!(run["machine"]["cpuidle"].is_string(), "{}", run["machine"]);
    assert!(run["corpus"]["stats"]["files"].as_u64().unwrap() > 1000);

    // Nothing dropped silently: every method is ok with all runs, or says why not.
    for section in run["sections"].as_array().unwrap() {
        // The sandbox section runs one start per round, --fast-loop rounds.
        let rounds = if section["id"] == "sandbox" {
            run["settings"]["fast_loop"].clone()
        } else {
            3.into()
        };
        for m in section["methods"].as_array().unwrap() {
            // VM boots are slow methods: `--slow-runs` rounds (at most the runs).
            let rounds = if section["id"] == "sandbox"
                && ["vm-start", "vm-run"].contains(&m["id"].as_str().unwrap_or(""))
            {
                run["settings"]["slow_runs"].clone()
            } else {
                rounds.clone()
            };
            match m["status"].as_str().unwrap() {
                "ok" => assert_eq!(m["runs_completed"], rounds, "{m}"),
                _ => assert!(!m["reason"].as_str().unwrap_or("").is_empty(), "{m}"),
            }
        }
    }
    let import = methods(&run, "import");
    for id in ["tar-zstd", "git-commit"] {
        let m = method(&import, id);
        assert_eq!(m["status"], "ok", "{m}");
        let s = &m["summary"];
        assert!(s["cold_s"]["median"].as_f64().unwrap() > 0.0);
        assert!(s["stored_bytes"]["median"].as_f64().unwrap() > 0.0);
        assert_eq!(s["cold_s"]["n"], 3);
    }
    // From git, a commit imported again reads nothing from git.
    let from_git = method(&import, "store-git");
    if from_git["status"] == "ok" || std::env::var("CI").as_deref() == Ok("true") {
        assert_eq!(from_git["status"], "ok", "{from_git}");
        let s = &from_git["summary"];
        assert!(s["cold_s"]["median"].as_f64().unwrap() > 0.0);
        assert_eq!(s["unchanged_files_read"]["max"].as_f64(), Some(0.0), "{s}");
        assert!(s["changed_files_read"]["median"].as_f64().unwrap() > 0.0);
    }
    let store = method(&import, "store");
    match store["status"].as_str().unwrap() {
        "ok" => {
            let s = &store["summary"];
            assert!(s["cold_s"]["median"].as_f64().unwrap() > 0.0);
            assert!(s["unchanged_s"]["median"].as_f64().unwrap() > 0.0);
            assert!(s["stored_bytes"]["median"].as_f64().unwrap() > 0.0);
        }
        other => {
            let why = store["reason"].as_str().unwrap();
            // Only an absent or not-yet-implemented mountctl is an acceptable skip.
            assert!(
                other == "skipped"
                    && (why.contains("not found") || why.contains("not available yet")),
                "the store method {other}: {why}"
            );
            eprintln!("NOTE: store import not measured: {why}");
        }
    }
    // Twenty tiny imports, twenty packs; one after the repack.
    let repack = method(&import, "store-repack");
    if repack["status"] == "ok" {
        let s = &repack["summary"];
        assert_eq!(
            s["repack_packs_before"]["median"].as_f64(),
            Some(20.0),
            "{s}"
        );
        assert_eq!(s["repack_packs_after"]["max"].as_f64(), Some(1.0), "{s}");
        assert!(s["repack_s"]["median"].as_f64().unwrap() > 0.0);
    } else {
        assert_eq!(repack["status"], store["status"], "{repack}");
    }
    let mat = methods(&run, "materialize");
    assert_eq!(method(&mat, "cp-a")["status"], "ok");
    // Where mountctl makes overlay or fuse workspaces, the control socket makes them too.
    for (by_mountctl, by_socket) in [
        ("cowspace-overlay-view", "cowspace-overlay-socket"),
        ("cowspace-fuse", "cowspace-fuse-socket"),
    ] {
        if method(&mat, by_mountctl)["status"] == "ok" {
            let m = method(&mat, by_socket);
            assert_eq!(m["status"], "ok", "{m}");
            assert!(
                m["summary"]["create_s"]["median"].as_f64().unwrap() > 0.0,
                "{m}"
            );
        }
    }
    // Loop filesystems are never made in quick mode: their methods say so.
    for id in ["cowspace-btrfs", "btrfs-snapshot", "reflink-copy"] {
        let m = method(&mat, id);
        assert_eq!(m["status"], "skipped", "{m}");
        assert!(m["reason"].as_str().unwrap().contains("--quick"), "{m}");
    }
    let sandbox = methods(&run, "sandbox");
    assert!(!sandbox.is_empty());
    // Remotes: against moto's server, which CI installs; elsewhere a skip says why.
    let remote = methods(&run, "remote");
    let lazy = method(&remote, "lazy");
    if lazy["status"] == "ok" || std::env::var("CI").as_deref() == Ok("true") {
        for id in [
            "push",
            "tar-zstd-put",
            "lazy",
            "fetch-create",
            "pull",
            "get-one-object",
        ] {
            assert_eq!(
                method(&remote, id)["status"],
                "ok",
                "{}",
                method(&remote, id)
            );
        }
        let s = &lazy["summary"];
        assert!(s["usable_s"]["median"].as_f64().unwrap() > 0.0, "{s}");
        assert!(s["metadata_bytes"]["median"].as_f64().unwrap() > 0.0, "{s}");
        // Reads fetch something, and not the whole tree.
        let reads = s["reads_fetched_bytes"]["median"].as_f64().unwrap();
        assert!(reads > 0.0, "{s}");
        let pulled = method(&remote, "pull")["summary"]["download_bytes"]["median"]
            .as_f64()
            .unwrap();
        assert!(reads < pulled / 10.0, "reads fetched {reads} of {pulled}");
        let pushed = method(&remote, "push")["summary"]["upload_bytes"]["median"]
            .as_f64()
            .unwrap();
        assert!(pushed > 0.0);
    } else {
        eprintln!("NOTE: remote section not measured: {}", lazy["reason"]);
    }

    // Network: the host's side always runs; the sandbox's needs root, and then every
    // paired figure is there, one per run.
    let network = methods(&run, "network");
    let direct = method(&network, "direct");
    assert_eq!(direct["status"], "ok", "{direct}");
    assert!(
        direct["summary"]["download_mbps"]["median"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    assert_eq!(direct["summary"]["held_connections"]["n"], 3, "{direct}");
    let proxied = method(&network, "egress-proxy");
    if proxied["status"] == "ok" {
        let s = &proxied["summary"];
        for k in [
            "download_ratio",
            "download_connect_ratio",
            "request_added_s",
            "request_keepalive_added_s",
            "proxy_rss_held_bytes",
        ] {
            assert_eq!(s[k]["n"], 3, "{k}: {s}");
        }
        assert!(s["proxy_rss_held_bytes"]["median"].as_f64().unwrap() > 0.0);
    } else {
        eprintln!(
            "NOTE: network through the proxy not measured: {}",
            proxied["reason"]
        );
    }

    // No leftovers: the work directory is empty and nothing is mounted below tmp.
    let left: Vec<_> = std::fs::read_dir(&work)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "leftovers: {left:?}");
    assert!(
        mounts_below(tmp.path()).is_empty(),
        "{:?}",
        mounts_below(tmp.path())
    );
    // …and no daemon started for a store below it keeps running.
    let needle = tmp.path().to_string_lossy().into_owned();
    let daemons: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&needle) && !c.contains("bench"))
        .collect();
    assert!(daemons.is_empty(), "left running: {daemons:?}");

    // The report re-renders from the JSON alone.
    let rep = Command::new(BENCH)
        .arg("report")
        .arg(&out)
        .output()
        .unwrap();
    assert!(rep.status.success());
    let md = String::from_utf8(rep.stdout).unwrap();
    assert!(
        md.contains("## Import") && md.contains("| metric |"),
        "{md}"
    );
    assert!(md.contains("tar \\| zstd -T0 -3"));
}

#[test]
fn bad_arguments_are_usage_errors_before_any_effect() {
    let tmp = tempfile::tempdir().unwrap();
    for args in [
        vec!["run", "--methods", "nope"],
        vec!["run", "--sections", "nope"],
        vec!["run", "--corpus", "nope"],
        vec!["run", "--runs", "0"],
    ] {
        let out = Command::new(BENCH)
            .args(&args)
            .arg("--cache")
            .arg(tmp.path().join("cache"))
            .arg("--out")
            .arg(tmp.path().join("out"))
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!tmp.path().join("cache").exists() && !tmp.path().join("out").exists());
    }
}
