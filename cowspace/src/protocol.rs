//! The control socket's messages as types (`docs/control-protocol.md`): one [`Request`]
//! enum, decoded once by the daemon and encoded by [`crate::daemon::Client`], and the
//! [`Response`] envelope. The JSON on the wire is `{"op": OP, "args": {...}}`; `args` may
//! be left out when every argument has a default.
//!
//! Every argument object refuses keys it does not know (`invalid_input` naming the key
//! and the operation): a typo such as `memroy` must never start a sandbox without its
//! memory limit. Requests whose arguments are a workspace plus an options struct
//! ([`WithWorkspace`], [`SandboxStartArgs`]) split the object by key and decode each part
//! strictly, since serde's `flatten` cannot be combined with `deny_unknown_fields`.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::runtime::{CommitOptions, CreateOptions};

/// The protocol's version, answered by `ping` as `protocol`: clients refuse a daemon whose
/// version differs from theirs. It changes only when a request or answer changes
/// incompatibly (an added operation or argument does not change it).
pub const PROTOCOL_VERSION: u32 = 1;

/// Arguments that are nothing but a workspace.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceArg {
    /// The workspace's id, unique id prefix or name.
    pub workspace: String,
}

/// No arguments.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoArgs {}

/// A workspace beside the options of an operation on it, on the wire as one object.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WithWorkspace<T> {
    pub workspace: String,
    pub options: T,
}

/// `list`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ListArgs {
    /// Also removed workspaces.
    pub all: bool,
}

/// `diff`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiffArgs {
    pub workspace: String,
    /// A unified patch of text files too.
    #[serde(default)]
    pub patch: bool,
    /// Paths the base's exclusion policy leaves out too.
    #[serde(default)]
    pub include_excluded: bool,
}

/// `remove`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoveArgs {
    pub workspace: String,
    /// Remove even with a running sandbox, uncommitted changes or processes using it.
    #[serde(default)]
    pub force: bool,
}

/// `sandbox_start`: the workspace, the placement, and the sandbox's controls.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SandboxStartArgs {
    pub workspace: String,
    /// In a micro-VM instead of namespaces.
    pub vm: bool,
    /// Run a VM under software emulation (which does not isolate).
    pub accept_emulation: bool,
    pub controls: crate::sandbox::SandboxOptions,
}

/// `sandbox_publish` and `sandbox_unpublish`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxPortArgs {
    pub workspace: String,
    /// The port inside the sandbox.
    pub port: u16,
}

/// `sandbox_log`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxLogArgs {
    pub workspace: String,
    /// Only the last this many decisions (default: all kept).
    #[serde(default)]
    pub tail: Option<usize>,
}

/// `files_stat`, `files_list` (with `recursive`), `files_read`, `files_write`,
/// `files_mkdir`, `files_remove`, `files_rename`, `files_symlink`: a path inside a
/// workspace and what the operation takes (`docs/files.md`). Contents travel as base64.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilesArgs {
    pub workspace: String,
    /// A path inside the workspace (`src/a.py`, `/src/a.py`, `.`).
    #[serde(default)]
    pub path: String,
    /// The path's exact bytes in hex, for a name that is not UTF-8 (as listings give
    /// it in `path_hex`); instead of `path`.
    #[serde(default)]
    pub path_hex: Option<String>,
    /// `files_list`: every entry below, not one level.
    #[serde(default)]
    pub recursive: bool,
    /// `files_read`: where to start.
    #[serde(default)]
    pub offset: u64,
    /// `files_read`: how many bytes at most (default and bound: 64 MiB).
    #[serde(default)]
    pub length: Option<u64>,
    /// `files_write`: the contents, base64.
    #[serde(default)]
    pub data: Option<String>,
    /// `files_write`, `files_mkdir`: permission bits.
    #[serde(default)]
    pub mode: Option<u32>,
    /// `files_write`: add to the file instead of replacing it.
    #[serde(default)]
    pub append: bool,
    /// `files_mkdir`: make missing parents, no error if it exists.
    #[serde(default)]
    pub parents: bool,
    /// `files_rename`: the new path; `files_symlink`: the link's target.
    #[serde(default)]
    pub to: Option<String>,
}

