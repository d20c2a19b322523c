//! The writable FUSE view of a workspace (the `fuse` materializer): the snapshot's tree
//! from the store merged with the workspace's private state on local disk, served by the
//! daemon, so no kernel overlayfs is needed.
//!
//! # State on disk
//!
//! `<private_dir>/upper` is kept in exactly kernel overlayfs's upper-layer format (as
//! the `overlay` materializer mounts it: `userxattr`, no redirects, no metacopy, no
//! index): new and modified objects as whole real files, deletions as whiteouts
//! (character devices 0:0), directories that replace a snapshot directory marked
//! `user.overlay.opaque=y`. Diff and commit therefore read it with `upper.rs`, unchanged
//! and in time proportional to what changed, and the semantics are overlay's by
//! construction. Copy-ups are made in `<private_dir>/work` and renamed into place, so a
//! crash never leaves a half-copied file in the upper layer without saying so; the work
//! directory is emptied whenever the workspace is served again. A file of
//! [`lazy::LAZY_COPY_MIN_BYTES`] or more that cannot be reflinked is placed at full size
//! at once with a copy-up record ([`lazy::COPYUP_XATTR`]) and filled later ([`lazy`]);
//! diff and commit finish such copies before they read the upper. The upper directory
//! is the only truth: after a daemon crash, serving the same upper again (which resumes
//! recorded copy-ups) is the whole recovery.
//!
//! # Identity
//!
//! An unmodified snapshot entry has the view's inode number and times
//! ([`crate::view::served_file_stat`]), so a checkout's rewritten `.git/index` agrees
//! with the workspace. A copied-up object keeps that number in the xattr
//! [`layers::INO_XATTR`] (`trusted.*`: not recorded by commits); an object made in the
//! workspace is numbered from its upper inode ([`layers::UPPER_INO_BASE`] + `st_ino`).
//! `st_ino` is thus stable for an object's lifetime, across renames and daemon restarts.
//! The names of a file that has several in the snapshot are one node (one number); its
//! copy-up is linked at every name of the group in the upper layer, and a name of it is
//! copied up with the group before it is deleted or replaced, so the upper layer keeps
//! the group (commits, restarts) and an unmodified one reports the group's link count.
//!
//! # Inode lifetime
//!
//! As in the view: the daemon's table holds exactly the inodes the kernel holds (lookup
//! counts: +1 per entry replied, -n per forget; the root is never forgotten), so its size
//! is bounded by the kernel's inode cache. A node remembers its directory and name (a
//! directory's is unique: a directory is renamed only once nothing of the snapshot is
//! merged beneath it, and the held nodes beneath then learn their upper objects) and,
//! once it has one, an `O_PATH` descriptor of its upper object, through which every
//! operation on a modified file goes (so hard links and open-but-deleted files work).
//!
//! # I/O
//!
//! Two open modes ([`OpenMode`], the daemon's `--fuse-open-mode`):
//!
//! - `cached` (the default): the first open is answered "not implemented", after which
//!   the kernel opens every file of the mount without a request (no open, no release;
//!   `create` too is refused, so new files are made with `mknod`) and keeps each file's
//!   pages between opens. Reads, writes, syncs and allocations arrive by inode
//!   (`cached.rs`): an unmodified file is read from its blob-cache file; its first write,
//!   truncate or allocation copies it up (not its open, which the daemon never sees),
//!   after which its upper file serves it. A copy-up does not change a byte the kernel
//!   cached. Writes go through to the upper file at once (no writeback cache), so a
//!   file's size and times stay the daemon's. `FUSE_ATOMIC_O_TRUNC` is not negotiated:
//!   the kernel then sends an open's `O_TRUNC` as a `setattr`. A file deleted before its
//!   first change and still open gets a copy of its own linked nowhere (`O_TMPFILE` in
//!   the work directory). A lazily copied file is read from the blob for the blocks not
//!   done; a write copies its blocks first; a deleted one stays registered until the
//!   kernel forgets its inode.
//! - `passthrough`: opens are answered with FUSE passthrough: an unmodified file opened
//!   for reading is backed by its blob-cache file; an open for writing first copies the
//!   file up (nothing with `O_TRUNC`) and is backed by the upper file. Reads, writes and
//!   mmap never reach the daemon — except for a file whose lazy copy-up is still in
//!   progress: its opens are served by the daemon (direct I/O), which copies what a
//!   write touches first. **Known gap:** while an unmodified file is open for reading
//!   (backed by its blob-cache file), an open of it that needs another backing — for
//!   writing (a copy-up), or any open once the file was copied up meanwhile (by a
//!   truncate, or a rename of a snapshot directory above it) — fails with `EIO`: the
//!   kernel requires every open of an inode that has a passthrough open to pass through
//!   to that same file, and refuses the daemon-served (direct I/O) open offered instead.
//!   The `cached` mode has no such case.
//!
//! Each workspace's request threads follow the CPUs of the processes that use it, when
//! those are confined to fewer CPUs than the daemon may use ([`crate::placement`]): every
//! request but `forget` first places its serving thread.
//!
//! Copy-ups use a reflink where the filesystem can, else `copy_file_range`, lazily for
//! large files. Directories are opened without a request: the first `opendir` is
//! answered "not implemented", after which the kernel sends no open or release of a
//! directory and keeps listings (`FOPEN_CACHE_DIR`), dropping one when its directory
//! changes through the mount; so a second walk of a tree asks for none. Listings are
//! read by inode in the order of a hash of each name, whose value is the offset a reader
//! resumes after ([`listing::Listing`]): a listing read in pieces while the directory
//! changes never shows an entry twice or skips one that was there throughout, and
//! `telldir` positions stay valid.
//!
//! # What the kernel keeps
//!
//! Every change to a served workspace goes through its mount, and the kernel drops or
//! refreshes what a change touches, so entries (negative ones too) and attributes are
//! given a long TTL ([`crate::filesystem::TTL`]), listings carry attributes (`readdirplus`, each entry
//! taking a lookup), symlink targets are cached, and closes send no flush. In the cached
//! open mode file pages are kept too: a renamed file keeps its inode (and its pages); a
//! removed file's inode leaves the kernel (and its pages with it) before the daemon lets
//! go of its upper file, so its number cannot name another file meanwhile. The one
//! writer the kernel cannot see is a sandbox's own overlay of the same upper directory
//! while a busy host mount could not be suspended; that mount may then show the state
//! before the run until it is served again.
//!
//! # Not supported
//!
//! `RENAME_WHITEOUT` is `EINVAL` (`RENAME_NOREPLACE` and `RENAME_EXCHANGE` work). (A
//! directory that has snapshot content beneath is renamed after the daemon copies it up
//! with all of it, since the upper format has no redirects; see [`ops::Cow::rename`]. It
//! costs time in proportion to the tree; lookups, reads, writes and creates go on
//! meanwhile, other renames and removals in the workspace wait for it.) `O_TMPFILE` is
//! `EOPNOTSUPP` (the FUSE library has no `tmpfile`). File locks are the kernel's own (local to this host, which
//! is every user of a workspace).

