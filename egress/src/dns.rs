//! The DNS responder inside the sandbox: answers only names the policy allows.
//!
//! Packets are parsed and built by hand, bounded to [`MAX_DNS_PACKET_BYTES`]: we need the
//! header, one question and A/AAAA answers, nothing else; hand-written code keeps every
//! length check visible, and avoids a new dependency tree (`hickory-proto`) or a crate
//! (`simple-dns`) that is not already in the workspace lock.
//!
//! A query (QR=0, opcode 0, exactly one question, no answer or authority records, no
//! compression pointer in the question) for name N and type T:
//! - N not allowed by the policy on any port ([`crate::policy::Policy::decide_name`]):
//!   **REFUSED**, logged denied with `via: "dns"`. REFUSED rather than NXDOMAIN: it says
//!   "not for you" instead of asserting the name does not exist, and resolvers do not
//!   cache it as a negative answer, so a policy change takes effect on the next lookup.
//! - N allowed: the addresses the proxy itself would connect to: its `add_hosts`
//!   addresses, else the host resolver's with private addresses dropped (none left:
//!   REFUSED, logged `"private address"`; resolver error: SERVFAIL, `"resolve failed"`).
//!   A gets the IPv4 ones, AAAA the IPv6 ones, any other type an empty NOERROR answer;
//!   TTL [`DNS_TTL_SECS`]. Answers that do not fit in 512 bytes are cut and TC set.
//! - A class other than IN: REFUSED, logged `"not class IN"`.
//! - A valid header with another opcode: NOTIMP. Anything else (truncated, a response, a
//!   pointer, two questions, over 512 bytes): dropped without an answer.
//!
//! Each query is answered on its own thread (at most [`MAX_DNS_INFLIGHT`] at once, further
//! queries dropped) since the host resolver may block.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::log::Via;
use crate::policy::{Host, RULE_INVALID_HOST, RULE_PRIVATE, RULE_RESOLVE_FAILED, is_private_for};
use crate::shared::Shared;

/// Largest query accepted and largest answer sent (plain DNS over UDP, no EDNS).
pub const MAX_DNS_PACKET_BYTES: usize = 512;
/// TTL of every answer: short, so policy changes reach clients quickly.
pub const DNS_TTL_SECS: u32 = 5;
/// Most queries being answered at once.
pub const MAX_DNS_INFLIGHT: usize = 64;
/// Longest name in a question, in bytes on the wire.
const MAX_WIRE_NAME_BYTES: usize = 255;

/// DNS record type A.
pub const TYPE_A: u16 = 1;
/// DNS record type AAAA.
pub const TYPE_AAAA: u16 = 28;
const CLASS_IN: u16 = 1;
/// Rule of a denied query whose class is not IN (CHAOS, HESIOD, ANY).
pub const RULE_NOT_CLASS_IN: &str = "not class IN";

/// Response codes used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Rcode {
    /// No error.
    NoError = 0,
    /// The server failed (resolver error).
    ServFail = 2,
    /// Opcode not implemented.
    NotImp = 4,
    /// Refused by policy.
    Refused = 5,
}

/// One parsed query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    /// Transaction id.
    pub id: u16,
    /// The header flags of the query.
    pub flags: u16,
    /// The name asked, lowercase, dot-separated, without trailing dot.
    pub name: String,
    /// QTYPE.
    pub qtype: u16,
    /// QCLASS.
    pub qclass: u16,
    /// The question section's bytes, echoed in the answer.
    pub question: Vec<u8>,
}

