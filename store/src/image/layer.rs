//! Applying one image layer (a tar stream, plain, gzip or zstd) onto the image's tree.
//!
//! Every entry goes through the tar import's checks ([`TarImport::entry`]): absolute
//! paths, `..`, entries under a symlink, hard links to anything but an earlier file of
//! the image are refused. On top of that, OCI whiteouts: `DIR/.wh.NAME` removes `NAME`
//! as the layers below left it, `DIR/.wh..wh..opq` empties `DIR` of what the layers
//! below put there. A whiteout hides only lower layers' entries: what this layer itself
//! puts at a path (before or after the whiteout in the stream) is kept, so the set of
//! paths this layer touched is tracked while it streams.

use std::collections::HashSet;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;

use crate::error::Result;
use crate::image::verify::Hashing;
use crate::import::tar::{PathFilter, TarImport, display, read_error, split_member};
use crate::ingest::Ingest;

/// Bytes of read buffer between a layer's stream and its decompressor.
const READ_BUFFER_BYTES: usize = 1 << 20;
/// The whiteout prefix, and the name marking an opaque directory.
const WHITEOUT_PREFIX: &[u8] = b".wh.";
const OPAQUE_MARKER: &[u8] = b".wh..wh..opq";
/// Other `.wh..wh.` names are aufs bookkeeping, not paths: left out.
const AUFS_META_PREFIX: &[u8] = b".wh..wh.";

/// A layer's decompressed stream (the compression is recognised by its first bytes, as
/// registries do not always label it right).
enum Decoder<R: Read> {
    Plain(BufReader<R>),
    Gzip(Box<flate2::read::MultiGzDecoder<BufReader<R>>>),
    Zstd(zstd::stream::read::Decoder<'static, BufReader<BufReader<R>>>),
}

impl<R: Read> Decoder<R> {
    fn new(raw: R) -> io::Result<Decoder<R>> {
        let mut raw = BufReader::with_capacity(READ_BUFFER_BYTES, raw);
        let magic = raw.fill_buf()?;
        Ok(if magic.starts_with(&[0x1f, 0x8b]) {
            Decoder::Gzip(Box::new(flate2::read::MultiGzDecoder::new(raw)))
        } else if magic.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            Decoder::Zstd(zstd::stream::read::Decoder::with_buffer(BufReader::new(
                raw,
            ))?)
        } else {
            Decoder::Plain(raw)
        })
    }

    fn into_raw(self) -> BufReader<R> {
        match self {
            Decoder::Plain(r) => r,
            Decoder::Gzip(d) => d.into_inner(),
            Decoder::Zstd(d) => d.finish().into_inner(),
        }
    }
}

impl<R: Read> Read for Decoder<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Decoder::Plain(r) => r.read(buf),
            Decoder::Gzip(d) => d.read(buf),
            Decoder::Zstd(d) => d.read(buf),
        }
    }
}

/// Applies the layer streamed by `raw` onto `state`'s builder; returns the layer's diff
/// id (the sha256 of its uncompressed tar). `raw` is read to its end, so a checking
/// reader below sees the whole blob.
pub(crate) fn apply<R: Read>(
    state: &mut TarImport<'_>,
    raw: R,
    filter: &mut PathFilter<'_>,
    ingest: &mut Ingest<'_>,
) -> Result<String> {
    let archive: &Path = state.archive;
    let decoder = Decoder::new(raw).map_err(|e| read_error(archive, e))?;
    let mut ar = tar::Archive::new(Hashing::new(decoder));
    let mut touched: HashSet<Vec<u8>> = HashSet::new();
    {
        let entries = ar.entries().map_err(|e| read_error(archive, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| read_error(archive, e))?;
            let name = entry.path_bytes().into_owned();
            if entry.header().entry_type().is_pax_global_extensions() {
                continue;
            }
            let comps = split_member(&name).map_err(|why| unsafe_entry(state, &name, why))?;
            if let Some((last, parents)) = comps.split_last()
                && last.starts_with(WHITEOUT_PREFIX)
            {
                whiteout(state, &name, &comps, (last, parents), &touched)?;
                continue;
            }
            let mut p = Vec::new();
            for c in &comps {
                if !p.is_empty() {
                    p.push(b'/');
                }
                p.extend_from_slice(c);
                touched.insert(p.clone());
            }
            state.entry(entry, filter, ingest)?;
        }
    }
    // The rest of the stream: the tar's padding, the compressed stream's tail.
    let mut hashing = ar.into_inner();
    io::copy(&mut hashing, &mut io::sink()).map_err(|e| read_error(archive, e))?;
    let (decoder, diff_id) = hashing.finish();
    io::copy(&mut decoder.into_raw(), &mut io::sink()).map_err(|e| read_error(archive, e))?;
    Ok(diff_id)
}

fn unsafe_entry(state: &TarImport<'_>, name: &[u8], why: impl Into<String>) -> crate::Error {
    crate::Error::UnsafeEntry {
        archive: state.archive_name.clone(),
        entry: display(name),
        why: why.into(),
    }
}

/// Applies the whiteout entry `name` (its checked components `comps`, split into the
/// last and its parents).
fn whiteout(
    state: &mut TarImport<'_>,
    name: &[u8],
    comps: &[Vec<u8>],
    (last, parents): (&Vec<u8>, &[Vec<u8>]),
    touched: &HashSet<Vec<u8>>,
) -> Result<()> {
    state.check_parents(name, comps)?;
    let is_touched = |p: &[u8]| touched.contains(p);
    if last.as_slice() == OPAQUE_MARKER {
        state.builder.remove_lower(parents, false, &is_touched);
        return Ok(());
    }
    if last.starts_with(AUFS_META_PREFIX) {
        state
            .warnings
            .push(format!("{}: aufs metadata, left out", display(name)));
        return Ok(());
    }
    let target = &last[WHITEOUT_PREFIX.len()..];
    if target.is_empty() || target == b"." || target == b".." {
        return Err(unsafe_entry(
            state,
            name,
            "a whiteout that names no entry of its own directory (escapes it)",
        ));
    }
    crate::tree::check_name(target)
        .map_err(|e| unsafe_entry(state, name, format!("whiteout of an invalid name: {e}")))?;
    let mut path = parents.to_vec();
    path.push(target.to_vec());
    state.builder.remove_lower(&path, true, &is_touched);
    Ok(())
}