mod cached;
mod copyup;
mod fdio;
pub mod fs;
mod handles;
pub mod layers;
pub mod lazy;
mod listing;
mod namespace;
mod nfs;
pub mod node;
mod open;
pub mod ops;
mod readdir;
mod rename;
mod resolve;
mod setattr;
mod writeback;
mod xattrs;

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cowspace_store::{SnapshotId, Store};
use fuser::{BackgroundSession, Config, SessionACL};

use crate::error::{Error, Result};
use crate::registry::{Record, Status};

pub use cowspace::served::{WS_SOURCE_PREFIX, WS_SUBTYPE};
pub use nfs::CowNfs;
use nfs::NfsMount;

/// Request threads per workspace (each with its own `/dev/fuse` clone).
pub const THREADS_PER_WORKSPACE: usize = 2;

/// How long stopping a workspace waits for its serving threads to end.
const SESSION_END_WAIT_MS: u64 = 2_000;

/// A workspace whose daemon held at least this many inodes gives its memory back to the
/// system when it goes ([`crate::sys::trim_heap`]).
const TRIM_AFTER_INODES: usize = 4096;

/// How the opens of a workspace's files are answered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OpenMode {
    /// The first open is answered "not implemented", after which the kernel opens every
    /// file of the mount without asking and keeps its pages between opens; reads and
    /// writes arrive by inode and the daemon copies a file up at its first change.
    #[default]
    Cached,
    /// Each open is a request, answered with a FUSE passthrough backing file (blob or
    /// upper file; an open for writing copies up first).
    Passthrough,
}

