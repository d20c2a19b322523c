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

use cowspace_store::layout::Layout;

use crate::error::{Error, Result};
use crate::protocol::{NoArgs, RemoveArgs, Request, Response, ShutdownArgs};

/// How long to wait for a started daemon to answer.
pub const DAEMON_START_TIMEOUT_MS: u64 = 15_000;
/// How long a control request may take before the client gives up.
pub const CONTROL_TIMEOUT_MS: u64 = 120_000;
/// `fsd`'s exit status when another daemon holds the root's lock: that one may still be
/// starting (mounting its view) when ours gives up, so the starter waits for it.
pub const EXIT_ANOTHER_DAEMON: u8 = 75;

pub fn socket_path(root: &Path) -> PathBuf {
    Layout::new(root).daemon_socket()
}

pub fn log_path(root: &Path) -> PathBuf {
    Layout::new(root).daemon_log()
}

/// Sends one request and reads its answer: the result, or the answered error with its
/// kind, message and hint ([`Error::answered_body`]).
pub fn request(root: &Path, req: &Request) -> Result<serde_json::Value> {
    let sock = socket_path(root);
    let s = UnixStream::connect(&sock).map_err(Error::io("connect to", &sock))?;
    exchange(s, &sock, req)?.into_result()
}

/// Whether the process at the other end of `s` sees the mounts this one sees (its
/// mount namespace is ours): only then may it mount and unmount for us.
fn peer_shares_mounts(s: &UnixStream) -> bool {
    let Ok(cred) = nix::sys::socket::getsockopt(s, nix::sys::socket::sockopt::PeerCredentials)
    else {
        return false;
    };
    let ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/mnt")).ok();
    // A peer in another pid namespace shows pid 0 (or another process's number, whose
    // namespace is then compared: still the question asked).
    cred.pid() > 0 && ns("self").is_some() && ns("self") == ns(&cred.pid().to_string())
}

fn exchange(mut s: UnixStream, sock: &Path, req: &Request) -> Result<Response> {
    s.set_read_timeout(Some(Duration::from_millis(CONTROL_TIMEOUT_MS)))
        .map_err(Error::io("configure", sock))?;
    let mut line = req.encode()?;
    line.push(b'\n');
    s.write_all(&line).map_err(Error::io("write to", sock))?;
    let mut resp = String::new();
    BufReader::new(&s)
        .read_line(&mut resp)
        .map_err(Error::io("read from", sock))?;
    serde_json::from_str(&resp)
        .map_err(|e| Error::Daemon(format!("unreadable response {resp:?}: {e}")))
}

/// Sends one request to the root's daemon when one answers from this process's mount
/// namespace (only such a daemon mounts and unmounts where the caller sees the
/// workspaces), and gives its result: `None` when no daemon does. An answered error keeps
/// its kind, message and hint ([`Error::answered`]).
pub fn ask(root: &Path, req: &Request) -> Result<Option<serde_json::Value>> {
    let sock = socket_path(root);
    let Ok(s) = UnixStream::connect(&sock) else {
        return Ok(None);
    };
    if !peer_shares_mounts(&s) {
        return Ok(None);
    }
    exchange(s, &sock, req)?.into_result().map(Some)
}

/// Removes workspace `ws` through the root's daemon, when one answers (`None` when none
/// does, or none that can): a removal there answers as soon as the workspace has left its path, and the
/// kernel's teardown of a used mount follows on the daemon's thread instead of holding
/// up the caller (`mounts::defer`).
///
/// Only a daemon in this process's mount namespace is asked: the unmount must happen
/// where the caller sees the workspace.
pub fn remove(root: &Path, ws: &str, force: bool) -> Result<Option<crate::registry::Record>> {
    let req = Request::Remove(RemoveArgs {
        workspace: ws.to_string(),
        force,
    });
    let Some(v) = ask(root, &req)? else {
        return Ok(None);
    };
    serde_json::from_value(v)
        .map(Some)
        .map_err(|e| Error::Daemon(format!("unreadable remove answer: {e}")))
}

/// Whether a daemon answers on the root's socket.
pub fn ping(root: &Path) -> bool {
    ping_result(root).is_some()
}

/// The daemon's answer to `ping`, if one answers.
fn ping_result(root: &Path) -> Option<serde_json::Value> {
    request(root, &Request::Ping(NoArgs {})).ok()
}

