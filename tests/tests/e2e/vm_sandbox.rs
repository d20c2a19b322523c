//! Long-lived VM sandboxes end to end, as root: `mountctl sandbox start WS --vm`, then
//! `exec`, `sandbox status` and `sandbox stop` exactly as with a namespace sandbox, under
//! whatever accelerator the host has (TCG in CI, accepted with `--accept-emulation`).
//!
//! - one VM: refused without acceptance (exit 7, nothing started); the status says
//!   `provider: vm` and why isolation needs validation; qemu, crossed from the host
//!   while a second workspace exists, is an unprivileged uid without capabilities, with
//!   no_new_privs and seccomp, in a root of its own where neither that workspace, its
//!   own, the runtime root nor the store can be opened, every mount read-only but its
//!   run directory, and virtiofsd's server has only the workspace as its root; a fork
//!   bomb stops at `--pids` and a later exec forks again; a `--secret` is a read-only
//!   file of the guest's `/run/secrets`; a `--ro-bind` directory is read-only in the
//!   guest and copied from into the workspace (a source through a symlink refused);
//!   execs run in the guest with
//!   stdin, stdout, stderr and exit status (127, 128 + N), a forwarded signal, two execs
//!   that can only finish together, `exec -t` (the guest's own terminal, its size and a
//!   resize passed on, Ctrl-C reaching the command), a background process that outlives
//!   its exec; with
//!   `--net none` the guest has only `lo` and reaches nothing of the host; what it
//!   writes is the workspace's; stop leaves no process, cgroup or run directory;
//! - two VMs publishing the same guest port: two host ports, each reaching its own
//!   server started in the background by an exec and checked by a second one; memory
//!   exhaustion in one guest is contained (the guest OOM-kills, the VM goes on); the
//!   other's qemu and virtiofsd run on the CPUs of its `--cpuset-cpus`;
//! - `kill -9` of qemu, virtiofsd and the keeper (the first VM started through the
//!   control socket): `sweep` leaves nothing.
//!
//! Few VMs, because every boot under TCG costs seconds. Skips with a reason when not
//! root or when qemu, virtiofsd or the guest kernel are missing; fails instead under
//! `CI=true`. Each test's runtime root ([`WsRoot`]) removes its workspaces with
//! `--force` when dropped, which stops their sandboxes, also when an assertion fails;
//! [`Bg`] kills a background exec client. Waits are bounded (a hang fails), never timed.
//!
//! Run: `cargo build --workspace --bins && CI=true cargo test -p cowspace-tests --test e2e vm_sandbox`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cowspace_tests::{Out, mountctl_bin};
use serde_json::Value;

use crate::vm::{VM_WAIT, emulated, procs_with, require_vm, setup, vm_leftovers};
use crate::workspaces::support::{WsRoot, alive, kill9};