impl OpenMode {
    pub fn parse(s: &str) -> Option<OpenMode> {
        match s {
            "cached" => Some(OpenMode::Cached),
            "passthrough" => Some(OpenMode::Passthrough),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            OpenMode::Cached => "cached",
            OpenMode::Passthrough => "passthrough",
        }
    }
}

/// How a daemon serves its fuse workspaces (from its command line).
#[derive(Clone, Copy, Debug)]
pub struct Serving {
    pub mode: OpenMode,
    /// Whether [`OpenMode::Passthrough`] may use FUSE passthrough (else the daemon
    /// serves those opens' I/O).
    pub passthrough: bool,
    /// Whether each workspace's request threads follow the CPUs of the processes that
    /// use it ([`crate::placement`]).
    pub follow_cpus: bool,
}

impl Default for Serving {
    fn default() -> Serving {
        Serving {
            mode: OpenMode::Cached,
            passthrough: true,
            follow_cpus: true,
        }
    }
}

/// The filesystem core of the workspace of `snapshot` with private state in
/// `private_dir`, copy-ups a crash or a stop interrupted resumed.
fn open_core(store: Arc<Store>, snapshot: SnapshotId, private_dir: &Path) -> Result<Arc<ops::Cow>> {
    let owner = std::fs::metadata(store.root()).map_err(Error::io("stat", store.root()))?;
    let snap = store.snapshot(&snapshot)?;
    let layers = layers::Layers::new(
        Arc::clone(&store),
        snapshot,
        private_dir,
        owner.uid(),
        owner.gid(),
    );
    layers
        .prepare(snap.root_mode, &snap.root_xattrs)
        .map_err(Error::io("prepare", private_dir))?;
    let root = ops::root_node(&layers, snap.root).map_err(Error::io("open", &layers.upper))?;
    let cow = Arc::new(ops::Cow::new(layers, root));
    // Copy-ups a crash or a stop interrupted go on, registered before the first open.
    let resumed = lazy::scan(&cow.layers.upper, &store)
        .map_err(Error::io("resume copy-ups in", &cow.layers.upper))?;
    for p in resumed {
        cow.lazy
            .add(Arc::new(p))
            .map_err(Error::io("resume copy-ups in", &cow.layers.upper))?;
    }
    Ok(cow)
}

/// A served workspace; unmounts on drop.
pub struct CowMount {
    path: PathBuf,
    session: Option<BackgroundSession>,
    cow: Arc<ops::Cow>,
    passthrough: Arc<AtomicBool>,
    mode: OpenMode,
    opens: Arc<AtomicU64>,
}

impl std::fmt::Debug for CowMount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CowMount")
            .field("path", &self.path)
            .finish()
    }
}

impl CowMount {
    /// Serves the workspace of `snapshot` with private state in `private_dir` at `path`
    /// (an existing directory), as `serving` says.
    pub fn mount(
        store: Arc<Store>,
        snapshot: SnapshotId,
        private_dir: &Path,
        path: &Path,
        serving: Serving,
    ) -> Result<CowMount> {
        let mode = serving.mode;
        let cow = open_core(store, snapshot, private_dir)?;
        let flag = Arc::new(AtomicBool::new(false));
        let opens = Arc::new(AtomicU64::new(0));
        let fs = fs::CowFs::new(
            Arc::clone(&cow),
            mode,
            serving.passthrough && mode == OpenMode::Passthrough,
            Arc::clone(&flag),
            Arc::clone(&opens),
            serving.follow_cpus,
        );
        let mut config = Config::default();
        config.acl = SessionACL::All;
        config.n_threads = Some(THREADS_PER_WORKSPACE);
        config.clone_fd = true;
        let session = mount_fuse(path, private_dir).and_then(|fd| {
            let s = fuser::Session::from_fd(
                crate::fuse::FuseServer::new(Arc::new(fs)),
                fd,
                SessionACL::All,
                config,
            )
            .and_then(fuser::Session::spawn);
            if s.is_err() {
                // Mounted, but never served: nothing can use it.
                let _ = crate::mounts::unmount_lazy(path);
            }
            s
        });
        let session = match session {
            Ok(s) => s,
            Err(e) => {
                cow.lazy.stop();
                return Err(Error::Io {
                    step: "mount the workspace's FUSE view at",
                    path: path.to_path_buf(),
                    source: e,
                });
            }
        };
        Ok(CowMount {
            path: path.to_path_buf(),
            session: Some(session),
            cow,
            passthrough: flag,
            mode,
            opens,
        })
    }

