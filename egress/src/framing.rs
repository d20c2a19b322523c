//! HTTP/1.1 message framing over blocking sockets: bounded head reads, header rules, body
//! copies.
//!
//! Header rules: a request body is `chunked` (the only transfer coding accepted, and never
//! together with `Content-Length`: that ambiguity is how requests are smuggled) or has one
//! `Content-Length` (repeats must agree) or is empty. A response to `HEAD`, a 1xx, 204 or
//! 304 has no body; else `chunked` as the last coding, else `Content-Length`, else the body
//! runs to the close. Hop-by-hop fields and `Proxy-*` are dropped when forwarding.
//!
//! Bodies are copied verbatim (a chunked body stays chunked) while being parsed just
//! enough to find where the message ends, so the next message on a keep-alive connection
//! starts at the right byte. Refused (an `InvalidData` error, and the connection closed):
//! a head over [`MAX_HEAD_BYTES`] or not complete within [`HEAD_TIMEOUT`], a chunk-size
//! line over [`MAX_CHUNK_LINE_BYTES`], not hexadecimal or not ending in CRLF, a chunk not
//! followed by CRLF, more than [`MAX_TRAILER_LINES`] trailer lines.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::tunnel::{IDLE_TIMEOUT, find_head_end};

/// Most bytes in a request or response head (request line and headers).
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Most header fields in one head.
pub const MAX_HEADERS: usize = 128;
/// Time allowed for a whole head once its first byte arrived.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest chunk-size or trailer line.
pub const MAX_CHUNK_LINE_BYTES: usize = 4096;
/// Most trailer lines after the last chunk.
pub const MAX_TRAILER_LINES: usize = 64;

fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// Reads one head (through the blank line). `Ok(None)` on a clean close before any byte.
/// Waits up to [`IDLE_TIMEOUT`] for the first byte, then [`HEAD_TIMEOUT`] for the rest.
pub fn read_head(reader: &mut BufReader<TcpStream>) -> io::Result<Option<Vec<u8>>> {
    let mut head: Vec<u8> = Vec::new();
    let mut deadline: Option<Instant> = None;
    loop {
        let timeout = match deadline {
            None if reader.buffer().is_empty() => IDLE_TIMEOUT,
            None => {
                deadline = Some(Instant::now() + HEAD_TIMEOUT);
                HEAD_TIMEOUT
            }
            Some(d) => d.saturating_duration_since(Instant::now()),
        };
        if timeout.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "request head not complete in time",
            ));
        }
        reader.get_ref().set_read_timeout(Some(timeout))?;
        let avail = reader.fill_buf()?;
        if avail.is_empty() {
            return match head.is_empty() {
                true => Ok(None),
                false => Err(io::ErrorKind::UnexpectedEof.into()),
            };
        }
        deadline.get_or_insert_with(|| Instant::now() + HEAD_TIMEOUT);
        let from = head.len().saturating_sub(3);
        let take = avail.len().min(MAX_HEAD_BYTES + 1 - head.len());
        head.extend_from_slice(&avail[..take]);
        if let Some(end) = find_head_end(&head[from..]).map(|e| e + from) {
            let consumed = take - (head.len() - end);
            reader.consume(consumed);
            head.truncate(end);
            return Ok(Some(head));
        }
        reader.consume(take);
        if head.len() > MAX_HEAD_BYTES {
            return Err(invalid(format!("head larger than {MAX_HEAD_BYTES} bytes")));
        }
    }
}

