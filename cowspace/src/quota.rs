//! Per-workspace disk quotas (`create --disk SIZE`) and the filesystem that makes them
//! enforceable (`init --workspaces-fs SIZE`).
//!
//! A workspace's private state (`workspaces/<id>/`: an overlay's upper and work
//! directories, a fuse workspace's upper, scratch) is, with a quota, a btrfs subvolume of
//! its own whose level-0 qgroup is limited to the quota (`max_rfer`). The kernel then
//! refuses the worker's writes past it with `EDQUOT` ("Disk quota exceeded") in the
//! writer's own calls, whatever writes them (the worker through the overlay, the daemon
//! for a fuse workspace), while other workspaces, the store and the registry, which are
//! outside that subvolume, keep writing.
//!
//! Why btrfs qgroups: they are the filesystem quota this kernel has. xfs project quotas
//! (`CONFIG_XFS_QUOTA`) and ext4 project quotas (`CONFIG_QFMT_V2`) are not built on the
//! hosts cowspace is tested on; a kernel with them could carry a second backend here.
//! btrfs limits bytes, not inodes: `--inodes` is refused.
//!
//! A runtime root on a filesystem without quotas gets one with `mountctl init
//! --workspaces-fs SIZE`: a sparse image file `<root>/workspaces.btrfs` made a btrfs
//! filesystem with quotas on and loop-mounted at `workspaces/`. The image's presence is
//! the record: [`ensure_workspaces_fs`] (called whenever a runtime is opened, so after a
//! reboot the first command, `recover` among them, brings it back) mounts it again before
//! anything reads or writes `workspaces/`.
//!
//! Usage is read from the kernel's qgroup counters in sysfs
//! (`/sys/fs/btrfs/<fsid>/qgroups/0_<subvolume>/`): a few small files, no walk.
//! `referenced` counts what the last transaction committed and `rsv_data` what is
//! reserved for dirty data since; their sum is what the limit is checked against.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The image file holding `workspaces/` in a root made with `--workspaces-fs`.
pub const WORKSPACES_IMAGE: &str = "workspaces.btrfs";
/// The smallest `--workspaces-fs`: below this `mkfs.btrfs` cannot fit its metadata.
pub const MIN_WORKSPACES_FS_BYTES: u64 = 256 << 20;
/// The smallest `--disk`: a quota smaller than btrfs's own bookkeeping of an empty
/// subvolume and an overlay's work directory would refuse the first write.
pub const MIN_DISK_BYTES: u64 = 1 << 20;

/// What the fix is when `workspaces/` has no quotas.
const FIX: &str = "make a runtime root whose workspaces live on a filesystem with quotas: \
                   `mountctl --root NEW init --workspaces-fs SIZE` (a btrfs image with \
                   quotas, loop-mounted at workspaces/), or mount a btrfs filesystem at \
                   workspaces/ and run `btrfs quota enable` on it";

/// A workspace's quota as its record keeps it (`policies.disk`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskQuota {
    /// The limit on the bytes its private state refers to.
    pub limit_bytes: u64,
    /// The btrfs filesystem id (the name of its directory in `/sys/fs/btrfs/`).
    pub fsid: String,
    /// The subvolume holding its private state (its level-0 qgroup is `0/<subvolume>`).
    pub subvolume: u64,
}

/// A workspace's disk use as `status` and `list` report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskUse {
    /// Bytes its private state holds (committed plus reserved for dirty data).
    pub used_bytes: u64,
    /// Its quota.
    pub limit_bytes: u64,
}

impl DiskQuota {
    /// The quota recorded in a workspace's `policies`, if it has one.
    pub fn of(policies: &serde_json::Value) -> Option<DiskQuota> {
        serde_json::from_value(policies.get("disk")?.clone()).ok()
    }

    fn sysfs(&self) -> PathBuf {
        Path::new("/sys/fs/btrfs")
            .join(&self.fsid)
            .join("qgroups")
            .join(format!("0_{}", self.subvolume))
    }

    /// What the workspace uses now, from the kernel's counters; `None` when they cannot
    /// be read (the filesystem is not mounted).
    pub fn usage(&self) -> Option<DiskUse> {
        let dir = self.sysfs();
        let read = |name: &str| -> Option<u64> {
            fs::read_to_string(dir.join(name)).ok()?.trim().parse().ok()
        };
        Some(DiskUse {
            used_bytes: read("referenced")?.saturating_add(read("rsv_data").unwrap_or(0)),
            limit_bytes: read("max_referenced").unwrap_or(self.limit_bytes),
        })
    }
}

