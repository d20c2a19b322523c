//! Git loose objects, read without the `git` program: a loose object is one
//! zlib-compressed file, `objects/xx/yyyy…`, holding `<type> <size>\0` then the bytes.
//!
//! A git import reads the blobs that are loose this way on every ingest worker (inflate,
//! hash and compress in one pass, on all cores) instead of through one `git cat-file`
//! process, which inflates them all on one core. Everything else (packed objects,
//! alternates, symlink targets) still comes from `git cat-file --batch`. Written here
//! rather than taken from a git library (gix) because the format is this one header
//! line and a zlib stream, which `flate2` already reads; packs, which are the hard part,
//! stay with git itself.
//!
//! What is checked, as `git cat-file` checks it: the type is `blob`, the bytes are
//! exactly the size the header gives, and the zlib stream ends there with a good
//! checksum. (Neither git nor this recomputes the object's SHA-1 on reading.)

use std::collections::{BTreeMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use flate2::read::ZlibDecoder;

use crate::error::{Error, Result};

/// Longest header accepted (`blob <size>`, the size in decimal).
const MAX_HEADER_BYTES: usize = 32;

/// The fan-out directory of the loose object `oid` (hex) under the object directory
/// `objects`, and the object's name in it.
pub(crate) fn path_of<'a>(objects: &Path, oid: &'a str) -> Option<(PathBuf, &'a str)> {
    if oid.len() < 3 || !oid.is_char_boundary(2) {
        return None;
    }
    let (fan, rest) = oid.split_at(2);
    Some((objects.join(fan), rest))
}

/// A loose object found: which of the ids asked about, its fan-out directory (open, for
/// `openat`), its name there and its whole path (for errors).
pub(crate) struct Found {
    pub index: usize,
    pub dir: Arc<File>,
    pub name: OsString,
    pub path: PathBuf,
}

/// Which of `oids` are loose under `objects`: one directory listing per fan-out
/// directory asked about, not one `stat` per object. A directory that cannot be read
/// holds none (those objects are asked of `git cat-file`, which says why if it fails).
pub(crate) fn find<'a>(objects: &Path, oids: impl Iterator<Item = (usize, &'a str)>) -> Vec<Found> {
    let mut by_fan: BTreeMap<PathBuf, Vec<(usize, &str)>> = BTreeMap::new();
    for (i, oid) in oids {
        if let Some((fan, rest)) = path_of(objects, oid) {
            by_fan.entry(fan).or_default().push((i, rest));
        }
    }
    let mut out = Vec::new();
    for (fan, wanted) in by_fan {
        let Ok(rd) = std::fs::read_dir(&fan) else {
            continue;
        };
        let names: HashSet<OsString> = rd.filter_map(|e| Some(e.ok()?.file_name())).collect();
        if !wanted.iter().any(|(_, n)| names.contains(OsStr::new(n))) {
            continue;
        }
        let Ok(dir) = File::open(&fan) else {
            continue;
        };
        let dir = Arc::new(dir);
        for (index, name) in wanted {
            if names.contains(OsStr::new(name)) {
                out.push(Found {
                    index,
                    dir: dir.clone(),
                    name: name.into(),
                    path: fan.join(name),
                });
            }
        }
    }
    out
}

/// The blob held by one loose object, read as a stream of exactly its bytes.
pub(crate) struct Blob {
    path: PathBuf,
    inner: io::Take<ZlibDecoder<File>>,
    size: u64,
}

/// The error of a loose object that is not a well-formed blob.
pub(crate) fn corrupt(path: &Path, why: String) -> Error {
    Error::Git {
        step: "read loose object",
        repo: path.to_path_buf(),
        why,
    }
}

