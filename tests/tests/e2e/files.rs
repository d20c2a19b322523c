//! Files in and out of a workspace: `mountctl cp`, `mountctl fs`, `mountctl watch` and
//! the socket's `files_*` and `watch`, on real workspaces and sandboxes. A worker's
//! symlinks never redirect a host-side write, read or removal out of the workspace.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cowspace_tests::{mountctl_bin, write_file};
use serde_json::{Value, json};

use crate::sandbox::support as sbx;
use crate::workspaces::support::{WsRoot, require_root};

/// A bound against hangs, never a performance threshold.
const WAIT: Duration = Duration::from_secs(120);

fn setup(name: &str) -> (WsRoot, String) {
    sbx::helper();
    let r = WsRoot::new_in(&std::env::temp_dir());
    let src = r.t.path("src");
    write_file(&src.join("a.txt"), "a\n");
    write_file(&src.join("dir/inner.txt"), "inner\n");
    let snap = r.import(&src, &["--ref", "t/main"]);
    let ws = r.create(&snap, &["--name", name]);
    (r, ws.id)
}

fn mountctl(r: &WsRoot) -> Command {
    let mut c = Command::new(mountctl_bin());
    c.arg("--root").arg(r.root()).env_remove("COWSPACE_ROOT");
    c
}

