//! `--inject HOST=HEADER:@FILE`: the egress proxy adds a credential to the requests the
//! policy allows to HOST, and the credential never enters the sandbox.
//!
//! The test runs its own servers on the host's 127.0.0.1 (named inside by `--add-host`):
//! an HTTPS server with a certificate authority made here (given to the proxy with
//! `--upstream-ca`, never trusted inside) and a plain HTTP server, both answering 200 only
//! to a request carrying the right `Authorization`, and recording what they saw. Every
//! route around the rule (another port, an address literal, an SNI or `Host` mismatch, a
//! client that does not trust the sandbox's authority) must fail closed and carry no
//! credential; the value (and its base64) is then looked for everywhere the sandbox can
//! see, in every process of it and of the host, in the log and in the status.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use cowspace_tests::write_file;
use serde_json::Value;

use crate::sandbox::support as sbx;
use crate::workspaces::support::{WsRoot, require_root};

/// The credential the proxy adds. Never written inside the sandbox.
const SECRET: &str = "Bearer cowspace-test-7f3a9c1e5b2d4068";

/// What a test server saw of one request.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    host: String,
    authorization: Option<String>,
}

/// An HTTP or HTTPS server on 127.0.0.1: 200 with the right `Authorization`, else 401.
struct Server {
    port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    fn start(tls: Option<Arc<rustls::ServerConfig>>) -> Server {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (seen.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            for c in l.incoming() {
                if st.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(c) = c else { continue };
                let _ = c.set_read_timeout(Some(Duration::from_secs(30)));
                let (s, tls) = (s.clone(), tls.clone());
                std::thread::spawn(move || match tls {
                    Some(cfg) => {
                        let conn = rustls::ServerConnection::new(cfg).unwrap();
                        let mut stream = rustls::StreamOwned::new(conn, c);
                        answer(&mut stream, &s);
                    }
                    None => {
                        let mut c = c;
                        answer(&mut c, &s);
                    }
                });
            }
        });
        Server {
            port,
            seen,
            stop,
            thread: Some(thread),
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One request, one answer, then close.
fn answer<S: Read + Write>(s: &mut S, seen: &Mutex<Vec<Seen>>) {
    let mut r = BufReader::new(&mut *s);
    let mut line = String::new();
    if r.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let mut seen_one = Seen {
        method: line.split_whitespace().next().unwrap_or("").to_string(),
        host: String::new(),
        authorization: None,
    };
    let mut length = 0usize;
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).unwrap_or(0) == 0 {
            return;
        }
        if h == "\r\n" || h == "\n" {
            break;
        }
        let (name, value) = h.split_once(':').unwrap_or((&h, ""));
        let value = value.trim().to_string();
        match name.to_ascii_lowercase().as_str() {
            "host" => seen_one.host = value,
            "authorization" => seen_one.authorization = Some(value),
            "content-length" => length = value.parse().unwrap_or(0),
            _ => {}
        }
    }
    let mut body = vec![0u8; length];
    let _ = r.read_exact(&mut body);
    drop(r);
    let ok = seen_one.authorization.as_deref() == Some(SECRET);
    seen.lock().unwrap().push(seen_one);
    let (status, text) = if ok {
        ("200 OK", "authorized")
    } else {
        ("401 Unauthorized", "no credential")
    };
    let out = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    );
    let _ = s.write_all(out.as_bytes());
    let _ = s.flush();
}

/// A certificate authority made by the test and a server configuration for `names`.
fn test_ca(names: &[&str]) -> (String, Arc<rustls::ServerConfig>) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "egress inject test CA");
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
    (ca_cert.pem(), Arc::new(config))
}