/// Copies exactly `n` bytes, counting them with `count`.
pub fn copy_exact<R: BufRead, W: Write>(
    r: &mut R,
    w: &mut W,
    mut n: u64,
    count: &dyn Fn(usize),
) -> io::Result<()> {
    while n > 0 {
        let avail = r.fill_buf()?;
        if avail.is_empty() {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let take = avail.len().min(usize::try_from(n).unwrap_or(usize::MAX));
        w.write_all(&avail[..take])?;
        count(take);
        r.consume(take);
        n -= take as u64;
    }
    Ok(())
}

/// Copies until the reader's end, counting with `count`.
pub fn copy_to_eof<R: BufRead, W: Write>(
    r: &mut R,
    w: &mut W,
    count: &dyn Fn(usize),
) -> io::Result<()> {
    loop {
        let avail = r.fill_buf()?;
        if avail.is_empty() {
            return Ok(());
        }
        let take = avail.len();
        w.write_all(avail)?;
        count(take);
        r.consume(take);
    }
}

/// Reads one CRLF-terminated line of at most [`MAX_CHUNK_LINE_BYTES`].
fn read_line<R: BufRead>(r: &mut R) -> io::Result<Vec<u8>> {
    let mut line = Vec::new();
    r.take(MAX_CHUNK_LINE_BYTES as u64)
        .read_until(b'\n', &mut line)?;
    if !line.ends_with(b"\r\n") {
        return Err(invalid("chunk line too long, truncated or without CRLF"));
    }
    Ok(line)
}

/// The size on a chunk-size line (`1a;ext=1\r\n`).
pub fn parse_chunk_size(line: &[u8]) -> io::Result<u64> {
    let body = &line[..line.len().saturating_sub(2)];
    let digits = body.split(|&b| b == b';').next().unwrap_or_default();
    let digits = digits.strip_suffix(b" ").unwrap_or(digits);
    if digits.is_empty() || digits.len() > 15 || !digits.iter().all(u8::is_ascii_hexdigit) {
        return Err(invalid("bad chunk size"));
    }
    let text = std::str::from_utf8(digits).map_err(|_| invalid("bad chunk size"))?;
    u64::from_str_radix(text, 16).map_err(|_| invalid("bad chunk size"))
}

/// Copies a chunked body verbatim through its last chunk and trailers.
pub fn copy_chunked<R: BufRead, W: Write>(
    r: &mut R,
    w: &mut W,
    count: &dyn Fn(usize),
) -> io::Result<()> {
    loop {
        let line = read_line(r)?;
        let size = parse_chunk_size(&line)?;
        w.write_all(&line)?;
        count(line.len());
        if size == 0 {
            for _ in 0..=MAX_TRAILER_LINES {
                let line = read_line(r)?;
                w.write_all(&line)?;
                count(line.len());
                if line == b"\r\n" {
                    return Ok(());
                }
            }
            return Err(invalid("too many trailer lines"));
        }
        copy_exact(r, w, size, count)?;
        let mut crlf = [0u8; 2];
        r.read_exact(&mut crlf)?;
        if &crlf != b"\r\n" {
            return Err(invalid("chunk not followed by CRLF"));
        }
        w.write_all(&crlf)?;
        count(2);
    }
}

pub(crate) fn headers_named<'a>(
    headers: &'a [(String, Vec<u8>)],
    name: &'a str,
) -> impl Iterator<Item = &'a [u8]> + 'a {
    headers
        .iter()
        .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_slice())
}

/// Lowercase tokens of every `Connection` header.
pub(crate) fn connection_tokens(headers: &[(String, Vec<u8>)]) -> Vec<String> {
    headers_named(headers, "connection")
        .flat_map(|v| {
            String::from_utf8_lossy(v)
                .split(',')
                .map(|t| t.trim().to_ascii_lowercase())
                .collect::<Vec<_>>()
        })
        .filter(|t| !t.is_empty())
        .collect()
}

pub(crate) fn owned_headers(headers: &[httparse::Header<'_>]) -> Vec<(String, Vec<u8>)> {
    headers
        .iter()
        .map(|h| (h.name.to_string(), h.value.to_vec()))
        .collect()
}

/// How a message body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Body {
    None,
    Length(u64),
    Chunked,
    UntilClose,
}

pub(crate) fn content_length(headers: &[(String, Vec<u8>)]) -> Result<Option<u64>, String> {
    let mut found: Option<u64> = None;
    for v in headers_named(headers, "content-length") {
        let ok = !v.is_empty() && v.len() <= 19 && v.iter().all(u8::is_ascii_digit);
        let n = ok
            .then(|| std::str::from_utf8(v).ok()?.parse::<u64>().ok())
            .flatten()
            .ok_or("bad Content-Length")?;
        if found.is_some_and(|f| f != n) {
            return Err("conflicting Content-Length headers".into());
        }
        found = Some(n);
    }
    Ok(found)
}

pub(crate) fn transfer_codings(headers: &[(String, Vec<u8>)]) -> Vec<String> {
    headers_named(headers, "transfer-encoding")
        .flat_map(|v| {
            String::from_utf8_lossy(v)
                .split(',')
                .map(|t| t.trim().to_ascii_lowercase())
                .collect::<Vec<_>>()
        })
        .collect()
}

pub(crate) fn request_body(headers: &[(String, Vec<u8>)]) -> Result<Body, String> {
    let codings = transfer_codings(headers);
    let length = content_length(headers)?;
    if !codings.is_empty() {
        if length.is_some() {
            return Err("both Transfer-Encoding and Content-Length".into());
        }
        if codings != ["chunked"] {
            return Err(format!(
                "unsupported Transfer-Encoding `{}`",
                codings.join(", ")
            ));
        }
        return Ok(Body::Chunked);
    }
    Ok(match length {
        Some(0) | None => Body::None,
        Some(n) => Body::Length(n),
    })
}

pub(crate) fn response_body(
    is_head: bool,
    status: u16,
    headers: &[(String, Vec<u8>)],
) -> Result<Body, String> {
    if is_head || (100..200).contains(&status) || status == 204 || status == 304 {
        return Ok(Body::None);
    }
    let codings = transfer_codings(headers);
    if !codings.is_empty() {
        return Ok(if codings.last().is_some_and(|c| c == "chunked") {
            Body::Chunked
        } else {
            Body::UntilClose
        });
    }
    Ok(match content_length(headers)? {
        Some(0) => Body::None,
        Some(n) => Body::Length(n),
        None => Body::UntilClose,
    })
}

