//! The guest's end of a `--net egress` VM: on `NET_EGRESS` the agent listens on the
//! guest's 127.0.0.1 (the HTTP and SOCKS ports of the egress proxy, and the resolver's
//! port over UDP) and makes `/etc/resolv.conf` name that resolver. Each accepted
//! connection becomes a guest stream relayed to the host ([`crate::netrelay`]), whose
//! keeper connects it to the sandbox's egress proxy; each DNS query a `NET_DGRAM` whose
//! answer comes back on the same id. The guest has no other way out: no interface but
//! `lo`, no route.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::Agent;
use crate::netrelay::Relay;
use crate::proto::{Frame, GUEST_STREAM_BASE, kind, parse_egress};

/// Longest DNS message relayed (plain DNS over UDP).
const MAX_DNS_BYTES: usize = 512;
/// Queries waiting for an answer at once; older ones are forgotten first.
const MAX_PENDING_QUERIES: usize = 256;
/// How long a query waits for its answer.
const QUERY_TTL: Duration = Duration::from_secs(10);

/// The guest's egress: its relay and its resolver's pending queries.
pub struct Net {
    relay: Arc<Relay>,
    next: AtomicU32,
    dns: OnceLock<UdpSocket>,
    pending: Mutex<HashMap<u32, (SocketAddr, Instant)>>,
}

impl Net {
    fn next_id(&self) -> u32 {
        // Wraps within the guest's half of the id space (ids are not reused before
        // two billion others).
        GUEST_STREAM_BASE | (self.next.fetch_add(1, Ordering::Relaxed) & !GUEST_STREAM_BASE)
    }
}

/// `NET_EGRESS`: listens and starts relaying. Runs on the frame reader's thread, so the
/// listeners are there before any later `EXEC` starts.
pub fn start(agent: &Arc<Agent>, payload: &[u8]) {
    let Some((http, socks, dns)) = parse_egress(payload) else {
        eprintln!("cowspace-guest-agent: a malformed NET_EGRESS");
        return;
    };
    if agent.net.get().is_some() {
        return;
    }
    let sender = agent.clone();
    let net = Arc::new(Net {
        relay: Relay::new(Box::new(move |f: &Frame| {
            sender.send(f);
            true
        })),
        next: AtomicU32::new(1),
        dns: OnceLock::new(),
        pending: Mutex::new(HashMap::new()),
    });
    let _ = agent.net.set(net.clone());
    if std::fs::create_dir_all("/etc")
        .and_then(|()| std::fs::write("/etc/resolv.conf", "nameserver 127.0.0.1\n"))
        .is_err()
    {
        eprintln!("cowspace-guest-agent: writing /etc/resolv.conf failed");
    }
    for port in [http, socks] {
        match TcpListener::bind((Ipv4Addr::LOCALHOST, port)) {
            Ok(l) => {
                let (agent, net) = (agent.clone(), net.clone());
                std::thread::spawn(move || accept_loop(&agent, &net, &l, port));
            }
            Err(e) => eprintln!("cowspace-guest-agent: listening on 127.0.0.1:{port}: {e}"),
        }
    }
    match UdpSocket::bind((Ipv4Addr::LOCALHOST, dns)) {
        Ok(s) => match s.try_clone() {
            Ok(recv) => {
                let _ = net.dns.set(s);
                let (agent, net) = (agent.clone(), net.clone());
                std::thread::spawn(move || dns_loop(&agent, &net, &recv));
            }
            Err(e) => eprintln!("cowspace-guest-agent: the resolver's socket: {e}"),
        },
        Err(e) => eprintln!("cowspace-guest-agent: listening on 127.0.0.1:{dns}/udp: {e}"),
    }
}

fn accept_loop(agent: &Agent, net: &Net, listener: &TcpListener, port: u16) {
    loop {
        let Ok((sock, _)) = listener.accept() else {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        };
        let id = net.next_id();
        if !net.relay.open(id) {
            // Too many at once: this one is closed at once.
            continue;
        }
        // Sent before the socket is attached: the host learns of the stream before
        // its first bytes.
        agent.send(&Frame::new(id, kind::NET_OPEN, port.to_le_bytes().to_vec()));
        let _ = sock.set_nodelay(true);
        net.relay.attach(id, sock);
    }
}

fn dns_loop(agent: &Agent, net: &Net, sock: &UdpSocket) {
    let mut buf = [0u8; MAX_DNS_BYTES];
    loop {
        let Ok((n, from)) = sock.recv_from(&mut buf) else {
            continue;
        };
        let id = net.next_id();
        {
            let mut p = net.pending.lock().unwrap_or_else(|e| e.into_inner());
            p.retain(|_, (_, at)| at.elapsed() < QUERY_TTL);
            if p.len() >= MAX_PENDING_QUERIES {
                continue;
            }
            p.insert(id, (from, Instant::now()));
        }
        agent.send(&Frame::new(id, kind::NET_DGRAM, buf[..n].to_vec()));
    }
}

/// A frame of a guest stream (ids from [`GUEST_STREAM_BASE`]).
pub fn handle(agent: &Agent, f: Frame) {
    let Some(net) = agent.net.get() else {
        return;
    };
    if f.kind == kind::NET_DGRAM {
        let to = net
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&f.stream);
        if let (Some((to, _)), Some(s)) = (to, net.dns.get()) {
            let _ = s.send_to(&f.payload[..f.payload.len().min(MAX_DNS_BYTES)], to);
        }
        return;
    }
    net.relay.handle(f);
}
