//! An image as the sandbox's root filesystem.
//!
//! The runtime hands the helper an image's native lower (`cowspace::native`): its
//! metadata image mounted read-only (EROFS, `--image-meta`), whose regular files
//! redirect into the blob cache (`--image-data`, a data-only layer). The helper, root in
//! the initial user namespace, mounts per sandbox an overlay
//! `lowerdir=META::DATA,upperdir=…,workdir=…` whose layers are idmapped clones (the
//! image's uid 0 is the sandbox's root, as for a shared workspace overlay,
//! [`crate::share`]), with `trusted.overlay.*` xattrs (the metadata image's redirects
//! need them, which only the initial user namespace reads), `nosuid` and `nodev`: a
//! set-uid file of an image runs with the caller's ids, a device node cannot be opened.
//!
//! The writable layer is private to the sandbox: `<state>/run/<name>.<pid>/image/`
//! (`upper`, `work`) on the host, removed when the sandbox stops ([`PrivateLayer`]).
//! The metadata mount is shared by every sandbox of the image; each overlay holds its
//! own clones of it, so the image cannot change under a running sandbox.
//!
//! The overlay is mounted at a scratch path of the helper, cloned as a detached mount
//! (`open_tree`) for init to attach and pivot into, and the scratch mount detached at
//! once: the same steps as [`crate::share`], with the `mount(2)` the crate already uses
//! (no new raw syscalls).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::paths::{canonical_dir, refuse_overlap};
use crate::share::Scratch;
use crate::sys::{self, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY};

/// The control named when an image root cannot be made on this host.
pub const CONTROL: &str = "image root (overlay of idmapped layers)";

/// A validated image root: the mounted metadata image and the blob cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRoot {
    /// The root of the image's EROFS mount.
    pub meta: PathBuf,
    /// The blob cache its files redirect into.
    pub data: PathBuf,
}

impl ImageRoot {
    /// Checks `--image-meta` (the root of an EROFS mount) and `--image-data` (a
    /// directory), both canonical and neither overlapping `state_dir` nor the host root.
    pub fn validate(meta: &Path, data: &Path, state_dir: &Path) -> Result<ImageRoot> {
        let meta = canonical_dir(meta, "--image-meta")?;
        let data = canonical_dir(data, "--image-data")?;
        for (p, flag) in [(&meta, "--image-meta"), (&data, "--image-data")] {
            if p == Path::new("/") {
                return Err(Error::InvalidInput(format!(
                    "{flag} /: the host root is never an image"
                )));
            }
            refuse_overlap(p, state_dir, flag)?;
        }
        let table = crate::mountinfo::read().map_err(|e| {
            Error::InvalidInput(format!(
                "--image-meta: cannot read /proc/self/mountinfo: {e}"
            ))
        })?;
        let top = crate::mountinfo::lines(&table)
            .rev()
            .find(|l| Path::new(&l.target) == meta)
            .map(|l| l.fstype.to_string());
        if top.as_deref() != Some("erofs") {
            return Err(Error::InvalidInput(format!(
                "--image-meta {}: not the root of an image's metadata mount (erofs), but {}",
                meta.display(),
                top.as_deref().unwrap_or("no mount")
            )));
        }
        Ok(ImageRoot { meta, data })
    }

    /// The overlay options of the image root, its layers at `lower`, `data` and its
    /// private layer's `upper` and `work`.
    pub fn options(lower: &Path, data: &Path, upper: &Path, work: &Path) -> String {
        format!(
            "lowerdir={}::{},upperdir={},workdir={},redirect_dir=on,index=off,metacopy=off",
            lower.display(),
            data.display(),
            upper.display(),
            work.display()
        )
    }
}

/// Reads `--image-user UID:GID`: numbers of the sandbox's user namespace (below
/// [`crate::alloc::IDS_PER_SANDBOX`]).
pub fn parse_user(text: &str) -> Result<(u32, u32)> {
    let ids = text
        .split_once(':')
        .and_then(|(u, g)| Some((u.parse::<u32>().ok()?, g.parse::<u32>().ok()?)));
    match ids {
        Some((u, g)) if u < crate::alloc::IDS_PER_SANDBOX && g < crate::alloc::IDS_PER_SANDBOX => {
            Ok((u, g))
        }
        _ => Err(Error::InvalidInput(format!(
            "--image-user {text:?}: expected UID:GID, numbers below {}",
            crate::alloc::IDS_PER_SANDBOX
        ))),
    }
}

/// The sandbox's private writable layer (`upper`, `work`), removed on drop.
#[derive(Debug)]
pub struct PrivateLayer(PathBuf);

impl PrivateLayer {
    /// Makes `dir` (owned by the host's root, which is the sandbox's root through the
    /// idmapped clone) with an empty `upper` and `work`.
    pub fn create(dir: &Path) -> Result<PrivateLayer> {
        let _ = std::fs::remove_dir_all(dir);
        let layer = PrivateLayer(dir.to_path_buf());
        for d in [dir.to_path_buf(), dir.join("upper"), dir.join("work")] {
            std::fs::DirBuilder::new()
                .mode(0o755)
                .create(&d)
                .map_err(|source| Error::StateDir { path: d, source })?;
        }
        Ok(layer)
    }

    /// The directory holding `upper` and `work`.
    pub fn dir(&self) -> &Path {
        &self.0
    }
}

