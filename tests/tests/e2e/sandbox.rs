//! The sandbox escape suite: real namespaces, cgroups and seccomp, as root.
//!
//! Each case runs a command inside a sandbox that tries to get out, and asserts the
//! refusal itself (the error text or errno), not only an exit code. Skips with a reason
//! when not root, fails under `CI=true`. Helpers are in `sandbox_support.rs`.
//!
//! Needs on the host: `/usr/bin/python3` (seen inside through `/usr`), procps `ps`,
//! util-linux `script`, `mount`, `unshare` (`ping` is tried when present), and cgroup v1 `memory`, `pids`, `cpu` under
//! `/sys/fs/cgroup` (one case reads the limits there).
//!
//! Run: `cargo test -p cowspace-tests --test e2e sandbox` (as root).

#[path = "sandbox_support.rs"]
pub(crate) mod support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use support::{
    Running, Scratch, leftover_cgroups, marker, parts, processes_with, require_root, run,
};

/// Python inside the sandbox (the host's `/usr/bin/python3`, visible through `/usr`).
const PY: &str = "/usr/bin/python3";

#[test]
fn sandbox_runs_as_root_inside_in_workspace_with_its_hostname_and_exit_status() {
    require_root!();
    let s = Scratch::new();
    std::fs::write(s.ws().join("hello.txt"), "hi\n").unwrap();
    let out = run(s.command(
        "hello-box",
        &[],
        &[
            "/bin/sh",
            "-c",
            "id -u; hostname; pwd; cat hello.txt; echo made > made.txt; exit 3",
        ],
    ));
    let (code, stdout, stderr) = parts(&out);
    assert_eq!(code, Some(3), "stderr: {stderr}");
    assert_eq!(stdout, "0\nhello-box\n/workspace\nhi\n", "stderr: {stderr}");
    assert_eq!(
        std::fs::read_to_string(s.ws().join("made.txt")).unwrap(),
        "made\n"
    );
}

