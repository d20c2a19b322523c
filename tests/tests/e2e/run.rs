//! `mountctl run` end to end, as root: a command in a workspace's sandbox writes into the
//! workspace (seen by `diff` and `commit`), on both overlay lowers (a checkout and the
//! daemon's FUSE view); its exit status passes through; the host root, the runtime
//! root and the store are invisible inside; published ports are in `status --json`
//! while the run lasts and cleared after it; two workspaces both serving port 3000
//! answer on two host ports with their own identity; `remove` of a workspace with a
//! running sandbox is busy (5) and `remove --force` kills the sandbox; a control the
//! host cannot enforce is refused (7) and the command does not run.
//!
//! Skips with a reason when not root; fails under `CI=true`. Each test's runtime root
//! ([`WsRoot`]) removes its workspaces with `--force`, stops the daemon and detaches
//! leftover mounts when dropped, also when an assertion fails.
//!
//! Run: `cargo build -p mountctl -p sandbox-helper && cargo test -p cowspace-tests --test e2e run::`.

use std::io::Read;
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cowspace_tests::{mountctl_bin, write_file};
use serde_json::Value;

use crate::sandbox::support as sandbox_support;
use crate::workspaces::support::{Ws, WsRoot, require_root};

/// A runtime root with one snapshot (`t/main`: `a.txt`, `d/x`).
fn setup() -> (WsRoot, String) {
    // mountctl finds the helper next to itself; build it (or take $COWSPACE_SANDBOX_HELPER).
    sandbox_support::helper();
    let r = WsRoot::new();
    let src = r.t.path("src");
    write_file(&src.join("a.txt"), "hello\n");
    write_file(&src.join("d/x"), "x\n");
    let snap = r.import(&src, &["--ref", "t/main"]);
    (r, snap)
}

/// `mountctl --root ROOT run ARGS...` as a command (not started).
fn run_cmd(r: &WsRoot, args: &[&str]) -> Command {
    let mut c = Command::new(mountctl_bin());
    c.arg("--root")
        .arg(r.root())
        .arg("run")
        .args(args)
        .env("COWSPACE_SANDBOX_HELPER", sandbox_support::helper())
        .env_remove("COWSPACE_ROOT");
    c
}