/// What a packet is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packet {
    /// A standard query.
    Query(Query),
    /// A well-formed header with another opcode: answered NOTIMP.
    OtherOpcode {
        /// Transaction id.
        id: u16,
        /// Flags.
        flags: u16,
    },
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// Parses a query packet; `None` means drop it.
pub fn parse_packet(pkt: &[u8]) -> Option<Packet> {
    if pkt.len() < 12 || pkt.len() > MAX_DNS_PACKET_BYTES {
        return None;
    }
    let id = be16(pkt, 0)?;
    let flags = be16(pkt, 2)?;
    if flags & 0x8000 != 0 {
        return None; // a response
    }
    if (flags >> 11) & 0xf != 0 {
        return Some(Packet::OtherOpcode { id, flags });
    }
    let (qd, an, ns) = (be16(pkt, 4)?, be16(pkt, 6)?, be16(pkt, 8)?);
    if qd != 1 || an != 0 || ns != 0 {
        return None;
    }
    let mut at = 12;
    let mut labels: Vec<String> = Vec::new();
    loop {
        let len = *pkt.get(at)? as usize;
        at += 1;
        if len == 0 {
            break;
        }
        if len > 63 || at - 12 + len > MAX_WIRE_NAME_BYTES {
            return None; // a pointer (0xC0) or an over-long label or name
        }
        let label = pkt.get(at..at + len)?;
        if !label.iter().all(|b| b.is_ascii_graphic()) {
            return None;
        }
        labels.push(String::from_utf8_lossy(label).to_ascii_lowercase());
        at += len;
    }
    let qtype = be16(pkt, at)?;
    let qclass = be16(pkt, at + 2)?;
    let question = pkt[12..at + 4].to_vec();
    Some(Packet::Query(Query {
        id,
        flags,
        name: labels.join("."),
        qtype,
        qclass,
        question,
    }))
}

/// Builds the answer to `q`: `rcode`, and one record per address of the asked type.
pub fn build_answer(q: &Query, rcode: Rcode, addrs: &[IpAddr]) -> Vec<u8> {
    let mut records: Vec<Vec<u8>> = Vec::new();
    for addr in addrs {
        let (kind, data) = match addr {
            IpAddr::V4(v4) if q.qtype == TYPE_A => (TYPE_A, v4.octets().to_vec()),
            IpAddr::V6(v6) if q.qtype == TYPE_AAAA => (TYPE_AAAA, v6.octets().to_vec()),
            _ => continue,
        };
        let mut rr = vec![0xc0, 0x0c]; // pointer to the question's name
        rr.extend_from_slice(&kind.to_be_bytes());
        rr.extend_from_slice(&CLASS_IN.to_be_bytes());
        rr.extend_from_slice(&DNS_TTL_SECS.to_be_bytes());
        rr.extend_from_slice(&(data.len() as u16).to_be_bytes());
        rr.extend_from_slice(&data);
        records.push(rr);
    }
    let mut body = q.question.clone();
    let mut count: u16 = 0;
    let mut truncated = false;
    for rr in &records {
        if 12 + body.len() + rr.len() > MAX_DNS_PACKET_BYTES {
            truncated = true;
            break;
        }
        body.extend_from_slice(rr);
        count += 1;
    }
    // QR, the query's RD, RA, TC when cut.
    let flags =
        0x8000 | (q.flags & 0x0100) | 0x0080 | if truncated { 0x0200 } else { 0 } | rcode as u16;
    let mut out = Vec::with_capacity(12 + body.len());
    out.extend_from_slice(&q.id.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&1u16.to_be_bytes());
    out.extend_from_slice(&count.to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(&body);
    out
}

/// A header-only NOTIMP answer.
fn not_implemented(id: u16, flags: u16) -> Vec<u8> {
    let flags = 0x8000 | (flags & 0x7900) | Rcode::NotImp as u16;
    let mut out = id.to_be_bytes().to_vec();
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&[0; 8]);
    out
}