impl FilesArgs {
    /// The path inside the workspace: `path_hex`'s bytes when given, else `path`.
    pub fn inside(&self) -> Result<std::path::PathBuf> {
        use std::os::unix::ffi::OsStringExt;
        match &self.path_hex {
            Some(h) if !self.path.is_empty() => Err(Error::Invalid(format!(
                "args.path {:?} and args.path_hex {h:?}: give one",
                self.path
            ))),
            Some(h) => hex::decode(h)
                .map(|b| std::ffi::OsString::from_vec(b).into())
                .map_err(|e| Error::Invalid(format!("args.path_hex {h:?}: not hex: {e}"))),
            None => Ok(self.path.clone().into()),
        }
    }
}

/// `prepare_native`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotArg {
    /// A snapshot id, unique prefix or ref.
    pub snapshot: String,
}

/// `ref_set`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefSetArgs {
    pub name: String,
    pub snapshot: String,
    #[serde(default)]
    pub expect: Option<String>,
    #[serde(default)]
    pub force: bool,
}

/// `ref_delete`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefDeleteArgs {
    pub name: String,
    /// The snapshot the ref must hold.
    pub expect: String,
}

/// `show`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShowArgs {
    pub snapshot: String,
    #[serde(default)]
    pub path: String,
}

/// `push`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PushArgs {
    pub snapshot: String,
    #[serde(default)]
    pub remote: Option<String>,
    #[serde(default)]
    pub force: bool,
}

/// `pull`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PullArgs {
    pub snapshot: String,
    #[serde(default)]
    pub remote: Option<String>,
}

/// `fetch`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FetchArgs {
    pub remote: Option<String>,
}

/// `remote_gc`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RemoteGcArgs {
    pub remote: Option<String>,
    pub dry_run: bool,
    /// Seconds a mark must be old before what it named is deleted.
    pub grace: Option<i64>,
}

/// `export`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportArgs {
    pub snapshot: String,
    /// An absolute path that must not exist.
    pub dest: String,
    #[serde(default)]
    pub tar: bool,
}

/// `import`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ImportArgs {
    /// An absolute path: a directory, a tar archive, or a git repository with `git`.
    pub source: String,
    pub git: Option<String>,
    #[serde(rename = "ref")]
    pub ref_name: Option<String>,
    pub message: Option<String>,
    pub excludes: Vec<String>,
    pub no_default_excludes: bool,
    pub allow_devices: bool,
    pub allow_external_symlinks: bool,
    pub zstd_level: Option<i32>,
    pub threads: Option<usize>,
    pub no_git_fsmonitor: bool,
    /// Send `{"event": "progress", ...}` lines before the answer.
    pub progress: bool,
}

/// `shutdown`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShutdownArgs {
    /// Stop even while workspaces use the daemon.
    pub force: bool,
}

/// One request on the control socket.
// One request is decoded per message; the sandbox controls make a few variants larger.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    tag = "op",
    content = "args",
    rename_all = "snake_case",
    deny_unknown_fields
)]
pub enum Request {
    Ping(NoArgs),
    Create(CreateOptions),
    List(ListArgs),
    Status(WorkspaceArg),
    Diff(DiffArgs),
    Commit(WithWorkspace<CommitOptions>),
    Remove(RemoveArgs),
    Fork(WithWorkspace<crate::runtime::ForkOptions>),
    Sweep(NoArgs),
    PrepareNative(SnapshotArg),
    SandboxStart(SandboxStartArgs),
    SandboxStop(WorkspaceArg),
    SandboxPause(WorkspaceArg),
    SandboxResume(WorkspaceArg),
    SandboxSuspend(WorkspaceArg),
    SandboxStatus(WorkspaceArg),
    SandboxList(NoArgs),
    SandboxPolicy(WithWorkspace<crate::sandbox::PolicyUpdate>),
    SandboxPublish(SandboxPortArgs),
    SandboxUnpublish(SandboxPortArgs),
    SandboxLog(SandboxLogArgs),
    Exec(WorkspaceArg),
    FilesStat(FilesArgs),
    FilesList(FilesArgs),
    FilesRead(FilesArgs),
    FilesWrite(FilesArgs),
    FilesMkdir(FilesArgs),
    FilesRemove(FilesArgs),
    FilesRename(FilesArgs),
    FilesSymlink(FilesArgs),
    /// Streams change events (lines with `event`) until the client closes or the
    /// workspace goes; never answered otherwise.
    Watch(FilesArgs),
    Recover(WorkspaceArg),
    Snapshots(NoArgs),
    Refs(NoArgs),
    RefSet(RefSetArgs),
    RefDelete(RefDeleteArgs),
    Show(ShowArgs),
    Stats(NoArgs),
    Remotes(NoArgs),
    Push(PushArgs),
    Pull(PullArgs),
    Fetch(FetchArgs),
    RemoteGc(RemoteGcArgs),
    Gc(crate::ops::GcRequest),
    Export(ExportArgs),
    Import(ImportArgs),
    MountWorkspace(WorkspaceArg),
    FinishCopies(WorkspaceArg),
    UnmountWorkspace(WorkspaceArg),
    Shutdown(ShutdownArgs),
}

