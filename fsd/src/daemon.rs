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

/// Starts the daemon unless it already answers.
pub fn ensure_running(root: &Path) -> Result<()> {
    if ping(root) {
        return Ok(());
    }
    let log = log_path(root);
    let logf = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .map_err(Error::io("open", &log))?;
    let prog = fsd_program();
    let mut child = Command::new(&prog)
        .arg("--root")
        .arg(root)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(logf))
        .process_group(0)
        .spawn()
        .map_err(Error::io("start", &prog))?;
    let deadline = Instant::now() + Duration::from_millis(DAEMON_START_TIMEOUT_MS);
    let mut lost_race = false;
    while Instant::now() < deadline {
        if ping(root) {
            return Ok(());
        }
        if !lost_race && let Ok(Some(status)) = child.try_wait() {
            // Another daemon may have won the race to the socket.
            if ping(root) {
                return Ok(());
            }
            // It holds the lock but does not answer yet: wait for it.
            if status.code() == Some(EXIT_ANOTHER_DAEMON.into()) {
                lost_race = true;
                continue;
            }
            return Err(Error::Daemon(format!(
                "{} exited with {status}; see {}",
                prog.display(),
                log.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(Error::Daemon(format!(
        "{} did not answer within {DAEMON_START_TIMEOUT_MS} ms; see {}",
        prog.display(),
        log.display()
    )))
}

/// Asks the daemon to stop; waits until its socket is gone.
pub fn stop(root: &Path, force: bool) -> Result<bool> {
    if !ping(root) {
        return Ok(false);
    }
    let resp = request(
        root,
        &serde_json::json!({"op": "shutdown", "args": {"force": force}}),
    )?;
    if resp["ok"] != true {
        let kind = resp["error"]["kind"].as_str().unwrap_or("io").to_string();
        let msg = resp["error"]["message"].as_str().unwrap_or("").to_string();
        return Err(match kind.as_str() {
            "busy" => Error::Busy {
                id: "daemon".into(),
                pids: vec![],
            },
            _ => Error::Daemon(msg),
        });
    }
    let deadline = Instant::now() + Duration::from_millis(DAEMON_START_TIMEOUT_MS);
    while Instant::now() < deadline && ping(root) {
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(true)
}
