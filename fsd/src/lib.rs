//! The cowspace daemon and workspace library: writable copy-on-write workspaces of
//! snapshots (the `Materializer` seam: overlay, fuse, btrfs, reflink, copy), the registry of
//! every workspace, the control socket, and (in `view`) the read-only FUSE view of
//! snapshots.
//!
//! [`runtime::Runtime`] is the API a runtime embeds; `mountctl` uses it too.
#![deny(unsafe_code)]

pub mod blobfiles;
pub mod checkout;
pub mod control;
pub mod cow;
pub mod daemon;
pub mod error;
pub mod fromgit;
mod fusecore;
pub mod gitfsmonitor;
pub mod materializer;
pub mod mounts;
pub mod native;
pub mod placement;
pub mod registry;
mod retention;
pub mod runtime;
pub mod sandbox;
#[allow(unsafe_code)]
mod sys;
pub mod upper;
pub mod view;
mod wspath;

pub use sys::fix_mmap_threshold;
