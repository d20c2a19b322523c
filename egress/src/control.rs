//! The control seam between the process that runs the proxy and whoever manages it.
//!
//! Newline-delimited JSON over a Unix stream, one request per line and one answer line per
//! request, decoded once into [`ControlRequest`]:
//! - `{"op":"set_policy","policy":{...}}` -> `{"ok":true}`
//! - `{"op":"apply","changes":[{"allow":"x.com"},"reset"]}` -> `{"ok":true,"policy":{...}}`
//! - `{"op":"policy"}` -> `{"ok":true,"policy":{...}}`
//! - `{"op":"stats"}` -> `{"ok":true,"stats":{...}}`
//! - `{"op":"set_injections","config":{"injections":[...],"ca":{...}}}` -> `{"ok":true}`
//!   (never echoes a value; a bad request's error names no value either)
//! - anything else (bad JSON, unknown op or field, invalid pattern) ->
//!   `{"ok":false,"error":"..."}`; the connection stays usable.
//!
//! A line longer than [`MAX_CONTROL_LINE_BYTES`] is answered with an error and the
//! connection closed (the stream cannot be resynchronized safely). [`ControlClient`] is
//! the other side.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::policy::{Policy, PolicyChange};
use crate::server::Egress;
use crate::stats::Stats;

/// Longest request or answer line, newline included.
pub const MAX_CONTROL_LINE_BYTES: usize = 1024 * 1024;

/// One control request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum ControlRequest {
    /// Replace the policy.
    SetPolicy {
        /// The new policy.
        policy: Policy,
    },
    /// Apply changes to the policy in force; answers the new policy.
    Apply {
        /// The changes, in order.
        changes: Vec<PolicyChange>,
    },
    /// The policy in force.
    Policy {},
    /// The statistics.
    Stats {},
    /// Replace the injection rules (values and the authority's key travel here only;
    /// the answer never carries them).
    SetInjections {
        /// The rules and the authority.
        config: crate::inject::InjectConfig,
    },
}

/// One control answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlResponse {
    /// Whether the request succeeded.
    pub ok: bool,
    /// For `policy` and `apply`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<Policy>,
    /// For `stats`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<Stats>,
    /// When `ok` is false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl ControlResponse {
    fn error(msg: impl Into<String>) -> ControlResponse {
        ControlResponse {
            ok: false,
            error: Some(msg.into()),
            ..ControlResponse::default()
        }
    }
}

/// Reads one line of at most [`MAX_CONTROL_LINE_BYTES`]; `Ok(None)` at end of stream.
fn read_line<R: BufRead>(r: &mut R) -> io::Result<Option<Vec<u8>>> {
    let mut line = Vec::new();
    r.take(MAX_CONTROL_LINE_BYTES as u64)
        .read_until(b'\n', &mut line)?;
    if line.is_empty() {
        return Ok(None);
    }
    if !line.ends_with(b"\n") {
        let what = if line.len() >= MAX_CONTROL_LINE_BYTES {
            "line too long"
        } else {
            "truncated line"
        };
        return Err(io::Error::new(io::ErrorKind::InvalidData, what));
    }
    Ok(Some(line))
}

fn write_line<W: Write, T: Serialize>(w: &mut W, value: &T) -> io::Result<()> {
    let mut out = serde_json::to_vec(value).map_err(io::Error::other)?;
    out.push(b'\n');
    w.write_all(&out)
}

/// Answers one decoded request.
pub fn handle_request(egress: &Egress, request: ControlRequest) -> ControlResponse {
    match request {
        ControlRequest::SetPolicy { policy } => {
            egress.set_policy(policy);
            ControlResponse {
                ok: true,
                ..ControlResponse::default()
            }
        }
        ControlRequest::Apply { changes } => ControlResponse {
            ok: true,
            policy: Some(egress.apply(&changes)),
            ..ControlResponse::default()
        },
        ControlRequest::Policy {} => ControlResponse {
            ok: true,
            policy: Some(egress.policy()),
            ..ControlResponse::default()
        },
        ControlRequest::Stats {} => ControlResponse {
            ok: true,
            stats: Some(egress.stats()),
            ..ControlResponse::default()
        },
        ControlRequest::SetInjections { config } => match egress.set_injections(config) {
            Ok(()) => ControlResponse {
                ok: true,
                ..ControlResponse::default()
            },
            Err(e) => ControlResponse::error(e),
        },
    }
}

