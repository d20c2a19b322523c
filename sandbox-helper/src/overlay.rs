//! Workspaces that are overlayfs mounts (cowspace's `overlay` materializer).
//!
//! The sandbox maps its workspace to its own uids with an idmapped mount, but overlayfs
//! cannot be idmapped: its filesystem type lacks `FS_ALLOW_IDMAP`, so `mount_setattr`
//! with `MOUNT_ATTR_IDMAP` on an overlay mount fails with `EINVAL`. What overlayfs does
//! support is idmapped *layers* (Linux 5.19+) and being mounted inside a user namespace
//! (`FS_USERNS_MOUNT`). So when `--dir` is the root of an overlay mount, the helper
//! reads its layers from the mount table, clones each as an idmapped mount (lower
//! layers read-only, the directory holding the upper layer read-write) and the sandbox
//! init mounts a new overlay of them at `/workspace` inside its user namespace. Both
//! overlays share the upper layer, so what the command writes is in the workspace.
//!
//! Inside a user namespace overlayfs cannot use `trusted.overlay.*` xattrs (they need
//! `CAP_SYS_ADMIN` in the initial namespace), so it needs `userxattr`; the host's mount
//! must use it too, or the two would disagree on which directories are opaque. A
//! host overlay without `userxattr`, with an index, metacopy, data-only lower layers or
//! no upper layer is refused (exit 7). Each run gets its own work directory beside the
//! upper (`.sandbox-work.NAME.PID`, removed after the run) so the two mounts never
//! share overlayfs's scratch space.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The control named when an overlay workspace cannot be re-mounted inside.
pub const CONTROL: &str = "workspace mapped to the sandbox's uids (overlay of idmapped layers)";
/// Most lower layers accepted.
pub const MAX_LOWER_LAYERS: usize = 16;
/// Prefix of the per-run work directories made beside the upper layer.
pub const WORK_PREFIX: &str = ".sandbox-work.";

/// The layers of an overlay workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layers {
    /// Lower layers, top first.
    pub lowers: Vec<PathBuf>,
    /// Data-only lower layers below them (`lowerdir=L::D`: only the files redirected to
    /// from a lower layer's metadata are read there; cowspace's native lower).
    pub data: Vec<PathBuf>,
    /// The directory holding the upper layer (cloned read-write, idmapped).
    pub upper_parent: PathBuf,
    /// The upper layer's name in `upper_parent`.
    pub upper_name: OsString,
    /// This run's work directory's name in `upper_parent` (`.sandbox-work.NAME.PID`).
    pub work_name: OsString,
    /// The overlay keeps its metadata in `trusted.overlay.*` (no `userxattr`) and may
    /// hold renamed-directory redirects (`redirect_dir=on`): only an overlay mounted in
    /// the initial user namespace (the shared mount, `crate::share`) can take its layers.
    pub trusted: bool,
}

impl Layers {
    /// The upper layer.
    pub fn upper(&self) -> PathBuf {
        self.upper_parent.join(&self.upper_name)
    }
}

use crate::mountinfo::unescape;

fn unsupported(reason: String) -> Error {
    Error::Unsupported {
        control: CONTROL,
        reason,
    }
}

/// The layers of the overlay mounted at `dir` (the topmost mount there), or `None`
/// when `dir` is not the root of an overlay mount. Reads `/proc/self/mountinfo`.
/// `name` is the sandbox's (it names this run's work directory).
pub fn detect(dir: &Path, name: &str) -> Result<Option<Layers>> {
    let text = crate::mountinfo::read().map_err(|e| {
        Error::InvalidInput(format!("--dir: cannot read /proc/self/mountinfo: {e}"))
    })?;
    let mut layers = detect_in(&text, dir)?;
    if let Some(l) = &mut layers {
        l.work_name = format!("{WORK_PREFIX}{name}.{}", std::process::id()).into();
    }
    Ok(layers)
}

/// [`detect`] on a given mount table.
pub fn detect_in(mountinfo: &str, dir: &Path) -> Result<Option<Layers>> {
    // The last entry at `dir` is the one on top.
    let found = crate::mountinfo::lines(mountinfo)
        .rev()
        .find(|l| Path::new(&l.target) == dir)
        .map(|l| (l.fstype.to_string(), l.superopts.to_string()));
    let Some((fstype, opts)) = found else {
        return Ok(None);
    };
    if fstype != "overlay" {
        return Ok(None);
    }
    parse(&opts, dir).map(Some)
}

