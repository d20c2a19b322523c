//! The DNS responder: allowed names answered with the proxy's addresses, others refused.

use std::net::{IpAddr, UdpSocket};

use cowspace_egress::dns::{TYPE_A, TYPE_AAAA, build_query, parse_answer};

use crate::support::{Proxy, TEST_IO_TIMEOUT, policy};

fn ask(proxy: &Proxy, id: u16, name: &str, qtype: u16) -> (u16, u8, bool, Vec<IpAddr>) {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(TEST_IO_TIMEOUT)).unwrap();
    sock.send_to(&build_query(id, name, qtype), proxy.dns)
        .unwrap();
    let mut buf = [0u8; 600];
    let (n, _) = sock.recv_from(&mut buf).unwrap();
    parse_answer(&buf[..n]).unwrap()
}

#[test]
fn allowed_names_answer_added_addresses_and_others_are_refused() {
    let proxy = Proxy::start(policy(
        &["origin.test:8080", "localhost"],
        &["blocked.test"],
    ));
    let (id, rcode, _, addrs) = ask(&proxy, 41, "Origin.Test", TYPE_A);
    assert_eq!((id, rcode), (41, 0));
    assert_eq!(addrs, vec!["127.0.0.1".parse::<IpAddr>().unwrap()]);
    let (_, rcode, _, addrs) = ask(&proxy, 42, "origin.test", TYPE_AAAA);
    assert_eq!(
        (rcode, addrs.len()),
        (0, 0),
        "no IPv6 address: empty NOERROR"
    );
    let (_, rcode, _, addrs) = ask(&proxy, 43, "origin.test", 15);
    assert_eq!((rcode, addrs.len()), (0, 0), "MX: empty NOERROR");
    let (_, rcode, _, _) = ask(&proxy, 44, "exfil-data.attacker.test", TYPE_A);
    assert_eq!(rcode, 5, "REFUSED");
    let (_, rcode, _, _) = ask(&proxy, 45, "localhost", TYPE_A);
    assert_eq!(rcode, 5, "resolves only to private addresses");
    let records = proxy.records();
    let dns: Vec<_> = records
        .iter()
        .filter(|r| serde_json::to_value(r.via).unwrap() == "dns")
        .collect();
    assert!(
        dns.iter()
            .any(|r| r.host == "origin.test" && r.rule == "allow origin.test:8080" && r.port == 0)
    );
    assert!(proxy.logged("exfil-data.attacker.test", "denied", "default deny"));
    assert!(proxy.logged("localhost", "denied", "private address"));
}

#[test]
fn malformed_packets_get_no_answer() {
    let proxy = Proxy::start(policy(&["origin.test"], &[]));
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(TEST_IO_TIMEOUT)).unwrap();
    sock.send_to(b"\x00\x01garbage", proxy.dns).unwrap();
    // The next well-formed query is answered, and its answer is the first packet we get.
    sock.send_to(&build_query(9, "origin.test", TYPE_A), proxy.dns)
        .unwrap();
    let mut buf = [0u8; 600];
    let (n, _) = sock.recv_from(&mut buf).unwrap();
    assert_eq!(parse_answer(&buf[..n]).unwrap().0, 9);
}
