//! Errors of the store.
//!
//! Conventions (followed by every module of this crate):
//! - A variant names the step that failed and carries the path, id or input it failed on.
//! - Every variant maps to one of the few stable user-facing [`ErrorKind`]s, which the
//!   command line turns into exit codes and the control protocol into `kind` strings.
//! - A variant that has a fix for the user returns it from [`Error::hint`].

use std::io;
use std::path::PathBuf;

/// Longest user input a message repeats whole; a longer one is cut to
/// [`SHOWN_PREFIX_CHARS`] and its length said.
pub const MAX_SHOWN_CHARS: usize = 80;
/// How much of a too-long input a message shows.
pub const SHOWN_PREFIX_CHARS: usize = 40;

/// A user's input (a name, a ref, a path) as a message repeats it: quoted; an empty one
/// said to be empty (an invisible `""` is easy to miss); a very long one cut, with its
/// length (a 5,000-character ref would bury the message).
pub fn shown(input: &str) -> String {
    let n = input.chars().count();
    if n == 0 {
        "\"\" (an empty name)".into()
    } else if n > MAX_SHOWN_CHARS {
        let head: String = input.chars().take(SHOWN_PREFIX_CHARS).collect();
        format!("{:?}… ({n} characters)", head)
    } else {
        format!("{input:?}")
    }
}

/// [`shown`], but a plain word (letters, digits, `._/:@+-`) is left unquoted, as
/// messages that name workspaces and refs print them.
pub fn shown_bare(input: &str) -> String {
    let plain = input
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"._/:@+-".contains(&b));
    if plain && !input.is_empty() && input.len() <= MAX_SHOWN_CHARS {
        input.to_string()
    } else {
        shown(input)
    }
}

/// The stable kinds of failure, shared with `mountctl`'s exit codes and the control protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Malformed or unsafe input: bad path, unsafe tar entry, malformed id.
    InvalidInput,
    /// No such snapshot, ref, object or source.
    NotFound,
    /// The thing to create is already there.
    Exists,
    /// In use by someone else.
    Busy,
    /// Not possible on this host.
    Unsupported,
    /// A ref moved since it was read.
    Conflict,
    /// Stored data does not match its hash or cannot be decoded.
    Corrupt,
    /// Anything else: I/O, database, internal.
    Io,
}

impl ErrorKind {
    /// The kind named `name` ([`ErrorKind::as_str`]).
    pub fn parse(name: &str) -> Option<ErrorKind> {
        [
            ErrorKind::InvalidInput,
            ErrorKind::NotFound,
            ErrorKind::Exists,
            ErrorKind::Busy,
            ErrorKind::Unsupported,
            ErrorKind::Conflict,
            ErrorKind::Corrupt,
            ErrorKind::Io,
        ]
        .into_iter()
        .find(|k| k.as_str() == name)
    }

    /// The name used in JSON output and the control protocol.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidInput => "invalid_input",
            ErrorKind::NotFound => "not_found",
            ErrorKind::Exists => "exists",
            ErrorKind::Busy => "busy",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Corrupt => "corrupt",
            ErrorKind::Io => "io",
        }
    }

    /// The process exit code `mountctl` uses for this kind (see CLI.md).
    pub fn exit_code(self) -> u8 {
        match self {
            ErrorKind::Io => 1,
            ErrorKind::NotFound => 3,
            ErrorKind::Exists => 4,
            ErrorKind::Busy => 5,
            ErrorKind::Conflict => 6,
            ErrorKind::Unsupported => 7,
            ErrorKind::Corrupt => 8,
            ErrorKind::InvalidInput => 9,
        }
    }
}

