//! All end-to-end tests in one binary, one module per area.

mod crash;
mod egress;
mod files;
mod fork;
mod longlived;
mod images;
mod pause;
mod remote;
mod run;
mod sandbox;
mod store_cli;
mod vm;
mod vm_egress;
mod vm_sandbox;
mod workspaces;
