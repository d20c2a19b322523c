//! `overlay`: kernel overlayfs over a read-only lower (the daemon's snapshot view or a
//! checkout); upper and work directories private to the workspace. Creating one is
//! `mkdir` + one mount, whatever the size of the snapshot.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::sync::OnceLock;

use std::path::Path;

use cowspace_store::{SnapshotId, Store};

use crate::error::{Error, Result};
use crate::kinds::{Choice, LowerKind, LowerPlan};
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

    /// Overlay's lower policy: `auto` is [`auto_lower`], except that a snapshot whose
    /// contents are still on a remote gets the view (which reads them at first use; a
    /// native lower or a checkout would fetch every file first), and a large snapshot
    /// without a native lower yet gets the view now while the daemon builds one for the
    /// next creates ([`LowerPlan::native_later`]).
    fn lower(
        &self,
        store: &Store,
        snapshot: &SnapshotId,
        asked: Choice<LowerKind>,
    ) -> Result<LowerPlan> {
        let kind = match asked {
            Choice::Auto => {
                let (lower, _) = auto_lower(store, MaterializerKind::Overlay);
                if lower == LowerKind::Native && store.is_partial(snapshot)?.is_some() {
                    LowerKind::View
                } else if lower == LowerKind::Native && native_later(store, snapshot)? {
                    let mut plan =
                        LowerPlan::new(LowerKind::View, crate::plain::view_path(store, snapshot));
                    plan.native_later = true;
                    return Ok(plan);
                } else {
                    lower
                }
            }
            Choice::Exactly(LowerKind::Native) => {
                if let Err(why) = crate::native::probe(store) {
                    return Err(Error::Unsupported {
                        name: "overlay --lower native".into(),
                        why: format!("{why}; use --lower view or --lower checkout"),
                    });
                }
                LowerKind::Native
            }
            Choice::Exactly(k @ (LowerKind::View | LowerKind::Checkout)) => k,
            Choice::Exactly(other) => {
                return Err(Error::Invalid(format!(
                    "lower {other}: choose auto, native, view or checkout"
                )));
            }
        };
        let path = match kind {
            LowerKind::Native => crate::native::meta_path(store, snapshot),
            LowerKind::View => crate::plain::view_path(store, snapshot),
            _ => crate::checkout::checkout_path(store, snapshot),
        };
        Ok(LowerPlan::new(kind, path))
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

/// The lower `--lower auto` gives a workspace of materializer `kind`, and why: the
/// native lower reads file bytes straight from the blob cache with no daemon in the path
/// (it needs EROFS and data-only overlay layers, Linux 6.16+, and root); else the view
/// keeps file identity stable and reads lazily (it needs FUSE); else the checkout.
pub fn auto_lower(store: &Store, kind: MaterializerKind) -> (LowerKind, String) {
    let native = if kind == MaterializerKind::Overlay {
        crate::native::probe(store)
    } else {
        Err(format!(
            "the {} materializer makes its own tree",
            kind.as_str()
        ))
    };
    let native_why = match native {
        Ok(()) => {
            return (
                LowerKind::Native,
                "this host mounts EROFS images with data-only overlay layers".into(),
            );
        }
        Err(why) => why,
    };
    if Path::new("/dev/fuse").exists() && nix::unistd::geteuid().is_root() {
        return (
            LowerKind::View,
            format!("native lower unavailable ({native_why}); FUSE is usable"),
        );
    }
    (
        LowerKind::Checkout,
        format!("native lower unavailable ({native_why}); no usable FUSE for the view"),
    )
}

/// Whether a `--lower auto` create of `snapshot` takes the view now and leaves the
/// native lower to the daemon: its image is not built, the snapshot is too large to
/// build it during the create ([`crate::native::eager`]) and the view is usable.
fn native_later(store: &Store, snapshot: &SnapshotId) -> Result<bool> {
    if crate::native::is_built(store, snapshot)
        || !Path::new("/dev/fuse").exists()
        || !nix::unistd::geteuid().is_root()
    {
        return Ok(false);
    }
    let c = store.snapshot(snapshot)?.counts;
    Ok(!crate::native::eager(c.files, c.bytes))
}
