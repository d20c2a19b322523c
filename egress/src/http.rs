//! The HTTP/1.1 forward proxy: absolute-form requests and `CONNECT`.
//!
//! A client connection is a loop of requests. Each request is checked against the policy
//! in force at that moment (so a keep-alive connection's second request may be denied, or
//! go to another upstream). `GET http://host:port/path` is forwarded in origin-form
//! (`GET /path`) with its `Host` rewritten from the target; `CONNECT host:port` becomes a
//! tunnel (the `tunnel` module). Hop-by-hop headers (`Connection` and the fields it names,
//! `Keep-Alive`, `TE`, `Trailer`, `Upgrade`, `Expect`) and every `Proxy-*` header are
//! stripped; bodies are copied verbatim with their framing (the `framing` module), a
//! large `Content-Length` or close-delimited one with `splice(2)` (the `splice` module).
//!
//! Refused with `400`: a head that does not parse or exceeds [`crate::MAX_HEAD_BYTES`], an
//! origin-form or `https://` target, userinfo (`user@host`) or a fragment in the target,
//! several `Host` headers, both `Transfer-Encoding` and `Content-Length`, a transfer
//! coding other than `chunked`, differing `Content-Length`s, a `Connection` header naming
//! a framing header. Refused with `403` (and logged): a policy or address denial, and a
//! `Host` header naming another host or port than the target (`"host mismatch"`: a known
//! bypass of name-based proxies). `502` when the upstream cannot be resolved or reached or
//! sends a malformed response; `503` when the decision cannot be logged. After any error
//! response the client connection is closed.

use std::io::{self, BufReader, Write};
use std::net::TcpStream;
use std::sync::Arc;

use crate::framing::{
    Body, MAX_HEADERS, connection_tokens, copy_chunked, copy_exact, copy_to_eof, headers_named,
    owned_headers, read_head, request_body, response_body, write_headers,
};
use crate::log::Via;
use crate::policy::{Host, Policy, RULE_HOST_MISMATCH};
use crate::shared::{Refusal, Shared, connect_upstream};
use crate::splice::{self, KernelPipe, SPLICE_AFTER_BYTES};
use crate::stats::HostCounters;
use crate::tunnel::{self, IDLE_TIMEOUT};

/// Buffer of a client or upstream reader.
const READ_BUF_BYTES: usize = 16 * 1024;

/// Parses `host[:port]` (IPv6 in brackets). `None` for userinfo, a bad host or port.
pub(crate) fn parse_authority(s: &str) -> Option<(Host, Option<u16>)> {
    if s.is_empty() || s.contains('@') {
        return None;
    }
    let (host, port) = if s.starts_with('[') {
        let end = s.find(']')?;
        let (h, rest) = s.split_at(end + 1);
        (
            h,
            if rest.is_empty() {
                None
            } else {
                Some(rest.strip_prefix(':')?)
            },
        )
    } else {
        match s.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    let port = match port {
        None => None,
        Some(p) if !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()) => {
            Some(p.parse::<u16>().ok().filter(|&p| p != 0)?)
        }
        Some(_) => return None,
    };
    Some((Host::parse(host).ok()?, port))
}

/// A parsed request head, owned.
struct Request {
    method: String,
    target: String,
    minor: u8,
    headers: Vec<(String, Vec<u8>)>,
}

impl Request {
    fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        headers_named(&self.headers, name)
    }
}

fn parse_request(head: &[u8]) -> Result<Request, String> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err("incomplete request head".into()),
        Err(e) => return Err(format!("malformed request head: {e}")),
    }
    Ok(Request {
        method: req.method.unwrap_or_default().to_string(),
        target: req.path.unwrap_or_default().to_string(),
        minor: req.version.unwrap_or(0),
        headers: owned_headers(req.headers),
    })
}

