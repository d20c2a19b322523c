//! Pause, resume and suspend of long-lived sandboxes end to end, as root:
//! `mountctl sandbox pause|resume|suspend` and `sandbox start --idle-timeout`.
//!
//! - a CPU-busy loop and a server (python3 -m http.server, published): the sandbox's
//!   CPU time (utime + stime of every process in its cgroups) stays the same while it is
//!   paused and grows again after resume; a request sent while paused is answered after
//!   resume; an exec while paused is refused (exit 5) naming `sandbox resume`; pause
//!   twice, resume of a running sandbox, suspend of a namespace sandbox are refused with
//!   their messages;
//! - `--idle-timeout 2s`: the keeper pauses the idle sandbox by itself, and the next
//!   exec, then a connection to the published port, resume it;
//! - a VM sandbox: a guest loop counting into a workspace file stops counting while the
//!   VM is paused (qemu `stop`) and goes on after resume; its suspend is refused naming
//!   qemu's version and the virtio-fs share.
//!
//! Skips with a reason when not root (or without a VM placement, for the VM test).
//! Waits are bounded against hangs, never timed: "flat while paused" compares the CPU
//! time before and after a sleep, and a frozen process uses none at all.
//!
//! Run: `cargo build --workspace --bins && cargo test -p cowspace-tests --test e2e pause::`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use cowspace_tests::{Out, write_file};
use serde_json::Value;

use crate::sandbox::support as sbx;
use crate::workspaces::support::{WsRoot, require_root};

/// Bound on a wait for something that must happen (against hangs, not a threshold).
const WAIT: Duration = Duration::from_secs(120);

fn setup() -> (WsRoot, String) {
    sbx::helper();
    let r = WsRoot::new();
    let src = r.t.path("src");
    write_file(&src.join("a.txt"), "hello\n");
    let snap = r.import(&src, &["--ref", "t/main"]);
    (r, snap)
}

fn exec(r: &WsRoot, ws: &str, cmd: &[&str]) -> Out {
    let mut args = vec!["exec", ws, "--"];
    args.extend_from_slice(cmd);
    r.t.run(&args)
}

