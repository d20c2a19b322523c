//! The cowspace store: a content-addressed chunk store for repository snapshots.
//!
//! Files are cut into chunks (one chunk up to 256 KiB, FastCDC above), addressed by
//! BLAKE3, zstd-compressed into append-once pack files indexed in SQLite. Directories are
//! canonically encoded trees (a Merkle tree); a snapshot is a root tree plus provenance;
//! refs are names moved by compare-and-swap. No FUSE, no privileges.
//!
//! ```no_run
//! use cowspace_store::{Store, StoreConfig, ImportOptions};
//! # fn main() -> cowspace_store::Result<()> {
//! let root = std::path::Path::new("/tmp/cowspace-example");
//! let store = Store::init(root, StoreConfig::default())?;
//! let mut opts = ImportOptions::new();
//! opts.ref_name = Some("myrepo/main".into());
//! let report = store.import_dir(std::path::Path::new("."), &opts)?;
//! println!("snapshot {} ({} files)", report.snapshot, report.files);
//! store.export_dir(&report.snapshot, std::path::Path::new("/tmp/cowspace-export"))?;
//! # Ok(()) }
//! ```
//!
//! See `docs/store-format.md` for the on-disk format and its invariants.
#![deny(unsafe_code)]

pub mod adopt;
pub mod blobcache;
pub mod browse;
pub mod codec;
mod content;
pub mod diff;
pub mod edit;
pub mod error;
pub mod export;
pub mod fsck;
pub mod gc;
mod gitloose;
mod gitpack;
mod group;
pub mod id;
pub mod image;
pub mod import;
pub mod index;
mod ingest;
pub mod layout;
mod lazy;
pub mod lock;
pub mod pack;
pub mod refs;
pub mod remote;
pub mod repack;
pub mod repair;
pub mod snapshot;
pub mod statcache;
mod store;
mod suspects;
pub mod tree;
mod writer;
mod xattrs;

pub use edit::Editor;
pub use error::{Error, ErrorKind, Result};
pub use id::{ChunkId, ContentId, SnapshotId, TreeId};
pub use import::{ImportOptions, ImportReport, Progress, ProgressFn};
pub use ingest::FileContent;
pub use refs::Expect;
pub use snapshot::{Snapshot, Source};
pub use store::{Store, StoreConfig};
pub use tree::{Entry, Kind, Tree};
