//! A tunnel after `CONNECT` or SOCKS5: inspect the client's first bytes, then relay.
//!
//! The upstream is connected first (its address already checked), then the tunnel waits
//! for whichever side speaks first, up to [`IDLE_TIMEOUT`]:
//! - the **client** speaks first: its bytes are read (not yet forwarded) until they can be
//!   classified, within [`FIRST_BYTES_TIMEOUT`] and [`MAX_FIRST_BYTES`]. A TLS ClientHello
//!   must name the tunnel's host in its SNI when it has one (else rule `"sni mismatch"`;
//!   an unparsable one is `"malformed client hello"`); an HTTP request must carry exactly
//!   one `Host` naming the tunnel's host (and port, if given) (else `"host mismatch"`);
//!   anything else passes. A denial closes both sides; nothing reached the upstream.
//! - the **upstream** speaks first (SSH, SMTP, ...): there is nothing to inspect and the
//!   relay starts at once, so server-speaks-first protocols never hang. TLS and HTTP
//!   servers never speak first, so this path cannot skip their checks.
//!
//! Only the first bytes are inspected: a later request inside the same tunnel still goes
//! to the address that was checked, never anywhere else. The relay is one thread with
//! `poll(2)` over both non-blocking sockets, a bounded buffer per direction and half-close
//! passed through; it ends on close, error, or [`IDLE_TIMEOUT`] with no traffic. A
//! direction that has carried [`SPLICE_AFTER_BYTES`] moves on through a kernel pipe with
//! `splice(2)` (the `splice` module): the same loop, counters and half-close, without
//! copying the bytes into this process (the first bytes, inspected, were already sent).

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::log::Via;
use crate::policy::{Host, RULE_BAD_CLIENT_HELLO, RULE_HOST_MISMATCH, RULE_SNI_MISMATCH};
use crate::shared::Shared;
use crate::splice::{KernelPipe, SPLICE_AFTER_BYTES};
use crate::stats::HostCounters;
use crate::tls::{Hello, parse_client_hello};

/// A tunnel or keep-alive connection with no traffic for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// Once the client has started sending, its first message must be complete within this.
pub const FIRST_BYTES_TIMEOUT: Duration = Duration::from_secs(10);
/// Most first bytes buffered for inspection.
pub const MAX_FIRST_BYTES: usize = 64 * 1024;
/// Buffer per relay direction while it copies through user space (its first
/// [`SPLICE_AFTER_BYTES`], or all of it when no pipe can be made).
pub const RELAY_BUF_BYTES: usize = 16 * 1024;

/// The verdict on the first bytes.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum FirstBytes {
    NeedMore,
    Pass,
    Deny(&'static str),
}

/// Classifies the client's first bytes against the tunnel's `host:port`.
pub(crate) fn classify(buf: &[u8], host: &Host, port: u16) -> FirstBytes {
    let Some(&first) = buf.first() else {
        return FirstBytes::NeedMore;
    };
    if first == 0x16 {
        return match parse_client_hello(buf) {
            Hello::NeedMore => FirstBytes::NeedMore,
            Hello::Malformed => FirstBytes::Deny(RULE_BAD_CLIENT_HELLO),
            Hello::Sni(None) => FirstBytes::Pass,
            Hello::Sni(Some(sni)) => match host {
                Host::Name(name) if *name == sni => FirstBytes::Pass,
                _ => FirstBytes::Deny(RULE_SNI_MISMATCH),
            },
        };
    }
    // An HTTP request line starts with an upper-case method token and a space.
    let token = buf.iter().take_while(|b| b.is_ascii_uppercase()).count();
    if token == 0 || token > 20 {
        return FirstBytes::Pass;
    }
    match buf.get(token) {
        None => return FirstBytes::NeedMore,
        Some(b' ') => {}
        Some(_) => return FirstBytes::Pass,
    }
    let Some(end) = find_head_end(buf) else {
        return if buf.len() >= MAX_FIRST_BYTES {
            FirstBytes::Deny(RULE_HOST_MISMATCH)
        } else {
            FirstBytes::NeedMore
        };
    };
    let mut headers = [httparse::EMPTY_HEADER; crate::framing::MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    if !matches!(req.parse(&buf[..end]), Ok(httparse::Status::Complete(_))) {
        return FirstBytes::Deny(RULE_HOST_MISMATCH);
    }
    let mut hosts = req
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("host"));
    let (Some(value), None) = (hosts.next(), hosts.next()) else {
        return FirstBytes::Deny(RULE_HOST_MISMATCH);
    };
    match std::str::from_utf8(value.value)
        .ok()
        .and_then(|v| crate::http::parse_authority(v.trim()))
    {
        Some((h, p)) if h == *host && p.is_none_or(|p| p == port) => FirstBytes::Pass,
        _ => FirstBytes::Deny(RULE_HOST_MISMATCH),
    }
}