/// Writes a complete plain-text response (no body for `HEAD`).
fn respond(w: &mut TcpStream, code: u16, reason: &str, body: &str, is_head: bool) {
    let body = format!("{body}\n");
    let mut out = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if !is_head {
        out.push_str(&body);
    }
    let _ = w.write_all(out.as_bytes());
}

/// The pattern text that would name `host`, with `:port` when the name is already allowed
/// on another port.
fn suggestion(policy: &Policy, host: &Host, port: u16) -> String {
    let base = match host {
        Host::Ip(std::net::IpAddr::V6(ip)) => format!("[{ip}]"),
        _ => host.text(),
    };
    if policy.decide_name(host).allowed {
        format!("{base}:{port}")
    } else {
        base
    }
}

/// The status and body of a refusal, naming the host and the flag that would allow it.
fn refusal_response(
    policy: &Policy,
    host: &Host,
    port: u16,
    refusal: &Refusal,
) -> (u16, &'static str, String) {
    let target = host.authority(port);
    match refusal {
        Refusal::Policy(d) => {
            let fix = match d.rule.strip_prefix("deny ") {
                Some(pattern) => format!(
                    "remove the deny rule with mountctl sandbox policy WS --remove-host {pattern}"
                ),
                None => {
                    let s = suggestion(policy, host, port);
                    format!(
                        "allow it with --allow-host {s} (or mountctl sandbox policy WS --allow-host {s})"
                    )
                }
            };
            (
                403,
                "Forbidden",
                format!("cowspace: egress to {target} denied by {}; {fix}", d.rule),
            )
        }
        Refusal::Private => {
            let why = match host {
                Host::Name(n) => format!("{n} resolves only to private addresses"),
                Host::Ip(ip) => format!("{ip} is a private address"),
            };
            let name = match host {
                Host::Name(n) => n.clone(),
                Host::Ip(_) => "NAME".into(),
            };
            let body = format!(
                "cowspace: egress to {target} denied by private address: {why}; allow a private address for a name with --add-host {name}:ADDR"
            );
            (403, "Forbidden", body)
        }
        Refusal::Unresolvable(e) => (502, "Bad Gateway", format!("cowspace: {e}")),
        Refusal::Internal(e) => (
            503,
            "Service Unavailable",
            format!("cowspace: refusing egress: {e}"),
        ),
    }
}

fn host_mismatch(
    shared: &Shared,
    w: &mut TcpStream,
    host: &Host,
    port: u16,
    named: &str,
    via: Via,
    client: &Option<String>,
) {
    shared.deny_later(host, port, via, RULE_HOST_MISMATCH, client);
    let body = format!(
        "cowspace: request denied by host mismatch: the Host header names {named} but the request is for {}",
        host.authority(port)
    );
    respond(w, 403, "Forbidden", &body, false);
}

/// A `Host` header: its text, and its host and port when it parses.
type HostHeader = (String, Option<(Host, Option<u16>)>);

/// The `Host` header of a request: `Ok(None)` when absent, `Err` when repeated.
fn host_header(req: &Request) -> Result<Option<HostHeader>, String> {
    let mut values = req.values("host");
    let (Some(value), None) = (values.next(), values.next()) else {
        return match req.values("host").count() {
            0 => Ok(None),
            _ => Err("several Host headers".into()),
        };
    };
    let text = String::from_utf8_lossy(value).trim().to_string();
    let parsed = parse_authority(&text);
    Ok(Some((text, parsed)))
}

/// An upstream connection kept for the next request to the same `host:port`.
struct Upstream {
    host: Host,
    port: u16,
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    counters: Arc<HostCounters>,
}

impl Upstream {
    /// Whether the kept connection is still open and idle (no unread bytes).
    fn idle_and_open(&self) -> bool {
        if !self.reader.buffer().is_empty() || self.writer.set_nonblocking(true).is_err() {
            return false;
        }
        let alive = matches!(self.writer.peek(&mut [0u8; 1]), Err(e) if e.kind() == io::ErrorKind::WouldBlock);
        alive && self.writer.set_nonblocking(false).is_ok()
    }
}

