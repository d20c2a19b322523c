//! The host's end of the guest agent's channel ([`super::proto`] over qemu's Unix socket
//! of the `cowspace.agent` port): one reader thread dispatches the guest's frames to
//! the execs they belong to; each exec has a thread that writes its output to the
//! client's descriptors (and gives the guest credit back), and one that sends its stdin.
//! [`VmBackend`] puts it behind the keeper ([`crate::keeper`]), so `exec`, `status` and
//! `stop` of a VM sandbox are the keeper protocol a namespace sandbox speaks.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use super::proto::{
    ExecMsg, Frame, GUEST_STREAM_BASE, MAX_DATA_BYTES, WINDOW_BYTES, kind, size_payload,
};
use crate::keeper::{Backend, InitMsg};
use crate::serve::ExecRequest;

/// How long `stop` waits for the guest to shut down before qemu is killed.
const STOP_SHUTDOWN_MS: u64 = 5_000;
/// How often a stdin pump looks whether its exec ended while its stdin is quiet.
const STDIN_POLL_MS: u16 = 100;

/// What the reader passes to an exec's thread.
enum Event {
    Frame(Frame),
    Gone,
}

/// Credit for one exec's stdin, and whether the exec ended.
#[derive(Default)]
struct StdinCredit {
    state: Mutex<(u64, bool)>,
    cv: Condvar,
}

struct Stream {
    events: Sender<Event>,
    stdin: Arc<StdinCredit>,
    /// The output credit the guest holds: output beyond it is dropped, so a guest that
    /// ignores the protocol cannot queue unbounded memory in the keeper.
    output: Arc<AtomicU64>,
}

/// An open channel to a running guest agent.
pub struct Channel {
    out: Mutex<UnixStream>,
    streams: Mutex<HashMap<u32, Stream>>,
    /// The guest said `BYE`, or the channel ended: (bye, ended).
    end: (Mutex<(bool, bool)>, Condvar),
    /// `--net egress`: the relay of the guest's connections ([`super::netmux`]).
    net: std::sync::OnceLock<Arc<super::netmux::NetMux>>,
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Channel")
    }
}

impl Channel {
    /// Waits up to `timeout` for the agent's `READY` on `sock` (connected to qemu's
    /// port), then serves it on a reader thread. Gives the guest kernel's release.
    pub fn open(sock: UnixStream, timeout: Duration) -> std::io::Result<(Arc<Channel>, String)> {
        let mut input = sock.try_clone()?;
        input.set_read_timeout(Some(timeout))?;
        let ready = loop {
            match Frame::read_from(&mut input)? {
                Some(f) if f.stream == 0 && f.kind == kind::READY => break f,
                Some(_) => continue,
                None => {
                    return Err(std::io::Error::other(
                        "qemu closed the agent's port before the guest was ready",
                    ));
                }
            }
        };
        input.set_read_timeout(None)?;
        let ch = Arc::new(Channel {
            out: Mutex::new(sock),
            streams: Mutex::new(HashMap::new()),
            end: (Mutex::new((false, false)), Condvar::new()),
            net: std::sync::OnceLock::new(),
        });
        let reader = ch.clone();
        std::thread::Builder::new()
            .name("vm-agent-reader".into())
            .spawn(move || reader.read_loop(input))?;
        Ok((ch, String::from_utf8_lossy(&ready.payload).into_owned()))
    }

    pub(super) fn send(&self, f: &Frame) -> std::io::Result<()> {
        let mut o = self.out.lock().unwrap_or_else(|e| e.into_inner());
        f.write_to(&mut *o)
    }

    /// Hands the guest's network streams to `mux` from now on (once).
    pub(super) fn set_net(&self, mux: Arc<super::netmux::NetMux>) {
        let _ = self.net.set(mux);
    }

