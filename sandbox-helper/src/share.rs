//! One overlay mount of a workspace, shared by the host and a long-lived sandbox.
//!
//! overlayfs cannot be idmapped, but it can be mounted on idmapped layers (Linux 5.19+).
//! For a long-lived sandbox of an overlay workspace the helper (root in the initial user
//! namespace) replaces the host's overlay at the workspace path by a new overlay of the
//! same layers, each layer idmapped with the sandbox's user namespace, and gives the
//! sandbox a clone of that mount. The host and every exec then see the same files
//! through one superblock (one dentry cache; never two overlays over one upper layer).
//!
//! Ownership: a file owned by uid U on disk is owned by U inside the sandbox, and by
//! `base + U` on the host while the sandbox runs (`base` is the sandbox's first host
//! uid). What root inside writes is owned by uid 0 on disk, as with the one-shot run.
//! After the sandbox stops, the host's own overlay is mounted again and shows the disk
//! owners. The host's uid 0 has no uid inside, so while a sandbox runs the kernel
//! refuses (`EOVERFLOW`) to create a new name from the host in the shared mount;
//! reading and writing existing files from the host works.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags};

use crate::error::{Error, Result};
use crate::overlay::Layers;
use crate::sys::{self, MOUNT_ATTR_IDMAP, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY};

/// The shared overlay at the workspace path; [`SharedMount::release`] (or drop)
/// unmounts it, leaving the path for the caller to mount the host's overlay again.
#[derive(Debug)]
pub struct SharedMount {
    path: PathBuf,
    mounted: bool,
}

impl SharedMount {
    /// Unmounts the shared overlay. One still in use on the host is detached lazily
    /// (`Ok(false)`): the host processes using it keep it until they let go.
    pub fn release(&mut self) -> std::io::Result<bool> {
        if !self.mounted {
            return Ok(true);
        }
        self.mounted = false;
        match nix::mount::umount2(&self.path, MntFlags::empty()) {
            Ok(()) => Ok(true),
            Err(nix::errno::Errno::EBUSY) => sys::detach_mount(&self.path).map(|()| false),
            Err(nix::errno::Errno::EINVAL) => Ok(true),
            Err(e) => Err(e.into()),
        }
    }
}

impl Drop for SharedMount {
    fn drop(&mut self) {
        let _ = self.release();
    }
}

