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

/// `mountctl`'s fast path (`mountctl/src/fast.rs`) takes `create`, `remove`, `list` and
/// `status` while the daemon runs and reads no `--`; with a `--` the same command goes
/// to the full command line. Both give the same output and exit code, answers and
/// errors alike, with the daemon and without it.
#[test]
fn the_fast_path_and_the_full_command_line_answer_alike() {
    require_root!();
    let r = WsRoot::new();
    let src = r.t.path("src");
    base_tree(&src);
    let base = r.import(&src, &[]);
    let same = |fast: &[&str], full: &[&str]| {
        let (a, b) = (r.t.run(fast), r.t.run(full));
        assert_eq!(
            (a.code, &a.stdout, &a.stderr),
            (b.code, &b.stdout, &b.stderr),
            "`{}` and `{}` differ",
            a.cmdline,
            b.cmdline
        );
        a.code
    };
    let keys = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    // A create on the full command line (asserting success), by its JSON.
    let create_full = |name: &str| {
        let args = ["create", "--lower", "checkout", "--name", name, "--", &base];
        let v = r.t.json(args).ok().json();
        let id = v["id"].as_str().expect("id").to_string();
        r.track(&id);
        (id, v)
    };
    for daemon in [true, false] {
        if daemon {
            r.t.run(["daemon", "start"]).ok();
        }
        let pids = cowspace_tests::fsd_pids_of(r.root());
        assert_eq!(pids.len(), usize::from(daemon), "{pids:?}");
        let (a, b) = (format!("a-{daemon}"), format!("b-{daemon}"));
        let fast = r.create(&base, &["--lower", "checkout", "--name", &a]);
        let (full, full_json) = create_full(&b);
        assert_eq!(keys(&fast.json), keys(&full_json));
        if daemon {
            for ws in [&fast.id, &full] {
                assert_eq!(creator_pid(&r, ws), pids[0], "{ws}: not the daemon's");
            }
        }
        for json in [&["--json"][..], &[]] {
            fn joined<'a>(a: &[&'a str], b: &[&'a str]) -> Vec<&'a str> {
                [a, b].concat()
            }
            assert_eq!(
                same(
                    &joined(json, &["status", &a]),
                    &joined(json, &["status", "--", &a])
                ),
                0
            );
            assert_eq!(
                same(&joined(json, &["list"]), &joined(json, &["list", "--"])),
                0
            );
            for op in ["status", "remove", "create"] {
                let code = same(
                    &joined(json, &[op, "no-such"]),
                    &joined(json, &[op, "--", "no-such"]),
                );
                assert_eq!(code, 3, "{op} no-such");
            }
        }
        let (x, y) = (
            r.t.json(["remove", &fast.id]).ok().json(),
            r.t.json(["remove", "--", &full]).ok().json(),
        );
        assert_eq!(keys(&x), keys(&y));
        assert_eq!(
            (x["id"].as_str(), y["id"].as_str()),
            (Some(&*fast.id), Some(&*full))
        );
        // -q silences the confirmation on both paths.
        let q1 = r.create(&base, &["--lower", "checkout"]);
        let (q2, _) = create_full(&format!("q-{daemon}"));
        let (fast_q, full_q) = (
            r.t.run(["-q", "remove", &q1.id]).ok(),
            r.t.run(["-q", "remove", "--", &q2]).ok(),
        );
        assert_eq!((&*fast_q.stdout, &*fast_q.stderr), ("", ""));
        assert_eq!((&*full_q.stdout, &*full_q.stderr), ("", ""));
        if daemon {
            r.t.run(["daemon", "stop"]).ok();
            // It lets go of the socket and the lock first, then exits: awaited, not timed.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
            while !r.fsd_pids().is_empty() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
    }
    r.assert_clean();
}
