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
use crate::runtime::Runtime;
use cowspace::protocol::{ImportArgs, Request, Response};

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 256;
/// Largest request line.
pub const MAX_REQUEST_BYTES: u64 = 1024 * 1024;
/// Sends an event line before an operation's answer; `false` once the client is gone
/// (a failed send, or its hang-up). Given `Value::Null` it sends nothing and only says
/// whether the client is still there.
pub type Events<'a> = dyn Fn(&Value) -> bool + Send + Sync + 'a;

/// How often a watch looks at the stop flag while nothing changes.
const WATCH_POLL_MS: u64 = 1_000;
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
    /// The configuration's defaults, read at start: what a `create` or `sandbox_start`
    /// leaves out.
    pub config: cowspace::config::Config,
}

fn error_value(e: &Error) -> Value {
    json!(Response::error(e))
}

/// The sandbox controls' flags as the socket names them (`--memory` → `args.memory`):
/// a refusal of a `sandbox_start` names the argument the client sent, not a CLI flag.
const SOCKET_NAMES: [(&str, &str); 16] = [
    ("--cpuset-cpus", "args.cpuset_cpus"),
    ("--io-weight", "args.io_weight"),
    ("--io-max", "args.io_max"),
    ("--idle-timeout", "args.idle_timeout"),
    ("--allow-host", "args.allow_host"),
    ("--deny-host", "args.deny_host"),
    ("--add-host", "args.add_host"),
    ("--ro-bind", "args.ro_bind"),
    ("--publish", "args.publish"),
    ("--memory", "args.memory"),
    ("--secret", "args.secret"),
    ("--pids", "args.pids"),
    ("--cpus", "args.cpus"),
    ("--net", "args.net"),
    ("--env", "args.env"),
    ("--vm", "args.vm"),
];

