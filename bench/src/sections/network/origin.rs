//! The origin the network section downloads from: an HTTP/1.1 server on the host's
//! 127.0.0.1, threads of the bench process, every answer from memory (no disk, no
//! parsing beyond the request line and `Connection`), so what differs between the two
//! sides of a measurement is only the path to it.
//!
//! Routes: `/bulk` ([`Routes::bulk_bytes`] bytes, written from one repeated block),
//! `/small` ([`SMALL_BODY`]), and a PEP 503 package index under `/simple/` built from a
//! directory of wheels. Connections are kept alive unless the client asks to close (as
//! urllib does) or speaks HTTP/1.0 without `keep-alive`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};

/// The body of `/small`: a short answer, one TCP segment with its head.
pub const SMALL_BODY: &[u8] = b"cowspace bench origin: a short answer of 64 bytes, padded......\n";
/// Block `/bulk` is written from (the last write is cut to the length).
const BULK_BLOCK_BYTES: usize = 1 << 20;
/// Most connections open at once; past it a new one is closed at once.
pub const MAX_ORIGIN_CONNECTIONS: usize = 8192;
/// Stack of each connection thread (they hold a buffered reader and nothing else).
const ORIGIN_STACK_BYTES: usize = 64 * 1024;
/// A connection idle this long is closed (longer than any hold of the section).
const ORIGIN_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// Longest request head line read; longer ones close the connection.
const MAX_LINE_BYTES: usize = 8 * 1024;
/// Most header lines of one request.
const MAX_HEADER_LINES: usize = 128;

/// What the origin serves.
#[derive(Debug, Default)]
pub struct Routes {
    /// Length of `/bulk`.
    pub bulk_bytes: u64,
    /// Exact paths → (content type, body): `/small` and the package index.
    pub files: BTreeMap<String, (&'static str, Arc<[u8]>)>,
}

impl Routes {
    pub fn new(bulk_bytes: u64) -> Self {
        let mut files = BTreeMap::new();
        files.insert(
            "/small".to_string(),
            ("text/plain", Arc::<[u8]>::from(SMALL_BODY)),
        );
        Self { bulk_bytes, files }
    }