/// Probes run inside: `python3 /workspace/inj.py MODE URL [AUTH] [METHOD]` prints one line.
const PROBE: &str = r#"
import json, socket, ssl, sys, urllib.request
def out(**kw): print(json.dumps(kw)); sys.exit(0)
mode, url = sys.argv[1], sys.argv[2]
auth = sys.argv[3] if len(sys.argv) > 3 else ""
method = sys.argv[4] if len(sys.argv) > 4 else "GET"
try:
    if mode == "sni":  # CONNECT to one host, TLS naming another
        host, port, sni = url.split(":")
        s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
        s.sendall(("CONNECT %s:%s HTTP/1.1\r\nHost: %s:%s\r\n\r\n" % (host, port, host, port)).encode())
        head = s.recv(4096).decode(errors="replace").split("\r\n")[0]
        ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
        try:
            t = ctx.wrap_socket(s, server_hostname=sni)
            t.sendall(("GET / HTTP/1.1\r\nHost: %s:%s\r\n\r\n" % (host, port)).encode())
            out(head=head, got=t.recv(4096).decode(errors="replace"))
        except Exception as e:
            out(head=head, error=type(e).__name__)
    if mode == "system":  # a client with its own trust store: the system's roots only
        ctx = ssl.create_default_context(cafile="/etc/ssl/certs/ca-certificates.crt")
    elif mode.startswith("cafile="):
        ctx = ssl.create_default_context(cafile=mode[7:])
    else:  # the environment's SSL_CERT_FILE
        ctx = ssl.create_default_context()
    req = urllib.request.Request(url, method=method)
    if auth: req.add_header("Authorization", auth)
    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=ctx))
    try:
        with opener.open(req, timeout=10) as r:
            out(status=r.status, body=r.read().decode())
    except urllib.error.HTTPError as e:
        out(status=e.code, body=e.read().decode())
except Exception as e:
    out(error=type(e).__name__, text=str(e))
"#;

fn probe(r: &WsRoot, ws: &str, args: &[&str]) -> Value {
    let mut cmd = vec![
        "exec",
        ws,
        "--",
        "timeout",
        "30",
        "/usr/bin/python3",
        "/workspace/inj.py",
    ];
    cmd.extend_from_slice(args);
    let out = r.t.run(&cmd).ok();
    serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("probe {args:?}: {e}: {}", out.stdout))
}

fn setup() -> (WsRoot, String) {
    sbx::helper();
    let r = WsRoot::new_in(&std::env::temp_dir());
    let src = r.t.path("src");
    write_file(&src.join("inj.py"), PROBE);
    let snap = r.import(&src, &["--ref", "t/main"]);
    let ws = r.create(&snap, &["--name", "inj"]);
    (r, ws.id)
}

/// The needles: the value, and its base64 forms (as `Basic` credentials and proxies
/// would carry it).
fn needles() -> Vec<Vec<u8>> {
    let b64 = base64::engine::general_purpose::STANDARD;
    vec![
        SECRET.as_bytes().to_vec(),
        b64.encode(SECRET).into_bytes(),
        b64.encode(SECRET.trim_start_matches("Bearer "))
            .into_bytes(),
        SECRET.trim_start_matches("Bearer ").as_bytes().to_vec(),
    ]
}

fn holds_secret(bytes: &[u8]) -> bool {
    needles()
        .iter()
        .any(|n| bytes.windows(n.len()).any(|w| w == n.as_slice()))
}

/// Every regular file the sandbox sees (through its init's root, from the host), but
/// the host's read-only system directories shared with every sandbox and the kernel's
/// pseudo-filesystems: (paths holding the value).
fn scan_view(root: &Path) -> (usize, Vec<String>) {
    let mut found = Vec::new();
    let mut files = 0;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().to_string();
            if ["proc", "sys", "dev", "usr"].contains(&rel.as_str()) {
                continue;
            }
            let Ok(m) = std::fs::symlink_metadata(&p) else {
                continue;
            };
            if m.is_dir() {
                stack.push(p);
            } else if m.is_file() {
                files += 1;
                if std::fs::read(&p).is_ok_and(|b| holds_secret(&b)) {
                    found.push(rel);
                }
            }
        }
    }
    (files, found)
}

/// Processes on the host whose command line or environment hold the value.
fn scan_processes() -> Vec<String> {
    let me = std::process::id().to_string();
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let pid = e.file_name().to_string_lossy().to_string();
        if !pid.bytes().all(|b| b.is_ascii_digit()) || pid == me {
            continue;
        }
        for what in ["cmdline", "environ"] {
            if std::fs::read(format!("/proc/{pid}/{what}")).is_ok_and(|b| holds_secret(&b)) {
                found.push(format!("{pid}/{what}"));
            }
        }
    }
    found
}

