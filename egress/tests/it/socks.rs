//! SOCKS5: names, literals, refusals.

use std::io::{BufReader, Read, Write};
use std::net::Ipv6Addr;

use crate::support::{Proxy, Server, connect, echo_through, policy, socks_command, socks_connect};

#[test]
fn domain_allowed_and_denied() {
    let echo = Server::echo();
    let proxy = Proxy::start(policy(&["echo.test"], &[]));
    let (code, s) = socks_connect(&proxy, 3, b"echo.test", echo.port());
    assert_eq!(code, 0);
    assert_eq!(
        echo_through(&mut BufReader::new(s), b"through socks"),
        b"through socks"
    );
    let (code, _) = socks_connect(&proxy, 3, b"other.test", echo.port());
    assert_eq!(code, 2, "connection not allowed by ruleset");
    assert!(proxy.logged("echo.test", "allowed", "allow echo.test"));
    assert!(proxy.logged("other.test", "denied", "default deny"));
}

#[test]
fn private_literals_are_refused_even_under_star() {
    let echo = Server::echo();
    let proxy = Proxy::start(policy(&["*"], &[]));
    let (code, _) = socks_connect(&proxy, 1, &[127, 0, 0, 1], echo.port());
    assert_eq!(code, 2);
    let (code, _) = socks_connect(&proxy, 4, &Ipv6Addr::LOCALHOST.octets(), echo.port());
    assert_eq!(code, 2);
    let (code, _) = socks_connect(&proxy, 1, &[169, 254, 169, 254], 80);
    assert_eq!(code, 2);
    let (code, _) = socks_connect(&proxy, 3, b"127.0.0.1", echo.port());
    assert_eq!(code, 2, "a domain spelling a literal is that literal");
    assert!(proxy.logged("127.0.0.1", "denied", "private address"));
    assert!(proxy.logged("::1", "denied", "private address"));
    assert!(proxy.logged("169.254.169.254", "denied", "private address"));
}

#[test]
fn unsupported_commands_and_methods() {
    let proxy = Proxy::start(policy(&["*"], &[]));
    let (code, _) = socks_command(&proxy, 2, 3, b"echo.test", 80);
    assert_eq!(code, 7, "BIND");
    let (code, _) = socks_command(&proxy, 3, 3, b"echo.test", 80);
    assert_eq!(code, 7, "UDP ASSOCIATE");
    let mut s = connect(proxy.socks);
    s.write_all(&[5, 1, 2]).unwrap(); // username/password only
    let mut reply = [0u8; 2];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(reply, [5, 0xff]);
}

#[test]
fn unreachable_name_and_refused_port() {
    struct NoDns;
    impl cowspace_egress::Resolve for NoDns {
        fn resolve(&self, host: &str) -> std::io::Result<Vec<std::net::IpAddr>> {
            Err(std::io::Error::other(format!("{host}: no such host")))
        }
    }
    let proxy = Proxy::start_with(
        policy(&["dead.test", "nonexistent.invalid"], &[]),
        std::sync::Arc::new(NoDns),
    );
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (code, _) = socks_connect(&proxy, 3, b"dead.test", free);
    assert_eq!(code, 5, "connection refused");
    let (code, _) = socks_connect(&proxy, 3, b"nonexistent.invalid", 80);
    assert_eq!(code, 4, "host unreachable");
}