fn socket_names(e: Error) -> Error {
    if e.kind() != cowspace::error::ErrorKind::InvalidInput {
        return e;
    }
    let mut message = e.to_string();
    for (flag, arg) in SOCKET_NAMES {
        message = message.replace(flag, arg);
    }
    Error::Answered {
        kind: e.kind(),
        message,
        hint: e.hint(),
    }
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

/// Who sent a request (`SO_PEERCRED`).
#[derive(Debug, Clone, Copy)]
pub struct Caller {
    pub uid: u32,
}

impl Caller {
    /// Refuses an operation that reads or writes host paths the caller named unless the
    /// caller is root or this daemon's own user: the daemon would otherwise read or write
    /// them with privileges the caller may not have (the root's owner connecting to a
    /// daemon running as root).
    fn may_name_host_paths(&self, op: &str) -> Result<()> {
        let me = nix::unistd::geteuid().as_raw();
        if self.uid == 0 || self.uid == me {
            return Ok(());
        }
        Err(Error::Invalid(format!(
            "{op} over the socket names host paths, which this daemon (uid {me}) would use with \
             its own privileges: only root and uid {me} may ask; run `mountctl {op}` as uid {} \
             instead",
            self.uid
        )))
    }
}

/// A path argument that must be absolute (the daemon's working directory is not the
/// caller's).
fn abs_path_arg(key: &str, p: &str) -> Result<std::path::PathBuf> {
    if p.is_empty() {
        return Err(Error::Invalid(format!(
            "args.{key} (an absolute path) is required"
        )));
    }
    let p = std::path::PathBuf::from(p);
    if !p.is_absolute() {
        return Err(Error::Invalid(format!(
            "args.{key} {}: give an absolute path (the daemon's working directory is not yours)",
            p.display()
        )));
    }
    Ok(p)
}

/// The least time between two progress events of one import.
const PROGRESS_EVERY_MS: u64 = 100;

impl Server {
    /// Handles one request line from `caller`; `events` gets the lines an operation
    /// sends before its answer (an import's progress).
    pub fn handle_line(&self, line: &str, caller: Caller, events: &Events<'_>) -> Value {
        let r = Request::decode(line).and_then(|req| self.handle(req, caller, events));
        match r {
            Ok(v) => json!(Response::ok(v)),
            Err(e) => error_value(&e),
        }
    }

    /// Carries out one decoded request.
    pub fn handle(&self, req: Request, caller: Caller, events: &Events<'_>) -> Result<Value> {
        let rt = &self.runtime;
        Ok(match req {
            Request::Ping(_) => json!({
                "pong": true,
                "version": env!("CARGO_PKG_VERSION"),
                "protocol": cowspace::protocol::PROTOCOL_VERSION,
                "program": crate::daemon::program_identity(std::path::Path::new("/proc/self/exe")),
            }),
            Request::Create(mut o) => {
                // The configuration's defaults where the request names none.
                let given = o.materializer.map(|c| c.to_string());
                o.materializer = Some(self.config.materializer(given).value.parse()?);
                let given = o.lower.map(|c| c.to_string());
                o.lower = Some(self.config.lower(given).value.parse()?);
                o.disk = self.config.disk(o.disk).map(|s| s.value);
                rt.create(&o)?.created_json()
            }
            Request::List(a) => json!(rt.list(a.all)?),
            Request::Status(a) => json!(rt.status(&a.workspace)?),
            Request::Diff(a) => {
                let changes = rt.diff_with(&a.workspace, a.include_excluded)?;
                let patch = if a.patch {
                    Some(crate::upper::patch(rt.store(), &changes)?)
                } else {
                    None
                };
                let list: Vec<_> = changes.into_iter().map(|(c, _)| c).collect();
                json!({"workspace": rt.status(&a.workspace)?.id, "changes": list, "patch": patch})
            }
            Request::Commit(a) => {
                crate::runtime::commit_json(&rt.commit(&a.workspace, &a.options)?)
            }
            Request::Remove(a) => {
                let t = std::time::Instant::now();
                let rec = rt.remove(&a.workspace, a.force)?;
                rec.removed_json(t.elapsed().as_secs_f64() * 1e3)
            }
            Request::Fork(a) => rt.fork(&a.workspace, &a.options)?,
            Request::Sweep(_) => json!(rt.sweep()?),
            // Answered at once; the image is built on a thread of its own.
            Request::PrepareNative(a) => {
                let snap: cowspace_store::SnapshotId = rt.store().resolve(&a.snapshot)?;
                json!({"snapshot": snap.to_hex(), "preparing": prepare_in_background(rt, snap)})
            }
            Request::SandboxStart(a) => {
                let o = crate::sandbox::with_defaults(a.controls, &self.config.sandbox());
                // `vm: true` places it in a micro-VM; software emulation runs only when
                // `accept_emulation` (or the configuration) accepts it.
                let started = if a.vm {
                    let accept = a.accept_emulation
                        || self.config.vm_accept_emulation().is_some_and(|s| s.value);
                    let v = cowspace::vm::VmRun {
                        accept_emulation: accept,
                    };
                    rt.vm_start(&a.workspace, &o, &v)
                } else {
                    rt.sandbox_start(&a.workspace, &o)
                };
                started.map_err(socket_names)?
            }
            Request::SandboxStop(a) => rt.sandbox_stop(&a.workspace)?,
            Request::SandboxPause(a) => rt.sandbox_pause(&a.workspace)?,
            Request::SandboxResume(a) => rt.sandbox_resume(&a.workspace)?,
            Request::SandboxSuspend(a) => rt.sandbox_suspend(&a.workspace)?,
            Request::SandboxStatus(a) => rt.sandbox_status(&a.workspace)?,
            Request::SandboxList(_) => json!({"sandboxes": rt.sandbox_list()?}),
            Request::SandboxPolicy(a) => rt.sandbox_policy(&a.workspace, &a.options)?,
            Request::SandboxPublish(a) => rt.sandbox_publish(&a.workspace, a.port)?,
            Request::SandboxUnpublish(a) => rt.sandbox_unpublish(&a.workspace, a.port)?,
            Request::SandboxLog(a) => json!({"decisions": rt.sandbox_log(&a.workspace, a.tail)?}),
            // The command itself goes to the sandbox's keeper, with the caller's
            // descriptors (`SCM_RIGHTS`): this answers where (docs/sandbox.md).
            Request::Exec(a) => {
                let rec = rt.sandbox_status(&a.workspace)?;
                let name = rec["name"].as_str().unwrap_or_default().to_string();
                let (_, sock) = sandbox_api::keeper::paths(&rt.sandbox_state_dir(), &name);
                json!({"workspace": rec["workspace"], "socket": sock})
            }
            Request::FilesStat(a) => json!(rt.files(&a.workspace)?.stat(a.inside()?)?),
            Request::FilesList(a) => {
                json!({"entries": rt.files(&a.workspace)?.list(a.inside()?, a.recursive)?})
            }
            Request::FilesRead(a) => {
                use base64::Engine as _;
                let data = rt
                    .files(&a.workspace)?
                    .read(a.inside()?, a.offset, a.length)?;
                json!({"data": base64::engine::general_purpose::STANDARD.encode(&data), "length": data.len(), "offset": a.offset})
            }
            Request::FilesWrite(a) => {
                use base64::Engine as _;
                let data = base64::engine::general_purpose::STANDARD
                    .decode(a.data.as_deref().unwrap_or(""))
                    .map_err(|e| Error::Invalid(format!("args.data: not base64: {e}")))?;
                json!(
                    rt.files(&a.workspace)?
                        .write(a.inside()?, &data, a.mode, a.append)?
                )
            }
            Request::FilesMkdir(a) => {
                json!(
                    rt.files(&a.workspace)?
                        .mkdir(a.inside()?, a.parents, a.mode)?
                )
            }
            Request::FilesRemove(a) => {
                rt.files(&a.workspace)?.remove(a.inside()?, a.recursive)?;
                json!({"removed": a.path})
            }
            Request::FilesRename(a) => {
                let to = a
                    .to
                    .as_deref()
                    .ok_or_else(|| Error::Invalid("args.to (the new path) is required".into()))?;
                json!(rt.files(&a.workspace)?.rename(a.inside()?, to)?)
            }
            Request::FilesSymlink(a) => {
                let to = a.to.as_deref().ok_or_else(|| {
                    Error::Invalid("args.to (the link's target) is required".into())
                })?;
                json!(rt.files(&a.workspace)?.symlink(a.inside()?, to)?)
            }
            Request::Watch(a) => self.watch(&a, events)?,
            Request::Recover(a) => json!(rt.recover(&a.workspace)?),
            Request::Snapshots(_) => cowspace::ops::snapshots(rt.store())?,
            Request::Refs(_) => cowspace::ops::refs(rt.store())?,
            Request::RefSet(a) => cowspace::ops::ref_set(
                rt.store(),
                &a.name,
                &a.snapshot,
                a.expect.as_deref(),
                a.force,
            )?,
            Request::RefDelete(a) => cowspace::ops::ref_delete(rt.store(), &a.name, &a.expect)?,
            Request::Show(a) => cowspace::ops::show(rt.store(), &a.snapshot, &a.path)?,
            Request::Stats(_) => cowspace::ops::stats(rt.store())?,
            Request::Remotes(_) => cowspace::remote::list_json(rt.store())?,
            Request::Push(a) => json!(cowspace::remote::push(
                rt.store(),
                a.remote.as_deref(),
                &a.snapshot,
                a.force,
            )?),
            Request::Pull(a) => json!(cowspace::remote::pull(
                rt.store(),
                a.remote.as_deref(),
                &a.snapshot,
            )?),
            Request::Fetch(a) => json!(cowspace::remote::fetch(rt.store(), a.remote.as_deref())?),
            Request::RemoteGc(a) => json!(cowspace::remote::gc::gc(
                rt.store(),
                a.remote.as_deref(),
                a.dry_run,
                a.grace,
            )?),
            Request::Gc(a) => rt.gc(&a)?.to_json(),
            Request::Export(a) => {
                caller.may_name_host_paths("export")?;
                cowspace::ops::export(
                    rt.store(),
                    &a.snapshot,
                    &abs_path_arg("dest", &a.dest)?,
                    a.tar,
                )?
            }
            Request::Import(a) => {
                caller.may_name_host_paths("import")?;
                let source = abs_path_arg("source", &a.source)?;
                self.import(&source, a, events)?
            }
            Request::MountWorkspace(a) => {
                let rec = rt.status(&a.workspace)?;
                self.host.mount(&rec)?;
                json!({"workspace": rec.id, "path": rec.path, "served": true})
            }
            Request::FinishCopies(a) => {
                let rec = rt.status(&a.workspace)?;
                self.host.finish_copies(&rec)?;
                json!({"workspace": rec.id, "finished": true})
            }
            Request::UnmountWorkspace(a) => {
                let rec = rt.status(&a.workspace)?;
                let was = self.host.unmount(&rec.id);
                json!({"workspace": rec.id, "served": false, "was_served": was})
            }
            Request::Shutdown(a) => {
                let users = (self.busy)();
                if !users.is_empty() && !a.force {
                    return Err(Error::DaemonInUse { users });
                }
                self.stop.store(true, Ordering::SeqCst);
                json!({"stopping": true})
            }
        })
    }

    /// Streams a workspace's change events as event lines until the workspace goes or
    /// the client stops reading (a failed send ends it); answers `{"ended": true}`.
    fn watch(&self, a: &cowspace::protocol::FilesArgs, events: &Events<'_>) -> Result<Value> {
        let files = self.runtime.files(&a.workspace)?;
        let mut w = cowspace::watch::Watcher::new(files, &a.path)?;
        events(
            &json!({"event": "watching", "path": if a.path.is_empty() { "." } else { a.path.as_str() }}),
        );
        loop {
            if !events(&Value::Null) {
                return Ok(json!({"ended": true, "why": "the client went away"}));
            }
            if self.stop.load(Ordering::SeqCst) {
                return Ok(json!({"ended": true, "why": "the daemon is stopping"}));
            }
            match w.next(std::time::Duration::from_millis(WATCH_POLL_MS))? {
                cowspace::watch::Next::Ended => {
                    return Ok(json!({"ended": true, "why": "the workspace is gone"}));
                }
                cowspace::watch::Next::Events(evs) => {
                    for e in evs {
                        if !events(&json!(e)) {
                            return Ok(json!({"ended": true, "why": "the client went away"}));
                        }
                    }
                }
            }
        }
    }

    /// Imports `source` as `mountctl import` does, sending progress events while it runs
    /// when asked.
    fn import(
        &self,
        source: &std::path::Path,
        a: ImportArgs,
        events: &Events<'_>,
    ) -> Result<Value> {
        let mut config = cowspace_store::StoreConfig::default();
        if let Some(l) = a.zstd_level {
            config.zstd_level = l;
        }
        if let Some(t) = a.threads {
            config.workers = t;
        }
        let mut options = cowspace_store::ImportOptions::new();
        options.ref_name = a.ref_name;
        if let Some(m) = a.message {
            options.message = m;
        }
        options.default_excludes = !a.no_default_excludes;
        options.excludes = a.excludes;
        options.allow_devices = a.allow_devices;
        options.allow_external_symlinks = a.allow_external_symlinks;
        let imported = std::thread::scope(|scope| {
            let (tx, rx) = std::sync::mpsc::channel::<cowspace_store::Progress>();
            if a.progress {
                options.progress = Some(Arc::new(move |p| {
                    let _ = tx.send(p);
                }));
                // Events leave from this thread, at most one per PROGRESS_EVERY_MS, the
                // last one always.
                scope.spawn(move || {
                    let mut last: Option<std::time::Instant> = None;
                    let mut pending = None;
                    let send = |p: &cowspace_store::Progress| {
                        let _ = events(&json!({"event": "progress", "files_done": p.files_done,
                            "files_total": p.files_total, "bytes_done": p.bytes_done}));
                    };
                    while let Ok(p) = rx.recv() {
                        let due = last.is_none_or(|t| {
                            t.elapsed() >= std::time::Duration::from_millis(PROGRESS_EVERY_MS)
                        });
                        if due {
                            send(&p);
                            last = Some(std::time::Instant::now());
                            pending = None;
                        } else {
                            pending = Some(p);
                        }
                    }
                    if let Some(p) = pending {
                        send(&p);
                    }
                });
            } else {
                drop(tx);
            }
            cowspace::import::import(
                self.runtime.root(),
                cowspace::import::ImportRequest {
                    source,
                    git_rev: a.git.as_deref(),
                    options,
                    config,
                    git_fsmonitor: !a.no_git_fsmonitor,
                },
            )
        })?;
        let mut v = json!(imported.report);
        v["notes"] = json!(imported.notes);
        Ok(v)
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
                        let _ = reply(&stream, &error_value(&Error::Invalid(why)));
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
        let caller = Caller {
            uid: nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials)
                .map(|c| c.uid())
                .unwrap_or(u32::MAX),
        };
        let writer = std::sync::Mutex::new(match stream.try_clone() {
            Ok(s) => s,
            Err(_) => return,
        });
        let events = |v: &Value| {
            if v.is_null() {
                let mut fds = [PollFd::new(
                    stream.as_fd(),
                    PollFlags::from_bits_retain(libc::POLLRDHUP),
                )];
                return !matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0);
            }
            let w = writer.lock().unwrap_or_else(|p| p.into_inner());
            reply(&w, v).is_ok()
        };
        let mut reader = BufReader::new(&stream);
        loop {
            let mut line = String::new();
            match (&mut reader).take(MAX_REQUEST_BYTES).read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let resp = self.handle_line(&line, caller, &events);
            let sent = reply(&writer.lock().unwrap_or_else(|p| p.into_inner()), &resp);
            if sent.is_err() || self.stop.load(Ordering::SeqCst) {
                return;
            }
        }
    }
}

