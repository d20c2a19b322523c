//! The HTTP forward proxy: forwarding, framing, keep-alive re-checks, refusals.

use std::io::{BufReader, Write};

use crate::support::{Origin, Proxy, eventually, policy, read_response, request};

#[test]
fn allowed_get_is_forwarded_in_origin_form_without_proxy_headers() {
    let origin = Origin::start();
    let proxy = Proxy::start(policy(&["origin.test"], &[]));
    let p = origin.port();
    let resp = request(
        &proxy,
        &format!(
            "GET http://origin.test:{p}/hello?x=1 HTTP/1.1\r\nHost: origin.test:{p}\r\nProxy-Authorization: Basic eA==\r\nConnection: keep-alive, X-Drop\r\nX-Drop: 1\r\nX-Keep: 2\r\n\r\n"
        ),
    );
    assert_eq!(resp.status, 200);
    assert_eq!(
        resp.body,
        format!("GET /hello?x=1 host=origin.test:{p} body=")
    );
    let head = origin.seen.lock().unwrap()[0].clone();
    assert!(head.starts_with("GET /hello?x=1 HTTP/1.1\r\n"), "{head}");
    assert!(head.contains("X-Keep: 2"), "{head}");
    for gone in ["Proxy-Authorization", "X-Drop", "Connection"] {
        assert!(!head.contains(gone), "{gone} forwarded: {head}");
    }
    assert!(proxy.logged("origin.test", "allowed", "allow origin.test"));
}

#[test]
fn keep_alive_second_request_is_checked_again() {
    let origin = Origin::start();
    let proxy = Proxy::start(policy(&["origin.test"], &[]));
    let p = origin.port();
    let mut s = proxy.client();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let get = format!("GET http://origin.test:{p}/one HTTP/1.1\r\nHost: origin.test:{p}\r\n\r\n");
    s.write_all(get.as_bytes()).unwrap();
    let first = read_response(&mut r, false);
    assert_eq!(
        (first.status, first.body.as_str()),
        (200, &*format!("GET /one host=origin.test:{p} body="))
    );
    // A different upstream on the same connection, allowed too.
    let other = Origin::start();
    let q = other.port();
    s.write_all(
        format!("GET http://origin.test:{q}/two HTTP/1.1\r\nHost: origin.test:{q}\r\n\r\n")
            .as_bytes(),
    )
    .unwrap();
    assert_eq!(
        read_response(&mut r, false).body,
        format!("GET /two host=origin.test:{q} body=")
    );
    proxy.egress.set_policy(policy(&[], &[]));
    s.write_all(get.as_bytes()).unwrap();
    let third = read_response(&mut r, false);
    assert_eq!(third.status, 403);
    assert!(
        third.body.contains("denied by default deny"),
        "{}",
        third.body
    );
    assert!(proxy.logged("origin.test", "denied", "default deny"));
}

#[test]
fn post_bodies_with_length_and_chunked() {
    let origin = Origin::start();
    let proxy = Proxy::start(policy(&["origin.test"], &[]));
    let p = origin.port();
    let mut s = proxy.client();
    let mut r = BufReader::new(s.try_clone().unwrap());
    write!(s, "POST http://origin.test:{p}/up HTTP/1.1\r\nHost: origin.test:{p}\r\nContent-Length: 11\r\n\r\nhello world").unwrap();
    assert_eq!(
        read_response(&mut r, false).body,
        format!("POST /up host=origin.test:{p} body=hello world")
    );
    write!(
        s,
        "POST http://origin.test:{p}/c HTTP/1.1\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n3\r\nabc\r\n4;ext=1\r\ndefg\r\n0\r\n\r\n"
    )
    .unwrap();
    let cont = read_response(&mut r, true);
    assert_eq!(cont.status, 100);
    assert_eq!(
        read_response(&mut r, false).body,
        format!("POST /c host=origin.test:{p} body=abcdefg")
    );
}

#[test]
fn head_chunked_and_close_delimited_responses_keep_framing() {
    let origin = Origin::start();
    let proxy = Proxy::start(policy(&["origin.test"], &[]));
    let p = origin.port();
    let mut s = proxy.client();
    let mut r = BufReader::new(s.try_clone().unwrap());
    write!(
        s,
        "HEAD http://origin.test:{p}/h HTTP/1.1\r\nHost: origin.test:{p}\r\n\r\n"
    )
    .unwrap();
    let head = read_response(&mut r, true);
    assert_eq!(head.status, 200);
    assert!(head.header("content-length").is_some());
    write!(s, "GET http://origin.test:{p}/chunked HTTP/1.1\r\n\r\n").unwrap();
    let chunked = read_response(&mut r, false);
    assert_eq!(chunked.body, "hello world");
    write!(s, "GET http://origin.test:{p}/close HTTP/1.1\r\n\r\n").unwrap();
    let close = read_response(&mut r, false);
    assert_eq!((close.status, close.body.as_str()), (200, "closing"));
    assert_eq!(close.header("connection"), Some("close"));
}

#[test]
fn denied_request_gets_403_naming_host_and_flag() {
    let proxy = Proxy::start(policy(&["origin.test:1"], &["evil.test"]));
    let resp = request(
        &proxy,
        "GET http://pypi.org/simple/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
    );
    assert_eq!(resp.status, 403);
    assert_eq!(
        resp.body.trim_end(),
        "cowspace: egress to pypi.org:80 denied by default deny; allow it with --allow-host pypi.org (or mountctl sandbox policy WS --allow-host pypi.org)"
    );
    let resp = request(&proxy, "GET http://evil.test/ HTTP/1.1\r\n\r\n");
    assert!(
        resp.body
            .contains("denied by deny evil.test; remove the deny rule"),
        "{}",
        resp.body
    );
    assert!(proxy.logged("pypi.org", "denied", "default deny"));
    assert!(proxy.logged("evil.test", "denied", "deny evil.test"));
}

