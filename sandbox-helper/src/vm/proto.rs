//! The frame protocol between a VM's keeper (the host) and the guest agent, over one
//! virtio-serial port (`cowspace.agent`). Standard library only: the guest agent
//! (`guest/agent.rs`, a static binary in the initramfs) compiles this same file.
//!
//! Every frame is a 9-byte header, then its payload:
//!
//! | bytes | field |
//! | --- | --- |
//! | 0..4 | stream id, u32 little-endian (0: the VM itself; one per exec otherwise) |
//! | 4 | kind ([`kind`]) |
//! | 5..9 | payload length, u32 little-endian, at most [`MAX_PAYLOAD_BYTES`] |
//!
//! Integers in payloads are little-endian. Output and stdin are flow-controlled with
//! credits, so one exec whose reader stalls never stalls the port for the others: the
//! sender of a data stream has [`WINDOW_BYTES`] of credit per exec to begin with and
//! sends no more data than it holds; the receiver gives credit back with `WINDOW` once
//! it has written the bytes on.

use std::io::{self, Read, Write};

/// Largest payload of one frame (an exec request is the largest).
pub const MAX_PAYLOAD_BYTES: usize = 320 * 1024;
/// Largest data payload a sender puts in one frame.
pub const MAX_DATA_BYTES: usize = 32 * 1024;
/// Credit, in bytes, that each direction of an exec's data starts with.
pub const WINDOW_BYTES: u64 = 256 * 1024;
/// Header length.
pub const HEADER_BYTES: usize = 9;

/// Frame kinds.
pub mod kind {
    /// guest → host, stream 0, once: the agent runs (payload: the guest kernel's
    /// release, UTF-8).
    pub const READY: u8 = 1;
    /// host → guest: start an exec on a new stream (payload: [`super::ExecMsg`]).
    pub const EXEC: u8 = 2;
    /// guest → host: the exec started (payload: i32 pid in the guest).
    pub const STARTED: u8 = 3;
    /// guest → host: the exec did not start (payload: i32 errno, u8 what: 0 the
    /// command, 1 the working directory, 2 the request).
    pub const FAILED: u8 = 4;
    /// host → guest: bytes for the exec's stdin.
    pub const STDIN: u8 = 5;
    /// host → guest: the exec's stdin ends.
    pub const STDIN_EOF: u8 = 6;
    /// guest → host: bytes the exec wrote to stdout.
    pub const STDOUT: u8 = 7;
    /// guest → host: bytes the exec wrote to stderr.
    pub const STDERR: u8 = 8;
    /// guest → host: the exec ended (payload: i32 status, 128 + N when killed by
    /// signal N), sent after all of its output. Later output of processes it left
    /// behind is dropped by the guest.
    pub const EXIT: u8 = 9;
    /// host → guest: send signal N (i32) to the exec's process.
    pub const SIGNAL: u8 = 10;
    /// Either way: u32 more bytes of credit for the exec's data in the other direction
    /// (host → guest: its stdout and stderr; guest → host: its stdin).
    pub const WINDOW: u8 = 11;
    /// host → guest, stream 0: sync and unmount the workspace, answer `BYE`, power off.
    pub const SHUTDOWN: u8 = 12;
    /// guest → host, stream 0: the workspace is synced and unmounted.
    pub const BYE: u8 = 13;
    /// host → guest, stream 0, before any exec: bytes appended to the secret file
    /// `/run/secrets/NAME` (payload: u32 name length, the name, the bytes).
    pub const SECRET: u8 = 14;
    /// host → guest, stream 0, after the secrets: `/run/secrets` becomes read-only.
    pub const SEAL_SECRETS: u8 = 15;
    /// host → guest, stream 0, before any exec: mount the virtio-fs tag read-only at
    /// the path (payload: two strings, tag then path).
    pub const MOUNT_RO: u8 = 16;
    /// host → guest: the terminal of an exec started with a pseudo-terminal has a new
    /// size (payload: u16 rows, u16 columns).
    pub const RESIZE: u8 = 17;
    /// host → guest, stream 0, before any exec, `--net egress` only: listen on the
    /// guest's 127.0.0.1 for the egress proxy (payload: u16 HTTP port, u16 SOCKS port,
    /// u16 DNS port) and make `/etc/resolv.conf` name it; each connection accepted there
    /// is a guest stream ([`super::GUEST_STREAM_BASE`] and up) relayed to the host's
    /// proxy (`netrelay.rs`).
    pub const NET_EGRESS: u8 = 18;
    /// guest → host, a new guest stream: a connection was accepted on the guest's port
    /// (payload: u16 port).
    pub const NET_OPEN: u8 = 19;
    /// Either way: bytes of a guest stream, within the credit the other side gave
    /// (`WINDOW` gives it back, as for an exec).
    pub const NET_DATA: u8 = 20;
    /// Either way: the sender's side of a guest stream ends (a half-close).
    pub const NET_EOF: u8 = 21;
    /// Either way: a guest stream is gone (refused, reset, or the protocol broken).
    pub const NET_CLOSE: u8 = 22;
    /// guest → host: a DNS query received on the guest's resolver port (the stream is
    /// the query's id); host → guest: the resolver's answer, on the same id.
    pub const NET_DGRAM: u8 = 23;
}