impl Request {
    /// The operation's name on the wire.
    pub fn op(&self) -> String {
        match serde_json::to_value(self) {
            Ok(v) => v["op"].as_str().unwrap_or("?").to_string(),
            Err(_) => "?".into(),
        }
    }

    /// Decodes one request line. Every error is `invalid_input` naming what is wrong:
    /// not JSON, no or an unknown `op`, an unknown or missing argument, a bad value.
    pub fn decode(line: &str) -> Result<Request> {
        let mut v: Value = serde_json::from_str(line)
            .map_err(|e| Error::Invalid(format!("request is not JSON: {e}")))?;
        let Some(obj) = v.as_object_mut() else {
            return Err(Error::Invalid(
                "a request is a JSON object {\"op\": ..., \"args\": {...}}".into(),
            ));
        };
        let op = match obj.get("op") {
            Some(Value::String(s)) => s.clone(),
            _ => return Err(Error::Invalid("op is required (a string)".into())),
        };
        // `args` may be left out (or null) when every argument has a default.
        if matches!(obj.get("args"), None | Some(Value::Null)) {
            obj.insert("args".into(), Value::Object(Map::new()));
        }
        serde_json::from_value(v).map_err(|e| {
            let e = e.to_string();
            let e = e
                .strip_suffix(" at line 0 column 0")
                .unwrap_or(&e)
                .to_string();
            if e.starts_with("unknown variant") {
                Error::Invalid(format!(
                    "unknown op {op:?}: see docs/control-protocol.md for the operations"
                ))
            } else {
                Error::Invalid(format!(
                    "op {op}: {e} (arguments are named as in docs/control-protocol.md)"
                ))
            }
        })
    }

    /// The request as one line of JSON (without its newline).
    pub fn encode(&self) -> Result<Vec<u8>> {
        serde_json::to_vec(self).map_err(|e| Error::Invalid(format!("request not encodable: {e}")))
    }
}

/// An error as the socket carries it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// One of the stable kinds (`not_found`, `invalid_input`, ...).
    pub kind: String,
    pub message: String,
    #[serde(default)]
    pub hint: Option<String>,
}

/// One answer on the control socket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Response {
    /// `{"ok": true, "result": ...}`.
    Ok { ok: True, result: Value },
    /// `{"ok": false, "error": {...}}`.
    Err { ok: False, error: ErrorBody },
}

/// `true` on the wire.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct True;
/// `false` on the wire.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct False;

macro_rules! literal_bool {
    ($t:ty, $v:expr) => {
        impl Serialize for $t {
            fn serialize<S: serde::Serializer>(
                &self,
                s: S,
            ) -> std::result::Result<S::Ok, S::Error> {
                s.serialize_bool($v)
            }
        }
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(
                d: D,
            ) -> std::result::Result<Self, D::Error> {
                if bool::deserialize(d)? == $v {
                    Ok(Self)
                } else {
                    Err(serde::de::Error::custom(concat!(
                        "expected ",
                        stringify!($v)
                    )))
                }
            }
        }
    };
}
literal_bool!(True, true);
literal_bool!(False, false);