impl Blob {
    /// Reads the header of the loose object open as `file` (`path` names it in errors).
    pub fn open(file: File, path: &Path) -> Result<Blob> {
        let mut z = ZlibDecoder::new(file);
        let mut header = Vec::with_capacity(MAX_HEADER_BYTES);
        let mut byte = [0u8; 1];
        loop {
            let n = z
                .read(&mut byte)
                .map_err(|e| corrupt(path, format!("not a zlib stream: {e}")))?;
            if n == 0 {
                return Err(corrupt(path, "ends inside its header".into()));
            }
            if byte[0] == 0 {
                break;
            }
            if header.len() == MAX_HEADER_BYTES {
                return Err(corrupt(path, "header too long".into()));
            }
            header.push(byte[0]);
        }
        let size = match header.strip_prefix(b"blob ") {
            Some(digits)
                if !digits.is_empty()
                    && digits.iter().all(u8::is_ascii_digit)
                    && (digits.len() == 1 || digits[0] != b'0') =>
            {
                std::str::from_utf8(digits)
                    .ok()
                    .and_then(|d| d.parse::<u64>().ok())
                    .ok_or_else(|| corrupt(path, "size out of range".into()))?
            }
            _ => {
                return Err(corrupt(
                    path,
                    format!(
                        "unexpected header {:?} (a blob was expected)",
                        String::from_utf8_lossy(&header)
                    ),
                ));
            }
        };
        Ok(Blob {
            path: path.to_path_buf(),
            inner: z.take(size),
            size,
        })
    }

    /// The blob's size, as its header says.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Checks that `got` bytes were all the header promised and that the stream ends
    /// right after them, its checksum verified.
    pub fn finish(mut self, got: u64) -> Result<()> {
        if got != self.size {
            return Err(corrupt(
                &self.path,
                format!("ended after {got} of {} bytes", self.size),
            ));
        }
        let mut rest = [0u8; 1];
        match self.inner.get_mut().read(&mut rest) {
            Ok(0) => Ok(()),
            Ok(_) => Err(corrupt(
                &self.path,
                format!("longer than the {} bytes its header says", self.size),
            )),
            Err(e) => Err(corrupt(&self.path, format!("bad zlib stream end: {e}"))),
        }
    }
}

impl Read for Blob {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("corrupt loose object {}: {e}", self.path.display()),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::{Compression, write::ZlibEncoder};
    use std::io::Write;

    fn object(raw: &[u8]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("obj");
        let mut z = ZlibEncoder::new(Vec::new(), Compression::default());
        z.write_all(raw).unwrap();
        std::fs::write(&path, z.finish().unwrap()).unwrap();
        (dir, path)
    }

    fn read(path: &Path) -> Result<Vec<u8>> {
        let mut b = Blob::open(File::open(path).unwrap(), path)?;
        let mut out = Vec::new();
        b.read_to_end(&mut out).map_err(Error::io("read", path))?;
        b.finish(out.len() as u64)?;
        Ok(out)
    }

    #[test]
    fn a_blob_reads_as_its_bytes_and_anything_else_is_refused() {
        let (_d, p) = object(b"blob 5\0hello");
        assert_eq!(read(&p).unwrap(), b"hello");
        let (_d, p) = object(b"blob 0\0");
        assert_eq!(read(&p).unwrap(), b"");
        for bad in [
            &b"tree 5\0hello"[..],
            b"blob 6\0hello",
            b"blob 4\0hello",
            b"blob 05\0hello",
            b"blob \0",
            b"blob 5hello",
            b"blob 99999999999999999999999\0",
        ] {
            let (_d, p) = object(bad);
            let e = read(&p).unwrap_err();
            assert!(matches!(e, Error::Git { .. }), "{bad:?}: {e}");
        }
        // A flipped byte in the stream: the checksum (or the inflate) fails.
        let (_d, p) = object(b"blob 11\0hello world");
        let mut raw = std::fs::read(&p).unwrap();
        let at = raw.len() - 6;
        raw[at] ^= 0x40;
        std::fs::write(&p, raw).unwrap();
        assert!(read(&p).is_err());
    }

    #[test]
    fn paths_split_the_id_as_git_does() {
        let (dir, rest) = path_of(Path::new("/o"), "ab12cd").unwrap();
        assert_eq!((dir, rest), (PathBuf::from("/o/ab"), "12cd"));
        assert!(path_of(Path::new("/o"), "ab").is_none());
    }
}
