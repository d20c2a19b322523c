//! The copy-up record: which blocks of a lazily copied file are done, as the xattr
//! [`super::COPYUP_XATTR`] holds it (the layout is in `lazy/mod.rs`).

use std::io;

use cowspace_store::ContentId;

/// The smallest block (1 MiB): what a write into a block not yet copied waits for.
pub const BLOCK_MIN_SHIFT: u8 = 20;
/// The record's bitmap stays under this size (fits one xattr block on every local
/// filesystem); larger files get larger blocks.
pub const MAX_BITMAP_BYTES: u64 = 2048;
/// The record's version byte.
pub const RECORD_VERSION: u8 = 1;
/// Byte offset of the bitmap in the record.
const HEADER_BYTES: usize = 42;

/// A copy-up in progress, as recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub content: ContentId,
    pub size: u64,
    pub shift: u8,
    pub done: Vec<u8>,
}

fn blocks_of(size: u64, shift: u8) -> u64 {
    size.div_ceil(1u64 << shift)
}

impl Record {
    /// A record with no block done, for `size` bytes of `content`.
    pub fn new(content: ContentId, size: u64) -> Record {
        let mut shift = BLOCK_MIN_SHIFT;
        while blocks_of(size, shift) > MAX_BITMAP_BYTES * 8 {
            shift += 1;
        }
        Record {
            content,
            size,
            shift,
            done: vec![0; blocks_of(size, shift).div_ceil(8) as usize],
        }
    }

    pub fn block_bytes(&self) -> u64 {
        1u64 << self.shift
    }

    pub fn blocks(&self) -> u64 {
        blocks_of(self.size, self.shift)
    }

    pub fn is_done(&self, i: u64) -> bool {
        self.done[(i / 8) as usize] & (1 << (i % 8)) != 0
    }

    pub fn set_done(&mut self, i: u64) {
        self.done[(i / 8) as usize] |= 1 << (i % 8);
    }

    /// Blocks not done.
    pub fn left(&self) -> u64 {
        self.blocks()
            - self
                .done
                .iter()
                .map(|b| u64::from(b.count_ones()))
                .sum::<u64>()
    }

    /// The blocks holding bytes `[off, off + len)` of the content (none past its end).
    pub fn blocks_over(&self, off: u64, len: u64) -> std::ops::Range<u64> {
        let end = off.saturating_add(len).min(self.size);
        if len == 0 || off >= end {
            return 0..0;
        }
        (off >> self.shift)..end.div_ceil(self.block_bytes())
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(HEADER_BYTES + self.done.len());
        v.push(RECORD_VERSION);
        v.extend_from_slice(self.content.as_bytes());
        v.extend_from_slice(&self.size.to_le_bytes());
        v.push(self.shift);
        v.extend_from_slice(&self.done);
        v
    }

    /// Decodes a record, refusing anything [`Record::encode`] would not write.
    pub fn decode(b: &[u8]) -> io::Result<Record> {
        let bad = |why: &str| {
            io::Error::new(io::ErrorKind::InvalidData, format!("copy-up record: {why}"))
        };
        // The header's fields as arrays: a short header does not split.
        let Some((&[version], rest)) = b.split_first_chunk::<1>() else {
            return Err(bad("unknown version or short header"));
        };
        let Some((content, rest)) = rest.split_first_chunk::<32>() else {
            return Err(bad("unknown version or short header"));
        };
        let Some((size, rest)) = rest.split_first_chunk::<8>() else {
            return Err(bad("unknown version or short header"));
        };
        let Some(&shift) = rest.first() else {
            return Err(bad("unknown version or short header"));
        };
        if version != RECORD_VERSION {
            return Err(bad("unknown version or short header"));
        }
        let content = ContentId::from_bytes(*content);
        let size = u64::from_le_bytes(*size);
        let want = Record::new(content, size);
        if shift != want.shift || b.len() != HEADER_BYTES + want.done.len() {
            return Err(bad("block size or bitmap length does not match the size"));
        }
        let rec = Record {
            content,
            size,
            shift,
            done: b[HEADER_BYTES..].to_vec(),
        };
        let blocks = rec.blocks();
        if (blocks..rec.done.len() as u64 * 8).any(|i| rec.is_done(i)) {
            return Err(bad("bits set past the last block"));
        }
        Ok(rec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    fn content() -> ContentId {
        ContentId::from_bytes([7; 32])
    }

    #[test]
    fn records_round_trip_and_strange_ones_are_refused() {
        let mut r = Record::new(content(), 5 * MIB as u64 + 3);
        assert_eq!(r.blocks(), 6);
        assert_eq!(r.left(), 6);
        r.set_done(0);
        r.set_done(5);
        assert_eq!(Record::decode(&r.encode()).unwrap(), r);
        assert_eq!(r.left(), 4);
        assert_eq!(r.blocks_over(MIB as u64 - 1, 2), 0..2);
        assert_eq!(r.blocks_over(6 * MIB as u64, 10), 0..0);
        let mut bad = r.encode();
        *bad.last_mut().unwrap() |= 0x80;
        assert!(Record::decode(&bad).is_err(), "a bit past the last block");
        assert!(Record::decode(&r.encode()[..HEADER_BYTES]).is_err());
        // Huge files get larger blocks so the bitmap stays small.
        let big = Record::new(content(), 1 << 40);
        assert!(big.done.len() as u64 <= MAX_BITMAP_BYTES);
        assert!(big.shift > BLOCK_MIN_SHIFT);
    }
}
