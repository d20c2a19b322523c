//! Finding, starting and stopping the daemon of a runtime root.
//!
//! The daemon listens on `<root>/run/fsd.sock`; a `ping` that answers means it is up.
//! `ensure_running` starts `fsd --root ROOT` in its own process group (so it outlives the
//! caller) and waits for the socket, logging to `<root>/run/fsd.log`.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// How long to wait for a started daemon to answer.
pub const DAEMON_START_TIMEOUT_MS: u64 = 15_000;
/// How long a control request may take before the client gives up.
pub const CONTROL_TIMEOUT_MS: u64 = 120_000;
/// `fsd`'s exit status when another daemon holds the root's lock: that one may still be
/// starting (mounting its view) when ours gives up, so the starter waits for it.
pub const EXIT_ANOTHER_DAEMON: u8 = 75;

pub fn socket_path(root: &Path) -> PathBuf {
    root.join("run/fsd.sock")
}

pub fn log_path(root: &Path) -> PathBuf {
    root.join("run/fsd.log")
}

/// Sends one request and reads one response line.
pub fn request(root: &Path, req: &serde_json::Value) -> Result<serde_json::Value> {
    let sock = socket_path(root);
    let mut s = UnixStream::connect(&sock).map_err(Error::io("connect to", &sock))?;
    s.set_read_timeout(Some(Duration::from_millis(CONTROL_TIMEOUT_MS)))
        .map_err(Error::io("configure", &sock))?;
    let mut line = serde_json::to_vec(req).expect("requests serialise");
    line.push(b'\n');
    s.write_all(&line).map_err(Error::io("write to", &sock))?;
    let mut resp = String::new();
    BufReader::new(&s)
        .read_line(&mut resp)
        .map_err(Error::io("read from", &sock))?;
    serde_json::from_str(&resp)
        .map_err(|e| Error::Daemon(format!("unreadable response {resp:?}: {e}")))
}

/// Removes workspace `ws` through the root's daemon, when one answers (`None` when none
/// does): a removal there answers as soon as the workspace has left its path, and the
/// kernel's teardown of a used mount follows on the daemon's thread instead of holding
/// up the caller (`mounts::defer`).
pub fn remove(root: &Path, ws: &str, force: bool) -> Result<Option<crate::registry::Record>> {
    let Ok(resp) = request(
        root,
        &serde_json::json!({"op": "remove", "args": {"workspace": ws, "force": force}}),
    ) else {
        return Ok(None);
    };
    if resp["ok"] != true {
        return Err(Error::answered(&resp));
    }
    serde_json::from_value(resp["result"].clone())
        .map(Some)
        .map_err(|e| Error::Daemon(format!("unreadable remove answer: {e}")))
}

/// Whether a daemon answers on the root's socket.
pub fn ping(root: &Path) -> bool {
    matches!(request(root, &serde_json::json!({"op": "ping"})), Ok(v) if v["ok"] == true)
}

/// The `fsd` program: `$COWSPACE_FSD`, else next to the running executable (or its
/// parent, for test binaries in `deps/`), else `fsd` on PATH.
pub fn fsd_program() -> PathBuf {
    if let Some(p) = std::env::var_os("COWSPACE_FSD") {
        return PathBuf::from(p);
    }
    if let Ok(exe) = std::env::current_exe() {
        for dir in exe.ancestors().skip(1).take(2) {
            let p = dir.join("fsd");
            if p.is_file() {
                return p;
            }
        }
    }
    PathBuf::from("fsd")
}

/// Whether a daemon process holds the root's lock (it may be starting or stopping
/// without answering on the socket).
pub fn lock_held(root: &Path) -> bool {
    let path = root.join("run/fsd.lock");
    match std::fs::File::open(&path) {
        // The daemon holds an exclusive lock for its whole life; a shared one that cannot
        // be taken means it is there. Ours is released when `f` is dropped.
        Ok(f) => f.try_lock_shared().is_err(),
        Err(_) => false,
    }
}

/// Starts the daemon unless it already answers.
pub fn ensure_running(root: &Path) -> Result<()> {
    if ping(root) {
        return Ok(());
    }
    let log = log_path(root);
    let prog = fsd_program();
    let spawn = || -> Result<std::process::Child> {
        let logf = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(Error::io("open", &log))?;
        Command::new(&prog)
            .arg("--root")
            .arg(root)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(logf))
            .process_group(0)
            .spawn()
            .map_err(Error::io("start", &prog))
    };
    let mut child = Some(spawn()?);
    let deadline = Instant::now() + Duration::from_millis(DAEMON_START_TIMEOUT_MS);
    while Instant::now() < deadline {
        if ping(root) {
            return Ok(());
        }
        match &mut child {
            Some(c) => {
                if let Ok(Some(status)) = c.try_wait() {
                    // Another daemon may have won the race to the socket.
                    if ping(root) {
                        return Ok(());
                    }
                    if status.code() != Some(EXIT_ANOTHER_DAEMON.into()) {
                        return Err(Error::Daemon(format!(
                            "{} exited with {status}; see {}",
                            prog.display(),
                            log.display()
                        )));
                    }
                    // It holds the lock but does not answer yet: wait for it.
                    child = None;
                }
            }
            // The other daemon was stopping, not starting: the lock is free, start ours.
            None if !lock_held(root) => child = Some(spawn()?),
            None => {}
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Err(Error::Daemon(format!(
        "{} did not answer within {DAEMON_START_TIMEOUT_MS} ms; see {}",
        prog.display(),
        log.display()
    )))
}

/// Asks the daemon to stop; waits until it has let go of the socket and the lock.
pub fn stop(root: &Path, force: bool) -> Result<bool> {
    if !ping(root) {
        return Ok(false);
    }
    let resp = request(
        root,
        &serde_json::json!({"op": "shutdown", "args": {"force": force}}),
    )?;
    if resp["ok"] != true {
        return Err(Error::answered(&resp));
    }
    // Gone means the process has let go of the lock, not only of the socket: a daemon
    // started right after this returns must not find the old one still there.
    let deadline = Instant::now() + Duration::from_millis(DAEMON_START_TIMEOUT_MS);
    while Instant::now() < deadline && (ping(root) || lock_held(root)) {
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(true)
}
