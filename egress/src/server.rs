//! The running proxy: accept loops, one thread per connection, live policy, statistics.
//!
//! [`Egress::start`] takes the three sockets the privileged helper made inside the
//! sandbox's network namespace and serves them from threads of this (host-side) process:
//! an accept loop for the HTTP proxy, one for SOCKS5, one receive loop for DNS. Each
//! accepted connection gets its own thread with a [`CONNECTION_STACK_BYTES`] stack; past
//! [`MAX_OPEN_CONNECTIONS`] open connections a new one is closed at once and counted in
//! [`Stats::connections_refused`]. A thread that cannot be spawned closes its connection.
//!
//! [`Egress::set_policy`] replaces the whole policy atomically: every decision made after
//! it returns uses the new policy (new connections, and each new request on a keep-alive
//! HTTP connection). Established tunnels and requests already admitted are **not** cut.
//!
//! [`Egress::stop`] (and `Drop`) stops accepting and joins the accept threads, within
//! [`ACCEPT_POLL`]. Connections already open run until they close or go idle
//! ([`crate::IDLE_TIMEOUT`]).

use std::fs::File;
use std::io;
use std::net::{IpAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::inject::{InjectConfig, InjectState};
use crate::log::DecisionLog;
use crate::policy::{Policy, PolicyChange, Resolve};
use crate::shared::{OpenGuard, Shared};
use crate::stats::{Stats, StatsTable};

/// Most client connections (HTTP and SOCKS together) open at once.
pub const MAX_OPEN_CONNECTIONS: usize = 4096;
/// Stack of each connection thread.
pub const CONNECTION_STACK_BYTES: usize = 128 * 1024;
/// How often the accept loops look at the stop flag.
pub const ACCEPT_POLL: Duration = Duration::from_millis(100);
/// Pause after a failed `accept` (e.g. out of descriptors) so the loop does not spin.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(20);

/// The sockets to serve, all created inside the sandbox's network namespace.
#[derive(Debug)]
pub struct Listeners {
    /// The HTTP proxy's listener (127.0.0.1:3128 inside).
    pub http: TcpListener,
    /// The SOCKS5 proxy's listener (127.0.0.1:1080 inside).
    pub socks: TcpListener,
    /// The DNS socket (127.0.0.1:53 inside).
    pub dns: UdpSocket,
}

/// Optional settings of [`Egress::start_with`].
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The host's own addresses: refused like private ones unless named by `add_hosts`.
    pub host_addrs: Vec<IpAddr>,
}

/// A running egress proxy for one sandbox.
pub struct Egress {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for Egress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Egress")
            .field("policy", &self.policy())
            .finish_non_exhaustive()
    }
}

type Handler = fn(&Shared, TcpStream, Option<String>);

impl Egress {
    /// Starts serving `listeners` under `policy`, logging decisions to `log` (open it for
    /// appending) and resolving names with `resolver`.
    pub fn start(
        listeners: Listeners,
        policy: Policy,
        log: File,
        resolver: Arc<dyn Resolve + Send + Sync>,
    ) -> io::Result<Egress> {
        Egress::start_with(listeners, policy, log, resolver, Options::default())
    }

