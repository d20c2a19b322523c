//! Long-lived sandboxes end to end, as root: `mountctl sandbox start|stop|status|list`
//! and `mountctl exec`, with real namespaces, cgroups and mounts.
//!
//! - the lifecycle on every materializer (overlay on a view lower, on a checkout lower,
//!   fuse): a background process outlives the exec that started it; stop leaves no
//!   process, cgroup or mount and gives the host its own view (owners) back;
//! - the seed-000 chain (dependency install from a shared read-only cache, migration
//!   into a private database, an app in the background on port 3000, a check over
//!   loopback inside and from the host through the published port) in three
//!   workspaces at once;
//! - 8 execs at once in one sandbox, and 16 sandboxes at once;
//! - the host view while a sandbox runs: both directions, `diff` and `commit` exact, and
//!   a new name from the host refused cleanly on a shared overlay;
//! - `kill -9` of the keeper during an exec (then `sweep`), and of an exec client;
//! - bad input; a runtime root under a 0700 directory;
//! - the escape cases against exec'd processes (descriptors, /proc/1, capabilities,
//!   no_new_privs, seccomp, pid namespace, cgroup).
//!
//! Skips with a reason when not root; fails under `CI=true`. Each test's runtime root
//! ([`WsRoot`]) removes its workspaces with `--force` when dropped (which stops their
//! sandboxes), also when an assertion fails. Processes are only ever killed by pid, and
//! only ones the test started. Waits are bounded (a hang fails) but never timed.
//!
//! Needs on the host: `/usr/bin/python3` (seen inside through `/usr`), procps `ps`.
//!
//! Run: `cargo build --workspace --bins && cargo test -p cowspace-tests --test e2e longlived`.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cowspace_tests::{Out, assert_same_tree, mountctl_bin, write_file};
use serde_json::Value;

use crate::sandbox::support::{self as sbx, marker, processes_with};
use crate::workspaces::support::{Ws, WsRoot, alive, kill9, require_root};

/// Python inside the sandbox (the host's, visible through `/usr`).
const PY: &str = "/usr/bin/python3";

/// How long a wait for something that must happen may last before the test fails (a
/// bound against hangs, never a performance threshold).
const WAIT: Duration = Duration::from_secs(120);

/// The three materializers a long-lived sandbox works on, as `create` arguments.
const MATERIALIZERS: [&[&str]; 4] = [
    &["--lower", "view"],
    &["--lower", "checkout"],
    &["--materializer", "fuse"],
    &["--lower", "native"],
];

/// A runtime root with one snapshot (`t/main`: `a.txt`, `d/x`), and the source tree.
fn setup() -> (WsRoot, String) {
    setup_in(&std::env::temp_dir())
}

fn setup_in(parent: &Path) -> (WsRoot, String) {
    // mountctl finds the helper next to itself; make sure it is built.
    sbx::helper();
    let r = WsRoot::new_in(parent);
    let src = r.t.path("src");
    write_file(&src.join("a.txt"), "hello\n");
    write_file(&src.join("d/x"), "x\n");
    let snap = r.import(&src, &["--ref", "t/main"]);
    (r, snap)
}

/// A started sandbox, as `sandbox start --json` reported it.
#[derive(Debug, Clone)]
struct Sbx {
    v: Value,
    keeper: u32,
    init: u32,
    cgroups: Vec<PathBuf>,
}

impl Sbx {
    fn port(&self, internal: u16) -> u16 {
        self.v["ports"][internal.to_string()]
            .as_u64()
            .unwrap_or_else(|| panic!("no published port {internal}: {}", self.v)) as u16
    }
    fn shared(&self) -> bool {
        self.v["host_mount"] == "shared"
    }
    fn uid_base(&self) -> u32 {
        self.v["host_uid_base"].as_u64().expect("host_uid_base") as u32
    }
    /// Host pids of every process in the sandbox's cgroups now.
    fn pids(&self) -> BTreeSet<u32> {
        let mut out = BTreeSet::new();
        for d in &self.cgroups {
            if let Ok(s) = std::fs::read_to_string(d.join("cgroup.procs")) {
                out.extend(s.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
            }
        }
        out
    }
}

/// `sandbox start WS EXTRA... --json`, asserting success and the record's fields.
#[track_caller]
fn start(r: &WsRoot, ws: &str, extra: &[&str]) -> Sbx {
    let mut args = vec!["sandbox", "start", ws];
    args.extend_from_slice(extra);
    let v = r.t.json(&args).ok().json();
    assert_eq!(v["state"], "running", "{v}");
    assert_eq!(v["provider"], "namespaces", "{v}");
    assert_eq!(v["isolation"], "verified", "{v}");
    let pid = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("no {k}: {v}")) as u32;
    let cgroups: Vec<PathBuf> = v["cgroups"]
        .as_array()
        .unwrap_or_else(|| panic!("no cgroups: {v}"))
        .iter()
        .map(|p| PathBuf::from(p.as_str().expect("cgroup path")))
        .collect();
    assert!(!cgroups.is_empty(), "{v}");
    let s = Sbx {
        keeper: pid("keeper_pid"),
        init: pid("init_pid"),
        cgroups,
        v,
    };
    assert!(alive(s.keeper) && alive(s.init), "{}", s.v);
    for d in &s.cgroups {
        assert!(d.is_dir(), "cgroup {} missing: {}", d.display(), s.v);
    }
    s
}

/// `mountctl exec WS -- CMD...`.
fn exec(r: &WsRoot, ws: &str, cmd: &[&str]) -> Out {
    let mut args = vec!["exec", ws, "--"];
    args.extend_from_slice(cmd);
    r.t.run(&args)
}

/// `exec WS -- sh -c SCRIPT`, asserting exit 0; gives stdout.
#[track_caller]
fn exec_sh(r: &WsRoot, ws: &str, script: &str) -> String {
    exec(r, ws, &["sh", "-c", script]).ok().stdout
}