fn reply(mut stream: &UnixStream, v: &Value) -> std::io::Result<()> {
    // A `Value` always serialises (its map keys are strings); an error is the writer's.
    let mut out = serde_json::to_vec(v).map_err(std::io::Error::other)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_root_and_the_daemons_user_may_name_host_paths() {
        let me = nix::unistd::geteuid().as_raw();
        assert!(Caller { uid: 0 }.may_name_host_paths("import").is_ok());
        assert!(Caller { uid: me }.may_name_host_paths("import").is_ok());
        let other = if me == 0 { 4_000_123 } else { me + 1 };
        let e = Caller { uid: other }
            .may_name_host_paths("export")
            .unwrap_err()
            .to_string();
        assert!(e.contains("mountctl export"), "{e}");
        assert!(e.contains(&format!("uid {other}")), "{e}");
    }

    #[test]
    fn sandbox_refusals_on_the_socket_name_its_arguments() {
        let e = socket_names(Error::Invalid(
            "--memory \"lots\": expected bytes; --cpuset-cpus and --net too".into(),
        ));
        let m = e.to_string();
        assert!(m.contains("args.memory \"lots\""), "{m}");
        assert!(
            m.contains("args.cpuset_cpus") && m.contains("args.net"),
            "{m}"
        );
        assert!(!m.contains("--"), "{m}");
        assert_eq!(e.kind().as_str(), "invalid_input");
    }

    #[test]
    fn path_arguments_must_be_absolute() {
        let e = abs_path_arg("source", "relative/dir")
            .unwrap_err()
            .to_string();
        assert!(e.contains("absolute"), "{e}");
        assert_eq!(
            abs_path_arg("source", "/abs").unwrap(),
            std::path::PathBuf::from("/abs")
        );
        assert!(abs_path_arg("source", "").is_err());
    }
}
