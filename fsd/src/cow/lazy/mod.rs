//! Lazy copy-up of large files where no reflink is possible: the upper file is made at
//! full size at once, and its content is copied from the blob-cache file in fixed-size
//! blocks, by a background copier and, ahead of it, on demand.
//!
//! # The record
//!
//! Until every block is copied, the upper file carries [`COPYUP_XATTR`]:
//!
//! | bytes | what |
//! | --- | --- |
//! | 0 | version, [`RECORD_VERSION`] |
//! | 1..33 | the content id of the snapshot file (its blob) |
//! | 33..41 | the content's size, u64 little-endian |
//! | 41 | log2 of the block size (at least [`BLOCK_MIN_SHIFT`]) |
//! | 42.. | one bit per block (block `i` is bit `i % 8` of byte `i / 8`), set when done; bits past the last block are zero |
//!
//! A block is *done* when it holds what the workspace shows: the snapshot's bytes, any
//! bytes written since, or nothing (it lies past the end of a truncated file). The
//! record is the only truth about which blocks are done; it is removed (after a data
//! sync) when the last block is done.
//!
//! # Rules
//!
//! - A block's bit is recorded only after its bytes are copied and synced
//!   (`fdatasync`), and the workspace writes into a block only after its bit is
//!   recorded; so re-copying the blocks the record does not name (after a crash) never
//!   overwrites a byte the user wrote.
//! - Every write, truncate and time change of a pending file goes through its
//!   [`Pending`] under one lock; reads are served here too (a block not done is read from
//!   the blob). So a pending file is never passed through to the kernel.
//! - A truncate truncates, then copies the bytes below the new end of the block holding
//!   it and records every block from there on as done. A crash between the two steps is
//!   finished the same way by [`Pending::load`]; bytes past the end of the file are never
//!   copied, so recovery never extends a file.
//! - Copying preserves the file's atime and mtime (the copy is not a change).
//! - Diff and commit read upper files directly: they finish pending copies first
//!   ([`Lazy::finish_all`] in the daemon, [`finish_records`] when nothing serves the
//!   workspace).

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use cowspace_store::{ContentId, Store};
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use nix::sys::time::TimeSpec;
use xattr::FileExt as _;

use super::fdio::{copy_range, fd_path};

mod record;

pub use self::record::{BLOCK_MIN_SHIFT, MAX_BITMAP_BYTES, RECORD_VERSION, Record};

/// The xattr recording a copy-up in progress (see the module docs for its layout).
/// `trusted.*`: never recorded by commits, never shown to the workspace.
pub const COPYUP_XATTR: &str = "trusted.cowspace.copyup";
/// Files at least this large are copied up lazily when no reflink is possible; smaller
/// ones are copied whole at once (a few milliseconds).
pub const LAZY_COPY_MIN_BYTES: u64 = 8 * 1024 * 1024;
/// What the background copier copies between two releases of a file's lock (and syncs
/// before recording).
pub const COPY_BATCH_BYTES: u64 = 8 * 1024 * 1024;
/// Environment variable: milliseconds the background copier waits before each batch
/// (tests use it to keep a copy-up in progress; unset: no wait).
pub const PAUSE_ENV: &str = "COWSPACE_COPYUP_PAUSE_MS";
/// How long an idle copier sleeps before looking again (it is also woken on new work).
const IDLE_WAIT_MS: u64 = 1_000;
/// Deepest upper directory walked looking for records.
const MAX_WALK_DEPTH: usize = 4096;

struct State {
    rec: Record,
    complete: bool,
}

/// One file being copied up: its upper file (read-write), the blob it is copied from,
/// and the record, behind one lock.
pub struct Pending {
    file: File,
    blob: File,
    state: Mutex<State>,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending").finish_non_exhaustive()
    }
}

fn times_of(m: &std::fs::Metadata) -> (TimeSpec, TimeSpec) {
    (
        TimeSpec::new(m.atime(), m.atime_nsec()),
        TimeSpec::new(m.mtime(), m.mtime_nsec()),
    )
}

