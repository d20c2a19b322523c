//! `mountctl run --vm` end to end, as root, under whatever accelerator the host has (TCG
//! in CI, accepted with `--accept-emulation`): the command runs in the guest (its
//! kernel, its command line, a qemu process in a cgroup of its own for the run), its
//! stdout, stderr and exit status come back byte for byte, what it writes is what
//! `diff` and `commit` see; refusals start nothing; a `kill -9` of `mountctl` takes the
//! VM down and `sweep` leaves nothing.
//!
//! Few tests, because every boot under TCG costs seconds. Skips with a reason when not
//! root or when qemu, virtiofsd or the guest kernel are missing (`scripts/setup.sh`
//! installs them); fails instead under `CI=true`. Each test's runtime root ([`WsRoot`])
//! removes its workspaces and detaches leftover mounts when dropped; [`Bg`] kills a
//! background run; the VM's processes die with their helper.
//!
//! Run: `cargo build --workspace --bins && CI=true cargo test -p cowspace-tests --test e2e vm::`.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cowspace_tests::{mountctl_bin, write_file};
use serde_json::Value;

use crate::sandbox::support as sandbox_support;
use crate::workspaces::support::{WsRoot, kill9};

/// How long a test waits for something a VM does (a boot under TCG takes seconds).
pub(crate) const VM_WAIT: Duration = Duration::from_secs(120);

/// Skips (or fails under CI) when the host lacks what a VM run needs.
macro_rules! require_vm_ {
    () => {
        crate::workspaces::support::require_root!();
        let vm = crate::vm::doctor_vm();
        if vm["available"] != true {
            let why = format!("no VM placement here: {}", vm["missing"]);
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("vm e2e test cannot run under CI=true: {why}");
            }
            eprintln!("SKIPPED: {why}");
            return;
        }
    };
}
pub(crate) use require_vm_ as require_vm;

/// The `vm` row of `mountctl doctor --json` (in a throwaway root).
pub(crate) fn doctor_vm() -> Value {
    let r = WsRoot::new();
    let out = r.t.json(["doctor"]).ok();
    out.json()["vm"].clone()
}

/// A runtime root with one workspace `name` of `a.txt`, `d/x` (a name per test: the
/// tests run at once, and leftovers are found by name).
pub(crate) fn setup(name: &str) -> WsRoot {
    sandbox_support::helper();
    let r = WsRoot::new();
    let src = r.t.path("src");
    write_file(&src.join("a.txt"), "hello\n");
    write_file(&src.join("d/x"), "x\n");
    let snap = r.import(&src, &["--ref", "t/main"]);
    r.create(&snap, &["--name", name]);
    r
}

/// `mountctl --root ROOT run WS --vm ARGS...` (not started).
fn vm_cmd(r: &WsRoot, ws: &str, args: &[&str]) -> Command {
    let mut c = Command::new(mountctl_bin());
    c.arg("--root")
        .arg(r.root())
        .args(["run", ws, "--vm"])
        .args(args)
        .env("COWSPACE_SANDBOX_HELPER", sandbox_support::helper())
        .env_remove("COWSPACE_ROOT")
        .stdin(Stdio::null());
    c
}

/// The accelerator is software emulation here (the usual case: CI, this host).
pub(crate) fn emulated() -> bool {
    !Path::new("/sys/module/kvm_intel").exists() && !Path::new("/sys/module/kvm_amd").exists()
}

/// Host processes whose command line contains `needle`.
pub(crate) fn procs_with(needle: &str) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(c) = std::fs::read(e.path().join("cmdline")) {
            let text = String::from_utf8_lossy(&c).replace('\0', " ");
            if text.contains(needle) && pid != std::process::id() {
                out.push((pid, text));
            }
        }
    }
    out
}