/// Detaches what was attached under a scratch directory on drop, and removes it.
pub(crate) struct Scratch {
    dir: PathBuf,
    attached: Vec<PathBuf>,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for a in self.attached.iter().rev() {
            let _ = sys::detach_mount(a);
            let _ = std::fs::remove_dir(a);
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

impl Scratch {
    /// A scratch directory at `dir`, which the caller has made.
    pub(crate) fn new(dir: &Path) -> Self {
        Scratch {
            dir: dir.to_path_buf(),
            attached: Vec::new(),
        }
    }

    /// Makes `name` under the scratch directory (mode 0700) and attaches the detached
    /// mount `fd` there (none: an empty directory, removed on drop like the others).
    pub(crate) fn attach(&mut self, fd: Option<BorrowedFd<'_>>, name: &str) -> Result<PathBuf> {
        let at = self.dir.join(name);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&at)
            .map_err(|source| Error::StateDir {
                path: at.clone(),
                source,
            })?;
        if let Some(fd) = fd {
            sys::move_mount(fd, &at).map_err(|source| Error::DetachedMount {
                path: at.clone(),
                source,
            })?;
        }
        self.attached.push(at.clone());
        Ok(at)
    }
}

pub(crate) fn idmapped_clone(path: &Path, attrs: u64, userns: BorrowedFd<'_>) -> Result<OwnedFd> {
    let fd = sys::open_tree_clone(path).map_err(|source| Error::DetachedMount {
        path: path.to_path_buf(),
        source,
    })?;
    sys::mount_setattr(fd.as_fd(), attrs | MOUNT_ATTR_IDMAP, Some(userns)).map_err(|source| {
        if matches!(
            source.raw_os_error(),
            Some(libc::EINVAL | libc::EOPNOTSUPP | libc::EPERM)
        ) {
            Error::Unsupported {
                control: crate::overlay::CONTROL,
                reason: format!(
                    "the filesystem of {} refuses idmapped mounts: {source}",
                    path.display()
                ),
            }
        } else {
            Error::DetachedMount {
                path: path.to_path_buf(),
                source,
            }
        }
    })?;
    Ok(fd)
}

/// Mounts an overlay (named `source` in the mount table) at `workspace`, `nosuid,nodev`,
/// from a thread whose filesystem ids are the sandbox's root (`uid_base`), with every
/// capability still effective: overlayfs does its own work in the upper layer (work
/// directory, copy-up, whiteouts) with its mounter's credentials, and on an idmapped
/// upper layer the host's uid 0 has no mapping (`EOVERFLOW`), while the sandbox's root
/// maps to disk uid 0. Also the image root's overlay ([`crate::image`]).
pub(crate) fn mount_as(
    uid_base: u32,
    source: &'static str,
    workspace: &Path,
    options: &str,
) -> std::io::Result<()> {
    let workspace = workspace.to_path_buf();
    let options = options.to_string();
    std::thread::spawn(move || -> std::io::Result<()> {
        nix::unistd::setfsgid(nix::unistd::Gid::from_raw(uid_base));
        nix::unistd::setfsuid(nix::unistd::Uid::from_raw(uid_base));
        sys::raise_effective_caps()?;
        nix::mount::mount(
            Some(source),
            &workspace,
            Some("overlay"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(options.as_str()),
        )
        .map_err(std::io::Error::from)
    })
    .join()
    .unwrap_or_else(|_| Err(std::io::Error::other("the mount thread panicked")))
}

/// Unmounts the host's overlay at `workspace`, for [`share`] to mount the shared one
/// there. Called before the sandbox's mount namespace is cloned, so that no copy of the
/// old overlay lives on in it: one upper layer is never under two live overlays. Refused
/// with [`Error::HostBusy`] when a process on the host has its working directory or a
/// file open there.
pub fn unmount_host(workspace: &Path) -> Result<()> {
    match nix::mount::umount2(workspace, MntFlags::empty()) {
        Ok(()) | Err(nix::errno::Errno::EINVAL) => Ok(()),
        Err(nix::errno::Errno::EBUSY) => Err(Error::HostBusy {
            path: workspace.to_path_buf(),
        }),
        Err(e) => Err(Error::Sync(std::io::Error::other(format!(
            "unmount the host's overlay of {}: {e}",
            workspace.display()
        )))),
    }
}

/// Mounts at `workspace` (left empty by [`unmount_host`]) an overlay of `layers`, idmapped with
/// the user namespace `userns`, using `work` (a directory beside the upper layer) as its
/// work directory. `scratch` is an empty directory path of the helper's to attach the
/// layers under while the overlay is mounted.
pub fn share(
    layers: &Layers,
    workspace: &Path,
    work_name: &std::ffi::OsStr,
    userns: BorrowedFd<'_>,
    uid_base: u32,
    scratch: &Path,
) -> Result<SharedMount> {
    let ro = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    let mut clones = Vec::with_capacity(layers.lowers.len() + layers.data.len() + 1);
    for lower in layers.lowers.iter().chain(&layers.data) {
        clones.push(idmapped_clone(lower, ro, userns)?);
    }
    clones.push(idmapped_clone(
        &layers.upper_parent,
        MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        userns,
    )?);
    std::fs::create_dir_all(scratch).map_err(|source| Error::StateDir {
        path: scratch.to_path_buf(),
        source,
    })?;
    let mut s = Scratch::new(scratch);
    let mut lower_paths = Vec::new();
    let mut data_paths = Vec::new();
    let n = clones.len();
    for (i, fd) in clones.iter().enumerate() {
        let name = if i + 1 == n {
            "rw".to_string()
        } else {
            format!("l{i}")
        };
        let at = s.attach(Some(fd.as_fd()), &name)?;
        if i < layers.lowers.len() {
            lower_paths.push(at);
        } else if i + 1 < n {
            data_paths.push(at);
        }
    }
    let rw = scratch.join("rw");
    let options = crate::overlay::mount_options(
        &lower_paths,
        &data_paths,
        &rw.join(&layers.upper_name),
        &rw.join(work_name),
        layers.trusted,
    );
    mount_as(uid_base, "cowspace", workspace, &options).map_err(|e| Error::Setup {
        step: format!(
            "mount the shared overlay of {} on idmapped layers",
            workspace.display()
        ),
        source: e,
    })?;
    drop(s);
    Ok(SharedMount {
        path: workspace.to_path_buf(),
        mounted: true,
    })
}
