//! Errors of the sandbox helper.
//!
//! Conventions: every variant names the step that failed and carries the path or input it
//! failed on. [`Error::kind`] maps a variant to one of the few stable user-facing kinds,
//! and [`Kind::exit_code`] maps a kind to the exit codes of `CLI.md` (7 unsupported,
//! 9 invalid input, 5 busy, 1 other).

use std::io;
use std::path::PathBuf;

pub use sandbox_api::Kind;

/// Everything that can go wrong while validating, setting up or running a sandbox.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The caller's input was refused before anything was created.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// A requested control cannot be enforced; nothing was run.
    #[error("unsupported: {control} cannot be enforced: {reason}")]
    Unsupported {
        /// The control, e.g. `memory limit`, `user namespace`.
        control: &'static str,
        /// What the host lacks.
        reason: String,
    },
    /// A VM run cannot be placed on this host (software emulation not accepted, a
    /// missing qemu, virtiofsd, guest kernel or busybox, or a control a VM does not
    /// enforce yet); nothing was started.
    #[error("unsupported: vm placement: {what}: {reason}")]
    VmUnavailable {
        /// What is missing or refused, e.g. `guest kernel`, `isolation`.
        what: &'static str,
        /// Why, and the fix.
        reason: String,
    },
    /// All uid ranges or ports are leased by running sandboxes.
    #[error("busy: {0}")]
    Busy(String),
    /// Preparing the state directory (locks, per-run directory).
    #[error("state directory {path}: {source}")]
    StateDir {
        /// The path that failed.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// Opening the workspace or a `--ro-bind` source.
    #[error("opening {path}: {source}")]
    OpenSource {
        /// The path that failed.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// Creating a cgroup, writing a limit or moving a process into it.
    #[error("cgroup {step} at {path}: {source}")]
    Cgroup {
        /// What was being done (`create`, `write memory.limit_in_bytes`, ...).
        step: &'static str,
        /// The cgroup file or directory.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// A limit read back after being written is not what was asked for.
    #[error("cgroup limit {path} reads back {got:?}, expected {wanted:?}")]
    CgroupReadBack {
        /// The cgroup file.
        path: PathBuf,
        /// What was written.
        wanted: String,
        /// What was read.
        got: String,
    },
    /// Building the seccomp filter.
    #[error("building the seccomp filter: {0}")]
    Seccomp(String),
    /// `clone(2)` of the sandbox init into new namespaces.
    #[error("creating the sandbox namespaces (clone): {0}")]
    Clone(io::Error),
    /// Writing `/proc/PID/uid_map` or `gid_map`.
    #[error("writing the sandbox's {file}: {source}")]
    IdMap {
        /// `uid_map` or `gid_map`.
        file: &'static str,
        /// The cause.
        source: io::Error,
    },
    /// Making a detached (bind or idmapped) mount for the sandbox's view.
    #[error("preparing the mount of {path}: {source}")]
    DetachedMount {
        /// The host path.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// Talking to the sandbox init over the setup socket.
    #[error("talking to the sandbox init: {0}")]
    Sync(io::Error),
    /// A step inside the sandbox failed before the command ran.
    #[error("setting up the sandbox: {step}: {source}")]
    Setup {
        /// The step, e.g. `pivot_root`, `mount /proc`.
        step: String,
        /// The cause.
        source: io::Error,
    },
    /// The command could not be started inside the sandbox.
    #[error("starting {command:?} inside the sandbox: {source}")]
    Exec {
        /// The command.
        command: String,
        /// The cause.
        source: io::Error,
    },
    /// Waiting for the sandbox init.
    #[error("waiting for the sandbox: {0}")]
    Wait(io::Error),
    /// The host's overlay of the workspace is in use on the host, so it cannot be
    /// replaced by the mount it shares with a long-lived sandbox.
    #[error(
        "busy: {path} is in use on the host (a process has its working directory or a file \
         open there), so it cannot be remounted for the sandbox"
    )]
    HostBusy {
        /// The workspace path.
        path: PathBuf,
    },
    /// A long-lived sandbox of that name runs already.
    #[error("exists: a sandbox {name:?} is running already")]
    AlreadyRunning {
        /// The sandbox's name.
        name: String,
    },
    /// A step of starting or talking to the egress proxy.
    #[error("egress proxy: {step}: {source}")]
    Egress {
        /// What was being done.
        step: &'static str,
        /// The cause.
        source: io::Error,
    },
    /// The egress proxy is gone: the sandbox has no way out until it is started again.
    #[error("egress proxy lost: {0}")]
    EgressLost(String),
    /// A request that needs something the running sandbox was not started with (a
    /// policy change without `--net egress`, a port published without a loopback).
    #[error("invalid input: {0}")]
    NotStartedWith(String),
    /// A port is published already, or not published.
    #[error("exists: {0}")]
    PortPublished(String),
    /// A port to unpublish is not published.
    #[error("not found: {0}")]
    PortNotPublished(String),
    /// Talking to a keeper, or a control read by the shared API.
    #[error(transparent)]
    Api(#[from] sandbox_api::Error),
}

impl Error {
    /// The stable kind of this error.
    pub fn kind(&self) -> Kind {
        match self {
            Error::Api(e) => e.kind(),
            Error::InvalidInput(_) => Kind::InvalidInput,
            Error::Unsupported { .. } | Error::VmUnavailable { .. } => Kind::Unsupported,
            Error::Busy(_) | Error::HostBusy { .. } => Kind::Busy,
            Error::PortNotPublished(_) => Kind::NotFound,
            Error::AlreadyRunning { .. } | Error::PortPublished(_) => Kind::Exists,
            Error::NotStartedWith(_) => Kind::InvalidInput,
            Error::Exec { source, .. } if source.kind() == io::ErrorKind::NotFound => {
                Kind::InvalidInput
            }
            // A path of the view that became a symlink after validation.
            Error::DetachedMount { source, .. } if source.raw_os_error() == Some(libc::ELOOP) => {
                Kind::InvalidInput
            }
            _ => Kind::Io,
        }
    }

    /// A short hint for the user, where one helps.
    pub fn hint(&self) -> Option<String> {
        match self {
            Error::Api(e) => e.hint(),
            other => other.static_hint().map(str::to_string),
        }
    }

    fn static_hint(&self) -> Option<&'static str> {
        match self {
            Error::Unsupported { .. } => Some(
                "run `sandbox-helper probe` to see which controls this host can enforce; \
                 drop the control or fix the host (the helper never runs without it)",
            ),
            Error::VmUnavailable { .. } => Some(
                "`mountctl doctor` shows what a VM run would use on this host and what is missing",
            ),
            Error::Busy(_) => Some("wait for other sandboxes to end"),
            Error::HostBusy { .. } => Some(
                "leave the workspace on the host (cd elsewhere, close its files; `fuser -vm PATH` \
                 lists the users), then start the sandbox again",
            ),
            Error::AlreadyRunning { .. } => {
                Some("use `mountctl exec WS -- CMD`, or `mountctl sandbox stop WS` first")
            }
            Error::Exec { .. } => Some("the command must exist inside the sandbox's view"),
            Error::EgressLost(_) => Some(
                "stop the sandbox (`mountctl sandbox stop WS`) and start it again with its policy",
            ),
            Error::NotStartedWith(_) => {
                Some("stop the sandbox and start it again with the control it needs")
            }
            Error::DetachedMount { source, .. } if source.raw_os_error() == Some(libc::ELOOP) => {
                Some(
                    "a component of that path is a symlink (made after it was checked): \
                     the sandbox's mounts are opened without following symlinks; give a \
                     path without symlinks",
                )
            }
            _ => None,
        }
    }
}

/// Result with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mount_source_that_became_a_symlink_is_invalid_input_with_a_hint() {
        let swapped = Error::DetachedMount {
            path: "/srv/shared/out".into(),
            source: io::Error::from_raw_os_error(libc::ELOOP),
        };
        assert_eq!(swapped.kind().exit_code(), 9);
        assert!(
            swapped
                .hint()
                .unwrap()
                .contains("without following symlinks")
        );
        let other = Error::DetachedMount {
            path: "/srv/shared/out".into(),
            source: io::Error::from_raw_os_error(libc::EIO),
        };
        assert_eq!(other.kind(), Kind::Io);
        assert!(other.hint().is_none());
    }
}