#[test]
fn egress_inject_adds_the_credential_outside_and_every_other_route_gets_none() {
    require_root!();
    let (r, ws) = setup();
    let (ca_pem, tls) = test_ca(&["api.test", "other.test"]);
    let https = Server::start(Some(tls));
    let plain = Server::start(None);
    let ca_file = r.t.path("upstream-ca.pem");
    write_file(&ca_file, &ca_pem);
    let secret_file = r.t.path("token");
    write_file(&secret_file, format!("{SECRET}\n"));
    let (hp, pp) = (https.port.to_string(), plain.port.to_string());
    let v =
        r.t.json([
            "sandbox",
            "start",
            &ws,
            "--net",
            "egress",
            "--add-host",
            "api.test:127.0.0.1",
            "--add-host",
            "other.test:127.0.0.1",
            "--add-host",
            "plain.test:127.0.0.1",
            "--allow-host",
            &format!("api.test:{hp}"),
            "--allow-host",
            &format!("other.test:{hp}"),
            "--allow-host",
            &format!("plain.test:{pp}"),
            "--inject",
            &format!("api.test=Authorization:@{}", secret_file.display()),
            "--inject",
            &format!("plain.test=Authorization:@{}", secret_file.display()),
            "--inject-methods",
            "plain.test=GET,HEAD",
            "--upstream-ca",
            &ca_file.to_string_lossy(),
        ])
        .ok()
        .json();
    assert_eq!(v["state"], "running", "{v}");
    // The test CA is not secret: a copy inside lets a client verify a passthrough.
    std::fs::copy(&ca_file, r.t.path("ws-ca.pem")).unwrap();
    r.t.run([
        "cp",
        &r.t.path("ws-ca.pem").to_string_lossy(),
        &format!("{ws}:/test-ca.pem"),
    ])
    .ok();

    // HTTPS to the injected host, without any credential inside: 200, and the server saw
    // exactly the injected value.
    let api = format!("https://api.test:{hp}/data");
    let got = probe(&r, &ws, &["env", &api]);
    if got["status"] != 200 {
        let diag = r.t.run(["exec", &ws, "--", "sh", "-c", "env | grep -i cert; ls -l /run/cowspace; tail -c 800 /run/cowspace/ca-bundle.pem; openssl x509 -in /run/cowspace/egress-ca.pem -noout -text | head -40"]).stdout;
        panic!("{got}\n{diag}");
    }
    let seen = https.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].authorization.as_deref(), Some(SECRET));
    assert_eq!(seen[0].host, format!("api.test:{hp}"));

    // The worker's own Authorization is replaced, not added to.
    let got = probe(&r, &ws, &["env", &api, "Bearer worker-made"]);
    assert_eq!(got["status"], 200, "{got}");
    assert_eq!(https.seen()[1].authorization.as_deref(), Some(SECRET));

    // Another allowed host on the same server: passthrough (verified with the test CA
    // inside, so never decrypted by the proxy), and no credential.
    let other = format!("https://other.test:{hp}/data");
    let got = probe(&r, &ws, &["cafile=/workspace/test-ca.pem", &other]);
    assert_eq!(got["status"], 401, "{got}");
    let last = https.seen().last().cloned().unwrap();
    assert_eq!(last.host, format!("other.test:{hp}"));
    assert_eq!(
        last.authorization, None,
        "a non-injected host got the credential"
    );

    // Plain HTTP: the header is set on the forwarded request; the method rule refuses POST.
    let plain_url = format!("http://plain.test:{pp}/x");
    let got = probe(&r, &ws, &["env", &plain_url, "Basic d29ya2VyOm1hZGU="]);
    assert_eq!(got["status"], 200, "{got}");
    assert_eq!(plain.seen()[0].authorization.as_deref(), Some(SECRET));
    assert_eq!(plain.seen()[0].method, "GET");
    let before = plain.seen().len();
    let got = probe(&r, &ws, &["env", &plain_url, "", "POST"]);
    assert_eq!(got["status"], 403, "{got}");
    assert!(
        got["body"].as_str().unwrap().contains("method rule"),
        "{got}"
    );
    assert_eq!(
        plain.seen().len(),
        before,
        "a refused method reached the server"
    );

    // Fail closed, no credential: a client trusting only the system roots (not the
    // sandbox's authority) fails its handshake, and nothing reaches the server.
    let before = https.seen().len();
    let got = probe(&r, &ws, &["system", &api]);
    assert!(
        got["error"].as_str().is_some_and(|e| e.contains("Error")),
        "a client without the sandbox's CA must fail: {got}"
    );
    // Another port of the injected host, an address literal, an SNI naming another host.
    let got = probe(&r, &ws, &["env", &format!("http://api.test:{pp}/x")]);
    assert_eq!(got["status"], 403, "{got}");
    let got = probe(&r, &ws, &["env", &format!("https://127.0.0.1:{hp}/x")]);
    assert!(got["status"] == 403 || got["error"].is_string(), "{got}");
    let got = probe(&r, &ws, &["sni", &format!("api.test:{hp}:other.test")]);
    assert!(
        !got["got"].as_str().unwrap_or("").contains("authorized"),
        "{got}"
    );
    assert_eq!(
        https.seen().len(),
        before,
        "a denied route reached the server: {:?}",
        https.seen()
    );

    // Evidence: the log names the header, never the value; the status names the rules.
    let log = r.t.json(["sandbox", "log", &ws]).ok().stdout;
    assert!(!holds_secret(log.as_bytes()), "the log holds the value");
    let recs: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        recs.iter().any(|r| r["host"] == "api.test"
            && r["verdict"] == "allowed"
            && r["injected"] == serde_json::json!(["authorization"])),
        "{log}"
    );
    assert!(recs.iter().any(|r| r["rule"] == "sni mismatch"), "{log}");
    assert!(
        recs.iter()
            .filter(|r| r["host"] == "other.test")
            .all(|r| r.get("injected").is_none()),
        "{log}"
    );
    let status = r.t.json(["sandbox", "status", &ws]).ok().stdout;
    assert!(
        !holds_secret(status.as_bytes()),
        "the status holds the value"
    );
    let st: Value = serde_json::from_str(&status).unwrap();
    assert_eq!(
        st["egress"]["injections"][0]["header"], "Authorization",
        "{st}"
    );

    // Live: the rule taken out, the host is a passthrough again (no credential, and
    // only the test CA verifies it); put back, the credential is added again.
    let v =
        r.t.json(["sandbox", "policy", &ws, "--remove-inject", "api.test"])
            .ok()
            .json();
    assert!(!holds_secret(v.to_string().as_bytes()), "{v}");
    let got = probe(&r, &ws, &["cafile=/workspace/test-ca.pem", &api]);
    assert_eq!(got["status"], 401, "{got}");
    assert_eq!(https.seen().last().unwrap().authorization, None);
    let s = r.t.json(["sandbox", "status", &ws]).ok().json();
    assert_eq!(
        s["egress"]["injections"].as_array().map(Vec::len),
        Some(1),
        "{s}"
    );
    let entry = format!("api.test=Authorization:@{}", secret_file.display());
    r.t.json(["sandbox", "policy", &ws, "--inject", &entry])
        .ok();
    let got = probe(&r, &ws, &["env", &api]);
    assert_eq!(got["status"], 200, "{got}");
    assert_eq!(
        https.seen().last().unwrap().authorization.as_deref(),
        Some(SECRET)
    );
    // A live rule for a host the policy does not allow is refused, and changes nothing.
    let bad = format!("nope.test=Authorization:@{}", secret_file.display());
    let out =
        r.t.run(["sandbox", "policy", &ws, "--inject", &bad])
            .code(9);
    assert!(
        out.stderr.contains("--allow-host nope.test"),
        "{}",
        out.stderr
    );
    let s = r.t.json(["sandbox", "status", &ws]).ok().json();
    assert_eq!(
        s["egress"]["injections"].as_array().map(Vec::len),
        Some(2),
        "{s}"
    );

    // The value is nowhere the sandbox can see, in no process's command line or
    // environment (inside or on the host), in no file inside.
    r.t.run(["exec", &ws, "--", "sh", "-c", "sleep 300 >/dev/null 2>&1 &"])
        .ok();
    let init = st["init_pid"].as_u64().expect("init_pid");
    let (files, found) = scan_view(Path::new(&format!("/proc/{init}/root")));
    assert!(files > 0, "the scan read nothing");
    assert!(found.is_empty(), "the value is inside: {found:?}");
    let procs = scan_processes();
    assert!(procs.is_empty(), "processes hold the value: {procs:?}");
    // The sandbox's CA is inside, its bundle named by the variables.
    let env = r.t.run(["exec", &ws, "--", "env"]).ok().stdout;
    assert!(
        env.contains("SSL_CERT_FILE=/run/cowspace/ca-bundle.pem"),
        "{env}"
    );
    let ca =
        r.t.run(["exec", &ws, "--", "cat", "/run/cowspace/egress-ca.pem"])
            .ok()
            .stdout;
    assert!(ca.contains("BEGIN CERTIFICATE") && !ca.contains("PRIVATE KEY"));

    r.t.json(["sandbox", "stop", &ws]).ok();
    drop((https, plain));
    r.discard(&ws);
    r.assert_clean();
}

