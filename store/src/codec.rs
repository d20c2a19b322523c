//! Compression of object bytes and the manifest encoding of multi-chunk files.

use crate::error::{Error, Result};
use crate::id::{ChunkId, ContentId};
use crate::pack::Codec;

/// Files up to this size are one chunk; larger files are cut by FastCDC.
pub const SINGLE_CHUNK_MAX_BYTES: u64 = 256 * 1024;
/// FastCDC sizes (the 2020 algorithm): minimum, average, maximum chunk.
pub const CDC_MIN_BYTES: u32 = 16 * 1024;
pub const CDC_AVG_BYTES: u32 = 64 * 1024;
pub const CDC_MAX_BYTES: u32 = 256 * 1024;
/// Largest object the store accepts (a chunk, a tree or a manifest).
pub const MAX_OBJECT_BYTES: usize = 64 * 1024 * 1024;
/// Default zstd level (fast, good ratio on source code).
pub const DEFAULT_ZSTD_LEVEL: i32 = 3;

/// Compresses with zstd, keeping the raw bytes (without a copy) when compression does
/// not pay.
pub fn compress(compressor: &mut zstd::bulk::Compressor<'_>, data: Vec<u8>) -> (Codec, Vec<u8>) {
    if data.len() < 64 {
        return (Codec::Raw, data);
    }
    match compressor.compress(&data) {
        Ok(c) if c.len() + c.len() / 32 < data.len() => (Codec::Zstd, c),
        _ => (Codec::Raw, data),
    }
}

thread_local! {
    /// A compression context per thread and level, for compression outside the ingest
    /// pipeline (a group member given to a remote on its own, repack's groups).
    static COMPRESSOR: std::cell::RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> =
        const { std::cell::RefCell::new(None) };
}

/// Runs `f` with this thread's compression context for `level` (made at its first use).
pub fn with_compressor<T>(
    level: i32,
    f: impl FnOnce(&mut zstd::bulk::Compressor<'static>) -> T,
) -> Result<T> {
    COMPRESSOR.with(|c| {
        let mut c = c.borrow_mut();
        let made = match c.take() {
            Some((l, z)) if l == level => z,
            _ => zstd::bulk::Compressor::new(level).map_err(|e| Error::Io {
                step: "start zstd",
                path: std::path::PathBuf::new(),
                source: e,
            })?,
        };
        Ok(f(&mut c.insert((level, made)).1))
    })
}

thread_local! {
    /// A decompression context per thread, made at its first use: making one costs more
    /// than decompressing a small tree (each read of an object made one before).
    static DECOMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { std::cell::RefCell::new(None) };
}

/// Reverses [`compress`], checking the length.
pub fn decompress(codec: Codec, stored: Vec<u8>, raw_len: usize, what: &str) -> Result<Vec<u8>> {
    let out = match codec {
        Codec::Raw => stored,
        // Its bytes are a whole group's: read through `crate::group`.
        Codec::Part => {
            return Err(Error::corrupt(
                "object",
                what,
                "a group member's bytes were read as a whole object",
            ));
        }
        Codec::Zstd => DECOMPRESSOR
            .with(|d| match &mut *d.borrow_mut() {
                Some(d) => d.decompress(&stored, raw_len),
                slot => {
                    let mut d = zstd::bulk::Decompressor::new()?;
                    let out = d.decompress(&stored, raw_len);
                    *slot = Some(d);
                    out
                }
            })
            .map_err(|e| Error::corrupt("object", what, format!("zstd: {e}")))?,
    };
    if out.len() != raw_len {
        return Err(Error::corrupt(
            "object",
            what,
            format!(
                "{} bytes after decompression, index says {raw_len}",
                out.len()
            ),
        ));
    }
    Ok(out)
}

/// The chunks of a file larger than one chunk, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub size: u64,
    pub chunks: Vec<(ChunkId, u32)>,
}

const MANIFEST_MAGIC: &[u8; 6] = b"CWMANI";
const MANIFEST_VERSION: u8 = 1;

impl Manifest {
    /// `"CWMANI" u8:version u64:size u32:count ([32]:chunk u32:len)*count`
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(19 + self.chunks.len() * 36);
        out.extend_from_slice(MANIFEST_MAGIC);
        out.push(MANIFEST_VERSION);
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&(self.chunks.len() as u32).to_le_bytes());
        for (id, len) in &self.chunks {
            out.extend_from_slice(id.as_bytes());
            out.extend_from_slice(&len.to_le_bytes());
        }
        out
    }

    pub fn decode(id: &ContentId, bytes: &[u8]) -> Result<Manifest> {
        let bad = |why: &str| Error::corrupt("manifest", id, why);
        let mut r = crate::tree::Reader::new(bytes);
        let header = (|| Ok::<_, String>((r.array::<6>()?, r.u8()?, r.u64()?, r.u32()?)))();
        let Ok((magic, version, size, count)) = header else {
            return Err(bad("bad header"));
        };
        if &magic != MANIFEST_MAGIC || version != MANIFEST_VERSION {
            return Err(bad("bad header"));
        }
        let count = count as usize;
        if bytes.len() != 19 + count * 36 {
            return Err(bad("length does not match the chunk count"));
        }
        let mut chunks = Vec::with_capacity(count);
        let mut total = 0u64;
        for rec in bytes[19..].chunks_exact(36) {
            let cid = ChunkId::from_slice(&rec[..32])?;
            let len = u32::from_le_bytes([rec[32], rec[33], rec[34], rec[35]]);
            total += u64::from(len);
            chunks.push((cid, len));
        }
        if total != size {
            return Err(bad("chunk lengths do not add up to the size"));
        }
        Ok(Manifest { size, chunks })
    }
}