fn parse(opts: &str, dir: &Path) -> Result<Layers> {
    let (mut lower, mut upper, mut work, mut userxattr) = (None, None, None, false);
    let mut redirects = false;
    for opt in opts.split(',') {
        let (key, value) = opt.split_once('=').unwrap_or((opt, ""));
        match (key, value) {
            ("lowerdir", v) => lower = Some(v.to_string()),
            ("upperdir", v) => upper = Some(PathBuf::from(unescape(v))),
            ("workdir", v) => work = Some(PathBuf::from(unescape(v))),
            ("userxattr", _) => userxattr = true,
            ("redirect_dir", "on" | "follow") => redirects = true,
            ("index" | "metacopy" | "nfs_export", "on") => {
                return Err(unsupported(format!(
                    "the overlay at {} uses {opt}, which an overlay inside a user namespace cannot",
                    dir.display()
                )));
            }
            _ => {}
        }
    }
    let show = dir.display();
    let lower =
        lower.ok_or_else(|| unsupported(format!("the overlay at {show} has no lowerdir")))?;
    let upper = upper.ok_or_else(|| {
        unsupported(format!(
            "the overlay at {show} has no upperdir (a read-only overlay cannot be a workspace)"
        ))
    })?;
    let work = work.ok_or_else(|| unsupported(format!("the overlay at {show} has no workdir")))?;
    if userxattr && redirects {
        return Err(unsupported(format!(
            "the overlay at {show} has redirects with userxattr, which overlayfs refuses"
        )));
    }
    if lower.contains("\\:") {
        return Err(unsupported(format!(
            "the overlay at {show} has escaped lower layer paths"
        )));
    }
    let mut parts = lower.split("::");
    let lowers: Vec<PathBuf> = parts
        .next()
        .unwrap_or_default()
        .split(':')
        .map(|l| PathBuf::from(unescape(l)))
        .collect();
    let data: Vec<PathBuf> = parts.map(|l| PathBuf::from(unescape(l))).collect();
    if data
        .iter()
        .any(|d| d.as_os_str().is_empty() || d.to_string_lossy().contains(':'))
    {
        return Err(unsupported(format!(
            "the overlay at {show} has a lowerdir the helper cannot read ({lower:?})"
        )));
    }
    if lowers.is_empty() || lowers.len() + data.len() > MAX_LOWER_LAYERS {
        return Err(unsupported(format!(
            "the overlay at {show} has {} lower layers (1 to {MAX_LOWER_LAYERS} supported)",
            lowers.len()
        )));
    }
    for p in lowers.iter().chain(&data).chain([&upper, &work]) {
        let s = p.to_string_lossy();
        if !p.is_absolute() || s.contains([',', ':', '\\']) {
            return Err(unsupported(format!(
                "the overlay at {show} has a layer path {s:?} that cannot be passed on"
            )));
        }
    }
    let (Some(upper_parent), Some(upper_name)) = (upper.parent(), upper.file_name()) else {
        return Err(unsupported(format!("the overlay at {show}: upperdir is /")));
    };
    Ok(Layers {
        lowers,
        data,
        upper_parent: upper_parent.to_path_buf(),
        upper_name: upper_name.to_os_string(),
        work_name: OsString::new(),
        trusted: !userxattr,
    })
}

/// Refuses layers that an overlay mounted inside the sandbox's user namespace (the
/// one-shot `--suspend-host-mount` design) cannot take: `trusted.overlay.*` xattrs need
/// `CAP_SYS_ADMIN` in the initial namespace, and redirects need those.
pub fn require_userns_mountable(layers: &Layers, dir: &Path) -> Result<()> {
    if layers.trusted || !layers.data.is_empty() {
        return Err(unsupported(format!(
            "the overlay at {} keeps its metadata in trusted.overlay.* xattrs (and may hold \
             directory redirects), which an overlay inside the sandbox's user namespace \
             cannot read; use --share-host-mount (what `mountctl run` passes)",
            dir.display()
        )));
    }
    Ok(())
}