impl Pending {
    /// Starts copying `size` bytes of `content` from `blob` into `file` (new, empty, open
    /// read-write): the file gets its full size and a record with no block done.
    pub fn start(file: File, blob: File, content: ContentId, size: u64) -> io::Result<Pending> {
        file.set_len(size)?;
        let rec = Record::new(content, size);
        file.set_xattr(COPYUP_XATTR, &rec.encode())?;
        Ok(Pending {
            file,
            blob,
            state: Mutex::new(State {
                rec,
                complete: false,
            }),
        })
    }

    /// The copy-up recorded on `file` (open read-write), if any, ready to go on: blocks
    /// past the end of the file (a truncate the crash interrupted) are done.
    pub fn load(file: File, store: &Store) -> io::Result<Option<Pending>> {
        Pending::load_with(file, |content| {
            let path = store
                .blob_cache()
                .ensure(content)
                .map_err(io::Error::other)?;
            File::open(path)
        })
    }

    /// [`Pending::load`] with the blob of a content opened by `blob_of`.
    pub fn load_with(
        file: File,
        blob_of: impl FnOnce(&ContentId) -> io::Result<File>,
    ) -> io::Result<Option<Pending>> {
        let Some(v) = file.get_xattr(COPYUP_XATTR)? else {
            return Ok(None);
        };
        let rec = Record::decode(&v)?;
        let blob = blob_of(&rec.content)?;
        if blob.metadata()?.len() != rec.size {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "copy-up record: the blob's size differs from the recorded size",
            ));
        }
        let p = Pending {
            file,
            blob,
            state: Mutex::new(State {
                rec,
                complete: false,
            }),
        };
        {
            // Blocks past the end of the file are done; one reaching past it holds its
            // bytes up to the end (a truncate the crash interrupted).
            let mut st = p.lock();
            let cur = p.file.metadata()?.len();
            let past = st.rec.blocks_over(cur, u64::MAX);
            p.ensure(&mut st, past)?;
        }
        Ok(Some(p))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The upper file's identity (its inode number on the upper filesystem).
    pub fn upper_ino(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.ino())
    }

    /// Whether every block is done (then the file is an ordinary upper file).
    pub fn is_complete(&self) -> bool {
        self.lock().complete
    }

    /// Copies the blocks of `blocks` not done, syncs them and records them done. Bytes
    /// past the end of the file are not copied (a block past the end is done as it is).
    fn ensure(&self, st: &mut State, blocks: std::ops::Range<u64>) -> io::Result<()> {
        if st.complete || blocks.is_empty() {
            return Ok(());
        }
        let meta = self.file.metadata()?;
        let cur = meta.len();
        let mut rec = st.rec.clone();
        let mut copied = false;
        for i in blocks {
            if rec.is_done(i) {
                continue;
            }
            let start = i << rec.shift;
            let end = (start + rec.block_bytes()).min(rec.size).min(cur);
            if start < end {
                copy_range(&self.blob, &self.file, start, end - start)?;
                copied = true;
            }
            rec.set_done(i);
        }
        if rec == st.rec {
            return Ok(());
        }
        if copied {
            // The copy is not a change of the file: its times stay.
            let (atime, mtime) = times_of(&meta);
            nix::sys::stat::futimens(self.file.as_fd(), &atime, &mtime)?;
        }
        self.record(st, rec)
    }

    /// Syncs the file's data, then records `rec` (or removes the record when every block
    /// is done); only then does the in-memory state follow.
    fn record(&self, st: &mut State, rec: Record) -> io::Result<()> {
        self.file.sync_data()?;
        self.record_synced(st, rec)
    }

    /// Records `rec`, every block it adds being on disk already.
    fn record_synced(&self, st: &mut State, rec: Record) -> io::Result<()> {
        if rec.left() == 0 {
            match self.file.remove_xattr(COPYUP_XATTR) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENODATA) => {}
                Err(e) => return Err(e),
            }
            st.complete = true;
        } else {
            self.file.set_xattr(COPYUP_XATTR, &rec.encode())?;
        }
        st.rec = rec;
        Ok(())
    }

    /// Writes `data` at `off` through `file` (an open of this upper file), after the
    /// blocks it covers are done. `append`: `file` appends, so the bytes land at the end.
    pub fn write_at(&self, file: &File, data: &[u8], off: u64, append: bool) -> io::Result<()> {
        let mut st = self.lock();
        let off = if append {
            self.file.metadata()?.len()
        } else {
            off
        };
        let blocks = st.rec.blocks_over(off, data.len() as u64);
        self.ensure(&mut st, blocks)?;
        file.write_all_at(data, off)
    }

    /// Reads at `off` into `buf`: done blocks from the upper file, others from the blob
    /// (which holds exactly their bytes). Returns the bytes read (short at the end).
    pub fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<usize> {
        let st = self.lock();
        let cur = self.file.metadata()?.len();
        if off >= cur {
            return Ok(0);
        }
        let n = (buf.len() as u64).min(cur - off) as usize;
        let mut pos = 0usize;
        while pos < n {
            let at = off + pos as u64;
            let block_end = ((at >> st.rec.shift) + 1) << st.rec.shift;
            let mut piece = ((block_end - at) as usize).min(n - pos);
            let from_blob = !st.complete && at < st.rec.size && !st.rec.is_done(at >> st.rec.shift);
            if from_blob {
                // The blob ends with the content; what follows was written since.
                piece = piece.min((st.rec.size - at) as usize);
            }
            let src = if from_blob { &self.blob } else { &self.file };
            src.read_exact_at(&mut buf[pos..pos + piece], at)?;
            pos += piece;
        }
        Ok(n)
    }

    /// Truncates (or extends) the file to `len`. Then the block holding the new end gets
    /// its bytes below the end and every block past it is done (before a truncate, no
    /// block past the end is pending, so an extension copies nothing).
    pub fn truncate(&self, len: u64) -> io::Result<()> {
        let mut st = self.lock();
        self.file.set_len(len)?;
        let past = st.rec.blocks_over(len, u64::MAX);
        self.ensure(&mut st, past)
    }

    /// Runs `f` (a change of the file's times, say) with no copy going on.
    pub fn locked<T>(&self, f: impl FnOnce() -> T) -> T {
        let _st = self.lock();
        f()
    }

    /// Copies up to `max_bytes` of blocks not done; whether the file is complete.
    ///
    /// Writers wait for at most one block: the lock is held for each block's copy, not
    /// for the batch, and not for the sync. A block copied here but not yet recorded is
    /// still pending for everyone else: a writer copies it again (the same bytes) before
    /// writing, a truncate settles it, and recording it done afterwards stays true.
    pub fn copy_some(&self, max_bytes: u64) -> io::Result<bool> {
        let per = {
            let st = self.lock();
            if st.complete {
                return Ok(true);
            }
            (max_bytes / st.rec.block_bytes()).max(1)
        };
        let mut copied: Vec<u64> = Vec::new();
        for _ in 0..per {
            let st = self.lock();
            let Some(i) = (0..st.rec.blocks()).find(|i| !st.rec.is_done(*i) && !copied.contains(i))
            else {
                break;
            };
            let meta = self.file.metadata()?;
            let start = i << st.rec.shift;
            let end = (start + st.rec.block_bytes())
                .min(st.rec.size)
                .min(meta.len());
            if start < end {
                copy_range(&self.blob, &self.file, start, end - start)?;
                // The copy is not a change of the file: its times stay.
                let (atime, mtime) = times_of(&meta);
                nix::sys::stat::futimens(self.file.as_fd(), &atime, &mtime)?;
            }
            copied.push(i);
        }
        if !copied.is_empty() {
            self.file.sync_data()?;
        }
        let mut st = self.lock();
        let mut rec = st.rec.clone();
        for i in copied {
            rec.set_done(i);
        }
        if rec != st.rec {
            self.record_synced(&mut st, rec)?;
        }
        Ok(st.complete)
    }

    /// Copies every block not done (a batch at a time, so writers wait little).
    pub fn finish(&self) -> io::Result<()> {
        while !self.copy_some(COPY_BATCH_BYTES)? {}
        Ok(())
    }

    /// Links to the file (0: deleted; then only its open handles need it, and they copy
    /// what they write on demand).
    fn nlink(&self) -> u64 {
        self.file.metadata().map(|m| m.nlink()).unwrap_or(0)
    }
}

