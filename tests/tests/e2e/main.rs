//! All end-to-end tests in one binary, one module per area.

mod crash;
mod egress;
mod egress_inject;
mod files;
mod fork;
mod fork_fulltree;
mod image_distro;
mod image_mounts;
mod image_sandbox;
mod image_workdir;
mod images;
mod io_limit;
mod longlived;
mod pause;
mod quota;
mod remote;
mod run;
mod sandbox;
mod store_cli;
mod vm;
mod vm_egress;
mod vm_sandbox;
mod workspaces;