    fn read_loop(&self, mut input: UnixStream) {
        while let Ok(Some(f)) = Frame::read_from(&mut input) {
            if f.stream >= GUEST_STREAM_BASE {
                // The guest's own streams: its egress, when it has one; else dropped.
                if let Some(n) = self.net.get() {
                    n.handle(f);
                }
                continue;
            }
            if f.stream == 0 {
                if f.kind == kind::BYE {
                    let (m, cv) = &self.end;
                    m.lock().unwrap_or_else(|e| e.into_inner()).0 = true;
                    cv.notify_all();
                }
                continue;
            }
            let streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
            let Some(s) = streams.get(&f.stream) else {
                continue;
            };
            if f.kind == kind::WINDOW {
                if let Some(n) = f.as_i32() {
                    let mut st = s.stdin.state.lock().unwrap_or_else(|e| e.into_inner());
                    st.0 = st.0.saturating_add(u64::from(n as u32)).min(WINDOW_BYTES);
                    s.stdin.cv.notify_all();
                }
                continue;
            }
            if matches!(f.kind, kind::STDOUT | kind::STDERR) {
                let n = f.payload.len() as u64;
                let within = s
                    .output
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |c| c.checked_sub(n))
                    .is_ok();
                if !within {
                    continue;
                }
            }
            let _ = s.events.send(Event::Frame(f));
        }
        // qemu is gone: every exec learns it, every connection of the guest ends.
        if let Some(n) = self.net.get() {
            n.close_all();
        }
        let mut streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        for (_, s) in streams.drain() {
            let _ = s.events.send(Event::Gone);
            end_stdin(&s.stdin);
        }
        let (m, cv) = &self.end;
        m.lock().unwrap_or_else(|e| e.into_inner()).1 = true;
        cv.notify_all();
    }

    /// Starts `msg` on `stream` with `stdio` (stdin, stdout, stderr); its start, failure
    /// and end go to `tx`, after all of its output was written to `stdio`. For a command
    /// on a pseudo-terminal in the guest (`msg.tty`), `stdio` is the slave of a host
    /// pseudo-terminal in raw mode, whose `master` goes to the client with the start;
    /// the guest's terminal does the line discipline, and a new size of the host's
    /// terminal is passed on to it.
    pub(crate) fn exec(
        self: &Arc<Self>,
        stream: u32,
        msg: &ExecMsg,
        stdio: [OwnedFd; 3],
        master: Option<OwnedFd>,
        tx: Sender<InitMsg>,
    ) -> std::io::Result<()> {
        assert_ne!(stream, 0, "stream 0 is the VM's own");
        let (etx, erx) = channel();
        let credit = Arc::new(StdinCredit {
            state: Mutex::new((WINDOW_BYTES, false)),
            cv: Condvar::new(),
        });
        let output = Arc::new(AtomicU64::new(WINDOW_BYTES));
        self.streams
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                stream,
                Stream {
                    events: etx,
                    stdin: credit.clone(),
                    output: output.clone(),
                },
            );
        if let Err(e) = self.send(&Frame::new(stream, kind::EXEC, msg.encode())) {
            self.forget(stream);
            return Err(e);
        }
        let [stdin, stdout, stderr] = stdio;
        let ch = self.clone();
        let tty = msg.tty;
        std::thread::Builder::new()
            .name("vm-exec".into())
            .spawn(move || {
                let stdio = [stdin, stdout, stderr];
                ch.relay(stream, erx, stdio, (credit, output), (master, tty), tx);
            })?;
        Ok(())
    }

    fn forget(&self, stream: u32) {
        if let Some(s) = self
            .streams
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&stream)
        {
            end_stdin(&s.stdin);
        }
    }

    /// One exec's life on the host: its output written to the client's descriptors,
    /// credit given back for it, its stdin pumped once it started.
    fn relay(
        self: &Arc<Self>,
        stream: u32,
        events: std::sync::mpsc::Receiver<Event>,
        [stdin, stdout, stderr]: [OwnedFd; 3],
        (credit, output): (Arc<StdinCredit>, Arc<AtomicU64>),
        (mut master, tty): (Option<OwnedFd>, Option<(u16, u16)>),
        tx: Sender<InitMsg>,
    ) {
        let mut out = File::from(stdout);
        let mut err = File::from(stderr);
        let mut stdin = Some(stdin);
        while let Ok(ev) = events.recv() {
            let f = match ev {
                Event::Frame(f) => f,
                Event::Gone => {
                    let _ = tx.send(InitMsg::Gone);
                    return;
                }
            };
            match f.kind {
                kind::STARTED => {
                    let _ = tx.send(InitMsg::Started(f.as_i32().unwrap_or(0), master.take()));
                    if let Some(fd) = stdin.take() {
                        let (ch, credit) = (self.clone(), credit.clone());
                        let _ = std::thread::Builder::new()
                            .name("vm-stdin".into())
                            .spawn(move || ch.pump_stdin(stream, fd, &credit, tty));
                    }
                }
                kind::FAILED => {
                    let errno = f.as_i32().unwrap_or(libc::EIO);
                    let what = f.payload.get(4).copied().unwrap_or(2);
                    self.forget(stream);
                    let _ = tx.send(InitMsg::Failed(errno, what));
                    return;
                }
                kind::STDOUT | kind::STDERR => {
                    let to = if f.kind == kind::STDOUT {
                        &mut out
                    } else {
                        &mut err
                    };
                    // A client that went away loses the output; the guest still gets
                    // its credit back, so the exec never blocks on it.
                    let _ = to.write_all(&f.payload);
                    output.fetch_add(f.payload.len() as u64, Ordering::SeqCst);
                    let _ = self.send(&Frame::int(stream, kind::WINDOW, f.payload.len() as i32));
                }
                kind::EXIT => {
                    let _ = out.flush();
                    let _ = err.flush();
                    self.forget(stream);
                    let _ = tx.send(InitMsg::Done(f.as_i32().unwrap_or(1)));
                    return;
                }
                _ => {}
            }
        }
    }

    /// Sends what the client gives on stdin, within the guest's credit, then `STDIN_EOF`.
    /// Ends early when the exec ended. For a pseudo-terminal (`tty`: the size the guest
    /// was given), `fd` is the host terminal's slave, and each new size it gets (the
    /// client sets it on the master) is sent as `RESIZE`, within [`STDIN_POLL_MS`].
    fn pump_stdin(&self, stream: u32, fd: OwnedFd, credit: &StdinCredit, tty: Option<(u16, u16)>) {
        let mut f = File::from(fd);
        let mut buf = vec![0u8; MAX_DATA_BYTES];
        let mut size = tty;
        loop {
            if credit.state.lock().unwrap_or_else(|e| e.into_inner()).1 {
                return;
            }
            if let Some(was) = size
                && let Ok(now) = crate::sys::window_size(f.as_fd())
                && now != was
            {
                size = Some(now);
                let resize = Frame::new(stream, kind::RESIZE, size_payload(now.0, now.1));
                if self.send(&resize).is_err() {
                    return;
                }
            }
            let mut pfd = [PollFd::new(f.as_fd(), PollFlags::POLLIN)];
            match poll(&mut pfd, PollTimeout::from(STDIN_POLL_MS)) {
                Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => break,
                Ok(_) => {}
            }
            let n = match f.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let mut st = credit.state.lock().unwrap_or_else(|e| e.into_inner());
            while st.0 < n as u64 && !st.1 {
                st = credit.cv.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            if st.1 {
                return;
            }
            st.0 -= n as u64;
            drop(st);
            if self
                .send(&Frame::new(stream, kind::STDIN, buf[..n].to_vec()))
                .is_err()
            {
                return;
            }
        }
        let _ = self.send(&Frame::new(stream, kind::STDIN_EOF, Vec::new()));
    }

    /// Has the guest mount each (tag, target) read-only; before any exec.
    pub fn mount_ro(&self, mounts: &[(String, String)]) -> std::io::Result<()> {
        for (tag, target) in mounts {
            self.send(&Frame::new(
                0,
                kind::MOUNT_RO,
                super::proto::mount_payload(tag, target),
            ))?;
        }
        Ok(())
    }

    /// Gives the guest the files of its `/run/secrets` (in pieces of at most
    /// [`MAX_DATA_BYTES`]) and makes the directory read-only. Sent before any exec, on
    /// the ordered channel, so every command finds them.
    pub fn put_secrets(&self, secrets: &[crate::spec::Secret]) -> std::io::Result<()> {
        if secrets.is_empty() {
            return Ok(());
        }
        for s in secrets {
            // An empty file is one frame without bytes.
            let mut pieces: Vec<&[u8]> = s.contents.chunks(MAX_DATA_BYTES).collect();
            if pieces.is_empty() {
                pieces.push(&[]);
            }
            for p in pieces {
                self.send(&Frame::new(
                    0,
                    kind::SECRET,
                    super::proto::secret_payload(&s.name, p),
                ))?;
            }
        }
        self.send(&Frame::new(0, kind::SEAL_SECRETS, Vec::new()))
    }

    /// Forwards signal `sig` to the process of exec `stream`.
    pub fn signal(&self, stream: u32, sig: i32) {
        let _ = self.send(&Frame::int(stream, kind::SIGNAL, sig));
    }

    /// Execs started and not ended.
    pub fn running(&self) -> usize {
        self.streams.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Asks the guest to end every process, unmount the workspace and power off; true
    /// when it said `BYE` within `timeout` (qemu then exits by itself).
    pub fn shutdown(&self, timeout: Duration) -> bool {
        if self
            .send(&Frame::new(0, kind::SHUTDOWN, Vec::new()))
            .is_err()
        {
            return false;
        }
        let deadline = Instant::now() + timeout;
        let (m, cv) = &self.end;
        let mut st = m.lock().unwrap_or_else(|e| e.into_inner());
        while !st.0 && !st.1 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            st = cv
                .wait_timeout(st, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        st.0
    }
}

fn end_stdin(c: &StdinCredit) {
    c.state.lock().unwrap_or_else(|e| e.into_inner()).1 = true;
    c.cv.notify_all();
}

/// A VM's guest agent as the keeper's [`Backend`].
pub(crate) struct VmBackend {
    /// The channel.
    pub(crate) channel: Arc<Channel>,
    /// Every command's environment before the request's own (`PATH`, `HOME`, `--env`).
    pub(crate) env: Vec<(String, String)>,
    /// Where an exec without its own working directory starts (`--workdir`).
    pub(crate) workdir: String,
    /// Set once a stop began: no new exec is sent.
    pub(crate) stopping: AtomicBool,
    /// qemu's monitor socket ([`super::qmp`]): pause is its `stop`, resume its `cont`.
    pub(crate) qmp: std::path::PathBuf,
    /// qemu's program (its version is named in the suspend refusal).
    pub(crate) qemu: std::path::PathBuf,
    /// `--net egress`: the sandbox's proxy.
    pub(crate) egress: Option<Arc<crate::egress::EgressProxy>>,
}

impl VmBackend {
    fn monitor(&self, command: &str) -> crate::error::Result<()> {
        super::qmp::execute(&self.qmp, command).map_err(|source| crate::error::Error::Setup {
            step: format!("vm: qemu monitor `{command}` at {}", self.qmp.display()),
            source,
        })
    }
}

/// The environment of a command in the guest: `base`, then `extra` (each name once,
/// the last value winning).
pub fn merged_env(base: &[(String, String)], extra: &[(String, String)]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for (k, v) in base.iter().chain(extra) {
        match out.iter_mut().find(|(ok, _)| ok == k) {
            Some(e) => e.1 = v.clone(),
            None => out.push((k.clone(), v.clone())),
        }
    }
    out
}

impl Backend for VmBackend {
    fn exec(
        &self,
        id: u64,
        req: &ExecRequest,
        stdio: Vec<OwnedFd>,
        tx: Sender<InitMsg>,
    ) -> std::io::Result<()> {
        if self.stopping.load(Ordering::SeqCst) {
            return Err(std::io::Error::other("the VM is shutting down"));
        }
        let stream = u32::try_from(id)
            .ok()
            .filter(|s| *s < GUEST_STREAM_BASE)
            .ok_or_else(|| std::io::Error::other("too many execs"))?;
        let (stdio, master) = match req.tty {
            Some((rows, cols)) => {
                let (master, slave) = host_pty(rows, cols)?;
                (
                    [slave.try_clone()?, slave.try_clone()?, slave],
                    Some(master),
                )
            }
            None => (
                stdio
                    .try_into()
                    .map_err(|_| std::io::Error::other("expected three descriptors"))?,
                None,
            ),
        };
        let msg = ExecMsg {
            argv: req.argv.clone(),
            env: merged_env(&self.env, &req.env),
            workdir: req.workdir.clone().unwrap_or_else(|| self.workdir.clone()),
            tty: req.tty,
        };
        self.channel.exec(stream, &msg, stdio, master, tx)
    }

    fn signal(&self, id: u64, sig: i32) {
        if let Ok(stream) = u32::try_from(id) {
            self.channel.signal(stream, sig);
        }
    }

    fn running(&self) -> usize {
        self.channel.running()
    }

    fn processes(&self) -> Option<usize> {
        None
    }

    fn pause(&self, _cgroups: &[std::path::PathBuf]) -> crate::error::Result<()> {
        self.monitor("stop")
    }

    fn resume(&self, _cgroups: &[std::path::PathBuf]) -> crate::error::Result<()> {
        self.monitor("cont")
    }

    fn suspend(&self) -> crate::error::Result<serde_json::Value> {
        let version = std::process::Command::new(&self.qemu)
            .arg("--version")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.lines().next().map(str::to_string))
            .unwrap_or_else(|| format!("{} (version unknown)", self.qemu.display()));
        Err(crate::keeper::vm_suspend_refusal(version.trim()))
    }

    fn wind_down(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        // The guest ends its processes, unmounts the workspace (all it wrote is on the
        // host) and powers off; a guest that does not answer is killed all the same.
        let _ = self
            .channel
            .shutdown(Duration::from_millis(STOP_SHUTDOWN_MS));
    }

    fn egress(&self) -> Option<&crate::egress::EgressProxy> {
        self.egress.as_deref()
    }
}

/// A host pseudo-terminal of this size for a VM exec with `-t`: (master, slave), both
/// close-on-exec, the slave in raw mode so bytes pass through it unchanged (the guest's
/// own terminal echoes, translates and turns Ctrl-C into a signal).
fn host_pty(rows: u16, cols: u16) -> std::io::Result<(OwnedFd, OwnedFd)> {
    use nix::fcntl::{FcntlArg, FdFlag, fcntl};
    use nix::sys::termios::{SetArg, cfmakeraw, tcgetattr, tcsetattr};
    let size = nix::pty::Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let pty = nix::pty::openpty(Some(&size), None)?;
    for fd in [&pty.master, &pty.slave] {
        fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))?;
    }
    let mut t = tcgetattr(&pty.slave)?;
    cfmakeraw(&mut t);
    tcsetattr(&pty.slave, SetArg::TCSANOW, &t)?;
    Ok((pty.master, pty.slave))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_s_environment_wins() {
        let s = |k: &str, v: &str| (k.to_string(), v.to_string());
        let env = merged_env(
            &[s("PATH", "/bin"), s("A", "1")],
            &[s("A", "2"), s("B", "3")],
        );
        assert_eq!(env, [s("PATH", "/bin"), s("A", "2"), s("B", "3")]);
    }

    #[test]
    fn a_host_terminal_for_a_vm_exec_passes_bytes_unchanged_and_shows_its_size() {
        let (master, slave) = host_pty(30, 100).unwrap();
        assert_eq!(crate::sys::window_size(slave.as_fd()).unwrap(), (30, 100));
        let (mut m, mut sl) = (File::from(master), File::from(slave));
        // Raw: no echo, no CR added, Ctrl-C is a byte.
        sl.write_all(b"a\nb").unwrap();
        let mut got = [0u8; 3];
        m.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"a\nb");
        m.write_all(b"\x03x\n").unwrap();
        let mut got = [0u8; 3];
        sl.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"\x03x\n");
        crate::sys::set_window_size(m.as_fd(), 40, 120).unwrap();
        assert_eq!(crate::sys::window_size(sl.as_fd()).unwrap(), (40, 120));
    }
}