/// The copy-ups in progress in one workspace, and its background copier (a thread
/// started at the first copy-up: most workspaces never have one).
pub struct Lazy {
    map: Mutex<HashMap<u64, Arc<Pending>>>,
    wake: Condvar,
    stop: AtomicBool,
    pause: Duration,
    copier: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Default for Lazy {
    fn default() -> Self {
        Lazy::new()
    }
}

impl Lazy {
    pub fn new() -> Lazy {
        let pause_ms = std::env::var(PAUSE_ENV)
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        Lazy {
            map: Mutex::new(HashMap::new()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            pause: Duration::from_millis(pause_ms),
            copier: Mutex::new(None),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Arc<Pending>>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a copy-up in progress (before anything may open its file), starting the
    /// background copier if it does not run yet.
    pub fn add(self: &Arc<Self>, p: Arc<Pending>) -> io::Result<()> {
        let ino = p.upper_ino()?;
        self.lock().insert(ino, p);
        self.wake.notify_all();
        let mut copier = self.copier.lock().unwrap_or_else(|e| e.into_inner());
        if copier.is_none() && !self.stop.load(Ordering::SeqCst) {
            let me = Arc::clone(self);
            match std::thread::Builder::new()
                .name("copy-up".into())
                .spawn(move || me.run())
            {
                Ok(t) => *copier = Some(t),
                // Writes still copy what they touch, and commit finishes the rest.
                Err(e) => tracing::warn!(error = %e, "cannot start the background copier"),
            }
        }
        Ok(())
    }

    /// The copy-up in progress of the upper file open as `fd` (any descriptor), deleted
    /// or not: a deleted one stays registered, its file held open (so its number names no
    /// other file), until the kernel forgets its inode ([`Lazy::forget_deleted`]).
    pub fn get(&self, fd: &impl AsFd) -> Option<Arc<Pending>> {
        let st = nix::sys::stat::fstat(fd.as_fd()).ok()?;
        let p = self.lock().get(&st.st_ino).cloned()?;
        (!p.is_complete()).then_some(p)
    }

    /// Drops the copy-up of the upper file open as `fd` if that file is deleted (the
    /// kernel forgot the last inode that could reach it).
    pub fn forget_deleted(&self, fd: &impl AsFd) {
        let Ok(st) = nix::sys::stat::fstat(fd.as_fd()) else {
            return;
        };
        let mut map = self.lock();
        if map.get(&st.st_ino).is_some_and(|p| p.nlink() == 0) {
            map.remove(&st.st_ino);
        }
    }

    /// Copy-ups in progress.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Finishes every copy-up in progress (diff and commit read upper files directly).
    pub fn finish_all(&self) -> io::Result<()> {
        let all: Vec<(u64, Arc<Pending>)> = self
            .lock()
            .iter()
            .map(|(k, v)| (*k, Arc::clone(v)))
            .collect();
        for (ino, p) in all {
            // A deleted file is not in the upper directory; its inode may still be read.
            if p.nlink() > 0 {
                p.finish()?;
                self.forget(ino, &p);
            }
        }
        Ok(())
    }

    /// Drops `p` (done, or deleted) from the copy-ups in progress.
    fn forget(&self, ino: u64, p: &Arc<Pending>) {
        let mut map = self.lock();
        if map.get(&ino).is_some_and(|q| Arc::ptr_eq(q, p)) {
            map.remove(&ino);
        }
    }

    /// Stops the copier (it checks between batches) and waits for it.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        {
            let _g = self.lock();
            self.wake.notify_all();
        }
        let copier = self.copier.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = copier {
            let _ = t.join();
        }
    }

    /// Waits `d` unless stopped first; whether to go on.
    fn sleep(&self, d: Duration) -> bool {
        let g = self.lock();
        if self.stop.load(Ordering::SeqCst) {
            return false;
        }
        let _ = self.wake.wait_timeout(g, d);
        !self.stop.load(Ordering::SeqCst)
    }

    /// The background copier: copies one batch at a time of some pending file until
    /// stopped.
    fn run(&self) {
        while !self.stop.load(Ordering::SeqCst) {
            // Deleted files are not copied on (their writers copy what they write); done
            // ones are dropped.
            let next = self
                .lock()
                .iter()
                .find(|(_, v)| v.is_complete() || v.nlink() > 0)
                .map(|(k, v)| (*k, Arc::clone(v)));
            let Some((ino, p)) = next else {
                if !self.sleep(Duration::from_millis(IDLE_WAIT_MS)) {
                    return;
                }
                continue;
            };
            if !self.pause.is_zero() && !self.sleep(self.pause) {
                return;
            }
            match p.copy_some(COPY_BATCH_BYTES) {
                Ok(false) => {}
                Ok(true) => self.forget(ino, &p),
                Err(e) => {
                    tracing::warn!(error = %e, "background copy-up failed; retried later");
                    if !self.sleep(Duration::from_millis(IDLE_WAIT_MS)) {
                        return;
                    }
                }
            }
        }
    }
}

/// Every copy-up recorded under `upper`, ready to go on (a walk of the upper directory,
/// whose size is what the workspace changed).
pub fn scan(upper: &Path, store: &Store) -> io::Result<Vec<Pending>> {
    let root = nix::fcntl::open(
        upper,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let mut out = Vec::new();
    walk(&root, store, 0, &mut out)?;
    Ok(out)
}

fn walk(dir: &OwnedFd, store: &Store, depth: usize, out: &mut Vec<Pending>) -> io::Result<()> {
    if depth > MAX_WALK_DEPTH {
        return Err(io::Error::from_raw_os_error(libc::ELOOP));
    }
    for e in std::fs::read_dir(fd_path(dir))? {
        let e = e?;
        let ft = e.file_type()?;
        let name = e.file_name();
        if ft.is_dir() {
            let sub = nix::fcntl::openat(
                dir,
                name.as_bytes(),
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )?;
            walk(&sub, store, depth + 1, out)?;
        } else if ft.is_file() {
            let fd = nix::fcntl::openat(
                dir,
                name.as_bytes(),
                OFlag::O_RDWR | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )?;
            if let Some(p) = Pending::load(File::from(fd), store)? {
                out.push(p);
            }
        }
    }
    Ok(())
}

/// Finishes every copy-up recorded under `upper` (a workspace nothing serves: no writer
/// can race the copy).
pub fn finish_records(upper: &Path, store: &Store) -> io::Result<usize> {
    let all = scan(upper, store)?;
    for p in &all {
        p.finish()?;
    }
    Ok(all.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    fn content() -> ContentId {
        ContentId::from_bytes([7; 32])
    }

    fn noise(len: usize, seed: u32) -> Vec<u8> {
        let mut x = seed.wrapping_mul(2_654_435_761).max(1);
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect()
    }

    /// A blob of `len` bytes and a pending copy of it into `dir/upper`; `None` when
    /// `trusted.*` xattrs cannot be set here (not root).
    fn start(dir: &Path, len: usize) -> Option<(Vec<u8>, Pending)> {
        let data = noise(len, len as u32);
        std::fs::write(dir.join("blob"), &data).unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(dir.join("upper"))
            .unwrap();
        let blob = File::open(dir.join("blob")).unwrap();
        match Pending::start(file, blob, content(), len as u64) {
            Ok(p) => Some((data, p)),
            Err(e) => {
                eprintln!("skipped: no trusted xattrs here ({e})");
                None
            }
        }
    }

    fn reload(dir: &Path) -> Option<Pending> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(dir.join("upper"))
            .unwrap();
        Pending::load_with(file, |c| {
            assert_eq!(*c, content());
            File::open(dir.join("blob"))
        })
        .unwrap()
    }

    fn read_all(p: &Pending) -> Vec<u8> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 3 * MIB + 17];
        loop {
            let n = p.read_at(&mut buf, out.len() as u64).unwrap();
            if n == 0 {
                return out;
            }
            out.extend_from_slice(&buf[..n]);
        }
    }