/// What a VM run of root `r` leaves on the host: its qemu and virtiofsd processes, its
/// per-run directories, its cgroups.
pub(crate) fn vm_leftovers(r: &WsRoot, ws: &str) -> Vec<String> {
    let state = r.root().join("run/sandbox");
    let mut left: Vec<String> = procs_with(&state.display().to_string())
        .into_iter()
        .filter(|(_, c)| c.contains("qemu-system") || c.contains("virtiofsd"))
        .map(|(p, c)| format!("process {p}: {c}"))
        .collect();
    if let Ok(d) = std::fs::read_dir(state.join("vm")) {
        left.extend(
            d.flatten()
                .map(|e| format!("run dir {}", e.path().display())),
        );
    }
    for h in ["/sys/fs/cgroup/cowspace", "/sys/fs/cgroup/memory/cowspace"] {
        if let Ok(d) = std::fs::read_dir(h) {
            left.extend(
                d.flatten()
                    .filter(|e| {
                        e.file_name()
                            .to_string_lossy()
                            .starts_with(&format!("vm-{ws}."))
                    })
                    .map(|e| format!("cgroup {}", e.path().display())),
            );
        }
    }
    left
}

/// A `mountctl run --vm` in the background, killed and reaped when dropped.
struct Bg(Option<Child>);

