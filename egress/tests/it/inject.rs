//! Injected credentials over real sockets: TLS terminated with the sandbox's authority
//! for an injected host, the header replaced on every request of a kept-alive tunnel,
//! a client that does not trust the authority failing before anything goes upstream, and
//! the control socket never echoing a value.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};

use cowspace_egress::inject::ca::CaPem;
use cowspace_egress::inject::{InjectConfig, Injection, SecretValue};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};

use crate::support::{Proxy, TEST_IO_TIMEOUT, policy};

const VALUE: &str = "Bearer it-secret-0123456789";

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// An HTTPS server for `origin.test` with its own CA; keep-alive; records each request's
/// `Authorization` (or `-`).
fn upstream() -> (u16, String, Arc<Mutex<Vec<String>>>) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["origin.test".to_string()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    let config = Arc::new(
        rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![leaf.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )
            .unwrap(),
    );
    let seen = Arc::new(Mutex::new(Vec::new()));
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let s = seen.clone();
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            let (config, s) = (config.clone(), s.clone());
            std::thread::spawn(move || {
                c.set_read_timeout(Some(TEST_IO_TIMEOUT)).unwrap();
                let conn = rustls::ServerConnection::new(config).unwrap();
                let mut r = BufReader::new(rustls::StreamOwned::new(conn, c));
                loop {
                    let mut auth = "-".to_string();
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    loop {
                        let mut h = String::new();
                        if r.read_line(&mut h).unwrap_or(0) == 0 {
                            return;
                        }
                        if h == "\r\n" {
                            break;
                        }
                        if let Some((n, v)) = h.split_once(':')
                            && n.eq_ignore_ascii_case("authorization")
                        {
                            auth = v.trim().to_string();
                        }
                    }
                    s.lock().unwrap().push(auth);
                    let _ = r
                        .get_mut()
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
                }
            });
        }
    });
    (port, ca_pem, seen)
}

fn injecting(proxy: &Proxy, ca: &CaPem, upstream_ca: &str) {
    proxy
        .egress
        .set_injections(InjectConfig {
            injections: vec![Injection {
                host: "origin.test".into(),
                header: "Authorization".into(),
                value: SecretValue(VALUE.into()),
                methods: Vec::new(),
            }],
            ca: Some(ca.clone()),
            upstream_ca_pem: Some(upstream_ca.into()),
        })
        .unwrap();
}

