//! Streaming a file's content out of the store, verified chunk by chunk.

use std::io::{self, Read};

use crate::error::{Error, Result};
use crate::id::{ChunkId, ContentId};
use crate::store::Store;

/// Reads a file's content chunk by chunk. Every chunk is checked against its id, and for
/// multi-chunk files the whole against the content id at the end; a mismatch is an
/// `InvalidData` I/O error whose message names the object (see [`Error::Corrupt`]).
pub struct ContentReader<'s> {
    store: &'s Store,
    id: ContentId,
    chunks: std::vec::IntoIter<(ChunkId, u32)>,
    buf: Vec<u8>,
    pos: usize,
    whole: Option<blake3::Hasher>,
    done: bool,
}

impl Store {
    /// A reader over a file's content.
    pub fn content_reader(&self, id: &ContentId) -> Result<ContentReader<'_>> {
        let chunks = self.content_chunks(id)?;
        self.prefetch(&chunks)?;
        let whole = (chunks.len() > 1).then(blake3::Hasher::new);
        Ok(ContentReader {
            store: self,
            id: *id,
            chunks: chunks.into_iter(),
            buf: Vec::new(),
            pos: 0,
            whole,
            done: false,
        })
    }
}

fn to_io(e: Error) -> io::Error {
    let kind = match e.kind() {
        crate::ErrorKind::Corrupt => io::ErrorKind::InvalidData,
        crate::ErrorKind::NotFound => io::ErrorKind::NotFound,
        _ => io::ErrorKind::Other,
    };
    io::Error::new(kind, e)
}

impl Read for ContentReader<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.buf.len() {
            if self.done {
                return Ok(0);
            }
            match self.chunks.next() {
                Some((cid, len)) => {
                    let data = self.store.chunk(&cid).map_err(to_io)?;
                    if data.len() != len as usize {
                        return Err(to_io(Error::corrupt(
                            "manifest",
                            self.id,
                            "chunk length differs",
                        )));
                    }
                    if let Some(h) = self.whole.as_mut() {
                        h.update(&data);
                    }
                    self.buf = data;
                    self.pos = 0;
                }
                None => {
                    self.done = true;
                    if let Some(h) = self.whole.take()
                        && h.finalize().as_bytes() != self.id.as_bytes()
                    {
                        return Err(to_io(Error::corrupt(
                            "content",
                            self.id,
                            "the chunks do not hash to the content id",
                        )));
                    }
                }
            }
        }
        let n = out.len().min(self.buf.len() - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// Turns an I/O error from a [`ContentReader`] back into the store's error.
pub fn from_io(e: io::Error, path: &std::path::Path) -> Error {
    if e.kind() == io::ErrorKind::InvalidData
        && let Some(inner) = e.get_ref().and_then(|i| i.downcast_ref::<Error>())
        && let Error::Corrupt { what, id, why } = inner
    {
        return Error::Corrupt {
            what,
            id: id.clone(),
            why: why.clone(),
        };
    }
    Error::Io {
        step: "copy content to",
        path: path.to_path_buf(),
        source: e,
    }
}
