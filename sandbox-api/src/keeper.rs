//! The client side of a long-lived sandbox's keeper: its socket's path, the requests it
//! takes and a connection to it (`docs/sandbox.md`, "Long-lived sandboxes").

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use nix::sys::socket::{AddressFamily, SockFlag, SockType, UnixAddr, connect, socket};
use serde_json::{Value, json};

use crate::error::{Error, Result};
use crate::exec::ExecRequest;
use crate::msg::{recv_msg, send_msg};

/// Longest client message (an exec request), in bytes.
pub const MAX_CLIENT_MESSAGE_BYTES: usize = crate::exec::MAX_EXEC_REQUEST_BYTES;

/// A long-lived sandbox's status, as `{"op":"status"}` answers it.
pub type Status = Value;

/// The directory of [`paths`]: the keepers' files under the state directory.
pub fn keep_dir(state: &Path) -> PathBuf {
    state.join("keep")
}

/// The keeper's files of sandbox `name` under the state directory: (lock, socket).
pub fn paths(state: &Path, name: &str) -> (PathBuf, PathBuf) {
    let dir = keep_dir(state);
    (
        dir.join(format!("{name}.lock")),
        dir.join(format!("{name}.sock")),
    )
}

/// A client's first message.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum KeeperRequest {
    /// The sandbox's status.
    Status,
    /// Stop it; answered once everything is freed.
    Stop,
    /// Start a command (with the client's stdio).
    Exec {
        /// The command.
        request: ExecRequest,
    },
    /// Change the egress policy (new connections follow it at once).
    Policy {
        /// Applied in order.
        changes: Vec<cowspace_egress::policy::PolicyChange>,
        /// `--inject HOST=HEADER:@FILE` entries added (the keeper reads each FILE).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        inject: Vec<String>,
        /// `--remove-inject HOST[=HEADER]`: rules taken out.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        remove_inject: Vec<String>,
    },
    /// Publish a port now.
    Publish {
        /// The port inside.
        port: u16,
    },
    /// Stop publishing a port.
    Unpublish {
        /// The port inside.
        port: u16,
    },
    /// Pause every process of the sandbox, its memory kept (a namespace sandbox's
    /// cgroup freezer; a VM's qemu `stop`). Answers `{"paused": true, "paused_at": T,
    /// "elapsed_ms": MS}`; refused when paused already.
    Pause,
    /// Resume a paused sandbox. Answers `{"resumed": true, "paused_ms": MS,
    /// "elapsed_ms": MS}`; refused when it runs.
    Resume,
    /// Save the sandbox with its processes to disk and end it (refused as `unsupported`
    /// on every host so far, naming why: `docs/sandbox.md`, "Pause, resume, suspend").
    Suspend,
}

/// A connection to a running sandbox's keeper (the client side).
#[derive(Debug)]
pub struct Client {
    conn: OwnedFd,
    name: String,
}

/// What an exec's start brought.
#[derive(Debug)]
pub enum Started {
    /// Running, with the terminal's master for `tty`.
    Running {
        /// The command's pid inside the sandbox (its pid namespace's numbering; the host
        /// pid is not told).
        pid: i32,
        /// The pseudo-terminal's master, when asked for.
        master: Option<OwnedFd>,
    },
    /// Not started: the error and the exit status to report.
    Refused {
        /// The error kind (`not_found`, `invalid_input`, ...).
        kind: String,
        /// What went wrong.
        message: String,
        /// The exit status a shell would give.
        exit: u8,
    },
}

impl Client {
    /// Connects to the keeper of sandbox `name`; [`Error::NotRunning`] when none runs.
    pub fn connect(state: &Path, name: &str) -> Result<Client> {
        let (_, path) = paths(state, name);
        let not_running = || Error::NotRunning {
            name: name.to_string(),
        };
        let sock = socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .map_err(|e| Error::Keeper {
            name: name.into(),
            source: e.into(),
        })?;
        let addr = UnixAddr::new(&path).map_err(|_| not_running())?;
        match connect(sock.as_raw_fd(), &addr) {
            Ok(()) => Ok(Client {
                conn: sock,
                name: name.to_string(),
            }),
            Err(nix::errno::Errno::ENOENT | nix::errno::Errno::ECONNREFUSED) => Err(not_running()),
            Err(e) => Err(Error::Keeper {
                name: name.into(),
                source: e.into(),
            }),
        }
    }