impl Drop for PrivateLayer {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Mounts the image root of `image` over `layer`, idmapped with the user namespace
/// `userns` whose root is host uid `uid_base`, and returns it as a detached mount
/// (`nosuid,nodev`). `scratch` is an empty path of the helper's for the mount's making.
pub fn mount(
    image: &ImageRoot,
    layer: &PrivateLayer,
    userns: BorrowedFd<'_>,
    uid_base: u32,
    scratch: &Path,
) -> Result<OwnedFd> {
    let ro = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    let unsupported = |e: Error| match e {
        Error::Unsupported { reason, .. } => Error::Unsupported {
            control: CONTROL,
            reason,
        },
        other => other,
    };
    let meta = crate::share::idmapped_clone(&image.meta, ro, userns).map_err(unsupported)?;
    let data = crate::share::idmapped_clone(&image.data, ro, userns).map_err(unsupported)?;
    let rw =
        crate::share::idmapped_clone(layer.dir(), MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, userns)
            .map_err(unsupported)?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(scratch)
        .map_err(|source| Error::StateDir {
            path: scratch.to_path_buf(),
            source,
        })?;
    let mut s = Scratch::new(scratch);
    let l = s.attach(Some(meta.as_fd()), "l")?;
    let d = s.attach(Some(data.as_fd()), "d")?;
    let rw = s.attach(Some(rw.as_fd()), "rw")?;
    let root = s.attach(None, "root")?;
    let options = ImageRoot::options(&l, &d, &rw.join("upper"), &rw.join("work"));
    crate::share::mount_as(uid_base, "cowspace-image", &root, &options).map_err(|source| {
        Error::Setup {
            step: format!(
                "mount the image root of {} ({options})",
                image.meta.display()
            ),
            source,
        }
    })?;
    let fd = sys::open_tree_clone(&root).map_err(|source| Error::DetachedMount {
        path: root.clone(),
        source,
    });
    // The overlay keeps private clones of its layers, and the detached clone keeps the
    // overlay: every path under the scratch directory goes now.
    drop(s);
    fd
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rootfs::{Step, plan};
    use crate::testing::{debian_host, spec};

    #[test]
    fn an_image_root_is_entered_first_and_nothing_of_the_hosts_system_is_attached() {
        let mut spec = spec();
        spec.image = Some(crate::image::ImageRoot {
            meta: "/r/cache/native/ab/meta".into(),
            data: "/r/cache/blobs".into(),
        });
        let plan = plan(&spec, Path::new("/run/x/root"), &debian_host());
        assert_eq!(plan.image_root, Some(0));
        let root = &plan.detached[0];
        assert_eq!(root.attrs, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV);
        assert_eq!(
            plan.steps[..6],
            [
                Step::MakePrivate,
                Step::Attach {
                    mount: 0,
                    target: "/run/x/root".into()
                },
                Step::PivotRootKeepingOld {
                    new_root: "/run/x/root".into()
                },
                Step::Mkdir {
                    path: "/proc".into(),
                    mode: 0o555
                },
                Step::Proc {
                    target: "/proc".into()
                },
                Step::DetachOldRoot,
            ]
        );
        // Every later step names a path inside the image root, after the pivot.
        for step in &plan.steps[6..] {
            let path = match step {
                Step::Mkdir { path, .. } | Step::File { path, .. } => path,
                Step::Attach { target, .. } | Step::Tmpfs { target, .. } => target,
                _ => continue,
            };
            assert!(!path.starts_with("/run/x"), "{step:?}");
        }
        let hosts: Vec<&Path> = plan.detached.iter().map(|d| d.host.as_path()).collect();
        for system in ["/usr", "/bin", "/lib", "/etc/ssl", "/etc/ld.so.cache"] {
            assert!(!hosts.contains(&Path::new(system)), "{system} attached");
        }
        assert!(!plan.steps.contains(&Step::RemountRootReadOnly));
        assert!(
            !plan
                .steps
                .iter()
                .any(|s| matches!(s, Step::PivotRoot { .. }))
        );
        // The image keeps its users; its /etc/hosts (maybe a symlink) is replaced.
        let hosts_file = Path::new("/etc/hosts");
        let unlink = plan
            .steps
            .iter()
            .position(|s| *s == Step::Unlink(hosts_file.into()))
            .unwrap();
        assert!(matches!(&plan.steps[unlink + 1], Step::File { path, .. } if path == hosts_file));
        assert!(
            !plan
                .steps
                .iter()
                .any(|s| matches!(s, Step::File { path, .. } if path == Path::new("/etc/passwd")))
        );
        assert_eq!(plan.steps.last(), Some(&Step::Chdir("/workspace".into())));
    }

    #[test]
    fn the_image_root_reads_redirects_from_trusted_xattrs_over_a_data_only_layer() {
        let o = ImageRoot::options(
            Path::new("/s/l"),
            Path::new("/s/d"),
            Path::new("/s/rw/upper"),
            Path::new("/s/rw/work"),
        );
        assert!(
            o.starts_with("lowerdir=/s/l::/s/d,upperdir=/s/rw/upper,"),
            "{o}"
        );
        assert!(!o.contains("userxattr"), "{o}");
    }

    #[test]
    fn meta_must_be_an_erofs_mount_and_never_the_host_root() {
        let tmp = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        let state = other.path().join("state");
        let e = ImageRoot::validate(tmp.path(), tmp.path(), &state).unwrap_err();
        assert!(e.to_string().contains("erofs"), "{e}");
        let e = ImageRoot::validate(Path::new("/"), tmp.path(), &state).unwrap_err();
        assert!(e.to_string().contains("host root"), "{e}");
        std::fs::create_dir(&state).unwrap();
        let e = ImageRoot::validate(&state, tmp.path(), other.path()).unwrap_err();
        assert!(e.to_string().contains("overlaps"), "{e}");
        assert_eq!(parse_user("1000:50").unwrap(), (1000, 50));
        for bad in ["1000", "a:b", "65536:0", "0:-1"] {
            assert!(parse_user(bad).is_err(), "{bad}");
        }
    }
}
