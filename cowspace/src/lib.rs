//! The cowspace runtime: writable copy-on-write workspaces of snapshots (the
//! [`materializer::Materializer`] seam: overlay, fuse, btrfs, reflink, copy), the registry
//! of every workspace, commits and diffs, the git fsmonitor, and sandboxes around
//! workspaces.
//!
//! [`Runtime`] is the API a runtime embeds; `mountctl` and the daemon (`fsd`, which
//! serves the FUSE views and fuse workspaces) use it too.
#![deny(unsafe_code)]

pub mod checkout;
pub mod config;
pub mod daemon;
pub mod error;
pub mod fromgit;
pub mod gitfsmonitor;
pub mod import;
pub mod lockfile;
pub mod materializer;
pub mod mounts;
pub mod native;
pub mod ops;
pub mod plain;
pub mod procfs;
pub mod registry;
mod retention;
pub mod runtime;
pub mod sandbox;
pub mod served;
#[allow(unsafe_code)]
pub mod sys;
mod tmpname;
pub mod upper;
pub mod vm;
mod wspath;

pub use error::{Error, Result};
pub use runtime::Runtime;
pub use sys::fix_mmap_threshold;
