//! The read-only snapshot view: every stored snapshot as a directory of one FUSE mount,
//! loaded lazily, with stable inode numbers, reads served from blob-cache files.
//!
//! # Layout
//!
//! The mount root (inode 1) is an empty directory. Looking up a snapshot id there (64
//! lowercase hex digits) resolves that snapshot's root directory; anything else is
//! `ENOENT`. Below it is the snapshot's tree. Nothing is read from the store until the
//! kernel asks for it, and nothing is ever written: every mutating operation is `EROFS`.
//!
//! # Inode numbers (stable identity)
//!
//! An inode number is a function of the entry alone (see [`InodeKey`]):
//! `2 + (first 8 bytes LE of blake3::derive_key("cowspace view inode v1", key)) mod (2^48 - 2)`
//! where `key` is the path from the snapshot root, a 0 byte, the kind, the mode (u32 LE),
//! the content or subtree hash and the entry's data; directories prefix the snapshot id.
//! Consequences:
//! - a file keeps its number in every mount, after daemon restarts, and in every snapshot
//!   holding the same content at the same path with the same mode (so such snapshots
//!   share one kernel inode and one page cache);
//! - every name of a hard-link group has the primary's number;
//! - a directory belongs to exactly one snapshot (the kernel allows it one parent);
//! - numbers stay below 2^48, leaving overlayfs's `xino` room for its layer bits.
//!
//! Attributes are as stable: mtime = ctime = atime = [`VIEW_TIME_SECS`], `nlink` the
//! number of names of a regular file in its snapshot (hard links; counted once per
//! snapshot by walking its trees, only when it has any), 1 for other non-directories and
//! 2 for directories, size and permission bits (setuid, setgid and sticky included) from
//! the entry, the owner from [`ViewOptions`].
//!
//! Two different entries whose keys land on the same number while both are held is a
//! collision: the later one is rehashed with a salt counter (and logged), so its number is
//! then not stable. With 48 bits this is expected about once in 10^5 mounts of an
//! 80,000-file tree.
//!
//! # Inode lifetime and lookup counts
//!
//! The daemon keeps a table of the inodes the kernel holds, and nothing else:
//! - every reply that hands the kernel an inode — a positive `lookup` entry, and each
//!   `readdirplus` entry other than `.` and `..` — adds one to that inode's lookup count,
//!   creating the table entry if needed;
//! - `forget(ino, n)` (and each item of `batch_forget`) subtracts `n`; at zero the entry
//!   leaves the table. A `readdirplus` entry that did not fit the reply buffer is given
//!   back at once;
//! - the mount root is never counted and never forgotten;
//! - a request naming an inode not in the table is answered `ESTALE` (the kernel only
//!   names inodes it holds, so this means a bug);
//! - negative lookups inside a snapshot are answered as node id 0 with the entry
//!   lifetime, so the kernel caches the absence; at the mount root they are plain `ENOENT`
//!   (snapshots appear over time).
//!
//! The table's size is therefore bounded by the kernel's inode cache: dropping caches
//! (`echo 2 > /proc/sys/vm/drop_caches`) shrinks it. Decoded trees sit in a small bounded
//! cache shared by all snapshots (identical subtrees have one id).
//!
//! # Caching and reads
//!
//! Entries, negative entries and attributes carry a lifetime of one day. How files are
//! opened and read is the [`ReadMode`]:
//! - `Cached` (the default): the first OPEN is answered "not implemented" (as are
//!   OPENDIR and FLUSH), so the kernel opens files and directories without asking and
//!   keeps their pages and listings cached (its defaults for such opens); a `read`
//!   arrives without a handle and is served by inode from the blob-cache file (kept open
//!   in a small bounded set), which the daemon makes sure exists first. Warm reads never
//!   reach the daemon, and every workspace of a snapshot shares the pages.
//! - `Passthrough`: when the kernel granted `FUSE_PASSTHROUGH`, each open is answered
//!   with the blob-cache file as backing (one backing id per inode while opens live,
//!   stack depth 1 so kernel overlayfs accepts the view as a lower layer); reads and mmap
//!   never reach the daemon, but every open and close is a round trip.
//! - `Served`: opens get a handle and `FOPEN_KEEP_CACHE`; reads are positioned reads from
//!   the blob file kept open per handle.
//!
//! A mount with `xattrs` off (the plain view, `plain.rs`) answers getxattr and listxattr
//! "not implemented", so the kernel stops asking: overlayfs otherwise asks for an xattr on
//! every entry it looks up. A corrupt object is `EIO`, never data.
//!
//! ```no_run
//! use std::sync::Arc;
//! use cowspace_fsd::view::{ViewMount, ViewOptions};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = Arc::new(cowspace_store::Store::open(
//!     std::path::Path::new("/var/lib/cowspace"),
//!     cowspace_store::StoreConfig::default(),
//! )?);
//! let view = ViewMount::mount(store, std::path::Path::new("/var/lib/cowspace/run/snapshots"),
//!     ViewOptions::default())?;
//! // ... /var/lib/cowspace/run/snapshots/<snapshot-id>/ is the snapshot's tree ...
//! view.unmount()?;
//! # Ok(()) }
//! ```