#[track_caller]
fn wait_for(what: &str, mut pred: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !pred() {
        assert!(Instant::now() < deadline, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One HTTP GET on 127.0.0.1:`port`; `None` when nothing answers.
fn http_get(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(WAIT)).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).ok()?;
    let (head, body) = answer.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.0 200").then(|| body.to_string())
}

#[track_caller]
fn http_get_when_up(port: u16, path: &str) -> String {
    let mut got = None;
    wait_for(&format!("an answer on 127.0.0.1:{port}"), || {
        got = http_get(port, path);
        got.is_some()
    });
    got.unwrap()
}

fn cgroups(v: &Value) -> Vec<PathBuf> {
    v["cgroups"]
        .as_array()
        .unwrap_or_else(|| panic!("no cgroups: {v}"))
        .iter()
        .map(|p| PathBuf::from(p.as_str().unwrap()))
        .collect()
}

/// utime + stime (clock ticks) of every process in the sandbox's cgroups now.
fn cpu_ticks(cg: &[PathBuf]) -> u64 {
    let mut pids = std::collections::BTreeSet::new();
    for d in cg {
        if let Ok(s) = std::fs::read_to_string(d.join("cgroup.procs")) {
            pids.extend(s.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        }
    }
    pids.iter()
        .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/stat")).ok())
        .filter_map(|stat| {
            let rest = stat.rsplit_once(") ")?.1.to_string();
            let f: Vec<&str> = rest.split_whitespace().collect();
            // After the command: state is field 3, utime 14, stime 15 (1-based).
            Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
        })
        .sum()
}

fn status(r: &WsRoot, ws: &str) -> Value {
    r.t.json(["sandbox", "status", ws]).ok().json()
}

#[test]
fn pause_freezes_a_busy_loop_and_a_server_and_resume_brings_them_back() {
    require_root!();
    let (r, snap) = setup();
    r.create(&snap, &["--name", "pz1"]);
    let v =
        r.t.json(["sandbox", "start", "pz1", "--publish", "3000"])
            .ok()
            .json();
    let port = v["ports"]["3000"].as_u64().expect("port") as u16;
    let cg = cgroups(&v);
    let freezer = cg
        .iter()
        .find(|d| d.join("freezer.state").is_file())
        .unwrap_or_else(|| panic!("no freezer among the sandbox's cgroups: {v}"))
        .clone();
    exec(
        &r,
        "pz1",
        &[
            "sh",
            "-c",
            "nohup sh -c 'while :; do :; done' >/dev/null 2>&1 </dev/null & \
             nohup python3 -m http.server 3000 >/dev/null 2>&1 </dev/null &",
        ],
    )
    .ok();
    assert_eq!(http_get_when_up(port, "/a.txt"), "hello\n");
    let t0 = cpu_ticks(&cg);
    wait_for("the loop to use CPU", || cpu_ticks(&cg) > t0);

    let t = Instant::now();
    let p = r.t.json(["sandbox", "pause", "pz1"]).ok().json();
    eprintln!(
        "pause: {:?} end to end (mountctl), {} ms in the keeper",
        t.elapsed(),
        p["elapsed_ms"]
    );
    assert_eq!(p["paused"], true, "{p}");
    assert_eq!(
        std::fs::read_to_string(freezer.join("freezer.state"))
            .unwrap()
            .trim(),
        "FROZEN"
    );
    let st = status(&r, "pz1");
    assert_eq!(st["state"], "paused", "{st}");
    assert_eq!(st["paused_by"], "request", "{st}");
    assert!(st["paused_at"].as_u64().is_some(), "{st}");

    // CPU time flat while paused.
    let frozen = cpu_ticks(&cg);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(cpu_ticks(&cg), frozen, "a paused sandbox used CPU");

    // A request while paused: its connection is held, answered after resume.
    let pending = std::thread::spawn(move || http_get(port, "/a.txt"));
    std::thread::sleep(Duration::from_millis(300));
    assert!(!pending.is_finished(), "a paused server answered");

    // Exec while paused: refused at once, naming the way out.
    let out = exec(&r, "pz1", &["true"]);
    assert_eq!(out.code, 5, "{out:?}");
    assert!(out.stderr.contains("is paused"), "{}", out.stderr);
    assert!(
        out.stderr.contains("mountctl sandbox resume"),
        "{}",
        out.stderr
    );
    // Pause twice: refused, saying since when.
    let out = r.t.run(["sandbox", "pause", "pz1"]);
    assert_eq!(out.code, 9, "{out:?}");
    assert!(
        out.stderr.contains("paused already, since"),
        "{}",
        out.stderr
    );
    // Suspend of a namespace sandbox: refused, naming CRIU and the VM alternative.
    let out = r.t.run(["sandbox", "suspend", "pz1"]);
    assert_eq!(out.code, 7, "{out:?}");
    assert!(
        out.stderr.contains("criu") || out.stderr.contains("CRIU"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("--vm"), "{}", out.stderr);
    // Nothing of it thawed the sandbox.
    assert_eq!(
        cpu_ticks(&cg),
        frozen,
        "a refused request thawed the sandbox"
    );

    let t = Instant::now();
    let v = r.t.json(["sandbox", "resume", "pz1"]).ok().json();
    eprintln!(
        "resume: {:?} end to end (mountctl), {} ms in the keeper",
        t.elapsed(),
        v["elapsed_ms"]
    );
    assert_eq!(v["resumed"], true, "{v}");
    assert_eq!(
        pending.join().unwrap().as_deref(),
        Some("hello\n"),
        "the request held during the pause"
    );
    wait_for("the loop to use CPU again", || cpu_ticks(&cg) > frozen);
    assert_eq!(status(&r, "pz1")["state"], "running");
    assert_eq!(exec(&r, "pz1", &["echo", "back"]).ok().stdout, "back\n");
    // Resume of a running sandbox: refused.
    let out = r.t.run(["sandbox", "resume", "pz1"]);
    assert_eq!(out.code, 9, "{out:?}");
    assert!(out.stderr.contains("is not paused"), "{}", out.stderr);

    // A paused sandbox stops cleanly (thawed, then killed).
    r.t.json(["sandbox", "pause", "pz1"]).ok();
    let v = r.t.json(["sandbox", "stop", "pz1"]).ok().json();
    assert_eq!(v["stopped"], true, "{v}");
    for d in &cg {
        assert!(!d.exists(), "cgroup {} left behind", d.display());
    }
    r.discard("pz1");
    r.assert_clean();
}

#[test]
fn idle_timeout_pauses_and_an_exec_or_a_connection_resumes() {
    require_root!();
    let (r, snap) = setup();
    r.create(&snap, &["--name", "pz2"]);
    // Refused for a one-shot run, and when it is no duration.
    let out =
        r.t.run(["run", "pz2", "--idle-timeout", "2s", "--", "true"]);
    assert_eq!(out.code, 9, "{out:?}");
    let out =
        r.t.run(["sandbox", "start", "pz2", "--idle-timeout", "soon"]);
    assert_eq!(out.code, 9, "{out:?}");
    assert!(out.stderr.contains("--idle-timeout"), "{}", out.stderr);

    let v =
        r.t.json([
            "sandbox",
            "start",
            "pz2",
            "--publish",
            "3000",
            "--idle-timeout",
            "2s",
        ])
        .ok()
        .json();
    let port = v["ports"]["3000"].as_u64().expect("port") as u16;
    exec(
        &r,
        "pz2",
        &[
            "sh",
            "-c",
            "nohup python3 -m http.server 3000 >/dev/null 2>&1 </dev/null &",
        ],
    )
    .ok();
    assert_eq!(http_get_when_up(port, "/a.txt"), "hello\n");
    let idle_paused = || {
        let st = status(&r, "pz2");
        st["state"] == "paused" && st["paused_by"] == "idle"
    };
    assert_eq!(status(&r, "pz2")["idle_timeout_ms"], 2000);
    wait_for("the idle pause", idle_paused);
    // The next exec resumes it.
    assert_eq!(exec(&r, "pz2", &["echo", "hi"]).ok().stdout, "hi\n");
    wait_for("the idle pause again", idle_paused);
    // A connection to the published port resumes it too, and is answered.
    assert_eq!(http_get(port, "/a.txt").as_deref(), Some("hello\n"));
    // A request-pause is not undone by traffic.
    wait_for("the idle pause a third time", idle_paused);
    r.t.run(["sandbox", "resume", "pz2"]).ok();
    r.t.json(["sandbox", "pause", "pz2"]).ok();
    let pending = std::thread::spawn(move || http_get(port, "/a.txt"));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(status(&r, "pz2")["paused_by"], "request");
    assert!(
        !pending.is_finished(),
        "traffic resumed a sandbox paused by request"
    );
    r.t.json(["sandbox", "resume", "pz2"]).ok();
    assert_eq!(pending.join().unwrap().as_deref(), Some("hello\n"));

    r.t.json(["sandbox", "stop", "pz2"]).ok();
    r.discard("pz2");
    r.assert_clean();
}

#[test]
fn vm_pause_stops_a_guest_counter_and_resume_goes_on() {
    const WS: &str = "vmpz";
    crate::vm::require_vm!();
    let r = crate::vm::setup(WS);
    let v =
        r.t.json(["sandbox", "start", WS, "--vm", "--accept-emulation"])
            .ok()
            .json();
    assert_eq!(v["provider"], "vm", "{v}");
    let ws_path = PathBuf::from(r.status(WS)["path"].as_str().unwrap());
    exec(
        &r,
        WS,
        &[
            "sh",
            "-c",
            "(i=0; while :; do i=$((i+1)); echo $i > count.tmp; mv count.tmp count; done) \
             >/dev/null 2>&1 </dev/null &",
        ],
    )
    .ok();
    let count = || -> u64 {
        std::fs::read_to_string(ws_path.join("count"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    };
    wait_for("the guest to count", || count() > 2);
    let t = Instant::now();
    let p = r.t.json(["sandbox", "pause", WS]).ok().json();
    eprintln!(
        "vm pause: {:?} end to end, {} ms in the keeper",
        t.elapsed(),
        p["elapsed_ms"]
    );
    let at = count();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(count(), at, "a paused guest went on counting");
    assert_eq!(status(&r, WS)["state"], "paused");
    assert_eq!(exec(&r, WS, &["true"]).code, 5);
    let out = r.t.run(["sandbox", "suspend", WS]);
    assert_eq!(out.code, 7, "{out:?}");
    assert!(
        out.stderr.contains("QEMU emulator version"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("vhost-user-fs"), "{}", out.stderr);
    let t = Instant::now();
    let v2 = r.t.json(["sandbox", "resume", WS]).ok().json();
    eprintln!(
        "vm resume: {:?} end to end, {} ms in the keeper",
        t.elapsed(),
        v2["elapsed_ms"]
    );
    wait_for("the guest to count on", || count() > at);
    r.t.json(["sandbox", "stop", WS]).ok();
    r.discard(WS);
    r.assert_clean();
}
