//! Pack files and the backend seam every pack byte goes through.
//!
//! A pack is written once, front to back, then sealed (fsync'ed) and never modified:
//!
//! ```text
//! pack    := "CWSPACK1" record*
//! record  := u8:kind u8:codec u16:0 u32:stored_len u32:raw_len [32]:id stored_bytes
//! ```
//!
//! A record of kind [`GROUP_KIND`] holds several small chunks compressed together (see
//! [`crate::group`]); each of them has an index row of codec [`Codec::Part`].
//!
//! A pack only counts once a committed index transaction names it; a pack file that no
//! transaction names (a crash before the commit) is an orphan that `gc` removes and
//! `fsck` reports. Object locations in the index point at `stored_bytes`.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// The first bytes of every pack.
pub const PACK_MAGIC: &[u8; 8] = b"CWSPACK1";
/// Bytes of a record header.
pub const RECORD_HEADER_BYTES: u64 = 44;
/// A writer starts a new pack once the current one holds this much.
pub const MAX_PACK_BYTES: u64 = 256 * 1024 * 1024;

/// A pack's name: 16 hex digits, unique per write.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PackId(String);

impl std::fmt::Debug for PackId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackId({})", self.0)
    }
}

impl std::fmt::Display for PackId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl PackId {
    /// A fresh, unique pack id.
    pub fn generate() -> PackId {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let mut h = blake3::Hasher::new();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        h.update(&now.to_le_bytes());
        h.update(&std::process::id().to_le_bytes());
        h.update(&COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
        PackId(hex::encode(&h.finalize().as_bytes()[..8]))
    }

    /// Parses a pack name as stored in the index or on disk.
    pub fn parse(s: &str) -> Option<PackId> {
        (s.len() == 16
            && s.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()))
        .then(|| PackId(s.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The record kind of a group: small chunks compressed together in one zstd frame
/// ([`crate::group`]). No index row has this kind: each member's row is a chunk's.
pub const GROUP_KIND: u8 = 5;

/// How object bytes are stored in a pack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    Raw = 0,
    Zstd = 1,
    /// A member of a group record (index rows only): `offset` and `stored_len` are the
    /// group's, the member is `raw_len` bytes at `part` in the group's raw bytes.
    Part = 2,
}

impl Codec {
    pub fn from_u8(b: u8) -> Option<Codec> {
        match b {
            0 => Some(Codec::Raw),
            1 => Some(Codec::Zstd),
            2 => Some(Codec::Part),
            _ => None,
        }
    }
}

/// A pack being written. Its writer holds it (see [`PackBackend::claim_orphan`]) from
/// its creation until the sink and the [`PackHold`] it turns into are dropped.
pub trait PackSink: Send {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()>;
    /// Makes everything written durable.
    fn sync(&mut self) -> io::Result<()>;
    /// Ends the writing, keeping the hold (the writer keeps it until its commit ended).
    fn into_hold(self: Box<Self>) -> Box<dyn PackHold> {
        Box::new(NoHold)
    }
}

/// The hold of a pack: while it lives, no other session adopts the pack.
pub trait PackHold: Send {
    /// Makes the pack's bytes durable (an adopter's, before the index names them).
    fn sync(&self) -> io::Result<()>;
}

/// The hold of a backend that has none.
struct NoHold;

impl PackHold for NoHold {
    fn sync(&self) -> io::Result<()> {
        Ok(())
    }
}

/// Where packs live. The store does all pack I/O through this seam, so tests can inject
/// faults and a remote object store can stand in for local files later.
pub trait PackBackend: Send + Sync {
    fn create(&self, pack: &PackId) -> io::Result<Box<dyn PackSink>>;
    fn read_at(&self, pack: &PackId, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    fn len(&self, pack: &PackId) -> io::Result<u64>;
    fn remove(&self, pack: &PackId) -> io::Result<()>;
    /// Every pack present, committed or not.
    fn list(&self) -> io::Result<Vec<PackId>>;
    /// Makes creations and removals of packs durable.
    fn sync_dir(&self) -> io::Result<()>;
    /// A human-readable location, for messages.
    fn location(&self, pack: &PackId) -> String;
    /// Takes the hold of a pack no writer holds any more (its writer ended without
    /// committing it: killed), so its complete records can be adopted; `None` while a
    /// writer holds it, or where the backend cannot tell (then nothing is adopted).
    fn claim_orphan(&self, _pack: &PackId) -> io::Result<Option<Box<dyn PackHold>>> {
        Ok(None)
    }
    /// Removes what writers killed while creating a pack left (before it had a name
    /// [`PackBackend::list`] shows); called by gc, with no writer running. How many.
    fn remove_unnamed(&self) -> io::Result<u64> {
        Ok(0)
    }
}

/// Packs as files in one local directory, read with positioned reads.
pub struct LocalPacks {
    dir: PathBuf,
    open: Mutex<HashMap<PackId, std::sync::Arc<File>>>,
}

/// Open pack files kept for reading; beyond this the table is cleared.
const MAX_OPEN_PACKS: usize = 256;

impl LocalPacks {
    pub fn new(dir: impl Into<PathBuf>) -> LocalPacks {
        LocalPacks {
            dir: dir.into(),
            open: Mutex::new(HashMap::new()),
        }
    }

    fn path(&self, pack: &PackId) -> PathBuf {
        self.dir.join(format!("{}.pack", pack.0))
    }

    fn file(&self, pack: &PackId) -> io::Result<std::sync::Arc<File>> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = open.get(pack) {
            return Ok(f.clone());
        }
        if open.len() >= MAX_OPEN_PACKS {
            open.clear();
        }
        // A pack opened for the first time may be where a gc or repack of another
        // process moved objects: the packs it deleted are let go, so their space is
        // freed (an open descriptor keeps a deleted file's blocks).
        open.retain(|_, f| {
            use std::os::unix::fs::MetadataExt;
            f.metadata().is_ok_and(|m| m.nlink() > 0)
        });
        let f = std::sync::Arc::new(File::open(self.path(pack))?);
        open.insert(pack.clone(), f.clone());
        Ok(f)
    }
}

/// Pack bytes written after which the kernel is asked to start writing them to disk, so
/// the fsync at the end of the session finds little left to wait for (the disk works
/// while the import still hashes and compresses).
const WRITEBACK_KICK_BYTES: u64 = 8 * 1024 * 1024;

struct LocalSink {
    file: io::BufWriter<File>,
    /// Bytes written, and how many of them writeback was started for.
    written: u64,
    kicked: u64,
}

impl PackSink for LocalSink {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.file.write_all(buf)?;
        self.written += buf.len() as u64;
        if self.written - self.kicked >= WRITEBACK_KICK_BYTES {
            self.file.flush()?;
            // On Linux, POSIX_FADV_DONTNEED starts writeback of the range's dirty pages
            // without waiting for it (like `sync_file_range(SYNC_FILE_RANGE_WRITE)`);
            // pages still dirty or under writeback stay cached. Only a hint: durability
            // still comes from `sync`.
            let _ = nix::fcntl::posix_fadvise(
                self.file.get_ref(),
                self.kicked as libc::off_t,
                (self.written - self.kicked) as libc::off_t,
                nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
            );
            self.kicked = self.written;
        }
        Ok(())
    }
    fn sync(&mut self) -> io::Result<()> {
        self.file.flush()?;
        self.file.get_ref().sync_all()
    }
    fn into_hold(self: Box<Self>) -> Box<dyn PackHold> {
        match self.file.into_inner() {
            Ok(f) => Box::new(FileHold(f)),
            // Unflushed bytes: the pack is not sealed, so nothing commits it; the lock
            // goes with the file.
            Err(e) => Box::new(FileHold(e.into_parts().1.into_parts().0)),
        }
    }
}

/// A pack file held by an exclusive `flock` on one of its descriptors.
struct FileHold(File);

impl PackHold for FileHold {
    fn sync(&self) -> io::Result<()> {
        self.0.sync_all()
    }
}

impl PackBackend for LocalPacks {
    fn create(&self, pack: &PackId) -> io::Result<Box<dyn PackSink>> {
        // Made under a name `list` does not show, locked, then given its name: a pack
        // file appears only held by its writer, so no adopter takes one being written.
        // The name is a new link (never a rename, which would replace a pack of the
        // same name), then the first name goes.
        let new = self.dir.join(format!("{}.pack.new", pack.0));
        let file = OpenOptions::new().write(true).create_new(true).open(&new)?;
        let named = file
            .try_lock()
            .map_err(|e| match e {
                fs::TryLockError::Error(e) => e,
                fs::TryLockError::WouldBlock => io::Error::other("a new pack is locked"),
            })
            .and_then(|()| fs::hard_link(&new, self.path(pack)));
        let unlinked = fs::remove_file(&new);
        named?;
        unlinked?;
        Ok(Box::new(LocalSink {
            file: io::BufWriter::with_capacity(1 << 20, file),
            written: 0,
            kicked: 0,
        }))
    }

    fn read_at(&self, pack: &PackId, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.file(pack)?.read_exact_at(buf, offset)
    }

    fn len(&self, pack: &PackId) -> io::Result<u64> {
        Ok(fs::metadata(self.path(pack))?.len())
    }

    fn remove(&self, pack: &PackId) -> io::Result<()> {
        self.open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(pack);
        match fs::remove_file(self.path(pack)) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            r => r,
        }
    }

    fn list(&self) -> io::Result<Vec<PackId>> {
        let mut out = Vec::new();
        for e in fs::read_dir(&self.dir)? {
            let name = e?.file_name();
            let name = name.to_string_lossy();
            if let Some(stem) = name.strip_suffix(".pack")
                && let Some(id) = PackId::parse(stem)
            {
                out.push(id);
            }
        }
        out.sort();
        Ok(out)
    }

    fn sync_dir(&self) -> io::Result<()> {
        sync_dir(&self.dir)
    }

    fn location(&self, pack: &PackId) -> String {
        self.path(pack).display().to_string()
    }

    fn remove_unnamed(&self) -> io::Result<u64> {
        let mut n = 0;
        for e in fs::read_dir(&self.dir)? {
            let e = e?;
            let name = e.file_name();
            let is_new = name
                .to_string_lossy()
                .strip_suffix(".pack.new")
                .is_some_and(|stem| PackId::parse(stem).is_some());
            // A live writer holds its new file until it is renamed.
            if is_new
                && let Ok(f) = File::open(e.path())
                && f.try_lock().is_ok()
            {
                fs::remove_file(e.path())?;
                n += 1;
            }
        }
        Ok(n)
    }

    fn claim_orphan(&self, pack: &PackId) -> io::Result<Option<Box<dyn PackHold>>> {
        let file = match File::open(self.path(pack)) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        match file.try_lock() {
            Ok(()) => Ok(Some(Box::new(FileHold(file)))),
            Err(fs::TryLockError::WouldBlock) => Ok(None),
            Err(fs::TryLockError::Error(e)) => Err(e),
        }
    }
}

/// fsync of a directory, so entries created or removed in it are durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// A record header's fields ([`record_header`] read back): kind byte, codec byte, stored
/// length, raw length, id.
pub fn parse_record_header(h: &[u8; 44]) -> (u8, u8, u32, u32, [u8; 32]) {
    let [kind, codec, _, _, s0, s1, s2, s3, r0, r1, r2, r3, id @ ..] = *h;
    (
        kind,
        codec,
        u32::from_le_bytes([s0, s1, s2, s3]),
        u32::from_le_bytes([r0, r1, r2, r3]),
        id,
    )
}

/// Encodes a record header.
pub fn record_header(
    kind: u8,
    codec: Codec,
    stored_len: u32,
    raw_len: u32,
    id: &[u8; 32],
) -> [u8; 44] {
    let mut h = [0u8; 44];
    h[0] = kind;
    h[1] = codec as u8;
    h[4..8].copy_from_slice(&stored_len.to_le_bytes());
    h[8..12].copy_from_slice(&raw_len.to_le_bytes());
    h[12..44].copy_from_slice(id);
    h
}