/// Serves one client connection of the HTTP proxy until it closes.
pub(crate) fn serve(shared: &Shared, stream: TcpStream, client: Option<String>) {
    let Ok(read_half) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::with_capacity(READ_BUF_BYTES, read_half);
    let mut writer = stream;
    let mut upstream: Option<Upstream> = None;
    loop {
        let head = match read_head(&mut reader) {
            Ok(Some(head)) => head,
            Ok(None) => return,
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                respond(
                    &mut writer,
                    400,
                    "Bad Request",
                    &format!("cowspace: {e}"),
                    false,
                );
                return;
            }
            Err(_) => return,
        };
        let req = match parse_request(&head) {
            Ok(req) => req,
            Err(e) => {
                respond(
                    &mut writer,
                    400,
                    "Bad Request",
                    &format!("cowspace: {e}"),
                    false,
                );
                return;
            }
        };
        if req.method == "CONNECT" {
            connect(shared, writer, reader, &req, &client);
            return;
        }
        let keep = forward(
            shared,
            &mut writer,
            &mut reader,
            &req,
            &mut upstream,
            &client,
        );
        if !keep {
            return;
        }
    }
}

fn connect(
    shared: &Shared,
    mut client: TcpStream,
    reader: BufReader<TcpStream>,
    req: &Request,
    addr: &Option<String>,
) {
    let Some((host, Some(port))) = parse_authority(&req.target) else {
        let body = format!("cowspace: CONNECT needs host:port, got `{}`", req.target);
        respond(&mut client, 400, "Bad Request", &body, false);
        return;
    };
    match host_header(req) {
        Err(e) => {
            return respond(
                &mut client,
                400,
                "Bad Request",
                &format!("cowspace: {e}"),
                false,
            );
        }
        Ok(Some((text, parsed))) => {
            if !parsed.is_some_and(|(h, p)| h == host && p.is_none_or(|p| p == port)) {
                return host_mismatch(shared, &mut client, &host, port, &text, Via::Connect, addr);
            }
        }
        Ok(None) => {}
    }
    let admitted = match shared.admit(&host, port, Via::Connect, addr) {
        Ok(a) => a,
        Err(refusal) => {
            let (code, reason, body) = refusal_response(&shared.policy(), &host, port, &refusal);
            return respond(&mut client, code, reason, &body, false);
        }
    };
    let state = shared.inject();
    if let Some(tls) = state
        .tls
        .clone()
        .filter(|_| !state.for_host(&host).is_empty())
    {
        drop(state);
        // Only a host with injections is decrypted (the `inject` module).
        if client
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .is_err()
        {
            return;
        }
        let prefix = reader.buffer().to_vec();
        drop(reader);
        return crate::inject::mitm::serve(
            shared, &tls, client, prefix, &host, port, &admitted, addr,
        );
    }
    drop(state);
    let upstream = match connect_upstream(&admitted.targets) {
        Ok(s) => s,
        Err(e) => {
            let body = format!("cowspace: cannot reach {}: {e}", host.authority(port));
            return respond(&mut client, 502, "Bad Gateway", &body, false);
        }
    };
    if client
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .is_err()
    {
        return;
    }
    let prefix = reader.buffer().to_vec();
    drop(reader);
    let _ = tunnel::run(
        shared,
        client,
        upstream,
        prefix,
        &host,
        port,
        Via::Connect,
        addr,
        &admitted.counters,
    );
}