    fn err(&self) -> impl Fn(std::io::Error) -> Error + '_ {
        move |source| Error::Keeper {
            name: self.name.clone(),
            source,
        }
    }

    fn recv_json(&self) -> Result<(Value, Vec<OwnedFd>)> {
        let (m, fds) = recv_msg(self.conn.as_raw_fd(), 1).map_err(self.err())?;
        if m.is_empty() {
            return Err(Error::Keeper {
                name: self.name.clone(),
                source: std::io::Error::other("the sandbox stopped"),
            });
        }
        let v = serde_json::from_slice(&m).map_err(|e| self.err()(e.into()))?;
        Ok((v, fds))
    }

    /// The sandbox's status.
    pub fn status(self) -> Result<Status> {
        let msg = serde_json::to_vec(&KeeperRequest::Status).map_err(|e| self.err()(e.into()))?;
        send_msg(self.conn.as_raw_fd(), &msg, &[]).map_err(self.err())?;
        Ok(self.recv_json()?.0)
    }

    /// Stops the sandbox: every process killed, its cgroups, ports and mounts freed.
    /// Returns once that is done.
    pub fn stop(self) -> Result<Value> {
        let msg = serde_json::to_vec(&KeeperRequest::Stop).map_err(|e| self.err()(e.into()))?;
        send_msg(self.conn.as_raw_fd(), &msg, &[]).map_err(self.err())?;
        match self.recv_json() {
            Ok((v, _)) => Ok(v),
            // The keeper exits right after answering; an end without the answer still
            // means it is gone.
            Err(_) => Ok(json!({"stopped": true})),
        }
    }

    /// One request answered by one object; an answered error comes back with its kind.
    fn ask(self, req: &KeeperRequest) -> Result<Value> {
        let msg = serde_json::to_vec(req).map_err(|e| self.err()(e.into()))?;
        send_msg(self.conn.as_raw_fd(), &msg, &[]).map_err(self.err())?;
        let v = self.recv_json()?.0;
        if let Some(e) = v.get("error") {
            return Err(Error::Answered {
                kind: crate::Kind::parse(e["kind"].as_str().unwrap_or("io")),
                message: e["message"].as_str().unwrap_or("refused").to_string(),
                hint: e["hint"].as_str().map(str::to_string),
            });
        }
        Ok(v)
    }

    /// Changes the sandbox's egress policy; answers `{"policy": ..., "allows_nothing"}`.
    pub fn policy(self, changes: Vec<cowspace_egress::policy::PolicyChange>) -> Result<Value> {
        self.ask(&KeeperRequest::Policy {
            changes,
            inject: Vec::new(),
            remove_inject: Vec::new(),
        })
    }

    /// [`Self::policy`] adding and removing injection rules too (files read by the keeper).
    pub fn policy_injecting(
        self,
        changes: Vec<cowspace_egress::policy::PolicyChange>,
        inject: Vec<String>,
        remove_inject: Vec<String>,
    ) -> Result<Value> {
        self.ask(&KeeperRequest::Policy {
            changes,
            inject,
            remove_inject,
        })
    }

    /// Publishes `port` now; answers `{"port", "host_port"}`.
    pub fn publish(self, port: u16) -> Result<Value> {
        self.ask(&KeeperRequest::Publish { port })
    }

    /// Stops publishing `port`.
    pub fn unpublish(self, port: u16) -> Result<Value> {
        self.ask(&KeeperRequest::Unpublish { port })
    }

    /// Pauses the sandbox (every process stopped, memory kept).
    pub fn pause(self) -> Result<Value> {
        self.ask(&KeeperRequest::Pause)
    }

    /// Resumes a paused sandbox.
    pub fn resume(self) -> Result<Value> {
        self.ask(&KeeperRequest::Resume)
    }

    /// Suspends the sandbox to disk (refused where that cannot be done, with the reason).
    pub fn suspend(self) -> Result<Value> {
        self.ask(&KeeperRequest::Suspend)
    }

    /// Starts `req` with `stdio` as its stdin, stdout and stderr (`None` with `req.tty`).
    pub fn exec(&self, req: &ExecRequest, stdio: Option<[BorrowedFd<'_>; 3]>) -> Result<Started> {
        let msg = serde_json::to_string(&KeeperRequest::Exec {
            request: req.clone(),
        })
        .map_err(|e| self.err()(e.into()))?;
        if msg.len() > MAX_CLIENT_MESSAGE_BYTES {
            return Err(Error::InvalidInput(format!(
                "the command and its environment exceed {MAX_CLIENT_MESSAGE_BYTES} bytes"
            )));
        }
        let raw: Vec<RawFd> = stdio.iter().flatten().map(|f| f.as_raw_fd()).collect();
        send_msg(self.conn.as_raw_fd(), msg.as_bytes(), &raw).map_err(self.err())?;
        let (v, mut fds) = self.recv_json()?;
        if let Some(pid) = v["started"].as_i64() {
            return Ok(Started::Running {
                pid: pid as i32,
                master: fds.pop(),
            });
        }
        Ok(Started::Refused {
            kind: v["error"]["kind"].as_str().unwrap_or("io").to_string(),
            message: v["error"]["message"]
                .as_str()
                .unwrap_or("exec failed")
                .to_string(),
            exit: v["exit"].as_u64().unwrap_or(1).min(255) as u8,
        })
    }

    /// Forwards signal `sig` to the running command.
    pub fn signal(&self, sig: i32) -> Result<()> {
        send_msg(
            self.conn.as_raw_fd(),
            json!({"signal": sig}).to_string().as_bytes(),
            &[],
        )
        .map_err(self.err())
    }

    /// Waits for the command to end: its exit status (128 + signal when killed).
    pub fn wait(&self) -> Result<u8> {
        let (v, _) = self.recv_json()?;
        Ok(v["exit"].as_u64().unwrap_or(1).min(255) as u8)
    }

    /// The connection, for polling beside other descriptors.
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.conn.as_fd()
    }
}

/// A terminal's window size (rows, columns), for `exec -t`.
pub fn terminal_size(fd: BorrowedFd<'_>) -> std::io::Result<(u16, u16)> {
    crate::sys::window_size(fd)
}

/// Sets a pseudo-terminal's window size (the master of `exec -t`, on `SIGWINCH`).
pub fn set_terminal_size(fd: BorrowedFd<'_>, rows: u16, cols: u16) -> std::io::Result<()> {
    crate::sys::set_window_size(fd, rows, cols)
}