#[test]
fn sandbox_host_files_home_root_and_state_dir_are_not_visible() {
    require_root!();
    let s = Scratch::new();
    let secret = s.dir.path().join("host-secret.txt");
    std::fs::write(&secret, "secret").unwrap();
    let script = format!(
        "cat {secret}; ls {state}; ls /home; ls /var/run/docker.sock; ls /var; cat /etc/shadow; ls /root | wc -l",
        secret = secret.display(),
        state = s.state().display()
    );
    let out = run(s.command("view-box", &[], &["/bin/sh", "-c", &script]));
    let (_, stdout, stderr) = parts(&out);
    assert!(
        stderr.contains(&format!(
            "cat: {}: No such file or directory",
            secret.display()
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "ls: cannot access '{}': No such file or directory",
            s.state().display()
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains("ls: cannot access '/home': No such file or directory"),
        "{stderr}"
    );
    assert!(
        stderr.contains("ls: cannot access '/var/run/docker.sock': No such file or directory"),
        "{stderr}"
    );
    assert!(
        stderr.contains("ls: cannot access '/var': No such file or directory"),
        "{stderr}"
    );
    assert!(
        stderr.contains("cat: /etc/shadow: No such file or directory"),
        "{stderr}"
    );
    assert_eq!(
        stdout.trim(),
        "0",
        "/root inside is a fresh empty directory"
    );
}

#[test]
fn sandbox_read_only_binds_and_system_dirs_refuse_writes() {
    require_root!();
    let s = Scratch::new();
    let deps = s.dir.path().join("deps");
    std::fs::create_dir(&deps).unwrap();
    std::fs::write(deps.join("lib.txt"), "shared").unwrap();
    let bind = format!("{}:/deps/cache", deps.display());
    let out = run(s.command(
        "ro-box",
        &["--ro-bind", &bind],
        &["/bin/sh", "-c", "cat /deps/cache/lib.txt; echo x > /deps/cache/lib.txt; touch /usr/evil; touch /etc/evil; touch /evil"],
    ));
    let (_, stdout, stderr) = parts(&out);
    assert_eq!(stdout, "shared");
    assert!(
        stderr.contains("cannot create /deps/cache/lib.txt: Read-only file system"),
        "{stderr}"
    );
    assert!(
        stderr.contains("touch: cannot touch '/usr/evil': Read-only file system"),
        "{stderr}"
    );
    assert!(
        stderr.contains("touch: cannot touch '/etc/evil': Read-only file system"),
        "{stderr}"
    );
    assert!(
        stderr.contains("touch: cannot touch '/evil': Read-only file system"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(deps.join("lib.txt")).unwrap(),
        "shared"
    );
    assert!(!std::path::Path::new("/usr/evil").exists());
}

fn connect_script(port: u16) -> String {
    format!(
        "import socket, errno\n\
         for addr in [('127.0.0.1', {port}), ('1.1.1.1', 80)]:\n\
         \x20   s = socket.socket()\n\
         \x20   s.settimeout(3)\n\
         \x20   try:\n\
         \x20       s.connect(addr); print(addr[0], 'connected')\n\
         \x20   except OSError as e:\n\
         \x20       print(addr[0], errno.errorcode.get(e.errno, e.errno))\n"
    )
}

#[test]
fn sandbox_net_none_reaches_nothing_and_loopback_not_the_host() {
    require_root!();
    let s = Scratch::new();
    let host = TcpListener::bind("127.0.0.1:0").unwrap();
    host.set_nonblocking(true).unwrap();
    let port = host.local_addr().unwrap().port();
    let script = connect_script(port);

    let out = run(s.command("net-none", &[], &[PY, "-c", &script]));
    let (_, stdout, stderr) = parts(&out);
    assert_eq!(
        stdout, "127.0.0.1 ENETUNREACH\n1.1.1.1 ENETUNREACH\n",
        "{stderr}"
    );

    let out = run(s.command("net-lo", &["--net", "loopback"], &[PY, "-c", &script]));
    let (_, stdout, stderr) = parts(&out);
    assert_eq!(
        stdout, "127.0.0.1 ECONNREFUSED\n1.1.1.1 ENETUNREACH\n",
        "{stderr}"
    );
    assert!(
        host.accept().is_err(),
        "the host listener was reached from the sandbox"
    );
}

#[test]
fn sandbox_fork_bomb_is_contained_by_the_pids_limit_and_leaves_nothing() {
    require_root!();
    let s = Scratch::new();
    let m = marker();
    // A counted fork loop (reports the refusal), then a real shell fork bomb that
    // keeps running until the command ends and init kills what is left.
    let script = format!(
        "import os, time, subprocess\n\
         kids = []\n\
         err = None\n\
         for i in range(1000):\n\
         \x20   try:\n\
         \x20       pid = os.fork()\n\
         \x20   except OSError as e:\n\
         \x20       err = e; break\n\
         \x20   if pid == 0:\n\
         \x20       os.execv('/bin/sleep', ['sleep', '{m}'])\n\
         \x20   kids.append(pid)\n\
         print(len(kids), os.strerror(err.errno) if err else 'no error')\n\
         for k in kids:\n\
         \x20   os.kill(k, 9); os.waitpid(k, 0)\n\
         subprocess.Popen(['/bin/sh', '-c', 'b() {{ b | b & }}; b'], stderr=subprocess.DEVNULL)\n\
         time.sleep(2)\n\
         print('survived')\n"
    );
    let run_ = Running::spawn(s.command("bomb-box", &["--pids", "32"], &[PY, "-c", &script]));
    let helper_pid = run_.pid();
    // The host is unaffected while the bomb runs.
    std::thread::sleep(Duration::from_millis(1000));
    assert!(
        std::process::Command::new("/bin/true")
            .status()
            .unwrap()
            .success()
    );
    let out = run_.wait();
    let (code, stdout, stderr) = parts(&out);
    assert_eq!(code, Some(0), "{stderr}");
    let mut lines = stdout.lines();
    let first = lines.next().unwrap_or_default();
    let (n, why) = first.split_once(' ').unwrap();
    assert!(n.parse::<u32>().unwrap() < 32, "{first}");
    assert_eq!(why, "Resource temporarily unavailable", "{stdout}");
    assert_eq!(lines.next(), Some("survived"));
    assert!(processes_with(&format!("sleep {m}")).is_empty());
    assert!(leftover_cgroups("bomb-box", helper_pid).is_empty());
}

#[test]
fn sandbox_memory_limit_oom_kills_and_the_helper_reports_it() {
    require_root!();
    let s = Scratch::new();
    let out = run(s.command(
        "oom-box",
        &["--memory", "48m"],
        &[PY, "-c", "b = bytearray(512 << 20); print('allocated')"],
    ));
    let (code, stdout, stderr) = parts(&out);
    assert_eq!(code, Some(137), "{stderr}");
    assert!(!stdout.contains("allocated"));
    assert!(
        stderr.contains("oom-box: out of memory: the kernel OOM-killed"),
        "{stderr}"
    );
    assert!(
        stderr.contains("memory limit of 50331648 bytes"),
        "{stderr}"
    );
}

#[test]
fn sandbox_privileged_calls_are_refused() {
    require_root!();
    let s = Scratch::new();
    let host_hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let my_pid = std::process::id();
    let script = format!(
        "import ctypes, os, socket\n\
         libc = ctypes.CDLL(None, use_errno=True)\n\
         def errno_of(r):\n\
         \x20   return 'ok' if r == 0 else os.strerror(ctypes.get_errno())\n\
         print('ptrace', errno_of(libc.ptrace(16, {my_pid}, 0, 0)))\n\
         print('ptrace-init', errno_of(libc.ptrace(16, 1, 0, 0)))\n\
         print('finit_module', errno_of(libc.syscall(313, 0, b'', 0)))\n\
         print('init_module', errno_of(libc.syscall(175, 0, 0, b'')))\n\
         print('kexec_load', errno_of(libc.syscall(246, 0, 0, 0, 0)))\n\
         print('bpf', errno_of(libc.syscall(321, 0, 0, 0)))\n\
         print('keyctl', errno_of(libc.syscall(250, 0, 0, 0, 0, 0)))\n\
         print('reboot', errno_of(libc.syscall(169, 0, 0, 0, 0)))\n\
         print('swapon', errno_of(libc.syscall(167, b'/tmp/x', 0)))\n\
         print('setns', errno_of(libc.syscall(308, 0, 0)))\n\
         print('unshare-user', errno_of(libc.unshare(0x10000000)))\n\
         try:\n\
         \x20   socket.sethostname('evil')\n\
         \x20   print('sethostname ok')\n\
         except OSError as e:\n\
         \x20   print('sethostname', e.strerror)\n"
    );
    let out = run(s.command("priv-box", &[], &[PY, "-c", &script]));
    let (_, stdout, stderr) = parts(&out);
    let denied = "Operation not permitted";
    for call in [
        "ptrace",
        "ptrace-init",
        "finit_module",
        "init_module",
        "kexec_load",
        "bpf",
        "keyctl",
        "reboot",
        "swapon",
        "setns",
        "unshare-user",
        "sethostname",
    ] {
        assert!(
            stdout.contains(&format!("{call} {denied}\n")),
            "{call}: {stdout} {stderr}"
        );
    }

    let out = run(s.command(
        "priv-tools",
        &[],
        &[
            "/bin/sh",
            "-c",
            "mount -t tmpfs none /tmp; unshare -U true; hostname evil; umount /proc",
        ],
    ));
    let (_, _, stderr) = parts(&out);
    assert!(
        stderr.contains("mount: /tmp: permission denied."),
        "{stderr}"
    );
    assert!(
        stderr.contains("unshare: unshare failed: Operation not permitted"),
        "{stderr}"
    );
    assert!(
        stderr.contains("hostname: you must be root to change the host name"),
        "{stderr}"
    );
    assert!(
        stderr.contains("umount: /proc: must be superuser to unmount."),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap(),
        host_hostname
    );
}

#[test]
fn sandbox_host_processes_are_not_visible() {
    require_root!();
    let s = Scratch::new();
    let out = run(s.command(
        "ps-box",
        &[],
        &[
            "/bin/sh",
            "-c",
            "ps -e -o pid=,comm=; ls -d /proc/[0-9]* | wc -l; kill -0 1 && echo init-visible",
        ],
    ));
    let (code, stdout, stderr) = parts(&out);
    assert_eq!(code, Some(0), "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    // init (pid 1), sh, ps; then the count of /proc entries at `ls` time, then our echo.
    let ps: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| {
            l.trim_start()
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_digit())
                && l.contains(' ')
        })
        .collect();
    assert_eq!(ps.len(), 3, "{stdout}");
    assert!(ps[0].trim_start().starts_with("1 "), "{stdout}");
    assert!(
        !stdout.contains("systemd") && !stdout.contains("e2e-"),
        "{stdout}"
    );
    let count: u32 = lines[3].trim().parse().unwrap();
    assert!(count <= 4, "{stdout}");
}

#[test]
fn sandbox_no_process_survives_the_sandbox_even_when_the_helper_is_killed() {
    require_root!();
    let s = Scratch::new();
    let m1 = marker();
    let script = format!(
        "sleep {m1} & (setsid sleep {m1} &) ; nohup sleep {m1} >/dev/null 2>&1 & echo started"
    );
    let out = run(s.command("leave-box", &[], &["/bin/sh", "-c", &script]));
    let (code, stdout, stderr) = parts(&out);
    assert_eq!((code, stdout.as_str()), (Some(0), "started\n"), "{stderr}");
    assert!(
        processes_with(&format!("sleep {m1}")).is_empty(),
        "daemons outlived the sandbox"
    );

    // SIGKILL of the helper itself: its init dies (parent-death signal) and so does
    // everything in the pid namespace; the next run removes the stale cgroup.
    let m2 = marker();
    let mut r = Running::spawn(s.command(
        "killed-box",
        &["--json"],
        &["/bin/sh", "-c", &format!("sleep {m2} & sleep {m2}")],
    ));
    let helper_pid = r.pid();
    let ready = r.ready_line();
    assert!(ready.contains("\"init_pid\""), "{ready}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while processes_with(&format!("sleep {m2}")).len() < 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(processes_with(&format!("sleep {m2}")).len(), 2);
    r.kill_now();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !processes_with(&format!("sleep {m2}")).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        processes_with(&format!("sleep {m2}")).is_empty(),
        "processes outlived a killed helper"
    );
    let out = run(s.command("after-kill", &[], &["/bin/true"]));
    assert_eq!(out.status.code(), Some(0));
    assert!(leftover_cgroups("killed-box", helper_pid).is_empty());
}

fn http_get(port: u16, path: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let attempt = (|| -> std::io::Result<String> {
            let mut c = TcpStream::connect(("127.0.0.1", port))?;
            c.set_read_timeout(Some(Duration::from_secs(5)))?;
            write!(c, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n")?;
            let mut body = String::new();
            c.read_to_string(&mut body)?;
            Ok(body)
        })();
        match attempt {
            Ok(body) if body.starts_with("HTTP/1.0 200") => return body,
            _ if Instant::now() > deadline => panic!("no answer on 127.0.0.1:{port}: {attempt:?}"),
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

fn port_of(ready: &str) -> (u16, u64) {
    let v: serde_json::Value =
        serde_json::from_str(ready).unwrap_or_else(|e| panic!("{e}: {ready:?}"));
    (
        v["ports"]["3000"].as_u64().unwrap() as u16,
        v["host_uid_base"].as_u64().unwrap(),
    )
}

#[test]
fn sandbox_two_sandboxes_serve_port_3000_on_two_host_ports() {
    require_root!();
    // One state directory: concurrent sandboxes share the host's leases.
    let s = Scratch::new();
    let server = [
        "/usr/bin/python3",
        "-m",
        "http.server",
        "3000",
        "--bind",
        "127.0.0.1",
    ];
    let ws_b = s.dir.path().join("ws-b");
    std::fs::create_dir(&ws_b).unwrap();
    std::fs::write(s.ws().join("id.txt"), "I am A\n").unwrap();
    std::fs::write(ws_b.join("id.txt"), "I am B\n").unwrap();
    let mut a = Running::spawn(s.command("web-a", &["--publish", "3000", "--json"], &server));
    let cmd_b = s.command_in(&ws_b, "web-b", &["--publish", "3000", "--json"], &server);
    let mut b = Running::spawn(cmd_b);
    let (port_a, uid_a) = port_of(&a.ready_line());
    let (port_b, uid_b) = port_of(&b.ready_line());
    assert_ne!(port_a, port_b);
    assert_ne!(uid_a, uid_b, "two sandboxes share a host uid range");
    assert!(http_get(port_a, "/id.txt").ends_with("I am A\n"));
    assert!(http_get(port_b, "/id.txt").ends_with("I am B\n"));
    // SIGTERM reaches the server through the helper and init.
    for r in [&a, &b] {
        let _ = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(r.pid().to_string())
            .status();
    }
    let out_a = a.wait();
    let out_b = b.wait();
    let (code_a, _, err_a) = parts(&out_a);
    assert_eq!(code_a, Some(143), "{err_a}");
    assert!(
        err_a.contains(&format!("published 3000 -> 127.0.0.1:{port_a}")),
        "{err_a}"
    );
    assert_eq!(out_b.status.code(), Some(143));
    assert!(
        TcpStream::connect(("127.0.0.1", port_a)).is_err(),
        "port still served after the end"
    );
}

#[test]
fn sandbox_missing_control_is_refused_with_exit_7_and_nothing_runs() {
    require_root!();
    let s = Scratch::new();
    let empty = s.dir.path().join("empty-cgroup-root");
    std::fs::create_dir(&empty).unwrap();
    let mut cmd = s.command(
        "refused-box",
        &["--memory", "64m", "--json"],
        &["/bin/sh", "-c", "touch /workspace/ran"],
    );
    cmd.env("COWSPACE_CGROUP_ROOT", &empty);
    let out = run(cmd);
    let (code, stdout, stderr) = parts(&out);
    assert_eq!(code, Some(7), "{stderr}");
    assert!(
        stderr.contains(
            "unsupported: process limit and accounting (cgroup pids controller) cannot be enforced"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "no cgroup v1 `pids` hierarchy at {}/pids",
            empty.display()
        )),
        "{stderr}"
    );
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["error"]["kind"], "unsupported");
    assert!(!s.ws().join("ran").exists(), "the command ran");
    let probe = std::process::Command::new(support::helper())
        .args(["probe", "--json"])
        .env("COWSPACE_CGROUP_ROOT", &empty)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&probe.stdout).unwrap();
    let pids = v["controls"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["control"].as_str().unwrap().contains("pids"))
        .unwrap();
    assert_eq!(pids["available"], false);
    assert!(
        pids["detail"]
            .as_str()
            .unwrap()
            .contains("no cgroup v1 `pids` hierarchy")
    );
    assert_eq!(
        std::fs::read_dir(s.state()).unwrap().count(),
        0,
        "state was touched before refusing"
    );
}

#[test]
fn sandbox_cannot_push_input_into_the_host_terminal() {
    require_root!();
    let s = Scratch::new();
    // Run the helper on a pseudo-terminal (util-linux `script`), as from a shell.
    let inner = s.command(
        "tty-box",
        &[],
        &[
            PY,
            "-c",
            "import fcntl, termios, os\n\
             print('isatty', os.isatty(0))\n\
             try:\n\
             \x20   fcntl.ioctl(0, termios.TIOCSTI, b'x'); print('TIOCSTI ok')\n\
             except OSError as e: print('TIOCSTI', e.strerror)\n\
             try:\n\
             \x20   open('/dev/tty'); print('/dev/tty opened')\n\
             except OSError as e: print('/dev/tty', e.strerror)\n",
        ],
    );
    let quoted: Vec<String> = std::iter::once(inner.get_program())
        .chain(inner.get_args())
        .map(|a| format!("'{}'", a.to_string_lossy().replace('\'', "'\\''")))
        .collect();
    let mut cmd = std::process::Command::new("script");
    cmd.args(["-qec", &quoted.join(" "), "/dev/null"]);
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let out = run(cmd);
    let (_, stdout, stderr) = parts(&out);
    assert!(
        stdout.contains("isatty True"),
        "not on a terminal: {stdout} {stderr}"
    );
    assert!(
        stdout.contains("TIOCSTI Operation not permitted"),
        "{stdout} {stderr}"
    );
    assert!(
        stdout.contains("/dev/tty No such device or address"),
        "{stdout} {stderr}"
    );
}

#[test]
fn sandbox_cannot_plant_set_id_or_capable_files_in_the_workspace() {
    require_root!();
    let s = Scratch::new();
    // Root inside owns the workspace's root-owned files through the idmapped mount: a
    // set-id or file-capability binary made there would be privileged on the host.
    let script = "import os\n\
        open('tool', 'w').write('x')\n\
        for mode in (0o4755, 0o2755):\n\
        \x20   try:\n\
        \x20       os.chmod('tool', mode); print(oct(mode), 'ok')\n\
        \x20   except OSError as e: print(oct(mode), e.strerror)\n\
        try:\n\
        \x20   os.close(os.open('made', os.O_CREAT | os.O_WRONLY, 0o4755)); print('create ok')\n\
        except OSError as e: print('create', e.strerror)\n\
        cap = bytes.fromhex('0100000201000000000000000000000000000000')\n\
        try:\n\
        \x20   os.setxattr('tool', 'security.capability', cap); print('setcap ok')\n\
        except OSError as e: print('setcap', e.strerror)\n";
    let out = run(s.command("setid-box", &[], &[PY, "-c", script]));
    let (_, stdout, stderr) = parts(&out);
    let denied = "Operation not permitted";
    for case in ["0o4755", "0o2755", "create", "setcap"] {
        assert!(
            stdout.contains(&format!("{case} {denied}\n")),
            "{case}: {stdout} {stderr}"
        );
    }
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(s.ws().join("tool"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o6000, 0, "set-id bit on the host: {mode:o}");
    assert!(!s.ws().join("made").exists());
}

#[test]
fn sandbox_kernel_knobs_are_out_of_reach_and_a_missing_command_exits_127() {
    require_root!();
    let s = Scratch::new();
    let out = run(s.command(
        "knob-box",
        &[],
        &[
            "/bin/sh",
            "-c",
            "echo 1 > /proc/sys/kernel/panic; echo x > /proc/sys/vm/drop_caches; \
             echo b > /proc/sysrq-trigger; ls /sys; cat /proc/1/environ",
        ],
    ));
    let (_, _, stderr) = parts(&out);
    assert!(
        stderr.contains("cannot create /proc/sys/kernel/panic: Permission denied"),
        "{stderr}"
    );
    assert!(
        stderr.contains("cannot create /proc/sys/vm/drop_caches: Permission denied"),
        "{stderr}"
    );
    assert!(
        stderr.contains("cannot create /proc/sysrq-trigger"),
        "{stderr}"
    );
    assert!(
        stderr.contains("ls: cannot access '/sys': No such file or directory"),
        "{stderr}"
    );
    assert!(
        stderr.contains("cat: /proc/1/environ: Permission denied"),
        "{stderr}"
    );

    let out = run(s.command("nocmd-box", &[], &["/no/such/command"]));
    let (code, _, stderr) = parts(&out);
    assert_eq!(code, Some(127), "as a shell says it: {stderr}");
    assert!(
        stderr.contains(
            "starting \"/no/such/command\" inside the sandbox: No such file or directory"
        ),
        "{stderr}"
    );
    // With --json: exactly one object on stdout, the error (no ready line before it).
    let out = run(s.command(
        "nocmd-json",
        &["--json", "--publish", "3000"],
        &["no-such-command"],
    ));
    let (code, stdout, _) = parts(&out);
    assert_eq!(code, Some(127));
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["error"]["kind"], "invalid_input");
}

#[test]
fn sandbox_limits_are_written_to_its_cgroups_and_removed_after() {
    require_root!();
    let s = Scratch::new();
    let mut r = Running::spawn(s.command(
        "limit-box",
        &["--memory", "96m", "--pids", "40", "--cpus", "0.5", "--json"],
        &["/bin/sleep", "60"],
    ));
    let helper_pid = r.pid();
    let ready: serde_json::Value = serde_json::from_str(&r.ready_line()).unwrap();
    let init_pid = ready["init_pid"].as_u64().unwrap();
    let dirs = leftover_cgroups("limit-box", helper_pid);
    let read = |controller: &str, file: &str| {
        let dir = dirs
            .iter()
            .find(|d| d.starts_with(format!("/sys/fs/cgroup/{controller}")))
            .unwrap();
        std::fs::read_to_string(dir.join(file))
            .unwrap()
            .trim()
            .to_string()
    };
    // This host: cgroup v1 for all three (see docs/sandbox.md).
    assert_eq!(
        read("memory", "memory.limit_in_bytes"),
        (96u64 << 20).to_string()
    );
    assert_eq!(read("pids", "pids.max"), "40");
    assert_eq!(read("cpu", "cpu.cfs_quota_us"), "50000");
    assert_eq!(read("cpu", "cpu.cfs_period_us"), "100000");
    for controller in ["memory", "pids", "cpu"] {
        assert!(
            read(controller, "cgroup.procs")
                .lines()
                .any(|p| p == init_pid.to_string()),
            "{controller}"
        );
    }
    let uid_line = std::fs::read_to_string(format!("/proc/{init_pid}/status"))
        .unwrap()
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .unwrap()
        .to_string();
    let host_uid: u64 = uid_line.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert_eq!(
        host_uid,
        ready["host_uid_base"].as_u64().unwrap(),
        "init is not root-inside"
    );
    assert!(
        host_uid >= 1_000_000_000,
        "init runs as a low host uid: {uid_line}"
    );
    // SIGKILL the helper: its sandbox dies with it, and the next run removes the groups
    // it could not.
    r.kill_now();
    let out = run(s.command(
        "after-limit",
        &["--memory", "64m", "--cpus", "1"],
        &["/bin/true"],
    ));
    assert_eq!(out.status.code(), Some(0));
    assert!(leftover_cgroups("limit-box", helper_pid).is_empty());
}

#[test]
fn sandbox_secrets_are_read_only_files_never_arguments_or_environment() {
    require_root!();
    let s = Scratch::new();
    let file = s.dir.path().join("token");
    std::fs::write(&file, "s3cr3t-value").unwrap();
    let secret = format!("api-token={}", file.display());
    let out = run(s.command(
        "secret-box",
        &["--secret", &secret],
        &[
            "/bin/sh",
            "-c",
            "cat /run/secrets/api-token; echo; echo x > /run/secrets/api-token; \
             env | grep -c s3cr3t-v''alue; tr '\\0' ' ' < /proc/1/cmdline | grep -c s3cr3t-v''alue; \
             ls -l /run/secrets",
        ],
    ));
    let (_, stdout, stderr) = parts(&out);
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some("s3cr3t-value"), "{stdout} {stderr}");
    assert_eq!(
        lines.next(),
        Some("0"),
        "secret in the environment: {stdout}"
    );
    assert_eq!(
        lines.next(),
        Some("0"),
        "secret in init's command line: {stdout}"
    );
    assert!(
        stderr.contains("cannot create /run/secrets/api-token: Read-only file system"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "s3cr3t-value");
}

/// A directory a runtime shares into sandboxes from some workspace (a build output,
/// another worker's results): its contents are the worker's, links included.
fn planted_links(s: &Scratch) -> std::path::PathBuf {
    let shared = s.dir.path().join("other-ws");
    std::fs::create_dir_all(shared.join("out")).unwrap();
    std::fs::write(shared.join("out/result.txt"), "built\n").unwrap();
    std::os::unix::fs::symlink("/etc", shared.join("share")).unwrap();
    std::os::unix::fs::symlink("/etc", shared.join("mid")).unwrap();
    std::os::unix::fs::symlink("../../../../../../../../../../etc", shared.join("up")).unwrap();
    shared
}

#[test]
fn sandbox_bind_sources_never_follow_a_symlink_a_worker_planted() {
    require_root!();
    let s = Scratch::new();
    let shared = planted_links(&s);
    let show = "cat /deps/x/passwd /deps/x 2>&1 | head -3; touch /workspace/ran";
    // (source, the component that is the link): the last component, a middle one, a
    // relative chain climbing to the host root.
    let cases = [
        (shared.join("share"), shared.join("share")),
        (shared.join("mid/passwd"), shared.join("mid")),
        (shared.join("up"), shared.join("up")),
        (shared.join("up/passwd"), shared.join("up")),
    ];
    for (source, link) in cases {
        let bind = format!("{}:/deps/x", source.display());
        let out = run(s.command("link-box", &["--ro-bind", &bind], &["/bin/sh", "-c", show]));
        let (code, stdout, stderr) = parts(&out);
        assert_eq!(code, Some(9), "{bind}: {stdout} {stderr}");
        assert!(
            !stdout.contains("root:"),
            "{bind}: host file shown: {stdout}"
        );
        assert!(
            stderr.contains(&format!("{} is a symlink", link.display())),
            "{bind}: the link is not named: {stderr}"
        );
        assert!(
            stderr.contains("without following symlinks"),
            "{bind}: {stderr}"
        );
        assert!(!s.ws().join("ran").exists(), "{bind}: the command ran");
    }

    // A relative source is taken against the caller's working directory, as given:
    // through a link it is refused the same way, with `..` it is refused outright.
    for (rel, why) in [("share", "is a symlink"), ("out/../share", "`..`")] {
        let bind = format!("{rel}:/deps/x");
        let mut cmd = s.command("rel-box", &["--ro-bind", &bind], &["/bin/sh", "-c", show]);
        cmd.current_dir(&shared);
        let out = run(cmd);
        let (code, stdout, stderr) = parts(&out);
        assert_eq!(code, Some(9), "{bind}: {stdout} {stderr}");
        assert!(
            !stdout.contains("root:"),
            "{bind}: host file shown: {stdout}"
        );
        assert!(stderr.contains(why), "{bind}: {stderr}");
    }

    // A legitimate bind in the same directory still works, absolute or relative.
    let mut cmd = s.command(
        "bind-ok",
        &[
            "--ro-bind",
            &format!("{}:/deps/abs", shared.join("out").display()),
            "--ro-bind",
            "./out/result.txt:/deps/rel.txt",
        ],
        &["/bin/sh", "-c", "cat /deps/abs/result.txt /deps/rel.txt"],
    );
    cmd.current_dir(&shared);
    let out = run(cmd);
    let (code, stdout, stderr) = parts(&out);
    assert_eq!(
        (code, stdout.as_str()),
        (Some(0), "built\nbuilt\n"),
        "{stderr}"
    );
}

const SOCKETS: &str = "import socket, errno\n\
    def try_socket(name, *args):\n\
    \x20   try:\n\
    \x20       socket.socket(*args).close(); print(name, 'ok')\n\
    \x20   except OSError as e:\n\
    \x20       print(name, errno.errorcode.get(e.errno, e.errno))\n\
    try_socket('packet', socket.AF_PACKET, socket.SOCK_RAW, 0)\n\
    try_socket('raw-icmp', socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)\n\
    try_socket('raw-tcp', socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)\n\
    try_socket('raw-icmp6', socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)\n\
    try_socket('dgram-icmp', socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)\n\
    # An echo request over the ICMP datagram socket (the kernel sets id and checksum).\n\
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)\n\
    s.settimeout(10)\n\
    s.sendto(b'\\x08\\x00\\x00\\x00\\x00\\x00\\x00\\x01cowspace', ('127.0.0.1', 0))\n\
    reply = s.recv(64)\n\
    print('echo reply', reply[0] == 0 and reply.endswith(b'cowspace'))\n";

#[test]
fn sandbox_raw_and_packet_sockets_are_refused_but_ping_sockets_work() {
    require_root!();
    let s = Scratch::new();
    let out = run(s.command(
        "raw-box",
        &["--net", "loopback"],
        &[
            "/bin/sh",
            "-c",
            "\"$0\" -c \"$1\" && grep CapBnd /proc/self/status",
            PY,
            SOCKETS,
        ],
    ));
    let (code, stdout, stderr) = parts(&out);
    assert_eq!(code, Some(0), "{stdout} {stderr}");
    for refused in ["packet", "raw-icmp", "raw-tcp", "raw-icmp6"] {
        assert!(
            stdout.contains(&format!("{refused} EPERM\n")),
            "{refused}: {stdout} {stderr}"
        );
    }
    assert!(stdout.contains("dgram-icmp ok\n"), "{stdout} {stderr}");
    assert!(stdout.contains("echo reply True\n"), "{stdout} {stderr}");
    let bounding = stdout
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .map(|hex| u64::from_str_radix(hex.trim(), 16).unwrap())
        .unwrap();
    assert_eq!(
        bounding & (1 << 13),
        0,
        "CAP_NET_RAW in the bounding set: {bounding:x}"
    );
    // ping itself, when the host has it (through /usr).
    if std::path::Path::new("/usr/bin/ping").exists() || std::path::Path::new("/bin/ping").exists()
    {
        let out = run(s.command(
            "ping-box",
            &["--net", "loopback"],
            &["ping", "-c", "1", "-W", "10", "127.0.0.1"],
        ));
        let (code, stdout, stderr) = parts(&out);
        assert_eq!(code, Some(0), "{stdout} {stderr}");
        assert!(stdout.contains(" 1 received"), "{stdout} {stderr}");
    }

    // Asked for explicitly, CAP_NET_RAW stays.
    let out = run(s.command(
        "raw-optin",
        &["--net", "loopback", "--cap-net-raw"],
        &[PY, "-c", SOCKETS],
    ));
    let (code, stdout, stderr) = parts(&out);
    assert_eq!(code, Some(0), "{stdout} {stderr}");
    for allowed in ["packet", "raw-icmp", "raw-tcp", "dgram-icmp"] {
        assert!(
            stdout.contains(&format!("{allowed} ok\n")),
            "{allowed}: {stdout} {stderr}"
        );
    }
}

/// `sh -c` that opens host descriptors without close-on-exec, then execs the helper with
/// them: 7 the host root, 8 this test's scratch directory, 9 a file given as
/// `--ready-fd 9` (CVE-2024-21626: a host directory descriptor leaked into the container
/// reached the host through `/proc/self/fd/N`).
fn with_inherited_host_fds(s: &Scratch, name: &str, cmd: &[&str]) -> std::process::Command {
    let inner = s.command(name, &["--ready-fd", "9"], cmd);
    let mut c = std::process::Command::new("/bin/sh");
    c.arg("-c")
        .arg("exec 7</ 8<\"$1\" 9>\"$2\"; shift 2; exec \"$@\"")
        .arg("sh")
        .arg(s.dir.path())
        .arg(s.dir.path().join("ready.json"))
        .arg(inner.get_program())
        .args(inner.get_args())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    c
}

#[test]
fn sandbox_no_descriptor_of_the_helper_or_its_caller_reaches_the_command() {
    require_root!();
    let s = Scratch::new();
    std::fs::write(s.dir.path().join("host-only.txt"), "host").unwrap();
    // Every descriptor the command holds, what it is, and whether `..` from the working
    // directory leaves the sandbox's root.
    let script = "import os, stat\n\
        names = os.listdir('/proc/self/fd')\n\
        for n in sorted(names, key=int):\n\
        \x20   try:\n\
        \x20       st = os.stat('/proc/self/fd/' + n)\n\
        \x20       print('fd', n, 'dir' if stat.S_ISDIR(st.st_mode) else 'other', os.readlink('/proc/self/fd/' + n))\n\
        \x20   except OSError as e:\n\
        \x20       print('fd', n, 'gone', e.strerror)\n\
        print('cwd', os.readlink('/proc/self/cwd'), 'root', os.readlink('/proc/self/root'))\n\
        os.chdir('../../../../../../..')\n\
        print('up', sorted(os.listdir('.')) == sorted(os.listdir('/')), os.path.exists('host-only.txt'))\n";
    let out = run(with_inherited_host_fds(
        &s,
        "fd-box",
        &["/usr/bin/python3", "-c", script],
    ));
    let (code, stdout, stderr) = parts(&out);
    assert_eq!(code, Some(0), "{stdout} {stderr}");
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
    // The listing's own descriptor, closed by the time it is looked at.
    assert!(
        fds.iter().filter(|f| f[1] == "gone").count() <= 1,
        "{stdout}"
    );
    assert!(
        !fds.iter().any(|f| f[1] == "dir"),
        "a directory descriptor: {stdout}"
    );
    assert!(
        stdout.contains("cwd /workspace root /\n"),
        "working directory or root outside the view: {stdout}"
    );
    assert!(
        stdout.contains("up True False\n"),
        "`..` left the root: {stdout}"
    );
    // The ready line went to fd 9, which the command never held.
    let ready = std::fs::read_to_string(s.dir.path().join("ready.json")).unwrap();
    assert!(ready.contains("\"name\":\"fd-box\""), "{ready}");
}

#[test]
fn sandbox_proc_1_exe_root_and_cwd_do_not_reach_the_host() {
    require_root!();
    let s = Scratch::new();
    let helper = support::helper();
    let before = std::fs::read(helper).unwrap();
    // Pid 1 inside is the sandbox init: a clone of the helper, so its exe is the host's
    // helper binary (CVE-2019-5736 overwrote the host's runtime through /proc/PID/exe).
    let script = "import os\n\
        for l in ['exe', 'root', 'cwd']:\n\
        \x20   try: print(l, os.readlink('/proc/1/' + l))\n\
        \x20   except OSError as e: print(l, e.strerror)\n\
        for d in ['fd', 'map_files', 'root/']:\n\
        \x20   try: os.listdir('/proc/1/' + d); print(d, 'listed')\n\
        \x20   except OSError as e: print(d, e.strerror)\n\
        for name, flags in [('rd', os.O_RDONLY), ('wr', os.O_WRONLY), ('rw', os.O_RDWR), ('path', os.O_PATH)]:\n\
        \x20   try: os.close(os.open('/proc/1/exe', flags)); print('exe', name, 'opened')\n\
        \x20   except OSError as e: print('exe', name, e.strerror)\n\
        try: os.close(os.open('/proc/self/exe', os.O_WRONLY)); print('self-exe wr opened')\n\
        except OSError as e: print('self-exe wr', e.strerror)\n";
    let out = run(s.command("proc1-box", &[], &[PY, "-c", script]));
    let (code, stdout, stderr) = parts(&out);
    assert_eq!(code, Some(0), "{stdout} {stderr}");
    let denied = "Permission denied";
    for case in [
        "exe",
        "root",
        "cwd",
        "fd",
        "map_files",
        "root/",
        "exe rd",
        "exe wr",
        "exe rw",
        "exe path",
    ] {
        assert!(
            stdout.contains(&format!("{case} {denied}\n")),
            "{case}: {stdout} {stderr}"
        );
    }
    // The command's own binary is a host file too (through the read-only /usr).
    assert!(
        [
            "Permission denied",
            "Read-only file system",
            "Text file busy"
        ]
        .iter()
        .any(|e| stdout.contains(&format!("self-exe wr {e}\n"))),
        "{stdout}"
    );
    assert_eq!(
        std::fs::read(helper).unwrap(),
        before,
        "the helper binary changed"
    );
}