/// Stream ids the guest chooses (its network streams and DNS queries) are this and
/// above; the host's execs use ids below it.
pub const GUEST_STREAM_BASE: u32 = 0x8000_0000;

/// A `NET_EGRESS` payload.
pub fn egress_payload(http: u16, socks: u16, dns: u16) -> Vec<u8> {
    [http, socks, dns]
        .iter()
        .flat_map(|p| p.to_le_bytes())
        .collect()
}

/// The (HTTP, SOCKS, DNS) ports of a `NET_EGRESS` payload.
pub fn parse_egress(b: &[u8]) -> Option<(u16, u16, u16)> {
    let b: [u8; 6] = b.try_into().ok()?;
    Some((
        u16::from_le_bytes([b[0], b[1]]),
        u16::from_le_bytes([b[2], b[3]]),
        u16::from_le_bytes([b[4], b[5]]),
    ))
}

/// One frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Stream id.
    pub stream: u32,
    /// Kind ([`kind`]).
    pub kind: u8,
    /// Payload.
    pub payload: Vec<u8>,
}

impl Frame {
    /// A frame of `kind` on `stream`.
    pub fn new(stream: u32, kind: u8, payload: Vec<u8>) -> Frame {
        Frame {
            stream,
            kind,
            payload,
        }
    }

    /// A frame whose payload is one i32.
    pub fn int(stream: u32, kind: u8, v: i32) -> Frame {
        Frame::new(stream, kind, v.to_le_bytes().to_vec())
    }

    /// The payload's first four bytes as an i32.
    pub fn as_i32(&self) -> Option<i32> {
        Some(i32::from_le_bytes(self.payload.get(..4)?.try_into().ok()?))
    }

    /// Header and payload as one buffer (written with one `write_all`).
    pub fn encode(&self) -> Vec<u8> {
        assert!(self.payload.len() <= MAX_PAYLOAD_BYTES, "frame too long");
        let mut b = Vec::with_capacity(HEADER_BYTES + self.payload.len());
        b.extend_from_slice(&self.stream.to_le_bytes());
        b.push(self.kind);
        b.extend_from_slice(&(self.payload.len() as u32).to_le_bytes());
        b.extend_from_slice(&self.payload);
        b
    }