/// Parses a `--disk` or `--workspaces-fs` size ([`sandbox_api::size::parse`]).
pub fn parse_size(flag: &str, text: &str) -> Result<u64> {
    sandbox_api::size::parse(text).map_err(|_| {
        Error::Invalid(format!(
            "{flag} {text:?}: give a size in bytes or with a k, m, g or t suffix (such as 2g) that fits in 64 bits"
        ))
    })
}

/// The filesystem id of the btrfs filesystem holding `dir`, as sysfs names it.
fn fsid_of(dir: &fs::File) -> std::io::Result<String> {
    let b = crate::sys::btrfs_fsid(dir)?;
    let h = hex::encode(b);
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    ))
}

/// `Ok(fsid)` when directories made under `ws_dir` can be given a quota: it is on btrfs
/// with quotas enabled. Otherwise what is missing.
pub fn probe(ws_dir: &Path) -> std::result::Result<String, String> {
    let st = nix::sys::statfs::statfs(ws_dir)
        .map_err(|e| format!("cannot read the filesystem of {}: {e}", ws_dir.display()))?;
    if st.filesystem_type() != nix::sys::statfs::BTRFS_SUPER_MAGIC {
        return Err(format!(
            "{} is not on btrfs (filesystem magic {:#x}), and btrfs qgroups are the only \
             per-directory quota this kernel enforces (xfs and ext4 project quotas are not \
             built into it)",
            ws_dir.display(),
            st.filesystem_type().0
        ));
    }
    let dir = fs::File::open(ws_dir).map_err(|e| format!("open {}: {e}", ws_dir.display()))?;
    let fsid = fsid_of(&dir).map_err(|e| format!("btrfs filesystem id: {e}"))?;
    let enabled = Path::new("/sys/fs/btrfs")
        .join(&fsid)
        .join("qgroups/enabled");
    match fs::read_to_string(&enabled) {
        Ok(v) if v.trim() == "1" => Ok(fsid),
        _ => Err(format!(
            "{} is on btrfs without quotas (`btrfs quota enable` was not run on it)",
            ws_dir.display()
        )),
    }
}

/// Refuses a quota request that cannot be enforced for `ws_dir`, before anything is
/// made: inodes always (btrfs counts bytes only), bytes where [`probe`] fails.
pub fn check_request(
    ws_dir: &Path,
    disk: Option<&str>,
    inodes: Option<u64>,
) -> Result<Option<u64>> {
    if let Some(n) = inodes {
        return Err(Error::Unenforceable {
            what: format!("--inodes {n}"),
            why: "the only filesystem quota this kernel enforces, btrfs qgroups, limits \
                  bytes, not inodes (xfs and ext4 project quotas, which count inodes, are \
                  not built into it)"
                .into(),
            fix: "leave out --inodes; --disk SIZE limits the bytes a workspace writes".into(),
        });
    }
    let Some(text) = disk else { return Ok(None) };
    let bytes = parse_size("--disk", text)?;
    if bytes < MIN_DISK_BYTES {
        return Err(Error::Invalid(format!(
            "--disk {text}: a quota must be at least {} MiB",
            MIN_DISK_BYTES >> 20
        )));
    }
    probe(ws_dir).map_err(|why| Error::Unenforceable {
        what: format!("--disk {text}"),
        why,
        fix: FIX.into(),
    })?;
    Ok(Some(bytes))
}

/// Makes `private_dir` (which must not exist) a subvolume limited to `limit_bytes`.
/// Nothing is left when it fails.
pub fn make_limited_dir(private_dir: &Path, limit_bytes: u64) -> Result<DiskQuota> {
    let (Some(parent), Some(name)) = (private_dir.parent(), private_dir.file_name()) else {
        return Err(Error::Invalid(format!(
            "{} has no parent",
            private_dir.display()
        )));
    };
    let p = fs::File::open(parent).map_err(Error::io("open", parent))?;
    crate::sys::btrfs_subvol_create(&p, name)
        .map_err(Error::io("create subvolume", private_dir))?;
    let limited = (|| -> Result<DiskQuota> {
        let d = fs::File::open(private_dir).map_err(Error::io("open", private_dir))?;
        crate::sys::btrfs_qgroup_limit(&d, limit_bytes)
            .map_err(Error::io("limit the qgroup of", private_dir))?;
        Ok(DiskQuota {
            limit_bytes,
            fsid: fsid_of(&d).map_err(Error::io("read the filesystem id of", private_dir))?,
            subvolume: crate::sys::btrfs_subvol_id(&d)
                .map_err(Error::io("read the subvolume id of", private_dir))?,
        })
    })();
    if limited.is_err() {
        let _ = crate::sys::btrfs_subvol_destroy(&p, name);
    }
    limited
}