/// `mountctl exec WS [-i] -- CMD...` as a command not yet started.
fn exec_cmd(r: &WsRoot, ws: &str, stdin: bool, cmd: &[&str]) -> Command {
    let mut c = Command::new(mountctl_bin());
    c.arg("--root").arg(r.root()).args(["exec", ws]);
    if stdin {
        c.arg("-i");
    }
    c.arg("--")
        .args(cmd)
        .env_remove("COWSPACE_ROOT")
        .env_remove("RUST_LOG")
        .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// `mountctl exec WS -- CMD...`.
pub(crate) fn exec(r: &WsRoot, ws: &str, cmd: &[&str]) -> Out {
    let mut args = vec!["exec", ws, "--"];
    args.extend_from_slice(cmd);
    r.t.run(&args)
}

/// `exec WS -- sh -c SCRIPT`, asserting exit 0; gives stdout.
#[track_caller]
fn exec_sh(r: &WsRoot, ws: &str, script: &str) -> String {
    exec(r, ws, &["sh", "-c", script]).ok().stdout
}

/// A background `mountctl` (an exec client), killed and reaped when dropped.
struct Bg(Option<Child>);

impl Bg {
    fn spawn(mut c: Command) -> Bg {
        Bg(Some(c.spawn().expect("spawn mountctl")))
    }
    fn pid(&self) -> u32 {
        self.0.as_ref().expect("running").id()
    }
    /// Waits for it to exit (failing after [`VM_WAIT`]): code, stdout, stderr.
    #[track_caller]
    fn finish(mut self) -> (i32, String, String) {
        let mut c = self.0.take().expect("running");
        let deadline = Instant::now() + VM_WAIT;
        while c.try_wait().expect("try_wait").is_none() {
            if Instant::now() > deadline {
                let _ = c.kill();
                panic!("an exec did not finish within {VM_WAIT:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let o = c.wait_with_output().expect("output");
        (
            o.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
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

/// Polls `pred` until it holds; fails after [`VM_WAIT`].
#[track_caller]
fn wait_for(what: &str, mut pred: impl FnMut() -> bool) {
    let deadline = Instant::now() + VM_WAIT;
    while !pred() {
        assert!(Instant::now() < deadline, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `sandbox start WS --vm --accept-emulation EXTRA... --json`, asserting success and the
/// record's VM fields.
#[track_caller]
pub(crate) fn start_vm(r: &WsRoot, ws: &str, extra: &[&str]) -> Value {
    let mut args = vec!["sandbox", "start", ws, "--vm", "--accept-emulation"];
    args.extend_from_slice(extra);
    let v = r.t.json(&args).ok().json();
    check_record(&v);
    v
}

#[track_caller]
fn check_record(v: &Value) {
    assert_eq!(v["state"], "running", "{v}");
    assert_eq!(v["provider"], "vm", "{v}");
    if emulated() {
        assert_eq!(v["isolation"], "needs_validation", "{v}");
        assert_eq!(v["accel"], "tcg", "{v}");
        assert!(
            v["reason"].as_str().is_some_and(|s| s.contains("TCG")),
            "{v}"
        );
    } else {
        assert_eq!(v["isolation"], "verified", "{v}");
    }
    for k in ["keeper_pid", "init_pid", "qemu_pid", "virtiofsd_pid"] {
        let pid = v[k].as_u64().unwrap_or_else(|| panic!("no {k}: {v}")) as u32;
        assert!(alive(pid), "{k} {pid} is not running: {v}");
    }
    assert_eq!(v["init_pid"], v["qemu_pid"], "{v}");
    let qemu = v["qemu_pid"].as_u64().unwrap();
    let cmdline = std::fs::read(format!("/proc/{qemu}/cmdline")).unwrap_or_default();
    assert!(
        String::from_utf8_lossy(&cmdline).contains("microvm"),
        "init_pid is no qemu microvm: {v}"
    );
    assert!(v["started_at"].is_u64(), "{v}");
    assert!(v["limits"]["memory_bytes"].is_u64(), "{v}");
    for d in v["cgroups"].as_array().expect("cgroups") {
        assert!(
            std::path::Path::new(d.as_str().unwrap()).is_dir(),
            "cgroup {d} missing"
        );
    }
}

/// What sandbox `ws` of root `r` left (processes, run directory, cgroups), not those of
/// another VM of the same root.
fn leftovers_of(r: &WsRoot, ws: &str) -> Vec<String> {
    vm_leftovers(r, ws)
        .into_iter()
        .filter(|l| l.contains(&format!("/{ws}.")) || l.contains(&format!("/vm-{ws}.")))
        .collect()
}

/// After a VM sandbox ended: its keeper, qemu and virtiofsd are gone, and so are its
/// cgroups and run directory.
#[track_caller]
pub(crate) fn assert_vm_gone(r: &WsRoot, ws: &str, v: &Value) {
    let pids: Vec<u32> = ["keeper_pid", "qemu_pid", "virtiofsd_pid"]
        .iter()
        .map(|k| v[k].as_u64().unwrap() as u32)
        .collect();
    wait_for("the VM's processes to end", || {
        pids.iter().all(|p| !alive(*p))
    });
    assert_eq!(leftovers_of(r, ws), Vec::<String>::new());
    for d in v["cgroups"].as_array().expect("cgroups") {
        assert!(
            !std::path::Path::new(d.as_str().unwrap()).exists(),
            "cgroup {d} left behind"
        );
    }
    assert!(r.status(ws)["sandbox_pid"].is_null(), "{}", r.status(ws));
}

/// The fields of `/proc/PID/status` named `key` (the words after `key:`).
fn status_field(pid: u64, key: &str) -> Vec<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status: {status}"))
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// Process `pid` (`what`) is in none of the host's namespaces `kinds` (those of this
/// test), and pid 1 of its own pid namespace when `pid` is one of them.
#[track_caller]
fn in_namespaces_of_its_own(pid: u64, what: &str, kinds: &[&str]) {
    for ns in kinds {
        assert_ne!(
            std::fs::read_link(format!("/proc/{pid}/ns/{ns}")).unwrap(),
            std::fs::read_link(format!("/proc/self/ns/{ns}")).unwrap(),
            "{what} is in the host's {ns} namespace"
        );
    }
    if kinds.contains(&"pid") {
        assert_eq!(
            status_field(pid, "NSpid").last().map(String::as_str),
            Some("1"),
            "{what}'s NSpid"
        );
    }
}

/// Opening `path` (a host path) through process `pid`'s root fails with ENOENT: the
/// path is not in its view of the file system.
#[track_caller]
fn not_in_root_of(pid: u64, path: &std::path::Path, what: &str) {
    let through = format!("/proc/{pid}/root{}", path.display());
    let err = std::fs::File::open(&through).expect_err(&format!("{what} is visible to {pid}"));
    assert_eq!(
        err.raw_os_error(),
        Some(libc::ENOENT),
        "{what} at {through}: {err}"
    );
}

/// Every path below `dir`, not crossing into `skip` (big read-only system trees).
fn walk(dir: &std::path::Path, skip: &[std::path::PathBuf], out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        out.push(p.clone());
        let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
        if is_dir && !skip.contains(&p) {
            walk(&p, skip, out);
        }
    }
}

/// While VM `v` runs, beside the other workspace `other` of the same root: qemu is an
/// unprivileged uid without capabilities, with no_new_privs and its seccomp filter, in
/// a root of its own holding nothing of the runtime root, the store or another
/// workspace; virtiofsd's server sees only the workspace it serves.
#[track_caller]
fn assert_qemu_confined(r: &WsRoot, ws: &str, v: &Value, other: &crate::workspaces::support::Ws) {
    let qemu = v["qemu_pid"].as_u64().unwrap();
    for key in ["Uid", "Gid"] {
        let ids = status_field(qemu, key);
        assert_eq!(ids.len(), 4, "{key}: {ids:?}");
        assert!(
            ids.iter().all(|i| i != "0" && *i == ids[0]),
            "qemu's {key} is {ids:?}"
        );
    }
    assert_eq!(status_field(qemu, "Groups"), Vec::<String>::new());
    for key in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(
            status_field(qemu, key),
            vec!["0000000000000000"],
            "qemu's {key}"
        );
    }
    assert_eq!(status_field(qemu, "NoNewPrivs"), vec!["1"]);
    assert_eq!(
        status_field(qemu, "Seccomp"),
        vec!["2"],
        "qemu's -sandbox is off"
    );
    // pid 1 of a pid namespace of its own: no other process to name or signal.
    in_namespaces_of_its_own(qemu, "qemu", &["mnt", "ipc", "uts", "net", "pid"]);
    // Try to cross: the other workspace's file, the runtime root, the store, the
    // registry, this VM's own workspace, through qemu's root.
    let other_file = other.path.join("other-secret");
    assert_eq!(std::fs::read_to_string(&other_file).unwrap(), "not yours\n");
    let ws_dir = std::path::PathBuf::from(v["path"].as_str().unwrap());
    for (path, what) in [
        (other_file.clone(), "the other workspace's file"),
        (other.path.clone(), "the other workspace"),
        (r.root().to_path_buf(), "the runtime root"),
        (r.root().join("store"), "the store"),
        (r.root().join("registry.db"), "the registry"),
        (
            ws_dir.join("a.txt"),
            "the workspace (qemu reaches it only through virtiofsd)",
        ),
        (std::path::PathBuf::from("/etc/passwd"), "/etc"),
        (
            std::path::PathBuf::from("/proc/1/root"),
            "the host's processes",
        ),
    ] {
        assert!(
            std::fs::symlink_metadata(&path).is_ok(),
            "{} is not there on the host",
            path.display()
        );
        not_in_root_of(qemu, &path, what);
    }
    // Its whole tree (the system directories aside): nothing under the runtime root's
    // or a workspace's name, only the run directory writable.
    let root = std::path::PathBuf::from(format!("/proc/{qemu}/root"));
    let mut seen = Vec::new();
    walk(&root, &[root.join("usr")], &mut seen);
    let names: Vec<String> = seen
        .iter()
        .map(|p| format!("/{}", p.strip_prefix(&root).unwrap().display()))
        .collect();
    let top: std::collections::BTreeSet<&str> = names
        .iter()
        .filter(|n| n.matches('/').count() == 1)
        .map(String::as_str)
        .collect();
    for t in &top {
        assert!(
            [
                "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/dev", "/vm",
                "/run"
            ]
            .contains(t),
            "{t} in qemu's root: {names:?}"
        );
    }
    for n in &names {
        assert!(
            !n.contains("other-secret")
                && !n.contains("registry.db")
                && !n.contains("cowspace-e2e"),
            "{n} in qemu's root"
        );
    }
    assert!(
        names.contains(&"/run/vm/agent.sock".to_string()),
        "{names:?}"
    );
    let mounts = std::fs::read_to_string(format!("/proc/{qemu}/mountinfo")).unwrap();
    for l in mounts.lines() {
        let f: Vec<&str> = l.split(' ').collect();
        assert!(
            f[4] == "/run/vm" || f[5].starts_with("ro"),
            "a writable mount for qemu: {l}"
        );
    }
    // The run directory: qemu's alone.
    let run_dir = format!(
        "{}/{}.{}",
        r.root().join("run/sandbox/vm").display(),
        ws,
        v["keeper_pid"]
    );
    let meta = std::fs::metadata(&run_dir).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
        0o700,
        "the run directory is open to others"
    );
    assert_eq!(
        std::os::unix::fs::MetadataExt::uid(&meta).to_string(),
        status_field(qemu, "Uid")[0]
    );
    // virtiofsd: the process serving the guest (the child of the one started, in pid
    // and mount namespaces of its own) has the workspace as its root.
    let fsd = v["virtiofsd_pid"].as_u64().unwrap();
    let children =
        std::fs::read_to_string(format!("/proc/{fsd}/task/{fsd}/children")).unwrap_or_default();
    let server: u64 = children
        .split_whitespace()
        .next()
        .unwrap_or_else(|| panic!("virtiofsd {fsd} has no server process"))
        .parse()
        .unwrap();
    assert!(
        std::path::Path::new(&format!("/proc/{server}/root/a.txt")).exists(),
        "virtiofsd's server does not have the workspace as its root"
    );
    for (path, what) in [
        (other_file, "the other workspace's file"),
        (other.path.clone(), "the other workspace"),
        (r.root().to_path_buf(), "the runtime root"),
        (r.root().join("store"), "the store"),
        (std::path::PathBuf::from("/etc/passwd"), "/etc"),
    ] {
        not_in_root_of(server, &path, what);
    }
    assert_ne!(
        std::fs::read_link(format!("/proc/{server}/ns/pid")).unwrap(),
        std::fs::read_link("/proc/self/ns/pid").unwrap(),
        "virtiofsd's server is in the host's pid namespace"
    );
    // virtiofsd's first process (it only waits for the server; the server's pivot_root
    // moved its root too, as they share a mount namespace): pid 1 of a pid namespace
    // of its own, and both see one mount, the workspace, as their root.
    in_namespaces_of_its_own(fsd, "virtiofsd", &["mnt", "pid"]);
    for (path, what) in [
        (
            other.path.join("other-secret"),
            "the other workspace's file",
        ),
        (other.path.clone(), "the other workspace"),
        (r.root().to_path_buf(), "the runtime root"),
        (r.root().join("store"), "the store"),
        (r.root().join("registry.db"), "the registry"),
        (std::path::PathBuf::from("/etc/passwd"), "/etc"),
    ] {
        not_in_root_of(fsd, &path, what);
    }
    for pid in [fsd, server] {
        let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
        let points: Vec<&str> = mounts
            .lines()
            .map(|l| l.split(' ').nth(4).unwrap_or(""))
            .collect();
        assert_eq!(points, vec!["/"], "virtiofsd {pid}'s mounts: {mounts}");
        assert!(
            std::path::Path::new(&format!("/proc/{pid}/root/a.txt")).exists(),
            "virtiofsd {pid}'s root is not the workspace"
        );
    }
}

/// Connects to 127.0.0.1:`port` until something answers with a line (qemu accepts on a
/// forwarded port before the guest's server listens, then closes); gives the answer.
#[track_caller]
fn reply_on(port: u16) -> String {
    let mut got = String::new();
    wait_for(&format!("an answer on 127.0.0.1:{port}"), || {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
        let _ = s.write_all(b"ping\n");
        got.clear();
        let _ = s.read_to_string(&mut got);
        !got.is_empty()
    });
    got
}

#[test]
fn vm_sandbox_runs_execs_as_a_namespace_sandbox_does() {
    const WS: &str = "vmkeep";
    const PIDS: u64 = 24;
    require_vm!();
    let r = setup(WS);
    if emulated() {
        let o = r.t.json(["sandbox", "start", WS, "--vm"]);
        let e = o.error(7, "unsupported");
        assert!(
            e["message"]
                .as_str()
                .unwrap()
                .contains("--accept-emulation"),
            "{e}"
        );
        assert_eq!(leftovers_of(&r, WS), Vec::<String>::new());
        assert!(r.status(WS)["sandbox_pid"].is_null());
    }
    // A secret larger than one frame, with every byte value.
    let secret: Vec<u8> = cowspace_tests::noise(7, 100_000);
    let secret_file = r.t.path("api-token");
    std::fs::write(&secret_file, &secret).unwrap();
    let secret_flag = format!("api-token={}", secret_file.display());
    // A read-only shared cache (and a link to it, which is refused as a source).
    let cache = r.t.path("cache");
    cowspace_tests::write_file(&cache.join("pkg/index.js"), "module.exports = 42;\n");
    let link = r.t.path("cache-link");
    std::os::unix::fs::symlink(&cache, &link).unwrap();
    let refused = r.t.json([
        "sandbox",
        "start",
        WS,
        "--vm",
        "--accept-emulation",
        "--ro-bind",
        &format!("{}:/deps", link.display()),
    ]);
    let e = refused.error(9, "invalid_input");
    assert!(e["message"].as_str().unwrap().contains("symlink"), "{e}");
    assert_eq!(leftovers_of(&r, WS), Vec::<String>::new());
    let bind_flag = format!("{}:/deps/cache", cache.display());
    // A second workspace of the same root, with a file of its own: no process of the
    // VM may reach it.
    let other = r.create("t/main", &["--name", "vmkeep-other"]);
    cowspace_tests::write_file(
        &other.path.join("other-secret"),
        "not yours
",
    );
    let v = start_vm(
        &r,
        WS,
        &[
            "--net",
            "none",
            "--env",
            "COWSPACE_T=it's",
            "--secret",
            &secret_flag,
            "--ro-bind",
            &bind_flag,
            "--pids",
            &PIDS.to_string(),
        ],
    );
    assert_eq!(v["limits"]["pids"], PIDS, "{v}");
    assert_eq!(v["ports"], serde_json::json!({}), "{v}");
    assert_eq!(v["limits"]["memory_bytes"], 256u64 << 20, "{v}");
    r.t.json(["sandbox", "start", WS, "--vm", "--accept-emulation"])
        .error(4, "exists");
    assert_qemu_confined(&r, WS, &v, &other);

    // --pids in the guest: a fork bomb (a shell starting sleeps until it cannot) is
    // stopped at the limit; once its processes end, a later exec forks again.
    let bomb = exec(
        &r,
        WS,
        &[
            "sh",
            "-c",
            "i=0; while [ $i -lt 500 ]; do sleep 3 & i=$((i+1)); done; echo escaped",
        ],
    );
    assert_eq!(bomb.code, 2, "{bomb:?}");
    assert!(bomb.stderr.contains("can't fork"), "{bomb:?}");
    assert!(!bomb.stdout.contains("escaped"), "{bomb:?}");
    let cg = "/sys/fs/cgroup/sandbox";
    let after = exec_sh(
        &r,
        WS,
        &format!(
            "read max < {cg}/pids.max; read now < {cg}/pids.current; \
             while read k n; do [ $k = max ] && hit=$n; done < {cg}/pids.events; \
             echo \"$max $now $hit\"; \
             until read c < {cg}/pids.current && [ $c -le 1 ]; do :; done; \
             echo \"$(echo forked)\""
        ),
    );
    let (line, forked) = after.split_once('\n').unwrap();
    let f: Vec<u64> = line.split(' ').map(|x| x.parse().unwrap()).collect();
    assert_eq!(f[0], PIDS, "{after}");
    assert!(f[1] <= PIDS, "more processes than --pids: {after}");
    assert!(f[2] > 0, "no fork was refused at the limit: {after}");
    assert_eq!(forked, "forked\n");
    let st = r.t.json(["sandbox", "status", WS]).ok().json();
    check_record(&st);
    assert_eq!(st["init_pid"], v["init_pid"], "{st}");
    assert_eq!(st["execs_running"], 0, "{st}");

    // In the guest: its kernel, not the host's.
    let release = exec(&r, WS, &["uname", "-r"]).ok().stdout;
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert_ne!(release.trim(), host.trim());
    assert_eq!(release.trim(), st["guest_kernel"], "{st}");

    // The secret is a read-only file of /run/secrets, in no status.
    let o = exec_cmd(&r, WS, false, &["cat", "/run/secrets/api-token"])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.stdout == secret, "the secret came back changed");
    assert_eq!(
        exec_sh(
            &r,
            WS,
            "stat -c %a /run/secrets/api-token; touch /run/secrets/new 2>/dev/null || echo read-only"
        ),
        "400\nread-only\n"
    );

    // The bind: readable, not writable, copied into the workspace ("an install"); its
    // source is attached only in its virtiofsd's own mount namespace, never the host's.
    assert_eq!(
        exec_sh(
            &r,
            WS,
            "cat /deps/cache/pkg/index.js; touch /deps/cache/x 2>/dev/null || echo read-only; \
             mkdir -p node_modules && cp -r /deps/cache/pkg node_modules/"
        ),
        "module.exports = 42;\nread-only\n"
    );
    let ws_dir = std::path::PathBuf::from(v["path"].as_str().unwrap());
    assert_eq!(
        std::fs::read_to_string(ws_dir.join("node_modules/pkg/index.js")).unwrap(),
        "module.exports = 42;\n"
    );
    assert!(!cache.join("x").exists());
    let state = r.root().join("run/sandbox").display().to_string();
    let host_mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !host_mounts.contains(&state),
        "a mount of the VM's run directory on the host: {host_mounts}"
    );
    exec_sh(&r, WS, "rm -r node_modules");

    // stdin, stdout, stderr and the exit status, byte for byte.
    let mut c = exec_cmd(
        &r,
        WS,
        true,
        &[
            "sh",
            "-c",
            "cat; echo \"env=$COWSPACE_T pwd=$(pwd)\"; printf 'e\\000rr' >&2; exit 7",
        ],
    );
    let mut child = c.spawn().unwrap();
    let input: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    {
        let mut w = child.stdin.take().unwrap();
        let input = input.clone();
        std::thread::spawn(move || {
            let _ = w.write_all(&input);
        });
    }
    let o = child.wait_with_output().unwrap();
    assert_eq!(
        o.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let tail = b"env=it's pwd=/workspace\n";
    assert_eq!(o.stdout.len(), input.len() + tail.len());
    assert_eq!(
        &o.stdout[..input.len()],
        &input[..],
        "stdin came back changed"
    );
    assert_eq!(&o.stdout[input.len()..], tail);
    assert_eq!(o.stderr, b"e\0rr");
    let missing = exec(&r, WS, &["no-such-command"]);
    assert_eq!(missing.code, 127, "{missing:?}");
    assert!(missing.stderr.contains("not found"), "{missing:?}");
    assert_eq!(exec(&r, WS, &["sh", "-c", "kill -9 $$"]).code, 137);

    // A signal to the exec client reaches the command.
    let sig = Bg::spawn(exec_cmd(
        &r,
        WS,
        false,
        &["sh", "-c", "touch sig.ready; exec sleep 1000"],
    ));
    let ws_path = std::path::PathBuf::from(v["path"].as_str().unwrap());
    wait_for("the signalled exec to start", || {
        ws_path.join("sig.ready").exists()
    });
    // `touch` ran; `exec sleep` follows at once, and a TERM before it is the same 143.
    let _ = Command::new("kill")
        .args(["-TERM", &sig.pid().to_string()])
        .status();
    assert_eq!(sig.finish().0, 143);

    // Two execs at once: each waits for the other's file, so neither ends alone.
    let a = Bg::spawn(exec_cmd(
        &r,
        WS,
        false,
        &[
            "sh",
            "-c",
            "touch a.up; until [ -e b.up ]; do sleep 0.05; done; echo A",
        ],
    ));
    let b = Bg::spawn(exec_cmd(
        &r,
        WS,
        false,
        &[
            "sh",
            "-c",
            "touch b.up; until [ -e a.up ]; do sleep 0.05; done; echo B",
        ],
    ));
    assert_eq!(a.finish(), (0, "A\n".into(), String::new()));
    assert_eq!(b.finish(), (0, "B\n".into(), String::new()));

    // `exec -t`: a terminal of the guest's own, of the outer terminal's size, resized
    // while the command runs; Ctrl-C typed at the outer terminal interrupts it.
    crate::longlived::assert_exec_tty(r.t.root(), WS);

    // A background process outlives the exec that started it.
    exec_sh(&r, WS, "sleep 1000 >/dev/null 2>&1 & echo $! > /tmp/bg.pid");
    assert_eq!(
        exec_sh(&r, WS, "kill -0 $(cat /tmp/bg.pid) && echo alive"),
        "alive\n"
    );

    // --net none: only `lo`, nothing of the host reachable.
    let host = TcpListener::bind("127.0.0.1:0").unwrap();
    host.set_nonblocking(true).unwrap();
    let port = host.local_addr().unwrap().port();
    assert_eq!(exec_sh(&r, WS, "ls /sys/class/net"), "lo\n");
    let probe = exec(
        &r,
        WS,
        &[
            "sh",
            "-c",
            &format!(
                "for h in 10.0.2.2 127.0.0.1; do echo x | nc -w 2 $h {port} && echo REACHED $h; done; true"
            ),
        ],
    )
    .ok();
    assert!(!probe.stdout.contains("REACHED"), "{probe:?}");
    assert!(host.accept().is_err(), "the guest reached a host listener");

    // What the guest writes is the workspace's.
    exec_sh(
        &r,
        WS,
        "rm -f a.up b.up sig.ready; echo more >> a.txt; printf 'n\\000' > new.bin",
    );
    assert_eq!(
        std::fs::read(ws_path.join("new.bin")).unwrap(),
        b"n\0",
        "the host does not see the guest's write"
    );
    assert_eq!(r.t.run(["diff", WS]).ok().stdout, "M a.txt\nA new.bin\n");

    let stopped = r.t.json(["sandbox", "stop", WS]).ok().json();
    assert_eq!(stopped["stopped"], true, "{stopped}");
    assert_vm_gone(&r, WS, &v);
    r.t.json(["exec", WS, "--", "true"]).code(3);
    r.discard(WS);
    r.discard("vmkeep-other");
    r.assert_clean();
}

#[test]
fn vm_sandboxes_publish_one_guest_port_on_two_host_ports_and_contain_memory() {
    const A: &str = "vmpuba";
    const B: &str = "vmpubb";
    require_vm!();
    let r = setup(A);
    r.create("t/main", &["--name", B]);
    // Both boot at once.
    let start = |ws: &str, extra: &[&str]| {
        let mut c = Command::new(mountctl_bin());
        c.arg("--root")
            .arg(r.root())
            .args([
                "--json",
                "sandbox",
                "start",
                ws,
                "--vm",
                "--accept-emulation",
            ])
            .args(["--publish", "3000"])
            .args(extra)
            .env_remove("COWSPACE_ROOT")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c.spawn().expect("sandbox start")
    };
    let (ca, cb) = (
        start(A, &["--memory", "256m"]),
        start(B, &["--cpuset-cpus", "0"]),
    );
    let parse = |c: Child| {
        let o = c.wait_with_output().unwrap();
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        check_record(&v);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        (v, err)
    };
    let ((va, ea), (vb, _)) = (parse(ca), parse(cb));
    let port = |v: &Value| v["ports"]["3000"].as_u64().unwrap_or_else(|| panic!("{v}")) as u16;
    let (pa, pb) = (port(&va), port(&vb));
    assert_ne!(pa, pb, "two sandboxes were given one host port");
    assert!(
        ea.contains(&format!("published 3000 -> 127.0.0.1:{pa}")),
        "{ea}"
    );
    assert_eq!(va["net"], "published", "{va}");
    // B's qemu and virtiofsd run on host CPU 0 only (the cgroup's cpuset).
    assert_eq!(vb["limits"]["cpuset_cpus"], "0", "{vb}");
    for k in ["qemu_pid", "virtiofsd_pid"] {
        let st = std::fs::read_to_string(format!("/proc/{}/status", vb[k])).unwrap();
        let allowed = st
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .map(str::trim);
        assert_eq!(allowed, Some("0"), "{k}: {st}");
    }
    for (ws, p) in [(A, pa), (B, pb)] {
        // Started in the background by one exec, checked by a second one inside, then
        // reached from the host through the published port.
        exec_sh(
            &r,
            ws,
            &format!(
                "(while true; do echo 'reply from {ws}' | nc -l -p 3000; done) >/dev/null 2>&1 &"
            ),
        );
        let mut inside = String::new();
        wait_for("the guest's server to answer inside", || {
            inside = exec_sh(&r, ws, "echo ping | nc -w 5 127.0.0.1 3000; true");
            !inside.is_empty()
        });
        assert_eq!(inside, format!("reply from {ws}\n"));
        assert_eq!(reply_on(p), format!("reply from {ws}\n"));
    }
    // A publishing guest reaches nothing of the host (qemu's `restrict=on`).
    let host = TcpListener::bind("127.0.0.1:0").unwrap();
    host.set_nonblocking(true).unwrap();
    let hp = host.local_addr().unwrap().port();
    let probe = exec_sh(
        &r,
        A,
        &format!("echo x | nc -w 2 10.0.2.2 {hp} && echo REACHED; true"),
    );
    assert!(!probe.contains("REACHED"), "{probe}");
    assert!(host.accept().is_err(), "the guest reached a host listener");

    // The guest of A runs out of memory: its kernel kills the hog, the VM goes on.
    let hog = exec(&r, A, &["sh", "-c", "tail /dev/zero"]);
    assert_eq!(hog.code, 137, "{hog:?}");
    let log = exec_sh(&r, A, "dmesg");
    assert!(log.contains("Out of memory: Killed process"), "{log}");
    assert_eq!(exec_sh(&r, A, "echo still here"), "still here\n");
    let st = r.t.json(["sandbox", "status", A]).ok().json();
    check_record(&st);
    assert_eq!(st["oom_kills"], 0, "the host cgroup OOM-killed: {st}");
    assert_eq!(reply_on(pa), format!("reply from {A}\n"));
    assert_eq!(reply_on(pb), format!("reply from {B}\n"));
    for (ws, v) in [(A, &va), (B, &vb)] {
        r.t.json(["sandbox", "stop", ws]).ok();
        assert_vm_gone(&r, ws, v);
    }
    // The ports are free again.
    for p in [pa, pb] {
        TcpListener::bind(("127.0.0.1", p)).expect("a published port outlived its VM");
    }
    r.discard(A);
    r.discard(B);
    r.assert_clean();
}

#[test]
fn vm_sandbox_kill9_of_qemu_virtiofsd_or_keeper_then_sweep_leaves_nothing() {
    const WS: &str = "vmk9";
    require_vm!();
    let r = setup(WS);
    for victim in ["qemu_pid", "virtiofsd_pid", "keeper_pid"] {
        // The first through the control socket, as a runtime in another language would.
        let v = if victim == "qemu_pid" {
            r.t.run(["daemon", "start"]).ok();
            let v = r.socket(
                "sandbox_start",
                serde_json::json!({"workspace": WS, "vm": true, "accept_emulation": true}),
            );
            assert_eq!(v["provider"], "vm", "{v}");
            let st = r.t.json(["sandbox", "status", WS]).ok().json();
            check_record(&st);
            assert_eq!(st["qemu_pid"], v["qemu_pid"], "{st}");
            v
        } else {
            start_vm(&r, WS, &[])
        };
        assert_eq!(exec_sh(&r, WS, "echo up"), "up\n");
        let pid = v[victim].as_u64().unwrap() as u32;
        kill9(pid);
        wait_for(&format!("{victim} {pid} to die"), || !alive(pid));
        let keeper = v["keeper_pid"].as_u64().unwrap() as u32;
        wait_for("the keeper to end with its VM", || !alive(keeper));
        r.t.run(["sweep"]).ok();
        assert_vm_gone(&r, WS, &v);
        let state = r.root().join("run/sandbox");
        assert_eq!(
            procs_with(&state.display().to_string()),
            Vec::<(u32, String)>::new(),
            "after kill -9 of {victim}"
        );
    }
    r.discard(WS);
    r.assert_clean();
}
