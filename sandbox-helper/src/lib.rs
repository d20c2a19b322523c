//! The cowspace sandbox: runs a worker's command isolated from the host and from other
//! workers, with its workspace at `/workspace`.
//!
//! A sandbox is a process tree in new user, mount, pid, network, ipc, uts and cgroup
//! namespaces (root inside, a dedicated unprivileged uid range outside), with a fresh
//! tmpfs root holding only read-only system directories, a minimal `/dev`, a fresh
//! `/proc`, private `/tmp`, and the workspace (idmapped, read-write); cgroup limits on
//! memory, processes and CPU; `no_new_privs`, a reduced capability bounding set and a
//! seccomp filter. Published ports are forwarded from unique 127.0.0.1 host ports.
//!
//! Every control asked for is checked first; one this host cannot enforce is refused
//! with [`Error::Unsupported`] before anything runs. There is no fallback to running on
//! the host. See `docs/sandbox.md` and `docs/threat-model.md`.
//!
//! Layout: [`spec`] validates input; [`probe`] checks the host; [`alloc`] leases uid
//! ranges and ports; [`cgroup`] holds one file per controller; [`rootfs`] plans the view
//! and applies it through the [`syscall::Syscall`] seam; [`init`] is pid 1 inside;
//! [`net`] forwards published ports; [`run`] ties them together; `sys` holds the only
//! `unsafe` code; [`vm`] places a command in a qemu micro-VM instead.
//!
//! # Example
//!
//! ```no_run
//! use std::path::PathBuf;
//! use sandbox_helper::spec::Controls;
//! use sandbox_helper::{Options, Spec, SpecInput};
//!
//! let opts = Options {
//!     state_dir: PathBuf::from("/var/lib/cowspace/run/sandbox"),
//!     cgroup_root: PathBuf::from("/sys/fs/cgroup"),
//! };
//! let input = SpecInput {
//!     name: "worker-1".into(),
//!     dir: PathBuf::from("/srv/workspaces/worker-1"),
//!     controls: Controls {
//!         memory: Some("512m".into()),
//!         pids: Some(256),
//!         publish: vec![3000],
//!         ..Controls::default()
//!     },
//!     command: vec!["python3".into(), "-m".into(), "http.server".into(), "3000".into()],
//!     ..SpecInput::default()
//! };
//! let spec = Spec::validate(input, &opts.state_dir)?;
//! let outcome = sandbox_helper::run(&spec, &opts, |ready| {
//!     for p in &ready.published {
//!         eprintln!("published {} -> 127.0.0.1:{}", p.internal, p.host);
//!     }
//! })?;
//! std::process::exit(outcome.code.into());
//! # Ok::<(), sandbox_helper::Error>(())
//! ```
#![deny(unsafe_code)]

pub mod alloc;
pub mod cgroup;
pub mod egress;
pub mod error;
pub mod image;
pub mod init;
pub mod jail;
pub mod keeper;
pub use sandbox_api::mountinfo;
pub mod net;
pub mod overlay;
mod paths;
pub mod probe;
pub mod rootfs;
pub mod run;
pub mod seccomp;
pub mod serve;
pub mod share;
pub mod spec;
mod stale;
mod sys;
pub mod syscall;
#[cfg(test)]
mod testing;
pub mod vm;

pub use error::{Error, Kind, Result};
pub use run::{Options, Outcome, Published, Ready, run, start};
pub use spec::{Limits, Net, RoBind, Spec, SpecInput};

/// Default state directory: `$COWSPACE_ROOT/run/sandbox`, else
/// `/var/lib/cowspace/run/sandbox`.
pub fn default_state_dir() -> std::path::PathBuf {
    let root = std::env::var_os("COWSPACE_ROOT")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| "/var/lib/cowspace".into());
    root.join("run").join("sandbox")
}