mod core;
mod fs;
mod inode;
pub use cowspace::plain;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use cowspace_store::Store;
use fuser::{BackgroundSession, Config, MountOption, SessionACL};
use nix::mount::MntFlags;

use self::core::ViewCore;
pub use self::core::{VIEW_BLKSIZE_BYTES, VIEW_TIME_SECS};
use self::fs::ViewFs;
pub use self::inode::{INO_CONTEXT, INO_LIMIT, InodeKey};
pub use crate::fuse::TTL as ENTRY_TTL;

/// File system name shown in the mount table.
pub const VIEW_FSNAME: &str = "cowspace";
/// File system subtype shown in the mount table (`fuse.cowspace-view`).
pub const VIEW_SUBTYPE: &str = "cowspace-view";

/// How the view answers opens and reads of files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReadMode {
    /// No open requests: the first open is answered "not implemented", after which the
    /// kernel opens and closes every file of the view without asking the daemon and
    /// keeps each file's pages cached between opens. Reads reach the daemon only to fill
    /// that cache, which all workspaces of a snapshot share. The default: a warm read of
    /// many small files costs no round trip at all (docs/BENCHMARKS.md has the figures).
    #[default]
    Cached,
    /// Opens answered with a FUSE passthrough backing file (the blob-cache file): reads
    /// never reach the daemon, but every open and close is a round trip. Where the
    /// kernel has no passthrough, behaves as [`ReadMode::Served`].
    Passthrough,
    /// Opens answered with a handle; the daemon serves reads from the blob-cache file and
    /// the kernel keeps the pages cached.
    Served,
}

impl ReadMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ReadMode::Cached => "cached",
            ReadMode::Passthrough => "passthrough",
            ReadMode::Served => "served",
        }
    }

    pub fn parse(s: &str) -> Option<ReadMode> {
        [ReadMode::Cached, ReadMode::Passthrough, ReadMode::Served]
            .into_iter()
            .find(|m| m.as_str() == s)
    }
}

/// How to serve the view.
#[derive(Debug, Clone)]
pub struct ViewOptions {
    /// Request threads, each with its own `/dev/fuse` clone (0 = one per core).
    pub threads: usize,
    /// How opens and reads of files are answered.
    pub read_mode: ReadMode,
    /// Owner shown for every entry (default: the owner of the runtime root).
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// Serve extended attributes (the default). Off, the mount is a plain view: it
    /// answers `getxattr` and `listxattr` with `ENOSYS`, so the kernel stops asking after
    /// the first of each, and it serves only snapshots recorded as having no xattrs at
    /// all ([`plain`]); any other snapshot is `ENOENT` there.
    pub xattrs: bool,
}

impl Default for ViewOptions {
    fn default() -> ViewOptions {
        ViewOptions {
            threads: 0,
            read_mode: ReadMode::default(),
            uid: None,
            gid: None,
            xattrs: true,
        }
    }
}

/// What can go wrong mounting or unmounting the view.
#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    #[error("mount point {path}: {source}")]
    Mountpoint {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("mount point {0} is not a directory")]
    NotADirectory(PathBuf),
    #[error("stat runtime root {path}: {source}")]
    RootOwner {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("mount the snapshot view at {path}: {source}")]
    Mount {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "unmount the snapshot view at {path}: {source} (detached lazily; it goes away when the last user lets go)"
    )]
    Unmount {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Counters of a mounted view (for tests, benchmarks and diagnostics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ViewStats {
    /// Whether opens are answered with passthrough backing files.
    pub passthrough: bool,
    /// Inodes the kernel holds (the mount root not counted).
    pub inodes: usize,
    pub lookups: u64,
    pub opens: u64,
    pub passthrough_opens: u64,
    /// `read` requests served by the daemon (0 for passthrough opens).
    pub reads: u64,
    pub read_bytes: u64,
    /// `getxattr` and `listxattr` requests that reached the daemon.
    pub xattr_requests: u64,
    pub ino_collisions: u64,
}

/// A mounted view; unmounts on drop.
pub struct ViewMount {
    mountpoint: PathBuf,
    core: Arc<ViewCore>,
    session: Option<BackgroundSession>,
}

impl std::fmt::Debug for ViewMount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ViewMount")
            .field("mountpoint", &self.mountpoint)
            .finish()
    }
}