    /// Whether opens pass through to backing files.
    pub fn passthrough(&self) -> bool {
        self.passthrough.load(Ordering::Relaxed)
    }

    /// `OPEN` requests this session received (in [`OpenMode::Cached`], only the first).
    pub fn opens(&self) -> u64 {
        self.opens.load(Ordering::Relaxed)
    }

    /// Inodes the daemon holds for this workspace (the root included).
    pub fn inodes(&self) -> usize {
        self.cow.table.held()
    }

    /// Writes back what the kernel holds unwritten (pages of shared writable mappings, in
    /// the cached open mode), then finishes every copy-up in progress: diff and commit
    /// read the upper directly.
    pub fn finish_copies(&self) -> Result<()> {
        if self.mode == OpenMode::Cached {
            writeback::write_back(&self.path, &self.cow)?;
        }
        self.cow
            .lazy
            .finish_all()
            .map_err(Error::io("finish copy-ups in", &self.cow.layers.upper))
    }

    /// Whether the session still serves (the kernel has not dropped the mount).
    pub fn serving(&self) -> bool {
        self.session
            .as_ref()
            .is_some_and(|s| !s.guard.is_finished())
    }

    fn shutdown(&mut self) {
        if let Some(threads) = self.end_session() {
            wait_for_session(threads);
        }
    }

    /// Ends the session: unmounts the workspace if still mounted. Gives the serving
    /// threads, which end once the kernel drops the connection.
    fn end_session(&mut self) -> Option<std::thread::JoinHandle<std::io::Result<()>>> {
        // The copier stops between two batches; what is left stays recorded and goes on
        // when the workspace is served again.
        self.cow.lazy.stop();
        let s = self.session.take()?;
        if !s.guard.is_finished() && crate::mounts::is_mounted(&self.path).unwrap_or(false) {
            match crate::mounts::unmount(&self.path) {
                Ok(()) => {}
                Err(e) => {
                    tracing::warn!(path = %self.path.display(), error = %e,
                        "workspace busy; detached lazily (it goes away when the last user lets go)");
                    let _ = crate::mounts::unmount_lazy(&self.path);
                }
            }
        }
        Some(s.guard)
    }
}

/// Mounts a new FUSE connection at `path` and gives its `/dev/fuse` descriptor. Mounted
/// here rather than by fuser, whose record of the mount unmounts by path when its
/// session is dropped: a workspace mounted at that path since would be unmounted, so
/// every removal had to wait for the session's end (and the attempt logged a warning).
fn mount_fuse(path: &Path, private_dir: &Path) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/fuse")?;
    let root_mode = std::fs::metadata(path)?.mode();
    let options = format!(
        "fd={},rootmode={root_mode:o},user_id={},group_id={},default_permissions,allow_other,subtype={WS_SUBTYPE}",
        dev.as_raw_fd(),
        nix::unistd::getuid(),
        nix::unistd::getgid(),
    );
    // The private directory as the source lets git's fsmonitor hook find the workspace
    // at any path (`gitfsmonitor.rs`).
    let source = format!("{WS_SOURCE_PREFIX}{}", private_dir.display());
    nix::mount::mount(
        Some(source.as_str()),
        path,
        Some("fuse"),
        nix::mount::MsFlags::MS_NOATIME,
        Some(options.as_str()),
    )?;
    Ok(dev.into())
}