#[test]
fn absolute_uri_and_host_header_must_agree() {
    let origin = Origin::start();
    let proxy = Proxy::start(policy(&["origin.test", "evil.test"], &[]));
    let p = origin.port();
    let resp = request(
        &proxy,
        &format!("GET http://origin.test:{p}/ HTTP/1.1\r\nHost: evil.test\r\n\r\n"),
    );
    assert_eq!(resp.status, 403);
    assert!(resp.body.contains("host mismatch"), "{}", resp.body);
    let resp = request(
        &proxy,
        &format!("GET http://origin.test:{p}/ HTTP/1.1\r\nHost: origin.test\r\n\r\n"),
    );
    assert_eq!(resp.status, 403, "port differs from the target's");
    assert!(proxy.logged("origin.test", "denied", "host mismatch"));
    assert!(
        origin.seen.lock().unwrap().is_empty(),
        "nothing reached the origin"
    );
}

#[test]
fn private_addresses_are_refused_unless_named() {
    let origin = Origin::start();
    let proxy = Proxy::start(policy(&["localhost", "*"], &[]));
    let p = origin.port();
    let resp = request(
        &proxy,
        &format!("GET http://localhost:{p}/ HTTP/1.1\r\nHost: localhost:{p}\r\n\r\n"),
    );
    assert_eq!(resp.status, 403);
    assert!(
        resp.body
            .contains("localhost resolves only to private addresses"),
        "{}",
        resp.body
    );
    assert!(
        resp.body.contains("--add-host localhost:ADDR"),
        "{}",
        resp.body
    );
    assert!(proxy.logged("localhost", "denied", "private address"));
    for target in [
        "169.254.169.254",
        "127.0.0.1",
        "[::1]",
        "[::ffff:127.0.0.1]",
        "10.1.2.3",
    ] {
        let resp = request(
            &proxy,
            &format!("GET http://{target}:{p}/latest/meta-data HTTP/1.1\r\n\r\n"),
        );
        assert_eq!(resp.status, 403, "{target}");
        assert!(
            resp.body.contains("private address"),
            "{target}: {}",
            resp.body
        );
    }
    assert!(proxy.logged("169.254.169.254", "denied", "private address"));
    assert!(origin.seen.lock().unwrap().is_empty());
}

#[test]
fn malformed_and_unreachable() {
    let proxy = Proxy::start(policy(&["dead.test", "origin.test"], &[]));
    for raw in [
        "GET /local HTTP/1.1\r\nHost: x\r\n\r\n",
        "GET https://origin.test/ HTTP/1.1\r\n\r\n",
        "GET http://user@origin.test/ HTTP/1.1\r\n\r\n",
        "NOT A REQUEST\r\n\r\n",
        "GET http://origin.test/ HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        "POST http://origin.test/ HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
        "CONNECT origin.test HTTP/1.1\r\n\r\n",
    ] {
        assert_eq!(request(&proxy, raw).status, 400, "{raw:?}");
    }
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let resp = request(
        &proxy,
        &format!("GET http://dead.test:{free}/ HTTP/1.1\r\n\r\n"),
    );
    assert_eq!(resp.status, 502);
    assert!(
        resp.body.contains("cannot reach dead.test"),
        "{}",
        resp.body
    );
}

#[test]
fn large_content_length_bodies_both_ways_keep_framing_and_exact_counts() {
    let origin = Origin::start();
    let proxy = Proxy::start(policy(&["origin.test"], &[]));
    let p = origin.port();
    let mut s = proxy.client();
    let mut r = BufReader::new(s.try_clone().unwrap());
    // The origin answers with the request body inside its own (Content-Length) body, so
    // a large body goes up and a larger one comes down, both spliced by the proxy.
    let body: String = (0..3 * 1024 * 1024 + 3)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let mut expected_down = 0;
    for path in ["/big", "/again"] {
        let head = format!(
            "POST http://origin.test:{p}{path} HTTP/1.1\r\nHost: origin.test:{p}\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let mut w = s.try_clone().unwrap();
        let up = body.clone();
        let sender = std::thread::spawn(move || {
            w.write_all(head.as_bytes()).unwrap();
            w.write_all(up.as_bytes()).unwrap();
        });
        let resp = read_response(&mut r, false);
        sender.join().unwrap();
        let text = format!("POST {path} host=origin.test:{p} body={body}");
        assert_eq!(resp.status, 200);
        assert!(resp.body == text, "body differs (len {})", resp.body.len());
        expected_down +=
            format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", text.len()).len() + text.len();
    }
    // A small request after them on the same connection: the framing held.
    write!(s, "GET http://origin.test:{p}/small HTTP/1.1\r\n\r\n").unwrap();
    let small = read_response(&mut r, false);
    let text = format!("GET /small host=origin.test:{p} body=");
    assert_eq!(small.body, text);
    expected_down +=
        format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", text.len()).len() + text.len();
    let seen = origin.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3, "three requests reached the origin");
    let expected_up: usize = seen.iter().map(String::len).sum::<usize>() + 2 * body.len();
    eventually("the bodies' bytes counted exactly", || {
        let s = proxy.egress.stats().hosts["origin.test"];
        (s.bytes_up, s.bytes_down) == (expected_up as u64, expected_down as u64)
    });
}
