//! TLS termination for a host with injected credentials.
//!
//! After `CONNECT host:port` is admitted, [`serve`] answers the client's TLS handshake
//! with a leaf for `host` signed by the sandbox's authority. A client that does not trust
//! that authority fails its handshake here, before anything is sent upstream (fail
//! closed). A ClientHello naming another server than `host` (SNI) is refused
//! (`"sni mismatch"`). Then the proxy connects to the admitted addresses and speaks TLS
//! to the real host, verifying its certificate for `host` against the host's roots and
//! `--upstream-ca`; a certificate that does not verify ends the connection with a `502`
//! and nothing of the request is sent.
//!
//! Requests then go one after the other over the two TLS sessions: each request's
//! `Host` must name `host` (else `"host mismatch"`, `403`, and no credential), its
//! method must be one the host's rules allow, hop-by-hop headers are dropped, the
//! injected headers replace any the client sent, and bodies are copied with their
//! framing.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

use rustls::pki_types::ServerName;
use rustls::{ClientConnection, ServerConnection, StreamOwned};

use super::ca::{CaPem, LeafCache};
use crate::framing::{
    Body, MAX_HEAD_BYTES, MAX_HEADERS, connection_tokens, copy_chunked, copy_exact, copy_to_eof,
    owned_headers, request_body, response_body, write_headers,
};
use crate::log::Via;
use crate::policy::{Host, RULE_HOST_MISMATCH, RULE_SNI_MISMATCH};
use crate::shared::{Admitted, Shared, connect_upstream};
use crate::tunnel::{FIRST_BYTES_TIMEOUT, IDLE_TIMEOUT};

/// Rule of a refusal by an injected host's method rule.
pub const RULE_METHOD: &str = "method not allowed";

/// The TLS side of the injections: the leaf cache and the upstream client configuration.
pub(crate) struct Terminator {
    leaves: LeafCache,
    client: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for Terminator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Terminator")
    }
}

impl Terminator {
    pub fn new(ca: &CaPem, upstream_ca_pem: Option<&str>) -> Result<Terminator, String> {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls_native_certs::load_native_certs().certs {
            let _ = roots.add(cert);
        }
        if let Some(pem) = upstream_ca_pem {
            let mut n = 0;
            for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                let cert = cert.map_err(|e| format!("--upstream-ca: {e}"))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("--upstream-ca: a certificate is refused: {e}"))?;
                n += 1;
            }
            if n == 0 {
                return Err("--upstream-ca holds no PEM certificate".into());
            }
        }
        let mut client = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS configuration: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        client.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Terminator {
            leaves: LeafCache::new(ca, provider)?,
            client: Arc::new(client),
        })
    }
}

/// A reader over `prefix` (bytes the client sent before the tunnel began), then `inner`.
struct Prefixed {
    prefix: io::Cursor<Vec<u8>>,
    inner: TcpStream,
}

impl Read for Prefixed {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if (self.prefix.position() as usize) < self.prefix.get_ref().len() {
            return self.prefix.read(buf);
        }
        self.inner.read(buf)
    }
}

impl Write for Prefixed {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.inner.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

type ClientSide = BufReader<StreamOwned<ServerConnection, Prefixed>>;
type UpstreamSide = BufReader<StreamOwned<ClientConnection, TcpStream>>;

/// Serves a terminated `CONNECT` to `host:port` (already admitted, `200` already sent).
#[allow(clippy::too_many_arguments)]
pub(crate) fn serve(
    shared: &Shared,
    tls: &Terminator,
    client: TcpStream,
    prefix: Vec<u8>,
    host: &Host,
    port: u16,
    admitted: &Admitted,
    addr: &Option<String>,
) {
    let Host::Name(name) = host else { return };
    let Ok(config) = tls.leaves.config_for(name) else {
        return;
    };
    let Ok(conn) = ServerConnection::new(config) else {
        return;
    };
    if client.set_read_timeout(Some(FIRST_BYTES_TIMEOUT)).is_err() {
        return;
    }
    let mut stream = StreamOwned::new(
        conn,
        Prefixed {
            prefix: io::Cursor::new(prefix),
            inner: client,
        },
    );
    while stream.conn.is_handshaking() {
        if stream.conn.complete_io(&mut stream.sock).is_err() {
            return; // the client does not trust the authority, or went away
        }
    }
    if let Some(sni) = stream.conn.server_name()
        && !Host::parse(sni).is_ok_and(|h| &h == host)
    {
        shared.deny_later(host, port, Via::Connect, RULE_SNI_MISMATCH, addr);
        return;
    }
    if stream
        .sock
        .inner
        .set_read_timeout(Some(IDLE_TIMEOUT))
        .is_err()
    {
        return;
    }
    let mut client = BufReader::with_capacity(16 * 1024, stream);
    let mut upstream: Option<UpstreamSide> = None;
    while let Ok(true) = exchange(
        shared,
        tls,
        &mut client,
        &mut upstream,
        host,
        port,
        admitted,
        addr,
    ) {}
    let s = client.get_mut();
    s.conn.send_close_notify();
    let _ = s.conn.complete_io(&mut s.sock);
}

fn respond<W: Write>(w: &mut W, code: u16, reason: &str, body: &str) {
    let body = format!("{body}\n");
    let out = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = w.write_all(out.as_bytes());
    let _ = w.flush();
}

/// Reads one head through its blank line, at most [`MAX_HEAD_BYTES`]; `None` at a clean
/// end before any byte.
fn read_head<R: BufRead>(r: &mut R) -> io::Result<Option<Vec<u8>>> {
    let mut head = Vec::new();
    loop {
        let mut line = Vec::new();
        let n = r
            .by_ref()
            .take((MAX_HEAD_BYTES + 1 - head.len()) as u64)
            .read_until(b'\n', &mut line)?;
        if n == 0 {
            return match head.is_empty() {
                true => Ok(None),
                false => Err(io::ErrorKind::UnexpectedEof.into()),
            };
        }
        head.extend_from_slice(&line);
        if head.len() > MAX_HEAD_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("head larger than {MAX_HEAD_BYTES} bytes"),
            ));
        }
        if line == b"\r\n" || line == b"\n" {
            if head.len() == line.len() {
                head.clear(); // a stray empty line before a request is skipped
                continue;
            }
            return Ok(Some(head));
        }
    }
}