/// Forwards one absolute-form request; returns whether the client connection stays open.
fn forward(
    shared: &Shared,
    client: &mut TcpStream,
    reader: &mut BufReader<TcpStream>,
    req: &Request,
    upstream: &mut Option<Upstream>,
    addr: &Option<String>,
) -> bool {
    let is_head = req.method == "HEAD";
    let bad = |client: &mut TcpStream, msg: &str| {
        respond(
            client,
            400,
            "Bad Request",
            &format!("cowspace: {msg}"),
            is_head,
        );
        false
    };
    let target = &req.target;
    let scheme_ok = target.len() > 7 && target[..7].eq_ignore_ascii_case("http://");
    if !scheme_ok {
        let msg = if target.starts_with('/') {
            "this is a proxy: send an absolute URI (GET http://host/path) or CONNECT host:port"
        } else {
            "only http:// targets are forwarded; use CONNECT host:port for https"
        };
        return bad(client, msg);
    }
    let rest = &target[7..];
    if rest.contains('#') {
        return bad(client, "a fragment (#) in the request target");
    }
    let split = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(split);
    let path = match path {
        "" => "/".to_string(),
        p if p.starts_with('?') => format!("/{p}"),
        p => p.to_string(),
    };
    let Some((host, port)) = parse_authority(authority) else {
        return bad(
            client,
            &format!("bad host `{authority}` in the request target"),
        );
    };
    let port = port.unwrap_or(80);
    match host_header(req) {
        Err(e) => return bad(client, &e),
        Ok(Some((text, parsed))) => {
            if !parsed.is_some_and(|(h, p)| h == host && p.unwrap_or(80) == port) {
                host_mismatch(shared, client, &host, port, &text, Via::Http, addr);
                return false;
            }
        }
        Ok(None) => {}
    }
    let tokens = connection_tokens(&req.headers);
    if tokens
        .iter()
        .any(|t| t == "content-length" || t == "transfer-encoding" || t == "host")
    {
        return bad(client, "Connection names a framing header");
    }
    let body = match request_body(&req.headers) {
        Ok(b) => b,
        Err(e) => return bad(client, &e),
    };
    let state = shared.inject();
    if !state.method_allowed(&host, &req.method) {
        shared.deny_later(
            &host,
            port,
            Via::Http,
            crate::inject::mitm::RULE_METHOD,
            addr,
        );
        let text = state.method_refusal(&host, port, &req.method);
        respond(client, 403, "Forbidden", &text, is_head);
        return false;
    }
    let (kept, added) = crate::inject::rewrite(&req.headers, &state.for_host(&host));
    drop(state);
    let rewritten;
    let req = if added.is_empty() {
        req
    } else {
        rewritten = Request {
            method: req.method.clone(),
            target: req.target.clone(),
            minor: req.minor,
            headers: kept,
        };
        &rewritten
    };
    let admitted = match shared.admit(&host, port, Via::Http, addr) {
        Ok(a) => a,
        Err(refusal) => {
            let (code, reason, text) = refusal_response(&shared.policy(), &host, port, &refusal);
            respond(client, code, reason, &text, is_head);
            return false;
        }
    };
    let reuse = upstream
        .as_ref()
        .is_some_and(|u| u.host == host && u.port == port && u.idle_and_open());
    if !reuse {
        *upstream = None;
        let stream = match connect_upstream(&admitted.targets) {
            Ok(s) => s,
            Err(e) => {
                let text = format!("cowspace: cannot reach {}: {e}", host.authority(port));
                respond(client, 502, "Bad Gateway", &text, is_head);
                return false;
            }
        };
        let Ok(read_half) = stream.try_clone() else {
            return false;
        };
        *upstream = Some(Upstream {
            host: host.clone(),
            port,
            reader: BufReader::with_capacity(READ_BUF_BYTES, read_half),
            writer: stream,
            counters: admitted.counters.clone(),
        });
    }
    let Some(up) = upstream.as_mut() else {
        return false;
    };
    match exchange(client, reader, req, &path, &host, port, body, up, &added) {
        Ok((client_keep, upstream_keep)) => {
            if !upstream_keep {
                *upstream = None;
            }
            client_keep
        }
        Err(Exchange::BeforeResponse(e)) => {
            *upstream = None;
            let text = format!("cowspace: upstream {} failed: {e}", host.authority(port));
            respond(client, 502, "Bad Gateway", &text, is_head);
            false
        }
        Err(Exchange::During) => {
            *upstream = None;
            false
        }
    }
}