    /// Writes the frame.
    pub fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
        w.write_all(&self.encode())?;
        w.flush()
    }

    /// Reads one frame; `Ok(None)` at a clean end of the channel (before a header).
    pub fn read_from(r: &mut impl Read) -> io::Result<Option<Frame>> {
        let mut h = [0u8; HEADER_BYTES];
        let mut got = 0;
        while got < HEADER_BYTES {
            match r.read(&mut h[got..]) {
                Ok(0) if got == 0 => return Ok(None),
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        let stream = u32::from_le_bytes(h[0..4].try_into().expect("4 bytes"));
        let len = u32::from_le_bytes(h[5..9].try_into().expect("4 bytes")) as usize;
        if len > MAX_PAYLOAD_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("frame of {len} bytes, more than {MAX_PAYLOAD_BYTES}"),
            ));
        }
        let mut payload = vec![0u8; len];
        r.read_exact(&mut payload)?;
        Ok(Some(Frame {
            stream,
            kind: h[4],
            payload,
        }))
    }
}

/// An exec request as the guest gets it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecMsg {
    /// The command and its arguments.
    pub argv: Vec<String>,
    /// The whole environment of the command.
    pub env: Vec<(String, String)>,
    /// The working directory.
    pub workdir: String,
    /// A pseudo-terminal of this size (rows, columns) as the command's stdin, stdout
    /// and stderr, instead of three pipes; its output all comes as `STDOUT`.
    pub tty: Option<(u16, u16)>,
}

/// A `RESIZE` payload.
pub fn size_payload(rows: u16, cols: u16) -> Vec<u8> {
    let mut b = rows.to_le_bytes().to_vec();
    b.extend_from_slice(&cols.to_le_bytes());
    b
}

/// The (rows, columns) of a `RESIZE` payload.
pub fn parse_size(b: &[u8]) -> Option<(u16, u16)> {
    let b: [u8; 4] = b.try_into().ok()?;
    Some((
        u16::from_le_bytes([b[0], b[1]]),
        u16::from_le_bytes([b[2], b[3]]),
    ))
}

fn put(b: &mut Vec<u8>, s: &str) {
    b.extend_from_slice(&(s.len() as u32).to_le_bytes());
    b.extend_from_slice(s.as_bytes());
}

struct Cursor<'a>(&'a [u8]);

impl Cursor<'_> {
    fn u32(&mut self) -> Option<u32> {
        let (h, t) = self.0.split_at_checked(4)?;
        self.0 = t;
        Some(u32::from_le_bytes(h.try_into().ok()?))
    }
    fn str(&mut self) -> Option<String> {
        let n = self.u32()? as usize;
        let (h, t) = self.0.split_at_checked(n)?;
        self.0 = t;
        String::from_utf8(h.to_vec()).ok()
    }
}

/// A `SECRET` payload: a piece of file `name`'s contents.
pub fn secret_payload(name: &str, bytes: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(4 + name.len() + bytes.len());
    put(&mut b, name);
    b.extend_from_slice(bytes);
    b
}

/// A `MOUNT_RO` payload.
pub fn mount_payload(tag: &str, target: &str) -> Vec<u8> {
    let mut b = Vec::new();
    put(&mut b, tag);
    put(&mut b, target);
    b
}

/// The tag and target of a `MOUNT_RO` payload.
pub fn parse_mount(b: &[u8]) -> Option<(String, String)> {
    let mut c = Cursor(b);
    let r = (c.str()?, c.str()?);
    c.0.is_empty().then_some(r)
}

/// The name and bytes of a `SECRET` payload.
pub fn parse_secret(b: &[u8]) -> Option<(String, &[u8])> {
    let mut c = Cursor(b);
    let name = c.str()?;
    Some((name, c.0))
}