/// Waits for a session's serving threads to end, which they do once the kernel drops the
/// connection; a mount kept alive elsewhere (a lazily detached one still in use) is not
/// waited for. Polled finely: the threads usually end within a millisecond of the
/// unmount.
fn wait_for_session(threads: std::thread::JoinHandle<std::io::Result<()>>) {
    for _ in 0..SESSION_END_WAIT_MS * 5 {
        if threads.is_finished() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    if threads.is_finished()
        && let Ok(Err(e)) = threads.join()
    {
        tracing::debug!(error = %e, "workspace session ended with an error");
    }
}

impl Drop for CowMount {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The workspaces this daemon serves, by id. Only the daemon (the one process that keeps
/// FUSE sessions alive) has one; see [`install_host`].
pub struct Host {
    store: Arc<Store>,
    serving: Serving,
    mounts: Mutex<HashMap<String, CowMount>>,
    /// The `nfs` workspaces: served over NFS and mounted by the kernel's client.
    exports: Mutex<HashMap<String, NfsMount>>,
    /// One mount or unmount of a workspace at a time (by id); those of different
    /// workspaces run in parallel, outside the `mounts` lock.
    gates: Mutex<HashMap<String, Arc<Mutex<()>>>>,
}

/// The server of this process's fuse workspaces (the daemon makes one at start and
/// registers it with its runtime: `Materializers::with_fuse_host`).
pub fn new_host(store: Arc<Store>, serving: Serving) -> Arc<Host> {
    Arc::new(Host {
        store,
        serving,
        mounts: Mutex::new(HashMap::new()),
        exports: Mutex::new(HashMap::new()),
        gates: Mutex::new(HashMap::new()),
    })
}

impl cowspace::materializer::fuse::FuseHost for Host {
    fn mount(&self, rec: &Record) -> Result<()> {
        Host::mount(self, rec)
    }

    fn unmount(&self, id: &str) {
        Host::unmount(self, id);
    }

    fn stop(&self, id: &str) -> Option<Box<dyn FnOnce() + Send>> {
        Host::stop(self, id)
    }

    fn finish_copies(&self, rec: &Record) -> Result<()> {
        Host::finish_copies(self, rec)
    }
}

impl Host {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, CowMount>> {
        self.mounts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Serves workspace `rec` at its path (again, after a crash or a run). Already served
    /// and mounted: nothing to do.
    pub fn mount(&self, rec: &Record) -> Result<()> {
        use crate::materializer::MaterializerKind::{Fuse, Nfs};
        if !matches!(rec.materializer, Fuse | Nfs) {
            return Err(Error::Invalid(format!(
                "workspace {} is a {} workspace, not a fuse or nfs one",
                rec.id, rec.materializer
            )));
        }
        if !matches!(
            rec.status,
            Status::Creating | Status::Active | Status::Stopped
        ) {
            return Err(Error::WrongState {
                id: rec.id.clone(),
                status: rec.status.as_str().into(),
                op: "mount_workspace",
            });
        }
        self.gated(&rec.id, || self.mount_gated(rec))
    }

    /// Runs `f` holding workspace `id`'s gate.
    fn gated<T>(&self, id: &str, f: impl FnOnce() -> T) -> T {
        let gate = Arc::clone(
            self.gates
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(id.to_owned())
                .or_default(),
        );
        let out = {
            let _g = gate.lock().unwrap_or_else(|p| p.into_inner());
            f()
        };
        let mut gates = self.gates.lock().unwrap_or_else(|p| p.into_inner());
        // Held by the map and this call only: nobody waits on it.
        if Arc::strong_count(&gate) == 2 {
            gates.remove(id);
        }
        out
    }

    fn mount_gated(&self, rec: &Record) -> Result<()> {
        if rec.materializer == crate::materializer::MaterializerKind::Nfs {
            return self.mount_nfs_gated(rec);
        }
        let old = {
            let mut mounts = self.lock();
            if let Some(m) = mounts.get(&rec.id)
                && m.serving()
                && crate::mounts::is_mounted(&rec.path)?
                && nix::sys::statfs::statfs(&rec.path).is_ok()
            {
                return Ok(());
            }
            mounts.remove(&rec.id)
        };
        // A session whose mount went away (an unmount, a sandbox run) is finished off.
        drop(old);
        if crate::mounts::is_mounted(&rec.path)? {
            crate::mounts::unmount_lazy(&rec.path)?;
        }
        std::fs::create_dir_all(&rec.path).map_err(Error::io("create directory", &rec.path))?;
        let snapshot: SnapshotId = rec.snapshot.parse()?;
        let m = CowMount::mount(
            Arc::clone(&self.store),
            snapshot,
            &rec.private_dir,
            &rec.path,
            self.serving,
        )?;
        tracing::info!(workspace = %rec.id, path = %rec.path.display(), mode = self.serving.mode.as_str(), passthrough = m.passthrough(), "fuse workspace served");
        self.lock().insert(rec.id.clone(), m);
        Ok(())
    }

    fn exports(&self) -> std::sync::MutexGuard<'_, HashMap<String, NfsMount>> {
        self.exports.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// [`Host::mount_gated`] of an `nfs` workspace.
    fn mount_nfs_gated(&self, rec: &Record) -> Result<()> {
        let old = {
            let mut exports = self.exports();
            if exports.contains_key(&rec.id)
                && crate::mounts::is_mounted(&rec.path)?
                && nix::sys::statfs::statfs(&rec.path).is_ok()
            {
                return Ok(());
            }
            exports.remove(&rec.id)
        };
        drop(old);
        if crate::mounts::is_mounted(&rec.path)? {
            crate::mounts::unmount_lazy(&rec.path)?;
        }
        std::fs::create_dir_all(&rec.path).map_err(Error::io("create directory", &rec.path))?;
        let m = NfsMount::mount(Arc::clone(&self.store), rec)?;
        tracing::info!(workspace = %rec.id, path = %rec.path.display(), port = m.served.addr().port(), "nfs workspace served");
        self.exports().insert(rec.id.clone(), m);
        Ok(())
    }

    /// Finishes the copy-ups in progress of workspace `rec`: through its mount when served
    /// (the copier and the writers share its locks), else from the records on disk.
    pub fn finish_copies(&self, rec: &Record) -> Result<()> {
        if let Some(m) = self.exports().get(&rec.id) {
            return m.served.finish_copies();
        }
        let served = self
            .lock()
            .get(&rec.id)
            .map(|m| (Arc::clone(&m.cow), m.mode, m.serving()));
        match served {
            Some((cow, mode, serving)) => {
                if mode == OpenMode::Cached && serving {
                    writeback::write_back(&rec.path, &cow)?;
                }
                cow.lazy
                    .finish_all()
                    .map_err(Error::io("finish copy-ups in", &cow.layers.upper))
            }
            None => {
                let upper = rec.upper_dir();
                if !upper.exists() {
                    return Ok(());
                }
                lazy::finish_records(&upper, &self.store)
                    .map(drop)
                    .map_err(Error::io("finish copy-ups in", &upper))
            }
        }
    }

    /// Stops serving workspace `id` (its mount is detached if still there).
    pub fn unmount(&self, id: &str) -> bool {
        // Ended under the gate: its unmount by path must not meet a new mount there.
        let ended = self.gated(id, || {
            if let Some(e) = self.exports().remove(id) {
                drop(e);
                return Some(false);
            }
            let m = self.lock().remove(id)?;
            let large = m.inodes() >= TRIM_AFTER_INODES;
            drop(m);
            Some(large)
        });
        let Some(large) = ended else {
            return false;
        };
        if large {
            // After the reply: trimming walks the whole heap.
            let _ = std::thread::Builder::new()
                .name("trim".into())
                .spawn(crate::sys::trim_heap);
        }
        true
    }

    /// Stops serving workspace `id` as [`Host::unmount`] does, but gives back what is
    /// left of it (its inode tables, freed when dropped, and their memory given back to
    /// the system as `unmount` does): for a caller that frees it later.
    pub fn stop(&self, id: &str) -> Option<Box<dyn FnOnce() + Send + 'static>> {
        // The serving threads are not waited for here: they hold nothing the answer
        // depends on, and their end (each frees its request buffer) is later work.
        let exported = self.gated(id, || self.exports().remove(id));
        if let Some(e) = exported {
            return Some(Box::new(move || drop(e)) as Box<dyn FnOnce() + Send>);
        }
        let (m, threads) = self.gated(id, || {
            let mut m = self.lock().remove(id)?;
            let threads = m.end_session();
            Some((m, threads))
        })?;
        Some(Box::new(move || {
            if let Some(t) = threads {
                wait_for_session(t);
            }
            let large = m.inodes() >= TRIM_AFTER_INODES;
            drop(m);
            if large {
                crate::sys::trim_heap();
            }
        }))
    }

    /// Ids of the workspaces served.
    pub fn served(&self) -> Vec<String> {
        let mut v: Vec<String> = self.lock().keys().cloned().collect();
        v.extend(self.exports().keys().cloned());
        v.sort();
        v
    }

    /// Stops serving everything (daemon shutdown).
    pub fn unmount_all(&self) {
        let all: Vec<CowMount> = self.lock().drain().map(|(_, m)| m).collect();
        drop(all);
        let exports: Vec<NfsMount> = self.exports().drain().map(|(_, m)| m).collect();
        drop(exports);
    }
}