/// `mountctl exec WS -- CMD...` as a command not yet started (for background execs).
fn exec_cmd(r: &WsRoot, ws: &str, cmd: &[&str]) -> Command {
    let mut c = Command::new(mountctl_bin());
    c.arg("--root")
        .arg(r.root())
        .args(["exec", ws, "--"])
        .args(cmd)
        .env_remove("COWSPACE_ROOT")
        .env_remove("RUST_LOG")
        .env("HOME", r.t.scratch())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// `sandbox stop WS --json`, asserting success.
#[track_caller]
fn stop(r: &WsRoot, ws: &str) -> Value {
    let v = r.t.json(["sandbox", "stop", ws]).ok().json();
    assert_eq!(v["stopped"], true, "{v}");
    v
}

/// Polls `pred` until it holds; fails after [`WAIT`].
#[track_caller]
fn wait_for(what: &str, mut pred: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !pred() {
        assert!(Instant::now() < deadline, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for a child to exit (failing after [`WAIT`]) and gives its code and output.
#[track_caller]
fn finish(mut c: Child) -> (i32, String, String) {
    let deadline = Instant::now() + WAIT;
    loop {
        if c.try_wait().expect("try_wait").is_some() {
            let o = c.wait_with_output().expect("output");
            return (
                o.status.code().unwrap_or(-1),
                String::from_utf8_lossy(&o.stdout).into_owned(),
                String::from_utf8_lossy(&o.stderr).into_owned(),
            );
        }
        if Instant::now() > deadline {
            let _ = c.kill();
            let o = c.wait_with_output().expect("output");
            panic!(
                "a command did not finish; stderr: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A background `mountctl` (an exec client), killed and reaped when dropped.
struct Bg(Option<Child>);

impl Bg {
    #[track_caller]
    fn spawn(mut c: Command) -> Bg {
        Bg(Some(c.spawn().expect("spawn mountctl")))
    }
    fn pid(&self) -> u32 {
        self.0.as_ref().expect("running").id()
    }
    /// Waits for it to exit: code, stdout, stderr.
    #[track_caller]
    fn finish(mut self) -> (i32, String, String) {
        finish(self.0.take().expect("running"))
    }
}

impl Drop for Bg {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// After a sandbox ended: its keeper, init and every process that was in it (`pids`,
/// read from its cgroups before) are gone, and so are its cgroup directories.
#[track_caller]
fn assert_sandbox_gone(s: &Sbx, pids: &BTreeSet<u32>) {
    wait_for("the sandbox's processes to be gone", || {
        !alive(s.keeper) && !alive(s.init) && pids.iter().all(|p| !alive(*p))
    });
    for d in &s.cgroups {
        assert!(!d.exists(), "cgroup {} left behind", d.display());
    }
}

/// The mount points under the test's directory, as a sorted list (with repeats).
fn mount_list(r: &WsRoot) -> Vec<PathBuf> {
    let mut m = r.mounts();
    m.sort();
    m
}

/// The owners (uid, gid) of every entry under `dir`, the directory itself included.
fn owners(dir: &Path) -> BTreeSet<(u32, u32)> {
    let mut out = BTreeSet::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(p) = todo.pop() {
        let md = std::fs::symlink_metadata(&p).unwrap_or_else(|e| panic!("lstat {p:?}: {e}"));
        out.insert((md.uid(), md.gid()));
        if md.is_dir() {
            for e in std::fs::read_dir(&p).unwrap_or_else(|e| panic!("read_dir {p:?}: {e}")) {
                todo.push(e.expect("entry").path());
            }
        }
    }
    out
}

/// What the host sees as the owners of the workspace's files while `s` runs: shifted by
/// the sandbox's uid base through the shared overlay, the disk's owners otherwise.
fn owners_while_running(s: &Sbx) -> BTreeSet<(u32, u32)> {
    if s.shared() {
        BTreeSet::from([(s.uid_base(), s.uid_base())])
    } else {
        BTreeSet::from([(0, 0)])
    }
}

/// One HTTP GET of `path` on 127.0.0.1:`port`; `None` when nothing answers (yet).
fn http_get(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).ok()?;
    let (head, body) = answer.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.0 200")
        .then(|| body.to_string())
        .or_else(|| Some(format!("status: {head}")))
}

/// GETs `path` until the server behind `port` answers; gives the body.
#[track_caller]
fn http_get_when_up(port: u16, path: &str) -> String {
    let mut got = None;
    wait_for(&format!("an answer on 127.0.0.1:{port}"), || {
        got = http_get(port, path);
        got.is_some()
    });
    got.unwrap()
}

// ---------------------------------------------------------------------------------------
// 1. Lifecycle on every materializer
// ---------------------------------------------------------------------------------------

fn lifecycle(create: &[&str]) {
    let (r, snap) = setup();
    let mut args = vec!["--name", "w1"];
    args.extend_from_slice(create);
    let ws: Ws = r.create(&snap, &args);
    let mounts_before = mount_list(&r);
    assert_eq!(owners(&ws.path), BTreeSet::from([(0, 0)]));

    let s = start(&r, "w1", &[]);
    assert_eq!(s.v["workspace"], ws.id.as_str(), "{}", s.v);
    assert_eq!(s.v["path"], ws.path.to_str().unwrap(), "{}", s.v);
    let overlay = ws.json["materializer"] == "overlay";
    assert_eq!(s.shared(), overlay, "host_mount: {}", s.v);
    assert_eq!(owners(&ws.path), owners_while_running(&s));

    // stdout, stderr and the exit status pass through.
    let out = exec(
        &r,
        "w1",
        &[
            "sh",
            "-c",
            "cat a.txt; pwd; id -u; hostname; echo to-err >&2; exit 7",
        ],
    )
    .code(7);
    assert_eq!(out.stdout, "hello\n/workspace\n0\nw1\n", "{}", out.stderr);
    assert!(out.stderr.contains("to-err"), "{}", out.stderr);
    assert_eq!(exec(&r, "w1", &["true"]).ok().stdout, "");

    // A background process started by one exec runs on in the next ones.
    let m = marker();
    exec_sh(
        &r,
        "w1",
        &format!("sleep {m} >/dev/null 2>&1 </dev/null & echo $! > /tmp/bg"),
    );
    let host_bg = processes_with(&format!("sleep {m}"));
    assert_eq!(
        host_bg.len(),
        1,
        "the background sleep on the host: {host_bg:?}"
    );
    assert!(
        s.pids().contains(&host_bg[0]),
        "the sleep is not in the cgroup"
    );
    let later = exec_sh(
        &r,
        "w1",
        "kill -0 \"$(cat /tmp/bg)\" && echo alive; ps -e -o args= | grep -c '^sleep'",
    );
    assert_eq!(later, "alive\n1\n");
    let st = r.t.json(["sandbox", "status", "w1"]).ok().json();
    assert_eq!(st["state"], "running", "{st}");
    assert_eq!(st["init_pid"], s.v["init_pid"], "{st}");
    assert!(st["processes"].as_u64().unwrap_or(0) >= 2, "{st}");
    let list = r.t.json(["sandbox", "list"]).ok().json();
    let listed: Vec<&Value> = list["sandboxes"]
        .as_array()
        .expect("sandboxes")
        .iter()
        .collect();
    assert_eq!(listed.len(), 1, "{list}");
    assert_eq!(listed[0]["workspace"], ws.id.as_str(), "{list}");

    let pids = s.pids();
    assert!(pids.len() >= 2, "{pids:?}");
    stop(&r, "w1");
    assert_sandbox_gone(&s, &pids);
    assert!(!alive(host_bg[0]), "the background sleep survived the stop");
    assert_eq!(mount_list(&r), mounts_before, "mounts after stop");
    assert_eq!(
        owners(&ws.path),
        BTreeSet::from([(0, 0)]),
        "owners after stop"
    );
    assert_eq!(
        std::fs::read_to_string(ws.path.join("a.txt")).unwrap(),
        "hello\n"
    );
    assert_eq!(std::fs::read_to_string(ws.path.join("d/x")).unwrap(), "x\n");
    let list = r.t.json(["sandbox", "list"]).ok().json();
    assert_eq!(list["sandboxes"], serde_json::json!([]), "{list}");
    r.t.json(["sandbox", "status", "w1"]).error(3, "not_found");
    exec(&r, "w1", &["true"]).code(3);

    r.remove("w1");
    r.assert_clean();
}

#[test]
fn longlived_lifecycle_overlay_native() {
    require_root!();
    lifecycle(MATERIALIZERS[3]);
}

#[test]
fn longlived_lifecycle_overlay_view() {
    require_root!();
    lifecycle(MATERIALIZERS[0]);
}

#[test]
fn longlived_lifecycle_overlay_checkout() {
    require_root!();
    lifecycle(MATERIALIZERS[1]);
}

#[test]
fn longlived_lifecycle_fuse() {
    require_root!();
    lifecycle(MATERIALIZERS[2]);
}

// ---------------------------------------------------------------------------------------
// 2. The seed-000 chain in three workspaces at once
// ---------------------------------------------------------------------------------------

/// The "migration": a private SQLite database in the workspace, and the page the app
/// serves, read back from it.
const MIGRATE: &str = "import sqlite3, sys\n\
    db = sqlite3.connect('/workspace/app.db')\n\
    db.execute('create table who (name text)')\n\
    db.execute('insert into who values (?)', (sys.argv[1],))\n\
    db.commit()\n\
    (name,) = db.execute('select name from who').fetchone()\n\
    open('/workspace/whoami.txt', 'w').write(name)\n";

/// The check inside: GET the app over loopback until it answers.
const CHECK: &str = "import sys, time, urllib.request\n\
    for _ in range(1200):\n\
    \x20   try:\n\
    \x20       print(urllib.request.urlopen('http://127.0.0.1:3000/' + sys.argv[1]).read().decode(), end='')\n\
    \x20       break\n\
    \x20   except OSError:\n\
    \x20       time.sleep(0.1)\n\
    else:\n\
    \x20   sys.exit('the app never answered')\n";

fn seed_chain(r: &WsRoot, name: &str, cache: &Path) -> (Sbx, BTreeSet<u32>) {
    let bind = format!("{}:/deps", cache.display());
    let s = start(r, name, &["--publish", "3000", "--ro-bind", &bind]);
    // Dependency install from the shared read-only cache.
    exec_sh(
        r,
        name,
        "mkdir -p vendor && cp /deps/lib.txt vendor/lib.txt",
    );
    let out = exec(r, name, &["sh", "-c", "echo x > /deps/planted"]);
    assert_ne!(out.code, 0, "the cache is writable inside {name}");
    // Migration into the workspace's own database.
    exec(r, name, &[PY, "-c", MIGRATE, name]).ok();
    // The app, in the background, on the same internal port in every sandbox.
    exec_sh(
        r,
        name,
        "nohup python3 -m http.server 3000 >/dev/null 2>&1 </dev/null &",
    );
    // A second exec reaches it over loopback inside.
    let inside = exec(r, name, &[PY, "-c", CHECK, "whoami.txt"]).ok().stdout;
    assert_eq!(inside, name);
    let inside = exec(r, name, &[PY, "-c", CHECK, "vendor/lib.txt"])
        .ok()
        .stdout;
    assert_eq!(inside, "lib 1.2.3\n");
    // The host reaches the same app through the sandbox's own published port.
    let port = s.port(3000);
    assert_eq!(http_get_when_up(port, "/whoami.txt"), name);
    assert_eq!(http_get_when_up(port, "/vendor/lib.txt"), "lib 1.2.3\n");
    let pids = s.pids();
    (s, pids)
}

#[test]
fn longlived_seed_chain_in_three_workspaces_at_once() {
    require_root!();
    let (r, snap) = setup();
    let cache = r.t.path("cache");
    write_file(&cache.join("lib.txt"), "lib 1.2.3\n");
    let names = ["app0", "app1", "app2"];
    let wss: Vec<Ws> = names
        .iter()
        .map(|n| r.create(&snap, &["--name", n]))
        .collect();
    let mounts_before = mount_list(&r);
    let started: Vec<(Sbx, BTreeSet<u32>)> = std::thread::scope(|sc| {
        let hs: Vec<_> = names
            .iter()
            .map(|n| {
                let (r, cache) = (&r, &cache);
                sc.spawn(move || seed_chain(r, n, cache))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("a chain failed"))
            .collect()
    });
    // Three different host ports, each still giving its own workspace's page.
    let ports: BTreeSet<u16> = started.iter().map(|(s, _)| s.port(3000)).collect();
    assert_eq!(ports.len(), 3, "{ports:?}");
    for ((s, _), (n, ws)) in started.iter().zip(names.iter().zip(&wss)) {
        assert_eq!(http_get_when_up(s.port(3000), "/whoami.txt"), *n);
        // The host sees what the chain wrote.
        assert_eq!(
            std::fs::read_to_string(ws.path.join("whoami.txt")).unwrap(),
            *n
        );
        assert_eq!(
            std::fs::read_to_string(ws.path.join("vendor/lib.txt")).unwrap(),
            "lib 1.2.3\n"
        );
        assert!(ws.path.join("app.db").is_file());
    }
    assert!(!cache.join("planted").exists());
    let list = r.t.json(["sandbox", "list"]).ok().json();
    assert_eq!(
        list["sandboxes"].as_array().map(Vec::len),
        Some(3),
        "{list}"
    );

    for (n, (s, pids)) in names.iter().zip(&started) {
        stop(&r, n);
        assert_sandbox_gone(s, pids);
        let port = s.port(3000);
        assert!(
            TcpStream::connect(("127.0.0.1", port)).is_err(),
            "port {port} of {n} still accepts connections after stop"
        );
    }
    assert_eq!(mount_list(&r), mounts_before, "mounts after stop");
    for ws in &wss {
        assert_eq!(owners(&ws.path), BTreeSet::from([(0, 0)]));
        r.discard(&ws.id);
    }
    r.assert_clean();
}

// ---------------------------------------------------------------------------------------
// 3. Concurrency: 8 execs in one sandbox, 16 sandboxes
// ---------------------------------------------------------------------------------------

#[test]
fn longlived_eight_execs_at_once_in_one_sandbox() {
    require_root!();
    let (r, snap) = setup();
    let ws = r.create(&snap, &["--name", "busy"]);
    let s = start(&r, "busy", &[]);
    let children: Vec<Bg> = (0..8)
        .map(|k| {
            let script = format!(
                "mkdir -p out/e{k} && for j in $(seq 1 25); do echo {k}-$j > out/e{k}/f$j; done; \
                 echo done {k}"
            );
            Bg::spawn(exec_cmd(&r, "busy", &["sh", "-c", &script]))
        })
        .collect();
    for (k, c) in children.into_iter().enumerate() {
        let (code, out, err) = c.finish();
        assert_eq!(
            (code, out.as_str()),
            (0, format!("done {k}\n").as_str()),
            "{err}"
        );
    }
    for k in 0..8 {
        for j in 1..=25 {
            let p = ws.path.join(format!("out/e{k}/f{j}"));
            assert_eq!(
                std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p:?}: {e}")),
                format!("{k}-{j}\n")
            );
        }
    }
    let st = r.t.json(["sandbox", "status", "busy"]).ok().json();
    assert_eq!(st["execs_running"], 0, "{st}");
    let pids = s.pids();
    stop(&r, "busy");
    assert_sandbox_gone(&s, &pids);
    assert_eq!(std::fs::read_dir(ws.path.join("out")).unwrap().count(), 8);
    r.discard("busy");
    r.assert_clean();
}

#[test]
fn longlived_sixteen_sandboxes_at_once() {
    require_root!();
    let (r, snap) = setup();
    let names: Vec<String> = (0..16).map(|i| format!("s{i:02}")).collect();
    let wss: Vec<Ws> = names
        .iter()
        .map(|n| r.create(&snap, &["--name", n]))
        .collect();
    let mounts_before = mount_list(&r);
    let started: Vec<Sbx> = std::thread::scope(|sc| {
        let hs: Vec<_> = names
            .iter()
            .map(|n| {
                let r = &r;
                sc.spawn(move || start(r, n, &[]))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("a start failed"))
            .collect()
    });
    let bases: BTreeSet<u32> = started.iter().map(Sbx::uid_base).collect();
    let inits: BTreeSet<u32> = started.iter().map(|s| s.init).collect();
    assert_eq!(
        (bases.len(), inits.len()),
        (16, 16),
        "uid ranges or inits shared"
    );
    let list = r.t.json(["sandbox", "list"]).ok().json();
    assert_eq!(
        list["sandboxes"].as_array().map(Vec::len),
        Some(16),
        "{list}"
    );
    std::thread::scope(|sc| {
        for n in &names {
            let r = &r;
            sc.spawn(move || {
                let out = exec_sh(r, n, "hostname > me.txt; cat a.txt");
                assert_eq!(out, "hello\n");
            });
        }
    });
    for (n, ws) in names.iter().zip(&wss) {
        assert_eq!(
            std::fs::read_to_string(ws.path.join("me.txt")).unwrap(),
            format!("{n}\n")
        );
    }
    let pids: Vec<BTreeSet<u32>> = started.iter().map(Sbx::pids).collect();
    std::thread::scope(|sc| {
        for n in &names {
            let r = &r;
            sc.spawn(move || stop(r, n));
        }
    });
    for (s, p) in started.iter().zip(&pids) {
        assert_sandbox_gone(s, p);
    }
    let list = r.t.json(["sandbox", "list"]).ok().json();
    assert_eq!(list["sandboxes"], serde_json::json!([]), "{list}");
    assert_eq!(mount_list(&r), mounts_before, "mounts after stop");
    for ws in &wss {
        assert_eq!(owners(&ws.path), BTreeSet::from([(0, 0)]));
        r.discard(&ws.id);
    }
    r.assert_clean();
}

// ---------------------------------------------------------------------------------------
// 4. The host view while a sandbox runs
// ---------------------------------------------------------------------------------------

/// `diff WS --json` as (change, path) pairs.
fn diff_pairs(r: &WsRoot, ws: &str) -> BTreeSet<(String, String)> {
    let v = r.t.json(["diff", ws]).ok().json();
    v["changes"]
        .as_array()
        .unwrap_or_else(|| panic!("diff --json has no changes: {v}"))
        .iter()
        .map(|c| {
            (
                c["change"].as_str().expect("change").to_owned(),
                c["path"].as_str().expect("path").to_owned(),
            )
        })
        .collect()
}

fn pairs(p: &[(&str, &str)]) -> BTreeSet<(String, String)> {
    p.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

fn host_view(create: &[&str]) {
    let (r, snap) = setup();
    let mut args = vec!["--name", "hv"];
    args.extend_from_slice(create);
    let ws = r.create(&snap, &args);
    let s = start(&r, "hv", &[]);

    // Inside -> host, during the run.
    exec_sh(
        &r,
        "hv",
        "umask 022; echo inside > in.txt; mkdir sub; echo deep > sub/deep.txt",
    );
    assert_eq!(
        std::fs::read_to_string(ws.path.join("in.txt")).unwrap(),
        "inside\n"
    );
    assert_eq!(
        std::fs::read_to_string(ws.path.join("sub/deep.txt")).unwrap(),
        "deep\n"
    );
    // Host -> inside: an existing file modified on the host.
    std::fs::write(ws.path.join("a.txt"), "host edit\n").unwrap();
    assert_eq!(exec_sh(&r, "hv", "cat a.txt"), "host edit\n");
    // A file written inside, modified on the host, read inside again.
    std::fs::OpenOptions::new()
        .append(true)
        .open(ws.path.join("in.txt"))
        .unwrap()
        .write_all(b"and host\n")
        .unwrap();
    assert_eq!(exec_sh(&r, "hv", "cat in.txt"), "inside\nand host\n");

    // A new name from the host: refused cleanly through the shared overlay (the host's
    // uid 0 has no uid inside), nothing half-made; allowed on a mount the host kept.
    let new = ws.path.join("host-new.txt");
    match std::fs::write(&new, "from host\n") {
        Err(e) if s.shared() => {
            assert_eq!(e.raw_os_error(), Some(75), "expected EOVERFLOW, got {e}");
            assert!(!new.exists());
            exec(&r, "hv", &["test", "-e", "host-new.txt"]).code(1);
            let e = std::fs::create_dir(ws.path.join("host-dir")).unwrap_err();
            assert_eq!(
                e.raw_os_error(),
                Some(75),
                "mkdir: expected EOVERFLOW, got {e}"
            );
        }
        Ok(()) if !s.shared() => {
            assert_eq!(exec_sh(&r, "hv", "cat host-new.txt"), "from host\n");
            std::fs::remove_file(&new).unwrap();
        }
        other => panic!(
            "host create with host_mount {}: {other:?}",
            s.v["host_mount"]
        ),
    }

    // diff and commit during the run are exact.
    let want = pairs(&[
        ("modified", "a.txt"),
        ("added", "in.txt"),
        ("added", "sub"),
        ("added", "sub/deep.txt"),
    ]);
    assert_eq!(diff_pairs(&r, "hv"), want);
    let (committed, _, _) = r.commit("hv", &[]);
    let expected = r.t.path("expected");
    write_file(&expected.join("a.txt"), "host edit\n");
    write_file(&expected.join("d/x"), "x\n");
    write_file(&expected.join("in.txt"), "inside\nand host\n");
    write_file(&expected.join("sub/deep.txt"), "deep\n");
    for (p, mode) in [
        ("", 0o755),
        ("d", 0o755),
        ("sub", 0o755),
        ("a.txt", 0o644),
        ("d/x", 0o644),
        ("in.txt", 0o644),
        ("sub/deep.txt", 0o644),
    ] {
        std::fs::set_permissions(expected.join(p), std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let export = r.t.path("export");
    r.t.run([
        "export".as_ref(),
        committed.as_str().as_ref(),
        export.as_os_str(),
    ])
    .ok();
    assert_same_tree(&expected, &export);
    assert_same_tree(&ws.path, &export);
    // Still running, and still writable from both sides after the commit.
    exec_sh(&r, "hv", "echo after > in.txt");
    assert_eq!(
        std::fs::read_to_string(ws.path.join("in.txt")).unwrap(),
        "after\n"
    );

    let pids = s.pids();
    stop(&r, "hv");
    assert_sandbox_gone(&s, &pids);
    // After stop the host creates names again, with its own owners.
    std::fs::write(&new, "from host\n").unwrap();
    std::fs::create_dir(ws.path.join("host-dir")).unwrap();
    assert_eq!(owners(&ws.path), BTreeSet::from([(0, 0)]));
    assert_eq!(
        diff_pairs(&r, "hv"),
        pairs(&[
            ("modified", "a.txt"),
            ("added", "in.txt"),
            ("added", "sub"),
            ("added", "sub/deep.txt"),
            ("added", "host-new.txt"),
            ("added", "host-dir"),
        ])
    );
    r.discard("hv");
    r.assert_clean();
}

#[test]
fn longlived_host_view_overlay_native() {
    require_root!();
    host_view(MATERIALIZERS[3]);
}

#[test]
fn longlived_host_view_overlay_view() {
    require_root!();
    host_view(MATERIALIZERS[0]);
}

#[test]
fn longlived_host_view_overlay_checkout() {
    require_root!();
    host_view(MATERIALIZERS[1]);
}

#[test]
fn longlived_host_view_fuse() {
    require_root!();
    host_view(MATERIALIZERS[2]);
}

// ---------------------------------------------------------------------------------------
// 5. kill -9 of the keeper during an exec; kill -9 of an exec client
// ---------------------------------------------------------------------------------------

fn keeper_killed(create: &[&str]) {
    let (r, snap) = setup();
    let mut args = vec!["--name", "k9"];
    args.extend_from_slice(create);
    let ws = r.create(&snap, &args);
    let mounts_before = mount_list(&r);
    let s = start(&r, "k9", &[]);
    exec_sh(
        &r,
        "k9",
        "echo kept > kept.txt; mkdir -p deep/er; echo d > deep/er/f",
    );
    let m = marker();
    let long = Bg::spawn(exec_cmd(
        &r,
        "k9",
        &[
            "sh",
            "-c",
            &format!("echo during > during.txt; exec sleep {m}"),
        ],
    ));
    let marker_cmd = format!("sleep {m}");
    wait_for("the long exec to run", || {
        processes_with(&marker_cmd).len() == 1
    });
    let sleeper = processes_with(&marker_cmd)[0];
    let pids = s.pids();
    assert!(pids.contains(&sleeper), "{pids:?} lacks {sleeper}");

    kill9(s.keeper);
    let (code, _, err) = long.finish();
    assert_ne!(
        code, 0,
        "the exec succeeded though its sandbox was killed: {err}"
    );
    // Nothing of it keeps running (its cgroups are for sweep to free: the keeper that
    // would have removed them is dead).
    wait_for("the killed sandbox's processes to be gone", || {
        !alive(s.init) && pids.iter().all(|p| !alive(*p))
    });
    assert!(!alive(sleeper));

    let sw = r.t.json(["sweep"]).ok().json();
    let cleared: Vec<&str> = sw["sandboxes_cleared"]
        .as_array()
        .unwrap_or_else(|| panic!("{sw}"))
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(cleared, [ws.id.as_str()], "{sw}");
    // What the dead keeper would have freed: its cgroups, its per-run directory in the
    // helper's state, its overlay work directory beside the workspace's upper layer.
    assert_sandbox_gone(&s, &pids);
    let run_dirs = r.root().join("run/sandbox/run");
    let left: Vec<String> = std::fs::read_dir(&run_dirs)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(
        left,
        Vec::<String>::new(),
        "per-run dirs left in {run_dirs:?}"
    );
    let private = PathBuf::from(
        r.status(&ws.id)["private_dir"]
            .as_str()
            .expect("private_dir"),
    );
    let work: Vec<String> = cowspace_tests::dir_entries(&private)
        .into_iter()
        .filter(|n| n.starts_with(".sandbox-work"))
        .collect();
    assert_eq!(work, Vec::<String>::new(), "work dirs left in {private:?}");
    assert_eq!(mount_list(&r), mounts_before, "mounts after sweep");
    assert_eq!(
        owners(&ws.path),
        BTreeSet::from([(0, 0)]),
        "owners after sweep"
    );
    for (p, c) in [
        ("a.txt", "hello\n"),
        ("kept.txt", "kept\n"),
        ("during.txt", "during\n"),
        ("deep/er/f", "d\n"),
    ] {
        assert_eq!(
            std::fs::read_to_string(ws.path.join(p)).unwrap_or_else(|e| panic!("{p}: {e}")),
            c
        );
    }
    exec(&r, "k9", &["true"]).code(3);
    let sw = r.t.json(["sweep"]).ok().json();
    assert_eq!(sw["sandboxes_cleared"], serde_json::json!([]), "{sw}");

    // A new sandbox starts and sees the data.
    let s2 = start(&r, "k9", &[]);
    assert_eq!(
        exec_sh(&r, "k9", "cat kept.txt during.txt"),
        "kept\nduring\n"
    );
    let pids = s2.pids();
    stop(&r, "k9");
    assert_sandbox_gone(&s2, &pids);
    assert_eq!(mount_list(&r), mounts_before);
    r.discard("k9");
    r.assert_clean();
}

#[test]
fn longlived_keeper_kill9_during_exec_overlay_native() {
    require_root!();
    keeper_killed(MATERIALIZERS[3]);
}

#[test]
fn longlived_keeper_kill9_during_exec_overlay_view() {
    require_root!();
    keeper_killed(MATERIALIZERS[0]);
}

#[test]
fn longlived_keeper_kill9_during_exec_fuse() {
    require_root!();
    keeper_killed(MATERIALIZERS[2]);
}

#[test]
fn longlived_exec_client_kill9_kills_its_command_only() {
    require_root!();
    let (r, snap) = setup();
    r.create(&snap, &["--name", "cl"]);
    let s = start(&r, "cl", &[]);
    let bg = marker();
    exec_sh(
        &r,
        "cl",
        &format!("sleep {bg} >/dev/null 2>&1 </dev/null &"),
    );
    let m = marker();
    let client = Bg::spawn(exec_cmd(&r, "cl", &["sleep", &m]));
    let marker_cmd = format!("sleep {m}");
    wait_for("the exec'd sleep to run", || {
        processes_with(&marker_cmd).len() == 1
    });
    let sleeper = processes_with(&marker_cmd)[0];
    kill9(client.pid());
    let (code, _, _) = client.finish();
    assert_eq!(code, -1, "the client was not killed");
    wait_for("the command of the killed client to be killed", || {
        !alive(sleeper)
    });
    // The sandbox runs on, with its other processes.
    assert!(alive(s.keeper) && alive(s.init));
    assert_eq!(processes_with(&format!("sleep {bg}")).len(), 1);
    let st = r.t.json(["sandbox", "status", "cl"]).ok().json();
    assert_eq!(st["state"], "running", "{st}");
    wait_for("the killed exec to be forgotten", || {
        r.t.json(["sandbox", "status", "cl"]).ok().json()["execs_running"] == 0
    });
    assert_eq!(exec_sh(&r, "cl", "echo still"), "still\n");
    let pids = s.pids();
    stop(&r, "cl");
    assert_sandbox_gone(&s, &pids);
    r.remove("cl");
    r.assert_clean();
}

// ---------------------------------------------------------------------------------------
// 6. Bad input
// ---------------------------------------------------------------------------------------

#[test]
fn longlived_bad_input() {
    require_root!();
    let (r, snap) = setup();
    let ws = r.create(&snap, &["--name", "bad"]);
    let mounts_before = mount_list(&r);

    // exec with no sandbox: not found, and nothing ran on the host.
    let host_file = ws.path.join("ran-on-host");
    let script = format!("touch {} ran-here", host_file.display());
    let e =
        r.t.json(["exec", "bad", "--", "sh", "-c", &script])
            .error(3, "not_found");
    assert!(e["message"].as_str().unwrap().contains("no sandbox"), "{e}");
    exec(&r, "bad", &["sh", "-c", &script]).code(3);
    assert!(
        !host_file.exists(),
        "exec without a sandbox ran on the host"
    );
    assert!(!r.t.scratch().join("ran-here").exists());
    assert!(!Path::new("ran-here").exists());
    // Stopping no sandbox is no error: it says none was running.
    let v = r.t.json(["sandbox", "stop", "bad"]).ok().json();
    assert_eq!(v["was_running"], false, "{v}");

    // Refused limits: nothing starts, the workspace is as it was.
    // (`--publish 0` is a usage error, 2, as for `run`: the grammar takes 1..=65535;
    // CPU 999 is not on this host.)
    for (args, code, kind) in [
        (["--memory", "1"], 9, "invalid_input"),
        (["--publish", "0"], 2, "usage"),
        (["--cpuset-cpus", "999"], 9, "invalid_input"),
    ] {
        let mut all = vec!["sandbox", "start", "bad"];
        all.extend_from_slice(&args);
        r.t.json(&all).error(code, kind);
        exec(&r, "bad", &["true"]).code(3);
        assert_eq!(mount_list(&r), mounts_before, "mounts after {args:?}");
        assert_eq!(owners(&ws.path), BTreeSet::from([(0, 0)]));
    }

    let s = start(&r, "bad", &[]);
    // Start twice.
    r.t.json(["sandbox", "start", "bad"]).error(4, "exists");
    assert!(alive(s.keeper));
    // A command that does not exist; a file that is not executable.
    let out = exec(&r, "bad", &["no-such-command-here"]).code(127);
    assert!(
        out.stderr.contains("no-such-command-here"),
        "{}",
        out.stderr
    );
    exec(&r, "bad", &["/workspace/a.txt"]).code(126);
    exec(&r, "bad", &["./a.txt"]).code(126);
    // The sandbox is unharmed by all that.
    assert_eq!(exec_sh(&r, "bad", "cat a.txt"), "hello\n");

    let pids = s.pids();
    stop(&r, "bad");
    assert_sandbox_gone(&s, &pids);
    // Stop twice: the second has nothing to do, and says so (0).
    let v = r.t.json(["sandbox", "stop", "bad"]).ok().json();
    assert_eq!(
        (&v["stopped"], &v["was_running"]),
        (&false.into(), &false.into()),
        "{v}"
    );
    let out = r.t.run(["sandbox", "stop", "bad"]).ok();
    assert!(out.stdout.contains("no sandbox was running"), "{out:?}");
    assert_eq!(mount_list(&r), mounts_before);
    r.remove("bad");
    r.assert_clean();
}

// ---------------------------------------------------------------------------------------
// 7. A runtime root under a 0700 directory
// ---------------------------------------------------------------------------------------

/// A `mktemp -d` directory (mode 0700), removed on drop.
struct PrivateDir(PathBuf);

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn longlived_runtime_root_under_a_0700_directory() {
    require_root!();
    let out = Command::new("mktemp")
        .arg("-d")
        .output()
        .expect("mktemp -d");
    assert!(out.status.success());
    let dir = PrivateDir(PathBuf::from(String::from_utf8(out.stdout).unwrap().trim()));
    assert_eq!(
        std::fs::metadata(&dir.0).unwrap().permissions().mode() & 0o7777,
        0o700
    );
    {
        let (r, snap) = setup_in(&dir.0);
        for (i, create) in MATERIALIZERS.iter().enumerate() {
            let name = format!("p{i}");
            let mut args = vec!["--name", name.as_str()];
            args.extend_from_slice(create);
            let ws = r.create(&snap, &args);
            let s = start(&r, &name, &[]);
            assert_eq!(
                exec_sh(&r, &name, "cat a.txt; echo w > w.txt; id -u"),
                "hello\n0\n"
            );
            assert_eq!(
                std::fs::read_to_string(ws.path.join("w.txt")).unwrap(),
                "w\n"
            );
            let pids = s.pids();
            stop(&r, &name);
            assert_sandbox_gone(&s, &pids);
            r.discard(&name);
        }
        r.assert_clean();
    }
    // The parent was never opened up.
    assert_eq!(
        std::fs::metadata(&dir.0).unwrap().permissions().mode() & 0o7777,
        0o700
    );
}

// ---------------------------------------------------------------------------------------
// 8. The escape cases against exec'd processes
// ---------------------------------------------------------------------------------------

/// Every descriptor the process holds, and what it is.
const FDS: &str = "import os, stat\n\
    for n in sorted(os.listdir('/proc/self/fd'), key=int):\n\
    \x20   try:\n\
    \x20       st = os.stat('/proc/self/fd/' + n)\n\
    \x20       print('fd', n, 'dir' if stat.S_ISDIR(st.st_mode) else 'other', os.readlink('/proc/self/fd/' + n))\n\
    \x20   except OSError as e:\n\
    \x20       print('fd', n, 'gone', e.strerror)\n\
    print('cwd', os.readlink('/proc/self/cwd'), 'root', os.readlink('/proc/self/root'))\n";

/// What /proc/1 (the sandbox's init, a clone of the helper) gives an exec'd process.
const PROC1: &str = "import os\n\
    for l in ['exe', 'root', 'cwd']:\n\
    \x20   try: print(l, os.readlink('/proc/1/' + l))\n\
    \x20   except OSError as e: print(l, e.strerror)\n\
    for d in ['fd', 'map_files', 'root/', 'cwd/']:\n\
    \x20   try: os.listdir('/proc/1/' + d); print(d, 'listed')\n\
    \x20   except OSError as e: print(d, e.strerror)\n\
    for name, flags in [('rd', os.O_RDONLY), ('wr', os.O_WRONLY), ('path', os.O_PATH)]:\n\
    \x20   for l in ['exe', 'root', 'cwd']:\n\
    \x20       try: os.close(os.open('/proc/1/' + l, flags)); print(l, name, 'opened')\n\
    \x20       except OSError as e: print(l, name, e.strerror)\n";

/// `/proc/self/status` field `key`.
fn status_field<'a>(status: &'a str, key: &str) -> &'a str {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(':')))
        .unwrap_or_else(|| panic!("no {key} in {status}"))
        .trim()
}

#[test]
fn longlived_exec_escape_cases() {
    require_root!();
    let (r, snap) = setup();
    let ws = r.create(&snap, &["--name", "esc"]);
    let s = start(&r, "esc", &["--publish", "3000"]);
    let first_cgroup = exec(&r, "esc", &["cat", "/proc/self/cgroup"]).ok().stdout;
    let bg = marker();
    exec_sh(
        &r,
        "esc",
        &format!("sleep {bg} >/dev/null 2>&1 </dev/null &"),
    );

    // Descriptors: only 0, 1, 2, none a directory, even when the exec client holds host
    // directories without close-on-exec (CVE-2024-21626).
    write_file(&r.t.path("host-only.txt"), "host");
    let inner = exec_cmd(&r, "esc", &[PY, "-c", FDS]);
    let mut c = Command::new("/bin/sh");
    c.arg("-c")
        .arg("exec 7</ 8<\"$1\"; shift; exec \"$@\"")
        .arg("sh")
        .arg(r.t.scratch())
        .arg(inner.get_program())
        .args(inner.get_args())
        .env_remove("COWSPACE_ROOT")
        .env("HOME", r.t.scratch())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (code, stdout, stderr) = finish(c.spawn().expect("spawn exec"));
    assert_eq!(code, 0, "{stdout} {stderr}");
    let fds: Vec<Vec<&str>> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("fd "))
        .map(|l| l.splitn(3, ' ').collect())
        .collect();
    let open: Vec<&str> = fds
        .iter()
        .filter(|f| f[1] != "gone")
        .map(|f| f[0])
        .collect();
    assert_eq!(open, ["0", "1", "2"], "descriptors beyond stdio: {stdout}");
    assert!(
        fds.iter().filter(|f| f[1] == "gone").count() <= 1,
        "{stdout}"
    );
    assert!(
        !fds.iter().any(|f| f[1] == "dir"),
        "a directory fd: {stdout}"
    );
    assert!(stdout.contains("cwd /workspace root /\n"), "{stdout}");

    // /proc/1: neither its exe nor its root nor its cwd (CVE-2019-5736).
    let out = exec(&r, "esc", &[PY, "-c", PROC1]).ok();
    for case in [
        "exe",
        "root",
        "cwd",
        "fd",
        "map_files",
        "root/",
        "cwd/",
        "exe rd",
        "exe wr",
        "exe path",
        "root rd",
        "root path",
        "cwd rd",
        "cwd path",
    ] {
        assert!(
            out.stdout.contains(&format!("{case} Permission denied\n")),
            "{case}: {} {}",
            out.stdout,
            out.stderr
        );
    }
    assert!(!out.stdout.contains("opened"), "{}", out.stdout);

    // Capabilities, no_new_privs, seccomp.
    let status = exec(&r, "esc", &["cat", "/proc/self/status"]).ok().stdout;
    const CAP_NET_RAW: u32 = 13;
    const CAP_SYS_ADMIN: u32 = 21;
    for key in ["CapEff", "CapBnd", "CapPrm", "CapAmb", "CapInh"] {
        let caps = u64::from_str_radix(status_field(&status, key), 16).expect("hex caps");
        for (cap, name) in [
            (CAP_NET_RAW, "CAP_NET_RAW"),
            (CAP_SYS_ADMIN, "CAP_SYS_ADMIN"),
        ] {
            assert_eq!(caps & (1 << cap), 0, "{key} holds {name}: {status}");
        }
    }
    assert_eq!(status_field(&status, "NoNewPrivs"), "1", "{status}");
    assert_eq!(status_field(&status, "Seccomp"), "2", "{status}");

    // Only the sandbox's processes: its init, the background sleep, and ps itself.
    let ps = exec(&r, "esc", &["ps", "-e", "-o", "pid=,args="])
        .ok()
        .stdout;
    let procs: BTreeMap<u32, String> = ps
        .lines()
        .map(|l| {
            let (pid, args) = l.trim().split_once(' ').expect("pid args");
            (pid.parse().expect("pid"), args.trim().to_string())
        })
        .collect();
    assert_eq!(procs.len(), 3, "{ps}");
    assert!(procs[&1].contains("sandbox-helper"), "{ps}");
    assert!(procs.values().any(|a| a == &format!("sleep {bg}")), "{ps}");
    assert!(procs.values().any(|a| a.starts_with("ps ")), "{ps}");
    let host_bg = processes_with(&format!("sleep {bg}"));
    assert_eq!(host_bg.len(), 1);

    // The cgroups: every exec'd process is in the sandbox's, like the first exec.
    let later = exec(&r, "esc", &["cat", "/proc/self/cgroup"]).ok().stdout;
    assert_eq!(later, first_cgroup);
    let m = marker();
    let probe = Bg::spawn(exec_cmd(&r, "esc", &["sleep", &m]));
    let marker_cmd = format!("sleep {m}");
    wait_for("the exec'd sleep", || {
        processes_with(&marker_cmd).len() == 1
    });
    let host_pid = processes_with(&marker_cmd)[0];
    let in_cgroup = s.pids();
    assert!(
        in_cgroup.contains(&host_pid),
        "{in_cgroup:?} lacks {host_pid}"
    );
    assert!(in_cgroup.contains(&host_bg[0]), "{in_cgroup:?}");
    assert!(in_cgroup.contains(&s.init), "{in_cgroup:?}");
    let cg = |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    assert_eq!(cg(host_pid), cg(s.init));
    drop(probe);
    wait_for("the killed exec's command to go", || !alive(host_pid));

    let pids = s.pids();
    stop(&r, "esc");
    assert_sandbox_gone(&s, &pids);
    assert_eq!(owners(&ws.path), BTreeSet::from([(0, 0)]));
    r.remove("esc");
    r.assert_clean();
}

/// `exec -t` under a pseudo-terminal of 30 rows and 100 columns (made by Python's
/// `pty`), which becomes 40 by 120 once the command is ready; the command waits to see
/// the new size, then a Ctrl-C is typed. Bounded by its own deadline.
const TTY_DRIVER: &str = r#"
import os, pty, sys, fcntl, termios, struct, time, select
mountctl, root, ws = sys.argv[1], sys.argv[2], sys.argv[3]
script = ("tty; stty size; echo ready; "
          "until [ \"$(stty size)\" = '40 120' ]; do sleep 0.1; done; "
          "echo resized; sleep 60; echo not-interrupted")
pid, fd = pty.fork()
if pid == 0:
    fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    os.execv(mountctl, [mountctl, "--root", root, "exec", "-t", ws, "--", "sh", "-c", script])
out, resized, sent, deadline = b"", False, False, time.time() + 120
while time.time() < deadline:
    r, _, _ = select.select([fd], [], [], 0.2)
    if r:
        try:
            d = os.read(fd, 4096)
        except OSError:
            break
        if not d:
            break
        out += d
    if b"ready" in out and not resized:
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        resized = True
    if b"resized" in out and not sent:
        os.write(fd, b"\x03")
        sent = True
_, status = os.waitpid(pid, 0)
print(out.decode(errors="replace"))
print("exit", os.waitstatus_to_exitcode(status))
"#;

/// Runs [`TTY_DRIVER`] on sandbox `ws` of runtime root `root` and checks what it saw: a
/// terminal inside, of the outer size, resized while the command ran, and Ctrl-C
/// ending it with 130.
pub(crate) fn assert_exec_tty(root: &std::path::Path, ws: &str) {
    let o = Command::new(PY)
        .args(["-c", TTY_DRIVER])
        .arg(cowspace_tests::mountctl_bin())
        .arg(root)
        .arg(ws)
        .output()
        .expect("run python3");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("/dev/pts/"), "no terminal inside: {out}");
    assert!(
        out.contains("30 100"),
        "the window size did not pass: {out}"
    );
    assert!(out.contains("resized"), "the new size did not pass: {out}");
    assert!(
        !out.contains("not-interrupted"),
        "Ctrl-C did not reach it: {out}"
    );
    assert!(out.contains("exit 130"), "{out}");
}

#[test]
fn longlived_exec_tty_gives_a_sandbox_terminal_with_the_size_and_ctrl_c() {
    require_root!();
    let (r, snap) = setup();
    let ws = r.create(&snap, &["--name", "tty"]);
    // Started as a background job of a non-interactive shell is (SIGINT and SIGQUIT
    // ignored, and SIGHUP as by nohup): the sandbox's commands must not inherit that.
    let mut args = vec![std::ffi::OsString::from("-c")];
    args.push("trap '' INT QUIT HUP; exec \"$@\"".into());
    args.push("sh".into());
    args.push(cowspace_tests::mountctl_bin().into());
    args.extend(["--root".into(), r.root().as_os_str().to_owned()]);
    args.extend(["--json", "sandbox", "start", "tty"].map(std::ffi::OsString::from));
    let started = cowspace_tests::run_program(
        std::path::Path::new("/bin/sh"),
        &args,
        &[("HOME", r.t.scratch().as_os_str())],
    );
    assert_eq!(started.ok().json()["state"], "running");
    let ignored = exec_sh(&r, "tty", "grep SigIgn /proc/self/status");
    assert_eq!(ignored.trim(), "SigIgn:\t0000000000000000", "{ignored}");
    assert_exec_tty(r.root(), "tty");
    // Without -t no terminal is passed, even from one: stdin is /dev/null.
    let plain = exec(&r, "tty", &["sh", "-c", "tty || true"]).ok().stdout;
    assert!(plain.contains("not a tty"), "{plain}");
    stop(&r, "tty");
    r.remove(&ws.id);
}

/// `--cpuset-cpus 0`: every exec'd process may run on CPU 0 only, and cannot widen it
/// (`taskset` inside fails to leave the set); the limit is read back in the status.
#[test]
fn longlived_cpuset_confines_every_exec_and_cannot_be_widened() {
    require_root!();
    let (r, snap) = setup();
    let ws = r.create(&snap, &["--name", "cpus"]);
    let s = start(&r, "cpus", &["--cpuset-cpus", "0"]);
    assert_eq!(s.v["limits"]["cpuset_cpus"], "0", "{}", s.v);
    let allowed = exec_sh(&r, "cpus", "grep Cpus_allowed_list /proc/self/status");
    assert!(allowed.trim().ends_with("\t0"), "{allowed}");
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    if online.trim() != "0" {
        let widened = exec_sh(
            &r,
            "cpus",
            "python3 -c 'import os; os.sched_setaffinity(0, range(os.cpu_count())); print(sorted(os.sched_getaffinity(0)))' 2>&1 || true",
        );
        assert!(
            widened.contains("[0]") || widened.contains("Invalid argument"),
            "the set was widened: {widened}"
        );
    }
    stop(&r, "cpus");
    r.remove(&ws.id);
}

/// `kill -9` of the sandbox's init: the keeper frees the sandbox and exits; `exec` then
/// finds none (3); `sweep` clears the record and leaves the workspace active with its own
/// mount and owners, and a new sandbox starts and sees the data; without a sweep, the
/// next `start` clears the dead sandbox itself (docs/sandbox.md, "Crashes").
#[test]
fn longlived_init_kill9_is_cleaned_by_its_keeper_and_sweep() {
    require_root!();
    let (r, snap) = setup();
    let ws = r.create(&snap, &["--name", "initk"]);
    let s = start(&r, "initk", &[]);
    exec_sh(&r, "initk", "echo kept > kept.txt");
    let _ = Command::new("kill")
        .args(["-9", &s.init.to_string()])
        .status();
    wait_for("the keeper to end", || !alive(s.keeper));
    exec(&r, "initk", &["true"]).code(3);
    let v = r.t.json(["sweep"]).ok().json();
    assert!(
        v["sandboxes_cleared"]
            .as_array()
            .is_some_and(|a| a.iter().any(|w| w == ws.id.as_str())),
        "{v}"
    );
    assert_eq!(r.status("initk")["status"], "active");
    assert_eq!(owners(&ws.path), BTreeSet::from([(0, 0)]));
    for d in &s.cgroups {
        assert!(!d.exists(), "cgroup {} left", d.display());
    }
    start(&r, "initk", &[]);
    assert_eq!(exec_sh(&r, "initk", "cat kept.txt"), "kept\n");
    stop(&r, "initk");
    // Without a sweep: the next start clears the dead sandbox itself.
    let s = start(&r, "initk", &[]);
    let _ = Command::new("kill")
        .args(["-9", &s.init.to_string()])
        .status();
    wait_for("the keeper to end", || !alive(s.keeper));
    let s = start(&r, "initk", &[]);
    assert_eq!(exec_sh(&r, "initk", "cat kept.txt"), "kept\n");
    stop(&r, "initk");
    for d in &s.cgroups {
        assert!(!d.exists(), "cgroup {} left", d.display());
    }
    assert_eq!(r.status("initk")["status"], "active");
    r.discard(&ws.id);
}
