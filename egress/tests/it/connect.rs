//! CONNECT tunnels: policy per host and port, first-bytes inspection, server-first.

use std::io::{BufRead, Read, Write};

use cowspace_egress::tls::client_hello_for_tests;

use crate::support::{
    Origin, Proxy, Server, closed, echo_through, eventually, policy, read_response, tunnel,
};

#[test]
fn allowed_tunnel_carries_data() {
    let echo = Server::echo();
    let proxy = Proxy::start(policy(&["echo.test"], &[]));
    let (status, mut t) = tunnel(&proxy, &format!("echo.test:{}", echo.port()));
    assert_eq!(status, 200);
    assert_eq!(
        echo_through(&mut t, b"\x00binary\xffdata"),
        b"\x00binary\xffdata"
    );
    assert!(proxy.logged("echo.test", "allowed", "allow echo.test"));
}

#[test]
fn allowed_name_on_a_denied_port() {
    let echo = Server::echo();
    let proxy = Proxy::start(policy(&["echo.test:1"], &[]));
    let (status, mut t) = tunnel(&proxy, &format!("echo.test:{}", echo.port()));
    assert_eq!(status, 403);
    let mut rest = String::new();
    let _ = t.read_to_string(&mut rest);
    assert!(
        rest.contains(&format!("--allow-host echo.test:{}", echo.port())),
        "{rest}"
    );
    assert!(proxy.logged("echo.test", "denied", "default deny"));
}

#[test]
fn client_hello_sni_must_name_the_tunnel_host() {
    let echo = Server::echo();
    let proxy = Proxy::start(policy(&["echo.test"], &[]));
    let authority = format!("echo.test:{}", echo.port());
    let (_, mut t) = tunnel(&proxy, &authority);
    t.get_mut()
        .write_all(&client_hello_for_tests(Some("evil.test")))
        .unwrap();
    assert!(closed(&mut t), "mismatched SNI must close the tunnel");
    assert!(proxy.logged("echo.test", "denied", "sni mismatch"));

    let (_, mut t) = tunnel(&proxy, &authority);
    let hello = client_hello_for_tests(Some("Echo.Test"));
    assert_eq!(echo_through(&mut t, &hello), hello);
}

#[test]
fn plain_http_inside_a_tunnel_must_carry_the_tunnel_host() {
    let origin = Origin::start();
    let proxy = Proxy::start(policy(&["origin.test"], &[]));
    let authority = format!("origin.test:{}", origin.port());
    let (_, mut t) = tunnel(&proxy, &authority);
    t.get_mut()
        .write_all(b"GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n")
        .unwrap();
    assert!(closed(&mut t));
    assert!(proxy.logged("origin.test", "denied", "host mismatch"));
    assert!(origin.seen.lock().unwrap().is_empty());

    let (_, mut t) = tunnel(&proxy, &authority);
    write!(t.get_mut(), "GET /in HTTP/1.1\r\nHost: {authority}\r\n\r\n").unwrap();
    assert_eq!(
        read_response(&mut t, false).body,
        format!("GET /in host={authority} body=")
    );
}

#[test]
fn server_speaks_first_protocols_do_not_hang() {
    let banner = Server::banner();
    let proxy = Proxy::start(policy(&["banner.test"], &[]));
    let (status, mut t) = tunnel(&proxy, &format!("banner.test:{}", banner.port()));
    assert_eq!(status, 200);
    let mut line = String::new();
    t.read_line(&mut line).unwrap();
    assert_eq!(line, "SSH-2.0-test\r\n");
    assert_eq!(
        echo_through(&mut t, b"SSH-2.0-client\r\n"),
        b"SSH-2.0-client\r\n"
    );
}

#[test]
fn connect_host_header_must_match() {
    let echo = Server::echo();
    let proxy = Proxy::start(policy(&["echo.test", "evil.test"], &[]));
    let mut s = proxy.client();
    write!(
        s,
        "CONNECT echo.test:{} HTTP/1.1\r\nHost: evil.test:443\r\n\r\n",
        echo.port()
    )
    .unwrap();
    let resp = read_response(&mut std::io::BufReader::new(s), false);
    assert_eq!(resp.status, 403);
    assert!(proxy.logged("echo.test", "denied", "host mismatch"));
}

/// What `drain_then_answer` sends back once the client has half-closed.
const ANSWER_BYTES: usize = 3 * 1024 * 1024 + 17;

fn answer_byte(i: usize) -> u8 {
    (i % 251) as u8
}

/// Reads the client's bytes to their end, then sends [`ANSWER_BYTES`] and closes.
fn drain_then_answer(
    mut s: std::net::TcpStream,
    seen: &std::sync::Arc<std::sync::Mutex<Vec<String>>>,
) {
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    seen.lock()
        .unwrap()
        .push(format!("{} {:x}", got.len(), checksum(&got)));
    let answer: Vec<u8> = (0..ANSWER_BYTES).map(answer_byte).collect();
    let _ = s.write_all(&answer);
}

fn checksum(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h: u64, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

#[test]
fn bulk_both_ways_with_half_close_and_exact_counts() {
    let seen = std::sync::Arc::default();
    let server = Server::start(drain_then_answer, std::sync::Arc::clone(&seen));
    let proxy = Proxy::start(policy(&["echo.test"], &[]));
    let (status, t) = tunnel(&proxy, &format!("echo.test:{}", server.port()));
    assert_eq!(status, 200);
    // Binary from the first byte (passes the first-bytes check), several MiB: the relay
    // moves most of it with splice(2).
    let up: Vec<u8> = (0..2 * 1024 * 1024 + 5)
        .map(|i| (i * 13 % 256) as u8)
        .collect();
    let mut w = t.get_ref().try_clone().unwrap();
    let sent = up.clone();
    let sender = std::thread::spawn(move || {
        w.write_all(&sent).unwrap();
        w.shutdown(std::net::Shutdown::Write).unwrap(); // passed through to the server
    });
    let mut r = t;
    let mut down = Vec::new();
    r.read_to_end(&mut down).unwrap(); // the server's close, passed through
    sender.join().unwrap();
    assert_eq!(
        seen.lock().unwrap().as_slice(),
        [format!("{} {:x}", up.len(), checksum(&up))]
    );
    assert_eq!(down.len(), ANSWER_BYTES);
    assert!(down.iter().enumerate().all(|(i, &b)| b == answer_byte(i)));
    eventually("the tunnel's bytes counted exactly", || {
        let s = proxy.egress.stats().hosts["echo.test"];
        (s.bytes_up, s.bytes_down) == (up.len() as u64, ANSWER_BYTES as u64)
    });
}