/// Decides, logs and answers one query.
pub(crate) fn answer(shared: &Shared, q: &Query, client: &Option<String>) -> Vec<u8> {
    let log = |host: &Host, allowed: bool, rule: &str| {
        let _ = shared.record(host, 0, Via::Dns, allowed, rule, client);
    };
    let host = match Host::parse(&q.name) {
        Ok(Host::Name(n)) => Host::Name(n),
        _ => {
            let text = if q.name.is_empty() {
                "."
            } else {
                q.name.as_str()
            };
            let record = crate::log::DecisionRecord::now(
                text,
                0,
                Via::Dns,
                false,
                RULE_INVALID_HOST,
                client.clone(),
            );
            let _ = shared.log.record(&record);
            return build_answer(q, Rcode::Refused, &[]);
        }
    };
    let policy = shared.policy();
    let decision = policy.decide_name(&host);
    if !decision.allowed {
        log(&host, false, &decision.rule);
        return build_answer(q, Rcode::Refused, &[]);
    }
    if q.qclass != CLASS_IN {
        log(&host, false, RULE_NOT_CLASS_IN);
        return build_answer(q, Rcode::Refused, &[]);
    }
    let mut addrs = policy.added_addrs(&host);
    if addrs.is_empty() && (q.qtype == TYPE_A || q.qtype == TYPE_AAAA) {
        let Host::Name(name) = &host else {
            return build_answer(q, Rcode::Refused, &[]);
        };
        match shared.resolver.resolve(name) {
            Err(_) => {
                log(&host, false, RULE_RESOLVE_FAILED);
                return build_answer(q, Rcode::ServFail, &[]);
            }
            Ok(found) => {
                addrs = found
                    .into_iter()
                    .filter(|ip| !is_private_for(*ip, &shared.host_addrs))
                    .collect()
            }
        }
        if addrs.is_empty() {
            log(&host, false, RULE_PRIVATE);
            return build_answer(q, Rcode::Refused, &[]);
        }
    }
    log(&host, true, &decision.rule);
    build_answer(q, Rcode::NoError, &addrs)
}

