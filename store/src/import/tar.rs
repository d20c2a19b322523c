//! Import of a tar archive (`.tar`, `.tar.gz`/`.tgz`, `.tar.zst`/`.tzst`).
//!
//! The archive is read once, as a stream: the compression is recognised by its magic
//! bytes, every raw byte passes through a BLAKE3 tee (the snapshot records the digest
//! of the archive as read), and file contents go straight from the decoder into the
//! ingest pipeline. Entries are applied in archive order onto a [`Builder`], so a file
//! may come before its directory entry and a later duplicate replaces an earlier one,
//! as `tar -x` would.
//!
//! Every entry is checked before it is applied; the first unsafe one stops the import
//! with [`Error::UnsafeEntry`] naming it, and the session is dropped unfinished, which
//! removes its packs: nothing reaches the index. Refused: absolute paths, `..`
//! components, names our trees cannot hold, entries under a path that is a symlink in
//! the archive, hard links whose target is not an earlier regular file of the archive,
//! symlinks whose target is absolute or climbs out of the root (unless
//! [`ImportOptions::allow_external_symlinks`]), device nodes (unless
//! [`ImportOptions::allow_devices`]), pax-format sparse files and unknown entry types.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::import::builder::{Builder, Item, Slot};
use crate::import::exclude::Excluder;
use crate::import::{Finish, ImportOptions, ImportReport, Progress};
use crate::ingest::Ingest;
use crate::lock::StoreLock;
use crate::snapshot::Source;
use crate::store::Store;
use crate::tree::{self, Kind};
use crate::xattrs::recorded_xattr;

/// Bytes of read buffer between the archive file and the decoder.
const READ_BUFFER_BYTES: usize = 1 << 20;

/// How an archive is compressed, from its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Compression {
    None,
    Gzip,
    Zstd,
}

/// The names `import` reads as tar archives (anything else that is not a directory is
/// refused, never parsed as a tar): `.tar`, `.tar.gz` (`.tgz`), `.tar.zst`.
pub const TAR_SUFFIXES: [&str; 4] = [".tar", ".tar.gz", ".tgz", ".tar.zst"];

/// Whether `path`'s name is a tar archive's ([`TAR_SUFFIXES`]). The contents decide
/// the compression; the name only decides that the file is read as an archive at all.
pub fn has_tar_name(path: &Path) -> bool {
    let name = path
        .file_name()
        .map(|n| n.as_encoded_bytes())
        .unwrap_or_default();
    TAR_SUFFIXES
        .iter()
        .any(|s| name.len() > s.len() && name.ends_with(s.as_bytes()))
}

fn detect(magic: &[u8], archive: &Path) -> Result<Compression> {
    let unsupported = |what: &str| {
        Err(Error::Invalid(format!(
            "{} is {what}-compressed; a tar archive may be plain, gzip or zstd",
            archive.display()
        )))
    };
    if magic.starts_with(&[0x1f, 0x8b]) {
        Ok(Compression::Gzip)
    } else if magic.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Ok(Compression::Zstd)
    } else if magic.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0]) {
        unsupported("xz")
    } else if magic.starts_with(b"BZh") {
        unsupported("bzip2")
    } else {
        Ok(Compression::None)
    }
}

/// Hashes every byte read from the archive file.
struct Tee {
    file: File,
    hasher: blake3::Hasher,
}

impl Read for Tee {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// The decompressed archive stream.
enum Decoded {
    Plain(BufReader<Tee>),
    // (Boxed: zlib-rs's inflate state is some 2 KiB larger than the others.)
    Gzip(Box<flate2::read::MultiGzDecoder<BufReader<Tee>>>),
    Zstd(zstd::stream::read::Decoder<'static, BufReader<BufReader<Tee>>>),
}

impl Decoded {
    fn new(c: Compression, tee: Tee) -> io::Result<Decoded> {
        let raw = BufReader::with_capacity(READ_BUFFER_BYTES, tee);
        Ok(match c {
            Compression::None => Decoded::Plain(raw),
            Compression::Gzip => Decoded::Gzip(Box::new(flate2::read::MultiGzDecoder::new(raw))),
            Compression::Zstd => Decoded::Zstd(zstd::stream::read::Decoder::new(raw)?),
        })
    }

