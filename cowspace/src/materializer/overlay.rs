//! `overlay`: kernel overlayfs over a read-only lower (the daemon's snapshot view or a
//! checkout); upper and work directories private to the workspace. Creating one is
//! `mkdir` + one mount, whatever the size of the snapshot.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::sync::OnceLock;

use cowspace_store::Store;

use crate::error::{Error, Result};
use crate::materializer::{ChangesLiveIn, Materializer, MaterializerKind, WorkspaceCtx};
use crate::mounts;

/// The cheap check made before every create: the kernel has overlayfs and this process
/// may mount (root). A failing mount is still reported and undone by `create`.
fn quick_probe() -> std::result::Result<(), String> {
    if !crate::procfs::has_filesystem("overlay") {
        return Err("the kernel has no overlay filesystem (modprobe overlay)".into());
    }
    if !nix::unistd::geteuid().is_root() {
        return Err(
            "mounting overlayfs needs root (unprivileged workspaces need the fuse materializer)"
                .into(),
        );
    }
    Ok(())
}

/// Attempts a real overlay mount once per process (in the runtime root's tmp) to learn
/// whether this host allows it (`mountctl doctor`).
pub fn trial_mount(store: &Store) -> std::result::Result<(), String> {
    static PROBED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    PROBED
        .get_or_init(|| {
            if !crate::procfs::has_filesystem("overlay") {
                return Err("the kernel has no overlay filesystem (modprobe overlay)".into());
            }
            let base = store
                .layout()
                .tmp()
                .join(format!("overlay-probe-{}", std::process::id()));
            let dirs = ["lower", "upper", "work", "mnt"].map(|d| base.join(d));
            for d in &dirs {
                fs::create_dir_all(d).map_err(|e| format!("cannot create {}: {e}", d.display()))?;
            }
            let r = mounts::mount_overlay(&dirs[0], &dirs[1], &dirs[2], &dirs[3], true);
            let out = match r {
                Ok(()) => {
                    let _ = mounts::unmount(&dirs[3]);
                    Ok(())
                }
                Err(Error::Mount {
                    source: nix::Error::EPERM,
                    ..
                }) => Err(
                    "mounting overlayfs needs root (or a user namespace with overlay support)"
                        .into(),
                ),
                Err(e) => Err(format!("a trial overlay mount failed: {e}")),
            };
            let _ = fs::remove_dir_all(&base);
            out
        })
        .clone()
}

/// The kernel overlayfs materializer.
pub struct Overlay;

impl Materializer for Overlay {
    fn kind(&self) -> MaterializerKind {
        MaterializerKind::Overlay
    }

    fn probe(&self, _store: &Store) -> std::result::Result<(), String> {
        quick_probe()
    }

    fn check(&self, store: &Store) -> std::result::Result<(), String> {
        self.probe(store)?;
        trial_mount(store)
    }

    fn mount(&self, cx: &WorkspaceCtx<'_>) -> Result<()> {
        let rec = cx.rec;
        // The native lower's image is mounted once per snapshot (again after a reboot).
        let data = if rec.lower_kind == crate::native::LOWER_KIND {
            crate::native::ensure_mounted(&rec.lower)?;
            Some(crate::native::data_layer(&rec.lower)?)
        } else {
            None
        };
        let upper = rec.upper_dir();
        let first = !upper.exists();
        for d in [upper.clone(), rec.work_dir()] {
            fs::create_dir_all(&d).map_err(Error::io("create directory", &d))?;
        }
        if first {
            // Overlay's root is the upper directory: it starts with the snapshot root's
            // mode (which the lower shows), as every other materializer's root does.
            let mode = fs::metadata(&rec.lower)
                .map_err(Error::io("stat", &rec.lower))?
                .mode();
            fs::set_permissions(&upper, fs::Permissions::from_mode(mode & 0o7777))
                .map_err(Error::io("chmod", &upper))?;
            // And its xattrs (the view serves the root's; a checkout's root has them).
            let xattrs = cowspace_store::import::dir::read_xattrs(&rec.lower)?;
            cowspace_store::export::set_xattrs(&upper, &xattrs)?;
        }
        fs::create_dir_all(&rec.path).map_err(Error::io("create directory", &rec.path))?;
        mounts::mount_overlay_with_data(
            &rec.lower,
            data.as_deref(),
            &rec.upper_dir(),
            &rec.work_dir(),
            &rec.path,
            rec.overlay_redirects,
        )
    }

    fn unmount_for_removal(&self, cx: &WorkspaceCtx<'_>, force: bool) -> Result<()> {
        let rec = cx.rec;
        if !mounts::deferring() {
            return self.unmount(cx, force);
        }
        if let Some(clone) = super::unmount_path_keeping_superblock(rec, force)? {
            mounts::defer(move || drop(clone));
        }
        Ok(())
    }

    fn changes_live_in(&self) -> ChangesLiveIn {
        ChangesLiveIn::Upper
    }

    fn sandbox_shares_host_mount(&self) -> bool {
        true
    }
}