/// Copies a body of `n` bytes (`None`: up to the end of `reader`) from `reader` to `w`:
/// what `reader` has buffered by copying it, the rest with `splice(2)` when at least
/// [`SPLICE_AFTER_BYTES`] are to come and a pipe can be made, else by copying too. Never
/// reads past the body's end, so a kept-alive connection's next message is intact.
fn copy_body(
    reader: &mut BufReader<TcpStream>,
    w: &mut TcpStream,
    n: Option<u64>,
    count: &dyn Fn(usize),
) -> io::Result<()> {
    let buffered = reader.buffer().len() as u64;
    let head = n.map_or(buffered, |n| n.min(buffered));
    let rest = n.map(|n| n - head);
    let pipe = match rest {
        Some(r) if r < SPLICE_AFTER_BYTES => None,
        _ => KernelPipe::new().ok(),
    };
    let Some(mut pipe) = pipe else {
        return match n {
            Some(n) => copy_exact(reader, w, n, count),
            None => copy_to_eof(reader, w, count),
        };
    };
    copy_exact(reader, w, head, count)?;
    assert!(
        reader.buffer().is_empty(),
        "bytes left buffered before a splice"
    );
    splice::copy_exact(&mut pipe, reader.get_ref(), w, rest, count)
}

/// How an exchange failed: before a response began (a 502 can still be sent) or during.
enum Exchange {
    BeforeResponse(String),
    During,
}

