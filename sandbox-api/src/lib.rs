//! What cowspace's runtime and its privileged sandbox helper share, and nothing more:
//! the controls a sandbox is asked for ([`spec::Controls`], [`spec::Net`], the name
//! rule), the one table of error kinds and exit codes ([`Kind`]), an exec request, the
//! client of a long-lived sandbox's keeper ([`keeper::Client`]), the framing of their
//! socket ([`msg`]), the decision log's place, and the one mountinfo parser.
//!
//! The runtime library (`cowspace`) depends on this crate, not on `sandbox-helper`: it
//! runs the helper as a program and talks to its keepers, and needs none of the
//! helper's namespaces, cgroups, seccomp or VM code.
#![deny(unsafe_code)]

pub mod error;
pub mod exec;
pub mod keeper;
pub mod mountinfo;
pub mod msg;
pub mod size;
pub mod spec;
mod sys;

pub use error::{Error, Kind, Result};

/// The egress decision log of sandbox `name` under the helper's state directory (JSON
/// lines, written by its proxy, removed when the sandbox stops).
pub fn egress_log_path(state: &std::path::Path, name: &str) -> std::path::PathBuf {
    state.join("keep").join(format!("{name}.egress.log"))
}
