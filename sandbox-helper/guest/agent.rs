//! `cowspace-guest-agent`: pid 1 of a cowspace VM once `/init` has loaded the modules
//! and mounted the workspace. It serves the host's end of one virtio-serial port (the
//! path in its first argument) and nothing else: no process reaches it but the host's
//! keeper through qemu. Only in a `--net egress` VM does it listen, on the guest's own
//! 127.0.0.1, for the egress proxy it relays to the host (`net.rs`).
//!
//! The frames are [`proto`]'s (the keeper's own definitions, compiled into this binary
//! too). For each `EXEC` it starts the command with three pipes (or, for `-t`, a
//! pseudo-terminal of the guest's devpts, the command its session leader) and copies
//! them to and from frames of that exec's stream, within the credit the other side
//! gives; it reaps
//! every process (orphans come to pid 1) and sends `EXIT` once the command ended and its
//! output was read to its end (or [`OUTPUT_DRAIN_MS`] passed, for output pipes kept
//! open by processes it left in the background, which keep running). `SHUTDOWN` kills
//! every process, unmounts the workspace, answers `BYE` and powers the VM off.
//!
//! Standard library only, linked statically (`-C target-feature=+crt-static`) by the
//! helper's build script; the helper carries the binary and puts it in the initramfs.

#[path = "../src/vm/proto.rs"]
#[allow(dead_code)]
mod proto;

#[path = "../src/vm/netrelay.rs"]
#[allow(dead_code)]
mod netrelay;

mod net;

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use proto::{
    ExecMsg, Frame, MAX_DATA_BYTES, WINDOW_BYTES, kind, parse_mount, parse_secret, parse_size,
};

/// How long an exec's output pipes are still read after its process ended, before
/// `EXIT` is sent anyway (a background process may hold them for ever).
const OUTPUT_DRAIN_MS: u64 = 200;
/// Most execs running at once.
const MAX_EXECS: usize = 1024;
/// How long `SHUTDOWN` waits for killed processes to let go of the workspace.
const SHUTDOWN_WAIT_MS: u64 = 2_000;
/// Where the workspace is mounted.
const WORKSPACE: &str = "/workspace";
/// Where secrets are (a tmpfs of their own, read-only once they are written).
const SECRETS: &str = "/run/secrets";
/// The `cgroup.procs` of the cgroup every exec joins under `--pids` (made by `/init`).
const SANDBOX_CGROUP: &str = "/sys/fs/cgroup/sandbox/cgroup.procs";
/// The size of the secrets' tmpfs.
const SECRETS_TMPFS: &str = "mode=0700,size=8m";

/// The only `unsafe` code: the few libc calls std has no safe form of.
#[allow(unsafe_code)]
mod sys {
    use std::ffi::{CString, c_char, c_int};

    unsafe extern "C" {
        fn waitpid(pid: c_int, status: *mut c_int, options: c_int) -> c_int;
        fn kill(pid: c_int, sig: c_int) -> c_int;
        fn sync();
        fn umount2(target: *const c_char, flags: c_int) -> c_int;
        fn reboot(howto: c_int) -> c_int;
        fn write(fd: c_int, buf: *const std::ffi::c_void, count: usize) -> isize;
        fn mount(
            source: *const c_char,
            target: *const c_char,
            fstype: *const c_char,
            flags: std::ffi::c_ulong,
            data: *const std::ffi::c_void,
        ) -> c_int;
    }

    unsafe extern "C" {
        fn ioctl(fd: c_int, request: std::ffi::c_ulong, ...) -> c_int;
        fn setsid() -> c_int;
    }

    const TIOCSPTLCK: std::ffi::c_ulong = 0x4004_5431;
    const TIOCGPTN: std::ffi::c_ulong = 0x8004_5430;
    const TIOCSWINSZ: std::ffi::c_ulong = 0x5414;
    const TIOCSCTTY: std::ffi::c_ulong = 0x540E;
    const O_NOCTTY: i32 = 0o400;

