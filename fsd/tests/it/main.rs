//! The daemon crate's integration tests, one binary: the snapshot view, the fuse
//! workspace server (open modes, placement, the model-based test), and the library's
//! materializers and git paths through real mounts.

mod common;
mod cowopen;
mod fromgit;
mod fulltree;
mod gitstatus;
mod layering;
mod model;
mod native;
mod nfs;
mod nfs_vm;
mod placement;
mod plainview;
mod view;