/// Whether a header is dropped when forwarding: hop-by-hop, `Proxy-*`, or named by
/// `Connection`. `Host` is dropped from requests and set from the target.
pub(crate) fn is_hop_by_hop(name: &str, tokens: &[String], request: bool) -> bool {
    let n = name.to_ascii_lowercase();
    matches!(
        n.as_str(),
        "connection" | "keep-alive" | "te" | "trailer" | "upgrade"
    ) || n.starts_with("proxy-")
        || (request && (n == "host" || n == "expect"))
        || tokens.contains(&n)
}

pub(crate) fn write_headers(out: &mut Vec<u8>, headers: &[(String, Vec<u8>)], request: bool) {
    let tokens = connection_tokens(headers);
    for (name, value) in headers {
        if !is_hop_by_hop(name, &tokens, request) {
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn hdrs(list: &[(&str, &str)]) -> Vec<(String, Vec<u8>)> {
        list.iter()
            .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
            .collect()
    }

    fn chunked(input: &[u8]) -> io::Result<(Vec<u8>, usize)> {
        let mut r = io::Cursor::new(input);
        let mut out = Vec::new();
        let n = Cell::new(0);
        copy_chunked(&mut r, &mut out, &|k| n.set(n.get() + k))?;
        Ok((out, r.position() as usize))
    }

    #[test]
    fn chunked_copies_verbatim_and_stops_at_end() {
        let body = b"5;x=y\r\nhello\r\n6\r\n world\r\n0\r\nTrailer: 1\r\n\r\n";
        let mut input = body.to_vec();
        input.extend_from_slice(b"GET /next HTTP/1.1\r\n");
        let (out, consumed) = chunked(&input).unwrap();
        assert_eq!(out, body);
        assert_eq!(consumed, body.len());
        let (out, _) = chunked(b"A\r\n0123456789\r\n0\r\n\r\n").unwrap();
        assert_eq!(out.len(), 20);
    }

    #[test]
    fn chunked_refusals() {
        for bad in [
            &b"zz\r\n"[..],
            b"5\nhello\r\n0\r\n\r\n",
            b"5\r\nhelloXX0\r\n\r\n",
            b"5\r\nhel",
            b"10000000000000000\r\n",
            b"\r\n",
        ] {
            assert!(chunked(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        let mut long = b"1".repeat(MAX_CHUNK_LINE_BYTES);
        long.extend_from_slice(b"\r\n");
        assert!(chunked(&long).is_err());
        let mut trailers = b"0\r\n".to_vec();
        for _ in 0..=MAX_TRAILER_LINES {
            trailers.extend_from_slice(b"X: y\r\n");
        }
        trailers.extend_from_slice(b"\r\n");
        assert!(chunked(&trailers).is_err());
    }

    #[test]
    fn chunk_sizes() {
        assert_eq!(parse_chunk_size(b"ff\r\n").unwrap(), 255);
        assert_eq!(parse_chunk_size(b"0;a=b\r\n").unwrap(), 0);
        assert!(parse_chunk_size(b"-1\r\n").is_err());
        assert!(parse_chunk_size(b"+1\r\n").is_err());
    }

    #[test]
    fn body_framing_rules() {
        assert_eq!(
            request_body(&hdrs(&[("Content-Length", "5")])),
            Ok(Body::Length(5))
        );
        assert_eq!(
            request_body(&hdrs(&[("Transfer-Encoding", "Chunked")])),
            Ok(Body::Chunked)
        );
        assert!(
            request_body(&hdrs(&[
                ("Transfer-Encoding", "chunked"),
                ("Content-Length", "5")
            ]))
            .is_err()
        );
        assert!(request_body(&hdrs(&[("Transfer-Encoding", "gzip, chunked")])).is_err());
        assert!(request_body(&hdrs(&[("Content-Length", "5"), ("Content-Length", "6")])).is_err());
        assert!(request_body(&hdrs(&[("Content-Length", "5, 5")])).is_err());
        assert_eq!(
            response_body(true, 200, &hdrs(&[("Content-Length", "5")])),
            Ok(Body::None)
        );
        assert_eq!(response_body(false, 304, &[]), Ok(Body::None));
        assert_eq!(response_body(false, 200, &[]), Ok(Body::UntilClose));
        assert_eq!(
            response_body(false, 200, &hdrs(&[("Transfer-Encoding", "gzip")])),
            Ok(Body::UntilClose)
        );
    }

    #[test]
    fn hop_by_hop_stripped() {
        let h = hdrs(&[
            ("Host", "x"),
            ("Connection", "close, X-Secret"),
            ("X-Secret", "1"),
            ("Proxy-Authorization", "Basic x"),
            ("Keep-Alive", "5"),
            ("Accept", "*/*"),
            ("Content-Length", "3"),
        ]);
        let mut out = Vec::new();
        write_headers(&mut out, &h, true);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "Accept: */*\r\nContent-Length: 3\r\n"
        );
    }
}