/// Everything that can go wrong in the store.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no runtime root at {0} (or it was not initialised)")]
    RootMissing(PathBuf),
    #[error("a runtime root is already initialised at {0}")]
    RootExists(PathBuf),
    #[error("the runtime root {root} is inside the source {source_dir} being imported")]
    RootInsideSource { root: PathBuf, source_dir: PathBuf },
    #[error(
        "store format version {found} at {path} is not supported (this build reads {supported})"
    )]
    FormatVersion {
        path: PathBuf,
        found: String,
        supported: u32,
    },
    #[error("{step} {path}: {source}")]
    Io {
        step: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("index database ({step}): {source}")]
    Db {
        step: &'static str,
        source: rusqlite::Error,
    },
    #[error("source {0} does not exist")]
    SourceMissing(PathBuf),
    #[error("invalid input: {0}")]
    Invalid(String),
    #[error("unsafe entry {entry:?} in {archive}: {why}")]
    UnsafeEntry {
        archive: String,
        entry: String,
        why: String,
    },
    #[error("{what} {name} not found")]
    NotFound { what: &'static str, name: String },
    #[error("no remote is configured in this runtime root")]
    NoRemote,
    #[error("{0} is ambiguous: it matches more than one snapshot")]
    Ambiguous(String),
    #[error("ref {name} is at {}, not at the expected {expected}", ref_at(.actual))]
    RefConflict {
        name: String,
        /// Snapshot ids in hex (this module sits below `id`, which uses its errors).
        expected: String,
        /// Where the ref is (`None`: it does not exist).
        actual: Option<String>,
    },
    #[error("ref {name} already exists at {actual}; moving it needs --expect {actual}")]
    RefExists { name: String, actual: String },
    #[error("{what} exists already: {path}")]
    DestinationExists { what: &'static str, path: PathBuf },
    #[error("corrupt {what} {id}: {why}")]
    Corrupt {
        what: &'static str,
        id: String,
        why: String,
    },
    #[error("git {step} in {repo}: {why}")]
    Git {
        step: &'static str,
        repo: PathBuf,
        why: String,
    },
    #[error("the store is busy: {0}")]
    Busy(String),
    #[error("{0}")]
    Unsupported(String),
    #[error("remote {remote} ({object}): {why}")]
    Remote {
        remote: String,
        object: String,
        why: String,
    },
}

impl Error {
    /// The stable kind of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::RootMissing(_)
            | Error::SourceMissing(_)
            | Error::NotFound { .. }
            | Error::NoRemote => ErrorKind::NotFound,
            Error::RootExists(_) | Error::DestinationExists { .. } => ErrorKind::Exists,
            Error::RootInsideSource { .. }
            | Error::Invalid(_)
            | Error::UnsafeEntry { .. }
            | Error::Ambiguous(_) => ErrorKind::InvalidInput,
            Error::RefConflict { .. } | Error::RefExists { .. } => ErrorKind::Conflict,
            Error::Corrupt { .. } => ErrorKind::Corrupt,
            Error::Busy(_) => ErrorKind::Busy,
            Error::Unsupported(_) | Error::FormatVersion { .. } => ErrorKind::Unsupported,
            Error::Git { .. } => ErrorKind::InvalidInput,
            Error::Io { source, .. } if source.kind() == io::ErrorKind::NotFound => {
                ErrorKind::NotFound
            }
            Error::Io { .. } | Error::Db { .. } | Error::Remote { .. } => ErrorKind::Io,
        }
    }

    /// What the user can do about it, when there is something.
    pub fn hint(&self) -> Option<String> {
        Some(match self {
            // `init` cannot make a root where something else is.
            Error::RootMissing(p) if p.exists() && !p.is_dir() => format!(
                "{} is not a directory: pick another --root (or move that file away)",
                p.display()
            ),
            Error::RootMissing(p) => {
                format!("run `mountctl --root {} init` first", p.display())
            }
            Error::RootExists(_) => "use the existing root, or pick another --root".into(),
            Error::RootInsideSource { .. } => {
                "put the runtime root outside the tree (--root DIR or COWSPACE_ROOT)".into()
            }
            Error::RefConflict { actual: None, .. } => {
                "the ref does not exist: leave out --expect to create it".into()
            }
            Error::RefConflict {
                actual: Some(actual),
                ..
            } => {
                format!("re-read the ref; pass --expect {actual} if overwriting it is intended")
            }
            Error::RefExists { actual, .. } => format!("pass --expect {actual}"),
            Error::DestinationExists { .. } => "choose a path that does not exist yet".into(),
            Error::Corrupt { .. } => {
                "run `mountctl fsck` to list every damaged object; re-import the source".into()
            }
            // Too short for a prefix: a real snapshot's short prefix must not read as
            // missing for no reason.
            Error::NotFound {
                what: "snapshot or ref",
                name,
            } if name.len() < MIN_PREFIX_HEX && name.bytes().all(|b| b.is_ascii_hexdigit()) => {
                format!(
                    "a snapshot id prefix needs at least {} hex digits; `mountctl snapshots` \
                     lists the ids",
                    MIN_PREFIX_HEX
                )
            }
            Error::NotFound {
                what: "snapshot or ref",
                ..
            } => "`mountctl snapshots` and `mountctl refs` list what exists".into(),
            Error::Ambiguous(_) => "give more hex digits of the snapshot id".into(),
            Error::NoRemote => "add one with `mountctl remote add NAME s3://BUCKET/PREFIX \
                [--endpoint URL]` (the first one added is the default), then retry"
                .into(),
            Error::Busy(_) => "wait for the other operation to finish and retry".into(),
            Error::Remote { remote, .. } => format!(
                "check that remote {remote} answers (`mountctl doctor`) and that the AWS \
                 credentials in the environment are valid, then retry; nothing was changed \
                 here, and reads work again once it answers"
            ),
            _ => return None,
        })
    }

    pub(crate) fn io(
        step: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { step, path, source }
    }

    pub(crate) fn db(step: &'static str) -> impl FnOnce(rusqlite::Error) -> Error {
        move |source| Error::Db { step, source }
    }

    pub(crate) fn corrupt(what: &'static str, id: impl ToString, why: impl Into<String>) -> Error {
        Error::Corrupt {
            what,
            id: id.to_string(),
            why: why.into(),
        }
    }

    pub(crate) fn not_found(what: &'static str, name: impl Into<String>) -> Error {
        Error::NotFound {
            what,
            name: name.into(),
        }
    }
}

/// The store's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Where a ref is, in a conflict's message.
fn ref_at(at: &Option<String>) -> &str {
    at.as_deref().unwrap_or("nothing (no such ref)")
}

/// The fewest hex digits a snapshot id prefix may have (the rule `refs` applies, stated
/// here beside the hint that names it).
pub const MIN_PREFIX_HEX: usize = 6;