impl Response {
    /// A success.
    pub fn ok(result: Value) -> Response {
        Response::Ok { ok: True, result }
    }

    /// A failure with the error's stable kind, message and hint.
    pub fn error(e: &Error) -> Response {
        Response::Err {
            ok: False,
            error: ErrorBody {
                kind: e.kind().as_str().to_string(),
                message: e.to_string(),
                hint: e.hint(),
            },
        }
    }

    /// The result, or the answered error with its kind ([`Error::Answered`]).
    pub fn into_result(self) -> Result<Value> {
        match self {
            Response::Ok { result, .. } => Ok(result),
            Response::Err { error, .. } => Err(Error::answered_body(error)),
        }
    }
}

/// Splits an object into the keys `head` names and the rest, each decoded strictly.
fn split_object(mut v: Value, head: &[&str]) -> std::result::Result<(Value, Value), String> {
    let Some(obj) = v.as_object_mut() else {
        return Err(format!("expected an object of arguments, got {v}"));
    };
    let mut h = Map::new();
    for k in head {
        if let Some(x) = obj.remove(*k) {
            h.insert((*k).to_string(), x);
        }
    }
    Ok((Value::Object(h), v))
}

fn strict<T: DeserializeOwned>(v: Value) -> std::result::Result<T, String> {
    serde_json::from_value(v).map_err(|e| e.to_string())
}

fn merge(head: Value, rest: Value) -> std::result::Result<Value, String> {
    let (Value::Object(mut h), Value::Object(r)) = (head, rest) else {
        return Err("arguments encode as objects".into());
    };
    h.extend(r);
    Ok(Value::Object(h))
}

impl<T: Serialize> Serialize for WithWorkspace<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let head = serde_json::json!({"workspace": self.workspace});
        let rest = serde_json::to_value(&self.options).map_err(serde::ser::Error::custom)?;
        merge(head, rest)
            .map_err(serde::ser::Error::custom)?
            .serialize(s)
    }
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for WithWorkspace<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        use serde::de::Error as _;
        let (head, rest) =
            split_object(Value::deserialize(d)?, &["workspace"]).map_err(D::Error::custom)?;
        let head: WorkspaceArg = strict(head).map_err(D::Error::custom)?;
        Ok(WithWorkspace {
            workspace: head.workspace,
            options: strict(rest).map_err(D::Error::custom)?,
        })
    }
}

/// The head of [`SandboxStartArgs`].
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StartHead {
    workspace: String,
    #[serde(default)]
    vm: bool,
    #[serde(default)]
    accept_emulation: bool,
}

impl Serialize for SandboxStartArgs {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let head = serde_json::to_value(StartHead {
            workspace: self.workspace.clone(),
            vm: self.vm,
            accept_emulation: self.accept_emulation,
        })
        .map_err(serde::ser::Error::custom)?;
        let rest = serde_json::to_value(&self.controls).map_err(serde::ser::Error::custom)?;
        merge(head, rest)
            .map_err(serde::ser::Error::custom)?
            .serialize(s)
    }
}

