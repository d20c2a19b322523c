//! The one table of user-facing error kinds (string, exit code) that the runtime, the
//! helper, its keeper and the command line share, and the errors of this crate.

use std::io;

/// The stable user-facing kinds (a subset of cowspace's kinds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Bad input: a malformed name, path, limit or option.
    InvalidInput,
    /// A control that was asked for cannot be enforced on this host.
    Unsupported,
    /// Every uid range or port of the allowed range is taken, or the host uses the
    /// workspace's mount.
    Busy,
    /// No sandbox runs under that name.
    NotFound,
    /// A sandbox runs under that name already.
    Exists,
    /// Any other failure (I/O, a kernel call that failed).
    Io,
}

impl Kind {
    /// The kind named `s` (as [`Kind::as_str`] gives it); unknown names are `Io`.
    pub fn parse(s: &str) -> Kind {
        match s {
            "invalid_input" => Kind::InvalidInput,
            "unsupported" => Kind::Unsupported,
            "busy" => Kind::Busy,
            "not_found" => Kind::NotFound,
            "exists" => Kind::Exists,
            _ => Kind::Io,
        }
    }

    /// Exit code of the `sandbox-helper` binary (and `mountctl`) for this kind.
    pub fn exit_code(self) -> u8 {
        match self {
            Kind::InvalidInput => 9,
            Kind::Unsupported => 7,
            Kind::Busy => 5,
            Kind::NotFound => 3,
            Kind::Exists => 4,
            Kind::Io => 1,
        }
    }

    /// The name used in `--json` error objects.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::InvalidInput => "invalid_input",
            Kind::Unsupported => "unsupported",
            Kind::Busy => "busy",
            Kind::NotFound => "not_found",
            Kind::Exists => "exists",
            Kind::Io => "io",
        }
    }
}

/// What can go wrong talking to a keeper or reading a sandbox's controls.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad input (a name, a control, a request too large).
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// No long-lived sandbox of that name runs.
    #[error("not found: no sandbox {name:?} is running")]
    NotRunning {
        /// The sandbox's name.
        name: String,
    },
    /// Talking to a long-lived sandbox's keeper.
    #[error("talking to sandbox {name:?}: {source}")]
    Keeper {
        /// The sandbox's name.
        name: String,
        /// The cause.
        source: io::Error,
    },
    /// A keeper's refusal, as it answered it.
    #[error("{message}")]
    Answered {
        /// Its stable kind.
        kind: Kind,
        /// What it said.
        message: String,
        /// Its hint.
        hint: Option<String>,
    },
}

impl Error {
    /// The stable kind of this error.
    pub fn kind(&self) -> Kind {
        match self {
            Error::InvalidInput(_) => Kind::InvalidInput,
            Error::NotRunning { .. } => Kind::NotFound,
            Error::Keeper { .. } => Kind::Io,
            Error::Answered { kind, .. } => *kind,
        }
    }

    /// A short hint for the user, where one helps.
    pub fn hint(&self) -> Option<String> {
        match self {
            Error::NotRunning { .. } => Some("start it with `mountctl sandbox start WS`".into()),
            Error::Answered { hint, .. } => hint.clone(),
            _ => None,
        }
    }
}

/// Result with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
