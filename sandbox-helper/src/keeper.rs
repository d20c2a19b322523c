//! The keeper of a long-lived sandbox: the helper process that set the sandbox up stays
//! with it, serving execs, status and stop on a Unix socket, until the sandbox stops.
//!
//! The keeper is the parent of the sandbox's init, which has a parent-death signal: if
//! the keeper dies (even by `SIGKILL`), init dies, and with it every process of the
//! sandbox's pid namespace. Its leases (uid range, ports, name) are `flock`s that end
//! with it. A sandbox therefore never outlives its keeper.
//!
//! The socket is `STATE/keep/NAME.sock` (mode 0600, in a 0700 directory: only root
//! reaches it), `SOCK_SEQPACKET`, one JSON message per packet:
//! - client → keeper, first message: `{"op":"exec","request":{...}}` with the client's
//!   stdin, stdout and stderr (`SCM_RIGHTS`; none when `request.tty` is set), or
//!   `{"op":"status"}`, or `{"op":"stop"}`, or `{"op":"pause"}`, `{"op":"resume"}`,
//!   `{"op":"suspend"}` (one answer each; see [`pause`]), or a network change.
//! - exec: keeper → client `{"started":PID}` (with the pseudo-terminal's master when
//!   `tty`), then `{"exit":STATUS}` when the command ends; or
//!   `{"error":{"kind":..,"message":..},"exit":STATUS}` when it did not start (127: the
//!   command does not exist). client → keeper, meanwhile: `{"signal":N}` forwards
//!   signal N to the command; closing the connection before the exit kills it.
//! - status: one object (see [`Status`]). stop: `{"stopped":true,"oom_kills":N}` once
//!   every process is gone and the sandbox's cgroups, ports and mounts are freed.

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::fcntl::{Flock, FlockArg};
use nix::sys::signal::{Signal, kill};
use nix::sys::socket::{
    AddressFamily, Backlog, SockFlag, SockType, UnixAddr, accept4, bind, listen, socket,
};
use nix::unistd::Pid;
use serde_json::{Value, json};

use crate::error::{Error, Result};
use crate::serve::{ExecRequest, recv_msg, send_msg};

mod init_backend;
mod pause;
pub(crate) use init_backend::InitBackend;
pub(crate) use pause::vm_suspend_refusal;

/// Most clients connected to one keeper at once.
pub const MAX_CLIENTS: usize = 512;

/// The name lock and the listening socket of a keeper, taken before anything else.
#[derive(Debug)]
pub struct Listener {
    _lock: Flock<File>,
    sock: OwnedFd,
    path: PathBuf,
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Takes the name `name` (refused with [`Error::AlreadyRunning`] while another keeper
/// holds it) and listens on its socket.
pub fn listen_on(state: &Path, name: &str) -> Result<Listener> {
    let (lock_path, sock_path) = paths(state, name);
    let dir = &sandbox_api::keeper::keep_dir(state);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| Error::StateDir {
            path: dir.to_path_buf(),
            source,
        })?;
    let state_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::StateDir { path, source }
    };
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(state_err(&lock_path))?;
    let lock =
        Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|_| Error::AlreadyRunning {
            name: name.to_string(),
        })?;
    // The name is ours: a socket file left by a keeper that was killed is stale.
    let _ = std::fs::remove_file(&sock_path);
    let sock = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| state_err(&sock_path)(e.into()))?;
    let addr = UnixAddr::new(&sock_path).map_err(|e| state_err(&sock_path)(e.into()))?;
    bind(sock.as_raw_fd(), &addr).map_err(|e| state_err(&sock_path)(e.into()))?;
    std::fs::set_permissions(&sock_path, std::fs::Permissions::from_mode(0o600))
        .map_err(state_err(&sock_path))?;
    let backlog = Backlog::new(128).map_err(|e| state_err(&sock_path)(e.into()))?;
    listen(&sock, backlog).map_err(|e| state_err(&sock_path)(e.into()))?;
    Ok(Listener {
        _lock: lock,
        sock,
        path: sock_path,
    })
}

/// What the sandbox told the keeper about one exec.
#[derive(Debug)]
pub(crate) enum InitMsg {
    /// Started: its pid inside, and the pseudo-terminal's master when asked for.
    Started(i32, Option<OwnedFd>),
    /// Not started: errno, and what failed (0 the command, 1 the working directory, 2
    /// the request).
    Failed(i32, u8),
    /// Ended with this status (128 + N when killed by signal N).
    Done(i32),
    /// The sandbox is gone.
    Gone,
}