/// Serves control requests on `stream` until it closes.
pub fn serve_control(stream: UnixStream, egress: &Egress) -> io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = stream;
    loop {
        let line = match read_line(&mut reader) {
            Ok(Some(line)) => line,
            Ok(None) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                write_line(&mut writer, &ControlResponse::error(e.to_string()))?;
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let response = match serde_json::from_slice::<ControlRequest>(&line) {
            Ok(request) => handle_request(egress, request),
            // A serde error may quote the input, which may hold a credential: say only
            // where it failed.
            Err(e) => ControlResponse::error(format!(
                "bad request (line {}, column {}): {:?}",
                e.line(),
                e.column(),
                e.classify()
            )),
        };
        write_line(&mut writer, &response)?;
    }
}

/// Why a control call failed.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The socket failed.
    #[error("control socket: {0}")]
    Io(#[from] io::Error),
    /// The answer was not valid JSON of the expected shape.
    #[error("control answer does not decode: {0}")]
    Decode(#[from] serde_json::Error),
    /// The proxy refused the request.
    #[error("egress proxy refused: {0}")]
    Refused(String),
    /// The proxy closed the connection, or answered without the expected field.
    #[error("egress proxy closed the control connection or sent an incomplete answer")]
    Closed,
}

/// The client side of the control protocol.
#[derive(Debug)]
pub struct ControlClient {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl ControlClient {
    /// Wraps a connected stream.
    pub fn new(stream: UnixStream) -> io::Result<ControlClient> {
        Ok(ControlClient {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
        })
    }

    /// Connects to a control socket at `path`.
    pub fn connect(path: &Path) -> io::Result<ControlClient> {
        ControlClient::new(UnixStream::connect(path)?)
    }

    /// Sends one request and reads its answer; `Err(Refused)` when `ok` is false.
    pub fn call(&mut self, request: &ControlRequest) -> Result<ControlResponse, ControlError> {
        write_line(&mut self.writer, request)?;
        let line = read_line(&mut self.reader)?.ok_or(ControlError::Closed)?;
        let response: ControlResponse = serde_json::from_slice(&line)?;
        if !response.ok {
            return Err(ControlError::Refused(response.error.unwrap_or_default()));
        }
        Ok(response)
    }

    /// Replaces the proxy's policy.
    pub fn set_policy(&mut self, policy: &Policy) -> Result<(), ControlError> {
        self.call(&ControlRequest::SetPolicy {
            policy: policy.clone(),
        })
        .map(|_| ())
    }

    /// Applies changes; returns the new policy.
    pub fn apply(&mut self, changes: &[PolicyChange]) -> Result<Policy, ControlError> {
        let request = ControlRequest::Apply {
            changes: changes.to_vec(),
        };
        self.call(&request)?.policy.ok_or(ControlError::Closed)
    }

    /// The policy in force.
    pub fn policy(&mut self) -> Result<Policy, ControlError> {
        self.call(&ControlRequest::Policy {})?
            .policy
            .ok_or(ControlError::Closed)
    }

    /// The proxy's statistics.
    pub fn stats(&mut self) -> Result<Stats, ControlError> {
        self.call(&ControlRequest::Stats {})?
            .stats
            .ok_or(ControlError::Closed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_wire_forms() {
        let r: ControlRequest = serde_json::from_str(r#"{"op":"stats"}"#).unwrap();
        assert_eq!(r, ControlRequest::Stats {});
        assert_eq!(serde_json::to_string(&r).unwrap(), r#"{"op":"stats"}"#);
        let r: ControlRequest = serde_json::from_str(
            r#"{"op":"apply","changes":[{"allow":"x.com"},{"remove":"y.com"},"reset"]}"#,
        )
        .unwrap();
        let ControlRequest::Apply { changes } = r else {
            panic!()
        };
        assert_eq!(changes.len(), 3);
        assert!(serde_json::from_str::<ControlRequest>(r#"{"op":"nope"}"#).is_err());
        assert!(serde_json::from_str::<ControlRequest>(r#"{"op":"stats","x":1}"#).is_err());
        let ok = serde_json::to_string(&ControlResponse {
            ok: true,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(ok, r#"{"ok":true}"#);
    }
}
