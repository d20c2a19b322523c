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
//! passed through; it ends on close, error, or [`IDLE_TIMEOUT`] with no traffic.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::log::Via;
use crate::policy::{Host, RULE_BAD_CLIENT_HELLO, RULE_HOST_MISMATCH, RULE_SNI_MISMATCH};
use crate::shared::Shared;
use crate::stats::HostCounters;
use crate::tls::{Hello, parse_client_hello};

/// A tunnel or keep-alive connection with no traffic for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// Once the client has started sending, its first message must be complete within this.
pub const FIRST_BYTES_TIMEOUT: Duration = Duration::from_secs(10);
/// Most first bytes buffered for inspection.
pub const MAX_FIRST_BYTES: usize = 64 * 1024;
/// Buffer per relay direction.
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

/// One direction of the relay.
struct Pipe {
    buf: Vec<u8>,
    start: usize,
    end: usize,
    eof: bool,
    shut: bool,
}

impl Pipe {
    fn new() -> Pipe {
        Pipe {
            buf: vec![0; RELAY_BUF_BYTES],
            start: 0,
            end: 0,
            eof: false,
            shut: false,
        }
    }
    fn empty(&self) -> bool {
        self.start == self.end
    }
    fn done(&self) -> bool {
        self.eof && self.empty()
    }
    /// Moves bytes `from` -> `to` as far as they go without blocking.
    fn pump(
        &mut self,
        from: &mut TcpStream,
        to: &mut TcpStream,
        count: &dyn Fn(usize),
    ) -> io::Result<()> {
        if self.empty() && !self.eof {
            match from.read(&mut self.buf) {
                Ok(0) => self.eof = true,
                Ok(n) => {
                    count(n);
                    (self.start, self.end) = (0, n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        while !self.empty() {
            match to.write(&self.buf[self.start..self.end]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.start += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
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