impl ExecMsg {
    /// `u32 argc, argv…, u32 envc, (key, value)…, workdir`, each string a u32 length and
    /// its UTF-8 bytes; then, for a pseudo-terminal only, its size as a `RESIZE` payload.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&(self.argv.len() as u32).to_le_bytes());
        for a in &self.argv {
            put(&mut b, a);
        }
        b.extend_from_slice(&(self.env.len() as u32).to_le_bytes());
        for (k, v) in &self.env {
            put(&mut b, k);
            put(&mut b, v);
        }
        put(&mut b, &self.workdir);
        if let Some((rows, cols)) = self.tty {
            b.extend_from_slice(&size_payload(rows, cols));
        }
        b
    }

    /// The inverse of [`ExecMsg::encode`]; `None` for anything malformed or with bytes
    /// left over.
    pub fn decode(b: &[u8]) -> Option<ExecMsg> {
        let mut c = Cursor(b);
        let argc = c.u32()? as usize;
        if argc > b.len() / 4 {
            return None;
        }
        let argv = (0..argc).map(|_| c.str()).collect::<Option<Vec<_>>>()?;
        let envc = c.u32()? as usize;
        if envc > b.len() / 8 {
            return None;
        }
        let env = (0..envc)
            .map(|_| Some((c.str()?, c.str()?)))
            .collect::<Option<Vec<_>>>()?;
        let workdir = c.str()?;
        let tty = match c.0 {
            [] => None,
            rest => Some(parse_size(rest)?),
        };
        Some(ExecMsg {
            argv,
            env,
            workdir,
            tty,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_back_to_back() {
        let frames = [
            Frame::new(0, kind::READY, b"6.1.0".to_vec()),
            Frame::int(7, kind::EXIT, 130),
            Frame::new(u32::MAX, kind::STDOUT, vec![0, 255, 10]),
            Frame::new(3, kind::STDIN_EOF, Vec::new()),
        ];
        let mut wire = Vec::new();
        for f in &frames {
            f.write_to(&mut wire).unwrap();
        }
        let mut r = &wire[..];
        for f in &frames {
            assert_eq!(Frame::read_from(&mut r).unwrap().as_ref(), Some(f));
        }
        assert_eq!(Frame::read_from(&mut r).unwrap(), None);
        assert_eq!(frames[1].as_i32(), Some(130));
    }

    #[test]
    fn a_cut_or_oversized_frame_is_an_error() {
        let wire = Frame::new(1, kind::STDOUT, b"hello".to_vec()).encode();
        assert!(Frame::read_from(&mut &wire[..wire.len() - 1]).is_err());
        assert!(Frame::read_from(&mut &wire[..4]).is_err());
        let mut big = wire.clone();
        big[5..9].copy_from_slice(&((MAX_PAYLOAD_BYTES as u32) + 1).to_le_bytes());
        assert!(Frame::read_from(&mut &big[..]).is_err());
    }

    #[test]
    fn secret_payloads_round_trip() {
        let p = secret_payload("api-token", b"s3\0cr3t");
        assert_eq!(
            parse_secret(&p),
            Some(("api-token".into(), &b"s3\0cr3t"[..]))
        );
        assert_eq!(parse_secret(&p[..3]), None);
        let m = mount_payload("ro0", "/cache");
        assert_eq!(parse_mount(&m), Some(("ro0".into(), "/cache".into())));
        assert_eq!(parse_mount(&m[..m.len() - 1]), None);
    }

    #[test]
    fn exec_messages_round_trip_and_reject_garbage() {
        let m = ExecMsg {
            argv: vec!["sh".into(), "-c".into(), "echo 'x' \0?".into()],
            env: vec![("A".into(), "it's".into()), ("EMPTY".into(), String::new())],
            workdir: "/workspace/d".into(),
            tty: None,
        };
        let b = m.encode();
        assert_eq!(ExecMsg::decode(&b).as_ref(), Some(&m));
        assert_eq!(ExecMsg::decode(&b[..b.len() - 1]), None);
        let mut extra = b.clone();
        extra.push(0);
        assert_eq!(ExecMsg::decode(&extra), None);
        assert_eq!(ExecMsg::decode(&[255, 255, 255, 255]), None);
        let t = ExecMsg {
            tty: Some((24, 80)),
            ..m
        };
        let b = t.encode();
        assert_eq!(ExecMsg::decode(&b), Some(t));
        assert_eq!(ExecMsg::decode(&b[..b.len() - 1]), None);
        assert_eq!(parse_size(&size_payload(50, 132)), Some((50, 132)));
        assert_eq!(parse_size(&[1, 2, 3]), None);
    }
}
