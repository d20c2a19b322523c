//! The daemon killed (`kill -9`) while a worker writes into a workspace it serves (overlay
//! over the view, or a fuse workspace, which the daemon serves whole): `sweep` marks the
//! workspaces `stopped`, `recover` brings each back with everything that had been written,
//! and removing them leaves nothing behind.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::base_tree;
use super::support::{KillOnDrop, WsRoot, alive, kill9, require_root};

/// The content the writer gives file number `i` (what `yes | head` writes).
fn expected(i: u64) -> String {
    format!("file {i}\n").repeat(500)
}

/// A writer in `dir`: files `out/f<i>` written with fsync, each name printed once done.
fn start_writer(dir: &Path) -> KillOnDrop {
    let child = Command::new("sh")
        .arg("-c")
        .arg(
            "mkdir -p out && i=0; while [ $i -lt 100000 ]; do \
               yes \"file $i\" | head -n 500 | dd of=out/f$i conv=fsync status=none || exit 1; \
               echo f$i; i=$((i+1)); done",
        )
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the writer");
    KillOnDrop(child)
}

#[test]
fn daemon_killed_during_writes_workspaces_recover_with_their_data() {
    require_root!();
    crash_and_recover(&["--lower", "view"]);
}

#[test]
fn daemon_killed_during_writes_fuse_workspaces_recover_with_their_data() {
    require_root!();
    crash_and_recover(&["--materializer", "fuse"]);
}

/// Three workspaces made with `create_flags`, the daemon killed while one is written.
fn crash_and_recover(create_flags: &[&str]) {
    let r = WsRoot::new();
    let src = r.t.path("src");
    base_tree(&src);
    let base = r.import(&src, &[]);
    let wss: Vec<_> = (0..3).map(|_| r.create(&base, create_flags)).collect();
    // Data written (and closed) in the quiet workspaces before the crash.
    for (n, ws) in wss.iter().enumerate() {
        std::fs::write(ws.path.join(format!("before-{n}.txt")), format!("ws {n}\n")).unwrap();
        std::fs::write(ws.path.join("README.md"), format!("edited in {n}\n")).unwrap();
    }
    let fsd = r.fsd_pids();
    assert_eq!(fsd.len(), 1, "one daemon serves the root: {fsd:?}");

    // A worker writing in a loop; the daemon dies under it.
    let mut writer = start_writer(&wss[0].path);
    let mut lines = BufReader::new(writer.0.stdout.take().expect("stdout"));
    let mut done: Vec<String> = Vec::new();
    let started = Instant::now();
    while done.len() < 200 && started.elapsed() < Duration::from_secs(60) {
        let mut l = String::new();
        if lines.read_line(&mut l).unwrap_or(0) == 0 {
            break;
        }
        done.push(l.trim().to_owned());
    }
    assert!(done.len() >= 200, "the writer completed only {done:?}");
    kill9(fsd[0]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(fsd[0]) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!alive(fsd[0]), "the daemon survived kill -9");
    // Let the writer run on for a moment after the crash, then stop it and take every
    // name it finished (its writes go to the upper layer, which the crash does not touch).
    std::thread::sleep(Duration::from_millis(300));
    let _ = writer.0.kill();
    let _ = writer.0.wait();
    for l in lines.lines() {
        match l {
            Ok(l) if !l.trim().is_empty() => done.push(l.trim().to_owned()),
            _ => break,
        }
    }
    drop(writer);
    eprintln!("the writer finished {} files", done.len());

    let sweep = r.t.json(["sweep"]).ok().json();
    let mut stopped: Vec<String> = sweep["stopped"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    stopped.sort();
    let mut ids: Vec<String> = wss.iter().map(|w| w.id.clone()).collect();
    ids.sort();
    // No daemon has started since the crash: sweep is what finds them.
    assert_eq!(stopped, ids, "sweep: {sweep}");
    for id in &ids {
        let st = r.status(id);
        assert_eq!(st["status"], "stopped", "{id} after sweep: {st}");
    }
    assert_eq!(r.fsd_pids(), Vec::<u32>::new(), "sweep started no daemon");

    for (n, ws) in wss.iter().enumerate() {
        let rec: Value = r.t.json(["recover", &ws.id]).ok().json();
        assert_eq!(rec["status"], "active", "{rec}");
        assert_eq!(
            std::fs::read_to_string(ws.path.join(format!("before-{n}.txt"))).unwrap(),
            format!("ws {n}\n")
        );
        assert_eq!(
            std::fs::read_to_string(ws.path.join("README.md")).unwrap(),
            format!("edited in {n}\n")
        );
        // The base shows through the new daemon's view again.
        assert_eq!(
            std::fs::read_to_string(ws.path.join("src/lib/a.rs")).unwrap(),
            "pub fn a() {}\n"
        );
    }
    for name in &done {
        let i: u64 = name.trim_start_matches('f').parse().expect("writer output");
        let p = wss[0].path.join("out").join(name);
        let got = std::fs::read_to_string(&p)
            .unwrap_or_else(|e| panic!("{name}, completed before the crash, is gone: {e}"));
        assert!(got == expected(i), "{name}: content differs after recover");
    }
    // The recovered workspace commits what it holds.
    let (snap, _, _) = r.commit(&wss[0].id, &[]);
    let last = done.last().expect("a finished file");
    let i: u64 = last.trim_start_matches('f').parse().expect("writer output");
    let show =
        r.t.json(["show", &snap, &format!("out/{last}")])
            .ok()
            .json();
    assert_eq!(show["entry"]["size"], expected(i).len() as u64, "{show}");

    for ws in &wss {
        r.discard(&ws.id);
    }
    r.t.json(["sweep"]).ok();
    r.assert_clean();
}
