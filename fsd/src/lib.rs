//! The cowspace daemon: the read-only FUSE views of snapshots (`view`), the FUSE server of
//! fuse workspaces (`cow`), their placement on CPUs, and the control socket's server.
//! Everything else a runtime needs is the `cowspace` library.
#![deny(unsafe_code)]

pub mod blobfiles;
pub mod control;
pub mod cow;
mod fusecore;
pub mod placement;
pub mod view;

pub(crate) use cowspace::{
    checkout, daemon, error, materializer, mounts, native, registry, runtime, sandbox, sys, upper,
};
