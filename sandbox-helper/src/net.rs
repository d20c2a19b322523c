//! Published ports: a host listener per port, forwarded into the sandbox's network
//! namespace by proxy threads of the helper.
//!
//! Each proxy thread enters the sandbox's network namespace with `setns` (which affects
//! only the calling thread) and connects to `127.0.0.1:PORT` there for every connection
//! accepted on the host listener (a socket of the host's namespace, bound before the
//! sandbox started). No TUN device, no veth, no routing: the sandbox still has no
//! interface but its loopback.

use std::fs::File;
use std::io;
use std::net::{Ipv4Addr, Shutdown, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use nix::sched::CloneFlags;

use crate::alloc::PortLease;
use crate::syscall::{LinuxSyscall, Syscall};

/// Most connections forwarded at once per published port.
pub const MAX_CONNECTIONS_PER_PORT: usize = 128;
/// How long connecting inside the sandbox may take.
const CONNECT_TIMEOUT_MS: u64 = 2_000;
/// Bytes copied at once between a published port's two sockets.
const COPY_CHUNK_BYTES: usize = 64 * 1024;

/// Called on every connection accepted on a published port and every chunk of traffic
/// from outside, before it is forwarded: the keeper notes the activity (its idle
/// timer) and resumes a sandbox it paused for idleness.
pub type ActivityHook = Arc<dyn Fn() + Send + Sync>;
/// Where a network's forwarders find the hook (set once the keeper serves).
#[derive(Clone, Default)]
struct HookCell(Arc<std::sync::OnceLock<ActivityHook>>);

impl std::fmt::Debug for HookCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "HookCell(set)"
        } else {
            "HookCell(unset)"
        })
    }
}

fn note(hook: &HookCell) {
    if let Some(h) = hook.0.get() {
        h();
    }
}

/// Running proxies; dropping (or [`Proxy::stop`]) stops accepting and joins the threads.
#[derive(Debug)]
pub struct Proxy {
    leases: Vec<PortLease>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Proxy {
    /// Starts one accept thread per lease, connecting inside the network namespace `netns`
    /// (an open `/proc/PID/ns/net`).
    pub fn start(leases: Vec<PortLease>, netns: &File) -> io::Result<Proxy> {
        Proxy::start_with(leases, netns, HookCell::default())
    }

    /// [`Proxy::start`], calling `hook` on activity.
    fn start_with(leases: Vec<PortLease>, netns: &File, hook: HookCell) -> io::Result<Proxy> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for lease in &leases {
            let listener = lease.listener.try_clone()?;
            let ns = netns.try_clone()?;
            let internal = lease.internal;
            let stop = stop.clone();
            let hook = hook.clone();
            let thread = std::thread::Builder::new()
                .name(format!("publish-{internal}"))
                .spawn(move || accept_loop(listener, ns, internal, stop, hook))?;
            threads.push(thread);
        }
        Ok(Proxy {
            leases,
            stop,
            threads,
        })
    }