/// Sends the request upstream and the response back; returns (client keep, upstream keep).
#[allow(clippy::too_many_arguments)]
fn exchange(
    client: &mut TcpStream,
    reader: &mut BufReader<TcpStream>,
    req: &Request,
    path: &str,
    host: &Host,
    port: u16,
    body: Body,
    up: &mut Upstream,
    injected: &[(String, Vec<u8>)],
) -> Result<(bool, bool), Exchange> {
    let counters = up.counters.clone();
    let count_up = |n: usize| counters.up(n);
    let count_down = |n: usize| counters.down(n);
    let host_value = if port == 80 {
        let a = host.authority(port);
        a.strip_suffix(":80").unwrap_or(&a).to_string()
    } else {
        host.authority(port)
    };
    let mut head = format!(
        "{} {path} HTTP/1.{}\r\nHost: {host_value}\r\n",
        req.method, req.minor
    )
    .into_bytes();
    write_headers(&mut head, &req.headers, true);
    // Written after the filter: a `Connection` token naming an injected header cannot
    // drop it.
    for (name, value) in injected {
        head.extend_from_slice(name.as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value);
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"\r\n");
    let before = |e: io::Error| Exchange::BeforeResponse(e.to_string());
    let expects = req
        .values("expect")
        .any(|v| v.eq_ignore_ascii_case(b"100-continue"));
    if expects && req.minor == 1 && body != Body::None {
        client
            .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
            .map_err(|_| Exchange::During)?;
    }
    up.writer.write_all(&head).map_err(before)?;
    count_up(head.len());
    reader
        .get_ref()
        .set_read_timeout(Some(IDLE_TIMEOUT))
        .map_err(before)?;
    match body {
        Body::None | Body::UntilClose => Ok(()),
        Body::Length(n) => copy_body(reader, &mut up.writer, Some(n), &count_up),
        Body::Chunked => copy_chunked(reader, &mut up.writer, &count_up),
    }
    .map_err(|_| Exchange::During)?;
    let client_close =
        req.minor == 0 || connection_tokens(&req.headers).iter().any(|t| t == "close");
    loop {
        let raw = match read_head(&mut up.reader) {
            Ok(Some(raw)) => raw,
            Ok(None) => return Err(Exchange::BeforeResponse("closed before responding".into())),
            Err(e) => return Err(before(e)),
        };
        count_down(raw.len());
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut headers);
        if !matches!(resp.parse(&raw), Ok(httparse::Status::Complete(_))) {
            return Err(Exchange::BeforeResponse("malformed response head".into()));
        }
        let status = resp.code.unwrap_or(0);
        let reason = resp.reason.unwrap_or("").to_string();
        let minor = resp.version.unwrap_or(0);
        let headers = owned_headers(resp.headers);
        if status == 101 {
            return Err(Exchange::BeforeResponse(
                "protocol upgrades are not proxied".into(),
            ));
        }
        if (100..200).contains(&status) {
            client.write_all(&raw).map_err(|_| Exchange::During)?;
            continue;
        }
        let body = response_body(req.method == "HEAD", status, &headers)
            .map_err(Exchange::BeforeResponse)?;
        let tokens = connection_tokens(&headers);
        let upstream_close = (minor == 0 && !tokens.iter().any(|t| t == "keep-alive"))
            || tokens.iter().any(|t| t == "close");
        let client_keep = !client_close && body != Body::UntilClose;
        let upstream_keep = !upstream_close && body != Body::UntilClose;
        let mut out = format!("HTTP/1.1 {status} {reason}\r\n").into_bytes();
        write_headers(&mut out, &headers, false);
        if !client_keep {
            out.extend_from_slice(b"Connection: close\r\n");
        }
        out.extend_from_slice(b"\r\n");
        client.write_all(&out).map_err(|_| Exchange::During)?;
        up.reader
            .get_ref()
            .set_read_timeout(Some(IDLE_TIMEOUT))
            .map_err(|_| Exchange::During)?;
        match body {
            Body::None => Ok(()),
            Body::Length(n) => copy_body(&mut up.reader, client, Some(n), &count_down),
            Body::Chunked => copy_chunked(&mut up.reader, client, &count_down),
            Body::UntilClose => copy_body(&mut up.reader, client, None, &count_down),
        }
        .map_err(|_| Exchange::During)?;
        return Ok((client_keep, upstream_keep));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorities() {
        let (h, p) = parse_authority("Example.com:8080").unwrap();
        assert_eq!((h.text(), p), ("example.com".to_string(), Some(8080)));
        assert_eq!(parse_authority("[::1]:443").unwrap().1, Some(443));
        assert_eq!(parse_authority("[::1]").unwrap().0.text(), "::1");
        for bad in [
            "",
            "a@b.com",
            "x.com:",
            "x.com:0",
            "x.com:99999",
            "::1",
            "x.com:1:2",
            "[::1",
        ] {
            assert!(parse_authority(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn refusal_texts() {
        let policy: Policy = serde_json::from_str(r#"{"allow":["pypi.org:80"]}"#).unwrap();
        let host = Host::parse("pypi.org").unwrap();
        let d = policy.decide_host(&host, 443);
        let (code, _, body) = refusal_response(&policy, &host, 443, &Refusal::Policy(d));
        assert_eq!(code, 403);
        assert_eq!(
            body,
            "cowspace: egress to pypi.org:443 denied by default deny; allow it with --allow-host pypi.org:443 (or mountctl sandbox policy WS --allow-host pypi.org:443)"
        );
        let other = Host::parse("files.test").unwrap();
        let d = policy.decide_host(&other, 443);
        let (_, _, body) = refusal_response(&policy, &other, 443, &Refusal::Policy(d));
        assert!(body.contains("--allow-host files.test (or"), "{body}");
        let local = Host::parse("localhost").unwrap();
        let (_, _, body) = refusal_response(&policy, &local, 80, &Refusal::Private);
        assert!(
            body.contains("localhost resolves only to private addresses"),
            "{body}"
        );
        assert!(body.contains("--add-host localhost:ADDR"), "{body}");
    }
}