    /// A new pseudo-terminal of the guest's devpts, of this size: (master, slave).
    pub fn open_pty(rows: u16, cols: u16) -> std::io::Result<(std::fs::File, std::fs::File)> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::OpenOptionsExt;
        let open = |path: &str| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(O_NOCTTY)
                .open(path)
        };
        let master = open("/dev/ptmx")?;
        let mut unlock: c_int = 0;
        let mut n: u32 = 0;
        // SAFETY: TIOCSPTLCK reads one int and TIOCGPTN writes one unsigned int, each
        // through a pointer to a live local of that type.
        unsafe {
            if ioctl(master.as_raw_fd(), TIOCSPTLCK, &mut unlock as *mut c_int) != 0
                || ioctl(master.as_raw_fd(), TIOCGPTN, &mut n as *mut u32) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
        }
        let slave = open(&format!("/dev/pts/{n}"))?;
        set_size(&master, rows, cols)?;
        Ok((master, slave))
    }

    /// Sets a terminal's window size (`TIOCSWINSZ`; the foreground gets `SIGWINCH`).
    pub fn set_size(tty: &std::fs::File, rows: u16, cols: u16) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        let ws: [u16; 4] = [rows, cols, 0, 0];
        // SAFETY: TIOCSWINSZ reads one `struct winsize` (four u16) from the pointer,
        // which points at `ws`.
        if unsafe { ioctl(tty.as_raw_fd(), TIOCSWINSZ, ws.as_ptr()) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Has `cmd`'s child start a session whose controlling terminal is its stdin (the
    /// pseudo-terminal's slave), so Ctrl-C and job control work as on a terminal.
    pub fn session_on_stdin(cmd: &mut std::process::Command) {
        use std::os::unix::process::CommandExt;
        // SAFETY: the closure runs between fork and exec and calls only setsid(2) and
        // ioctl(2) on descriptor 0, both async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                if setsid() < 0 || ioctl(0, TIOCSCTTY, 0 as c_int) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }

    const MS_RDONLY: std::ffi::c_ulong = 1;
    const MS_NOSUID: std::ffi::c_ulong = 2;
    const MS_NODEV: std::ffi::c_ulong = 4;
    const MS_NOEXEC: std::ffi::c_ulong = 8;
    const MS_REMOUNT: std::ffi::c_ulong = 32;

    /// A tmpfs at `target` (nosuid, nodev, noexec) with `opts`; true when mounted.
    pub fn mount_tmpfs(target: &str, opts: &str) -> bool {
        let (Ok(t), Ok(o), Ok(fs)) = (
            CString::new(target),
            CString::new(opts),
            CString::new("tmpfs"),
        ) else {
            return false;
        };
        // SAFETY: every pointer is a NUL-terminated string that outlives the call.
        unsafe {
            mount(
                fs.as_ptr(),
                t.as_ptr(),
                fs.as_ptr(),
                MS_NOSUID | MS_NODEV | MS_NOEXEC,
                o.as_ptr().cast(),
            ) == 0
        }
    }

    /// Mounts virtio-fs `tag` read-only (nosuid, nodev) at `target`; true when mounted.
    pub fn mount_virtiofs_ro(tag: &str, target: &str) -> bool {
        let (Ok(t), Ok(d), Ok(fs)) = (
            CString::new(target),
            CString::new(tag),
            CString::new("virtiofs"),
        ) else {
            return false;
        };
        // SAFETY: every pointer is a NUL-terminated string that outlives the call; the
        // data pointer is null.
        unsafe {
            mount(
                d.as_ptr(),
                t.as_ptr(),
                fs.as_ptr(),
                MS_RDONLY | MS_NOSUID | MS_NODEV,
                std::ptr::null(),
            ) == 0
        }
    }

    /// Remounts the tmpfs at `target` read-only; true when done.
    pub fn remount_read_only(target: &str) -> bool {
        let Ok(t) = CString::new(target) else {
            return false;
        };
        // SAFETY: `t` is a NUL-terminated string that outlives the call; the other
        // pointers are null, which remount takes.
        unsafe {
            mount(
                std::ptr::null(),
                t.as_ptr(),
                std::ptr::null(),
                MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                std::ptr::null(),
            ) == 0
        }
    }

    /// Waits for any child: (pid, status as a shell reports it: the exit code, or 128 +
    /// the signal), or the errno.
    pub fn wait_any() -> Result<(i32, i32), i32> {
        let mut st: c_int = 0;
        // SAFETY: `st` is a valid, writable c_int for the call's duration.
        let pid = unsafe { waitpid(-1, &mut st, 0) };
        if pid < 0 {
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
        }
        let sig = st & 0x7f;
        let code = if sig == 0 {
            (st >> 8) & 0xff
        } else {
            128 + sig
        };
        Ok((pid, code))
    }

    /// `kill(2)`; errors are ignored (the process may have ended).
    pub fn signal(pid: i32, sig: i32) {
        // SAFETY: plain system call on integers.
        unsafe {
            kill(pid, sig);
        }
    }

    /// `sync(2)`.
    pub fn sync_all() {
        // SAFETY: no arguments.
        unsafe { sync() }
    }

    /// `umount2(2)`: true when unmounted.
    pub fn unmount(path: &str) -> bool {
        let Ok(c) = CString::new(path) else {
            return false;
        };
        // SAFETY: `c` is a NUL-terminated string that outlives the call.
        unsafe { umount2(c.as_ptr(), 0) == 0 }
    }

    /// Has `cmd`'s child join the cgroup whose `cgroup.procs` is `procs` before it
    /// execs (so every process it starts counts against that cgroup's limits); a
    /// refused write fails the spawn.
    pub fn join_cgroup_on_exec(cmd: &mut std::process::Command, procs: &std::fs::File) {
        use std::os::fd::AsRawFd;
        use std::os::unix::process::CommandExt;
        let fd = procs.as_raw_fd();
        // SAFETY: the closure runs between fork and exec and calls only write(2), on an
        // fd the agent keeps open for its whole life, from a static buffer.
        unsafe {
            cmd.pre_exec(move || {
                let zero = b"0";
                if write(fd, zero.as_ptr().cast(), zero.len()) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }

    /// `reboot(RB_AUTOBOOT)`: with `reboot=t` and qemu's `-no-reboot`, qemu exits.
    pub fn restart() -> ! {
        // SAFETY: plain system call; it does not return when it succeeds.
        unsafe {
            reboot(0x0123_4567);
        }
        std::process::exit(1)
    }
}

/// The credit of one exec's output, and whether its `EXIT` was sent.
#[derive(Default)]
struct Credit {
    state: Mutex<(u64, bool)>,
    cv: Condvar,
}

/// What the agent knows of one running exec.
struct Exec {
    pid: i32,
    stdin: Option<Sender<Option<Vec<u8>>>>,
    credit: Arc<Credit>,
    readers: Arc<(Mutex<u32>, Condvar)>,
    /// The pseudo-terminal's master, for an exec started with one.
    terminal: Option<Arc<File>>,
}

struct Agent {
    port: Mutex<File>,
    /// `cgroup.procs` of the sandbox's cgroup (`--pids`), which every exec joins.
    cgroup: Option<File>,
    execs: Mutex<HashMap<u32, Exec>>,
    /// Signalled when a child is started (the reaper waits for one when there is none).
    started: Condvar,
    /// `--net egress`: the relay of the guest's connections to the host's proxy.
    net: std::sync::OnceLock<Arc<net::Net>>,
}

impl Agent {
    fn send(&self, f: &Frame) {
        let mut p = self.port.lock().unwrap_or_else(|e| e.into_inner());
        // A write fails only when qemu is gone, and then so is this VM.
        let _ = f.write_to(&mut *p);
    }
}

fn main() {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("cowspace-guest-agent: usage: cowspace-guest-agent PORT");
        std::process::exit(2);
    };
    let port = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
    {
        Ok(f) => f,
        Err(e) => {
            eprintln!("cowspace-guest-agent: {path}: {e}");
            std::process::exit(1);
        }
    };
    let mut input = port.try_clone().expect("clone the port");
    // Made by /init when the VM has `--pids`; its absence then is /init's failure.
    let cgroup = std::fs::OpenOptions::new()
        .write(true)
        .open(SANDBOX_CGROUP)
        .ok();
    let agent = Arc::new(Agent {
        port: Mutex::new(port),
        cgroup,
        execs: Mutex::new(HashMap::new()),
        started: Condvar::new(),
        net: std::sync::OnceLock::new(),
    });
    {
        let agent = agent.clone();
        std::thread::spawn(move || reap(&agent));
    }
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    // The first write blocks until the host has connected to its end.
    agent.send(&Frame::new(
        0,
        kind::READY,
        release.trim().as_bytes().to_vec(),
    ));
    loop {
        match Frame::read_from(&mut input) {
            Ok(Some(f)) => handle(&agent, f),
            // The host's end is not connected (for a moment, or qemu is going).
            Ok(None) | Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

fn handle(agent: &Arc<Agent>, f: Frame) {
    if f.stream >= proto::GUEST_STREAM_BASE {
        net::handle(agent, f);
        return;
    }
    match f.kind {
        kind::EXEC => start(agent, f.stream, &f.payload),
        kind::STDIN | kind::STDIN_EOF => {
            let mut execs = agent.execs.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(e) = execs.get_mut(&f.stream) {
                if f.kind == kind::STDIN {
                    if let Some(tx) = &e.stdin {
                        let _ = tx.send(Some(f.payload));
                    }
                } else if let Some(tx) = e.stdin.take() {
                    let _ = tx.send(None);
                }
            }
        }
        kind::SIGNAL => {
            let execs = agent.execs.lock().unwrap_or_else(|e| e.into_inner());
            if let (Some(e), Some(sig)) = (execs.get(&f.stream), f.as_i32())
                && e.pid > 0
            {
                sys::signal(e.pid, sig);
            }
        }
        kind::WINDOW => {
            let execs = agent.execs.lock().unwrap_or_else(|e| e.into_inner());
            if let (Some(e), Some(n)) = (execs.get(&f.stream), f.as_i32()) {
                let mut s = e.credit.state.lock().unwrap_or_else(|e| e.into_inner());
                s.0 += u64::from(n as u32);
                e.credit.cv.notify_all();
            }
        }
        kind::RESIZE => {
            let execs = agent.execs.lock().unwrap_or_else(|e| e.into_inner());
            if let (Some(t), Some((rows, cols))) = (
                execs.get(&f.stream).and_then(|e| e.terminal.as_ref()),
                parse_size(&f.payload),
            ) {
                let _ = sys::set_size(t, rows, cols);
            }
        }
        kind::SHUTDOWN => shutdown(agent),
        kind::NET_EGRESS => net::start(agent, &f.payload),
        kind::SECRET => put_secret(&f.payload),
        kind::MOUNT_RO => {
            if let Some((tag, target)) = parse_mount(&f.payload) {
                let made = target.starts_with('/')
                    && std::fs::create_dir_all(&target).is_ok()
                    && sys::mount_virtiofs_ro(&tag, &target);
                if !made {
                    eprintln!("cowspace-guest-agent: mounting {tag} at {target} failed");
                }
            }
        }
        kind::SEAL_SECRETS if !sys::remount_read_only(SECRETS) => {
            eprintln!("cowspace-guest-agent: remounting {SECRETS} read-only failed");
        }
        _ => {}
    }
}

/// Appends a piece of a secret to its file (the tmpfs made at the first).
fn put_secret(payload: &[u8]) {
    use std::os::unix::fs::OpenOptionsExt;
    let Some((name, bytes)) = parse_secret(payload) else {
        return;
    };
    // The host checked the name; a slash or a dot start would leave the directory.
    if name.is_empty() || name.starts_with('.') || name.contains('/') {
        return;
    }
    let dir = std::path::Path::new(SECRETS);
    if !dir.is_dir() {
        let made = std::fs::create_dir_all(dir).is_ok() && sys::mount_tmpfs(SECRETS, SECRETS_TMPFS);
        if !made {
            eprintln!("cowspace-guest-agent: making {SECRETS} failed");
            return;
        }
    }
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o400)
        .open(dir.join(&name))
        .and_then(|mut f| f.write_all(bytes));
    if let Err(e) = written {
        eprintln!("cowspace-guest-agent: {SECRETS}/{name}: {e}");
    }
}

fn failed(agent: &Agent, stream: u32, errno: i32, what: u8) {
    let mut p = errno.to_le_bytes().to_vec();
    p.push(what);
    agent.send(&Frame::new(stream, kind::FAILED, p));
}

fn start(agent: &Arc<Agent>, stream: u32, payload: &[u8]) {
    let Some(m) = ExecMsg::decode(payload) else {
        return failed(agent, stream, 22, 2);
    };
    if m.argv.is_empty() || m.argv.iter().any(|a| a.contains('\0')) {
        return failed(agent, stream, 22, 2);
    }
    if !std::path::Path::new(&m.workdir).is_dir() {
        return failed(agent, stream, 2, 1);
    }
    let mut execs = agent.execs.lock().unwrap_or_else(|e| e.into_inner());
    if execs.len() >= MAX_EXECS || execs.contains_key(&stream) {
        drop(execs);
        return failed(agent, stream, 11, 2);
    }
    let mut cmd = Command::new(&m.argv[0]);
    if let Some(procs) = &agent.cgroup {
        sys::join_cgroup_on_exec(&mut cmd, procs);
    }
    cmd.args(&m.argv[1..])
        .env_clear()
        .envs(m.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&m.workdir);
    let mut terminal = None;
    if let Some((rows, cols)) = m.tty {
        let slave = match sys::open_pty(rows, cols) {
            Ok((master, slave)) => {
                terminal = Some(master);
                slave
            }
            Err(e) => {
                drop(execs);
                return failed(agent, stream, e.raw_os_error().unwrap_or(5), 2);
            }
        };
        let (Ok(a), Ok(b)) = (slave.try_clone(), slave.try_clone()) else {
            drop(execs);
            return failed(agent, stream, 24, 2);
        };
        cmd.stdin(Stdio::from(a))
            .stdout(Stdio::from(b))
            .stderr(Stdio::from(slave));
        sys::session_on_stdin(&mut cmd);
    } else {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
    }
    let spawned = cmd.spawn();
    // The slave's copies are the child's now: its master reads end when they close.
    drop(cmd);
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            drop(execs);
            return failed(agent, stream, e.raw_os_error().unwrap_or(2), 0);
        }
    };
    let pid = child.id() as i32;
    let credit = Arc::new(Credit {
        state: Mutex::new((WINDOW_BYTES, false)),
        cv: Condvar::new(),
    });
    let (tx, rx) = channel();
    // Output comes from two pipes, or from one terminal (which counts as both readers).
    type Streams = (Box<dyn Write + Send>, Vec<(Box<dyn Read + Send>, u8)>, u32);
    let streams: Streams = match &terminal {
        None => (
            Box::new(child.stdin.take().expect("piped stdin")),
            vec![
                (
                    Box::new(child.stdout.take().expect("piped stdout")),
                    kind::STDOUT,
                ),
                (
                    Box::new(child.stderr.take().expect("piped stderr")),
                    kind::STDERR,
                ),
            ],
            0,
        ),
        Some(master) => {
            let (Ok(w), Ok(r)) = (master.try_clone(), master.try_clone()) else {
                sys::signal(pid, 9);
                drop(execs);
                return failed(agent, stream, 24, 2);
            };
            (Box::new(w), vec![(Box::new(r), kind::STDOUT)], 1)
        }
    };
    let (stdin, outputs, done_readers) = streams;
    let readers = Arc::new((Mutex::new(done_readers), Condvar::new()));
    execs.insert(
        stream,
        Exec {
            pid,
            stdin: Some(tx),
            credit: credit.clone(),
            readers: readers.clone(),
            terminal: terminal.map(Arc::new),
        },
    );
    // Sent before the reaper can see the exit (it needs this lock).
    agent.send(&Frame::int(stream, kind::STARTED, pid));
    drop(execs);
    agent.started.notify_all();
    // The child is reaped by `reap` (waitpid of any child), not through `child`.
    drop(child);
    {
        let agent = agent.clone();
        std::thread::spawn(move || feed_stdin(&agent, stream, stdin, rx));
    }
    for (mut r, k) in outputs {
        let (agent, credit, readers) = (agent.clone(), credit.clone(), readers.clone());
        std::thread::spawn(move || {
            let mut buf = vec![0u8; MAX_DATA_BYTES];
            loop {
                let n = match r.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                let mut s = credit.state.lock().unwrap_or_else(|e| e.into_inner());
                while s.0 < n as u64 && !s.1 {
                    s = credit.cv.wait(s).unwrap_or_else(|e| e.into_inner());
                }
                if s.1 {
                    // The exec's EXIT is sent: what its background processes write
                    // now is read and dropped, so they never block on a full pipe.
                    continue;
                }
                s.0 -= n as u64;
                // Sent under the credit lock, so it cannot follow the exec's EXIT.
                agent.send(&Frame::new(stream, k, buf[..n].to_vec()));
                drop(s);
            }
            let (done, cv) = &*readers;
            *done.lock().unwrap_or_else(|e| e.into_inner()) += 1;
            cv.notify_all();
        });
    }
}

/// Writes what the host sends for the exec's stdin, giving the credit back as it goes.
fn feed_stdin(
    agent: &Agent,
    stream: u32,
    mut stdin: Box<dyn Write + Send>,
    rx: std::sync::mpsc::Receiver<Option<Vec<u8>>>,
) {
    let mut open = true;
    while let Ok(Some(data)) = rx.recv() {
        if open && stdin.write_all(&data).is_err() {
            // The command closed its stdin: the rest is dropped, credit still given.
            open = false;
        }
        agent.send(&Frame::int(stream, kind::WINDOW, data.len() as i32));
    }
}

/// Reaps every child; for an exec's process, sends its `EXIT` once its output is read.
fn reap(agent: &Arc<Agent>) {
    loop {
        let (pid, code) = match sys::wait_any() {
            Ok(x) => x,
            Err(_) => {
                // No child at all: wait for the next start.
                let execs = agent.execs.lock().unwrap_or_else(|e| e.into_inner());
                let _ = agent
                    .started
                    .wait_timeout(execs, Duration::from_millis(500));
                continue;
            }
        };
        let mut execs = agent.execs.lock().unwrap_or_else(|e| e.into_inner());
        let Some((&stream, e)) = execs.iter_mut().find(|(_, e)| e.pid == pid) else {
            continue;
        };
        // Kept (its output may still need credit) but never signalled again: the pid
        // may be reused.
        e.pid = 0;
        let (credit, readers) = (e.credit.clone(), e.readers.clone());
        drop(execs);
        let agent = agent.clone();
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_millis(OUTPUT_DRAIN_MS);
            let (done, cv) = &*readers;
            let mut n = done.lock().unwrap_or_else(|e| e.into_inner());
            while *n < 2 {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                n = cv
                    .wait_timeout(n, left)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            drop(n);
            // Marked under the credit lock: no output frame of this exec follows EXIT.
            let mut s = credit.state.lock().unwrap_or_else(|e| e.into_inner());
            s.1 = true;
            agent.send(&Frame::int(stream, kind::EXIT, code));
            drop(s);
            credit.cv.notify_all();
            agent
                .execs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&stream);
        });
    }
}

/// Ends every process, unmounts the workspace (so all it wrote is on the host), says
/// `BYE` and powers off.
fn shutdown(agent: &Agent) -> ! {
    sys::signal(-1, 9);
    let deadline = Instant::now() + Duration::from_millis(SHUTDOWN_WAIT_MS);
    sys::sync_all();
    while !sys::unmount(WORKSPACE) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    sys::sync_all();
    agent.send(&Frame::new(0, kind::BYE, Vec::new()));
    sys::restart()
}