fn connect_tls(tls: &Terminator, host: &str, admitted: &Admitted) -> Result<UpstreamSide, String> {
    let tcp = connect_upstream(&admitted.targets).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(IDLE_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from(host.to_string()).map_err(|e| e.to_string())?;
    let conn = ClientConnection::new(tls.client.clone(), name).map_err(|e| e.to_string())?;
    let mut stream = StreamOwned::new(conn, tcp);
    while stream.conn.is_handshaking() {
        stream
            .conn
            .complete_io(&mut stream.sock)
            .map_err(|e| format!("TLS with the upstream host failed: {e}"))?;
    }
    Ok(BufReader::with_capacity(16 * 1024, stream))
}

/// One request and its response; `Ok(true)` when both sides stay open for another.
#[allow(clippy::too_many_arguments)]
fn exchange(
    shared: &Shared,
    tls: &Terminator,
    client: &mut ClientSide,
    upstream: &mut Option<UpstreamSide>,
    host: &Host,
    port: u16,
    admitted: &Admitted,
    addr: &Option<String>,
) -> Result<bool, ()> {
    let head = match read_head(client) {
        Ok(Some(h)) => h,
        Ok(None) => return Ok(false),
        Err(e) => {
            if e.kind() == io::ErrorKind::InvalidData {
                respond(
                    client.get_mut(),
                    400,
                    "Bad Request",
                    &format!("cowspace: {e}"),
                );
            }
            return Err(());
        }
    };
    let mut raw = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut raw);
    if !matches!(req.parse(&head), Ok(httparse::Status::Complete(_))) {
        respond(
            client.get_mut(),
            400,
            "Bad Request",
            "cowspace: malformed request head",
        );
        return Err(());
    }
    let method = req.method.unwrap_or_default().to_string();
    let path = req.path.unwrap_or_default().to_string();
    let minor = req.version.unwrap_or(1);
    let headers = owned_headers(req.headers);
    let w = client.get_mut();
    if !path.starts_with('/') {
        respond(
            w,
            400,
            "Bad Request",
            "cowspace: send an origin-form target (/path) in this tunnel",
        );
        return Err(());
    }
    let hosts: Vec<&Vec<u8>> = headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("host"))
        .map(|(_, v)| v)
        .collect();
    let named = match hosts.as_slice() {
        [one] => String::from_utf8_lossy(one).trim().to_string(),
        _ => {
            respond(
                w,
                400,
                "Bad Request",
                "cowspace: exactly one Host header is needed",
            );
            return Err(());
        }
    };
    let same = crate::http::parse_authority(&named)
        .is_some_and(|(h, p)| &h == host && p.is_none_or(|p| p == port));
    if !same {
        shared.deny_later(host, port, Via::Connect, RULE_HOST_MISMATCH, addr);
        let body = format!(
            "cowspace: request denied by host mismatch: the Host header names {named} but the tunnel is to {}",
            host.authority(port)
        );
        respond(w, 403, "Forbidden", &body);
        return Err(());
    }
    let state = shared.inject();
    if !state.method_allowed(host, &method) {
        shared.deny_later(host, port, Via::Connect, RULE_METHOD, addr);
        let body = state.method_refusal(host, port, &method);
        respond(w, 403, "Forbidden", &body);
        return Err(());
    }
    let tokens = connection_tokens(&headers);
    if tokens
        .iter()
        .any(|t| t == "content-length" || t == "transfer-encoding" || t == "host")
    {
        respond(
            w,
            400,
            "Bad Request",
            "cowspace: Connection names a framing header",
        );
        return Err(());
    }
    let body = match request_body(&headers) {
        Ok(b) => b,
        Err(e) => {
            respond(w, 400, "Bad Request", &format!("cowspace: {e}"));
            return Err(());
        }
    };
    let (kept, added) = super::rewrite(&headers, &state.for_host(host));
    drop(state);
    let Host::Name(name) = host else {
        return Err(());
    };
    if upstream.is_none() {
        match connect_tls(tls, name, admitted) {
            Ok(u) => *upstream = Some(u),
            Err(e) => {
                let body = format!("cowspace: cannot reach {}: {e}", host.authority(port));
                respond(w, 502, "Bad Gateway", &body);
                return Err(());
            }
        }
    }
    let Some(up) = upstream.as_mut() else {
        return Err(());
    };
    let counters = admitted.counters.clone();
    let count_up = |n: usize| counters.up(n);
    let count_down = |n: usize| counters.down(n);
    let host_value = if port == 443 {
        name.clone()
    } else {
        host.authority(port)
    };
    let mut out = format!("{method} {path} HTTP/1.1\r\nHost: {host_value}\r\n").into_bytes();
    write_headers(&mut out, &kept, true);
    for (n, v) in &added {
        out.extend_from_slice(n.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(v);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    let expects = headers
        .iter()
        .any(|(n, v)| n.eq_ignore_ascii_case("expect") && v.eq_ignore_ascii_case(b"100-continue"));
    if expects && minor == 1 && body != Body::None {
        client
            .get_mut()
            .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
            .map_err(|_| ())?;
    }
    let sent = up.get_mut().write_all(&out);
    if let Err(e) = sent {
        let body = format!("cowspace: upstream {} failed: {e}", host.authority(port));
        respond(client.get_mut(), 502, "Bad Gateway", &body);
        return Err(());
    }
    count_up(out.len());
    match body {
        Body::None | Body::UntilClose => Ok(()),
        Body::Length(n) => copy_exact(client, up.get_mut(), n, &count_up),
        Body::Chunked => copy_chunked(client, up.get_mut(), &count_up),
    }
    .map_err(|_| ())?;
    up.get_mut().flush().map_err(|_| ())?;
    let client_close = minor == 0 || tokens.iter().any(|t| t == "close");
    loop {
        let raw = match read_head(up) {
            Ok(Some(raw)) => raw,
            Ok(None) | Err(_) => {
                let body = format!(
                    "cowspace: upstream {} closed before responding",
                    host.authority(port)
                );
                respond(client.get_mut(), 502, "Bad Gateway", &body);
                return Err(());
            }
        };
        count_down(raw.len());
        let mut hs = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut hs);
        if !matches!(resp.parse(&raw), Ok(httparse::Status::Complete(_))) {
            respond(
                client.get_mut(),
                502,
                "Bad Gateway",
                "cowspace: malformed response head",
            );
            return Err(());
        }
        let status = resp.code.unwrap_or(0);
        let reason = resp.reason.unwrap_or("").to_string();
        let rminor = resp.version.unwrap_or(0);
        let rheaders = owned_headers(resp.headers);
        if status == 101 {
            respond(
                client.get_mut(),
                502,
                "Bad Gateway",
                "cowspace: protocol upgrades are not proxied",
            );
            return Err(());
        }
        if (100..200).contains(&status) {
            client.get_mut().write_all(&raw).map_err(|_| ())?;
            continue;
        }
        let rbody = response_body(method == "HEAD", status, &rheaders).map_err(|_| ())?;
        let rtokens = connection_tokens(&rheaders);
        let upstream_close = (rminor == 0 && !rtokens.iter().any(|t| t == "keep-alive"))
            || rtokens.iter().any(|t| t == "close");
        let client_keep = !client_close && rbody != Body::UntilClose;
        let upstream_keep = !upstream_close && rbody != Body::UntilClose;
        let mut head = format!("HTTP/1.1 {status} {reason}\r\n").into_bytes();
        write_headers(&mut head, &rheaders, false);
        if !client_keep {
            head.extend_from_slice(b"Connection: close\r\n");
        }
        head.extend_from_slice(b"\r\n");
        let w = client.get_mut();
        w.write_all(&head).map_err(|_| ())?;
        match rbody {
            Body::None => Ok(()),
            Body::Length(n) => copy_exact(up, w, n, &count_down),
            Body::Chunked => copy_chunked(up, w, &count_down),
            Body::UntilClose => copy_to_eof(up, w, &count_down),
        }
        .map_err(|_| ())?;
        w.flush().map_err(|_| ())?;
        if !upstream_keep {
            *upstream = None;
        }
        return Ok(client_keep && (upstream_keep || upstream.is_none()));
    }
}