impl Bg {
    fn pid(&self) -> u32 {
        self.0.as_ref().map_or(0, Child::id)
    }
    fn wait(&mut self) -> std::process::Output {
        let mut c = self.0.take().expect("running");
        let deadline = Instant::now() + VM_WAIT;
        while c.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = c.kill();
                panic!("the VM run did not end within {VM_WAIT:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        c.wait_with_output().unwrap()
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

/// Waits until a qemu of root `r` runs; gives its pid and command line.
fn wait_for_qemu(r: &WsRoot, bg: &mut Bg) -> (u32, String) {
    let state = r.root().join("run/sandbox").display().to_string();
    let deadline = Instant::now() + VM_WAIT;
    loop {
        if let Some(q) = procs_with(&state).into_iter().find(|(_, c)| {
            c.starts_with("/usr/bin/qemu-system") || c.contains("qemu-system-x86_64 ")
        }) {
            return q;
        }
        if let Some(st) = bg.0.as_mut().unwrap().try_wait().unwrap() {
            let out = bg.0.take().unwrap().wait_with_output().unwrap();
            panic!(
                "the run ended ({st}) before a qemu was seen: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        assert!(Instant::now() < deadline, "no qemu within {VM_WAIT:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The guest's command ($1 a nonce, $2 the runtime root, $3 the test's host pid):
/// identity, the nonce, whether the host's root or processes show, binary output on both
/// streams, the three
/// kinds of change, then it waits for the host's `go` file (so the test sees qemu
/// running) and exits 3.
const GUEST: &str = concat!(
    "uname -r; cat /proc/cmdline; echo \"nonce=$1\"; echo \"env=$COWSPACE_T\"; ",
    "awk '/MemTotal/ {print $2}' /proc/meminfo; ",
    "for p in \"$2\" \"$2/registry.db\"; do [ -e \"$p\" ] && echo \"VISIBLE $p\"; done; ",
    "grep -qs e2e /proc/$3/cmdline && echo \"VISIBLE host pid $3\"; ",
    "printf 'bin\\000\\001\\377\\n'; printf 'to-stderr\\000\\n' >&2; ",
    "printf 'new\\000\\377' > new.bin; echo more >> a.txt; rm d/x; ",
    "until [ -e go ]; do sleep 0.05; done; rm go; exit 3",
);

#[test]
fn vm_run_is_in_the_guest_and_its_writes_are_the_workspace_s() {
    const WS: &str = "vmguest";
    require_vm!();
    let r = setup(WS);
    let path = r.status(WS)["path"].as_str().unwrap().to_string();
    let root = r.root().canonicalize().unwrap().display().to_string();
    let me = std::process::id().to_string();
    let nonce = format!("{:x}", std::process::id() as u64 * 7919 + 0xc0ffee);
    let mut c = vm_cmd(
        &r,
        WS,
        &[
            "--accept-emulation",
            "--memory=320m",
            "--env=COWSPACE_T=it's \"quoted\" $x",
            "--",
            "sh",
            "-c",
            GUEST,
            "sh",
            &nonce,
            &root,
            &me,
        ],
    );
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut bg = Bg(Some(c.spawn().expect("start mountctl run --vm")));
    // A qemu runs for this run, in a cgroup of its own with a memory limit.
    let (qemu, cmdline) = wait_for_qemu(&r, &mut bg);
    assert!(cmdline.contains("microvm"), "{cmdline}");
    assert!(
        !cmdline.contains(&nonce),
        "the nonce went by the command line: {cmdline}"
    );
    let cg = std::fs::read_to_string(format!("/proc/{qemu}/cgroup")).unwrap();
    // In the memory controller's hierarchy (v1) or the unified one (v2), with a limit.
    let mine = format!("/cowspace/vm-{WS}.");
    let line = cg
        .lines()
        .find(|l| (l.contains(":memory:") || l.starts_with("0::")) && l.contains(&mine))
        .unwrap_or_else(|| panic!("qemu is not in the run's memory cgroup: {cg}"));
    let rel = line.splitn(3, ':').nth(2).unwrap();
    let limit = ["memory/", ""]
        .iter()
        .find_map(|h| {
            let d = Path::new("/sys/fs/cgroup").join(h).join(&rel[1..]);
            std::fs::read_to_string(d.join("memory.limit_in_bytes"))
                .or_else(|_| std::fs::read_to_string(d.join("memory.max")))
                .ok()
        })
        .unwrap_or_else(|| panic!("no memory limit for {line}"));
    assert!(limit.trim().parse::<u64>().unwrap() >= 256 << 20, "{limit}");
    // qemu has no network namespace of the host's.
    assert_ne!(
        std::fs::read_link(format!("/proc/{qemu}/ns/net")).unwrap(),
        std::fs::read_link("/proc/self/ns/net").unwrap(),
        "qemu runs in the host's network namespace"
    );
    write_file(&Path::new(&path).join("go"), "");
    let out = bg.wait();
    let stdout = out.stdout.clone();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(3), "stderr: {stderr}");
    let text = String::from_utf8_lossy(&stdout).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.len() >= 6, "stdout {text:?}\nstderr {stderr}");
    // The guest's kernel and command line, not the host's.
    let host_kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let guest_kernel = doctor_vm()["kernel"]["version"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(lines[0], guest_kernel);
    assert_ne!(lines[0], host_kernel.trim());
    let host_cmdline = std::fs::read_to_string("/proc/cmdline").unwrap();
    assert!(
        lines[1].contains("rdinit=/init") && lines[1].contains("reboot=t"),
        "{}",
        lines[1]
    );
    assert_ne!(lines[1], host_cmdline.trim());
    assert_eq!(lines[2], format!("nonce={nonce}"));
    // Byte for byte, each stream on its own.
    // --env passed as given, --memory the guest's RAM (less what the kernel keeps).
    assert_eq!(lines[3], "env=it's \"quoted\" $x");
    let kib: u64 = lines[4].parse().unwrap();
    assert!(kib <= 320 << 10 && kib > 256 << 10, "MemTotal {kib} KiB");
    let tail = format!("{}\nbin\0\x01", lines[..5].join("\n"));
    assert!(stdout.starts_with(tail.as_bytes()));
    assert!(stdout.ends_with(b"\x01\xff\n"), "{stdout:?}");
    let own: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.starts_with("sandbox-helper: "))
        .collect();
    assert_eq!(own, ["to-stderr\0"], "{stderr}");
    assert!(
        stderr.contains("isolation: needs_validation") || !emulated(),
        "{stderr}"
    );
    assert!(!text.contains("to-stderr"));
    assert!(!text.contains("VISIBLE"), "{text}");
    // What the guest wrote is the workspace's, exactly.
    assert_eq!(
        std::fs::read(Path::new(&path).join("new.bin")).unwrap(),
        b"new\0\xff"
    );
    assert_eq!(
        std::fs::read_to_string(Path::new(&path).join("a.txt")).unwrap(),
        "hello\nmore\n"
    );
    let diff = r.t.run(["diff", WS]).ok();
    assert_eq!(diff.stdout, "M a.txt\nD d/x\nA new.bin\n");
    let (snap, _, _) = r.commit(WS, &[]);
    let show = r.t.run(["show", &snap]).ok();
    assert!(
        show.stdout.contains("new.bin") && !show.stdout.contains(" d/x"),
        "{}",
        show.stdout
    );
    assert_eq!(vm_leftovers(&r, WS), Vec::<String>::new());
    r.remove(WS);
    r.assert_clean();
}

#[test]
fn vm_refusals_start_nothing() {
    const WS: &str = "vmrefuse";
    require_vm!();
    let r = setup(WS);
    let refused = |c: &mut Command| {
        let o = c.output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(o.status.code(), Some(7), "{err}");
        assert_eq!(o.stdout, b"", "{err}");
        assert!(
            !r.root().join("cache/vm").exists(),
            "an initramfs was built: {err}"
        );
        assert_eq!(vm_leftovers(&r, WS), Vec::<String>::new());
        err
    };
    if emulated() {
        // Software emulation is no isolation boundary: refused unless accepted.
        let err = refused(&mut vm_cmd(&r, WS, &["--", "touch", "ran"]));
        assert!(
            err.contains("TCG") && err.contains("--accept-emulation"),
            "{err}"
        );
    }
    // A missing guest kernel is named, with the command that installs it.
    let missing = r.t.path("no-such-vmlinuz-1.0");
    let err = refused(
        vm_cmd(&r, WS, &["--accept-emulation", "--", "touch", "ran"])
            .env("COWSPACE_VM_KERNEL", &missing),
    );
    assert!(
        err.contains(&missing.display().to_string()) && err.contains("setup.sh"),
        "{err}"
    );
    // So is a missing qemu.
    let err = refused(
        vm_cmd(&r, WS, &["--accept-emulation", "--", "touch", "ran"])
            .env("COWSPACE_VM_QEMU", r.t.path("no-qemu")),
    );
    assert!(
        err.contains("qemu") && err.contains("apt-get install qemu-system-x86"),
        "{err}"
    );
    // --pids with a guest kernel that has no pids controller is refused, naming why.
    let kdir = r.t.path("kernel");
    std::fs::create_dir_all(kdir.join("lib/modules/9.9-nopids/kernel")).unwrap();
    cowspace_tests::write_file(&kdir.join("boot/vmlinuz-9.9-nopids"), "not a kernel");
    cowspace_tests::write_file(
        &kdir.join("boot/config-9.9-nopids"),
        "CONFIG_CGROUPS=y\n# CONFIG_CGROUP_PIDS is not set\n",
    );
    let err = refused(
        vm_cmd(
            &r,
            WS,
            &["--accept-emulation", "--pids", "64", "--", "touch", "ran"],
        )
        .env("COWSPACE_VM_KERNEL", kdir.join("boot/vmlinuz-9.9-nopids")),
    );
    assert!(
        err.contains("--pids") && err.contains("CONFIG_CGROUP_PIDS"),
        "{err}"
    );
    let path = r.status(WS)["path"].as_str().unwrap().to_string();
    assert!(
        !Path::new(&path).join("ran").exists(),
        "a refused command ran"
    );
    assert_eq!(r.t.run(["diff", WS]).ok().stdout, "");
    r.remove(WS);
    r.assert_clean();
}

#[test]
fn vm_run_killed_takes_its_vm_down_and_sweep_leaves_nothing() {
    const WS: &str = "vmkill";
    require_vm!();
    let r = setup(WS);
    let mut c = vm_cmd(
        &r,
        WS,
        &[
            "--accept-emulation",
            "--",
            "sh",
            "-c",
            "until [ -e go ]; do sleep 0.05; done",
        ],
    );
    c.stdout(Stdio::null()).stderr(Stdio::piped());
    let mut bg = Bg(Some(c.spawn().expect("start mountctl run --vm")));
    let (qemu, _) = wait_for_qemu(&r, &mut bg);
    let helper = r.status(WS)["sandbox_pid"]
        .as_u64()
        .expect("the run's helper");
    kill9(bg.pid());
    let _ = bg.wait();
    // The helper got SIGTERM when its caller died and ended the VM.
    let deadline = Instant::now() + VM_WAIT;
    let gone = |pid: u64| !Path::new(&format!("/proc/{pid}")).exists();
    while !(gone(qemu.into()) && gone(helper)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(gone(qemu.into()), "qemu {qemu} outlived its run");
    assert!(gone(helper), "the helper {helper} outlived its run");
    r.t.run(["sweep"]).ok();
    let deadline = Instant::now() + VM_WAIT;
    while !vm_leftovers(&r, WS).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(vm_leftovers(&r, WS), Vec::<String>::new());
    assert!(r.status(WS)["sandbox_pid"].is_null(), "{}", r.status(WS));
    r.remove(WS);
    r.assert_clean();
}
