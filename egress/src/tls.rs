//! A bounded, by-hand parser of a TLS ClientHello's server name (SNI).
//!
//! Written by hand rather than with a TLS crate: we need one field of one message, must
//! refuse anything ambiguous, and must bound the bytes we buffer; a full TLS library
//! (`rustls`) would pull in cryptography for nothing, and the parsing-only crates are
//! small and thinly maintained. The parser reassembles the handshake message from one or
//! more handshake records (up to [`MAX_CLIENT_HELLO_BYTES`]), then walks the ClientHello
//! (RFC 8446 §4.1.2) and its `server_name` extension (RFC 6066 §3). It refuses
//! ([`Hello::Malformed`]): a non-handshake record before the message is complete, a
//! message other than ClientHello, any length that overruns its container, trailing bytes,
//! a repeated `server_name` extension, more than one host name, an empty or non-ASCII name.

/// Most bytes of ClientHello handshake message accepted.
pub const MAX_CLIENT_HELLO_BYTES: usize = 32 * 1024;

const RECORD_HANDSHAKE: u8 = 0x16;
const HANDSHAKE_CLIENT_HELLO: u8 = 0x01;
const EXT_SERVER_NAME: u16 = 0;
const NAME_TYPE_HOST: u8 = 0;

/// What the first bytes of a connection say about its TLS server name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hello {
    /// Not enough bytes yet: read more (the caller bounds how long and how many).
    NeedMore,
    /// A complete ClientHello, with its server name (lowercase, trailing dot dropped) if
    /// it has one.
    Sni(Option<String>),
    /// Starts like TLS but is not a well-formed ClientHello.
    Malformed,
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.buf.len() {
            return None;
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
    fn vec8(&mut self) -> Option<Reader<'a>> {
        let n = self.u8()? as usize;
        self.take(n).map(|buf| Reader { buf })
    }
    fn vec16(&mut self) -> Option<Reader<'a>> {
        let n = self.u16()? as usize;
        self.take(n).map(|buf| Reader { buf })
    }
}

/// Parses the first bytes a client sent (starting with the TLS record header).
pub fn parse_client_hello(bytes: &[u8]) -> Hello {
    // Reassemble the handshake message from consecutive handshake records.
    let mut message: Vec<u8> = Vec::new();
    let mut rest = bytes;
    loop {
        if let Some(needed) = message_len(&message) {
            if needed > MAX_CLIENT_HELLO_BYTES {
                return Hello::Malformed;
            }
            if message.len() >= needed + 4 {
                if message.len() > needed + 4 {
                    return Hello::Malformed; // a second message in the same flight
                }
                break;
            }
        }
        if rest.len() < 5 {
            return Hello::NeedMore;
        }
        let (kind, major, len) = (
            rest[0],
            rest[1],
            u16::from_be_bytes([rest[3], rest[4]]) as usize,
        );
        if kind != RECORD_HANDSHAKE || major != 3 || len == 0 || len > 16_384 + 2048 {
            return Hello::Malformed;
        }
        if rest.len() < 5 + len {
            return Hello::NeedMore;
        }
        message.extend_from_slice(&rest[5..5 + len]);
        rest = &rest[5 + len..];
    }
    match parse_message(&message) {
        Some(sni) => Hello::Sni(sni),
        None => Hello::Malformed,
    }
}

fn message_len(message: &[u8]) -> Option<usize> {
    (message.len() >= 4)
        .then(|| u32::from_be_bytes([0, message[1], message[2], message[3]]) as usize)
}

/// `None` when malformed; `Some(None)` when there is no server name.
fn parse_message(message: &[u8]) -> Option<Option<String>> {
    let mut r = Reader { buf: message };
    if r.u8()? != HANDSHAKE_CLIENT_HELLO {
        return None;
    }
    let body_len = r.take(3)?;
    let body_len = u32::from_be_bytes([0, body_len[0], body_len[1], body_len[2]]) as usize;
    let mut body = Reader {
        buf: r.take(body_len)?,
    };
    body.take(2 + 32)?; // legacy_version, random
    let session = body.vec8()?;
    if session.buf.len() > 32 {
        return None;
    }
    let suites = body.vec16()?;
    if suites.buf.is_empty() || suites.buf.len() % 2 != 0 {
        return None;
    }
    if body.vec8()?.buf.is_empty() {
        return None; // compression methods must list at least `null`
    }
    if body.buf.is_empty() {
        return Some(None); // no extensions at all
    }
    let mut exts = body.vec16()?;
    if !body.buf.is_empty() {
        return None;
    }
    let mut sni: Option<String> = None;
    let mut seen_sni = false;
    while !exts.buf.is_empty() {
        let kind = exts.u16()?;
        let mut data = exts.vec16()?;
        if kind != EXT_SERVER_NAME {
            continue;
        }
        if seen_sni {
            return None;
        }
        seen_sni = true;
        let mut list = data.vec16()?;
        if !data.buf.is_empty() || list.buf.is_empty() {
            return None;
        }
        while !list.buf.is_empty() {
            let name_type = list.u8()?;
            let name = list.vec16()?.buf;
            if name_type != NAME_TYPE_HOST {
                continue; // unknown name types are skipped, as RFC 6066 asks
            }
            if sni.is_some() || name.is_empty() || !name.iter().all(|b| b.is_ascii_graphic()) {
                return None;
            }
            let name = std::str::from_utf8(name).ok()?;
            let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
            sni = Some(name);
        }
    }
    Some(sni)
}