    /// Gives back the tee (bytes buffered above it were hashed when they were read).
    fn into_tee(self) -> Tee {
        match self {
            Decoded::Plain(r) => r.into_inner(),
            Decoded::Gzip(d) => d.into_inner().into_inner(),
            Decoded::Zstd(d) => d.finish().into_inner().into_inner(),
        }
    }
}

impl Read for Decoded {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Decoded::Plain(r) => r.read(buf),
            Decoded::Gzip(d) => d.read(buf),
            Decoded::Zstd(d) => d.read(buf),
        }
    }
}

/// The exclusion policy applied to paths that arrive in any order (tar entries, git
/// tree listings): every ancestor directory is checked, each decision is remembered,
/// and an excluded directory is counted once.
pub(crate) struct PathFilter<'a> {
    excluder: &'a Excluder,
    dirs: HashMap<Vec<u8>, bool>,
    pub excluded: u64,
}

impl<'a> PathFilter<'a> {
    pub fn new(excluder: &'a Excluder) -> PathFilter<'a> {
        PathFilter {
            excluder,
            dirs: HashMap::new(),
            excluded: 0,
        }
    }

    fn dir_excluded(&mut self, rel: &[u8], name: &[u8], count: bool) -> bool {
        if let Some(&x) = self.dirs.get(rel) {
            return x;
        }
        let x = self.excluder.excludes(rel, name, true);
        if count {
            self.dirs.insert(rel.to_vec(), x);
            if x {
                self.excluded += 1;
            }
        }
        x
    }

    fn check(&mut self, comps: &[Vec<u8>], is_dir: bool, count: bool) -> bool {
        let Some((last, parents)) = comps.split_last() else {
            return false;
        };
        let mut rel = Vec::new();
        for name in parents {
            if !rel.is_empty() {
                rel.push(b'/');
            }
            rel.extend_from_slice(name);
            if self.dir_excluded(&rel, name, count) {
                return true;
            }
        }
        if !rel.is_empty() {
            rel.push(b'/');
        }
        rel.extend_from_slice(last);
        if is_dir {
            self.dir_excluded(&rel, last, count)
        } else {
            let x = self.excluder.excludes(&rel, last, false);
            if x && count {
                self.excluded += 1;
            }
            x
        }
    }

    /// Whether the entry at `comps` is left out (counted when it is).
    pub fn excludes(&mut self, comps: &[Vec<u8>], is_dir: bool) -> bool {
        self.check(comps, is_dir, true)
    }

    /// Whether the entry at `comps` would be left out (nothing counted or remembered).
    pub fn would_exclude(&mut self, comps: &[Vec<u8>], is_dir: bool) -> bool {
        self.check(comps, is_dir, false)
    }
}

/// Splits an archive member name into checked components, or says why it is unsafe.
/// `.` components and repeated `/` are dropped; the empty result is the root.
pub(crate) fn split_member(path: &[u8]) -> std::result::Result<Vec<Vec<u8>>, String> {
    if path.first() == Some(&b'/') {
        return Err("the path is absolute".into());
    }
    let mut out = Vec::new();
    for c in path.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => return Err("the path has a `..` component".into()),
            _ => {
                if c.len() > tree::MAX_NAME_BYTES {
                    return Err(format!(
                        "a name is longer than {} bytes",
                        tree::MAX_NAME_BYTES
                    ));
                }
                if c.contains(&0) {
                    return Err("the path contains a NUL byte".into());
                }
                out.push(c.to_vec());
            }
        }
    }
    Ok(out)
}

/// Whether a symlink at `parent/…` pointing to `target` leaves the root when resolved
/// lexically (symlinks along the way are not followed; those are checked where they are).
fn symlink_escapes(parent: &[Vec<u8>], target: &[u8]) -> bool {
    if target.first() == Some(&b'/') {
        return true;
    }
    let mut depth = parent.len();
    for c in target.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => match depth.checked_sub(1) {
                Some(d) => depth = d,
                None => return true,
            },
            _ => depth += 1,
        }
    }
    false
}

pub(crate) fn display(path: &[u8]) -> String {
    String::from_utf8_lossy(path).into_owned()
}

