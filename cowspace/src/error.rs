//! Errors of workspaces and the daemon. Same conventions as the store's (`store/src/error.rs`):
//! variants name the failed step and carry the input; each maps to one stable kind.

use std::io;
use std::path::PathBuf;

pub use cowspace_store::ErrorKind;

/// Everything that can go wrong with workspaces.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Store(#[from] cowspace_store::Error),
    #[error("registry ({step}): {source}")]
    Registry {
        step: &'static str,
        source: rusqlite::Error,
    },
    #[error("{step} {path}: {source}")]
    Io {
        step: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("mount {target}: {source}")]
    Mount { target: PathBuf, source: nix::Error },
    #[error("unmount {target}: {source}")]
    Unmount { target: PathBuf, source: nix::Error },
    #[error("no workspace {} in this runtime root", cowspace_store::error::shown_bare(.0))]
    NoWorkspace(String),
    #[error("no such file or directory: {0}")]
    NoFile(String),
    #[error("a workspace named {0} exists already")]
    NameTaken(String),
    #[error("{0} exists already")]
    PathExists(PathBuf),
    #[error("workspace {id} is {}", busy_by(pids))]
    Busy { id: String, pids: Vec<i32> },
    /// A removal without `--force` that would lose what the workspace holds (a running
    /// sandbox, uncommitted changes): `what` says which, `hint` how to keep or drop it.
    #[error("workspace {id} {what}")]
    Keeps {
        id: String,
        what: String,
        hint: String,
    },
    #[error("the daemon still serves workspaces: {}", .users.join(", "))]
    DaemonInUse { users: Vec<String> },
    #[error("materializer {name} cannot work on this host: {why}")]
    Unsupported { name: String, why: String },
    /// A limit asked for that this host cannot enforce (`create --disk`, `--inodes`):
    /// `fix` says what would make it enforceable.
    #[error("{what} cannot be enforced here: {why}")]
    Unenforceable {
        what: String,
        why: String,
        fix: String,
    },
    #[error("invalid input: {0}")]
    Invalid(String),
    #[error("workspace {id} is {status}, not usable for {op}")]
    WrongState {
        id: String,
        status: String,
        op: &'static str,
    },
    #[error("the daemon: {0}")]
    Daemon(String),
    #[error("remote ref {name} on {remote}: {why}")]
    RemoteRef {
        remote: String,
        name: String,
        why: String,
    },
    /// An error the daemon answered a request with, as it said it.
    #[error("{message}")]
    Answered {
        kind: ErrorKind,
        message: String,
        hint: Option<String>,
    },
}

/// Who keeps a workspace busy, in words: the processes, or that none was found.
fn busy_by(pids: &[i32]) -> String {
    if pids.is_empty() {
        return "busy, and no process using it was found".to_string();
    }
    let list: Vec<String> = pids.iter().map(i32::to_string).collect();
    let what = if pids.len() == 1 {
        "process"
    } else {
        "processes"
    };
    format!("in use by {what} {}", list.join(", "))
}

impl Error {
    /// The stable kind (exit code, protocol `kind`).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Store(e) => e.kind(),
            Error::NoWorkspace(_) | Error::NoFile(_) => ErrorKind::NotFound,
            Error::NameTaken(_) | Error::PathExists(_) => ErrorKind::Exists,
            Error::Busy { .. } | Error::Keeps { .. } | Error::DaemonInUse { .. } => ErrorKind::Busy,
            Error::Answered { kind, .. } => *kind,
            Error::Unsupported { .. } | Error::Unenforceable { .. } => ErrorKind::Unsupported,
            Error::Invalid(_) => ErrorKind::InvalidInput,
            Error::WrongState { .. } | Error::RemoteRef { .. } => ErrorKind::Conflict,
            Error::Io { source, .. } if source.kind() == io::ErrorKind::NotFound => {
                ErrorKind::NotFound
            }
            Error::Registry { .. }
            | Error::Io { .. }
            | Error::Mount { .. }
            | Error::Unmount { .. }
            | Error::Daemon(_) => ErrorKind::Io,
        }
    }

    /// What the user can do about it.
    pub fn hint(&self) -> Option<String> {
        Some(match self {
            Error::Store(e) => return e.hint(),
            Error::Answered { hint, .. } => return hint.clone(),
            Error::Keeps { hint, .. } => hint.clone(),
            Error::Unenforceable { fix, .. } => fix.clone(),
            Error::RemoteRef { remote, name, .. } => format!(
                "`mountctl pull {remote}/{name}` (or `mountctl fetch`), commit on top of it and \
                 push again; `push --force` replaces it"
            ),
            Error::NoWorkspace(_) => "`mountctl list` shows the workspaces of this root".into(),
            Error::NameTaken(_) => "pick another --name, or remove the existing workspace".into(),
            Error::PathExists(_) => "give a --path that does not exist yet".into(),
            Error::Busy { pids, .. } if pids.is_empty() => {
                "a mount inside it, or a process in another mount namespace, may hold it; \
                 --force detaches it (it goes once unused)"
                    .into()
            }
            Error::Busy { .. } => "stop those processes, or pass --force to end them".into(),
            Error::DaemonInUse { .. } => "remove them first (`mountctl remove WS`), or pass \
                --force: their mounts then fail until `mountctl recover WS`"
                .into(),
            Error::Unsupported { .. } => {
                "`mountctl doctor` lists what each materializer needs; pick one that works here"
                    .into()
            }
            Error::WrongState { .. } => "`mountctl sweep` or `mountctl recover WS`".into(),
            _ => return None,
        })
    }

    pub fn io(step: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { step, path, source }
    }

    /// The error of a control-socket answer (`{"ok": false, "error": {...}}`).
    pub fn answered(resp: &serde_json::Value) -> Error {
        let e = &resp["error"];
        Error::Answered {
            kind: e["kind"]
                .as_str()
                .and_then(ErrorKind::parse)
                .unwrap_or(ErrorKind::Io),
            message: e["message"]
                .as_str()
                .unwrap_or("the daemon refused without saying why")
                .to_string(),
            hint: e["hint"].as_str().map(str::to_string),
        }
    }

    /// The error of a decoded control-socket answer.
    pub fn answered_body(e: crate::protocol::ErrorBody) -> Error {
        Error::Answered {
            kind: ErrorKind::parse(&e.kind).unwrap_or(ErrorKind::Io),
            message: e.message,
            hint: e.hint,
        }
    }

    pub(crate) fn reg(step: &'static str) -> impl FnOnce(rusqlite::Error) -> Error {
        move |source| Error::Registry { step, source }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_names_the_processes_or_says_none_was_found() {
        let busy = |pids: Vec<i32>| Error::Busy {
            id: "ws-1".into(),
            pids,
        };
        assert_eq!(
            busy(vec![12, 34]).to_string(),
            "workspace ws-1 is in use by processes 12, 34"
        );
        assert_eq!(
            busy(vec![7]).to_string(),
            "workspace ws-1 is in use by process 7"
        );
        let none = busy(vec![]);
        assert!(!none.to_string().contains("[]"), "{none}");
        assert!(none.to_string().contains("no process"), "{none}");
        assert!(none.hint().unwrap().contains("--force"));
    }
}
