//! `--net egress`: a sandbox reaches what its policy allows through the host-side proxy,
//! and nothing else. Real namespaces, a real proxy process, real pip and git; every
//! server is the test's own, on the host's 127.0.0.1, named inside by `--add-host`.
//!
//! Each bypass attempt must fail closed: refused or denied at once, never a way out and
//! never a hang (every probe inside runs under a timeout).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cowspace_tests::write_file;
use serde_json::Value;

use crate::sandbox::support as sbx;
use crate::workspaces::support::{WsRoot, alive, require_root};

/// A bound against hangs, never a performance threshold.
const WAIT: Duration = Duration::from_secs(120);

/// The wheels the set-up downloads once (`scripts/setup.sh`), served as a package index.
const WHEELHOUSE_ENV: &str = "COWSPACE_TEST_WHEELS";
const WHEELHOUSE_DEFAULT: &str = "/var/cache/cowspace/test-wheels";

/// A static file server on the host's 127.0.0.1 (a thread of the test), with directory
/// listings (what pip's `--index-url` and git's dumb HTTP read). Stops on drop.
pub(crate) struct Origin {
    pub(crate) port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Origin {
    pub(crate) fn serve(dir: &Path) -> Origin {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let dir = dir.to_path_buf();
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            for c in l.incoming() {
                if s.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(c) = c else { continue };
                let dir = dir.clone();
                std::thread::spawn(move || serve_conn(c, &dir));
            }
        });
        Origin {
            port,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One HTTP/1.1 connection: GETs of files and directories under `dir`, keep-alive.
fn serve_conn(c: TcpStream, dir: &Path) {
    let _ = c.set_read_timeout(Some(Duration::from_secs(30)));
    let mut r = BufReader::new(c.try_clone().unwrap());
    let mut w = c;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut host = String::new();
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            if h == "\r\n" || h == "\n" {
                break;
            }
            if let Some(v) = h.to_ascii_lowercase().strip_prefix("host:") {
                host = v.trim().to_string();
            }
        }
        let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
        let rel = path
            .split('?')
            .next()
            .unwrap_or("/")
            .trim_start_matches('/');
        let p = dir.join(rel);
        let (status, body, ctype) = if rel.contains("..") {
            ("403 Forbidden", b"no".to_vec(), "text/plain")
        } else if rel == "whoami" {
            (
                "200 OK",
                format!("origin host={host}").into_bytes(),
                "text/plain",
            )
        } else if p.is_dir() {
            let mut names: Vec<String> = std::fs::read_dir(&p)
                .unwrap()
                .filter_map(|e| e.ok())
                .map(|e| {
                    let n = e.file_name().to_string_lossy().to_string();
                    if e.path().is_dir() {
                        format!("{n}/")
                    } else {
                        n
                    }
                })
                .collect();
            names.sort();
            let links: String = names
                .iter()
                .map(|n| format!("<a href=\"{n}\">{n}</a><br>\n"))
                .collect();
            (
                "200 OK",
                format!("<html><body>\n{links}</body></html>\n").into_bytes(),
                "text/html",
            )
        } else if let Ok(b) = std::fs::read(&p) {
            ("200 OK", b, "application/octet-stream")
        } else {
            ("404 Not Found", b"not found".to_vec(), "text/plain")
        };
        let head = format!(
            "HTTP/1.1 {status}\r\nContent-Length: {}\r\nContent-Type: {ctype}\r\n\r\n",
            body.len()
        );
        if w.write_all(head.as_bytes()).is_err() || w.write_all(&body).is_err() {
            return;
        }
    }
}

fn setup() -> (WsRoot, String) {
    sbx::helper();
    let r = WsRoot::new_in(&std::env::temp_dir());
    let src = r.t.path("src");
    write_file(&src.join("requirements.txt"), "six\nidna\n");
    write_file(&src.join("probe.py"), PROBE);
    let snap = r.import(&src, &["--ref", "t/main"]);
    let ws = r.create(&snap, &["--name", "eg"]);
    (r, ws.id)
}