    /// [`Egress::start`] with [`Options`].
    pub fn start_with(
        listeners: Listeners,
        policy: Policy,
        log: File,
        resolver: Arc<dyn Resolve + Send + Sync>,
        options: Options,
    ) -> io::Result<Egress> {
        let shared = Arc::new(Shared {
            policy: RwLock::new(Arc::new(policy)),
            resolver,
            host_addrs: options.host_addrs,
            log: DecisionLog::new(log),
            stats: StatsTable::default(),
            open: AtomicUsize::new(0),
            refused: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
            inject: RwLock::new(Arc::new(InjectState::default())),
        });
        listeners.http.set_nonblocking(true)?;
        listeners.socks.set_nonblocking(true)?;
        let egress = Egress {
            shared: shared.clone(),
            threads: Mutex::new(Vec::new()),
        };
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new().name(name.into()).spawn(f)
        };
        let mut threads = Vec::new();
        let s = shared.clone();
        let http = listeners.http;
        threads.push(spawn(
            "egress-http",
            Box::new(move || accept_loop(s, http, crate::http::serve)),
        )?);
        let s = shared.clone();
        let socks = listeners.socks;
        threads.push(spawn(
            "egress-socks",
            Box::new(move || accept_loop(s, socks, crate::socks::serve)),
        )?);
        let s = shared;
        let dns = listeners.dns;
        threads.push(spawn(
            "egress-dns",
            Box::new(move || crate::dns::serve(s, dns, ACCEPT_POLL)),
        )?);
        *egress.threads.lock().unwrap_or_else(|e| e.into_inner()) = threads;
        Ok(egress)
    }

    /// Replaces the policy; decisions made from now on use it.
    pub fn set_policy(&self, policy: Policy) {
        *self
            .shared
            .policy
            .write()
            .unwrap_or_else(|e| e.into_inner()) = Arc::new(policy);
    }

    /// Replaces the injection rules (and the authority that terminates TLS for their
    /// hosts); refused, with the rules in force kept, when one does not check.
    pub fn set_injections(&self, config: InjectConfig) -> Result<(), String> {
        let state = InjectState::new(config)?;
        *self
            .shared
            .inject
            .write()
            .unwrap_or_else(|e| e.into_inner()) = Arc::new(state);
        Ok(())
    }

    /// The injection rules in force, as `(host, header)` pairs (never the values).
    pub fn injections(&self) -> Vec<(String, String)> {
        self.shared
            .inject()
            .rules
            .iter()
            .map(|r| (r.host.clone(), r.header.clone()))
            .collect()
    }

    /// Applies `changes` to the policy in force, atomically; returns the new policy.
    pub fn apply(&self, changes: &[PolicyChange]) -> Policy {
        let mut guard = self
            .shared
            .policy
            .write()
            .unwrap_or_else(|e| e.into_inner());
        let mut policy = Policy::clone(&guard);
        policy.apply(changes);
        *guard = Arc::new(policy.clone());
        policy
    }

    /// The policy in force.
    pub fn policy(&self) -> Policy {
        Policy::clone(&self.shared.policy())
    }

    /// A snapshot of the statistics.
    pub fn stats(&self) -> Stats {
        let mut stats = self.shared.stats.snapshot();
        stats.connections_open = self.shared.open.load(Ordering::Acquire) as u64;
        stats.connections_refused = self.shared.refused.load(Ordering::Relaxed);
        stats.log_records_dropped = self.shared.log.dropped();
        stats
    }

    /// Stops accepting and joins the accept threads; open connections finish on their own.
    pub fn stop(&self) {
        self.shared.stopping.store(true, Ordering::Release);
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for t in threads {
            let _ = t.join();
        }
    }
}

impl Drop for Egress {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(shared: Arc<Shared>, listener: TcpListener, handler: Handler) {
    let timeout = PollTimeout::try_from(ACCEPT_POLL).unwrap_or(PollTimeout::MAX);
    while !shared.stopping.load(Ordering::Acquire) {
        let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
        if !matches!(poll(&mut fds, timeout), Ok(n) if n > 0) {
            continue;
        }
        let (stream, peer) = match listener.accept() {
            Ok(x) => x,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(_) => {
                std::thread::sleep(ACCEPT_ERROR_BACKOFF);
                continue;
            }
        };
        let Some(guard) = OpenGuard::try_new(&shared, MAX_OPEN_CONNECTIONS) else {
            continue; // over the bound: `stream` closes here
        };
        if stream.set_nonblocking(false).is_err() {
            continue;
        }
        let _ = stream.set_nodelay(true);
        let s = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("egress-conn".into())
            .stack_size(CONNECTION_STACK_BYTES)
            .spawn(move || {
                let _guard = guard;
                handler(&s, stream, Some(peer.to_string()));
            });
        if spawned.is_err() {
            shared.refused.fetch_add(1, Ordering::Relaxed);
        }
    }
}