/// Room given above a workspace's quota while it is mounted again ([`with_headroom`]).
const MOUNT_HEADROOM_BYTES: u64 = 4 << 20;

/// Runs `f` (mounting the workspace again) with the quota of `private_dir` raised by
/// [`MOUNT_HEADROOM_BYTES`] and puts it back after: a workspace at its quota has no room
/// for the directories its mount makes (overlay's work directory), and a worker must be
/// able to get it back to delete files.
pub fn with_headroom<T>(
    private_dir: &Path,
    q: Option<&DiskQuota>,
    f: impl FnOnce() -> Result<T>,
) -> Result<T> {
    let Some(q) = q else { return f() };
    let d = fs::File::open(private_dir).map_err(Error::io("open", private_dir))?;
    crate::sys::btrfs_qgroup_limit(&d, q.limit_bytes.saturating_add(MOUNT_HEADROOM_BYTES))
        .map_err(Error::io("raise the qgroup limit of", private_dir))?;
    let out = f();
    crate::sys::btrfs_qgroup_limit(&d, q.limit_bytes)
        .map_err(Error::io("limit the qgroup of", private_dir))?;
    out
}

/// A workspace's quota raised by [`MOUNT_HEADROOM_BYTES`] while a sandbox is set up in
/// it (the helper makes its overlay's work directory beside the upper layer, which a
/// workspace at its quota has no room for); put back when dropped. For the few
/// milliseconds it is raised, the workspace could take that much more.
pub struct Headroom {
    dir: fs::File,
    limit_bytes: u64,
}

impl Headroom {
    /// Raises the quota of workspace `rec`, if it has one. A failure is logged: the
    /// sandbox then meets the quota as it is.
    pub fn raise(rec: &crate::registry::Record) -> Option<Headroom> {
        let q = DiskQuota::of(&rec.policies)?;
        let raised = fs::File::open(&rec.private_dir).and_then(|dir| {
            crate::sys::btrfs_qgroup_limit(
                &dir,
                q.limit_bytes.saturating_add(MOUNT_HEADROOM_BYTES),
            )?;
            Ok(dir)
        });
        match raised {
            Ok(dir) => Some(Headroom {
                dir,
                limit_bytes: q.limit_bytes,
            }),
            Err(e) => {
                tracing::warn!(workspace = %rec.id, "raising its quota for a sandbox's setup: {e}");
                None
            }
        }
    }
}

impl Drop for Headroom {
    fn drop(&mut self) {
        if let Err(e) = crate::sys::btrfs_qgroup_limit(&self.dir, self.limit_bytes) {
            tracing::error!("putting a workspace's quota back after a sandbox's setup: {e}");
        }
    }
}

/// The image file of a root made with `--workspaces-fs`.
pub fn image_path(root: &Path) -> PathBuf {
    root.join(WORKSPACES_IMAGE)
}