/// The overlay mount options for the sandbox's overlay of the layers: the host's
/// xattr namespace and redirect policy (`trusted`: `trusted.overlay.*` and
/// `redirect_dir=on`; else `userxattr,redirect_dir=nofollow`).
pub fn mount_options(
    lowers: &[PathBuf],
    data: &[PathBuf],
    upper: &Path,
    work: &Path,
    trusted: bool,
) -> String {
    let lowers: Vec<String> = lowers
        .iter()
        .map(|l| l.display().to_string())
        .collect::<Vec<_>>()
        .into_iter()
        .chain(data.iter().map(|d| format!(":{}", d.display())))
        .collect();
    let policy = if trusted {
        "redirect_dir=on,index=off,metacopy=off"
    } else {
        "userxattr,redirect_dir=nofollow,index=off,metacopy=off"
    };
    format!(
        "lowerdir={},upperdir={},workdir={},{policy}",
        lowers.join(":"),
        upper.display(),
        work.display()
    )
}

/// Removes per-run work directories beside `upper_parent` whose helper is gone.
pub fn reap_stale_work_dirs(upper_parent: &Path) {
    let Ok(entries) = std::fs::read_dir(upper_parent) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(rest) = name.strip_prefix(WORK_PREFIX)
            && crate::stale::owner_is_gone(rest)
        {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COWSPACE: &str = "36 27 0:45 / /r/ws/ws-1/mnt rw,noatime shared:20 - overlay cowspace rw,lowerdir=/r/cache/checkouts/ab,upperdir=/r/ws/ws-1/upper,workdir=/r/ws/ws-1/work,redirect_dir=nofollow,uuid=on,userxattr\n";

    #[test]
    fn finds_the_layers_of_a_cowspace_overlay() {
        let l = detect_in(COWSPACE, Path::new("/r/ws/ws-1/mnt"))
            .unwrap()
            .unwrap();
        assert_eq!(l.lowers, vec![PathBuf::from("/r/cache/checkouts/ab")]);
        assert_eq!(l.upper(), PathBuf::from("/r/ws/ws-1/upper"));
        assert!(
            detect_in(COWSPACE, Path::new("/r/ws/ws-1"))
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn trusted_xattrs_are_only_for_the_shared_mount_and_index_is_refused() {
        let trusted = COWSPACE
            .replace(",userxattr", "")
            .replace("redirect_dir=nofollow", "redirect_dir=on");
        let dir = Path::new("/r/ws/ws-1/mnt");
        let l = detect_in(&trusted, dir).unwrap().unwrap();
        assert!(l.trusted);
        let e = require_userns_mountable(&l, dir).unwrap_err();
        assert!(e.to_string().contains("trusted.overlay"), "{e}");
        let plain = detect_in(COWSPACE, dir).unwrap().unwrap();
        assert!(!plain.trusted);
        require_userns_mountable(&plain, dir).unwrap();
        let both = COWSPACE.replace("redirect_dir=nofollow", "redirect_dir=on");
        assert!(detect_in(&both, dir).is_err());
        let index = COWSPACE.replace("uuid=on", "index=on");
        assert!(detect_in(&index, Path::new("/r/ws/ws-1/mnt")).is_err());
        // Data-only layers (the native lower) are read for the shared mount, never for
        // an overlay inside the user namespace.
        let dataonly = trusted.replace("lowerdir=/r/cache/checkouts/ab", "lowerdir=/a::/b");
        let l = detect_in(&dataonly, dir).unwrap().unwrap();
        assert_eq!(l.lowers, vec![PathBuf::from("/a")]);
        assert_eq!(l.data, vec![PathBuf::from("/b")]);
        assert!(require_userns_mountable(&l, dir).is_err());
        let opts = mount_options(&l.lowers, &l.data, Path::new("/u"), Path::new("/w"), true);
        assert!(opts.starts_with("lowerdir=/a::/b,upperdir=/u,"), "{opts}");
    }

    #[test]
    fn a_plain_directory_or_another_filesystem_is_not_an_overlay() {
        let ext4 = "30 1 254:0 / /srv rw - ext4 /dev/vda rw\n";
        assert!(detect_in(ext4, Path::new("/srv")).unwrap().is_none());
        assert!(detect_in(ext4, Path::new("/srv/x")).unwrap().is_none());
    }
}