/// An I/O error met while reading the archive stream: damage and truncation are bad
/// input, anything else an I/O failure.
pub(crate) fn read_error(archive: &Path, e: io::Error) -> Error {
    match e.kind() {
        io::ErrorKind::Other
        | io::ErrorKind::InvalidData
        | io::ErrorKind::InvalidInput
        | io::ErrorKind::UnexpectedEof => Error::Invalid(format!(
            "{} is not a readable tar archive (damaged or truncated?): {}",
            archive.display(),
            printable(&e.to_string())
        )),
        _ => Error::io("read archive", archive)(e),
    }
}

/// The most of a tar reader's message shown, in characters: it may quote a whole header.
const MAX_TAR_MESSAGE_CHARS: usize = 160;

/// `text` fit for a terminal: the tar reader quotes the header bytes it could not parse,
/// which in a file that is no archive are binary (control characters, invalid UTF-8).
/// Each run of those becomes one `?`, and the text is cut at [`MAX_TAR_MESSAGE_CHARS`].
fn printable(text: &str) -> String {
    let mut out = String::new();
    let mut shown = 0;
    for c in text.chars() {
        let bad = c.is_control() || c == char::REPLACEMENT_CHARACTER;
        if bad && out.ends_with('?') {
            continue;
        }
        if shown == MAX_TAR_MESSAGE_CHARS {
            out.push('…');
            break;
        }
        out.push(if bad { '?' } else { c });
        shown += 1;
    }
    out
}

/// The state of one tar import while entries are applied (also an image's, whose layers
/// are applied one after the other onto one builder: `crate::image::layer`).
pub(crate) struct TarImport<'o> {
    pub archive: &'o Path,
    pub archive_name: String,
    pub opts: &'o ImportOptions,
    pub builder: Builder,
    pub next_group: u64,
    /// Symlinks applied so far (a quick "is any parent a symlink?" skip when zero).
    pub symlinks: u64,
    pub files: u64,
    pub bytes: u64,
    pub warnings: Vec<String>,
    /// Leave device nodes out with a warning instead of refusing them (images: the
    /// sandbox has its own `/dev`, and the image root is mounted `nodev` anyway).
    pub drop_devices: bool,
}

