//! The SOCKS5 proxy (RFC 1928): no authentication, `CONNECT` only.
//!
//! The greeting must offer method 0 (no authentication), else the reply is `0xFF` and the
//! connection closes. A request's address may be a domain name, IPv4 or IPv6; a domain
//! that spells an IP literal is treated as that literal. The decision is the same gate as
//! the HTTP proxy's (`Shared::admit`): an IP literal is refused when
//! private, a name when it resolves only to private addresses. Replies: `0x02`
//! (connection not allowed by ruleset) for policy and address denials, `0x04` (host
//! unreachable) when the name does not resolve or the connect times out, `0x05`
//! (connection refused), `0x03` (network unreachable), `0x07` for `BIND` and
//! `UDP ASSOCIATE`, `0x08` for an unknown address type, `0x01` for any other failure.
//! The whole negotiation must finish within [`SOCKS_HANDSHAKE_TIMEOUT`]. After the
//! success reply the connection is a tunnel (the `tunnel` module), first bytes inspected.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, TcpStream};
use std::time::Duration;

use crate::log::Via;
use crate::policy::{Host, RULE_INVALID_HOST};
use crate::shared::{Refusal, Shared, connect_upstream};
use crate::tunnel;

/// Time allowed for the greeting and the request.
pub const SOCKS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

const VERSION: u8 = 5;
const METHOD_NONE: u8 = 0;
const METHOD_UNACCEPTABLE: u8 = 0xff;
const CMD_CONNECT: u8 = 1;
const ATYP_V4: u8 = 1;
const ATYP_DOMAIN: u8 = 3;
const ATYP_V6: u8 = 4;

/// A SOCKS5 reply code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Reply {
    /// `0x00` succeeded.
    Succeeded = 0,
    /// `0x01` general SOCKS server failure.
    GeneralFailure = 1,
    /// `0x02` connection not allowed by ruleset.
    NotAllowed = 2,
    /// `0x03` network unreachable.
    NetworkUnreachable = 3,
    /// `0x04` host unreachable.
    HostUnreachable = 4,
    /// `0x05` connection refused.
    ConnectionRefused = 5,
    /// `0x07` command not supported.
    CommandNotSupported = 7,
    /// `0x08` address type not supported.
    AddressTypeNotSupported = 8,
}

fn reply(stream: &mut TcpStream, code: Reply) -> io::Result<()> {
    // BND.ADDR 0.0.0.0:0: the host-side address is nobody's business inside the sandbox.
    stream.write_all(&[VERSION, code as u8, 0, ATYP_V4, 0, 0, 0, 0, 0, 0])
}

fn connect_error_reply(e: &io::Error) -> Reply {
    match e.kind() {
        io::ErrorKind::ConnectionRefused => Reply::ConnectionRefused,
        io::ErrorKind::NetworkUnreachable => Reply::NetworkUnreachable,
        _ => Reply::HostUnreachable,
    }
}

/// The target of a request: a host, or why it cannot be one.
enum Target {
    Host(Host, u16),
    /// A domain that is not a valid name (logged as `invalid host`).
    Invalid(String, u16),
    /// An address type other than 1, 3, 4.
    BadType,
}

fn read_request(stream: &mut TcpStream) -> io::Result<(u8, Target)> {
    let mut head = [0u8; 4];
    stream.read_exact(&mut head)?;
    if head[0] != VERSION || head[2] != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "bad SOCKS request header",
        ));
    }
    let host = match head[3] {
        ATYP_V4 => {
            let mut a = [0u8; 4];
            stream.read_exact(&mut a)?;
            Ok(Host::Ip(Ipv4Addr::from(a).into()))
        }
        ATYP_V6 => {
            let mut a = [0u8; 16];
            stream.read_exact(&mut a)?;
            Ok(Host::Ip(
                std::net::IpAddr::V6(Ipv6Addr::from(a)).to_canonical(),
            ))
        }
        ATYP_DOMAIN => {
            let mut len = [0u8; 1];
            stream.read_exact(&mut len)?;
            let mut name = vec![0u8; len[0] as usize];
            stream.read_exact(&mut name)?;
            let text = String::from_utf8_lossy(&name).into_owned();
            Host::parse(&text).map_err(|_| text)
        }
        _ => return Ok((head[1], Target::BadType)),
    };
    let mut port = [0u8; 2];
    stream.read_exact(&mut port)?;
    let port = u16::from_be_bytes(port);
    Ok((
        head[1],
        match host {
            Ok(h) => Target::Host(h, port),
            Err(text) => Target::Invalid(text, port),
        },
    ))
}

/// Serves one SOCKS5 client connection.
pub(crate) fn serve(shared: &Shared, mut stream: TcpStream, client: Option<String>) {
    let _ = handle(shared, &mut stream, &client);
}

fn handle(shared: &Shared, stream: &mut TcpStream, client: &Option<String>) -> io::Result<()> {
    stream.set_read_timeout(Some(SOCKS_HANDSHAKE_TIMEOUT))?;
    let mut greeting = [0u8; 2];
    stream.read_exact(&mut greeting)?;
    if greeting[0] != VERSION || greeting[1] == 0 {
        return Ok(()); // not SOCKS5: close
    }
    let mut methods = vec![0u8; greeting[1] as usize];
    stream.read_exact(&mut methods)?;
    if !methods.contains(&METHOD_NONE) {
        return stream.write_all(&[VERSION, METHOD_UNACCEPTABLE]);
    }
    stream.write_all(&[VERSION, METHOD_NONE])?;
    let (cmd, target) = read_request(stream)?;
    let (host, port) = match target {
        Target::BadType => return reply(stream, Reply::AddressTypeNotSupported),
        _ if cmd != CMD_CONNECT => return reply(stream, Reply::CommandNotSupported),
        Target::Invalid(text, port) => {
            let _ = shared.log.record(&crate::log::DecisionRecord::now(
                &text,
                port,
                Via::Socks,
                false,
                RULE_INVALID_HOST,
                client.clone(),
            ));
            return reply(stream, Reply::NotAllowed);
        }
        Target::Host(host, port) => (host, port),
    };
    let admitted = match shared.admit(&host, port, Via::Socks, client) {
        Ok(a) => a,
        Err(Refusal::Policy(_) | Refusal::Private) => return reply(stream, Reply::NotAllowed),
        Err(Refusal::Unresolvable(_)) => return reply(stream, Reply::HostUnreachable),
        Err(Refusal::Internal(_)) => return reply(stream, Reply::GeneralFailure),
    };
    let upstream = match connect_upstream(&admitted.targets) {
        Ok(s) => s,
        Err(e) => return reply(stream, connect_error_reply(&e)),
    };
    reply(stream, Reply::Succeeded)?;
    stream.set_read_timeout(None)?;
    let client_stream = stream.try_clone()?;
    tunnel::run(
        shared,
        client_stream,
        upstream,
        Vec::new(),
        &host,
        port,
        Via::Socks,
        client,
        &admitted.counters,
    )
}
