//! The cowspace daemon: the filesystem cores, the read-only views of snapshots (`view`)
//! and fuse workspaces (`cow`), behind one interface (`filesystem`) served to the kernel
//! by one FUSE server (`fuse`); their placement on CPUs; the control socket's server.
//! Everything else a runtime needs is the `cowspace` library.
#![deny(unsafe_code)]

pub mod blobfiles;
pub mod control;
pub mod cow;
pub mod filesystem;
pub mod fuse;
pub mod nfs;
pub mod placement;
pub mod view;

pub(crate) use cowspace::{
    checkout, daemon, error, materializer, mounts, native, registry, runtime, sandbox, sys, upper,
};
