//! Test servers and clients: a proxy on port 0, an HTTP origin, an echo server, a
//! server-speaks-first server, and small HTTP/CONNECT/SOCKS client helpers.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cowspace_egress::{DecisionRecord, Egress, Listeners, Policy, Resolve, SystemResolver};

/// Generous bound on any single read in a test, so a bug fails instead of hanging.
pub const TEST_IO_TIMEOUT: Duration = Duration::from_secs(20);

/// A proxy under test.
pub struct Proxy {
    pub egress: Egress,
    pub http: SocketAddr,
    pub socks: SocketAddr,
    pub dns: SocketAddr,
    pub log_path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Proxy {
    pub fn start(policy: Policy) -> Proxy {
        Proxy::start_with(policy, Arc::new(SystemResolver))
    }

    pub fn start_with(policy: Policy, resolver: Arc<dyn Resolve + Send + Sync>) -> Proxy {
        let dir = tempfile::tempdir().unwrap();
        let log_path = dir.path().join("decisions.jsonl");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .unwrap();
        let listeners = Listeners {
            http: TcpListener::bind("127.0.0.1:0").unwrap(),
            socks: TcpListener::bind("127.0.0.1:0").unwrap(),
            dns: UdpSocket::bind("127.0.0.1:0").unwrap(),
        };
        let http = listeners.http.local_addr().unwrap();
        let socks = listeners.socks.local_addr().unwrap();
        let dns = listeners.dns.local_addr().unwrap();
        let egress = Egress::start(listeners, policy, log, resolver).unwrap();
        Proxy {
            egress,
            http,
            socks,
            dns,
            log_path,
            _dir: dir,
        }
    }

    /// Every decision record so far.
    pub fn records(&self) -> Vec<DecisionRecord> {
        let text = std::fs::read_to_string(&self.log_path).unwrap();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// Whether a record with this host, verdict and rule exists.
    pub fn logged(&self, host: &str, verdict: &str, rule: &str) -> bool {
        self.records().iter().any(|r| {
            r.host == host && serde_json::to_value(r.verdict).unwrap() == verdict && r.rule == rule
        })
    }

    pub fn client(&self) -> TcpStream {
        connect(self.http)
    }
}

pub fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(TEST_IO_TIMEOUT)).unwrap();
    s
}

/// A policy allowing `allow`, denying `deny`, with `origin.test`, `echo.test`,
/// `banner.test` and `dead.test` added as 127.0.0.1.
pub fn policy(allow: &[&str], deny: &[&str]) -> Policy {
    Policy {
        allow: allow.iter().map(|s| s.parse().unwrap()).collect(),
        deny: deny.iter().map(|s| s.parse().unwrap()).collect(),
        add_hosts: ["origin.test", "echo.test", "banner.test", "dead.test"]
            .iter()
            .map(|n| format!("{n}:127.0.0.1").parse().unwrap())
            .collect(),
    }
}

/// A TCP server on 127.0.0.1 running `handler` per connection until dropped.
pub struct Server {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl Server {
    pub fn start(
        handler: fn(TcpStream, &Arc<Mutex<Vec<String>>>),
        seen: Arc<Mutex<Vec<String>>>,
    ) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stop2.load(Ordering::Acquire) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let seen = seen.clone();
                let _ = std::thread::Builder::new()
                    .stack_size(64 * 1024)
                    .spawn(move || handler(stream, &seen));
            }
        });
        Server { addr, stop }
    }

    pub fn echo() -> Server {
        Server::start(echo, Arc::default())
    }

    pub fn banner() -> Server {
        Server::start(
            |mut s, _| {
                let _ = s.write_all(b"SSH-2.0-test\r\n");
                echo(s, &Arc::default());
            },
            Arc::default(),
        )
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = TcpStream::connect(self.addr); // wake the accept loop
    }
}

fn echo(mut s: TcpStream, _: &Arc<Mutex<Vec<String>>>) {
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if s.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
        }
    }
}

/// An HTTP origin answering `METHOD PATH host=HOST body=BODY`; `/chunked` answers in
/// chunks, `/close` with a close-delimited body. Request heads go to `seen`.
pub struct Origin {
    pub server: Server,
    pub seen: Arc<Mutex<Vec<String>>>,
}

impl Origin {
    pub fn start() -> Origin {
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        Origin {
            server: Server::start(origin_conn, seen.clone()),
            seen,
        }
    }
    pub fn port(&self) -> u16 {
        self.server.port()
    }
}

fn origin_conn(stream: TcpStream, seen: &Arc<Mutex<Vec<String>>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut w = stream;
    while let Some(head) = read_head(&mut reader) {
        seen.lock()
            .unwrap()
            .push(String::from_utf8_lossy(&head).into_owned());
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        req.parse(&head).unwrap();
        let method = req.method.unwrap().to_string();
        let path = req.path.unwrap().to_string();
        let get = |n: &str| {
            req.headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case(n))
                .map(|h| String::from_utf8_lossy(h.value).into_owned())
        };
        let host = get("host").unwrap_or_default();
        let body = if get("transfer-encoding").is_some() {
            read_chunked(&mut reader)
        } else {
            let n: usize = get("content-length")
                .map(|v| v.parse().unwrap())
                .unwrap_or(0);
            let mut b = vec![0; n];
            reader.read_exact(&mut b).unwrap();
            b
        };
        let text = format!(
            "{method} {path} host={host} body={}",
            String::from_utf8_lossy(&body)
        );
        let out = match path.as_str() {
            "/chunked" => {
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n".to_string()
            }
            "/close" => {
                let _ = w.write_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nclosing");
                return;
            }
            _ if method == "HEAD" => format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", text.len()),
            _ => format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{text}", text.len()),
        };
        if w.write_all(out.as_bytes()).is_err() {
            return;
        }
    }
}

