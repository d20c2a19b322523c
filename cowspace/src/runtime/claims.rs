//! The registry side of a sandbox in a workspace: who runs in it, its published ports,
//! the host's mount while a sandbox shares it, and ending a sandbox.

use super::*;

impl Runtime {
    /// The workspace a sandbox may run in: `active`, mounted, its lower layer present,
    /// and no other sandbox running in it. Records `pid` (the caller's, then the helper's
    /// through [`Runtime::move_sandbox`]) as its sandbox
    /// ([`Record::sandbox_pid`]) in the same registry transaction.
    pub fn claim_sandbox(&self, ws: &str, pid: i32) -> Result<Record> {
        let mut rec = self.reg().get(ws)?;
        // A sandbox that ended without its keeper's clean-up (its init or keeper killed)
        // is cleared as `sweep` clears it: the host's own overlay mounted again, its
        // leftovers reaped (docs/sandbox.md, "Crashes").
        if rec.status == Status::Active && rec.sandbox.is_some() && live_sandbox(&rec).is_none() {
            self.forget_sandbox(&rec)?;
            self.reap_dead_sandboxes(&rec.path);
            rec = self.reg().get(ws)?;
        }
        let mat = self.materializer_of(&rec);
        let mounted = rec.status == Status::Active
            && mat.is_mounted(&self.cx(&rec))?
            && lower_alive(&rec.lower);
        if !mounted {
            let status = if rec.status == Status::Active {
                "active but not mounted (its mount or lower layer is gone)".to_string()
            } else {
                rec.status.as_str().to_string()
            };
            return Err(Error::WrongState {
                id: rec.id,
                status,
                op: "a sandbox (`mountctl recover WS` mounts it again)",
            });
        }
        self.reg().modify(&rec.id, |r| {
            if let Some(pid) = live_sandbox(r) {
                return Err(Error::Answered {
                    kind: crate::error::ErrorKind::Exists,
                    message: format!(
                        "a sandbox runs in workspace {} already (sandbox-helper pid {pid})",
                        r.id
                    ),
                    hint: Some(
                        "one sandbox per workspace: `mountctl exec WS -- CMD` runs more commands \
                         in a sandbox started with `mountctl sandbox start WS`; or wait for the \
                         run to end"
                            .into(),
                    ),
                });
            }
            r.sandbox_pid = Some(pid);
            r.ports = serde_json::json!({});
            Ok(r.clone())
        })
    }

    /// Replaces the claimed sandbox pid `from` of `ws` by `to` (the caller claims with
    /// its own pid, starts the helper, then records the helper's).
    pub fn move_sandbox(&self, ws: &str, from: i32, to: i32) -> Result<()> {
        let id = self.reg().get(ws)?.id;
        self.reg().modify(&id, |r| {
            if r.sandbox_pid == Some(from) {
                r.sandbox_pid = Some(to);
            }
            Ok(())
        })
    }

    /// Records the published ports (internal -> host, a JSON object) of the sandbox
    /// running in `ws`, shown by `status` while it runs.
    pub fn set_ports(&self, ws: &str, ports: serde_json::Value) -> Result<()> {
        let id = self.reg().get(ws)?.id;
        self.reg().modify(&id, |r| {
            r.ports = ports;
            Ok(())
        })
    }

    /// While a sandbox runs in `ws` on its own overlay of the workspace's layers, the
    /// host's overlay of the same upper layer would be a second, unsynchronised mount of
    /// it (overlayfs leaves that undefined). This unmounts the host's; `false` when it is
    /// in use on the host and stays mounted (its view may then be stale until the run
    /// ends). [`Runtime::resume_host_mount`] mounts it again.
    pub fn suspend_host_mount(&self, ws: &str) -> Result<bool> {
        let rec = self.reg().get(ws)?;
        if !crate::mounts::is_mounted(&rec.path)? {
            return Ok(true);
        }
        match crate::mounts::unmount(&rec.path) {
            Ok(()) => Ok(true),
            Err(nix::Error::EBUSY) => Ok(false),
            Err(source) => Err(Error::Unmount {
                target: rec.path.clone(),
                source,
            }),
        }
    }