    fn write(p: &Pending, model: &mut Vec<u8>, off: usize, data: &[u8]) {
        let f = p.file.try_clone().unwrap();
        p.write_at(&f, data, off as u64, false).unwrap();
        if model.len() < off + data.len() {
            model.resize(off + data.len(), 0);
        }
        model[off..off + data.len()].copy_from_slice(data);
    }

    #[test]
    fn reads_writes_and_truncates_during_the_copy_show_exactly_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        let Some((mut model, p)) = start(tmp.path(), 9 * MIB + 12_345) else {
            return;
        };
        assert_eq!(read_all(&p), model, "nothing copied yet");
        write(&p, &mut model, 4 * MIB + 100, b"middle");
        write(&p, &mut model, 9 * MIB + 12_345, b"appended");
        write(&p, &mut model, MIB - 2, b"across a block edge");
        assert_eq!(read_all(&p), model);
        assert!(!p.copy_some(MIB as u64).unwrap(), "one block more, not all");
        assert_eq!(read_all(&p), model);
        p.truncate(6 * MIB as u64 + 5).unwrap();
        model.truncate(6 * MIB + 5);
        assert_eq!(read_all(&p), model, "after truncate");
        // Extended again: zeros, never the old bytes.
        write(&p, &mut model, 8 * MIB, b"z");
        assert_eq!(read_all(&p), model, "after extending");
        p.finish().unwrap();
        assert!(p.is_complete());
        assert_eq!(std::fs::read(tmp.path().join("upper")).unwrap(), model);
        assert_eq!(
            p.file.get_xattr(COPYUP_XATTR).unwrap(),
            None,
            "record removed"
        );
    }