/// CONNECT through the proxy, then TLS trusting `roots` (PEM).
fn tunnel(
    proxy: &Proxy,
    port: u16,
    roots: &str,
) -> std::io::Result<BufReader<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>> {
    let mut s = proxy.client();
    write!(
        s,
        "CONNECT origin.test:{port} HTTP/1.1\r\nHost: origin.test:{port}\r\n\r\n"
    )?;
    let mut head = [0u8; 39];
    s.read_exact(&mut head)?;
    assert!(head.starts_with(b"HTTP/1.1 200"), "{head:?}");
    let mut store = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(roots.as_bytes()) {
        store.add(c.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(store)
        .with_no_client_auth();
    let name = ServerName::try_from("origin.test").unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let mut stream = rustls::StreamOwned::new(conn, s);
    while stream.conn.is_handshaking() {
        stream.conn.complete_io(&mut stream.sock)?;
    }
    Ok(BufReader::new(stream))
}

fn get(
    t: &mut BufReader<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>,
    port: u16,
    auth: Option<&str>,
) -> String {
    let auth = auth.map_or(String::new(), |a| format!("Authorization: {a}\r\n"));
    write!(
        t.get_mut(),
        "GET /x HTTP/1.1\r\nHost: origin.test:{port}\r\n{auth}\r\n"
    )
    .unwrap();
    let mut status = String::new();
    t.read_line(&mut status).unwrap();
    loop {
        let mut h = String::new();
        t.read_line(&mut h).unwrap();
        if h == "\r\n" {
            break;
        }
    }
    let mut body = [0u8; 2];
    t.read_exact(&mut body).unwrap();
    status
}

#[test]
fn injected_host_is_terminated_and_every_request_of_a_kept_tunnel_gets_the_value() {
    let (port, upstream_ca, seen) = upstream();
    let proxy = Proxy::start(policy(&["origin.test"], &[]));
    let ca = CaPem::generate("it CA").unwrap();
    injecting(&proxy, &ca, &upstream_ca);
    let mut t = tunnel(&proxy, port, &ca.cert_pem).unwrap();
    assert!(get(&mut t, port, None).contains("200"));
    assert!(get(&mut t, port, Some("Bearer worker")).contains("200"));
    assert_eq!(*seen.lock().unwrap(), vec![VALUE.to_string(), VALUE.into()]);
    let rec = proxy
        .records()
        .into_iter()
        .find(|r| r.host == "origin.test")
        .unwrap();
    assert_eq!(rec.injected, vec!["authorization".to_string()]);
    let log = std::fs::read_to_string(&proxy.log_path).unwrap();
    assert!(!log.contains(VALUE));
    assert_eq!(
        proxy.egress.injections(),
        vec![("origin.test".to_string(), "Authorization".to_string())]
    );
}

#[test]
fn a_client_trusting_another_authority_fails_before_anything_goes_upstream() {
    let (port, upstream_ca, seen) = upstream();
    let proxy = Proxy::start(policy(&["origin.test"], &[]));
    let ca = CaPem::generate("it CA").unwrap();
    injecting(&proxy, &ca, &upstream_ca);
    // The upstream's own CA is not the sandbox's: the proxy's leaf does not verify.
    assert!(tunnel(&proxy, port, &upstream_ca).is_err());
    assert!(seen.lock().unwrap().is_empty());
}

#[test]
fn an_upstream_that_does_not_verify_gets_nothing() {
    let (port, _upstream_ca, seen) = upstream();
    let proxy = Proxy::start(policy(&["origin.test"], &[]));
    let ca = CaPem::generate("it CA").unwrap();
    // The proxy trusts another CA than the upstream's.
    let other = CaPem::generate("unrelated").unwrap();
    injecting(&proxy, &ca, &other.cert_pem);
    let mut t = tunnel(&proxy, port, &ca.cert_pem).unwrap();
    let status = {
        write!(
            t.get_mut(),
            "GET /x HTTP/1.1\r\nHost: origin.test:{port}\r\n\r\n"
        )
        .unwrap();
        let mut s = String::new();
        t.read_line(&mut s).unwrap();
        s
    };
    assert!(status.contains("502"), "{status}");
    assert!(seen.lock().unwrap().is_empty());
}

#[test]
fn the_control_socket_never_answers_a_value() {
    let proxy = Proxy::start(policy(&["origin.test"], &[]));
    let (ours, theirs) = UnixStream::pair().unwrap();
    let egress = &proxy.egress;
    std::thread::scope(|s| {
        s.spawn(move || cowspace_egress::serve_control(theirs, egress));
        let mut r = BufReader::new(ours.try_clone().unwrap());
        let mut w = ours;
        let good = format!(
            r#"{{"op":"set_injections","config":{{"injections":[{{"host":"origin.test","header":"X-Key","value":"{VALUE}"}}]}}}}"#
        );
        // A bad one: an unknown field beside the value, and a value with a newline.
        let bad = format!(
            r#"{{"op":"set_injections","config":{{"injections":[{{"host":"origin.test","header":"X-Key","value":"{VALUE}","x":1}}]}}}}"#
        );
        let newline = format!(
            r#"{{"op":"set_injections","config":{{"injections":[{{"host":"origin.test","header":"X-Key","value":"{VALUE}\n"}}]}}}}"#
        );
        for line in [good, bad, newline] {
            writeln!(w, "{line}").unwrap();
            let mut answer = String::new();
            r.read_line(&mut answer).unwrap();
            assert!(!answer.contains("it-secret"), "{answer}");
        }
        drop(w);
    });
    assert_eq!(proxy.egress.injections().len(), 1);
}