/// Probes run inside the sandbox: `python3 probe.py CHECK ARGS...` prints one line.
const PROBE: &str = r#"
import json, os, socket, ssl, struct, sys, urllib.request
check, args = sys.argv[1], sys.argv[2:]
def out(**kw): print(json.dumps(kw)); sys.exit(0)
T = 10
try:
    if check == "get":  # through HTTP_PROXY, as tools do
        try:
            with urllib.request.urlopen(args[0], timeout=T) as r:
                out(status=r.status, body=r.read().decode())
        except urllib.error.HTTPError as e:
            out(status=e.code, body=e.read().decode())
    if check == "raw":  # a tool that ignores the proxy variables
        host, port = args[0], int(args[1])
        s = socket.create_connection((host, port), timeout=T)
        s.sendall(b"GET /whoami HTTP/1.0\r\nHost: x\r\n\r\n")
        out(connected=True, got=s.recv(100).decode(errors="replace"))
    if check == "udp":
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.settimeout(T)
        s.sendto(b"x", (args[0], int(args[1])))
        out(sent=True)
    if check == "resolve":
        out(addrs=sorted({a[4][0] for a in socket.getaddrinfo(args[0], 80)}))
    if check == "proxy":  # a raw request to the HTTP proxy: CONNECT or a GET
        s = socket.create_connection(("127.0.0.1", 3128), timeout=T)
        s.sendall(args[0].encode().decode("unicode_escape").encode())
        data = b""
        while b"\r\n\r\n" not in data:
            b = s.recv(4096)
            if not b: break
            data += b
        head = data.split(b"\r\n")[0].decode(errors="replace")
        if len(args) > 1 and args[1] == "tls" and " 200" in head:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            try:
                t = ctx.wrap_socket(s, server_hostname=args[2])
                out(head=head, tls="handshake")
            except Exception as e:
                out(head=head, tls="closed", why=type(e).__name__)
        if len(args) > 1 and args[1] == "then" and " 200" in head:
            s.sendall(args[2].encode().decode("unicode_escape").encode())
            rest = b""
            try:
                while True:
                    b = s.recv(4096)
                    if not b: break
                    rest += b
            except Exception:
                pass
            out(head=head, then=rest.decode(errors="replace"))
        out(head=head, body=data.decode(errors="replace"))
    if check == "socks":  # SOCKS5, domain name or literal
        host, port = args[0], int(args[1])
        s = socket.create_connection(("127.0.0.1", 1080), timeout=T)
        s.sendall(b"\x05\x01\x00"); assert s.recv(2) == b"\x05\x00"
        try:
            ip = socket.inet_pton(socket.AF_INET6, host); req = b"\x04" + ip
        except OSError:
            try:
                ip = socket.inet_pton(socket.AF_INET, host); req = b"\x01" + ip
            except OSError:
                req = b"\x03" + bytes([len(host)]) + host.encode()
        s.sendall(b"\x05\x01\x00" + req + struct.pack(">H", port))
        rep = s.recv(262)
        code = rep[1] if len(rep) > 1 else -1
        if code == 0:
            s.sendall(("GET /whoami HTTP/1.1\r\nHost: %s:%d\r\n\r\n" % (host, port)).encode())
            got = b""
            # The answer may come in several segments: read until its body is there.
            while b"origin host" not in got:
                b = s.recv(4096)
                if not b: break
                got += b
            out(code=code, got=got.decode(errors="replace"))
        out(code=code)
except Exception as e:
    out(error=type(e).__name__, errno=getattr(e, "errno", None), text=str(e))
"#;

/// `exec WS -- python3 /workspace/probe.py CHECK ARGS...` under a timeout: its answer.
fn probe(r: &WsRoot, ws: &str, args: &[&str]) -> Value {
    probe_env(r, ws, &[], args)
}

fn probe_env(r: &WsRoot, ws: &str, env_unset: &[&str], args: &[&str]) -> Value {
    let mut cmd = vec!["exec", ws, "--", "timeout", "30", "env"];
    for e in env_unset {
        cmd.push("-u");
        cmd.push(e);
    }
    cmd.extend(["/usr/bin/python3", "/workspace/probe.py"]);
    cmd.extend_from_slice(args);
    let started = Instant::now();
    let out = r.t.run(&cmd).ok();
    assert!(started.elapsed() < WAIT, "probe {args:?} hung");
    serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("probe {args:?}: {e}: {}", out.stdout))
}

