//! The pieces of the files section that need no daemon: the control socket's line
//! protocol as a runtime speaks it, base64 for `files_write`'s `data`, the fixtures'
//! contents and the watch's event lines.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

use anyhow::{Context, Result, ensure};

/// One connection to a daemon's control socket: request lines answered in order.
pub struct Conn {
    write: UnixStream,
    read: BufReader<UnixStream>,
    line: String,
}

impl Conn {
    pub fn connect(sock: &Path) -> Result<Self> {
        let s = UnixStream::connect(sock)
            .with_context(|| format!("connecting to {}", sock.display()))?;
        Ok(Self {
            read: BufReader::new(s.try_clone()?),
            write: s,
            line: String::new(),
        })
    }

    /// Sends one request line (`buf` is reused) and gives its result.
    pub fn request(
        &mut self,
        op: &str,
        args: serde_json::Value,
        buf: &mut Vec<u8>,
    ) -> Result<serde_json::Value> {
        buf.clear();
        serde_json::to_writer(&mut *buf, &serde_json::json!({"op": op, "args": args}))?;
        buf.push(b'\n');
        self.write.write_all(buf)?;
        self.line.clear();
        self.read.read_line(&mut self.line)?;
        let v: serde_json::Value = serde_json::from_str(&self.line)
            .with_context(|| format!("the daemon's reply to {op}: {:?}", self.line))?;
        ensure!(
            v["ok"] == true,
            "{op} through the control socket: {}",
            v["error"]
        );
        Ok(v["result"].clone())
    }
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding (RFC 4648), appended to `out`.
pub fn base64_into(data: &[u8], out: &mut String) {
    out.reserve(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        let idx = |shift: u32| B64[((n >> shift) & 63) as usize] as char;
        out.push(idx(18));
        out.push(idx(12));
        out.push(if c.len() > 1 { idx(6) } else { '=' });
        out.push(if c.len() > 2 { idx(0) } else { '=' });
    }
}

/// Deterministic, incompressible-looking bytes (xorshift64*), distinct per `stream`.
pub fn fill(buf: &mut [u8], stream: u64) {
    let mut x = stream.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for chunk in buf.chunks_mut(8) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        let v = x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
}

/// The path of a `created` or `modified` event line of `mountctl --json watch`.
pub fn event_path(line: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    match v["event"].as_str()? {
        "created" | "modified" => v["path"].as_str().map(str::to_string),
        _ => None,
    }
}

/// The number of regular files below `dir` and their total bytes (a copy's check).
pub fn count_tree(dir: &Path) -> Result<(u64, u64)> {
    let (mut files, mut bytes) = (0, 0);
    for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let e = e?;
        let t = e.file_type()?;
        if t.is_dir() {
            let (f, b) = count_tree(&e.path())?;
            files += f;
            bytes += b;
        } else if t.is_file() {
            files += 1;
            bytes += e.metadata()?.len();
        }
    }
    Ok((files, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &[u8]) -> String {
        let mut o = String::new();
        base64_into(s, &mut o);
        o
    }

    #[test]
    fn base64_matches_rfc4648_vectors() {
        assert_eq!(b64(b""), "");
        assert_eq!(b64(b"f"), "Zg==");
        assert_eq!(b64(b"fo"), "Zm8=");
        assert_eq!(b64(b"foo"), "Zm9v");
        assert_eq!(b64(b"foob"), "Zm9vYg==");
        assert_eq!(b64(b"fooba"), "Zm9vYmE=");
        assert_eq!(b64(b"foobar"), "Zm9vYmFy");
        assert_eq!(b64(&[0xff, 0xfe, 0x00]), "//4A");
        assert_eq!(b64(&[0u8; 4096]).len(), 5464);
    }

    #[test]
    fn fill_is_deterministic_and_differs_per_stream() {
        let (mut a, mut b, mut c) = ([0u8; 37], [0u8; 37], [0u8; 37]);
        fill(&mut a, 1);
        fill(&mut b, 1);
        fill(&mut c, 2);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.iter().any(|x| *x != 0));
    }

    #[test]
    fn only_created_and_modified_lines_name_a_path() {
        assert_eq!(
            event_path(r#"{"event":"created","path":"watch/r0-1"}"#).as_deref(),
            Some("watch/r0-1")
        );
        assert_eq!(
            event_path(r#"{"event":"modified","path":"a"}"#).as_deref(),
            Some("a")
        );
        assert_eq!(event_path(r#"{"event":"removed","path":"a"}"#), None);
        assert_eq!(event_path(r#"{"event":"rescan","path":"."}"#), None);
        assert_eq!(event_path("watching w:."), None);
    }

    #[test]
    fn count_tree_counts_nested_files() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("x")).unwrap();
        std::fs::write(d.path().join("a"), b"123").unwrap();
        std::fs::write(d.path().join("x/b"), b"45").unwrap();
        assert_eq!(count_tree(d.path()).unwrap(), (2, 5));
    }
}