    #[test]
    fn writes_racing_the_background_copier_all_land() {
        let tmp = tempfile::tempdir().unwrap();
        let Some((mut model, p)) = start(tmp.path(), 24 * MIB + 777) else {
            return;
        };
        let p = Arc::new(p);
        let copier = {
            let p = Arc::clone(&p);
            std::thread::spawn(move || {
                while !p.copy_some(3 * MIB as u64).unwrap() {
                    std::thread::yield_now();
                }
            })
        };
        // Writes all over the file (and past its end) while blocks are being copied.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for k in 0..400u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let off = (x % (25 * MIB as u64)) as usize;
            write(&p, &mut model, off, format!("w{k}").as_bytes());
        }
        copier.join().unwrap();
        p.finish().unwrap();
        assert!(p.is_complete());
        assert!(
            std::fs::read(tmp.path().join("upper")).unwrap() == model,
            "the upper file differs from the model"
        );
    }

    #[test]
    fn a_crash_mid_copy_is_finished_from_the_record_keeping_what_was_written() {
        let tmp = tempfile::tempdir().unwrap();
        let Some((mut model, p)) = start(tmp.path(), 10 * MIB) else {
            return;
        };
        write(&p, &mut model, 7 * MIB + 3, b"written before the crash");
        p.copy_some(2 * MIB as u64).unwrap();
        write(&p, &mut model, 10 * MIB, b"tail");
        drop(p);
        let p = reload(tmp.path()).expect("a record");
        assert_eq!(read_all(&p), model);
        p.finish().unwrap();
        assert_eq!(std::fs::read(tmp.path().join("upper")).unwrap(), model);
        drop(p);
        assert!(reload(tmp.path()).is_none(), "finished: no record left");
    }

    #[test]
    fn a_truncate_cut_short_by_a_crash_is_finished_without_extending_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        let Some((mut model, p)) = start(tmp.path(), 10 * MIB) else {
            return;
        };
        // The truncate's first step only, then the crash.
        p.file.set_len(3 * MIB as u64 + 10).unwrap();
        model.truncate(3 * MIB + 10);
        drop(p);
        let p = reload(tmp.path()).expect("a record");
        assert_eq!(read_all(&p), model);
        p.finish().unwrap();
        assert_eq!(std::fs::read(tmp.path().join("upper")).unwrap(), model);
    }

    #[test]
    fn copying_keeps_the_files_times() {
        let tmp = tempfile::tempdir().unwrap();
        let Some((_, p)) = start(tmp.path(), 3 * MIB) else {
            return;
        };
        let t = TimeSpec::new(1_000_000, 0);
        nix::sys::stat::futimens(p.file.as_fd(), &t, &t).unwrap();
        p.finish().unwrap();
        let m = p.file.metadata().unwrap();
        assert_eq!((m.mtime(), m.atime()), (1_000_000, 1_000_000));
    }
}