fn start(r: &WsRoot, ws: &str, extra: &[&str]) -> Value {
    let mut args = vec!["sandbox", "start", ws, "--net", "egress"];
    args.extend_from_slice(extra);
    let v = r.t.json(&args).ok().json();
    assert_eq!(v["state"], "running", "{v}");
    v
}

fn status(r: &WsRoot, ws: &str) -> Value {
    r.t.json(["sandbox", "status", ws]).ok().json()
}

fn log(r: &WsRoot, ws: &str) -> Vec<Value> {
    let out = r.t.json(["sandbox", "log", ws]).ok();
    out.stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn stop(r: &WsRoot, ws: &str) {
    let v = r.t.json(["sandbox", "stop", ws]).ok().json();
    assert_eq!(v["stopped"], true, "{v}");
}

#[test]
fn egress_allows_by_policy_and_every_bypass_fails_closed() {
    require_root!();
    let (r, ws) = setup();
    let www = r.t.path("www");
    write_file(&www.join("hello.txt"), "hello from the origin\n");
    let o = Origin::serve(&www);
    let p = o.port.to_string();
    let allowed = format!("origin.test:{p}");
    start(
        &r,
        &ws,
        &[
            "--add-host",
            "origin.test:127.0.0.1",
            "--add-host",
            "other.test:127.0.0.1",
            "--allow-host",
            &allowed,
            "--allow-host",
            "localhost",
            "--allow-host",
            "169.254.169.254",
        ],
    );
    let st = status(&r, &ws);
    assert_eq!(st["net"], "egress", "{st}");
    assert_eq!(st["egress"]["state"], "running", "{st}");
    assert_eq!(st["egress"]["allows_nothing"], false, "{st}");

    // Allowed, through the proxy variables.
    let url = format!("http://origin.test:{p}/hello.txt");
    let v = probe(&r, &ws, &["get", &url]);
    assert_eq!(v["status"], 200, "{v}");
    assert_eq!(v["body"], "hello from the origin\n", "{v}");

    // Denied: 403 naming the host and the flag.
    let v = probe(
        &r,
        &ws,
        &["get", &format!("http://other.test:{p}/hello.txt")],
    );
    assert_eq!(v["status"], 403, "{v}");
    let body = v["body"].as_str().unwrap();
    assert!(
        body.contains("other.test") && body.contains("--allow-host"),
        "{v}"
    );

    // An allowed name on a port the pattern does not name.
    let v = probe(
        &r,
        &ws,
        &[
            "proxy",
            "CONNECT origin.test:1 HTTP/1.1\\r\\nHost: origin.test:1\\r\\n\\r\\n",
        ],
    );
    assert!(v["head"].as_str().unwrap().contains("403"), "{v}");

    // A name allowed by pattern whose addresses are all private (no --add-host), asked
    // of the proxy directly (the proxy variables leave localhost out: NO_PROXY).
    let v = probe(
        &r,
        &ws,
        &[
            "proxy",
            &format!(
                "GET http://localhost:{p}/hello.txt HTTP/1.1\\r\\nHost: localhost:{p}\\r\\n\\r\\n"
            ),
        ],
    );
    assert!(v["head"].as_str().unwrap().contains("403"), "{v}");
    // Cloud metadata, even when allowed by name.
    let v = probe(
        &r,
        &ws,
        &["get", "http://169.254.169.254/latest/meta-data/"],
    );
    assert_eq!(v["status"], 403, "{v}");
    // IPv6 and IPv4 literals of the host.
    let v = probe(
        &r,
        &ws,
        &[
            "proxy",
            &format!("CONNECT [::1]:{p} HTTP/1.1\\r\\nHost: [::1]:{p}\\r\\n\\r\\n"),
        ],
    );
    assert!(v["head"].as_str().unwrap().contains("403"), "{v}");
    let v = probe(&r, &ws, &["socks", "127.0.0.1", &p]);
    assert_eq!(v["code"], 2, "{v}");
    let v = probe(&r, &ws, &["socks", "::1", &p]);
    assert_eq!(v["code"], 2, "{v}");

    // Host header against the request target: allowed target, denied Host, and the
    // reverse.
    let v = probe(
        &r,
        &ws,
        &[
            "proxy",
            &format!(
                "GET http://origin.test:{p}/whoami HTTP/1.1\\r\\nHost: other.test:{p}\\r\\n\\r\\n"
            ),
        ],
    );
    assert!(!v["head"].as_str().unwrap().contains("200"), "{v}");
    let v = probe(
        &r,
        &ws,
        &[
            "proxy",
            &format!(
                "GET http://other.test:{p}/whoami HTTP/1.1\\r\\nHost: origin.test:{p}\\r\\n\\r\\n"
            ),
        ],
    );
    assert!(!v["head"].as_str().unwrap().contains("200"), "{v}");
    // Inside an allowed tunnel: a request naming another host, and a TLS hello whose SNI
    // names another host.
    let v = probe(
        &r,
        &ws,
        &[
            "proxy",
            &format!("CONNECT origin.test:{p} HTTP/1.1\\r\\nHost: origin.test:{p}\\r\\n\\r\\n"),
            "then",
            &format!("GET /whoami HTTP/1.1\\r\\nHost: other.test:{p}\\r\\n\\r\\n"),
        ],
    );
    assert!(v["head"].as_str().unwrap().contains("200"), "{v}");
    assert!(!v["then"].as_str().unwrap().contains("origin host"), "{v}");
    let v = probe(
        &r,
        &ws,
        &[
            "proxy",
            &format!("CONNECT origin.test:{p} HTTP/1.1\\r\\nHost: origin.test:{p}\\r\\n\\r\\n"),
            "tls",
            "other.test",
        ],
    );
    assert_eq!(v["tls"], "closed", "{v}");
    // The allowed tunnel with a matching Host works.
    let v = probe(
        &r,
        &ws,
        &[
            "proxy",
            &format!("CONNECT origin.test:{p} HTTP/1.1\\r\\nHost: origin.test:{p}\\r\\n\\r\\n"),
            "then",
            &format!(
                "GET /whoami HTTP/1.1\\r\\nHost: origin.test:{p}\\r\\nConnection: close\\r\\n\\r\\n"
            ),
        ],
    );
    assert!(
        v["then"]
            .as_str()
            .unwrap()
            .contains("origin host=origin.test"),
        "{v}"
    );
    // SOCKS5 by name: allowed and denied.
    let v = probe(&r, &ws, &["socks", "origin.test", &p]);
    assert_eq!(v["code"], 0, "{v}");
    assert!(v["got"].as_str().unwrap().contains("origin host"), "{v}");
    let v = probe(&r, &ws, &["socks", "other.test", &p]);
    assert_eq!(v["code"], 2, "{v}");

    // DNS: the allowed name resolves (to its --add-host address), the denied one not.
    let v = probe(&r, &ws, &["resolve", "origin.test"]);
    assert_eq!(v["addrs"], serde_json::json!(["127.0.0.1"]), "{v}");
    let v = probe(&r, &ws, &["resolve", "other.test"]);
    assert!(v["error"].is_string(), "{v}");
    let v = probe(&r, &ws, &["resolve", "example.com"]);
    assert!(v["error"].is_string(), "{v}");

    // No route out: raw connects and UDP fail at once; the host's 127.0.0.1 services
    // are not the sandbox's (its loopback is its own).
    for (host, port) in [
        ("127.0.0.1", p.as_str()),
        ("169.254.169.254", "80"),
        ("203.0.113.9", "443"),
        ("::1", p.as_str()),
    ] {
        let v = probe(&r, &ws, &["raw", host, port]);
        assert!(
            v["error"].is_string() && v["connected"].is_null(),
            "{host}: {v}"
        );
    }
    // The allowed name, by a tool that ignores the proxy: refused, not a way out.
    let v = probe_env(
        &r,
        &ws,
        &["HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"],
        &["get", &url],
    );
    assert!(v["error"].is_string(), "{v}");
    let v = probe(&r, &ws, &["raw", "origin.test", &p]);
    assert!(v["connected"].is_null(), "{v}");
    let v = probe(&r, &ws, &["udp", "203.0.113.9", "53"]);
    assert!(v["error"].is_string(), "{v}");

    // Every decision is logged with its rule; status counts them per host.
    let decisions = log(&r, &ws);
    assert!(
        decisions
            .iter()
            .any(|d| d["host"] == "origin.test" && d["verdict"] == "allowed"),
        "{decisions:?}"
    );
    assert!(
        decisions.iter().any(|d| d["host"] == "other.test"
            && d["verdict"] == "denied"
            && d["rule"] == "default deny"),
        "{decisions:?}"
    );
    assert!(
        decisions
            .iter()
            .any(|d| d["host"] == "localhost" && d["rule"] == "private address"),
        "{decisions:?}"
    );
    assert!(
        decisions
            .iter()
            .any(|d| d["via"] == "dns" && d["verdict"] == "denied"),
        "{decisions:?}"
    );
    let st = status(&r, &ws);
    let hosts = &st["egress"]["stats"]["hosts"];
    assert!(
        hosts["origin.test"]["allowed"].as_u64().unwrap() >= 3,
        "{st}"
    );
    assert!(
        hosts["origin.test"]["bytes_down"].as_u64().unwrap() > 0,
        "{st}"
    );
    assert!(hosts["other.test"]["denied"].as_u64().unwrap() >= 1, "{st}");
    stop(&r, &ws);
    r.discard(&ws);
    r.assert_clean();
}

#[test]
fn egress_policy_changes_live_and_the_log_shows_each_verdict() {
    require_root!();
    let (r, ws) = setup();
    let www = r.t.path("www");
    write_file(&www.join("f"), "f\n");
    let o = Origin::serve(&www);
    let p = o.port.to_string();
    start(&r, &ws, &["--add-host", "origin.test:127.0.0.1"]);
    let st = status(&r, &ws);
    assert_eq!(st["egress"]["allows_nothing"], true, "{st}");
    let url = format!("http://origin.test:{p}/f");
    let mut verdicts = Vec::new();
    for (change, want) in [
        (vec!["--allow-host", "origin.test"], 200),
        (vec!["--deny-host", "origin.test"], 403),
        (
            vec!["--remove-host", "origin.test", "--allow-host", "*.test"],
            200,
        ),
        (vec!["--reset"], 403),
    ] {
        let mut args = vec!["sandbox", "policy", &ws];
        args.extend(change.iter().copied());
        let v = r.t.json(&args).ok().json();
        assert!(v["policy"].is_object(), "{v}");
        let got = probe(&r, &ws, &["get", &url]);
        assert_eq!(got["status"], want, "after {change:?}: {got}");
        verdicts.push(if want == 200 { "allowed" } else { "denied" });
    }
    let decisions: Vec<String> = log(&r, &ws)
        .iter()
        .filter(|d| d["host"] == "origin.test" && d["via"] == "http")
        .map(|d| d["verdict"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(decisions, verdicts, "the log shows each verdict in order");
    // Bad changes are refused naming the flag; the policy stays.
    let e =
        r.t.run(["sandbox", "policy", &ws, "--allow-host", "http://x.test"])
            .code(9);
    assert!(e.stderr.contains("--allow-host"), "{}", e.stderr);
    r.t.run(["sandbox", "policy", &ws]).code(9);
    stop(&r, &ws);
    r.discard(&ws);
    r.assert_clean();
}

#[test]
fn egress_pip_install_and_git_clone_through_the_policy() {
    require_root!();
    let wheels = PathBuf::from(std::env::var(WHEELHOUSE_ENV).unwrap_or(WHEELHOUSE_DEFAULT.into()));
    let have = std::fs::read_dir(&wheels)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .any(|e| e.path().extension().is_some_and(|x| x == "whl"))
        })
        .unwrap_or(false);
    if !have {
        let why = format!(
            "no wheels in {} (scripts/setup.sh downloads them)",
            wheels.display()
        );
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
        eprintln!("SKIPPED: {why}");
        return;
    }
    let (r, ws) = setup();
    // A package index: /simple/NAME/ listing each wheel (PEP 503 by directory listing).
    let idx = r.t.path("index");
    for e in std::fs::read_dir(&wheels).unwrap() {
        let f = e.unwrap().path();
        let name = f.file_name().unwrap().to_string_lossy().to_string();
        if !name.ends_with(".whl") {
            continue;
        }
        let project = name
            .split('-')
            .next()
            .unwrap()
            .to_lowercase()
            .replace('_', "-");
        std::fs::create_dir_all(idx.join("simple").join(&project)).unwrap();
        std::fs::copy(&f, idx.join("simple").join(&project).join(&name)).unwrap();
    }
    // A git repository over dumb HTTP.
    let repo = r.t.path("gitsrc");
    write_file(&repo.join("README"), "served over http\n");
    let git = |dir: &Path, args: &[&str]| {
        let st = std::process::Command::new("git")
            .current_dir(dir)
            .args(args)
            .status()
            .unwrap();
        assert!(st.success(), "git {args:?}");
    };
    git(&repo, &["init", "-q"]);
    git(
        &repo,
        &["-c", "user.name=t", "-c", "user.email=t@t", "add", "."],
    );
    git(
        &repo,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-qm",
            "one",
        ],
    );
    git(
        &idx,
        &["clone", "-q", "--bare", repo.to_str().unwrap(), "repo.git"],
    );
    git(&idx.join("repo.git"), &["update-server-info"]);
    let o = Origin::serve(&idx);
    let p = o.port.to_string();
    start(
        &r,
        &ws,
        &[
            "--add-host",
            "pypi.test:127.0.0.1",
            "--add-host",
            "git.test:127.0.0.1",
            "--allow-host",
            "pypi.test",
        ],
    );
    let index = format!("http://pypi.test:{p}/simple/");
    let pip = |r: &WsRoot, target: &str, what: &[&str]| {
        let mut args = vec![
            "exec",
            &ws,
            "--",
            "timeout",
            "120",
            "/usr/bin/python3",
            "-m",
            "pip",
            "install",
            "--no-cache-dir",
            "--disable-pip-version-check",
            "--retries",
            "0",
            "--timeout",
            "10",
            "--target",
            target,
            "--trusted-host",
            "pypi.test",
            "--index-url",
            &index,
        ];
        args.extend_from_slice(what);
        r.t.run(&args)
    };
    let out = pip(&r, "/tmp/site", &["-r", "/workspace/requirements.txt"]);
    assert_eq!(
        out.code, 0,
        "pip install through the policy: {}\n{}",
        out.stdout, out.stderr
    );
    let v =
        r.t.run([
            "exec",
            &ws,
            "--",
            "env",
            "PYTHONPATH=/tmp/site",
            "/usr/bin/python3",
            "-c",
            "import six, idna; print('ok')",
        ])
        .ok();
    assert_eq!(v.stdout.trim(), "ok");
    // git: denied, then allowed live.
    let clone = |r: &WsRoot, dest: &str| {
        r.t.run([
            "exec",
            &ws,
            "--",
            "timeout",
            "60",
            "git",
            "clone",
            "-q",
            &format!("http://git.test:{p}/repo.git"),
            dest,
        ])
    };
    let out = clone(&r, "/tmp/denied");
    assert_ne!(
        out.code, 0,
        "a git clone of a host not allowed: {}",
        out.stderr
    );
    assert!(out.stderr.contains("403"), "{}", out.stderr);
    r.t.json([
        "sandbox",
        "policy",
        &ws,
        "--allow-host",
        "git.test",
        "--remove-host",
        "pypi.test",
    ])
    .ok();
    let out = clone(&r, "/tmp/allowed");
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v =
        r.t.run(["exec", &ws, "--", "cat", "/tmp/allowed/README"])
            .ok();
    assert_eq!(v.stdout, "served over http\n");
    // pip with its index no longer allowed: it finds nothing (pip reads the index's 403
    // as "no versions"), and the log says why.
    let out = pip(&r, "/tmp/site2", &["six"]);
    assert_ne!(out.code, 0, "{}", out.stdout);
    let decisions = log(&r, &ws);
    let last_pypi = decisions
        .iter()
        .rev()
        .find(|d| d["host"] == "pypi.test")
        .unwrap();
    assert_eq!(last_pypi["verdict"], "denied", "{decisions:?}");
    assert!(
        decisions
            .iter()
            .any(|d| d["host"] == "pypi.test" && d["verdict"] == "allowed"),
        "{decisions:?}"
    );
    assert!(
        decisions
            .iter()
            .any(|d| d["host"] == "git.test" && d["verdict"] == "allowed"),
        "{decisions:?}"
    );
    stop(&r, &ws);
    r.discard(&ws);
    r.assert_clean();
}