impl ViewMount {
    /// Mounts the view of `store` at `mountpoint` (an existing directory) and serves it
    /// from background threads until unmounted.
    pub fn mount(
        store: Arc<Store>,
        mountpoint: &Path,
        opts: ViewOptions,
    ) -> Result<ViewMount, ViewError> {
        let meta = std::fs::metadata(mountpoint).map_err(|source| ViewError::Mountpoint {
            path: mountpoint.to_path_buf(),
            source,
        })?;
        if !meta.is_dir() {
            return Err(ViewError::NotADirectory(mountpoint.to_path_buf()));
        }
        let (uid, gid) = match (opts.uid, opts.gid) {
            (Some(u), Some(g)) => (u, g),
            (u, g) => {
                let root =
                    std::fs::metadata(store.root()).map_err(|source| ViewError::RootOwner {
                        path: store.root().to_path_buf(),
                        source,
                    })?;
                (u.unwrap_or(root.uid()), g.unwrap_or(root.gid()))
            }
        };
        let threads = match opts.threads {
            0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
            n => n,
        };
        let core = Arc::new(ViewCore::new(store, uid, gid, opts.xattrs));
        let fs = ViewFs::new(Arc::clone(&core), opts.read_mode);
        let mut config = Config::default();
        config.mount_options = vec![
            MountOption::RO,
            MountOption::FSName(VIEW_FSNAME.into()),
            // fuser's own `Subtype` only reaches fusermount; the kernel takes it as an option.
            MountOption::CUSTOM(format!("subtype={VIEW_SUBTYPE}")),
            MountOption::DefaultPermissions,
            MountOption::NoAtime,
        ];
        // Root runs the daemon; sandboxed workers read the view as other users.
        config.acl = SessionACL::All;
        config.n_threads = Some(threads);
        config.clone_fd = true;
        let session = fuser::spawn_mount(
            crate::fuse::FuseServer::new(Arc::new(fs)),
            mountpoint,
            &config,
        )
        .map_err(|source| ViewError::Mount {
            path: mountpoint.to_path_buf(),
            source,
        })?;
        tracing::info!(
            mountpoint = %mountpoint.display(),
            threads,
            read_mode = opts.read_mode.as_str(),
            xattrs = opts.xattrs,
            passthrough = core.counters.passthrough.load(Ordering::Relaxed),
            "snapshot view mounted"
        );
        Ok(ViewMount {
            mountpoint: mountpoint.to_path_buf(),
            core,
            session: Some(session),
        })
    }

    /// Where the view is mounted.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Whether reads are passed through to blob-cache files.
    pub fn passthrough(&self) -> bool {
        self.core.counters.passthrough.load(Ordering::Relaxed)
    }

    /// Current counters.
    pub fn stats(&self) -> ViewStats {
        let c = &self.core.counters;
        ViewStats {
            passthrough: c.passthrough.load(Ordering::Relaxed),
            inodes: self.core.table.len(),
            lookups: c.lookups.load(Ordering::Relaxed),
            opens: c.opens.load(Ordering::Relaxed),
            passthrough_opens: c.passthrough_opens.load(Ordering::Relaxed),
            reads: c.reads.load(Ordering::Relaxed),
            read_bytes: c.read_bytes.load(Ordering::Relaxed),
            xattr_requests: c.xattr_requests.load(Ordering::Relaxed),
            ino_collisions: self.core.table.collisions(),
        }
    }

    /// Unmounts and waits for the serving threads. When the view is busy (an overlay on
    /// top of it, open files), it is detached lazily and `Unmount` is returned.
    pub fn unmount(mut self) -> Result<(), ViewError> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<(), ViewError> {
        let Some(session) = self.session.take() else {
            return Ok(());
        };
        match session.umount_and_join() {
            Ok(()) => Ok(()),
            Err(e) if e.raw_os_error() == Some(nix::libc::EBUSY) => {
                // Busy (an overlay on top, open files): detach so the path is free; the
                // serving threads end when the kernel drops the connection.
                if let Err(e) = nix::mount::umount2(&self.mountpoint, MntFlags::MNT_DETACH) {
                    tracing::error!(error = %e, mountpoint = %self.mountpoint.display(),
                        "lazy unmount of the snapshot view failed");
                }
                Err(ViewError::Unmount {
                    path: self.mountpoint.clone(),
                    source: e,
                })
            }
            Err(e) => {
                tracing::warn!(error = %e, "snapshot view threads ended with an error");
                Ok(())
            }
        }
    }
}

impl Drop for ViewMount {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::warn!(error = %e, "snapshot view unmounted lazily");
        }
    }
}

pub use cowspace::served::{served_file_stat, served_identity, served_time_secs};