pub fn read_head<R: BufRead>(r: &mut R) -> Option<Vec<u8>> {
    let mut head = Vec::new();
    loop {
        let mut line = Vec::new();
        if r.read_until(b'\n', &mut line).ok()? == 0 {
            return None;
        }
        head.extend_from_slice(&line);
        if line == b"\r\n" {
            return Some(head);
        }
    }
}

pub fn read_chunked<R: BufRead>(r: &mut R) -> Vec<u8> {
    let mut body = Vec::new();
    loop {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        let size = usize::from_str_radix(line.trim().split(';').next().unwrap(), 16).unwrap();
        if size == 0 {
            let mut end = String::new();
            r.read_line(&mut end).unwrap();
            return body;
        }
        let mut chunk = vec![0; size + 2];
        r.read_exact(&mut chunk).unwrap();
        body.extend_from_slice(&chunk[..size]);
    }
}

/// A response read by a client: status, lowercase headers, body.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Reads one response; `head_request` means no body follows.
pub fn read_response<R: BufRead>(r: &mut R, head_request: bool) -> Response {
    let head = read_head(r).expect("a response head");
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    resp.parse(&head).unwrap();
    let status = resp.code.unwrap();
    let headers: Vec<(String, String)> = resp
        .headers
        .iter()
        .map(|h| {
            (
                h.name.to_ascii_lowercase(),
                String::from_utf8_lossy(h.value).into_owned(),
            )
        })
        .collect();
    let get = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    let body = if head_request || status == 204 || status == 304 {
        Vec::new()
    } else if get("transfer-encoding").is_some() {
        read_chunked(r)
    } else if let Some(n) = get("content-length") {
        let mut b = vec![0; n.parse().unwrap()];
        r.read_exact(&mut b).unwrap();
        b
    } else {
        let mut b = Vec::new();
        r.read_to_end(&mut b).unwrap();
        b
    };
    Response {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// Sends `raw` on a new proxy connection and reads one response.
pub fn request(proxy: &Proxy, raw: &str) -> Response {
    let mut s = proxy.client();
    s.write_all(raw.as_bytes()).unwrap();
    read_response(&mut BufReader::new(s), raw.starts_with("HEAD "))
}

/// Opens a CONNECT tunnel; returns the status and, on 200, the stream.
pub fn tunnel(proxy: &Proxy, authority: &str) -> (u16, BufReader<TcpStream>) {
    let mut s = proxy.client();
    write!(
        s,
        "CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n"
    )
    .unwrap();
    let mut r = BufReader::new(s);
    let head = read_head(&mut r).expect("a CONNECT response");
    let status = String::from_utf8_lossy(&head[9..12]).parse().unwrap();
    (status, r)
}

/// Whether the peer closed `r` without sending anything more.
pub fn closed(r: &mut BufReader<TcpStream>) -> bool {
    let mut buf = [0u8; 64];
    matches!(r.read(&mut buf), Ok(0) | Err(_))
}

/// Writes `data` into a tunnel and reads the same number of bytes back.
pub fn echo_through(r: &mut BufReader<TcpStream>, data: &[u8]) -> Vec<u8> {
    r.get_mut().write_all(data).unwrap();
    let mut back = vec![0; data.len()];
    r.read_exact(&mut back).unwrap();
    back
}

/// Polls `f` until it holds, for up to [`TEST_IO_TIMEOUT`]: the proxy's thread may count
/// its last bytes just after the client has read them.
pub fn eventually(what: &str, f: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + TEST_IO_TIMEOUT;
    while !f() {
        assert!(std::time::Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A SOCKS5 handshake and CONNECT; returns the reply code and the stream.
pub fn socks_connect(proxy: &Proxy, atyp: u8, addr: &[u8], port: u16) -> (u8, TcpStream) {
    socks_command(proxy, 1, atyp, addr, port)
}

pub fn socks_command(proxy: &Proxy, cmd: u8, atyp: u8, addr: &[u8], port: u16) -> (u8, TcpStream) {
    let mut s = connect(proxy.socks);
    s.write_all(&[5, 1, 0]).unwrap();
    let mut method = [0u8; 2];
    s.read_exact(&mut method).unwrap();
    assert_eq!(method, [5, 0]);
    let mut req = vec![5, cmd, 0, atyp];
    if atyp == 3 {
        req.push(addr.len() as u8);
    }
    req.extend_from_slice(addr);
    req.extend_from_slice(&port.to_be_bytes());
    s.write_all(&req).unwrap();
    let mut reply = [0u8; 10];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(reply[0], 5);
    (reply[1], s)
}