    /// Adds a PEP 503 index of the `*.whl` files in `dir` (`/simple/`, `/simple/NAME/`,
    /// `/simple/NAME/FILE`). Returns the project names, empty when there are no wheels.
    pub fn add_wheelhouse(&mut self, dir: &Path) -> Result<Vec<String>> {
        let mut projects: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let rd = std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
        for e in rd {
            let p = e?.path();
            let Some(name) = p.file_name().and_then(|n| n.to_str()).map(str::to_string) else {
                continue;
            };
            if !name.ends_with(".whl") {
                continue;
            }
            let project = project_of(&name);
            let body = std::fs::read(&p).with_context(|| format!("reading {}", p.display()))?;
            self.files.insert(
                format!("/simple/{project}/{name}"),
                ("application/octet-stream", Arc::from(body)),
            );
            projects.entry(project).or_default().push(name);
        }
        for (project, wheels) in &projects {
            self.files.insert(
                format!("/simple/{project}/"),
                ("text/html", Arc::from(listing(wheels).into_bytes())),
            );
        }
        let names: Vec<String> = projects.keys().cloned().collect();
        let dirs: Vec<String> = names.iter().map(|n| format!("{n}/")).collect();
        if !names.is_empty() {
            self.files.insert(
                "/simple/".to_string(),
                ("text/html", Arc::from(listing(&dirs).into_bytes())),
            );
        }
        Ok(names)
    }
}

/// A wheel's project as PEP 503 normalizes it (`Foo_Bar-1.0-…whl` → `foo-bar`).
pub fn project_of(wheel: &str) -> String {
    let dist = wheel.split('-').next().unwrap_or(wheel);
    let mut out = String::new();
    for c in dist.chars() {
        let c = c.to_ascii_lowercase();
        if matches!(c, '_' | '.' | '-') {
            if !out.ends_with('-') {
                out.push('-');
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn listing(names: &[String]) -> String {
    let links: String = names
        .iter()
        .map(|n| format!("<a href=\"{n}\">{n}</a><br>\n"))
        .collect();
    format!("<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n")
}

/// One request's head, as far as the origin reads it.
#[derive(Debug, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    /// The path, without a query and without `http://host` (absolute form).
    pub path: String,
    /// Keep the connection open after the answer.
    pub keep_alive: bool,
}

/// Parses a request line and its header lines (without line ends).
pub fn parse_request(line: &str, headers: &[String]) -> Option<Request> {
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_string();
    let target = parts.next()?;
    let version = parts.next()?;
    if parts.next().is_some() || !version.starts_with("HTTP/1.") {
        return None;
    }
    let target = match target.strip_prefix("http://") {
        Some(rest) => rest.find('/').map_or("/", |i| &rest[i..]),
        None => target,
    };
    let path = target.split('?').next().unwrap_or("/").to_string();
    let tokens: Vec<String> = headers
        .iter()
        .filter_map(|h| {
            let (k, v) = h.split_once(':')?;
            k.trim().eq_ignore_ascii_case("connection").then_some(v)
        })
        .flat_map(|v| v.split(',').map(|t| t.trim().to_ascii_lowercase()))
        .collect();
    let keep_alive = if version == "HTTP/1.0" {
        tokens.iter().any(|t| t == "keep-alive")
    } else {
        !tokens.iter().any(|t| t == "close")
    };
    Some(Request {
        method,
        path,
        keep_alive,
    })
}

/// The running server. Stops accepting on drop; open connections end with their
/// clients (or at [`ORIGIN_IDLE_TIMEOUT`]).
pub struct Origin {
    pub port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Origin {
    pub fn serve(routes: Routes) -> Result<Origin> {
        let l = TcpListener::bind("127.0.0.1:0").context("binding the origin on 127.0.0.1")?;
        let port = l.local_addr()?.port();
        let stop = Arc::new(AtomicBool::new(false));
        let routes = Arc::new(routes);
        let block: Arc<[u8]> = (0..BULK_BLOCK_BYTES)
            .map(|i| (i % 251) as u8)
            .collect::<Vec<u8>>()
            .into();
        let open = Arc::new(AtomicUsize::new(0));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("bench-origin".into())
            .spawn(move || {
                for c in l.incoming() {
                    if s.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(c) = c else {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    };
                    if open.load(Ordering::SeqCst) >= MAX_ORIGIN_CONNECTIONS {
                        continue;
                    }
                    open.fetch_add(1, Ordering::SeqCst);
                    let (routes, block, open2) = (routes.clone(), block.clone(), open.clone());
                    let spawned = std::thread::Builder::new()
                        .stack_size(ORIGIN_STACK_BYTES)
                        .spawn(move || {
                            let _ = serve_conn(c, &routes, &block);
                            open2.fetch_sub(1, Ordering::SeqCst);
                        });
                    if spawned.is_err() {
                        open.fetch_sub(1, Ordering::SeqCst);
                    }
                }
            })
            .context("starting the origin's accept thread")?;
        Ok(Origin {
            port,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the blocking accept.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Reads one line of at most [`MAX_LINE_BYTES`], without its line end; `None` at EOF.
fn read_line(r: &mut impl BufRead) -> std::io::Result<Option<String>> {
    let mut buf = Vec::new();
    let n = r
        .by_ref()
        .take(MAX_LINE_BYTES as u64 + 1)
        .read_until(b'\n', &mut buf)?;
    if n == 0 {
        return Ok(None);
    }
    if !buf.ends_with(b"\n") {
        return Err(std::io::Error::other("request line too long or cut"));
    }
    while buf.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        buf.pop();
    }
    Ok(Some(String::from_utf8_lossy(&buf).into_owned()))
}

fn serve_conn(c: TcpStream, routes: &Routes, block: &[u8]) -> std::io::Result<()> {
    c.set_read_timeout(Some(ORIGIN_IDLE_TIMEOUT))?;
    c.set_nodelay(true)?;
    let mut r = BufReader::new(c.try_clone()?);
    let mut w = c;
    loop {
        let Some(line) = read_line(&mut r)? else {
            return Ok(());
        };
        let mut headers = Vec::new();
        loop {
            let Some(h) = read_line(&mut r)? else {
                return Ok(());
            };
            if h.is_empty() {
                break;
            }
            if headers.len() == MAX_HEADER_LINES {
                return Err(std::io::Error::other("too many header lines"));
            }
            headers.push(h);
        }
        let Some(req) = parse_request(&line, &headers) else {
            let _ = w.write_all(
                b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            );
            return Ok(());
        };
        let head_only = req.method == "HEAD";
        let conn = if req.keep_alive {
            ""
        } else {
            "Connection: close\r\n"
        };
        if req.method != "GET" && !head_only {
            w.write_all(
                format!("HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n{conn}\r\n")
                    .as_bytes(),
            )?;
        } else if req.path == "/bulk" {
            w.write_all(
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\n{conn}\r\n",
                    routes.bulk_bytes
                )
                .as_bytes(),
            )?;
            let mut left = if head_only { 0 } else { routes.bulk_bytes };
            while left > 0 {
                let n = left.min(block.len() as u64) as usize;
                w.write_all(&block[..n])?;
                left -= n as u64;
            }
        } else {
            let (status, ctype, body): (&str, &str, &[u8]) = match routes.files.get(&req.path) {
                Some((t, b)) => ("200 OK", t, b),
                None => ("404 Not Found", "text/plain", b"not found\n"),
            };
            // Head and body in one write: one segment for a short answer.
            let mut out = format!(
                "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n{conn}\r\n",
                body.len()
            )
            .into_bytes();
            if !head_only {
                out.extend_from_slice(body);
            }
            w.write_all(&out)?;
        }
        if !req.keep_alive {
            let _ = w.shutdown(Shutdown::Write);
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_with_their_connection_semantics() {
        let h = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let r = parse_request("GET /small?x=1 HTTP/1.1", &h(&["Host: a"])).unwrap();
        assert_eq!(r.path, "/small");
        assert!(r.keep_alive);
        let r = parse_request("GET /small HTTP/1.1", &h(&["connection: Close"])).unwrap();
        assert!(!r.keep_alive);
        let r = parse_request("GET / HTTP/1.0", &h(&[])).unwrap();
        assert!(!r.keep_alive);
        let r = parse_request("GET / HTTP/1.0", &h(&["Connection: keep-alive"])).unwrap();
        assert!(r.keep_alive);
        let r = parse_request("GET http://origin.test:8/simple/six/ HTTP/1.1", &[]).unwrap();
        assert_eq!(r.path, "/simple/six/");
        let r = parse_request("GET http://origin.test:8 HTTP/1.1", &[]).unwrap();
        assert_eq!(r.path, "/");
        for bad in ["", "GET", "GET /", "GET / SPDY/3", "GET / HTTP/1.1 x"] {
            assert!(parse_request(bad, &[]).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn wheel_names_normalize_to_their_project() {
        assert_eq!(project_of("six-1.16.0-py2.py3-none-any.whl"), "six");
        assert_eq!(
            project_of("Foo_Bar.baz-1.0-py3-none-any.whl"),
            "foo-bar-baz"
        );
    }

    fn get(port: u16, req: &str) -> Vec<u8> {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(req.as_bytes()).unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).unwrap();
        out
    }

    #[test]
    fn the_origin_serves_bulk_small_and_an_index_over_loopback() {
        let wheels = tempfile::tempdir().unwrap();
        std::fs::write(wheels.path().join("six-1.16.0-py2.py3-none-any.whl"), b"PK").unwrap();
        std::fs::write(wheels.path().join("notes.txt"), b"x").unwrap();
        let mut routes = Routes::new(3 * BULK_BLOCK_BYTES as u64 + 7);
        assert_eq!(routes.add_wheelhouse(wheels.path()).unwrap(), vec!["six"]);
        let o = Origin::serve(routes).unwrap();

        let out = get(o.port, "GET /bulk HTTP/1.1\r\nConnection: close\r\n\r\n");
        let split = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        assert_eq!(out.len() - split, 3 * BULK_BLOCK_BYTES + 7);
        assert!(out.starts_with(b"HTTP/1.1 200 OK\r\n"));

        // Two requests on one connection (keep-alive), then HTTP/1.0 closes.
        let out = get(
            o.port,
            "GET /small HTTP/1.1\r\n\r\nGET /simple/six/ HTTP/1.0\r\n\r\n",
        );
        let text = String::from_utf8_lossy(&out);
        assert_eq!(text.matches("HTTP/1.1 200 OK").count(), 2, "{text}");
        assert!(text.contains(std::str::from_utf8(SMALL_BODY).unwrap()));
        assert!(text.contains("href=\"six-1.16.0-py2.py3-none-any.whl\""));

        let out = get(o.port, "GET /simple/ HTTP/1.0\r\n\r\n");
        assert!(String::from_utf8_lossy(&out).contains("href=\"six/\""));
        let out = get(
            o.port,
            "GET /simple/six/six-1.16.0-py2.py3-none-any.whl HTTP/1.0\r\n\r\n",
        );
        assert!(out.ends_with(b"\r\n\r\nPK"));
        let out = get(o.port, "GET /nope HTTP/1.0\r\n\r\n");
        assert!(out.starts_with(b"HTTP/1.1 404"));
        let out = get(o.port, "BREW /pot HTCPCP/1.0\r\n\r\n");
        assert!(out.starts_with(b"HTTP/1.1 400"));
        drop(o);
    }
}