#[test]
fn egress_proxy_killed_fails_closed_and_stop_leaves_nothing() {
    require_root!();
    let (r, ws) = setup();
    let www = r.t.path("www");
    write_file(&www.join("f"), "f\n");
    let o = Origin::serve(&www);
    let p = o.port.to_string();
    start(
        &r,
        &ws,
        &[
            "--add-host",
            "origin.test:127.0.0.1",
            "--allow-host",
            "origin.test",
        ],
    );
    let url = format!("http://origin.test:{p}/f");
    assert_eq!(probe(&r, &ws, &["get", &url])["status"], 200);
    let st = status(&r, &ws);
    let pid = st["egress"]["proxy_pid"].as_u64().expect("proxy_pid") as u32;
    // The proxy is not root and holds no capability.
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |k: &str| s.lines().find(|l| l.starts_with(k)).unwrap().to_string();
    assert!(
        field("Uid:")
            .split_whitespace()
            .skip(1)
            .all(|u| u == "65534"),
        "{s}"
    );
    assert!(field("CapEff:").ends_with("0000000000000000"), "{s}");
    assert!(field("CapPrm:").ends_with("0000000000000000"), "{s}");
    assert!(field("NoNewPrivs:").ends_with('1'), "{s}");
    crate::workspaces::support::kill9(pid);
    let deadline = Instant::now() + WAIT;
    while alive(pid) {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(20));
    }
    let v = probe(&r, &ws, &["get", &url]);
    assert!(v["error"].is_string(), "after the proxy's death: {v}");
    let st = status(&r, &ws);
    assert_eq!(st["egress"]["state"], "lost", "{st}");
    assert!(
        st["egress"]["reason"]
            .as_str()
            .unwrap()
            .contains("signal 9"),
        "{st}"
    );
    let e =
        r.t.run(["sandbox", "policy", &ws, "--allow-host", "x.test"]);
    assert_ne!(e.code, 0);
    stop(&r, &ws);
    let log = r.root().join("run/sandbox/keep/eg.egress.log");
    assert!(!log.exists(), "the decision log outlived the sandbox");
    r.discard(&ws);
    r.assert_clean();
}

