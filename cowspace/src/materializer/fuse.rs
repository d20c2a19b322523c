//! `fuse`: the daemon serves the workspace itself (its FUSE server, the [`FuseHost`] it
//! registers): the snapshot from the store merged with a private upper directory in
//! overlay's format, no kernel overlayfs needed. Only the daemon can keep a FUSE session
//! alive, so `mount` asks it to (`mount_workspace` on the control socket) unless this
//! process is the daemon. Diff and commit read the upper directory like the overlay
//! materializer's.

use std::path::Path;

use cowspace_store::{SnapshotId, Store};

use crate::error::{Error, Result};
use crate::kinds::{Choice, LowerKind, LowerPlan};
use crate::materializer::{
    ChangesLiveIn, Materializer, MaterializerKind, WorkspaceCtx, unmount_path,
};
use crate::protocol::{Request, WorkspaceArg};
use crate::registry::Record;

/// The `lower_kind` of fuse workspaces: the daemon reads the snapshot from the store.
pub const LOWER_KIND: crate::materializer::LowerKind = crate::materializer::LowerKind::Store;

/// What serves fuse workspaces in this process: the daemon registers its FUSE server
/// (`Materializers::with_fuse_host`); every other process asks the daemon.
pub trait FuseHost: Send + Sync {
    /// Serves workspace `rec` at its path (again, after a crash or a run); already served
    /// and mounted: nothing to do.
    fn mount(&self, rec: &Record) -> Result<()>;
    /// Lets go of the session of workspace `id` (its mount is gone).
    fn unmount(&self, id: &str);
    /// Ends the serving of workspace `id` for a removal; what is left to free, to run on
    /// the teardown thread.
    fn stop(&self, id: &str) -> Option<Box<dyn FnOnce() + Send>>;
    /// Finishes the workspace's copy-ups in progress, so its upper directory holds whole
    /// files.
    fn finish_copies(&self, rec: &Record) -> Result<()>;
}

/// The fuse materializer; `host` when this process serves the workspaces itself.
#[derive(Default)]
pub struct Fuse {
    pub host: Option<std::sync::Arc<dyn FuseHost>>,
}

