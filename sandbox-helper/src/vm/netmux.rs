//! The keeper's end of a `--net egress` VM: the guest reaches the sandbox's egress proxy
//! over the agent's channel, never over a network.
//!
//! The guest has no interface but `lo` (`-nic none`: qemu gives it no device that could
//! carry a packet out). Its agent listens on the guest's 127.0.0.1 at the proxy's ports
//! (`guest/net.rs`) and carries each connection as a stream of the channel
//! ([`super::netrelay`]). Here, each stream the guest opens is connected to the same
//! egress proxy a namespace sandbox has ([`crate::egress::EgressProxy`], host-side,
//! unprivileged, default deny), whose sockets are made inside a network namespace of
//! this VM's own that holds only a loopback: the keeper's connecting threads enter it,
//! connect to the proxy there, and nothing else is reachable from it. A stream to a port
//! other than the proxy's is refused. DNS queries (`NET_DGRAM`) go to the proxy's
//! resolver the same way and its answers back to the guest.
//!
//! Everything the guest sends is bounded: at most [`super::netrelay::MAX_NET_STREAMS`]
//! streams of [`super::netrelay::NET_WINDOW_BYTES`] queued each, and at most
//! [`MAX_DNS_INFLIGHT`] queries at once, each answered within [`DNS_TIMEOUT`] or not at
//! all.

use std::fs::File;
use std::net::{Ipv4Addr, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use nix::sched::CloneFlags;

use super::agent::Channel;
use super::netrelay::Relay;
use super::proto::{Frame, egress_payload, kind};
use crate::spec::{EGRESS_DNS_PORT, EGRESS_HTTP_PORT, EGRESS_SOCKS_PORT};
use crate::syscall::{LinuxSyscall, Syscall};

/// Most DNS queries being answered at once; further ones are dropped (the guest's
/// resolver asks again).
pub const MAX_DNS_INFLIGHT: usize = 64;
/// How long a DNS query waits for the proxy's resolver.
pub const DNS_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest DNS message relayed.
const MAX_DNS_BYTES: usize = 512;

/// A network namespace holding only a loopback, up: where the VM's egress proxy
/// listens. Made by a thread of its own, which ends right after.
pub fn private_netns() -> std::io::Result<File> {
    std::thread::scope(|s| {
        s.spawn(|| {
            LinuxSyscall.unshare(CloneFlags::CLONE_NEWNET)?;
            LinuxSyscall.loopback_up()?;
            File::open("/proc/thread-self/ns/net")
        })
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("the namespace thread panicked")))
    })
}

/// The relay of one VM's egress.
pub struct NetMux {
    relay: Arc<Relay>,
    netns: Arc<File>,
    channel: Weak<Channel>,
    dns_inflight: Arc<AtomicUsize>,
}

impl std::fmt::Debug for NetMux {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NetMux")
    }
}

impl NetMux {
    /// Relays `channel`'s guest streams to the proxy listening in `netns`, and tells
    /// the guest to listen (before any exec is sent, so every command finds the proxy).
    pub fn start(channel: &Arc<Channel>, netns: File) -> std::io::Result<Arc<NetMux>> {
        let weak = Arc::downgrade(channel);
        let sender = weak.clone();
        let relay = Relay::new(Box::new(move |f: &Frame| {
            sender.upgrade().is_some_and(|c| c.send(f).is_ok())
        }));
        let mux = Arc::new(NetMux {
            relay,
            netns: Arc::new(netns),
            channel: weak,
            dns_inflight: Arc::new(AtomicUsize::new(0)),
        });
        channel.set_net(mux.clone());
        channel.send(&Frame::new(
            0,
            kind::NET_EGRESS,
            egress_payload(EGRESS_HTTP_PORT, EGRESS_SOCKS_PORT, EGRESS_DNS_PORT),
        ))?;
        Ok(mux)
    }

    /// Streams open now.
    pub fn streams(&self) -> usize {
        self.relay.len()
    }

    /// Ends every stream (the VM is gone).
    pub fn close_all(&self) {
        self.relay.close_all();
    }

    fn send(&self, f: &Frame) {
        if let Some(c) = self.channel.upgrade() {
            let _ = c.send(f);
        }
    }

    /// A frame of a guest stream, from the channel's reader.
    pub fn handle(&self, f: Frame) {
        match f.kind {
            kind::NET_OPEN => self.open(f),
            kind::NET_DGRAM => self.query(f),
            _ => {
                self.relay.handle(f);
            }
        }
    }

    fn open(&self, f: Frame) {
        let id = f.stream;
        let port = match <[u8; 2]>::try_from(f.payload.as_slice()) {
            Ok(b) => u16::from_le_bytes(b),
            Err(_) => 0,
        };
        // Only the proxy's ports: the namespace holds nothing else, and the guest
        // names nothing else.
        if ![EGRESS_HTTP_PORT, EGRESS_SOCKS_PORT].contains(&port) || !self.relay.open(id) {
            self.send(&Frame::new(id, kind::NET_CLOSE, Vec::new()));
            return;
        }
        let (relay, netns) = (self.relay.clone(), self.netns.clone());
        let spawned = std::thread::Builder::new()
            .name("net-connect".into())
            .stack_size(64 * 1024)
            .spawn(move || match connect_inside(&netns, port) {
                Ok(sock) => relay.attach(id, sock),
                Err(_) => relay.close(id, true),
            });
        if spawned.is_err() {
            self.relay.close(id, true);
        }
    }

    fn query(&self, f: Frame) {
        let inflight = self.dns_inflight.clone();
        if inflight.fetch_add(1, Ordering::SeqCst) >= MAX_DNS_INFLIGHT {
            inflight.fetch_sub(1, Ordering::SeqCst);
            return;
        }
        let (netns, channel) = (self.netns.clone(), self.channel.clone());
        let spawned = std::thread::Builder::new()
            .name("net-dns".into())
            .stack_size(64 * 1024)
            .spawn(move || {
                if let Ok(answer) = ask_inside(&netns, &f.payload)
                    && let Some(c) = channel.upgrade()
                {
                    let _ = c.send(&Frame::new(f.stream, kind::NET_DGRAM, answer));
                }
                inflight.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            self.dns_inflight.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// A connection to the proxy's `port` on the loopback of `netns` (this thread enters
/// the namespace; it is a thread of its own that ends with the connection's relay).
fn connect_inside(netns: &File, port: u16) -> std::io::Result<TcpStream> {
    LinuxSyscall.setns(netns.as_fd(), CloneFlags::CLONE_NEWNET)?;
    let s = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
    s.set_nodelay(true)?;
    Ok(s)
}

/// One query to the proxy's resolver in `netns`, and its answer.
fn ask_inside(netns: &File, query: &[u8]) -> std::io::Result<Vec<u8>> {
    if query.len() > MAX_DNS_BYTES {
        return Err(std::io::Error::other("query too long"));
    }
    LinuxSyscall.setns(netns.as_fd(), CloneFlags::CLONE_NEWNET)?;
    let s = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))?;
    s.connect((Ipv4Addr::LOCALHOST, EGRESS_DNS_PORT))?;
    s.set_read_timeout(Some(DNS_TIMEOUT))?;
    s.send(query)?;
    let mut buf = [0u8; MAX_DNS_BYTES];
    let n = s.recv(&mut buf)?;
    Ok(buf[..n].to_vec())
}