pub(crate) fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// Which side spoke first.
enum First {
    Client,
    Upstream,
    Neither,
}

fn wait_first(client: &TcpStream, upstream: &TcpStream) -> io::Result<First> {
    let timeout = PollTimeout::try_from(IDLE_TIMEOUT).unwrap_or(PollTimeout::MAX);
    let mut fds = [
        PollFd::new(client.as_fd(), PollFlags::POLLIN),
        PollFd::new(upstream.as_fd(), PollFlags::POLLIN),
    ];
    if poll(&mut fds, timeout)? == 0 {
        return Ok(First::Neither);
    }
    let ready = |fd: &PollFd| fd.revents().is_some_and(|r| !r.is_empty());
    Ok(if ready(&fds[0]) {
        First::Client
    } else if ready(&fds[1]) {
        First::Upstream
    } else {
        First::Neither
    })
}

/// Runs a tunnel whose upstream is connected; `prefix` holds client bytes already read.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    shared: &Shared,
    mut client: TcpStream,
    mut upstream: TcpStream,
    mut prefix: Vec<u8>,
    host: &Host,
    port: u16,
    via: Via,
    client_addr: &Option<String>,
    counters: &HostCounters,
) -> io::Result<()> {
    let first = if prefix.is_empty() {
        wait_first(&client, &upstream)?
    } else {
        First::Client
    };
    match first {
        First::Neither => return Ok(()),
        First::Upstream => {}
        First::Client => {
            let deadline = Instant::now() + FIRST_BYTES_TIMEOUT;
            loop {
                match classify(&prefix, host, port) {
                    FirstBytes::Pass => break,
                    FirstBytes::Deny(rule) => {
                        shared.deny_later(host, port, via, rule, client_addr);
                        return Ok(());
                    }
                    FirstBytes::NeedMore => {}
                }
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() || prefix.len() >= MAX_FIRST_BYTES {
                    return Ok(()); // incomplete first message: close, forward nothing
                }
                client.set_read_timeout(Some(left))?;
                let mut chunk = vec![0u8; (MAX_FIRST_BYTES - prefix.len()).min(RELAY_BUF_BYTES)];
                let n = client.read(&mut chunk)?;
                if n == 0 {
                    return Ok(());
                }
                prefix.extend_from_slice(&chunk[..n]);
            }
            client.set_read_timeout(None)?;
            counters.up(prefix.len());
            upstream.write_all(&prefix)?;
        }
    }
    relay(&mut client, &mut upstream, counters)
}

/// One direction of the relay: through a user-space buffer at first, through a kernel
/// pipe (`splice(2)`, the `splice` module) once it has carried [`SPLICE_AFTER_BYTES`].
struct Pipe {
    buf: Vec<u8>,
    start: usize,
    end: usize,
    kernel: Option<KernelPipe>,
    /// Bytes read from the source so far.
    moved: u64,
    /// Cleared when a pipe could not be made or spliced: this direction stays buffered.
    may_splice: bool,
    eof: bool,
    shut: bool,
}