/// Where a keeper's execs run: the namespace sandbox's init ([`InitBackend`]), or a
/// VM's guest agent (`vm::agent::VmBackend`). Everything else of the keeper (the
/// socket, its protocol, status and stop) is the same for both.
pub(crate) trait Backend: Send + Sync {
    /// Starts exec `id` with the client's stdin, stdout and stderr (none for a
    /// pseudo-terminal); what becomes of it is sent to `tx`. An error: it was not sent.
    fn exec(
        &self,
        id: u64,
        req: &ExecRequest,
        stdio: Vec<OwnedFd>,
        tx: Sender<InitMsg>,
    ) -> std::io::Result<()>;
    /// Forwards signal `sig` to exec `id`'s process.
    fn signal(&self, id: u64, sig: i32);
    /// Execs started and not ended.
    fn running(&self) -> usize;
    /// Processes in the sandbox (init included), where the host can count them.
    fn processes(&self) -> Option<usize>;
    /// Winds the sandbox down before `stop` kills what is left (a VM's guest ends its
    /// processes and unmounts the workspace); returns when done or given up.
    fn wind_down(&self) {}
    /// Stops every process of the sandbox where it is, its memory kept; returns once
    /// all are stopped. `cgroups` are the sandbox's group directories. Refused as
    /// unsupported, naming why, where the host cannot.
    fn pause(&self, cgroups: &[PathBuf]) -> Result<()>;
    /// Lets them run again.
    fn resume(&self, cgroups: &[PathBuf]) -> Result<()>;
    /// Saves the sandbox with its processes to disk (refused, naming why, where the
    /// host cannot: every backend so far).
    fn suspend(&self) -> Result<Value>;
    /// The egress proxy the backend itself holds (a VM's; a namespace sandbox's is its
    /// [`crate::net::Network`]'s).
    fn egress(&self) -> Option<&crate::egress::EgressProxy> {
        None
    }
}

/// What every connection thread shares.
struct Shared {
    name: String,
    backend: Arc<dyn Backend>,
    init_pid: Pid,
    next_id: AtomicU64,
    clients: AtomicUsize,
    stop_waiters: Mutex<Vec<OwnedFd>>,
    status: Value,
    cgroups: Vec<PathBuf>,
    /// Ports and egress, changed while it runs (a namespace sandbox's; `None` for a VM).
    net: Option<Arc<crate::net::Network>>,
    /// Paused or not, and the idle timer.
    pause: pause::PauseState,
    /// Set once a stop began (the idle timer ends).
    stopping: std::sync::atomic::AtomicBool,
}

pub use sandbox_api::keeper::{
    Client, KeeperRequest, MAX_CLIENT_MESSAGE_BYTES, Started, Status, paths, set_terminal_size,
    terminal_size,
};

/// Serves the sandbox's execs through `backend` until it ends (stopped, or killed from
/// outside): `init_pid` is the host process whose `SIGKILL` ends it (the namespace
/// sandbox's init; a VM's qemu), and the caller's to wait for. `status` is the static
/// part of the status answer (name, ports, limits, ...; its `idle_timeout_ms` starts the
/// idle timer). Returns at once; once the
/// sandbox has ended, the caller frees it and calls [`Stopped::reply`].
pub(crate) fn serve(
    listener: &Listener,
    backend: Arc<dyn Backend>,
    init_pid: Pid,
    status: Value,
    cgroups: Vec<PathBuf>,
    net: Option<Arc<crate::net::Network>>,
) -> Stopped {
    let idle_timeout = status["idle_timeout_ms"]
        .as_u64()
        .map(Duration::from_millis);
    let shared = Arc::new(Shared {
        pause: pause::PauseState::new(idle_timeout),
        stopping: std::sync::atomic::AtomicBool::new(false),
        name: status["name"].as_str().unwrap_or_default().to_string(),
        backend,
        init_pid,
        next_id: AtomicU64::new(1),
        clients: AtomicUsize::new(0),
        stop_waiters: Mutex::new(Vec::new()),
        status,
        cgroups,
        net,
    });
    if let Some(n) = &shared.net {
        let weak = Arc::downgrade(&shared);
        n.on_activity(Arc::new(move || {
            if let Some(s) = weak.upgrade() {
                pause::wake(&s);
            }
        }));
    }
    pause::start_idle_timer(&shared);
    let accept = listener.sock.try_clone().and_then(|lsock| {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name("accept".into())
            .spawn(move || accept_loop(&lsock, &shared))
    });
    let signals = accept.and_then(|_| {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || stop_on_signal(&shared))
    });
    if let Err(e) = signals {
        // Nobody could reach or stop the sandbox: it is ended, and the caller, waiting
        // for init, frees it.
        eprintln!(
            "sandbox-helper: {}: the keeper cannot start its threads ({e}); the sandbox is \
             stopped",
            shared.name
        );
        shared.stopping.store(true, Ordering::SeqCst);
        pause::thaw_for_stop(&shared);
        let _ = kill(shared.init_pid, Signal::SIGKILL);
    }
    Stopped { shared }
}