#[test]
fn egress_inject_bad_input_is_refused_naming_the_flag_and_nothing_starts() {
    require_root!();
    let (r, ws) = setup();
    let good = r.t.path("good");
    write_file(&good, "Bearer x\n");
    let inner_newline = r.t.path("two-lines");
    write_file(&inner_newline, "Bearer x\nX-Evil: 1\n");
    let cr = r.t.path("cr");
    write_file(&cr, "Bearer x\r");
    let big = r.t.path("big");
    write_file(&big, "a".repeat(16 * 1024 + 1));
    let gd = format!("{}", good.display());
    let allow = ["--net", "egress", "--allow-host", "api.test"];
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--inject".into(), format!("other.test=Authorization:@{gd}")],
            "--allow-host other.test",
        ),
        (
            vec![
                "--inject".into(),
                "api.test=Authorization:@/nonexistent/token".into(),
            ],
            "--inject",
        ),
        (
            vec!["--inject".into(), format!("api.test=Bad Name:@{gd}")],
            "--inject",
        ),
        (
            vec!["--inject".into(), format!("api.test=X\nY:@{gd}")],
            "--inject",
        ),
        (
            vec![
                "--inject".into(),
                format!("api.test=Authorization:@{}", big.display()),
            ],
            "at most 16384 bytes",
        ),
        (
            vec![
                "--inject".into(),
                format!("api.test=Authorization:@{}", inner_newline.display()),
            ],
            "newline",
        ),
        (
            vec![
                "--inject".into(),
                format!("api.test=Authorization:@{}", cr.display()),
            ],
            "newline",
        ),
        (
            vec!["--inject".into(), format!("*.test=Authorization:@{gd}")],
            "exact host name",
        ),
        (
            vec!["--inject-methods".into(), "api.test=GET".into()],
            "--inject-methods",
        ),
    ];
    for (args, says) in cases {
        let mut all: Vec<String> = vec!["sandbox".into(), "start".into(), ws.clone()];
        all.extend(allow.iter().map(|s| s.to_string()));
        all.extend(args.iter().cloned());
        let out = r.t.run(&all).code(9);
        assert!(out.stderr.contains(says), "{args:?}: {}", out.stderr);
        assert!(
            !out.stderr.contains("Bearer x"),
            "an error shows the value: {}",
            out.stderr
        );
        r.t.run(["sandbox", "status", &ws]).code(3);
    }
    // Without --net egress there is no proxy to add it.
    let out =
        r.t.run([
            "sandbox",
            "start",
            &ws,
            "--inject",
            &format!("api.test=Authorization:@{gd}"),
        ])
        .code(9);
    assert!(out.stderr.contains("--net egress"), "{}", out.stderr);
    r.t.run(["sandbox", "status", &ws]).code(3);
    r.discard(&ws);
    r.assert_clean();
}