/// Runs a program that has no library equivalent for cowspace (making a filesystem,
/// attaching a loop device), naming it and its output when it fails.
fn run(step: &'static str, path: &Path, cmd: &mut Command) -> Result<()> {
    let out = cmd.output().map_err(Error::io(step, path))?;
    if out.status.success() {
        return Ok(());
    }
    Err(Error::Io {
        step,
        path: path.to_path_buf(),
        source: std::io::Error::other(format!(
            "{:?} failed ({}): {}",
            cmd.get_program(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    })
}

/// Mounts `image` at `ws_dir` through a loop device. `mount -o loop` is used because it
/// sets the loop device up with autoclear (it goes with the last unmount) and finds a
/// free one race-free; no maintained crate covers the loop-control dance plus the
/// autoclear flag.
fn mount_image(image: &Path, ws_dir: &Path) -> Result<()> {
    run(
        "mount the workspaces filesystem",
        ws_dir,
        Command::new("mount")
            .args(["-t", "btrfs", "-o", "loop,noatime"])
            .arg(image)
            .arg(ws_dir),
    )
}

/// `mountctl init --workspaces-fs SIZE` on the initialised root `root` holding no
/// workspace: makes the sparse image, a btrfs filesystem on it (`mkfs.btrfs`: making
/// a filesystem has no library), mounts it at `workspaces/` with quotas on. `false`
/// when the root has it already.
pub fn init_workspaces_fs(root: &Path, size_bytes: u64, has_workspaces: bool) -> Result<bool> {
    let image = image_path(root);
    let ws_dir = cowspace_store::layout::Layout::new(root).workspaces();
    if image.exists() {
        ensure_workspaces_fs(root)?;
        return Ok(false);
    }
    if size_bytes < MIN_WORKSPACES_FS_BYTES {
        return Err(Error::Invalid(format!(
            "--workspaces-fs {size_bytes}: give at least {} MiB (btrfs needs room for its \
             metadata)",
            MIN_WORKSPACES_FS_BYTES >> 20
        )));
    }
    let foreign = fs::read_dir(&ws_dir)
        .map(|rd| rd.flatten().next().is_some())
        .unwrap_or(false);
    if has_workspaces || foreign {
        return Err(Error::Invalid(format!(
            "{} holds workspaces already: --workspaces-fs would hide them under the new \
             filesystem; remove them first (`mountctl list`, `mountctl remove WS`) or give \
             a new --root",
            root.display()
        )));
    }
    if crate::mounts::is_mounted(&ws_dir)? {
        return Err(Error::Invalid(format!(
            "{} is a mount point already; unmount it or give a new --root",
            ws_dir.display()
        )));
    }
    let mode = fs::metadata(&ws_dir)
        .map_err(Error::io("stat", &ws_dir))?
        .permissions()
        .mode();
    let made = (|| -> Result<()> {
        let f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&image)
            .map_err(Error::io("create", &image))?;
        f.set_len(size_bytes).map_err(Error::io("size", &image))?;
        drop(f);
        run(
            "make a btrfs filesystem on",
            &image,
            Command::new("mkfs.btrfs").arg("-q").arg(&image),
        )?;
        mount_image(&image, &ws_dir)?;
        let d = fs::File::open(&ws_dir).map_err(Error::io("open", &ws_dir))?;
        crate::sys::btrfs_quota_enable(&d).map_err(Error::io("enable quotas on", &ws_dir))?;
        fs::set_permissions(&ws_dir, fs::Permissions::from_mode(mode & 0o7777))
            .map_err(Error::io("chmod", &ws_dir))
    })();
    if let Err(e) = made {
        if crate::mounts::is_mounted(&ws_dir).unwrap_or(false) {
            let _ = crate::mounts::unmount(&ws_dir);
        }
        let _ = fs::remove_file(&image);
        return Err(e);
    }
    Ok(true)
}

/// Mounts the root's workspaces image at `workspaces/` unless it is mounted (after a
/// reboot). `true` when it mounted it. A root without an image: nothing to do.
pub fn ensure_workspaces_fs(root: &Path) -> Result<bool> {
    let image = image_path(root);
    if !image.exists() {
        return Ok(false);
    }
    let ws_dir = cowspace_store::layout::Layout::new(root).workspaces();
    if crate::mounts::is_mounted(&ws_dir)? {
        return Ok(false);
    }
    // One process mounts it: the others wait here and find it mounted.
    let _lock = crate::lockfile::lock(&image, true)?;
    if crate::mounts::is_mounted(&ws_dir)? {
        return Ok(false);
    }
    mount_image(&image, &ws_dir)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_suffixes_and_refuse_the_rest() {
        assert_eq!(parse_size("--disk", "20m").unwrap(), 20 << 20);
        assert_eq!(parse_size("--disk", "20MiB").unwrap(), 20 << 20);
        assert_eq!(parse_size("--disk", "2G").unwrap(), 2 << 30);
        assert_eq!(parse_size("--disk", "4096").unwrap(), 4096);
        for bad in ["", "m", "-1m", "1.5g", "20x", "99999999999999999999t"] {
            let e = parse_size("--disk", bad).unwrap_err().to_string();
            assert!(e.contains("--disk"), "{bad}: {e}");
        }
    }

    #[test]
    fn inodes_are_refused_as_unenforceable_naming_why() {
        let e = check_request(Path::new("/"), None, Some(1000)).unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::Unsupported);
        assert!(e.to_string().contains("inodes"), "{e}");
    }

    #[test]
    fn a_quota_is_read_back_from_a_record() {
        let p = serde_json::json!({"disk": {"limit_bytes": 5, "fsid": "x", "subvolume": 257}});
        let q = DiskQuota::of(&p).unwrap();
        assert_eq!(q.subvolume, 257);
        assert!(DiskQuota::of(&serde_json::json!({})).is_none());
    }
}
