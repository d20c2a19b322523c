//! Creates racing a daemon's start and sweeps: on a fresh root with no daemon, many
//! `mountctl create` at once (each may start the daemon, which sweeps as it starts) while
//! `mountctl sweep` runs over and over; every create succeeds and every workspace is
//! whole. A creator that is alive is left alone by sweep; one killed mid-create is
//! finished off by the next sweep.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};

use cowspace_tests::{mountctl_bin, scan_tree};
use serde_json::Value;

use super::base_tree;
use super::support::{KillOnDrop, Ws, WsRoot, alive, kill9, require_root};

/// Creates at once, cycling through the ways a workspace is made.
const CREATES: usize = 24;
const KINDS: [&[&str]; 4] = [
    &["--lower", "view"],
    &["--lower", "checkout"],
    &["--materializer", "copy"],
    &["--materializer", "fuse"],
];

/// Asserts that `ws` shows every path of `src`, and regular files with their content.
#[track_caller]
fn assert_whole(src: &Path, ws: &Ws, what: &str) {
    let want = scan_tree(src);
    let got = scan_tree(&ws.path);
    let want_paths: BTreeSet<&String> = want.keys().collect();
    let got_paths: BTreeSet<&String> = got.keys().collect();
    assert_eq!(
        got_paths,
        want_paths,
        "{what}: paths of {}",
        ws.path.display()
    );
    for p in want.keys() {
        let (a, b) = (src.join(p), ws.path.join(p));
        if std::fs::symlink_metadata(&a).unwrap().is_file() {
            assert!(
                std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap(),
                "{what}: {p} differs"
            );
        }
    }
}

#[test]
fn parallel_creates_on_a_fresh_root_racing_the_daemon_start_and_sweeps_all_succeed_whole() {
    require_root!();
    let r = WsRoot::new();
    let src = r.t.path("src");
    base_tree(&src);
    let base = r.import(&src, &[]);
    assert_eq!(
        r.fsd_pids(),
        Vec::<u32>::new(),
        "no daemon before the creates"
    );
    assert!(
        !r.root().join("registry.db").exists(),
        "the creates open a fresh registry"
    );

    let creating = AtomicBool::new(true);
    let (wss, sweeps) = std::thread::scope(|s| {
        let sweeper = s.spawn(|| {
            let mut sweeps: Vec<Value> = Vec::new();
            while creating.load(Ordering::SeqCst) {
                sweeps.push(r.t.json(["sweep"]).ok().json());
            }
            sweeps
        });
        let creators: Vec<_> = (0..CREATES)
            .map(|i| {
                let (r, base) = (&r, &base);
                s.spawn(move || (i, r.create_out(base, KINDS[i % KINDS.len()])))
            })
            .collect();
        let outs: Vec<_> = creators
            .into_iter()
            .map(|h| h.join().expect("a creating thread panicked"))
            .collect();
        creating.store(false, Ordering::SeqCst);
        (outs, sweeper.join().expect("the sweeping thread panicked"))
    });
    let wss: Vec<(usize, Ws)> = wss
        .into_iter()
        .map(|(i, out)| {
            let v = out.ok().json();
            let ws = Ws {
                id: v["workspace"].as_str().expect("id").to_owned(),
                path: v["path"].as_str().expect("path").into(),
                json: v,
            };
            (i, ws)
        })
        .collect();
    eprintln!("{} sweeps ran during the creates", sweeps.len());
    let ids: BTreeSet<&str> = wss.iter().map(|(_, w)| w.id.as_str()).collect();
    for sweep in &sweeps {
        for finished in sweep["finished"].as_array().expect("finished") {
            assert!(
                !ids.contains(finished.as_str().unwrap_or("")),
                "a sweep finished off a create still running: {sweep}"
            );
        }
    }
    for (i, ws) in &wss {
        let what = format!("workspace {i} ({:?})", KINDS[i % KINDS.len()]);
        assert_eq!(r.status(&ws.id)["status"], "active", "{what}");
        assert_whole(&src, ws, &what);
    }
    assert_eq!(r.fsd_pids().len(), 1, "one daemon");

    // A sweep now changes nothing.
    let sweep = r.t.json(["sweep"]).ok().json();
    for key in ["stopped", "finished", "creating", "leftovers_removed"] {
        assert_eq!(sweep[key], serde_json::json!([]), "{key}: {sweep}");
    }
    for (_, ws) in &wss {
        r.remove(&ws.id);
    }
    r.assert_clean();
}

