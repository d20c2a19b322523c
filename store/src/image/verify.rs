//! Checking blobs against the digests and sizes that name them, while they stream.
//!
//! OCI names every blob by `sha256:HEX` and declares its size. [`Verified`] hashes the
//! bytes as they are read, refuses a byte past the declared size at once (a lying
//! source cannot make us read more than it declared), and at the end of the stream
//! compares size and digest. A failure is kept in a shared [`Verdict`] as well as
//! returned as an I/O error: readers above (the decompressor, the tar reader) turn I/O
//! errors into their own messages, and the import reports the verdict instead.

use std::cell::RefCell;
use std::io::{self, Read};
use std::rc::Rc;

use sha2::{Digest as _, Sha256};

use crate::error::{Error, Result};

/// The one digest algorithm accepted (the only one registries and tools produce).
pub const SHA256_PREFIX: &str = "sha256:";

/// Checks that `digest` is `sha256:` and 64 lowercase hex digits.
pub fn check_digest(digest: &str) -> Result<()> {
    let ok = digest.strip_prefix(SHA256_PREFIX).is_some_and(|h| {
        h.len() == 64
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    });
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "{digest:?} is not a sha256 digest (sha256: and 64 lowercase hex digits)"
        )))
    }
}

/// `sha256:HEX` of `bytes`.
pub fn sha256_of(bytes: &[u8]) -> String {
    format!("{SHA256_PREFIX}{}", hex::encode(Sha256::digest(bytes)))
}

/// Checks a blob held in memory (a manifest, an index, a config) against its descriptor.
pub fn check_bytes(what: &str, bytes: &[u8], digest: &str, size: u64) -> Result<()> {
    if bytes.len() as u64 != size {
        return Err(Error::corrupt(
            "image blob",
            digest,
            format!(
                "{what} has {} bytes, its descriptor says {size}",
                bytes.len()
            ),
        ));
    }
    let found = sha256_of(bytes);
    if found != digest {
        return Err(Error::corrupt(
            "image blob",
            digest,
            format!("{what} hashes to {found}"),
        ));
    }
    Ok(())
}

/// The first failure met by a [`Verified`] or [`Hashing`] reader, shared with the import.
pub type Verdict = Rc<RefCell<Option<Error>>>;

/// Records `e` unless an earlier failure is recorded, and gives an I/O error to return.
fn fail(verdict: &Verdict, e: Error) -> io::Error {
    let msg = e.to_string();
    verdict.borrow_mut().get_or_insert(e);
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// A blob stream checked against its digest and declared size.
pub struct Verified<R> {
    inner: R,
    hasher: Sha256,
    seen: u64,
    size: u64,
    digest: String,
    what: String,
    verdict: Verdict,
    done: bool,
}

impl<R: Read> Verified<R> {
    pub fn new(inner: R, digest: &str, size: u64, what: String, verdict: Verdict) -> Self {
        Verified {
            inner,
            hasher: Sha256::new(),
            seen: 0,
            size,
            digest: digest.to_string(),
            what,
            verdict,
            done: false,
        }
    }

    /// Bytes read so far.
    pub fn seen(&self) -> u64 {
        self.seen
    }

    fn end(&mut self) -> io::Result<()> {
        if self.done {
            return Ok(());
        }
        self.done = true;
        if self.seen != self.size {
            return Err(fail(
                &self.verdict,
                Error::corrupt(
                    "image blob",
                    &self.digest,
                    format!(
                        "{} ended after {} bytes, its descriptor says {} (truncated?)",
                        self.what, self.seen, self.size
                    ),
                ),
            ));
        }
        let found = format!(
            "{SHA256_PREFIX}{}",
            hex::encode(std::mem::take(&mut self.hasher).finalize())
        );
        if found != self.digest {
            return Err(fail(
                &self.verdict,
                Error::corrupt(
                    "image blob",
                    &self.digest,
                    format!("{} hashes to {found}: it is not the blob named", self.what),
                ),
            ));
        }
        Ok(())
    }
}

impl<R: Read> Read for Verified<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        // One byte more than declared is asked for, so an overlong blob is seen.
        let room = (self.size - self.seen.min(self.size)).saturating_add(1);
        let want = buf.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        if n == 0 {
            self.end()?;
            return Ok(0);
        }
        self.seen += n as u64;
        if self.seen > self.size {
            self.done = true;
            return Err(fail(
                &self.verdict,
                Error::corrupt(
                    "image blob",
                    &self.digest,
                    format!(
                        "{} is longer than the {} bytes its descriptor declares",
                        self.what, self.size
                    ),
                ),
            ));
        }
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// Hashes an uncompressed layer stream (its "diff id") as it is read.
pub struct Hashing<R> {
    pub inner: R,
    hasher: Sha256,
}

impl<R: Read> Hashing<R> {
    pub fn new(inner: R) -> Self {
        Hashing {
            inner,
            hasher: Sha256::new(),
        }
    }

    /// `sha256:HEX` of everything read.
    pub fn finish(self) -> (R, String) {
        let hex = hex::encode(self.hasher.finalize());
        (self.inner, format!("{SHA256_PREFIX}{hex}"))
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(data: &[u8], digest: &str, size: u64) -> (io::Result<Vec<u8>>, Option<Error>) {
        let verdict = Verdict::default();
        let mut v = Verified::new(data, digest, size, "blob".into(), verdict.clone());
        let mut out = Vec::new();
        let r = v.read_to_end(&mut out).map(|_| out);
        let e = verdict.borrow_mut().take();
        (r, e)
    }

    #[test]
    fn streaming_digest_equals_one_shot() {
        let data = vec![7u8; 100_000];
        let d = sha256_of(&data);
        let (r, e) = read_all(&data, &d, data.len() as u64);
        assert_eq!(r.unwrap(), data);
        assert!(e.is_none());
    }

    #[test]
    fn wrong_digest_short_and_long_blobs_are_refused() {
        let data = b"hello".to_vec();
        let d = sha256_of(&data);
        let other = sha256_of(b"other");
        for (digest, size) in [(&other, 5), (&d, 4), (&d, 6)] {
            let (r, e) = read_all(&data, digest, size);
            assert!(r.is_err(), "{digest} {size}");
            assert_eq!(e.unwrap().kind(), crate::ErrorKind::Corrupt);
        }
    }

    #[test]
    fn digest_syntax() {
        assert!(check_digest(&sha256_of(b"")).is_ok());
        assert!(check_digest("sha512:00").is_err());
        assert!(check_digest(&format!("sha256:{}", "A".repeat(64))).is_err());
        assert!(check_digest("sha256:../../etc/passwd").is_err());
    }
}