/// `mountctl fs write WS:PATH` with `data` on stdin: its exit code and stderr.
fn fs_write(r: &WsRoot, target: &str, data: &[u8]) -> (i32, String) {
    let mut c = mountctl(r)
        .args(["fs", "write", target])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(data).unwrap();
    let out = c.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn finish(r: &WsRoot, ws: &str, sandbox: bool) {
    if sandbox {
        r.t.json(["sandbox", "stop", ws]).ok();
    }
    r.t.run(["remove", "--force", ws]).ok();
    r.assert_clean();
}

#[test]
fn files_a_workers_symlink_flips_never_redirect_a_host_write_read_or_removal() {
    require_root!();
    let (r, ws) = setup("race");
    let outside = r.t.path("outside");
    std::fs::create_dir_all(&outside).unwrap();
    write_file(&outside.join("canary"), "untouched\n");
    r.t.json(["sandbox", "start", &ws]).ok();
    // Inside: `dir` flips between a real directory and symlinks out, as fast as it can.
    let flipper = format!(
        "cd /workspace && while true; do rm -rf dir; ln -s /etc dir; rm -f dir; ln -s ../../../../{} dir; rm -f dir; mkdir dir; done",
        outside.display()
    );
    let mut flip = mountctl(&r)
        .args(["exec", &ws, "--", "sh", "-c", &flipper])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let etc_before: Vec<_> = std::fs::read_dir("/etc")
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .collect();
    let mut landed = 0;
    for i in 0..1000 {
        let (code, _) = fs_write(
            &r,
            &format!("{ws}:dir/canary"),
            format!("write {i}\n").as_bytes(),
        );
        if code == 0 {
            landed += 1;
        }
        // Reads and removals through the same path.
        let _ = mountctl(&r)
            .args(["fs", "cat", &format!("{ws}:dir/canary")])
            .output();
        let _ = mountctl(&r)
            .args(["fs", "rm", &format!("{ws}:dir/passwd")])
            .output();
    }
    // `cp` in and out through the flipping path.
    let host_src = r.t.path("cpsrc");
    write_file(&host_src.join("canary"), "from cp\n");
    for _ in 0..20 {
        let _ = mountctl(&r)
            .args([
                "cp",
                &host_src.join("canary").to_string_lossy(),
                &format!("{ws}:dir/canary"),
            ])
            .output();
        let dest = r.t.path("cpout");
        let _ = std::fs::remove_dir_all(&dest);
        let _ = mountctl(&r)
            .args(["cp", &format!("{ws}:dir"), &dest.to_string_lossy()])
            .output();
    }
    flip.kill().ok();
    flip.wait().ok();
    assert_eq!(
        std::fs::read_to_string(outside.join("canary")).unwrap(),
        "untouched\n"
    );
    assert_eq!(
        std::fs::read_dir(&outside).unwrap().count(),
        1,
        "something landed outside"
    );
    assert!(
        !Path::new("/etc/canary").exists(),
        "a write landed in the host's /etc"
    );
    let etc_after: Vec<_> = std::fs::read_dir("/etc")
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .collect();
    assert_eq!(etc_before.len(), etc_after.len(), "the host's /etc changed");
    assert!(
        std::fs::metadata("/etc/passwd").is_ok(),
        "a removal reached the host's /etc"
    );
    assert!(
        landed > 0,
        "no write landed at all while `dir` was a directory"
    );
    finish(&r, &ws, true);
}

#[test]
fn files_written_by_the_host_while_the_sandbox_runs_belong_to_its_root() {
    require_root!();
    let (r, ws) = setup("own");
    let st = r.t.json(["sandbox", "start", &ws]).ok().json();
    let base = st["host_uid_base"].as_u64().unwrap();
    assert_eq!(st["host_write_ids"]["uid"], base, "{st}");
    assert_eq!(st["host_write_ids"]["gid"], base, "{st}");
    assert_eq!(
        fs_write(&r, &format!("{ws}:new.txt"), b"from the host\n").0,
        0
    );
    assert_eq!(fs_write(&r, &format!("{ws}:a.txt"), b"overwritten\n").0, 0);
    r.t.run(["fs", "mkdir", "-p", &format!("{ws}:made/deeper")])
        .ok();
    r.t.run(["fs", "mv", &format!("{ws}:new.txt"), "made/moved.txt"])
        .ok();
    let script = "set -e; cd /workspace; ls -ln made/moved.txt a.txt; cat made/moved.txt a.txt; \
                  echo inside >> made/moved.txt; chmod 600 made/moved.txt; rm a.txt; \
                  touch made/deeper/x; ls -lnd made made/deeper";
    let out = r.t.run(["exec", &ws, "--", "sh", "-c", script]).ok();
    for line in out
        .stdout
        .lines()
        .filter(|l| l.starts_with('-') || l.starts_with('d'))
    {
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!((f[2], f[3]), ("0", "0"), "not root's inside: {line}");
    }
    assert!(
        out.stdout.contains("from the host") && out.stdout.contains("overwritten"),
        "{}",
        out.stdout
    );
    // On the host the files belong to the sandbox's root's host ids.
    let ws_path = r.root().join("workspaces");
    let _ = ws_path;
    let v =
        r.t.json(["fs", "stat", &format!("{ws}:made/moved.txt")])
            .ok()
            .json();
    assert_eq!(v["uid"], 0, "{v}");
    assert_eq!(v["mode"], 0o600, "{v}");
    let path = r.t.json(["status", &ws]).ok().json()["path"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        std::fs::metadata(Path::new(&path).join("made/moved.txt"))
            .unwrap()
            .uid() as u64,
        base
    );
    // diff sees them.
    let d = r.t.json(["diff", &ws]).ok().json();
    let paths: Vec<&str> = d["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["path"].as_str().unwrap())
        .collect();
    for p in ["a.txt", "made/moved.txt", "made/deeper/x"] {
        assert!(paths.contains(&p), "{p} not in {paths:?}");
    }
    finish(&r, &ws, true);
}

#[test]
fn files_cp_both_ways_keeps_names_modes_symlinks_and_bytes() {
    require_root!();
    let (r, ws) = setup("cp");
    let src = r.t.path("tree");
    write_file(&src.join("plain.txt"), "plain\n");
    write_file(&src.join("with space/ünïcødé ✓.txt"), "unicode\n");
    std::fs::create_dir_all(src.join("empty dir")).unwrap();
    write_file(&src.join("bin/run.sh"), "#!/bin/sh\necho run\n");
    std::fs::set_permissions(
        src.join("bin/run.sh"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::os::unix::fs::symlink("../plain.txt", src.join("bin/link")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", src.join("abs-link")).unwrap();
    std::fs::hard_link(src.join("plain.txt"), src.join("hard.txt")).unwrap();
    // A name that is not UTF-8, carried exactly.
    {
        use std::os::unix::ffi::OsStrExt;
        std::fs::write(
            src.join(std::ffi::OsStr::from_bytes(b"raw\xff.txt")),
            "bytes\n",
        )
        .unwrap();
    }
    // A 100 MiB file of varied bytes.
    let big: Vec<u8> = (0..100u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(src.join("big.bin"), &big).unwrap();
    r.t.run(["cp", &src.to_string_lossy(), &format!("{ws}:in")])
        .ok();
    let out = r.t.path("back");
    r.t.run(["cp", &format!("{ws}:in"), &out.to_string_lossy()])
        .ok();
    let diff = Command::new("diff")
        .args(["-r", "--no-dereference"])
        .arg(&src)
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        diff.status.success(),
        "{}",
        String::from_utf8_lossy(&diff.stdout)
    );
    for p in ["bin/run.sh", "plain.txt", "empty dir"] {
        let a = std::fs::symlink_metadata(src.join(p))
            .unwrap()
            .permissions()
            .mode();
        let b = std::fs::symlink_metadata(out.join(p))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(a, b, "{p}");
    }
    assert_eq!(
        std::fs::read_link(out.join("abs-link")).unwrap(),
        Path::new("/etc/passwd")
    );
    assert_eq!(std::fs::read(out.join("big.bin")).unwrap(), big);
    // A tar stream out and in again.
    let tar_out = mountctl(&r)
        .args(["cp", &format!("{ws}:in/bin"), "-"])
        .output()
        .unwrap();
    assert!(tar_out.status.success());
    let mut c = mountctl(&r)
        .args(["cp", "-", &format!("{ws}:.")])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(&tar_out.stdout).unwrap();
    assert!(c.wait().unwrap().success());
    let v =
        r.t.json(["fs", "stat", &format!("{ws}:bin/link")])
            .ok()
            .json();
    assert_eq!(v["kind"], "symlink");
    assert_eq!(v["target"], "../plain.txt");
    let v =
        r.t.json(["fs", "stat", &format!("{ws}:bin/run.sh")])
            .ok()
            .json();
    assert_eq!(v["mode"], 0o755);
    // A tar entry naming `..` is refused, nothing written outside.
    let mut evil = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(4);
    h.set_mode(0o644);
    h.as_gnu_mut().unwrap().name[..13].copy_from_slice(b"../escape.txt");
    h.set_cksum();
    evil.append(&h, &b"evil"[..]).unwrap();
    let evil = evil.into_inner().unwrap();
    let mut c = mountctl(&r)
        .args(["cp", "-", &format!("{ws}:in")])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(&evil).unwrap();
    let o = c.wait_with_output().unwrap();
    assert_eq!(
        o.status.code(),
        Some(9),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    finish(&r, &ws, false);
}

#[test]
fn files_bad_input_is_refused_with_its_kind_and_nothing_is_written() {
    require_root!();
    let (r, ws) = setup("bad");
    let code = |args: &[&str]| r.t.run(args).code;
    assert_eq!(code(&["fs", "cat", &format!("{ws}:../../etc/passwd")]), 9);
    assert_eq!(
        code(&["fs", "cat", &format!("{ws}:/etc/passwd")]),
        3,
        "an absolute path is inside the workspace"
    );
    assert_eq!(code(&["fs", "cat", "nosuchws:a.txt"]), 3);
    assert_eq!(
        fs_write(&r, &format!("{ws}:dir"), b"x").0,
        9,
        "over a directory"
    );
    assert_eq!(fs_write(&r, &format!("{ws}:missing/parent.txt"), b"x").0, 3);
    let big = vec![b'x'; (64 << 20) + 1];
    let (c, e) = fs_write(&r, &format!("{ws}:big"), &big);
    assert_eq!(c, 9, "{e}");
    assert_eq!(
        code(&["fs", "stat", &format!("{ws}:big")]),
        3,
        "nothing written"
    );
    // A fifo made inside is refused on read, without hanging.
    r.t.json(["sandbox", "start", &ws]).ok();
    r.t.run(["exec", &ws, "--", "mkfifo", "/workspace/fifo"])
        .ok();
    let t = Instant::now();
    assert_eq!(code(&["fs", "cat", &format!("{ws}:fifo")]), 9);
    assert!(t.elapsed() < WAIT);
    assert_eq!(fs_write(&r, &format!("{ws}:fifo"), b"x").0, 9);
    r.t.json(["sandbox", "stop", &ws]).ok();
    r.t.run(["remove", "--force", &ws]).ok();
    assert_eq!(
        code(&["fs", "ls", &format!("{ws}:.")]),
        3,
        "a removed workspace"
    );
    r.assert_clean();
}

/// The lines of `mountctl --json watch`, as they come.
fn watch_lines(child: &mut std::process::Child) -> std::sync::mpsc::Receiver<Value> {
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if let Ok(v) = serde_json::from_str::<Value>(&l)
                && tx.send(v).is_err()
            {
                return;
            }
        }
    });
    rx
}

/// Reads events until `done` holds for those seen.
fn watch_until(
    rx: &std::sync::mpsc::Receiver<Value>,
    mut done: impl FnMut(&[Value]) -> bool,
) -> Vec<Value> {
    let mut seen = Vec::new();
    let deadline = Instant::now() + WAIT;
    while !done(&seen) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(v) => seen.push(v),
            Err(_) => panic!(
                "watch: gave up waiting; saw {} events, the last: {:?}",
                seen.len(),
                seen.iter().rev().take(20).collect::<Vec<_>>()
            ),
        }
    }
    seen
}

#[test]
fn files_watch_reports_the_sandboxs_and_the_hosts_changes_and_ends_with_the_workspace() {
    require_root!();
    let (r, ws) = setup("watch");
    r.t.json(["sandbox", "start", &ws]).ok();
    let mut w = mountctl(&r)
        .args(["--json", "watch", &ws])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let rx = watch_lines(&mut w);
    std::thread::sleep(Duration::from_millis(500));
    // A build step inside: 10,000 files in new directories.
    r.t.run(["exec", &ws, "--", "sh", "-c", "cd /workspace && mkdir -p out/a out/b && for i in $(seq 5000); do : > out/a/f$i; : > out/b/g$i; done"]).ok();
    let seen = watch_until(&rx, |s| {
        let has = |p: &str| s.iter().any(|v| v["event"] == "created" && v["path"] == p);
        s.iter().any(|v| v["event"] == "rescan") || (has("out/a/f5000") && has("out/b/g5000"))
    });
    if !seen.iter().any(|v| v["event"] == "rescan") {
        let created = seen
            .iter()
            .filter(|v| v["event"] == "created" && v["path"].as_str().unwrap().starts_with("out/"))
            .count();
        assert!(created >= 10_002, "{created} created under out/");
    }
    // Then single changes, inside and from the host: each reported as what it is.
    r.t.run([
        "exec",
        &ws,
        "--",
        "sh",
        "-c",
        "cd /workspace && echo more >> a.txt && mv dir/inner.txt dir/renamed.txt && rm -r out/b",
    ])
    .ok();
    assert_eq!(fs_write(&r, &format!("{ws}:host.txt"), b"h").0, 0);
    watch_until(&rx, |s| {
        let has = |ev: &str, p: &str| s.iter().any(|v| v["event"] == ev && v["path"] == p);
        has("modified", "a.txt")
            && s.iter().any(|v| {
                v["event"] == "renamed"
                    && v["path"] == "dir/renamed.txt"
                    && v["from"] == "dir/inner.txt"
            })
            && has("removed", "out/b")
            && has("modified", "host.txt")
            && !s
                .iter()
                .any(|v| v["path"].as_str().unwrap_or("").contains(".cowspace-write"))
    });
    // A git checkout of another branch inside: every path it changes is reported.
    let git = "cd /workspace/repo && g() { git -c user.name=t -c user.email=t@t \"$@\"; } && \
               g checkout -q -b other && rm one.txt && echo changed > two.txt && echo new > three.txt && \
               g add -A && g commit -qm other && g checkout -q main";
    r.t.run(["exec", &ws, "--", "sh", "-c", "mkdir /workspace/repo && cd /workspace/repo && git init -q -b main && echo 1 > one.txt && echo 2 > two.txt && git -c user.name=t -c user.email=t@t add -A && git -c user.name=t -c user.email=t@t commit -qm one"]).ok();
    std::thread::sleep(Duration::from_millis(200));
    while rx.try_recv().is_ok() {}
    r.t.run(["exec", &ws, "--", "sh", "-c", git]).ok();
    watch_until(&rx, |s| {
        let touched = |p: &str| s.iter().any(|v| v["path"] == p || v["event"] == "rescan");
        // Back on main: one.txt and two.txt restored, three.txt gone.
        touched("repo/one.txt") && touched("repo/two.txt") && touched("repo/three.txt")
    });
    r.t.json(["sandbox", "stop", &ws]).ok();
    r.t.run(["remove", "--force", &ws]).ok();
    let t = Instant::now();
    loop {
        if let Some(s) = w.try_wait().unwrap() {
            assert!(s.success());
            break;
        }
        assert!(
            t.elapsed() < WAIT,
            "the watch did not end with the workspace"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    r.assert_clean();
}

#[test]
fn files_through_the_socket_write_read_list_and_watch() {
    require_root!();
    let (r, ws) = setup("sock");
    r.t.run(["daemon", "start"]).ok();
    let sock = r.root().join("run/fsd.sock");
    let ask = |req: Value| -> Value {
        let mut s = UnixStream::connect(&sock).unwrap();
        s.write_all(format!("{req}\n").as_bytes()).unwrap();
        let mut line = String::new();
        BufReader::new(&s).read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap()
    };
    let v = ask(
        json!({"op": "files_write", "args": {"workspace": ws, "path": "s.txt", "data": "aGVsbG8K", "mode": 0o640}}),
    );
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["result"]["mode"], 0o640);
    let v = ask(json!({"op": "files_read", "args": {"workspace": ws, "path": "s.txt"}}));
    assert_eq!(v["result"]["data"], "aGVsbG8K", "{v}");
    let v =
        ask(json!({"op": "files_list", "args": {"workspace": ws, "path": ".", "recursive": true}}));
    let names: Vec<&str> = v["result"]["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"dir/inner.txt") && names.contains(&"s.txt"),
        "{names:?}"
    );
    // A name that is not UTF-8, by its bytes.
    let v = ask(
        json!({"op": "files_write", "args": {"workspace": ws, "path_hex": "726177ff", "data": "eA=="}}),
    );
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["result"]["path_hex"], "726177ff", "{v}");
    let v = ask(json!({"op": "files_read", "args": {"workspace": ws, "path_hex": "726177ff"}}));
    assert_eq!(v["result"]["data"], "eA==", "{v}");
    let v = ask(json!({"op": "files_read", "args": {"workspace": ws, "path": "../x"}}));
    assert_eq!(v["error"]["kind"], "invalid_input", "{v}");
    let v =
        ask(json!({"op": "files_read", "args": {"workspace": ws, "path": "s.txt", "bogus": 1}}));
    assert_eq!(v["error"]["kind"], "invalid_input", "{v}");
    // A watch streams event lines.
    let s = UnixStream::connect(&sock).unwrap();
    (&s).write_all(format!("{}\n", json!({"op": "watch", "args": {"workspace": ws}})).as_bytes())
        .unwrap();
    let mut lines = BufReader::new(s.try_clone().unwrap()).lines();
    let first: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(first["event"], "watching", "{first}");
    let v =
        ask(json!({"op": "files_write", "args": {"workspace": ws, "path": "w.txt", "data": ""}}));
    assert_eq!(v["ok"], true);
    s.set_read_timeout(Some(WAIT)).unwrap();
    let mut got = false;
    for l in lines.by_ref() {
        let v: Value = serde_json::from_str(&l.unwrap()).unwrap();
        if v["path"] == "w.txt" {
            got = true;
            break;
        }
    }
    assert!(got);
    drop(s);
    finish(&r, &ws, false);
}