#[test]
fn egress_bad_input_is_refused_naming_the_flag_and_nothing_starts() {
    require_root!();
    let (r, ws) = setup();
    for (args, says) in [
        (vec!["--net", "egress", "--allow-host", ""], "--allow-host"),
        (
            vec!["--net", "egress", "--allow-host", "*."],
            "--allow-host",
        ),
        (
            vec!["--net", "egress", "--allow-host", "https://pypi.org"],
            "--allow-host",
        ),
        (
            vec!["--net", "egress", "--deny-host", "pypi.org/simple"],
            "--deny-host",
        ),
        (
            vec!["--net", "egress", "--add-host", "mirror.test"],
            "--add-host",
        ),
        (
            vec!["--net", "egress", "--add-host", "mirror.test:300.1.1.1"],
            "--add-host",
        ),
        (
            vec!["--net", "none", "--allow-host", "pypi.org"],
            "--net egress",
        ),
        (vec!["--allow-host", "pypi.org"], "--net egress"),
        (
            vec!["--net", "loopback", "--add-host", "a.test:10.0.0.1"],
            "--net egress",
        ),
    ] {
        let mut all = vec!["sandbox", "start", ws.as_str()];
        all.extend(args.iter().copied());
        let out = r.t.run(&all).code(9);
        assert!(out.stderr.contains(says), "{args:?}: {}", out.stderr);
        r.t.run(["sandbox", "status", &ws]).code(3);
    }
    // The socket refuses an unknown argument instead of ignoring it.
    let v = r.t.json(["list"]).ok().json();
    assert!(v.is_array());
    r.discard(&ws);
    r.assert_clean();
}