impl<'de> Deserialize<'de> for SandboxStartArgs {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        use serde::de::Error as _;
        let (head, rest) = split_object(
            Value::deserialize(d)?,
            &["workspace", "vm", "accept_emulation"],
        )
        .map_err(D::Error::custom)?;
        let head: StartHead = strict(head).map_err(D::Error::custom)?;
        Ok(SandboxStartArgs {
            workspace: head.workspace,
            vm: head.vm,
            accept_emulation: head.accept_emulation,
            controls: strict(rest).map_err(D::Error::custom)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(s: &str) -> Request {
        Request::decode(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn the_wire_is_op_and_args_and_args_may_be_left_out() {
        assert_eq!(decode(r#"{"op":"ping"}"#), Request::Ping(NoArgs {}));
        assert_eq!(
            decode(r#"{"op":"list","args":null}"#),
            Request::List(ListArgs { all: false })
        );
        assert_eq!(
            decode(r#"{"op":"status","args":{"workspace":"w1"}}"#),
            Request::Status(WorkspaceArg {
                workspace: "w1".into()
            })
        );
        let r = Request::Remove(RemoveArgs {
            workspace: "w".into(),
            force: true,
        });
        let line = String::from_utf8(r.encode().unwrap()).unwrap();
        assert_eq!(
            line,
            r#"{"op":"remove","args":{"workspace":"w","force":true}}"#
        );
        assert_eq!(decode(&line), r);
        assert_eq!(r.op(), "remove");
    }

    #[test]
    fn unknown_arguments_are_refused_naming_the_key_and_the_op() {
        for (line, key) in [
            (
                r#"{"op":"sandbox_start","args":{"workspace":"w","memroy":"1g"}}"#,
                "memroy",
            ),
            (
                r#"{"op":"create","args":{"snapshot":"s","nmae":"x"}}"#,
                "nmae",
            ),
            (
                r#"{"op":"commit","args":{"workspace":"w","mesage":"m"}}"#,
                "mesage",
            ),
            (
                r#"{"op":"remove","args":{"workspace":"w","froce":true}}"#,
                "froce",
            ),
            (r#"{"op":"ping","args":{"x":1}}"#, "x"),
            (r#"{"op":"list","args":{"all":true},"extra":1}"#, "extra"),
        ] {
            let e = Request::decode(line).unwrap_err();
            assert_eq!(e.kind().as_str(), "invalid_input", "{line}");
            let m = e.to_string();
            assert!(m.contains(key), "{line}: {m}");
        }
        let e = Request::decode(r#"{"op":"sandbox_start","args":{"workspace":"w","memroy":"1g"}}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("sandbox_start"), "{e}");
    }

    #[test]
    fn missing_and_mistyped_arguments_and_unknown_ops_are_refused() {
        for (line, says) in [
            (r#"{"op":"status"}"#, "workspace"),
            (r#"{"op":"status","args":{"workspace":3}}"#, "string"),
            (r#"{"op":"frobnicate"}"#, "unknown op"),
            (r#"{"args":{}}"#, "op is required"),
            (r#"[1]"#, "JSON object"),
            ("not json", "not JSON"),
        ] {
            let m = Request::decode(line).unwrap_err().to_string();
            assert!(m.contains(says), "{line}: {m}");
        }
    }

    #[test]
    fn split_arguments_round_trip() {
        let line = r#"{"op":"sandbox_start","args":{"workspace":"w","vm":true,"memory":"1g","publish":[3000]}}"#;
        let Request::SandboxStart(a) = decode(line) else {
            panic!()
        };
        assert!(a.vm && !a.accept_emulation);
        assert_eq!(a.controls.memory.as_deref(), Some("1g"));
        assert_eq!(a.controls.publish, vec![3000]);
        let back =
            decode(&String::from_utf8(Request::SandboxStart(a.clone()).encode().unwrap()).unwrap());
        assert_eq!(back, Request::SandboxStart(a));
        let line = r#"{"op":"commit","args":{"workspace":"w","ref":"r/main","message":"m"}}"#;
        let Request::Commit(c) = decode(line) else {
            panic!()
        };
        assert_eq!(c.workspace, "w");
        assert_eq!(c.options.ref_name.as_deref(), Some("r/main"));
    }

    #[test]
    fn responses_keep_their_shape() {
        let ok: Response = serde_json::from_str(r#"{"ok":true,"result":{"a":1}}"#).unwrap();
        assert_eq!(
            ok.clone().into_result().unwrap(),
            serde_json::json!({"a":1})
        );
        let err: Response = serde_json::from_str(
            r#"{"ok":false,"error":{"kind":"not_found","message":"no such workspace","hint":null}}"#,
        )
        .unwrap();
        let e = err.into_result().unwrap_err();
        assert_eq!(e.kind().as_str(), "not_found");
        assert_eq!(
            serde_json::to_string(&Response::ok(serde_json::json!(1))).unwrap(),
            r#"{"ok":true,"result":1}"#
        );
    }
}