/// Serves `socket` until the proxy stops (checked every `poll` interval).
pub(crate) fn serve(shared: Arc<Shared>, socket: UdpSocket, poll: Duration) {
    let _ = socket.set_read_timeout(Some(poll));
    let inflight = Arc::new(AtomicUsize::new(0));
    let mut buf = [0u8; MAX_DNS_PACKET_BYTES + 1];
    while !shared.stopping.load(Ordering::Acquire) {
        let (n, peer) = match socket.recv_from(&mut buf) {
            Ok(x) => x,
            Err(_) => continue, // timeout (stop check) or a transient error
        };
        let reply = match parse_packet(&buf[..n]) {
            None => continue,
            Some(Packet::OtherOpcode { id, flags }) => {
                let _ = socket.send_to(&not_implemented(id, flags), peer);
                continue;
            }
            Some(Packet::Query(q)) => q,
        };
        if inflight.fetch_add(1, Ordering::AcqRel) >= MAX_DNS_INFLIGHT {
            inflight.fetch_sub(1, Ordering::AcqRel);
            continue;
        }
        let Ok(out) = socket.try_clone() else {
            inflight.fetch_sub(1, Ordering::AcqRel);
            continue;
        };
        let (shared2, inflight2) = (shared.clone(), inflight.clone());
        let spawned = std::thread::Builder::new()
            .name("egress-dns".into())
            .stack_size(crate::server::CONNECTION_STACK_BYTES)
            .spawn(move || {
                respond(&shared2, &out, &reply, peer);
                inflight2.fetch_sub(1, Ordering::AcqRel);
            });
        if spawned.is_err() {
            inflight.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

fn respond(shared: &Shared, socket: &UdpSocket, q: &Query, peer: SocketAddr) {
    let out = answer(shared, q, &Some(peer.to_string()));
    let _ = socket.send_to(&out, peer);
}

/// Builds a query packet (tests and tools).
pub fn build_query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
    let mut out = id.to_be_bytes().to_vec();
    out.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.').filter(|l| !l.is_empty()) {
        out.push(label.len() as u8);
        out.extend_from_slice(label.as_bytes());
    }
    out.push(0);
    out.extend_from_slice(&qtype.to_be_bytes());
    out.extend_from_slice(&CLASS_IN.to_be_bytes());
    out
}

/// Reads an answer: (id, rcode, truncated, addresses) (tests and tools).
pub fn parse_answer(pkt: &[u8]) -> Option<(u16, u8, bool, Vec<IpAddr>)> {
    let id = be16(pkt, 0)?;
    let flags = be16(pkt, 2)?;
    let an = be16(pkt, 6)?;
    let mut at = 12;
    while *pkt.get(at)? != 0 {
        at += 1 + *pkt.get(at)? as usize;
    }
    at += 5;
    let mut addrs = Vec::new();
    for _ in 0..an {
        let kind = be16(pkt, at + 2)?;
        let len = be16(pkt, at + 10)? as usize;
        let data = pkt.get(at + 12..at + 12 + len)?;
        match (kind, len) {
            (TYPE_A, 4) => addrs.push(IpAddr::from(<[u8; 4]>::try_from(data).ok()?)),
            (TYPE_AAAA, 16) => addrs.push(IpAddr::from(<[u8; 16]>::try_from(data).ok()?)),
            _ => return None,
        }
        at += 12 + len;
    }
    Some((id, (flags & 0xf) as u8, flags & 0x0200 != 0, addrs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(name: &str, qtype: u16) -> Query {
        match parse_packet(&build_query(7, name, qtype)) {
            Some(Packet::Query(q)) => q,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn round_trip() {
        let q = query("Origin.TEST.", TYPE_A);
        assert_eq!((q.id, q.name.as_str(), q.qtype), (7, "origin.test", TYPE_A));
        let addrs: Vec<IpAddr> = vec!["192.0.2.1".parse().unwrap(), "2001:db8::1".parse().unwrap()];
        let (id, rcode, tc, got) = parse_answer(&build_answer(&q, Rcode::NoError, &addrs)).unwrap();
        assert_eq!((id, rcode, tc, got), (7, 0, false, vec![addrs[0]]));
        let q6 = query("origin.test", TYPE_AAAA);
        let (_, _, _, got) = parse_answer(&build_answer(&q6, Rcode::NoError, &addrs)).unwrap();
        assert_eq!(got, vec![addrs[1]]);
        let (_, rcode, _, got) = parse_answer(&build_answer(&q, Rcode::Refused, &[])).unwrap();
        assert_eq!((rcode, got.len()), (5, 0));
    }

    #[test]
    fn truncates_to_512() {
        let q = query("many.test", TYPE_AAAA);
        let addrs: Vec<IpAddr> = (0..40u16)
            .map(|i| IpAddr::from([0x2001, 0xdb8, 0, 0, 0, 0, 0, i]))
            .collect();
        let out = build_answer(&q, Rcode::NoError, &addrs);
        assert!(out.len() <= MAX_DNS_PACKET_BYTES);
        let (_, _, tc, got) = parse_answer(&out).unwrap();
        assert!(tc);
        assert!(!got.is_empty() && got.len() < 40);
    }

    #[test]
    fn malformed_dropped() {
        let good = build_query(1, "a.test", TYPE_A);
        for cut in 0..good.len() {
            assert!(parse_packet(&good[..cut]).is_none(), "cut {cut}");
        }
        let mut response = good.clone();
        response[2] |= 0x80;
        assert!(parse_packet(&response).is_none());
        let mut two = good.clone();
        two[5] = 2;
        assert!(parse_packet(&two).is_none());
        let mut pointer = good.clone();
        pointer[12] = 0xc0;
        assert!(parse_packet(&pointer).is_none());
        assert!(parse_packet(&vec![0u8; 513]).is_none());
        let mut notify = good;
        notify[2] = 0x20; // opcode 4
        assert!(matches!(
            parse_packet(&notify),
            Some(Packet::OtherOpcode { id: 1, .. })
        ));
    }
}
