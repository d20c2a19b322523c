//! CONNECT tunnels: policy per host and port, first-bytes inspection, server-first.

use std::io::{BufRead, Read, Write};

use cowspace_egress::tls::client_hello_for_tests;

use crate::support::{Origin, Proxy, Server, closed, echo_through, policy, read_response, tunnel};

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
