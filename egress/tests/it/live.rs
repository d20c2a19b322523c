//! Live policy changes, statistics, many open tunnels, the control protocol.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;

use cowspace_egress::{ControlClient, HostPattern, PolicyChange, serve_control};

use crate::support::{Proxy, Server, echo_through, policy, tunnel};

#[test]
fn policy_switches_for_new_connections_while_a_tunnel_keeps_working() {
    let echo = Server::echo();
    let proxy = Proxy::start(policy(&["echo.test"], &[]));
    let authority = format!("echo.test:{}", echo.port());
    let (status, mut kept) = tunnel(&proxy, &authority);
    assert_eq!(status, 200);
    assert_eq!(echo_through(&mut kept, b"one"), b"one");

    proxy.egress.set_policy(policy(&[], &[]));
    assert_eq!(tunnel(&proxy, &authority).0, 403);
    assert_eq!(
        echo_through(&mut kept, b"two"),
        b"two",
        "established tunnels are not cut"
    );

    proxy.egress.set_policy(policy(&["echo.test"], &[]));
    let (status, mut fresh) = tunnel(&proxy, &authority);
    assert_eq!(status, 200);
    assert_eq!(echo_through(&mut fresh, b"three"), b"three");
    assert_eq!(echo_through(&mut kept, b"four"), b"four");

    let verdicts: Vec<String> = proxy
        .records()
        .iter()
        .filter(|r| r.host == "echo.test")
        .map(|r| {
            serde_json::to_value(r.verdict)
                .unwrap()
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(verdicts, ["allowed", "denied", "allowed"]);
}

#[test]
fn stats_count_connections_and_bytes() {
    let echo = Server::echo();
    let proxy = Proxy::start(policy(&["echo.test"], &[]));
    let authority = format!("echo.test:{}", echo.port());
    let (_, mut t) = tunnel(&proxy, &authority);
    let data = vec![7u8; 100_000];
    assert_eq!(echo_through(&mut t, &data).len(), data.len());
    let _ = tunnel(&proxy, "denied.test:443");
    let stats = proxy.egress.stats();
    let echo_stats = stats.hosts["echo.test"];
    assert_eq!(echo_stats.allowed, 1);
    assert!(
        echo_stats.bytes_up >= 100_000 && echo_stats.bytes_down >= 100_000,
        "{echo_stats:?}"
    );
    assert_eq!(stats.hosts["denied.test"].denied, 1);
    assert_eq!(stats.totals.allowed, 1);
    assert_eq!(stats.totals.denied, 1);
    assert!(stats.connections_open >= 1);
    let json = serde_json::to_value(&stats).unwrap();
    assert!(json["hosts"]["echo.test"]["bytes_up"].as_u64().unwrap() >= 100_000);
}

#[test]
fn a_thousand_tunnels_held_open_at_once() {
    const TUNNELS: usize = 1000;
    let echo = Server::echo();
    let proxy = Proxy::start(policy(&["echo.test"], &[]));
    let authority = format!("echo.test:{}", echo.port());
    let mut open = Vec::with_capacity(TUNNELS);
    for i in 0..TUNNELS {
        let (status, mut t) = tunnel(&proxy, &authority);
        assert_eq!(status, 200, "tunnel {i}");
        assert_eq!(echo_through(&mut t, b"x"), b"x", "tunnel {i}");
        open.push(t);
    }
    assert!(proxy.egress.stats().connections_open >= TUNNELS as u64);
    // Every tunnel still works with all of them open.
    for t in open.iter_mut().step_by(97) {
        assert_eq!(echo_through(t, b"still"), b"still");
    }
    assert_eq!(
        proxy.egress.stats().hosts["echo.test"].allowed,
        TUNNELS as u64
    );
}

#[test]
fn control_protocol_round_trip() {
    let proxy = Proxy::start(policy(&["echo.test"], &[]));
    let (server_end, client_end) = UnixStream::pair().unwrap();
    let raw = client_end.try_clone().unwrap();
    std::thread::scope(|scope| {
        let egress = &proxy.egress;
        let server = scope.spawn(move || serve_control(server_end, egress));
        let mut client = ControlClient::new(client_end).unwrap();
        let mut next = policy(&["*.example.com:443"], &["bad.example.com"]);
        client.set_policy(&next).unwrap();
        assert_eq!(client.policy().unwrap(), next);
        assert_eq!(proxy.egress.policy(), next);
        let pattern: HostPattern = "pypi.org".parse().unwrap();
        let applied = client
            .apply(&[PolicyChange::Allow(pattern.clone())])
            .unwrap();
        next.allow.push(pattern);
        assert_eq!(applied, next);
        let stats = client.stats().unwrap();
        assert_eq!(stats.totals.allowed, 0);

        // Malformed requests are answered, and the connection stays usable.
        let mut w = raw.try_clone().unwrap();
        let mut r = BufReader::new(raw);
        for bad in [
            "not json\n",
            "{\"op\":\"launch\"}\n",
            "{\"op\":\"set_policy\",\"policy\":{\"allow\":[\"http://x\"]}}\n",
        ] {
            w.write_all(bad.as_bytes()).unwrap();
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            assert_eq!(v["ok"], false, "{bad}");
            assert!(!v["error"].as_str().unwrap().is_empty());
        }
        w.write_all(b"{\"op\":\"policy\"}\n").unwrap();
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        assert!(line.starts_with("{\"ok\":true,\"policy\":"), "{line}");
        drop(client);
        drop(w);
        drop(r);
        server.join().unwrap().unwrap();
    });
}