#[test]
fn egress_sixteen_sandboxes_each_see_only_their_own_policy() {
    require_root!();
    sbx::helper();
    let r = WsRoot::new_in(&std::env::temp_dir());
    let src = r.t.path("src");
    write_file(&src.join("probe.py"), PROBE);
    let snap = r.import(&src, &["--ref", "t/main"]);
    let www = r.t.path("www");
    write_file(&www.join("f"), "f\n");
    let o = Origin::serve(&www);
    let p = o.port.to_string();
    const N: usize = 16;
    let mut names = Vec::new();
    for i in 0..N {
        let name = format!("eg{i}");
        r.create(&snap, &["--name", &name]);
        let mut args = vec![
            "sandbox".to_string(),
            "start".into(),
            name.clone(),
            "--net".into(),
            "egress".into(),
        ];
        for j in 0..N {
            args.push("--add-host".into());
            args.push(format!("h{j}.test:127.0.0.1"));
        }
        args.push("--allow-host".into());
        args.push(format!("h{i}.test"));
        let v = r.t.json(&args).ok().json();
        assert_eq!(v["state"], "running", "{v}");
        names.push(name);
    }
    std::thread::scope(|s| {
        for (i, name) in names.iter().enumerate() {
            let r = &r;
            let p = &p;
            s.spawn(move || {
                let own = probe(r, name, &["get", &format!("http://h{i}.test:{p}/f")]);
                assert_eq!(own["status"], 200, "{name}: {own}");
                let other = probe(
                    r,
                    name,
                    &["get", &format!("http://h{}.test:{p}/f", (i + 1) % N)],
                );
                assert_eq!(other["status"], 403, "{name}: {other}");
            });
        }
    });
    for name in &names {
        stop(&r, name);
        r.discard(name);
    }
    r.assert_clean();
}