    /// Stops accepting and joins the accept threads. Connections in flight end when the
    /// sandbox's sockets close.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for lease in &self.leases {
            // Shutting a listening socket down wakes a thread blocked in accept.
            let _ = nix::sys::socket::shutdown(
                std::os::fd::AsRawFd::as_raw_fd(&lease.listener),
                nix::sys::socket::Shutdown::Both,
            );
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(
    listener: TcpListener,
    netns: File,
    internal: u16,
    stop: Arc<AtomicBool>,
    hook: HookCell,
) {
    if let Err(e) = LinuxSyscall.setns(netns.as_fd(), CloneFlags::CLONE_NEWNET) {
        eprintln!("sandbox-helper: publish {internal}: entering the sandbox's network: {e}");
        return;
    }
    let active = Arc::new(AtomicUsize::new(0));
    loop {
        let conn = listener.accept();
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok((outside, _)) = conn else {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        if active.load(Ordering::SeqCst) >= MAX_CONNECTIONS_PER_PORT {
            continue; // dropped: the client sees a reset
        }
        // A sandbox paused for idleness is resumed before the connection goes in.
        note(&hook);
        // Created on this thread, so the socket belongs to the sandbox's namespace.
        let inside = match TcpStream::connect_timeout(
            &(Ipv4Addr::LOCALHOST, internal).into(),
            Duration::from_millis(CONNECT_TIMEOUT_MS),
        ) {
            Ok(s) => s,
            Err(_) => continue,
        };
        active.fetch_add(1, Ordering::SeqCst);
        let active = active.clone();
        let hook = hook.clone();
        let _ = std::thread::Builder::new()
            .name(format!("conn-{internal}"))
            .spawn(move || {
                pipe_both(outside, inside, &hook);
                active.fetch_sub(1, Ordering::SeqCst);
            });
    }
}

/// Copies both directions until both are closed; traffic from outside (`a`) is noted.
fn pipe_both(a: TcpStream, b: TcpStream, hook: &HookCell) {
    let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) else {
        return;
    };
    let back = std::thread::spawn(move || copy_half(b2, a2, None));
    copy_half(a, b, Some(hook));
    let _ = back.join();
}

fn copy_half(mut from: TcpStream, mut to: TcpStream, hook: Option<&HookCell>) {
    use std::io::{Read, Write};
    let mut buf = vec![0u8; COPY_CHUNK_BYTES];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        if let Some(h) = hook {
            note(h);
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

/// A long-lived sandbox's network as its keeper changes it while it runs: its published
/// ports (one forwarder each, added and removed at any time) and its egress proxy.
#[derive(Debug)]
pub struct Network {
    name: String,
    state: std::path::PathBuf,
    netns: File,
    /// Whether the sandbox has a loopback up (`loopback` or `egress`): only then can a
    /// port be published.
    loopback: bool,
    ports: std::sync::Mutex<std::collections::BTreeMap<u16, Proxy>>,
    egress: Option<crate::egress::EgressProxy>,
    hook: HookCell,
}

impl Network {
    /// The network of sandbox `name` whose namespace is `netns`, publishing `leases`
    /// and with its egress proxy, if any.
    pub fn start(
        name: &str,
        state: &std::path::Path,
        netns: File,
        loopback: bool,
        leases: Vec<PortLease>,
        egress: Option<crate::egress::EgressProxy>,
    ) -> io::Result<Network> {
        let mut ports = std::collections::BTreeMap::new();
        let hook = HookCell::default();
        for lease in leases {
            let internal = lease.internal;
            ports.insert(
                internal,
                Proxy::start_with(vec![lease], &netns, hook.clone())?,
            );
        }
        Ok(Network {
            name: name.to_string(),
            state: state.to_path_buf(),
            netns,
            loopback,
            ports: std::sync::Mutex::new(ports),
            egress,
            hook,
        })
    }

    /// Calls `hook` on every connection to a published port and on its traffic from
    /// outside, from now on (set once; later calls are ignored).
    pub fn on_activity(&self, hook: ActivityHook) {
        let _ = self.hook.0.set(hook);
    }

    /// `{"PORT": HOST_PORT, ...}` of the ports published now.
    pub fn ports_json(&self) -> serde_json::Value {
        let ports = self.ports.lock().unwrap_or_else(|p| p.into_inner());
        ports
            .values()
            .flat_map(|p| {
                p.leases
                    .iter()
                    .map(|l| (l.internal.to_string(), l.host.into()))
            })
            .collect::<serde_json::Map<_, _>>()
            .into()
    }

    /// Publishes `internal` on a unique host port of 127.0.0.1, at once.
    pub fn publish(&self, internal: u16) -> crate::error::Result<u16> {
        use crate::error::Error;
        if !self.loopback {
            return Err(Error::NotStartedWith(format!(
                "sandbox {:?} runs with --net none: publishing {internal} needs a loopback \
                 inside (--net loopback or --net egress)",
                self.name
            )));
        }
        if internal == 0 {
            return Err(Error::InvalidInput("port 0: not a port".into()));
        }
        let mut ports = self.ports.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = ports.get(&internal) {
            let host = p.leases.first().map(|l| l.host).unwrap_or(0);
            return Err(Error::PortPublished(format!(
                "port {internal} of sandbox {:?} is published already, on 127.0.0.1:{host}",
                self.name
            )));
        }
        if ports.len() >= crate::spec::MAX_LIST_ENTRIES {
            return Err(Error::InvalidInput(format!(
                "more than {} published ports",
                crate::spec::MAX_LIST_ENTRIES
            )));
        }
        let lease = crate::alloc::lease_ports(&self.state, &self.name, &[internal])?
            .pop()
            .ok_or_else(|| Error::Busy(format!("no host port for {internal}")))?;
        let host = lease.host;
        let proxy =
            Proxy::start_with(vec![lease], &self.netns, self.hook.clone()).map_err(Error::Sync)?;
        ports.insert(internal, proxy);
        Ok(host)
    }

    /// Stops publishing `internal`: its host port closes and is free for others.
    /// Connections in flight end when their sockets close.
    pub fn unpublish(&self, internal: u16) -> crate::error::Result<u16> {
        let mut ports = self.ports.lock().unwrap_or_else(|p| p.into_inner());
        let Some(mut proxy) = ports.remove(&internal) else {
            return Err(crate::error::Error::PortNotPublished(format!(
                "port {internal} of sandbox {:?} is not published",
                self.name
            )));
        };
        let host = proxy.leases.first().map(|l| l.host).unwrap_or(0);
        proxy.stop();
        Ok(host)
    }

    /// The egress proxy, with `--net egress`.
    pub fn egress(&self) -> Option<&crate::egress::EgressProxy> {
        self.egress.as_ref()
    }

    /// Stops every forwarder and the egress proxy.
    pub fn stop(&self) {
        let mut ports = self.ports.lock().unwrap_or_else(|p| p.into_inner());
        for (_, mut p) in std::mem::take(&mut *ports) {
            p.stop();
        }
        if let Some(e) = &self.egress {
            e.stop();
        }
    }
}
