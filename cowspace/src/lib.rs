//! The cowspace runtime: writable copy-on-write workspaces of snapshots (the
//! [`Materializer`] seam: overlay, fuse, btrfs, reflink, copy), the registry of every
//! workspace, commits and diffs, imports, the git fsmonitor, the configuration, and
//! sandboxes (namespaces, or a micro-VM: [`vm`]) around workspaces.
//!
//! [`Runtime`] is the API a runtime embeds; `mountctl` and the daemon (`fsd`, which
//! serves the FUSE views and fuse workspaces) use it too. The modules below the curated
//! ones are the pieces the daemon and the command line share with the runtime: public,
//! so they can, but not part of what an embedder needs (hidden from the docs).
#![deny(unsafe_code)]

pub mod config;
pub mod daemon;
pub mod error;
pub mod files;
pub mod fromgit;
pub mod gitfsmonitor;
mod gitindex;
pub mod image;
pub mod import;
pub mod kinds;
pub mod materializer;
pub mod ops;
pub mod protocol;
pub mod quota;
pub mod registry;
pub mod remote;
pub mod runtime;
pub mod sandbox;
mod sandbox_image;
mod sandbox_net;
pub mod vm;
mod vmrun;
pub mod watch;

#[doc(hidden)]
pub mod checkout;
#[doc(hidden)]
pub mod lockfile;
#[doc(hidden)]
pub mod mounts;
#[doc(hidden)]
pub mod native;
#[doc(hidden)]
pub mod plain;
#[doc(hidden)]
pub mod procfs;
mod retention;
#[doc(hidden)]
pub mod served;
mod subvol;
#[doc(hidden)]
#[allow(unsafe_code)]
pub mod sys;
mod tmpname;
#[doc(hidden)]
pub mod upper;
mod wspath;

pub use config::Config;
pub use error::{Error, Result};
pub use import::{ImportRequest, Imported};
pub use materializer::{
    LowerKind, Materializer, MaterializerKind, Materializers, WorkspaceCtx, plaindir::PlainDir,
};
pub use registry::{Record, Status};
pub use runtime::{CommitOptions, CreateOptions, Runtime};
pub use sandbox::SandboxOptions;
pub use sys::fix_mmap_threshold;