    /// Mounts the host's overlay of `ws` again after a sandbox run (see
    /// [`Runtime::suspend_host_mount`]). A workspace removed meanwhile is left alone.
    pub fn resume_host_mount(&self, ws: &str) -> Result<()> {
        let rec = self.reg().get(ws)?;
        if rec.status != Status::Active || crate::mounts::is_mounted(&rec.path)? {
            return Ok(());
        }
        let mat = self.materializer_of(&rec);
        // A workspace at its disk quota has no room for overlay's work directory.
        let _headroom = crate::quota::Headroom::raise(&rec);
        mat.mount(&self.cx(&rec))
    }

    /// Forgets the sandbox `helper_pid` of `ws` (it ended): no sandbox, no ports.
    pub fn release_sandbox(&self, ws: &str, helper_pid: i32) -> Result<()> {
        let id = self.reg().get(ws)?.id;
        self.reg().modify(&id, |r| {
            if r.sandbox_pid == Some(helper_pid) {
                r.sandbox_pid = None;
                r.sandbox = None;
                r.ports = serde_json::json!({});
            }
            Ok(())
        })
    }
}

/// The recorded sandbox of `rec` if it still runs: the pid exists and is either a
/// `sandbox-helper` whose command line names the workspace's path, or (for the moment
/// between claiming and starting the helper) a `mountctl run` naming the workspace; so a
/// reused pid is not mistaken for it.
pub fn live_sandbox(rec: &Record) -> Option<i32> {
    let pid = rec.sandbox_pid?;
    let comm = crate::procfs::comm(pid)?;
    let cmdline = crate::procfs::cmdline(pid)?;
    let has = |want: &[u8]| cmdline.iter().any(|arg| arg == want);
    let ours = match comm.as_str() {
        "sandbox-helper" => {
            let path = rec.path.as_os_str().as_encoded_bytes();
            has(path) || has(&[b"--dir=".as_slice(), path].concat())
        }
        "mountctl" => {
            (has(b"run") || has(b"start"))
                && (has(rec.id.as_bytes())
                    || rec.name.as_deref().is_some_and(|n| has(n.as_bytes())))
        }
        _ => false,
    };
    ours.then_some(pid)
}

/// How long `remove --force` waits for a killed sandbox's helper to clean up and exit.
pub(crate) const SANDBOX_EXIT_WAIT_MS: u64 = 5_000;

/// Ends a sandbox: SIGKILL to its init (the helper's child; the whole pid namespace
/// dies with it), so the helper removes its cgroups and exits as usual; the helper
/// itself is killed when it has not exited after [`SANDBOX_EXIT_WAIT_MS`]. `pid` may be
/// a `mountctl run` recorded before it started its helper: then its helper is ended,
/// or that `mountctl` itself when it has none yet.
pub(crate) fn kill_sandbox(pid: i32) {
    use crate::procfs::children;
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let is_helper = |pid: i32| crate::procfs::comm(pid).is_some_and(|c| c == "sandbox-helper");
    let helper = if is_helper(pid) {
        pid
    } else if let Some(h) = children(pid).into_iter().find(|c| is_helper(*c)) {
        h
    } else {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        return;
    };
    for child in children(helper) {
        let _ = kill(Pid::from_raw(child), Signal::SIGKILL);
    }
    let gone = || crate::procfs::stat(helper).is_none_or(|s| s.is_zombie());
    let deadline = Instant::now() + std::time::Duration::from_millis(SANDBOX_EXIT_WAIT_MS);
    while !gone() && Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    if !gone() {
        let _ = kill(Pid::from_raw(helper), Signal::SIGKILL);
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