#[test]
fn ports_are_published_and_unpublished_while_the_sandbox_runs() {
    require_root!();
    let (r, ws) = setup();
    start(&r, &ws, &[]);
    r.t.run(["exec", &ws, "--", "sh", "-c", "mkdir -p /tmp/s && echo served > /tmp/s/i.txt && cd /tmp/s && nohup /usr/bin/python3 -m http.server 8000 --bind 127.0.0.1 >/dev/null 2>&1 &"]).ok();
    let v = r.t.json(["sandbox", "publish", &ws, "8000"]).ok().json();
    let host = v["host_port"].as_u64().expect("host_port") as u16;
    assert_eq!(status(&r, &ws)["ports"]["8000"], host, "status lists it");
    // Published twice: refused as exists.
    r.t.run(["sandbox", "publish", &ws, "8000"]).code(4);
    let deadline = Instant::now() + WAIT;
    let body = loop {
        if let Ok(mut c) = TcpStream::connect(("127.0.0.1", host)) {
            let _ = c.write_all(b"GET /i.txt HTTP/1.0\r\n\r\n");
            let _ = c.shutdown(Shutdown::Write);
            let mut s = String::new();
            let _ = c.read_to_string(&mut s);
            if s.contains("served") {
                break s;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the published port never answered"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(body.contains("200"), "{body}");
    r.t.json(["sandbox", "unpublish", &ws, "8000"]).ok();
    assert!(
        TcpStream::connect(("127.0.0.1", host)).is_err(),
        "the host port still answers"
    );
    r.t.run(["sandbox", "unpublish", &ws, "8000"]).code(3);
    assert!(status(&r, &ws)["ports"].as_object().unwrap().is_empty());
    stop(&r, &ws);
    r.discard(&ws);
    r.assert_clean();
}
