//! The control socket: newline-delimited JSON requests and responses on
//! `<root>/run/fsd.sock`, documented in `docs/control-protocol.md`.
//!
//! Request: `{"op": "create", "args": {...}}`. Response: `{"ok": true, "result": ...}` or
//! `{"ok": false, "error": {"kind", "message", "hint"}}`. Only root and the owner of the
//! runtime root may connect (checked with `SO_PEERCRED`). One thread per connection;
//! at most [`MAX_CONNECTIONS`] at once and [`MAX_REQUEST_BYTES`] per request.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use serde_json::{Value, json};

use crate::error::{Error, Result};
use crate::runtime::{CommitOptions, CreateOptions, Runtime};

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 256;
/// Largest request line.
pub const MAX_REQUEST_BYTES: u64 = 1024 * 1024;
/// How often the accept loop looks at the stop flag while no client connects.
const STOP_POLL_MS: u16 = 200;

/// What the server needs besides the runtime.
pub struct Server {
    pub runtime: Arc<Runtime>,
    /// Set when a `shutdown` request is accepted.
    pub stop: Arc<AtomicBool>,
    /// Whether workspaces still use the daemon (refuses `shutdown` without force).
    pub busy: Box<dyn Fn() -> Vec<String> + Send + Sync>,
    /// The FUSE server of fuse workspaces, which this daemon registered with the runtime.
    pub host: Arc<crate::cow::Host>,
}

fn error_value(e: &Error) -> Value {
    json!({"ok": false, "error": {"kind": e.kind().as_str(), "message": e.to_string(), "hint": e.hint()}})
}

fn args<T: serde::de::DeserializeOwned + Default>(v: &Value) -> Result<T> {
    match v.get("args") {
        None | Some(Value::Null) => Ok(T::default()),
        Some(a) => {
            serde_json::from_value(a.clone()).map_err(|e| Error::Invalid(format!("bad args: {e}")))
        }
    }
}

fn ws_arg(v: &Value) -> Result<String> {
    v["args"]["workspace"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| Error::Invalid("args.workspace (an id or name) is required".into()))
}

/// Starts building the native lower of `snap` on a thread, unless one already does
/// (`false` then) or it is built.
fn prepare_in_background(rt: &Arc<Runtime>, snap: cowspace_store::SnapshotId) -> bool {
    static BUSY: std::sync::Mutex<Vec<cowspace_store::SnapshotId>> =
        std::sync::Mutex::new(Vec::new());
    if crate::native::is_built(rt.store(), &snap) {
        return false;
    }
    {
        let mut busy = BUSY.lock().unwrap_or_else(|p| p.into_inner());
        if busy.contains(&snap) {
            return false;
        }
        busy.push(snap);
    }
    let rt = Arc::clone(rt);
    std::thread::spawn(move || {
        let started = std::time::Instant::now();
        match rt.prepare_native(&snap) {
            Ok(()) => {
                tracing::info!(snapshot = %snap.to_hex(), ms = started.elapsed().as_millis() as u64, "native lower built")
            }
            Err(e) => tracing::warn!(snapshot = %snap.to_hex(), "building the native lower: {e}"),
        }
        BUSY.lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|s| *s != snap);
    });
    true
}