/// A `fsd` that never answers: a create on the view waits for it (up to the daemon's
/// start timeout) with its workspace `creating`.
fn silent_fsd(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("silent-fsd");
    std::fs::write(
        &p,
        "#!/bin/sh\necho $$ > \"$(dirname \"$0\")/silent-fsd.pid\"\nexec sleep 600\n",
    )
    .unwrap();
    cowspace_tests::chmod(&p, 0o755);
    p
}

/// Kills the silent daemon of `dir` when dropped.
struct SilentFsd<'a>(&'a Path);

impl Drop for SilentFsd<'_> {
    fn drop(&mut self) {
        if let Ok(pid) = std::fs::read_to_string(self.0.join("silent-fsd.pid"))
            && let Ok(pid) = pid.trim().parse()
        {
            kill9(pid);
        }
    }
}

#[test]
fn sweep_leaves_a_live_creators_workspace_and_finishes_a_killed_ones() {
    require_root!();
    let r = WsRoot::new();
    let src = r.t.path("src");
    base_tree(&src);
    let base = r.import(&src, &[]);
    let fake = silent_fsd(r.t.scratch());
    let _silent = SilentFsd(r.t.scratch());

    let creator = KillOnDrop(
        Command::new(mountctl_bin())
            .arg("--root")
            .arg(r.root())
            .args(["--json", "create", &base, "--lower", "view"])
            .env("COWSPACE_FSD", &fake)
            .env_remove("COWSPACE_ROOT")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let pid = creator.0.id();
    // The create records its workspace, then waits for the daemon that never answers.
    let rec = loop {
        let list = r.t.json(["list"]).ok().json();
        if let Some(rec) = list.as_array().and_then(|l| l.first()) {
            break rec.clone();
        }
        assert!(alive(pid), "the create ended before it was seen creating");
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    // Stopped (not ended) so it stays mid-create, however long the checks take.
    let _ = Command::new("kill")
        .args(["-STOP", &pid.to_string()])
        .status();
    let id = rec["id"].as_str().expect("id").to_owned();
    r.track(&id);
    assert_eq!(rec["status"], "creating", "{rec}");
    assert_eq!(rec["creator"]["pid"], pid, "{rec}");
    let private = Path::new(rec["private_dir"].as_str().expect("private_dir")).to_owned();
    assert!(private.is_dir());

    // Alive (stopped is alive): sweep leaves it, and remove refuses.
    let sweep = r.t.json(["sweep"]).ok().json();
    assert_eq!(sweep["creating"], serde_json::json!([id]), "{sweep}");
    assert_eq!(sweep["finished"], serde_json::json!([]), "{sweep}");
    assert!(private.is_dir(), "sweep deleted a live create's directory");
    r.t.json(["remove", &id]).error(6, "conflict");
    assert_eq!(r.status(&id)["status"], "creating");

    // Killed mid-create: the next sweep finishes it.
    drop(creator);
    let sweep = r.t.json(["sweep"]).ok().json();
    assert_eq!(sweep["finished"], serde_json::json!([id]), "{sweep}");
    assert_eq!(sweep["creating"], serde_json::json!([]), "{sweep}");
    assert_eq!(r.status(&id)["status"], "failed");
    assert!(!private.exists(), "the killed create's directory is left");
    drop(_silent);
    r.assert_clean();
}

/// `gc` prunes checkouts no workspace uses while creates on a checkout lower come and
/// go: a create that has found its checkout never loses it to a prune (which read the
/// records before the create recorded its workspace).
#[test]
fn pruning_checkouts_never_takes_the_one_a_create_is_using() {
    require_root!();
    let r = WsRoot::new();
    let src = r.t.path("src");
    base_tree(&src);
    let base = r.import(&src, &[]);
    const CYCLES: usize = 12;
    let creating = AtomicBool::new(true);
    let prunes = std::thread::scope(|s| {
        let pruner = s.spawn(|| {
            let mut prunes = 0;
            while creating.load(Ordering::SeqCst) {
                let out = r.t.json(["gc", "--wait"]).ok().json();
                prunes += out["checkouts_removed"].as_u64().unwrap_or(0);
            }
            prunes
        });
        for i in 0..CYCLES {
            let ws = r.create(&base, &["--lower", "checkout"]);
            assert_whole(&src, &ws, &format!("cycle {i}"));
            // Removed, so its checkout is unused again and the next prune may take it.
            r.remove(&ws.id);
        }
        creating.store(false, Ordering::SeqCst);
        pruner.join().expect("the pruning thread panicked")
    });
    eprintln!("{prunes} checkouts pruned during {CYCLES} create/remove cycles");
    r.assert_clean();
}
