//! A fuse workspace's request threads follow the CPUs of the processes that use it: onto
//! the one CPU a confined reader may use, and back to every CPU once an unconfined one
//! asks, for as long as that one counts as recent; and programs run from the workspace,
//! each a new requester from within its `execve`. Mounted for real (the threads are this process's, so this file holds one test).
//! Root with /dev/fuse; skipped otherwise, except under `CI=true`; skipped on a host
//! where this process may use one CPU only.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{Env, can_run};
use cowspace_fsd::cow::{CowMount, Serving};
use cowspace_store::SnapshotId;

/// The CPU lists of this process's request threads (`fuser-0`, `fuser-1`, ...).
fn request_thread_cpus() -> Vec<String> {
    let mut out = Vec::new();
    for t in fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        let comm = comm.trim();
        if !comm.starts_with("fuser-") || comm == "fuser-bg" {
            continue;
        }
        let status = fs::read_to_string(t.path().join("status")).unwrap_or_default();
        if let Some(l) = status.lines().find(|l| l.starts_with("Cpus_allowed_list:")) {
            out.push(l["Cpus_allowed_list:".len()..].trim().to_string());
        }
    }
    out
}

/// Asks the workspace about new names (each a `LOOKUP`), `stat` pinned with `taskset`
/// when `cpu` is given, from this process otherwise, until every request thread shows
/// `want`.
fn until_threads_on(ws: &Path, cpu: Option<&str>, want: &str, n: &mut usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let cpus = request_thread_cpus();
        if !cpus.is_empty() && cpus.iter().all(|c| c == want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "request threads on {cpus:?}, want all on {want}"
        );
        *n += 1;
        let name = ws.join(format!("absent-{n}"));
        match cpu {
            Some(cpu) => taskset_stat_absent(cpu, &name),
            None => assert!(fs::symlink_metadata(&name).is_err()),
        }
    }
}

/// `stat` of `path` pinned to `cpu` (the name is absent: each is a `LOOKUP`).
fn taskset_stat_absent(cpu: &str, path: &Path) {
    let out = Command::new("taskset")
        .args(["-c", cpu, "stat"])
        .arg(path)
        .output()
        .expect("run taskset (util-linux)");
    assert!(!out.status.success(), "{} exists", path.display());
}

/// Serves a workspace of `snap` at `env`'s `ws-NAME`.
fn serve(env: &Env, snap: SnapshotId, name: &str, follow_cpus: bool) -> (CowMount, PathBuf) {
    let ws = env.dir(&format!("ws-{name}"));
    let serving = Serving {
        follow_cpus,
        ..Serving::default()
    };
    let m = CowMount::mount(
        Arc::clone(&env.store),
        snap,
        &env.dir(&format!("private-{name}")),
        &ws,
        serving,
    )
    .unwrap();
    (m, ws)
}

#[test]
fn request_threads_follow_a_confined_reader_and_come_back() {
    if !can_run() {
        return;
    }
    let own = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).unwrap();
    let cpus = cowspace_fsd::placement::cpus_of(&own);
    if cpus.len() < 2 {
        eprintln!("skipped: this process may use one CPU only");
        return;
    }
    let all = cowspace_fsd::placement::cpu_list(&own);
    let env = Env::new("placement-");
    let src = env.dir("src");
    fs::write(src.join("a"), b"hello\n").unwrap();
    fs::copy("/bin/true", src.join("true")).unwrap();
    let snap = env.import(&src);
    let (m, ws) = serve(&env, snap, "follow", true);
    let mut n = 0;
    // Before any request, the threads may use every CPU.
    assert!(request_thread_cpus().iter().all(|c| *c == all));
    let last = cpus[cpus.len() - 1].to_string();
    until_threads_on(&ws, Some(&last), &last, &mut n);
    // This process is not confined: once it asks, the threads get every CPU back...
    assert_eq!(fs::read(ws.join("a")).unwrap(), b"hello\n");
    until_threads_on(&ws, None, &all, &mut n);
    // ...and keep them while it counts as a recent requester, whoever asks.
    for _ in 0..10 {
        until_threads_on(&ws, Some(&last), &all, &mut n);
        n += 1;
        taskset_stat_absent(&last, &ws.join(format!("absent-{n}")));
    }
    assert!(request_thread_cpus().iter().all(|c| *c == all));
    drop(m);

    // `any`: the threads stay where the scheduler puts them.
    let (m, ws) = serve(&env, snap, "any", false);
    for i in 0..20 {
        taskset_stat_absent(&last, &ws.join(format!("absent-{i}")));
    }
    let threads = request_thread_cpus();
    assert!(threads.iter().all(|c| *c == all), "{threads:?}");
    drop(m);

    let (m, ws) = serve(&env, snap, "exec", true);
    // Programs of the workspace run, confined or not, each a new requester whose first
    // requests come during its `execve`.
    for i in 0..6 {
        let mut cmd = if i % 2 == 0 {
            Command::new(ws.join("true"))
        } else {
            let mut c = Command::new("taskset");
            c.args(["-c", &last]).arg(ws.join("true"));
            c
        };
        let mut child = cmd.spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            assert!(
                Instant::now() < deadline,
                "a program of the workspace hangs"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success());
    }
    drop(m);
}