/// The sandbox's init has ended (or is to be waited for): who asked for the stop.
pub(crate) struct Stopped {
    shared: Arc<Shared>,
}

impl Stopped {
    /// Answers every `stop` request once the sandbox is freed.
    pub(crate) fn reply(&self, oom_kills: u64) {
        let waiters = std::mem::take(
            &mut *self
                .shared
                .stop_waiters
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        let msg = json!({"stopped": true, "oom_kills": oom_kills}).to_string();
        for w in waiters {
            let _ = send_msg(w.as_raw_fd(), msg.as_bytes(), &[]);
        }
    }
}

/// SIGTERM, SIGINT or SIGHUP to the keeper stops the sandbox (thawed first: a frozen
/// process does not die).
fn stop_on_signal(shared: &Shared) {
    let mut set = nix::sys::signal::SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        set.add(s);
    }
    loop {
        if let Ok(Some(_)) = crate::sys::sigtimedwait(&set, Duration::from_secs(3600)) {
            shared.stopping.store(true, Ordering::SeqCst);
            pause::thaw_for_stop(shared);
            let _ = kill(shared.init_pid, Signal::SIGKILL);
            return;
        }
    }
}

fn accept_loop(lsock: &OwnedFd, shared: &Arc<Shared>) {
    loop {
        let conn = match accept4(lsock.as_raw_fd(), SockFlag::SOCK_CLOEXEC) {
            Ok(fd) => crate::sys::adopt_received_fd(fd),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if shared.clients.fetch_add(1, Ordering::SeqCst) >= MAX_CLIENTS {
            shared.clients.fetch_sub(1, Ordering::SeqCst);
            let _ = reply(
                &conn,
                &error_json(
                    "busy",
                    &format!("more than {MAX_CLIENTS} clients at once"),
                    1,
                ),
            );
            continue;
        }
        let shared = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("client".into())
            .spawn(move || {
                serve_client(&conn, &shared);
                shared.clients.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

fn reply(conn: &OwnedFd, v: &Value) -> std::io::Result<()> {
    send_msg(conn.as_raw_fd(), v.to_string().as_bytes(), &[])
}

fn error_json(kind: &str, message: &str, exit: u8) -> Value {
    json!({"error": {"kind": kind, "message": message}, "exit": exit})
}

fn serve_client(conn: &OwnedFd, shared: &Arc<Shared>) {
    let Ok((msg, fds)) = recv_msg(conn.as_raw_fd(), 3) else {
        return;
    };
    let req = match serde_json::from_slice::<KeeperRequest>(&msg) {
        Ok(r) => r,
        Err(e) => {
            let _ = reply(
                conn,
                &error_of(&Error::InvalidInput(format!("bad request: {e}"))),
            );
            return;
        }
    };
    match req {
        KeeperRequest::Status => {
            let _ = reply(conn, &status(shared));
        }
        KeeperRequest::Stop => {
            if let Ok(c) = conn.try_clone() {
                shared
                    .stop_waiters
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(c);
            }
            shared.stopping.store(true, Ordering::SeqCst);
            pause::thaw_for_stop(shared);
            shared.backend.wind_down();
            let _ = kill(shared.init_pid, Signal::SIGKILL);
        }
        KeeperRequest::Pause => {
            let answer = pause::pause(shared, pause::PausedBy::Request);
            let _ = reply(conn, &answer.unwrap_or_else(|e| error_of(&e)));
        }
        KeeperRequest::Resume => {
            let answer = pause::resume(shared);
            let _ = reply(conn, &answer.unwrap_or_else(|e| error_of(&e)));
        }
        KeeperRequest::Suspend => {
            let answer = shared.backend.suspend();
            let _ = reply(conn, &answer.unwrap_or_else(|e| error_of(&e)));
        }
        KeeperRequest::Exec { request } => exec(conn, shared, request, fds),
        KeeperRequest::Policy {
            changes,
            inject,
            remove_inject,
        } => {
            let answer = egress_of(shared)
                .ok_or_else(|| {
                    Error::NotStartedWith(format!(
                        "sandbox {:?} was not started with --net egress: it has no egress \
                         policy to change",
                        shared.name
                    ))
                })
                .and_then(|e| {
                    let policy = if inject.is_empty() && remove_inject.is_empty() {
                        e.change(&changes)?
                    } else {
                        e.change_with_injections(&changes, &inject, &remove_inject)?
                    };
                    Ok(json!({"policy": policy, "allows_nothing": policy.allow.is_empty()}))
                });
            let _ = reply(conn, &answer.unwrap_or_else(|e| error_of(&e)));
        }
        KeeperRequest::Publish { port } => {
            let answer = net_of(shared)
                .and_then(|n| n.publish(port))
                .map(|host| json!({"port": port, "host_port": host}));
            let _ = reply(conn, &answer.unwrap_or_else(|e| error_of(&e)));
        }
        KeeperRequest::Unpublish { port } => {
            let answer = net_of(shared)
                .and_then(|n| n.unpublish(port))
                .map(|host| json!({"port": port, "host_port": host, "unpublished": true}));
            let _ = reply(conn, &answer.unwrap_or_else(|e| error_of(&e)));
        }
    }
}

/// The sandbox's egress proxy, wherever its placement keeps it.
fn egress_of(shared: &Shared) -> Option<&crate::egress::EgressProxy> {
    match &shared.net {
        Some(n) => n.egress(),
        None => shared.backend.egress(),
    }
}

/// The live network of a namespace sandbox; a VM's ports are fixed at start.
fn net_of(shared: &Shared) -> Result<&crate::net::Network> {
    shared.net.as_deref().ok_or_else(|| Error::Unsupported {
        control: "changing a VM sandbox's network while it runs",
        reason: "a VM's ports are qemu's forwards, fixed at start: publish them with \
                 `sandbox start --vm --publish PORT`"
            .into(),
    })
}

/// An error as the keeper answers it, with the one kind table ([`Error::kind`]).
fn error_of(e: &Error) -> Value {
    let k = e.kind();
    json!({"error": {"kind": k.as_str(), "message": e.to_string(), "hint": e.hint()}, "exit": k.exit_code()})
}

/// Refuses descriptors a sandboxed process must never hold: a directory (or an `O_PATH`
/// descriptor) of the host would let it walk the host's tree through
/// `/proc/self/fd/N` or `openat` (runc CVE-2024-21626).
fn check_stdio(fds: &[OwnedFd]) -> std::result::Result<(), String> {
    for (i, fd) in fds.iter().enumerate() {
        let st = nix::sys::stat::fstat(fd).map_err(|e| format!("descriptor {i}: {e}"))?;
        if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            return Err(format!("descriptor {i} is a directory"));
        }
        let fl = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFL)
            .map_err(|e| format!("descriptor {i}: {e}"))?;
        if fl & libc::O_PATH != 0 {
            return Err(format!("descriptor {i} is an O_PATH descriptor"));
        }
    }
    Ok(())
}

fn exec(conn: &OwnedFd, shared: &Arc<Shared>, req: ExecRequest, fds: Vec<OwnedFd>) {
    if req.argv.is_empty() {
        let _ = reply(conn, &error_json("invalid_input", "no command given", 9));
        return;
    }
    let want = if req.tty.is_some() { 0 } else { 3 };
    if fds.len() != want {
        let _ = reply(
            conn,
            &error_json(
                "invalid_input",
                &format!("expected {want} descriptors, got {}", fds.len()),
                9,
            ),
        );
        return;
    }
    if let Err(e) = check_stdio(&fds) {
        let _ = reply(conn, &error_json("invalid_input", &e, 9));
        return;
    }
    let id = shared.next_id.fetch_add(1, Ordering::SeqCst);
    let (tx, rx) = channel();
    // Paused by request: refused at once (busy, 5); paused for idleness: resumed first.
    let sent = match pause::unless_paused(shared, || shared.backend.exec(id, &req, fds, tx)) {
        Ok(sent) => sent,
        Err(why) => {
            let _ = reply(conn, &error_json("busy", &why, 5));
            return;
        }
    };
    if let Err(e) = sent {
        let _ = reply(
            conn,
            &error_json("io", &format!("the sandbox is stopping: {e}"), 1),
        );
        return;
    }
    let cmd = req.argv[0].clone();
    match rx.recv() {
        Ok(InitMsg::Started(pid, master)) => {
            let msg = json!({"started": pid}).to_string();
            let master_raw: Vec<RawFd> = master.iter().map(|m| m.as_raw_fd()).collect();
            if send_msg(conn.as_raw_fd(), msg.as_bytes(), &master_raw).is_err() {
                shared.backend.signal(id, 9);
            }
            drop(master);
        }
        Ok(InitMsg::Failed(errno, what)) => {
            let err = std::io::Error::from_raw_os_error(errno);
            let v = match what {
                1 => error_json(
                    "invalid_input",
                    &format!(
                        "working directory {} does not exist inside the sandbox",
                        req.workdir
                            .as_deref()
                            .or(shared.status["workdir"].as_str())
                            .unwrap_or(crate::spec::DEFAULT_WORKDIR)
                    ),
                    9,
                ),
                0 if errno == libc::ENOENT => error_json(
                    "not_found",
                    &format!("{cmd}: command not found in the sandbox"),
                    127,
                ),
                0 if errno == libc::EACCES => {
                    error_json("invalid_input", &format!("{cmd}: permission denied"), 126)
                }
                0 => error_json("io", &format!("{cmd}: {err}"), 126),
                _ => error_json("invalid_input", &format!("bad exec request: {err}"), 9),
            };
            let _ = reply(conn, &v);
            return;
        }
        Ok(InitMsg::Gone) | Err(_) => {
            let _ = reply(conn, &error_json("io", "the sandbox stopped", 137));
            return;
        }
        Ok(InitMsg::Done(code)) => {
            let _ = reply(conn, &json!({"exit": code}));
            return;
        }
    }
    // Running: forward the client's signals; its hang-up kills the command.
    let forwarder = {
        let shared = shared.clone();
        let conn = conn.try_clone();
        std::thread::Builder::new()
            .name("client-signals".into())
            .spawn(move || {
                let Ok(conn) = conn else { return };
                loop {
                    let sig = match recv_msg(conn.as_raw_fd(), 0) {
                        Ok((m, _)) if m.is_empty() => 9,
                        Ok((m, _)) => match serde_json::from_slice::<Value>(&m) {
                            Ok(v) if v["signal"].is_i64() => {
                                v["signal"].as_i64().unwrap_or(0) as i32
                            }
                            _ => continue,
                        },
                        Err(_) => 9,
                    };
                    shared.backend.signal(id, sig);
                    if sig == 9 {
                        return;
                    }
                }
            })
    };
    let code = match rx.recv() {
        Ok(InitMsg::Done(code)) => code,
        _ => 137,
    };
    // The idle timer counts from the end of the last exec.
    shared.pause.touch();
    let _ = reply(conn, &json!({"exit": code}));
    // The forwarder ends when the client closes its end (a late kill finds no process:
    // init forgets an exec's pid once it is reaped).
    drop(forwarder);
}

fn read_trim(p: &Path) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

/// The live part of the status: processes, memory, OOM kills, execs running.
fn status(shared: &Shared) -> Value {
    let mut v = shared.status.clone();
    let procs = shared.backend.processes();
    let mut memory = None;
    let mut oom = None;
    for d in &shared.cgroups {
        if let Some(m) = read_trim(&d.join("memory.usage_in_bytes"))
            .or_else(|| read_trim(&d.join("memory.current")))
        {
            memory = m.parse::<u64>().ok();
        }
        if let Some(o) =
            read_trim(&d.join("memory.oom_control")).or_else(|| read_trim(&d.join("memory.events")))
        {
            oom = o
                .lines()
                .find_map(|l| l.strip_prefix("oom_kill "))
                .and_then(|n| n.trim().parse::<u64>().ok());
        }
    }
    shared.pause.status_into(&mut v);
    v["processes"] = json!(procs);
    v["memory_bytes"] = json!(memory);
    v["oom_kills"] = json!(oom.unwrap_or(0));
    v["execs_running"] = json!(shared.backend.running());
    v["name"] = json!(shared.name);
    if let Some(n) = &shared.net {
        v["ports"] = n.ports_json();
    }
    if let Some(e) = egress_of(shared) {
        v["egress"] = e.status();
    }
    v
}
