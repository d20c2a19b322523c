//! The namespace sandbox's init as the keeper's [`Backend`]: execs go to init over the
//! setup `SOCK_SEQPACKET` pair (the protocol of [`crate::serve`]), with the client's
//! descriptors; one thread reads init's answers.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};

use nix::unistd::Pid;

use super::{Backend, InitMsg};
use crate::serve::{self, ExecRequest, le_i32, recv_msg, send_msg, tag, unframe};

/// The namespace sandbox's init as a [`Backend`] (the protocol of [`crate::serve`]).
pub(crate) struct InitBackend {
    init: OwnedFd,
    init_pid: Pid,
    write: Mutex<()>,
    pending: Mutex<HashMap<u64, Sender<InitMsg>>>,
}

impl InitBackend {
    /// Serves `init`'s answers on a thread of its own.
    pub(crate) fn start(init: OwnedFd, init_pid: Pid) -> std::io::Result<Arc<InitBackend>> {
        let b = Arc::new(InitBackend {
            init,
            init_pid,
            write: Mutex::new(()),
            pending: Mutex::new(HashMap::new()),
        });
        let reader = b.clone();
        std::thread::Builder::new()
            .name("init-reader".into())
            .spawn(move || read_init(&reader))?;
        Ok(b)
    }

    fn to_init(&self, msg: &[u8], fds: &[RawFd]) -> std::io::Result<()> {
        let _w = self.write.lock().unwrap_or_else(|e| e.into_inner());
        send_msg(self.init.as_raw_fd(), msg, fds)
    }
}

impl Backend for InitBackend {
    fn exec(
        &self,
        id: u64,
        req: &ExecRequest,
        stdio: Vec<OwnedFd>,
        tx: Sender<InitMsg>,
    ) -> std::io::Result<()> {
        let body = serde_json::to_vec(req)?;
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, tx);
        let raw: Vec<RawFd> = stdio.iter().map(|f| f.as_raw_fd()).collect();
        let sent = self.to_init(&serve::frame(tag::EXEC, id, &body), &raw);
        if sent.is_err() {
            self.pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id);
        }
        sent
    }

    fn signal(&self, id: u64, sig: i32) {
        let _ = self.to_init(&serve::frame(tag::SIGNAL, id, &sig.to_le_bytes()), &[]);
    }

    fn running(&self) -> usize {
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    fn processes(&self) -> Option<usize> {
        Some(count_processes(self.init_pid))
    }

    fn pause(&self, cgroups: &[std::path::PathBuf]) -> crate::error::Result<()> {
        freezer_of(cgroups)?.freeze()
    }

    fn resume(&self, cgroups: &[std::path::PathBuf]) -> crate::error::Result<()> {
        freezer_of(cgroups)?.thaw()
    }

    fn suspend(&self) -> crate::error::Result<serde_json::Value> {
        Err(super::pause::namespace_suspend_refusal())
    }
}

/// The sandbox's freezer group; refused as unsupported when the host has none (the
/// sandbox started without it).
fn freezer_of(
    cgroups: &[std::path::PathBuf],
) -> crate::error::Result<crate::cgroup::freezer::Freezer> {
    crate::cgroup::freezer::Freezer::find(cgroups).ok_or_else(|| crate::error::Error::Unsupported {
        control: "pause (cgroup freezer)",
        reason: "the host has no cgroup freezer: no v1 `freezer` hierarchy and no v2 \
                 `cgroup.freeze` (`sandbox-helper probe` shows it); the sandbox runs without \
                 one"
        .into(),
    })
}

fn read_init(shared: &InitBackend) {
    loop {
        let (msg, mut fds) = match recv_msg(shared.init.as_raw_fd(), 1) {
            Ok((m, _)) if m.is_empty() => break,
            Ok(x) => x,
            Err(_) => break,
        };
        let Some((t, id, rest)) = unframe(&msg) else {
            continue;
        };
        let m = match t {
            tag::STARTED => InitMsg::Started(le_i32(rest).unwrap_or(0), fds.pop()),
            tag::FAILED => InitMsg::Failed(
                le_i32(rest).unwrap_or(libc::EIO),
                rest.get(4).copied().unwrap_or(2),
            ),
            tag::DONE => InitMsg::Done(le_i32(rest).unwrap_or(1)),
            _ => continue,
        };
        let done = matches!(m, InitMsg::Failed(..) | InitMsg::Done(_));
        let mut pending = shared.pending.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tx) = pending.get(&id) {
            let _ = tx.send(m);
        }
        if done {
            pending.remove(&id);
        }
    }
    // Init is gone: every exec waiting learns it.
    let mut pending = shared.pending.lock().unwrap_or_else(|e| e.into_inner());
    for (_, tx) in pending.drain() {
        let _ = tx.send(InitMsg::Gone);
    }
}

/// Processes in the sandbox's pid namespace (init included).
fn count_processes(init: Pid) -> usize {
    let Ok(ns) = std::fs::read_link(format!("/proc/{init}/ns/pid")) else {
        return 0;
    };
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter(|e| std::fs::read_link(e.path().join("ns/pid")).is_ok_and(|n| n == ns))
        .count()
}