fn output(mut c: Command) -> (i32, String, String) {
    let o = c.output().expect("start mountctl run");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// A `mountctl run` in the background, SIGKILLed and reaped when dropped.
struct Bg(Option<Child>);

impl Bg {
    fn spawn(mut c: Command) -> Bg {
        c.stdout(Stdio::null()).stderr(Stdio::piped());
        Bg(Some(c.spawn().expect("start mountctl run")))
    }
    fn pid(&self) -> i32 {
        self.0.as_ref().map(|c| c.id() as i32).unwrap_or(0)
    }
    fn signal(&self, sig: &str) {
        let _ = Command::new("kill")
            .args([sig, &self.pid().to_string()])
            .status();
    }
    /// Waits up to `secs` for the exit status.
    fn wait(&mut self, secs: u64) -> Option<i32> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        let child = self.0.as_mut()?;
        while Instant::now() < deadline {
            if let Some(st) = child.try_wait().expect("wait") {
                self.0 = None;
                return Some(st.code().unwrap_or(-1));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Bg {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            // SIGTERM first: mountctl forwards it and clears the registry; then SIGKILL.
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if matches!(c.try_wait(), Ok(Some(_))) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Polls `status --json` until `pred` holds (or panics after 15 s).
fn wait_status(r: &WsRoot, ws: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let v = r.status(ws);
        if pred(&v) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {v}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn no_ports(v: &Value) -> bool {
    v["ports"].as_object().is_some_and(|p| p.is_empty()) && v["sandbox_pid"].is_null()
}

/// Connects to 127.0.0.1:`port` until the server inside answers; gives its answer.
fn ask(port: u64) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port as u16)) {
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let mut answer = String::new();
            if s.read_to_string(&mut answer).is_ok() && !answer.is_empty() {
                return answer;
            }
        }
        assert!(Instant::now() < deadline, "nothing answered on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A server inside that answers every connection to port 3000 with its hostname.
const SERVER: &str = concat!(
    "import socket\n",
    "s = socket.socket()\n",
    "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n",
    "s.bind(('127.0.0.1', 3000))\n",
    "s.listen()\n",
    "while True:\n",
    "    c, _ = s.accept()\n",
    "    c.sendall(socket.gethostname().encode())\n",
    "    c.close()\n",
);

fn writes_diff_commit_and_exit_status(lower: &str) {
    let (r, snap) = setup();
    let ws: Ws = r.create(&snap, &["--name", "w1", "--lower", lower]);
    let (code, out, err) = output(run_cmd(
        &r,
        &[
            "w1",
            "--",
            "sh",
            "-c",
            "echo hi > /workspace/f; cat a.txt; id -u; hostname; echo more >> a.txt",
        ],
    ));
    assert_eq!(code, 0, "stdout {out}\nstderr {err}");
    assert_eq!(out, "hello\n0\nw1\n", "stderr {err}");
    assert_eq!(std::fs::read_to_string(ws.path.join("f")).unwrap(), "hi\n");
    let diff = r.t.run(["diff", "w1"]).ok();
    assert_eq!(diff.stdout, "M a.txt\nA f\n");
    let (new_snap, _, _) = r.commit("w1", &[]);
    let show = r.t.run(["show", &new_snap, "f"]).ok();
    assert!(show.stdout.contains(" f"), "{}", show.stdout);

    let (code, _, err) = output(run_cmd(&r, &["w1", "--", "sh", "-c", "exit 42"]));
    assert_eq!(code, 42, "{err}");

    // The host's root, the runtime root and its store are not there inside.
    let root = r.root().canonicalize().unwrap();
    let probe = format!(
        "for p in {root} {root}/store {root}/registry.db {tmp} /home /var /srv; do \
         if test -e $p; then echo VISIBLE $p; fi; done; ls /",
        root = root.display(),
        tmp = r.t.scratch().display(),
    );
    let (code, out, err) = output(run_cmd(&r, &["w1", "--", "sh", "-c", &probe]));
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains("VISIBLE"), "{out}");
    assert!(out.lines().any(|l| l == "workspace"), "{out}");
    assert!(no_ports(&r.status("w1")));
    r.remove("w1");
    r.assert_clean();
}

#[test]
fn run_writes_into_a_checkout_workspace_and_passes_the_exit_status() {
    require_root!();
    writes_diff_commit_and_exit_status("checkout");
}

#[test]
fn run_writes_into_a_view_workspace_and_passes_the_exit_status() {
    require_root!();
    writes_diff_commit_and_exit_status("view");
}

#[test]
fn run_writes_into_a_fuse_workspace_whose_host_mount_stays() {
    require_root!();
    let (r, snap) = setup();
    let ws: Ws = r.create(&snap, &["--name", "w1", "--materializer", "fuse"]);
    // Not an overlay: the sandbox binds the daemon's mount itself (idmapped), and the
    // host's mount stays, showing what the command writes as it writes it.
    let (code, out, err) = output(run_cmd(
        &r,
        &[
            "w1",
            "--",
            "sh",
            "-c",
            "echo hi > /workspace/f; cat a.txt; id -u; echo more >> a.txt",
        ],
    ));
    assert_eq!(code, 0, "stdout {out}\nstderr {err}");
    assert_eq!(out, "hello\n0\n", "stderr {err}");
    assert!(r.mounts().contains(&ws.path));
    assert_eq!(std::fs::read_to_string(ws.path.join("f")).unwrap(), "hi\n");
    assert_eq!(r.t.run(["diff", "w1"]).ok().stdout, "M a.txt\nA f\n");
    r.discard("w1");
    r.assert_clean();
}

#[test]
fn the_host_path_shows_the_runs_files_through_one_shared_mount() {
    require_root!();
    let (r, snap) = setup();
    let ws: Ws = r.create(&snap, &["--name", "w1", "--lower", "view"]);
    let mounted = || r.mounts().contains(&ws.path);
    assert!(mounted());
    let mut bg = Bg::spawn(run_cmd(
        &r,
        &[
            "w1",
            "--",
            "sh",
            "-c",
            "echo x > /workspace/during; while [ ! -e /workspace/go ]; do sleep 0.05; done",
        ],
    ));
    // Seen on the host path while the run lasts: one overlay serves both sides.
    let deadline = Instant::now() + Duration::from_secs(15);
    // Its content, not its existence: `>` creates the file before it writes.
    while std::fs::read_to_string(ws.path.join("during")).unwrap_or_default() != "x\n"
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        std::fs::read_to_string(ws.path.join("during")).unwrap_or_default(),
        "x\n",
        "the host path does not show what the run wrote"
    );
    assert!(mounted(), "the host path is not mounted during the run");
    let shared = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.contains(&format!(" {} ", ws.path.display())))
        .count();
    assert_eq!(shared, 1, "one mount at the host path");
    // A host write to an existing file works during the run (read back after it; the
    // inside view of host writes is `longlived::longlived_host_view_*`'s).
    std::fs::write(ws.path.join("a.txt"), "from the host\n").unwrap();
    let (code, out, err) = output(run_cmd(&r, &["w1", "--", "true"]));
    assert_eq!(code, 4, "a second run while one runs: exists\n{out}{err}");
    assert_eq!(
        std::process::Command::new("touch")
            .arg(ws.path.join("go"))
            .status()
            .unwrap()
            .code(),
        Some(1),
        "creating a name from the host during a run is refused (EOVERFLOW)"
    );
    std::fs::write(ws.path.join("during"), "x\n").unwrap();
    // Ended from inside instead: the run's own command makes the name.
    let (code, _, err) = output(run_cmd(&r, &["w1", "--", "true"]));
    assert_eq!(code, 4, "{err}");
    bg.signal("-TERM");
    assert!(bg.wait(15).is_some());
    assert!(mounted(), "the host's overlay was not mounted again");
    assert_eq!(
        std::fs::read_to_string(ws.path.join("a.txt")).unwrap(),
        "from the host\n"
    );
    std::fs::write(ws.path.join("after"), "host can create again\n").unwrap();

    // In use on the host: the run is refused before anything runs, naming the path.
    let held = std::fs::File::open(ws.path.join("a.txt")).unwrap();
    let (code, _, err) = output(run_cmd(
        &r,
        &["w1", "--", "sh", "-c", "echo ran > /workspace/ran"],
    ));
    assert_eq!(code, 5, "{err}");
    assert!(err.contains("in use on the host"), "{err}");
    assert!(mounted());
    drop(held);
    assert!(!ws.path.join("ran").exists(), "the refused run ran");
    r.discard("w1");
    r.assert_clean();
}

#[test]
fn published_ports_are_recorded_while_running_and_two_workspaces_serve_3000() {
    require_root!();
    let (r, snap) = setup();
    r.create(&snap, &["--name", "web-a"]);
    r.create(&snap, &["--name", "web-b", "--lower", "view"]);
    let mut a = Bg::spawn(run_cmd(
        &r,
        &["web-a", "--publish", "3000", "--", "python3", "-c", SERVER],
    ));
    let mut b = Bg::spawn(run_cmd(
        &r,
        &["web-b", "--publish", "3000", "--", "python3", "-c", SERVER],
    ));
    let has_port = |v: &Value| v["ports"]["3000"].as_u64().is_some();
    let pa = wait_status(&r, "web-a", "web-a's port", has_port)["ports"]["3000"]
        .as_u64()
        .unwrap();
    let pb = wait_status(&r, "web-b", "web-b's port", has_port)["ports"]["3000"]
        .as_u64()
        .unwrap();
    assert_ne!(pa, pb);
    assert_eq!(ask(pa), "web-a");
    assert_eq!(ask(pb), "web-b");
    // SIGTERM to mountctl: forwarded, the server dies of it, the record is cleared.
    a.signal("-TERM");
    assert_eq!(a.wait(15), Some(128 + 15));
    assert!(no_ports(&r.status("web-a")), "{}", r.status("web-a"));
    b.signal("-INT");
    assert!(b.wait(15).is_some());
    assert!(no_ports(&r.status("web-b")), "{}", r.status("web-b"));
    assert!(TcpStream::connect(("127.0.0.1", pa as u16)).is_err());
    r.remove("web-a");
    r.remove("web-b");
    r.assert_clean();
}

#[test]
fn remove_with_a_running_sandbox_is_busy_and_force_kills_it() {
    require_root!();
    let (r, snap) = setup();
    let ws = r.create(&snap, &["--name", "busy"]);
    let mut run = Bg::spawn(run_cmd(
        &r,
        &[
            "busy",
            "--",
            "sh",
            "-c",
            "touch /workspace/started; sleep 600",
        ],
    ));
    let v = wait_status(&r, "busy", "the sandbox", |v| {
        v["sandbox_pid"].as_i64().is_some()
    });
    // Seen in the upper layer (`diff`): the host's own overlay mount of the workspace
    // may keep a cached "absent" for a path the sandbox's overlay created (sandbox.md).
    let deadline = Instant::now() + Duration::from_secs(15);
    while !r.t.run(["diff", "busy"]).ok().stdout.contains("A started") {
        assert!(Instant::now() < deadline, "the command did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let helper = v["sandbox_pid"].as_i64().unwrap();
    r.t.json(["remove", "busy"]).error(5, "busy");
    assert!(
        r.t.run(["diff", "busy"]).ok().stdout.contains("A started"),
        "a busy remove removed data"
    );
    r.t.json(["remove", "--force", "busy"]).ok();
    assert!(
        run.wait(15).is_some(),
        "mountctl run outlived remove --force"
    );
    assert!(!Path::new(&format!("/proc/{helper}")).exists() || helper == 0);
    assert!(!ws.path.exists() || std::fs::read_dir(&ws.path).unwrap().next().is_none());
    r.assert_clean();
}

#[test]
fn an_unenforceable_control_is_refused_with_7_and_nothing_runs() {
    require_root!();
    let (r, snap) = setup();
    let ws = r.create(&snap, &["--name", "limited"]);
    let empty = r.t.path("empty-cgroup-root");
    std::fs::create_dir_all(&empty).unwrap();
    let mut c = run_cmd(
        &r,
        &[
            "limited",
            "--memory",
            "64m",
            "--",
            "touch",
            "/workspace/ran",
        ],
    );
    c.env("COWSPACE_CGROUP_ROOT", &empty);
    let (code, out, err) = output(c);
    assert_eq!(code, 7, "stdout {out}\nstderr {err}");
    assert!(err.contains("cannot be enforced"), "{err}");
    assert!(!ws.path.join("ran").exists());
    assert!(no_ports(&r.status("limited")));
    // An unknown workspace is refused by mountctl itself (not found, 3).
    let (code, _, err) = output(run_cmd(&r, &["nosuch", "--", "true"]));
    assert_ne!(code, 0, "{err}");
    r.remove("limited");
    r.assert_clean();
}

/// git in the sandbox of an overlay or fuse workspace of an imported git checkout: the
/// checkout names cowspace's fsmonitor hook, which runs `$COWSPACE_MOUNTCTL`; `mountctl
/// run` shows the sandbox this `mountctl` at its host path (and names it there) and the
/// workspace's upper layer read-only, so git there looks at
/// no file it trusts and still sees every change (docs/git.md). Where the program lies
/// under a directory the sandbox reserves (`/root`, say) the hook stays off: git looks at
/// every file, and says nothing about the hook either way.
#[test]
fn git_in_the_sandbox_of_a_git_checkout_asks_the_workspace() {
    require_root!();
    sandbox_support::helper();
    let r = WsRoot::new();
    let src = r.t.path("src");
    write_file(&src.join("a.txt"), "hello\n");
    write_file(&src.join("d/x"), "x\n");
    let git = |args: &[&str]| {
        let o = Command::new("git")
            .current_dir(&src)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
            .args(args)
            .output()
            .expect("git runs");
        assert!(o.status.success(), "git {args:?}: {o:?}");
    };
    git(&["init", "-q"]);
    git(&["add", "-A"]);
    git(&["commit", "-qm", "base"]);
    std::thread::sleep(Duration::from_millis(1200));
    git(&["status", "--porcelain"]);
    let snap = r.import(&src, &["--no-default-excludes"]);
    for materializer in ["overlay", "fuse"] {
        git_in_the_sandbox_of(&r, &snap, materializer);
    }
    r.assert_clean();
}

fn git_in_the_sandbox_of(r: &WsRoot, snap: &str, materializer: &str) {
    let ws = r.create(snap, &["--materializer", materializer]);
    let config = std::fs::read_to_string(ws.path.join(".git/config")).unwrap();
    assert!(
        config.contains("git-fsmonitor"),
        "the import names the hook: {config}"
    );
    let script = "cd /workspace && export GIT_TEST_PRELOAD_INDEX=1 && \
         GIT_TRACE2_EVENT=/tmp/trace git status --porcelain && \
         grep -o 'preload/sum_lstat\",\"value\":\"[0-9]*' /tmp/trace | tr -dc 0-9 && echo && \
         echo changed >> a.txt && rm d/x && echo new > d/y && \
         git status --porcelain --untracked-files=all && echo -- && \
         git -c core.fsmonitor=false status --porcelain --untracked-files=all";
    let (code, out, err) = output(run_cmd(r, &[&ws.id, "--", "sh", "-c", script]));
    assert_eq!(code, 0, "{materializer}: stderr: {err}");
    assert!(
        !err.contains("fsmonitor"),
        "{materializer}: git complains about the hook: {err}"
    );
    let changed = " M a.txt\n D d/x\n?? d/y\n";
    let reserved = ["/root/", "/etc/", "/run/", "/proc/", "/dev/", "/workspace/"];
    let looked_at = if reserved.iter().any(|d| mountctl_bin().starts_with(d)) {
        eprintln!(
            "note: {} lies where the sandbox binds nothing: the hook stays off",
            mountctl_bin().display()
        );
        "2"
    } else {
        "0"
    };
    assert_eq!(
        out,
        format!("{looked_at}\n{changed}--\n{changed}"),
        "{materializer}: stderr: {err}"
    );
    // A snapshot directory replaced (an opaque directory) and one renamed (a redirect),
    // whose trusted xattrs the sandbox cannot read: the hook still names what git must
    // look at (the tracked name the opaque directory hides included).
    let script = "cd /workspace && git add -A >/dev/null && git -c user.name=t -c user.email=t@example.invalid commit -qm two && \
         rm -rf d && mkdir d && echo y > d/other && mv d moved && mkdir d && \
         echo z > d/again && \
         git status --porcelain --untracked-files=all && echo -- && \
         git -c core.fsmonitor=false status --porcelain --untracked-files=all";
    let (code, out, err) = output(run_cmd(r, &[&ws.id, "--", "sh", "-c", script]));
    assert_eq!(code, 0, "{materializer}: stderr: {err}");
    let (with, without) = out.split_once("--\n").expect("two statuses");
    assert_eq!(with, without, "{materializer}: the hook hid a change");
    assert!(with.contains("moved/"), "{materializer}: {with}");
    assert!(with.contains(" D d/y"), "{materializer}: {with}");
    r.discard(&ws.id);
}

/// Each refused sandbox flag says the rule it broke, and a command that hits the process
/// limit is told so as one killed at the memory limit is.
#[test]
fn refused_flags_state_the_rule_and_a_process_limit_reached_is_said() {
    require_root!();
    let (r, snap) = setup();
    let ws = r.create(&snap, &["--name", "rules"]);
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    // The kernel's list format: `0-1,3`.
    let cpus: usize = online
        .trim()
        .split(',')
        .map(|r| match r.split_once('-') {
            Some((a, b)) => b.parse::<usize>().unwrap() - a.parse::<usize>().unwrap() + 1,
            None => 1,
        })
        .sum();
    let too_many = (cpus + 1).to_string();
    let cases: [(&[&str], &str); 5] = [
        (&["--memory", "99999999999999g"], "too large"),
        (&["--ro-bind", "/etc:relative"], "must be an absolute path"),
        (
            &["--ro-bind", "/etc:/usr/x"],
            "/run, /proc, /dev, /workspace, /usr",
        ),
        (&["--publish", "3000", "--publish", "3000"], "given twice"),
        (&["--cpus", &too_many], &format!("this host has {cpus} CPU")),
    ];
    for (flags, says) in cases {
        let mut args = vec!["rules"];
        args.extend_from_slice(flags);
        args.extend(["--", "touch", "/workspace/ran"]);
        let (code, out, err) = output(run_cmd(&r, &args));
        assert_eq!(code, 9, "{flags:?}: stdout {out}\nstderr {err}");
        assert!(err.contains(says), "{flags:?}: {err}");
        assert!(!ws.path.join("ran").exists(), "{flags:?}");
    }
    // More children than --pids allows: the shell's own "Cannot fork" and the reason.
    let (code, _, err) = output(run_cmd(
        &r,
        &[
            "rules",
            "--pids",
            "8",
            "--",
            "sh",
            "-c",
            "for i in 1 2 3 4 5 6 7 8 9 10; do sleep 1 & done; wait",
        ],
    ));
    assert_ne!(code, 0, "{err}");
    assert!(
        err.contains("process limit reached") && err.contains("limit of 8 processes"),
        "{err}"
    );
    r.remove("rules");
    r.assert_clean();
}