/// Which build of a program the file at `path` is: its device, inode, size and time.
/// `/proc/self/exe` gives the running program's, even once its file was replaced.
pub fn program_identity(path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some(format!(
        "{}:{}:{}:{}.{}",
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime(),
        m.mtime_nsec()
    ))
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
/// Detaches (lazily) the snapshot views under `root/run` that no daemon serves: after a
/// daemon was killed they stay mounted, and every access to them fails with "Transport
/// endpoint is not connected". Holds the daemon's lock meanwhile, so no daemon starts
/// (and mounts fresh views) between the check and the unmount; does nothing while one
/// runs. Gives the paths detached.
pub fn detach_dead_views(root: &Path) -> Vec<PathBuf> {
    let layout = Layout::new(root);
    // No lock file: no daemon ever ran here, so no view was mounted.
    if !layout.daemon_lock().exists() {
        return Vec::new();
    }
    let Ok(Some(lock)) = crate::lockfile::try_lock(&layout.daemon_lock(), true) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for dir in [layout.view(), layout.plain_view()] {
        if crate::mounts::is_mounted(&dir).unwrap_or(false)
            && crate::mounts::unmount_lazy(&dir).is_ok()
        {
            out.push(dir);
        }
    }
    drop(lock);
    out
}

/// Whether a daemon runs for `root`: it holds its lock exclusively for its whole life.
pub fn lock_held(root: &Path) -> bool {
    crate::lockfile::held_exclusively(&Layout::new(root).daemon_lock())
}

/// Starts the daemon unless it already answers. A daemon that runs another build of
/// `fsd` than the one this process would start (an upgrade, say: an older build may
/// refuse what a newer one stored) is stopped and started again when it serves no
/// workspace; while it does, it is left running, with a warning.
pub fn ensure_running(root: &Path) -> Result<()> {
    let prog = fsd_program();
    if let Some(pong) = ping_result(root) {
        let theirs = pong["program"].as_str().map(str::to_owned);
        let ours = program_identity(&prog);
        match (theirs, ours) {
            (Some(t), Some(o)) if t != o => match stop(root, false) {
                Ok(_) => tracing::info!(
                    program = %prog.display(),
                    "the daemon ran another build of fsd; started this one"
                ),
                Err(e) => {
                    tracing::warn!(
                        program = %prog.display(),
                        "the daemon runs another build of fsd and serves workspaces, so it keeps running ({e}); stop it (`mountctl daemon stop`) once they are removed"
                    );
                    return Ok(());
                }
            },
            _ => return Ok(()),
        }
    }
    let log = log_path(root);
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
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    Error::Daemon(format!(
                        "no fsd program was found: $COWSPACE_FSD is not set, there is none \
                             next to {} (or in its parent directory), and none on PATH; build \
                             it with `cargo build -p cowspace-fsd --bins` (it lands next to \
                             the other binaries) or set COWSPACE_FSD to its path",
                        std::env::current_exe()
                            .map(|p| p.display().to_string())
                            .unwrap_or_else(|_| "this program".into())
                    ))
                } else {
                    Error::io("start", &prog)(e)
                }
            })
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
    request(root, &Request::Shutdown(ShutdownArgs { force }))?;
    // Gone means the process has let go of the lock, not only of the socket: a daemon
    // started right after this returns must not find the old one still there.
    let deadline = Instant::now() + Duration::from_millis(DAEMON_START_TIMEOUT_MS);
    while Instant::now() < deadline && (ping(root) || lock_held(root)) {
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    /// A listener on `sock` in a process of its own (`unshare --mount` first when
    /// `own_ns`), which accepts one connection and holds it open.
    fn peer(sock: &Path, own_ns: bool) -> std::process::Child {
        let script = format!(
            "import socket,time\ns=socket.socket(socket.AF_UNIX)\ns.bind({:?})\ns.listen()\nc,_=s.accept()\ntime.sleep(10)",
            sock.to_str().unwrap()
        );
        let mut cmd = if own_ns {
            let mut c = Command::new("unshare");
            c.args(["--mount", "python3"]);
            c
        } else {
            Command::new("python3")
        };
        cmd.args(["-c", &script]).spawn().expect("start python3")
    }

    fn connect(sock: &Path) -> UnixStream {
        for _ in 0..500 {
            if let Ok(s) = UnixStream::connect(sock) {
                return s;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("no listener at {}", sock.display());
    }

    #[test]
    fn only_a_peer_in_our_mount_namespace_shares_our_mounts() {
        if !nix::unistd::geteuid().is_root() {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CI=true: this test must run (root)"
            );
            eprintln!("skipped: unshare --mount needs root");
            return;
        }
        let dir = std::env::temp_dir().join(format!("cowspace-peer-ns-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // In this process: the namespace is ours.
        let here = dir.join("here.sock");
        let listener = UnixListener::bind(&here).unwrap();
        let s = UnixStream::connect(&here).unwrap();
        let _accepted = listener.accept().unwrap();
        assert!(peer_shares_mounts(&s));
        for own_ns in [false, true] {
            let sock = dir.join(format!("peer-{own_ns}.sock"));
            let mut child = peer(&sock, own_ns);
            let s = connect(&sock);
            let shares = peer_shares_mounts(&s);
            let _ = child.kill();
            let _ = child.wait();
            assert_eq!(shares, !own_ns, "peer in its own mount namespace: {own_ns}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