impl Pipe {
    fn new() -> Pipe {
        Pipe {
            buf: vec![0; RELAY_BUF_BYTES],
            start: 0,
            end: 0,
            kernel: None,
            moved: 0,
            may_splice: true,
            eof: false,
            shut: false,
        }
    }
    fn empty(&self) -> bool {
        self.start == self.end && self.kernel.as_ref().is_none_or(KernelPipe::is_empty)
    }
    fn done(&self) -> bool {
        self.eof && self.empty()
    }
    /// Whether this direction moves through a kernel pipe now.
    #[cfg(test)]
    fn spliced(&self) -> bool {
        self.kernel.is_some()
    }
    /// Reads what `from` has into the empty pipe or buffer: `Ok(None)` when it has nothing.
    fn fill(&mut self, from: &mut TcpStream) -> io::Result<Option<usize>> {
        if self.kernel.is_none() && self.may_splice && self.moved >= SPLICE_AFTER_BYTES {
            match KernelPipe::new() {
                Ok(pipe) => {
                    self.kernel = Some(pipe);
                    self.buf = Vec::new();
                }
                Err(_) => self.may_splice = false,
            }
        }
        if let Some(pipe) = &mut self.kernel {
            match pipe.fill(&*from, u64::MAX) {
                // Nothing was moved: a socket that cannot be spliced goes back to copies.
                Err(e) if e.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error()) => {
                    self.kernel = None;
                    self.may_splice = false;
                    self.buf = vec![0; RELAY_BUF_BYTES];
                }
                other => return other,
            }
        }
        match from.read(&mut self.buf) {
            Ok(n) => {
                (self.start, self.end) = (0, n);
                Ok(Some(n))
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(None),
            Err(e) => Err(e),
        }
    }
    /// Writes what the pipe or buffer holds to `to` until empty or `to` would block.
    fn drain(&mut self, to: &mut TcpStream) -> io::Result<()> {
        if let Some(pipe) = &mut self.kernel {
            return pipe.drain(&*to);
        }
        while self.start < self.end {
            match to.write(&self.buf[self.start..self.end]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.start += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
    /// Moves bytes `from` -> `to` as far as they go without blocking.
    fn pump(
        &mut self,
        from: &mut TcpStream,
        to: &mut TcpStream,
        count: &dyn Fn(usize),
    ) -> io::Result<()> {
        if self.empty() && !self.eof {
            match self.fill(from)? {
                Some(0) => self.eof = true,
                Some(n) => {
                    count(n);
                    self.moved += n as u64;
                }
                None => {}
            }
        }
        self.drain(to)?;
        if self.done() && !self.shut {
            self.shut = true;
            let _ = to.shutdown(Shutdown::Write);
        }
        Ok(())
    }
    fn interest(&self) -> (PollFlags, PollFlags) {
        // (on the source, on the destination)
        if !self.empty() {
            (PollFlags::empty(), PollFlags::POLLOUT)
        } else if !self.eof {
            (PollFlags::POLLIN, PollFlags::empty())
        } else {
            (PollFlags::empty(), PollFlags::empty())
        }
    }
}

/// Copies both ways until both sides are done, an error, or [`IDLE_TIMEOUT`] of silence.
pub(crate) fn relay(
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    counters: &HostCounters,
) -> io::Result<()> {
    client.set_nonblocking(true)?;
    upstream.set_nonblocking(true)?;
    let (mut up, mut down) = (Pipe::new(), Pipe::new());
    let timeout = PollTimeout::try_from(IDLE_TIMEOUT).unwrap_or(PollTimeout::MAX);
    loop {
        up.pump(client, upstream, &|n| counters.up(n))?;
        down.pump(upstream, client, &|n| counters.down(n))?;
        if up.done() && down.done() {
            return Ok(());
        }
        let (up_src, up_dst) = up.interest();
        let (down_src, down_dst) = down.interest();
        let (client_ev, upstream_ev) = (up_src | down_dst, down_src | up_dst);
        // Only sockets with an interest are polled: a hung-up socket reports POLLHUP
        // whatever we ask, which would spin while we wait on the other one.
        let mut fds = Vec::with_capacity(2);
        if !client_ev.is_empty() {
            fds.push(PollFd::new(client.as_fd(), client_ev));
        }
        if !upstream_ev.is_empty() {
            fds.push(PollFd::new(upstream.as_fd(), upstream_ev));
        }
        if fds.is_empty() {
            return Ok(());
        }
        match poll(&mut fds, timeout) {
            Ok(0) => return Ok(()), // idle
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::client_hello_for_tests;
    use std::net::TcpListener;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    fn pattern(n: usize, seed: u8) -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
    }

    #[test]
    fn a_direction_switches_to_splice_after_its_first_bytes() {
        let (mut src_w, mut src_r) = pair();
        let (mut dst_w, mut dst_r) = pair();
        let total = 3 * SPLICE_AFTER_BYTES as usize + 777;
        let data = pattern(total, 5);
        let sent = data.clone();
        let writer = std::thread::spawn(move || {
            src_w.write_all(&sent).unwrap();
            src_w.shutdown(Shutdown::Write).unwrap();
            src_w
        });
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            dst_r.read_to_end(&mut got).unwrap();
            got
        });
        src_r.set_nonblocking(true).unwrap();
        dst_w.set_nonblocking(true).unwrap();
        let counted = std::cell::Cell::new(0);
        let mut pipe = Pipe::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !pipe.shut {
            assert!(Instant::now() < deadline, "relay stalled");
            pipe.pump(&mut src_r, &mut dst_w, &|n| counted.set(counted.get() + n))
                .unwrap();
            if !pipe.spliced() {
                assert!(pipe.moved < SPLICE_AFTER_BYTES + RELAY_BUF_BYTES as u64);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        assert!(pipe.spliced(), "a bulk direction moves through a pipe");
        assert_eq!((counted.get(), pipe.moved), (total, total as u64));
        let _src_w = writer.join().unwrap();
        drop(dst_w); // its write half was shut by the relay: the reader saw the end
        assert_eq!(reader.join().unwrap(), data);
    }

    #[test]
    fn relay_carries_bulk_both_ways_with_half_close_and_exact_counts() {
        let (mut client_app, mut client) = pair();
        let (mut upstream, mut server) = pair();
        let up_bytes = 5 * SPLICE_AFTER_BYTES as usize + 1234;
        let down_bytes = 7 * SPLICE_AFTER_BYTES as usize + 4321;
        let table = crate::stats::StatsTable::default();
        let c = table.host("h");
        let relay = std::thread::spawn(move || relay(&mut client, &mut upstream, &c));
        // The server reads the client's bytes to their end (a half-close), then answers.
        let server = std::thread::spawn(move || {
            let mut got = Vec::new();
            server.read_to_end(&mut got).unwrap();
            server.write_all(&pattern(down_bytes, 9)).unwrap();
            got
        });
        let mut app_w = client_app.try_clone().unwrap();
        let sender = std::thread::spawn(move || {
            app_w.write_all(&pattern(up_bytes, 3)).unwrap();
            app_w.shutdown(Shutdown::Write).unwrap();
        });
        let mut down = Vec::new();
        client_app.read_to_end(&mut down).unwrap();
        sender.join().unwrap();
        assert_eq!(server.join().unwrap(), pattern(up_bytes, 3));
        assert_eq!(down, pattern(down_bytes, 9));
        relay.join().unwrap().unwrap();
        let s = &table.snapshot().hosts["h"];
        assert_eq!(
            (s.bytes_up, s.bytes_down),
            (up_bytes as u64, down_bytes as u64)
        );
    }

    #[test]
    fn first_bytes() {
        let host = Host::parse("a.test").unwrap();
        let hello = client_hello_for_tests(Some("A.test"));
        assert_eq!(classify(&hello, &host, 443), FirstBytes::Pass);
        assert_eq!(classify(&hello[..20], &host, 443), FirstBytes::NeedMore);
        let other = client_hello_for_tests(Some("b.test"));
        assert_eq!(
            classify(&other, &host, 443),
            FirstBytes::Deny(RULE_SNI_MISMATCH)
        );
        let ip = Host::parse("203.0.113.9").unwrap();
        assert_eq!(
            classify(&hello, &ip, 443),
            FirstBytes::Deny(RULE_SNI_MISMATCH)
        );
        assert_eq!(
            classify(&client_hello_for_tests(None), &ip, 443),
            FirstBytes::Pass
        );
        assert_eq!(classify(b"SSH-2.0-x\r\n", &host, 22), FirstBytes::Pass);
        assert_eq!(classify(b"GE", &host, 80), FirstBytes::NeedMore);
        assert_eq!(
            classify(b"GET / HTTP/1.1\r\nHost: a.test", &host, 80),
            FirstBytes::NeedMore
        );
        let ok = b"GET / HTTP/1.1\r\nHost: A.test:80\r\n\r\n";
        assert_eq!(classify(ok, &host, 80), FirstBytes::Pass);
        let bad = b"GET / HTTP/1.1\r\nHost: b.test\r\n\r\n";
        assert_eq!(
            classify(bad, &host, 80),
            FirstBytes::Deny(RULE_HOST_MISMATCH)
        );
        let port = b"GET / HTTP/1.1\r\nHost: a.test:81\r\n\r\n";
        assert_eq!(
            classify(port, &host, 80),
            FirstBytes::Deny(RULE_HOST_MISMATCH)
        );
        let two = b"GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n";
        assert_eq!(
            classify(two, &host, 80),
            FirstBytes::Deny(RULE_HOST_MISMATCH)
        );
        let none = b"GET / HTTP/1.0\r\n\r\n";
        assert_eq!(
            classify(none, &host, 80),
            FirstBytes::Deny(RULE_HOST_MISMATCH)
        );
    }
}