impl Fuse {
    /// Finishes the workspace's copy-ups in progress, so its upper directory holds whole
    /// files: by the daemon when one runs (it may serve the workspace, and then only it
    /// may copy), else by `fsd finish-copies` from the records on disk.
    fn finish_copies(&self, store: &Store, rec: &Record) -> Result<()> {
        if let Some(host) = &self.host {
            return host.finish_copies(rec);
        }
        let root = store.root();
        if crate::daemon::ping(root) {
            crate::daemon::request(root, &Request::FinishCopies(ws_arg(rec)))?;
            return Ok(());
        }
        let upper = rec.upper_dir();
        if !upper.exists() {
            return Ok(());
        }
        let fsd = crate::daemon::fsd_program();
        let out = std::process::Command::new(&fsd)
            .arg("finish-copies")
            .arg("--root")
            .arg(store.root())
            .arg("--")
            .arg(&upper)
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(Error::io("run (to finish copy-ups)", &fsd))?;
        if !out.status.success() {
            return Err(Error::Invalid(format!(
                "finish copy-ups in {}: {} exited {}: {}",
                upper.display(),
                fsd.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(())
    }
}

impl Materializer for Fuse {
    fn kind(&self) -> MaterializerKind {
        MaterializerKind::Fuse
    }

    fn probe(&self, _store: &Store) -> std::result::Result<(), String> {
        if !Path::new("/dev/fuse").exists() {
            return Err("the kernel has no /dev/fuse (modprobe fuse)".into());
        }
        if !nix::unistd::geteuid().is_root() {
            return Err(
                "serving fuse workspaces needs root (whiteouts are device nodes; unprivileged fuse workspaces are not built yet)"
                    .into(),
            );
        }
        Ok(())
    }

    fn lower(
        &self,
        store: &Store,
        _snapshot: &SnapshotId,
        asked: Choice<LowerKind>,
    ) -> Result<LowerPlan> {
        match asked {
            Choice::Auto => {
                // The daemon serves the snapshot: started now, before the workspace is
                // recorded, so its start-up sweep never meets this create half-done.
                if self.host.is_none() {
                    crate::daemon::ensure_running(store.root())?;
                }
                Ok(LowerPlan::new(LOWER_KIND, store.root().join("store")))
            }
            Choice::Exactly(other) => Err(Error::Invalid(format!(
                "lower {other}: the fuse materializer reads the snapshot from the store itself (lower auto)"
            ))),
        }
    }

    fn mount(&self, cx: &WorkspaceCtx<'_>) -> Result<()> {
        let rec = cx.rec;
        if let Some(host) = &self.host {
            return host.mount(rec);
        }
        let root = cx.store.root();
        let req = Request::MountWorkspace(ws_arg(rec));
        // The daemon usually runs (create started it): asked at once, and started only
        // when nothing answers (mounting is idempotent, so asking again is safe).
        match crate::daemon::request(root, &req) {
            Ok(_) => Ok(()),
            // An answered refusal stands; no answer at all starts a daemon.
            Err(e @ Error::Answered { .. }) => Err(e),
            Err(e) => {
                tracing::debug!(error = %e, "no daemon answered mount_workspace; starting one");
                crate::daemon::ensure_running(root)?;
                crate::daemon::request(root, &req).map(|_| ())
            }
        }
    }

    fn unmount(&self, cx: &WorkspaceCtx<'_>, force: bool) -> Result<()> {
        let rec = cx.rec;
        unmount_path(rec, force)?;
        // The daemon lets go of the session (it ended with the mount).
        if let Some(host) = &self.host {
            host.unmount(&rec.id);
        } else if crate::daemon::ping(cx.store.root()) {
            let _ =
                crate::daemon::request(cx.store.root(), &Request::UnmountWorkspace(ws_arg(rec)));
        }
        Ok(())
    }

    fn unmount_for_removal(&self, cx: &WorkspaceCtx<'_>, force: bool) -> Result<()> {
        let rec = cx.rec;
        let Some(host) = self.host.as_ref().filter(|_| crate::mounts::deferring()) else {
            return self.unmount(cx, force);
        };
        let clone = super::unmount_path_keeping_superblock(rec, force)?;
        // Aborting the connection ends the session while the clone still holds the
        // superblock; without that, the clone is closed here.
        let clone = clone.filter(|c| {
            nix::sys::stat::fstat(c)
                .is_ok_and(|st| crate::mounts::abort_fuse_connection(st.st_dev, false))
        });
        let rest = host.stop(&rec.id);
        crate::mounts::defer(move || {
            // The tables first: their memory is back before the longer teardown.
            if let Some(free) = rest {
                free();
            }
            drop(clone);
        });
        Ok(())
    }

    fn is_mounted(&self, cx: &WorkspaceCtx<'_>) -> Result<bool> {
        let rec = cx.rec;
        // A mount whose daemon died is still in the table but answers ENOTCONN.
        Ok(crate::mounts::is_mounted(&rec.path)? && nix::sys::statfs::statfs(&rec.path).is_ok())
    }

    fn changes_live_in(&self) -> ChangesLiveIn {
        ChangesLiveIn::Upper
    }

    fn settle(&self, cx: &WorkspaceCtx<'_>) -> Result<()> {
        self.finish_copies(cx.store, cx.rec)
    }

    fn served_by_daemon(&self) -> bool {
        true
    }
}

/// What the host could change to make fuse workspaces answer faster, if anything, for
/// `mountctl doctor`: `(cause, fix)`.
pub fn host_hints() -> Vec<(String, String)> {
    haltpoll_hint(Path::new("/sys")).into_iter().collect()
}

/// A guest kernel whose idle driver is `haltpoll` with `guest_halt_poll_ns` 0 halts a vCPU
/// the moment it idles, so every FUSE request and every reply waits for the host to wake
/// the other side (a vCPU exit and entry). With the driver's default of 200 µs of
/// polling, a fresh fuse workspace of the Linux tree was read 1.5× faster and walked
/// 1.5× faster (docs/BENCHMARKS.md, "a host with halt polling"). `sys` is where
/// sysfs is mounted.
fn haltpoll_hint(sys: &Path) -> Option<(String, String)> {
    let read = |p: &str| std::fs::read_to_string(sys.join(p)).ok();
    let driver = read("devices/system/cpu/cpuidle/current_driver")?;
    let param = "module/haltpoll/parameters/guest_halt_poll_ns";
    let ns: u64 = read(param)?.trim().parse().ok()?;
    if driver.trim() != "haltpoll" || ns > 0 {
        return None;
    }
    Some((
        "this virtual machine halts an idle vCPU at once (cpuidle driver haltpoll, \
         guest_halt_poll_ns = 0), so every FUSE request and reply waits for the host to \
         wake a vCPU: fuse workspaces read and walk a fresh tree about 1.5× slower for it"
            .to_string(),
        format!(
            "as root: echo 200000 > /sys/{param} (the driver's default; at boot: \
             haltpoll.guest_halt_poll_ns=200000); an idle vCPU then polls up to 200 µs \
             before it halts"
        ),
    ))
}

/// The request argument naming `rec`.
fn ws_arg(rec: &Record) -> WorkspaceArg {
    WorkspaceArg {
        workspace: rec.id.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guest_that_halts_at_once_is_told_how_to_poll() {
        let sys = tempfile::tempdir().unwrap();
        let put = |p: &str, v: &str| {
            let p = sys.path().join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, v).unwrap();
        };
        assert_eq!(
            haltpoll_hint(sys.path()),
            None,
            "no cpuidle: nothing to say"
        );
        put("devices/system/cpu/cpuidle/current_driver", "haltpoll\n");
        assert_eq!(haltpoll_hint(sys.path()), None, "no haltpoll module");
        put("module/haltpoll/parameters/guest_halt_poll_ns", "200000\n");
        assert_eq!(haltpoll_hint(sys.path()), None, "polls already");
        put("module/haltpoll/parameters/guest_halt_poll_ns", "0\n");
        let (cause, fix) = haltpoll_hint(sys.path()).unwrap();
        assert!(cause.contains("guest_halt_poll_ns = 0"), "{cause}");
        assert!(
            fix.contains("echo 200000 > /sys/module/haltpoll/parameters/guest_halt_poll_ns"),
            "{fix}"
        );
        put("devices/system/cpu/cpuidle/current_driver", "intel_idle\n");
        assert_eq!(haltpoll_hint(sys.path()), None, "another idle driver");
    }
}