impl TarImport<'_> {
    fn unsafe_entry(&self, entry: &[u8], why: impl Into<String>) -> Error {
        Error::UnsafeEntry {
            archive: self.archive_name.clone(),
            entry: display(entry),
            why: why.into(),
        }
    }

    fn read_all<R: Read>(
        &mut self,
        ar: &mut tar::Archive<R>,
        filter: &mut PathFilter<'_>,
        ingest: &mut Ingest<'_>,
    ) -> Result<()> {
        let entries = ar.entries().map_err(|e| read_error(self.archive, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| read_error(self.archive, e))?;
            self.entry(entry, filter, ingest)?;
        }
        Ok(())
    }

    pub(crate) fn entry<R: Read>(
        &mut self,
        mut entry: tar::Entry<'_, R>,
        filter: &mut PathFilter<'_>,
        ingest: &mut Ingest<'_>,
    ) -> Result<()> {
        use tar::EntryType as T;
        let name = entry.path_bytes().into_owned();
        let header_type = entry.header().entry_type();
        if header_type.is_pax_global_extensions() {
            return Ok(()); // archive-wide comments (git archive's commit id)
        }
        let comps = split_member(&name).map_err(|why| self.unsafe_entry(&name, why))?;

        // Pax records of this entry: xattrs to keep, sparse encodings to refuse.
        let mut xattrs: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        if let Some(pax) = entry
            .pax_extensions()
            .map_err(|e| read_error(self.archive, e))?
        {
            for ext in pax {
                let ext = ext.map_err(|e| read_error(self.archive, e))?;
                let key = ext.key_bytes();
                if key.starts_with(b"GNU.sparse.") {
                    return Err(self.unsafe_entry(
                        &name,
                        "a sparse file in pax format is not supported (re-create the archive without --sparse)",
                    ));
                }
                if let Some(x) = key.strip_prefix(b"SCHILY.xattr.")
                    && recorded_xattr(x)
                {
                    xattrs.retain(|(k, _)| k != x);
                    xattrs.push((x.to_vec(), ext.value_bytes().to_vec()));
                }
            }
        }
        xattrs.sort();
        if xattrs.len() > tree::MAX_XATTRS
            || xattrs.iter().any(|(k, v)| {
                k.len() > usize::from(u16::MAX) || v.len() > tree::MAX_XATTR_VALUE_BYTES
            })
        {
            return Err(self.unsafe_entry(&name, "too many or too large extended attributes"));
        }

        let mode = entry
            .header()
            .mode()
            .map_err(|e| read_error(self.archive, e))?
            & 0o7777;
        // Old archives mark directories as regular files with a trailing slash.
        let is_dir = header_type.is_dir() || (header_type.is_file() && name.last() == Some(&b'/'));

        if comps.is_empty() {
            if !is_dir {
                return Err(self.unsafe_entry(&name, "names the root but is not a directory"));
            }
            self.builder.set_root_mode(mode);
            return Ok(());
        }
        self.check_parents(&name, &comps)?;

        match header_type {
            _ if is_dir => {
                if filter.excludes(&comps, true) {
                    return Ok(());
                }
                self.insert(&name, &comps, Item::Dir { mode, xattrs })
            }
            T::Regular | T::Continuous | T::GNUSparse => {
                if filter.excludes(&comps, false) {
                    return Ok(());
                }
                let size = entry.size();
                let content = ingest.store_reader(&mut entry, size).map_err(|e| match e {
                    Error::Io { source, .. } => read_error(self.archive, source),
                    e => e,
                })?;
                if content.size != size {
                    return Err(Error::Invalid(format!(
                        "{}: entry {} holds {} bytes, its header says {size} (truncated archive?)",
                        self.archive.display(),
                        display(&name),
                        content.size
                    )));
                }
                self.files += 1;
                self.bytes += size;
                if let Some(p) = &self.opts.progress {
                    p(Progress {
                        files_done: self.files,
                        files_total: self.files,
                        bytes_done: self.bytes,
                    });
                }
                let item = Item::File {
                    mode,
                    content: Slot::Known(content),
                    link_group: None,
                    xattrs,
                };
                self.insert(&name, &comps, item)
            }
            T::Link => self.hard_link(&entry, &name, comps, filter),
            T::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .map(|t| t.into_owned())
                    .unwrap_or_default();
                if target.is_empty() || target.len() > tree::MAX_TARGET_BYTES || target.contains(&0) {
                    return Err(self.unsafe_entry(&name, "the symlink target is empty, too long or contains NUL"));
                }
                if !self.opts.allow_external_symlinks
                    && symlink_escapes(&comps[..comps.len() - 1], &target)
                {
                    return Err(self.unsafe_entry(
                        &name,
                        format!(
                            "symlink to {:?} points outside the archive root (allowed only with --allow-external-symlinks)",
                            display(&target)
                        ),
                    ));
                }
                if filter.excludes(&comps, false) {
                    return Ok(());
                }
                self.symlinks += 1;
                // Symlinks carry no xattrs, as in a directory import.
                let item = Item::Symlink {
                    target,
                    xattrs: vec![],
                    link_group: None,
                };
                self.insert(&name, &comps, item)
            }
            T::Fifo => {
                if filter.excludes(&comps, false) {
                    return Ok(());
                }
                let item = Item::Special {
                    kind: Kind::Fifo,
                    mode,
                    rdev: 0,
                };
                self.insert(&name, &comps, item)
            }
            T::Char | T::Block => {
                if self.drop_devices {
                    self.warnings.push(format!(
                        "{}: a device node, left out (the sandbox has its own /dev)",
                        display(&name)
                    ));
                    return Ok(());
                }
                if !self.opts.allow_devices {
                    return Err(self.unsafe_entry(
                        &name,
                        "a device node; devices are imported only when allowed (--allow-devices)",
                    ));
                }
                if filter.excludes(&comps, false) {
                    return Ok(());
                }
                let h = entry.header();
                let num = |r: io::Result<Option<u32>>| {
                    r.map(|n| n.unwrap_or(0))
                        .map_err(|e| read_error(self.archive, e))
                };
                let rdev = libc::makedev(num(h.device_major())?, num(h.device_minor())?);
                let kind = if header_type == T::Char {
                    Kind::CharDevice
                } else {
                    Kind::BlockDevice
                };
                let item = Item::Special { kind, mode, rdev };
                self.insert(&name, &comps, item)
            }
            other => Err(self.unsafe_entry(
                &name,
                format!(
                    "entry type {:?} ({}) cannot be stored (sockets, volume labels, multi-volume and dump-dir entries are refused)",
                    char::from(other.as_byte()),
                    type_word(other),
                ),
            )),
        }
    }

    fn insert(&mut self, name: &[u8], comps: &[Vec<u8>], item: Item) -> Result<()> {
        self.builder.insert(comps, item).map_err(|e| match e {
            Error::Invalid(why) => self.unsafe_entry(name, why),
            e => e,
        })
    }

    /// Refuses an entry below a path that is a symlink in the archive: `tar -x` would
    /// write through the link.
    pub(crate) fn check_parents(&self, name: &[u8], comps: &[Vec<u8>]) -> Result<()> {
        if self.symlinks == 0 {
            return Ok(());
        }
        for i in 1..comps.len() {
            if let Some(Item::Symlink { .. }) = self.builder.item_at(&comps[..i]) {
                return Err(self.unsafe_entry(
                    name,
                    format!(
                        "its parent {} is a symlink in this archive",
                        display(&comps[..i].join(&b'/'))
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The link group of the earlier entry at `target` (`group`), given one now when it
    /// has none: its first hard link makes it a group.
    fn link_group_of(&mut self, target: &[Vec<u8>], group: Option<u64>) -> u64 {
        if let Some(g) = group {
            return g;
        }
        let g = self.next_group;
        self.next_group += 1;
        self.builder.set_link_group(target, g);
        g
    }

    fn hard_link<R: Read>(
        &mut self,
        entry: &tar::Entry<'_, R>,
        name: &[u8],
        comps: Vec<Vec<u8>>,
        filter: &mut PathFilter<'_>,
    ) -> Result<()> {
        let target = entry
            .link_name_bytes()
            .map(|t| t.into_owned())
            .unwrap_or_default();
        let tcomps = split_member(&target).map_err(|why| {
            self.unsafe_entry(
                name,
                format!("hard link target {:?}: {why}", display(&target)),
            )
        })?;
        if tcomps.is_empty() || tcomps == comps {
            return Err(self.unsafe_entry(name, "hard link to the root or to itself"));
        }
        if filter.would_exclude(&tcomps, false) {
            if !filter.excludes(&comps, false) {
                filter.excluded += 1;
                self.warnings.push(format!(
                    "{}: hard link to {} left out: its target is excluded",
                    display(name),
                    display(&target)
                ));
            }
            return Ok(());
        }
        if let Some(Item::Symlink {
            target, link_group, ..
        }) = self.builder.item_at(&tcomps)
        {
            // A hard link to a symlink: one more name of the symlink itself.
            if filter.excludes(&comps, false) {
                return Ok(());
            }
            let (target, group) = (target.clone(), *link_group);
            let group = self.link_group_of(&tcomps, group);
            let item = Item::Symlink {
                target,
                xattrs: vec![],
                link_group: Some(group),
            };
            return self.insert(name, &comps, item);
        }
        let Some((mode, content, group)) = self.builder.file_at(&tcomps) else {
            return Err(self.unsafe_entry(
                name,
                format!(
                    "hard link target {:?} is not an earlier regular file or symlink of the archive",
                    display(&target)
                ),
            ));
        };
        if filter.excludes(&comps, false) {
            return Ok(());
        }
        let xattrs = match self.builder.item_at(&tcomps) {
            Some(Item::File { xattrs, .. }) => xattrs.clone(),
            _ => vec![],
        };
        let group = self.link_group_of(&tcomps, group);
        // One inode: the link shares the target's mode and xattrs.
        let item = Item::File {
            mode,
            content,
            link_group: Some(group),
            xattrs,
        };
        self.insert(name, &comps, item)
    }
}

fn type_word(t: tar::EntryType) -> &'static str {
    match t.as_byte() {
        b'V' => "volume label",
        b'M' => "multi-volume continuation",
        b'D' => "GNU dump dir",
        b'N' => "GNU old long name",
        _ => "unknown",
    }
}

impl Store {
    /// Imports a tar archive (plain, gzip or zstd, recognised by its first bytes) as a
    /// new snapshot. An unsafe entry refuses the whole archive before anything is stored.
    pub fn import_tar(&self, archive: &Path, opts: &ImportOptions) -> Result<ImportReport> {
        let started = Instant::now();
        let file = match File::open(archive) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(Error::SourceMissing(archive.to_path_buf()));
            }
            Err(e) => return Err(Error::io("open archive", archive)(e)),
        };
        let meta = file.metadata().map_err(Error::io("stat", archive))?;
        if meta.is_dir() {
            return Err(Error::Invalid(format!(
                "{} is a directory, not a tar archive",
                archive.display()
            )));
        }
        let abs = std::fs::canonicalize(archive).map_err(Error::io("resolve", archive))?;
        if let Some(name) = &opts.ref_name {
            crate::refs::check_ref_name(name)?;
        }
        let excluder = Excluder::new(opts.default_excludes, &opts.excludes)?;
        let mut magic = [0u8; 6];
        let n = file
            .read_at(&mut magic, 0)
            .map_err(Error::io("read archive", archive))?;
        let compression = detect(&magic[..n], archive)?;
        let tee = Tee {
            file,
            hasher: blake3::Hasher::new(),
        };
        let decoded = Decoded::new(compression, tee).map_err(|e| read_error(archive, e))?;

        let _lock = StoreLock::shared(self)?;
        // What interrupted imports stored is found stored, not compressed again.
        let resumed = self.adopt_orphans()?;
        // Dropped unfinished on any error below: the session's packs are removed.
        let mut ingest = Ingest::start(self)?;
        let mut state = TarImport {
            archive,
            archive_name: abs.display().to_string(),
            opts,
            builder: Builder::new(0o755),
            next_group: 0,
            symlinks: 0,
            files: 0,
            bytes: 0,
            warnings: Vec::new(),
            drop_devices: false,
        };
        let mut filter = PathFilter::new(&excluder);
        let mut ar = tar::Archive::new(decoded);
        state.read_all(&mut ar, &mut filter, &mut ingest)?;
        // The digest covers the whole file, trailing padding included.
        let mut tee = ar.into_inner().into_tee();
        io::copy(&mut tee, &mut io::sink()).map_err(Error::io("read archive", archive))?;
        let digest = tee.hasher.finalize().to_hex().to_string();

        let finish = Finish {
            builder: state.builder,
            slots: Vec::new(),
            source: Source::Tar {
                path: abs.display().to_string(),
                digest,
            },
            policy: excluder.policy().clone(),
            excluded: filter.excluded,
            files_read: state.files,
            warnings: state.warnings,
            started,
            opts,
            git_fsmonitor: None,
            resumed,
        };
        finish.run(self, ingest, |_| Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_in_a_tar_readers_message_is_not_echoed() {
        let m = printable("bad field: \u{fffd}\u{1b}[2J\u{fffd}\u{7} for x");
        assert_eq!(m, "bad field: ?[2J? for x");
        assert!(printable(&"a".repeat(1000)).chars().count() <= MAX_TAR_MESSAGE_CHARS + 1);
        assert_eq!(
            printable("failed to read entire block"),
            "failed to read entire block"
        );
    }

    fn c(s: &str) -> Vec<Vec<u8>> {
        split_member(s.as_bytes()).unwrap()
    }

    #[test]
    fn member_names() {
        assert_eq!(
            c("./a//b/./c/"),
            vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]
        );
        assert!(c("./").is_empty());
        assert!(split_member(b"/etc/passwd").is_err());
        assert!(split_member(b"a/../../b").is_err());
        assert!(split_member(b"..").is_err());
        assert!(split_member(&[b'a'; 256]).is_err());
    }

    #[test]
    fn lexical_symlink_resolution() {
        assert!(!symlink_escapes(&c("a/b"), b"../../x"));
        assert!(symlink_escapes(&c("a/b"), b"../../../x"));
        assert!(!symlink_escapes(&[], b"./x/../y"));
        assert!(symlink_escapes(&[], b".."));
        assert!(symlink_escapes(&c("a"), b"/etc"));
        assert!(!symlink_escapes(&c("a"), b"b/c/../../.."));
        assert!(symlink_escapes(&c("a"), b"b/../../.."));
    }

    #[test]
    fn magic_bytes() {
        let p = Path::new("x");
        assert_eq!(detect(&[0x1f, 0x8b, 8], p).unwrap(), Compression::Gzip);
        assert_eq!(
            detect(&[0x28, 0xb5, 0x2f, 0xfd], p).unwrap(),
            Compression::Zstd
        );
        assert_eq!(detect(b"abc", p).unwrap(), Compression::None);
        assert!(detect(b"BZh91", p).is_err());
    }
}