/// Builds a minimal, well-formed ClientHello record carrying `sni` (tests and tools).
pub fn client_hello_for_tests(sni: Option<&str>) -> Vec<u8> {
    let mut exts = Vec::new();
    // supported_versions (TLS 1.3), just to have a non-SNI extension first.
    exts.extend_from_slice(&[0x00, 0x2b, 0x00, 0x03, 0x02, 0x03, 0x04]);
    if let Some(name) = sni {
        let n = name.len() as u16;
        exts.extend_from_slice(&EXT_SERVER_NAME.to_be_bytes());
        exts.extend_from_slice(&(n + 5).to_be_bytes());
        exts.extend_from_slice(&(n + 3).to_be_bytes());
        exts.push(NAME_TYPE_HOST);
        exts.extend_from_slice(&n.to_be_bytes());
        exts.extend_from_slice(name.as_bytes());
    }
    let mut body = vec![0x03, 0x03];
    body.extend_from_slice(&[0x5a; 32]);
    body.push(0); // empty session id
    body.extend_from_slice(&[0x00, 0x02, 0x13, 0x01]); // TLS_AES_128_GCM_SHA256
    body.extend_from_slice(&[0x01, 0x00]); // compression: null
    body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
    body.extend_from_slice(&exts);
    let mut msg = vec![HANDSHAKE_CLIENT_HELLO];
    msg.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    msg.extend_from_slice(&body);
    let mut record = vec![RECORD_HANDSHAKE, 0x03, 0x01];
    record.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    record.extend_from_slice(&msg);
    record
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_sni_and_absence() {
        let hello = client_hello_for_tests(Some("Example.COM."));
        assert_eq!(
            parse_client_hello(&hello),
            Hello::Sni(Some("example.com".into()))
        );
        let none = client_hello_for_tests(None);
        assert_eq!(parse_client_hello(&none), Hello::Sni(None));
    }

    #[test]
    fn every_truncation_needs_more_or_is_malformed() {
        let hello = client_hello_for_tests(Some("example.com"));
        for cut in 0..hello.len() {
            assert_eq!(
                parse_client_hello(&hello[..cut]),
                Hello::NeedMore,
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn split_across_two_records() {
        let hello = client_hello_for_tests(Some("a.test"));
        let msg = &hello[5..];
        let mut two = vec![0x16, 3, 1, 0, 10];
        two.extend_from_slice(&msg[..10]);
        two.extend_from_slice(&[0x16, 3, 1]);
        two.extend_from_slice(&((msg.len() - 10) as u16).to_be_bytes());
        two.extend_from_slice(&msg[10..]);
        assert_eq!(parse_client_hello(&two), Hello::Sni(Some("a.test".into())));
    }

    #[test]
    fn garbage_is_malformed() {
        assert_eq!(parse_client_hello(&[0x16, 3, 1, 0, 0]), Hello::Malformed);
        assert_eq!(parse_client_hello(&[0x17, 3, 3, 0, 1, 0]), Hello::Malformed);
        assert_eq!(
            parse_client_hello(&[0x16, 3, 1, 0, 4, 2, 0, 0, 0]),
            Hello::Malformed
        );
        let mut hello = client_hello_for_tests(Some("a.test"));
        let last = hello.len() - 1;
        hello[last] = 0; // NUL in the name
        assert_eq!(parse_client_hello(&hello), Hello::Malformed);
        let mut long = client_hello_for_tests(Some("a.test"));
        long[6..9].copy_from_slice(&[0x01, 0x00, 0x00]); // claims a 64 KiB message
        assert_eq!(parse_client_hello(&long), Hello::Malformed);
        // Overrunning inner length: session id length 200 > 32.
        let mut bad = client_hello_for_tests(Some("a.test"));
        bad[5 + 4 + 34] = 200;
        assert_eq!(parse_client_hello(&bad), Hello::Malformed);
        // Pseudo-random bytes after a valid header never panic.
        let mut x: u32 = 12345;
        for _ in 0..2000 {
            let mut buf = vec![0x16, 3, 1, 0, 60];
            for _ in 0..60 {
                x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
                buf.push((x >> 16) as u8);
            }
            let _ = parse_client_hello(&buf);
        }
    }
}