impl Server {
    /// Handles one request.
    pub fn handle(&self, req: &Value) -> Value {
        let rt = &self.runtime;
        let r: Result<Value> = (|| {
            let op = req["op"]
                .as_str()
                .ok_or_else(|| Error::Invalid("op is required".into()))?;
            Ok(match op {
                "ping" => json!({
                    "pong": true,
                    "version": env!("CARGO_PKG_VERSION"),
                    "program": crate::daemon::program_identity(std::path::Path::new("/proc/self/exe")),
                }),
                "create" => rt.create(&args::<CreateOptions>(req)?)?.created_json(),
                "list" => json!(rt.list(req["args"]["all"].as_bool().unwrap_or(false))?),
                "status" => json!(rt.status(&ws_arg(req)?)?),
                "diff" => {
                    let ws = ws_arg(req)?;
                    let changes = rt.diff_with(
                        &ws,
                        req["args"]["include_excluded"].as_bool().unwrap_or(false),
                    )?;
                    let patch = if req["args"]["patch"].as_bool().unwrap_or(false) {
                        Some(crate::upper::patch(rt.store(), &changes)?)
                    } else {
                        None
                    };
                    let list: Vec<_> = changes.into_iter().map(|(c, _)| c).collect();
                    json!({"workspace": rt.status(&ws)?.id, "changes": list, "patch": patch})
                }
                "commit" => {
                    let ws = ws_arg(req)?;
                    crate::runtime::commit_json(&rt.commit(&ws, &args::<CommitOptions>(req)?)?)
                }
                "remove" => {
                    let ws = ws_arg(req)?;
                    let t = std::time::Instant::now();
                    let rec = rt.remove(&ws, req["args"]["force"].as_bool().unwrap_or(false))?;
                    rec.removed_json(t.elapsed().as_secs_f64() * 1e3)
                }
                "sweep" => json!(rt.sweep()?),
                // Answered at once; the image is built on a thread of its own.
                "prepare_native" => {
                    let snap: cowspace_store::SnapshotId = rt.store().resolve(
                        req["args"]["snapshot"]
                            .as_str()
                            .ok_or_else(|| Error::Invalid("args.snapshot is required".into()))?,
                    )?;
                    json!({"snapshot": snap.to_hex(), "preparing": prepare_in_background(rt, snap)})
                }
                "sandbox_start" => {
                    let ws = ws_arg(req)?;
                    rt.sandbox_start(&ws, &args::<crate::sandbox::SandboxOptions>(req)?)?
                }
                "sandbox_stop" => rt.sandbox_stop(&ws_arg(req)?)?,
                "sandbox_status" => rt.sandbox_status(&ws_arg(req)?)?,
                "sandbox_list" => json!({"sandboxes": rt.sandbox_list()?}),
                // The command itself goes to the sandbox's keeper, with the caller's
                // descriptors (`SCM_RIGHTS`): this answers where (docs/sandbox.md).
                "exec" => {
                    let ws = ws_arg(req)?;
                    let rec = rt.sandbox_status(&ws)?;
                    let name = rec["name"].as_str().unwrap_or_default().to_string();
                    let (_, sock) = sandbox_helper::keeper::paths(&rt.sandbox_state_dir(), &name);
                    json!({"workspace": rec["workspace"], "socket": sock})
                }
                "recover" => json!(rt.recover(&ws_arg(req)?)?),
                "mount_workspace" => {
                    let rec = rt.status(&ws_arg(req)?)?;
                    self.host.mount(&rec)?;
                    json!({"workspace": rec.id, "path": rec.path, "served": true})
                }
                "finish_copies" => {
                    let rec = rt.status(&ws_arg(req)?)?;
                    self.host.finish_copies(&rec)?;
                    json!({"workspace": rec.id, "finished": true})
                }
                "unmount_workspace" => {
                    let rec = rt.status(&ws_arg(req)?)?;
                    let was = self.host.unmount(&rec.id);
                    json!({"workspace": rec.id, "served": false, "was_served": was})
                }
                "shutdown" => {
                    let users = (self.busy)();
                    if !users.is_empty() && !req["args"]["force"].as_bool().unwrap_or(false) {
                        return Err(Error::DaemonInUse { users });
                    }
                    self.stop.store(true, Ordering::SeqCst);
                    json!({"stopping": true})
                }
                other => return Err(Error::Invalid(format!("unknown op {other:?}"))),
            })
        })();
        match r {
            Ok(v) => json!({"ok": true, "result": v}),
            Err(e) => error_value(&e),
        }
    }

    /// Serves connections until `stop` is set. The listener must be non-blocking.
    pub fn serve(self: Arc<Self>, listener: UnixListener, owner_uid: u32) -> Result<()> {
        let active = Arc::new(AtomicUsize::new(0));
        while !self.stop.load(Ordering::SeqCst) {
            match listener.accept() {
                Ok((stream, _)) => {
                    let _ = stream.set_nonblocking(false);
                    if active.load(Ordering::SeqCst) >= MAX_CONNECTIONS {
                        let _ = reply(
                            &stream,
                            &error_value(&Error::Daemon("too many connections".into())),
                        );
                        continue;
                    }
                    if let Err(why) = check_peer(&stream, owner_uid) {
                        let _ = reply(
                            &stream,
                            &json!({"ok": false, "error": {"kind": "invalid_input", "message": why, "hint": null}}),
                        );
                        continue;
                    }
                    let me = self.clone();
                    let n = active.clone();
                    n.fetch_add(1, Ordering::SeqCst);
                    std::thread::spawn(move || {
                        me.connection(stream);
                        n.fetch_sub(1, Ordering::SeqCst);
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    // Wake as soon as a client connects (a fixed sleep here added its
                    // half on average to every request); look at `stop` every
                    // STOP_POLL_MS.
                    let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
                    match poll(&mut fds, PollTimeout::from(STOP_POLL_MS)) {
                        Ok(_) | Err(nix::Error::EINTR) => {}
                        Err(e) => return Err(Error::io("poll", "control socket")(e.into())),
                    }
                }
                Err(e) => return Err(Error::io("accept on", "control socket")(e)),
            }
        }
        Ok(())
    }

    fn connection(&self, stream: UnixStream) {
        let mut reader = BufReader::new(&stream);
        loop {
            let mut line = String::new();
            match (&mut reader).take(MAX_REQUEST_BYTES).read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let resp = match serde_json::from_str::<Value>(&line) {
                Ok(req) => self.handle(&req),
                Err(e) => error_value(&Error::Invalid(format!("request is not JSON: {e}"))),
            };
            if reply(&stream, &resp).is_err() || self.stop.load(Ordering::SeqCst) {
                return;
            }
        }
    }
}

fn reply(mut stream: &UnixStream, v: &Value) -> std::io::Result<()> {
    let mut out = serde_json::to_vec(v).expect("responses serialise");
    out.push(b'\n');
    stream.write_all(&out)
}

fn check_peer(stream: &UnixStream, owner_uid: u32) -> std::result::Result<(), String> {
    let cred = nix::sys::socket::getsockopt(stream, nix::sys::socket::sockopt::PeerCredentials)
        .map_err(|e| format!("cannot read peer credentials: {e}"))?;
    if cred.uid() == 0 || cred.uid() == owner_uid {
        Ok(())
    } else {
        Err(format!(
            "uid {} may not use this daemon (only root and uid {owner_uid}, the owner of the runtime root)",
            cred.uid()
        ))
    }
}

/// The uid owning the runtime root.
pub fn root_owner(root: &std::path::Path) -> Result<u32> {
    Ok(std::fs::metadata(root)
        .map_err(Error::io("stat", root))?
        .uid())
}
