//! The sandbox's filesystem view: planned on the host, applied inside the sandbox.
//!
//! [`plan`] turns a [`Spec`] into a list of [`Step`]s plus the host paths that become
//! detached mounts (made by the helper with `open_tree`, read-only or idmapped, and
//! handed to the sandbox init). [`apply`] (in `apply.rs`) runs the steps through the
//! [`crate::syscall::Syscall`] seam.
//!
//! Invariants (checked by the tests here and in `apply.rs`):
//! - the new root is a fresh tmpfs; only the paths listed here are attached to it, and
//!   every attached host path except the workspace is read-only;
//! - the old root is detached right after `pivot_root`, so nothing else of the host
//!   (its `/root`, `/home`, `/var/run`, the state directory, sockets) stays reachable;
//! - the root is remounted read-only last, and the working directory is `/workspace`.

use std::io;
use std::path::{Path, PathBuf};

use nix::mount::MsFlags;

use crate::spec::Spec;
use crate::sys::{
    MOUNT_ATTR_IDMAP, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY,
};

mod apply;

pub use apply::apply;

/// Most detached mounts handed to the sandbox (one `SCM_RIGHTS` message holds 253).
pub const MAX_DETACHED_MOUNTS: usize = 200;
/// Most cgroup files handed to init with the mounts (one per v1 controller used).
pub const MAX_CGROUP_JOINS: usize = 8;
/// Host directories bound read-only at the same place (or recreated as symlinks).
pub const SYSTEM_DIRS: [&str; 7] = ["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];
/// Entries of the host's `/etc` that programs need, bound read-only when present.
pub const ETC_ENTRIES: [&str; 24] = [
    "alternatives",
    "bash.bashrc",
    "ca-certificates",
    "ca-certificates.conf",
    "debian_version",
    "environment",
    "gai.conf",
    "host.conf",
    "inputrc",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "login.defs",
    "mime.types",
    "nsswitch.conf",
    "os-release",
    "profile",
    "profile.d",
    "protocols",
    "python3",
    "services",
    "ssl",
    "terminfo",
];
/// Device nodes bound from the host's `/dev`.
pub const DEV_NODES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];
/// Name of the old root's mount point inside the new root, detached after pivoting.
const OLD_ROOT: &str = ".oldroot";
/// Where an overlay workspace's layers are attached while its overlay is mounted.
const LAYERS_DIR: &str = ".layers";

/// What a host path is, as far as planning needs to know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostKind {
    /// A directory.
    Dir,
    /// Anything that is not a directory or symlink (regular file, device node).
    File,
    /// A symlink and its target.
    Symlink(PathBuf),
}

/// Looks host paths up while planning (swapped in tests).
pub trait HostFs {
    /// The kind of `path`, without following a final symlink; `None` when absent.
    fn kind(&self, path: &Path) -> Option<HostKind>;
}

/// The real host filesystem.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealHost;

impl HostFs for RealHost {
    fn kind(&self, path: &Path) -> Option<HostKind> {
        let meta = std::fs::symlink_metadata(path).ok()?;
        if meta.file_type().is_symlink() {
            Some(HostKind::Symlink(std::fs::read_link(path).ok()?))
        } else if meta.is_dir() {
            Some(HostKind::Dir)
        } else {
            Some(HostKind::File)
        }
    }
}

/// A host path to clone as a detached mount, with the attributes to set on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detached {
    /// The host path.
    pub host: PathBuf,
    /// `MOUNT_ATTR_*` flags.
    pub attrs: u64,
}

impl Detached {
    /// Whether this mount is idmapped with the sandbox's user namespace.
    pub fn idmapped(&self) -> bool {
        self.attrs & MOUNT_ATTR_IDMAP != 0
    }
}

/// One step of building the view, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Make every mount of the (copied) mount namespace private, so nothing propagates
    /// back to the host.
    MakePrivate,
    /// Mount a fresh tmpfs.
    Tmpfs {
        /// Mount point.
        target: PathBuf,
        /// Flags (`MS_NOSUID`...).
        flags: MsFlags,
        /// tmpfs options.
        options: String,
    },
    /// Create a directory (an existing one is fine).
    Mkdir {
        /// Path.
        path: PathBuf,
        /// Mode.
        mode: u32,
    },
    /// Create a file with contents (a mount point or a generated file).
    File {
        /// Path.
        path: PathBuf,
        /// Contents.
        contents: Vec<u8>,
    },
    /// Create a symlink.
    Symlink {
        /// What it points to.
        target: PathBuf,
        /// Where it is.
        link: PathBuf,
    },
    /// Attach detached mount number `mount` (an index into [`Plan::detached`]).
    Attach {
        /// Index.
        mount: usize,
        /// Mount point.
        target: PathBuf,
    },
    /// Mount a fresh `proc` (of the sandbox's pid namespace).
    Proc {
        /// Mount point.
        target: PathBuf,
    },
    /// Mount a new `devpts` instance.
    Devpts {
        /// Mount point.
        target: PathBuf,
    },
    /// `pivot_root` into `new_root`, then detach and remove the old root.
    PivotRoot {
        /// The new root (a mount point).
        new_root: PathBuf,
    },
    /// `pivot_root` into `new_root`, keeping the old root attached (an image root:
    /// `/proc` can only be mounted while the host's stays visible) until
    /// [`Step::DetachOldRoot`].
    PivotRootKeepingOld {
        /// The new root (a mount point).
        new_root: PathBuf,
    },
    /// Detach and remove the old root kept by [`Step::PivotRootKeepingOld`].
    DetachOldRoot,
    /// Remount `/` read-only.
    RemountRootReadOnly,
    /// Remount a tmpfs made by an earlier step read-only (`nosuid,nodev,noexec`).
    RemountReadOnly {
        /// Its mount point.
        target: PathBuf,
    },
    /// Mount an overlay (of layers attached by earlier steps) inside the sandbox's user
    /// namespace.
    Overlay {
        /// Mount point.
        target: PathBuf,
        /// The overlay's mount options (layers as paths in init's view).
        options: String,
    },
    /// Detach a mount made by an earlier step and remove its mount point.
    Detach {
        /// Its mount point.
        target: PathBuf,
    },
    /// Remove an empty directory made by an earlier step.
    Rmdir(PathBuf),
    /// Remove a non-directory if present (a name of an image root that the sandbox
    /// replaces by its own file).
    Unlink(PathBuf),
    /// Change the working directory.
    Chdir(PathBuf),
}

impl Step {
    fn describe(&self) -> String {
        match self {
            Step::MakePrivate => "make mounts private".into(),
            Step::Tmpfs { target, .. } => format!("mount tmpfs at {}", target.display()),
            Step::Mkdir { path, .. } => format!("mkdir {}", path.display()),
            Step::File { path, .. } => format!("create {}", path.display()),
            Step::Symlink { link, .. } => format!("symlink {}", link.display()),
            Step::Attach { target, .. } => format!("attach mount at {}", target.display()),
            Step::Proc { .. } => "mount /proc".into(),
            Step::Devpts { .. } => "mount /dev/pts".into(),
            Step::PivotRoot { .. } | Step::PivotRootKeepingOld { .. } => "pivot_root".into(),
            Step::DetachOldRoot => "detach the old root".into(),
            Step::RemountRootReadOnly => "remount / read-only".into(),
            Step::RemountReadOnly { target } => format!("remount {} read-only", target.display()),
            Step::Overlay { target, .. } => {
                format!("mount the workspace overlay at {}", target.display())
            }
            Step::Detach { target } => format!("detach {}", target.display()),
            Step::Rmdir(p) => format!("rmdir {}", p.display()),
            Step::Unlink(p) => format!("unlink {}", p.display()),
            Step::Chdir(p) => format!("chdir {}", p.display()),
        }
    }
}

/// The planned view.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Host paths to clone as detached mounts; [`Step::Attach`] refers to them by index.
    pub detached: Vec<Detached>,
    /// The steps, in order.
    pub steps: Vec<Step>,
    /// With an image root: the index in [`Plan::detached`] of the root, which is not a
    /// clone of its `host` path but the image's overlay the helper mounts
    /// ([`crate::image`]).
    pub image_root: Option<usize>,
}

/// A step that failed inside the sandbox.
#[derive(Debug)]
pub struct StepError {
    /// The step.
    pub step: String,
    /// The cause.
    pub source: io::Error,
}

struct Planner<'a> {
    root: &'a Path,
    plan: Plan,
}

impl Planner<'_> {
    fn at(&self, inside: &str) -> PathBuf {
        self.root.join(inside.trim_start_matches('/'))
    }
    fn push(&mut self, step: Step) {
        self.plan.steps.push(step);
    }
    fn attach(&mut self, host: PathBuf, attrs: u64, target: PathBuf) {
        self.plan.detached.push(Detached { host, attrs });
        let mount = self.plan.detached.len() - 1;
        self.push(Step::Attach { mount, target });
    }
    /// Mirrors a host path read-only at `inside` (dir, file or symlink).
    fn mirror(&mut self, host: &Path, kind: HostKind, inside: &str, attrs: u64) {
        let target = self.at(inside);
        match kind {
            HostKind::Symlink(to) => self.push(Step::Symlink {
                target: to,
                link: target,
            }),
            HostKind::Dir => {
                self.push(Step::Mkdir {
                    path: target.clone(),
                    mode: 0o755,
                });
                self.attach(host.to_path_buf(), attrs, target);
            }
            HostKind::File => {
                self.push(Step::File {
                    path: target.clone(),
                    contents: Vec::new(),
                });
                self.attach(host.to_path_buf(), attrs, target);
            }
        }
    }
    fn tmpfs(&mut self, inside: &str, mode: u32, flags: MsFlags, options: &str) {
        let target = self.at(inside);
        self.push(Step::Mkdir {
            path: target.clone(),
            mode,
        });
        self.push(Step::Tmpfs {
            target,
            flags,
            options: options.into(),
        });
    }
    /// A file of the sandbox's own at `inside`: on an image root, whatever the image has
    /// there (a symlink to elsewhere) is removed first.
    fn replace(&mut self, inside: &str, contents: String) {
        if self.root == Path::new("/") {
            self.push(Step::Unlink(self.at(inside)));
        }
        self.file(inside, contents);
    }
    fn file(&mut self, inside: &str, contents: String) {
        let path = self.at(inside);
        self.push(Step::File {
            path,
            contents: contents.into_bytes(),
        });
    }
}

/// Plans the view of `spec`, with the new root mounted at `new_root` (an empty host
/// directory that only the sandbox's mount namespace mounts over).
pub fn plan(spec: &Spec, new_root: &Path, host: &dyn HostFs) -> Plan {
    let ro = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    let safe = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    // An image root is entered first: every later path is then resolved inside it, so
    // a symlink the image holds (`/etc -> /host/path`) never leads a step of the set-up
    // out of the sandbox's own tree.
    let image = spec.image.as_ref();
    let mut p = Planner {
        root: if image.is_some() {
            Path::new("/")
        } else {
            new_root
        },
        plan: Plan {
            detached: Vec::new(),
            steps: Vec::new(),
            image_root: None,
        },
    };

    p.push(Step::MakePrivate);
    if let Some(image) = image {
        p.plan.detached.push(Detached {
            host: image.meta.clone(),
            attrs: MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        });
        p.plan.image_root = Some(0);
        p.push(Step::Attach {
            mount: 0,
            target: new_root.to_path_buf(),
        });
        // The kernel mounts a new `proc` only where another stays fully visible (the
        // host's, under the old root), so `/proc` is mounted before the old root goes,
        // and nothing else is done meanwhile: the image's symlinks could name the old
        // root's paths.
        p.push(Step::PivotRootKeepingOld {
            new_root: new_root.to_path_buf(),
        });
        p.push(Step::Mkdir {
            path: "/proc".into(),
            mode: 0o555,
        });
        p.push(Step::Proc {
            target: "/proc".into(),
        });
        p.push(Step::DetachOldRoot);
    } else {
        p.push(Step::Tmpfs {
            target: new_root.to_path_buf(),
            flags: safe,
            options: "mode=0755,size=16m".into(),
        });
        for dir in SYSTEM_DIRS {
            let host_path = Path::new("/").join(dir);
            if let Some(kind) = host.kind(&host_path) {
                p.mirror(&host_path, kind, dir, ro);
            }
        }
    }

    p.push(Step::Mkdir {
        path: p.at("etc"),
        mode: 0o755,
    });
    for entry in ETC_ENTRIES.iter().filter(|_| image.is_none()) {
        let host_path = Path::new("/etc").join(entry);
        if let Some(kind) = host.kind(&host_path) {
            p.mirror(&host_path, kind, &format!("etc/{entry}"), ro);
        }
    }
    let name = &spec.name;
    p.replace("etc/hostname", format!("{name}\n"));
    p.replace(
        "etc/hosts",
        format!("127.0.0.1\tlocalhost {name}\n::1\tlocalhost\n"),
    );
    // With egress the sandbox's own resolver answers on its loopback, for the names its
    // policy allows only; otherwise nothing resolves.
    p.replace(
        "etc/resolv.conf",
        if spec.egress.is_some() {
            "# the sandbox's own resolver: only the names its egress policy allows\n\
             nameserver 127.0.0.1\noptions attempts:1 timeout:2\n"
                .into()
        } else {
            "# no DNS inside a cowspace sandbox\n".into()
        },
    );
    // An image keeps its own users and groups.
    if image.is_none() {
        p.file(
            "etc/passwd",
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
                .into(),
        );
        p.file("etc/group", "root:x:0:\nnogroup:x:65534:\n".into());
    }

    if image.is_none() {
        p.push(Step::Mkdir {
            path: p.at("proc"),
            mode: 0o555,
        });
        p.push(Step::Proc {
            target: p.at("proc"),
        });
    }

    p.tmpfs(
        "dev",
        0o755,
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        "mode=0755,size=64k",
    );
    for node in DEV_NODES {
        let host_path = Path::new("/dev").join(node);
        if host.kind(&host_path).is_some() {
            p.mirror(
                &host_path,
                HostKind::File,
                &format!("dev/{node}"),
                MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC,
            );
        }
    }
    p.push(Step::Mkdir {
        path: p.at("dev/pts"),
        mode: 0o755,
    });
    p.push(Step::Devpts {
        target: p.at("dev/pts"),
    });
    p.tmpfs("dev/shm", 0o1777, safe, "mode=1777");
    for (link, to) in [
        ("dev/ptmx", "pts/ptmx"),
        ("dev/fd", "/proc/self/fd"),
        ("dev/stdin", "/proc/self/fd/0"),
        ("dev/stdout", "/proc/self/fd/1"),
        ("dev/stderr", "/proc/self/fd/2"),
    ] {
        p.push(Step::Symlink {
            target: to.into(),
            link: p.at(link),
        });
    }

    p.tmpfs("tmp", 0o1777, safe, "mode=1777");
    // An image's /root is its own, written to the sandbox's private layer.
    if image.is_none() {
        p.tmpfs("root", 0o700, safe, "mode=0700");
    }

    let workspace = p.at("workspace");
    p.push(Step::Mkdir {
        path: workspace.clone(),
        mode: 0o755,
    });
    let after_pivot = match &spec.overlay {
        // A long-lived sandbox's overlay is mounted once by the helper, on layers
        // idmapped with this sandbox's user namespace (`crate::share`): the sandbox gets
        // a clone of that mount, whose owners are already the sandbox's.
        Some(_) if spec.share_host_mount => {
            p.attach(
                spec.workspace.clone(),
                MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
                workspace,
            );
            Vec::new()
        }
        None => {
            p.attach(
                spec.workspace.clone(),
                MOUNT_ATTR_IDMAP | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
                workspace,
            );
            Vec::new()
        }
        Some(layers) => plan_overlay(&mut p, layers),
    };

    for bind in &spec.ro_binds {
        let inside = bind
            .target
            .to_string_lossy()
            .trim_start_matches('/')
            .to_string();
        let mut ancestor = PathBuf::new();
        let parts: Vec<_> = Path::new(&inside).components().collect();
        for part in &parts[..parts.len().saturating_sub(1)] {
            ancestor.push(part);
            let path = p.root.join(&ancestor);
            p.push(Step::Mkdir { path, mode: 0o755 });
        }
        // Without following a final symlink: one swapped in after validation fails the
        // no-symlink open of the mount instead of deciding the mount point's kind.
        let kind = if std::fs::symlink_metadata(&bind.source).is_ok_and(|m| m.is_dir()) {
            HostKind::Dir
        } else {
            HostKind::File
        };
        p.mirror(&bind.source, kind, &inside, ro);
    }

    if !spec.secrets.is_empty() {
        let dir = crate::spec::SECRETS_DIR.trim_start_matches('/');
        p.push(Step::Mkdir {
            path: p.at("run"),
            mode: 0o755,
        });
        p.tmpfs(dir, 0o700, safe | MsFlags::MS_NOEXEC, "mode=0700,size=8m");
        for secret in &spec.secrets {
            let path = p.at(&format!("{dir}/{}", secret.name));
            p.push(Step::File {
                path,
                contents: secret.contents.clone(),
            });
        }
        p.push(Step::RemountReadOnly { target: p.at(dir) });
    }

    if let Some(inject) = &spec.inject {
        // The sandbox's certificate authority (never its key) and the bundle naming it.
        let dir = crate::spec::inject::CA_DIR.trim_start_matches('/');
        p.push(Step::Mkdir {
            path: p.at("run"),
            mode: 0o755,
        });
        p.tmpfs(dir, 0o755, safe | MsFlags::MS_NOEXEC, "mode=0755,size=4m");
        for (file, contents) in [
            (crate::spec::inject::CA_FILE, &inject.ca_cert_pem),
            (crate::spec::inject::BUNDLE_FILE, &inject.bundle_pem),
        ] {
            p.push(Step::File {
                path: p.at(file.trim_start_matches('/')),
                contents: contents.as_bytes().to_vec(),
            });
        }
        p.push(Step::RemountReadOnly { target: p.at(dir) });
    }

    if image.is_none() {
        p.push(Step::PivotRoot {
            new_root: new_root.to_path_buf(),
        });
    }
    for step in after_pivot {
        p.push(step);
    }
    // An image root stays writable: its writes go to the sandbox's private layer.
    if image.is_none() {
        p.push(Step::RemountRootReadOnly);
    }
    // An image's working directory that the image lacks is made in the sandbox's
    // private layer (as container runtimes make a `WorkingDir`), inside the image root.
    if image.is_some() && !spec.workdir.starts_with(crate::spec::DEFAULT_WORKDIR) {
        let mut ancestors: Vec<&Path> = spec.workdir.ancestors().collect();
        ancestors.reverse();
        for dir in ancestors.into_iter().skip(1) {
            p.push(Step::Mkdir {
                path: dir.to_path_buf(),
                mode: 0o755,
            });
        }
    }
    p.push(Step::Chdir("/workspace".into()));
    p.plan
}

/// The workspace as a new overlay of idmapped layers (see [`crate::overlay`]): the
/// layers are attached under a hidden directory of the new root before `pivot_root`;
/// the steps returned run after it: mount the overlay at `/workspace` (so its options
/// name only paths of the sandbox's view, never host paths), then detach the layers
/// again (overlayfs keeps private clones of them) and remove the hidden directory.
fn plan_overlay(p: &mut Planner<'_>, layers: &crate::overlay::Layers) -> Vec<Step> {
    p.push(Step::Mkdir {
        path: p.at(LAYERS_DIR),
        mode: 0o700,
    });
    let hidden = Path::new("/").join(LAYERS_DIR);
    let mut attached = Vec::new();
    for (i, lower) in layers.lowers.iter().enumerate() {
        let name = format!("{LAYERS_DIR}/l{i}");
        p.push(Step::Mkdir {
            path: p.at(&name),
            mode: 0o700,
        });
        p.attach(
            lower.clone(),
            MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
            p.at(&name),
        );
        attached.push(hidden.join(format!("l{i}")));
    }
    let rw_name = format!("{LAYERS_DIR}/rw");
    p.push(Step::Mkdir {
        path: p.at(&rw_name),
        mode: 0o700,
    });
    p.attach(
        layers.upper_parent.clone(),
        MOUNT_ATTR_IDMAP | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        p.at(&rw_name),
    );
    let rw = hidden.join("rw");
    let options = crate::overlay::mount_options(
        &attached,
        &[],
        &rw.join(&layers.upper_name),
        &rw.join(&layers.work_name),
        false,
    );
    attached.push(rw);
    let mut after_pivot = vec![Step::Overlay {
        target: "/workspace".into(),
        options,
    }];
    after_pivot.extend(attached.into_iter().map(|target| Step::Detach { target }));
    after_pivot.push(Step::Rmdir(hidden));
    after_pivot
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{debian_host, spec};

    #[test]
    fn only_listed_host_paths_are_attached_and_only_the_workspace_is_writable() {
        let plan = plan(&spec(), Path::new("/state/run/w1/root"), &debian_host());
        let hosts: Vec<_> = plan
            .detached
            .iter()
            .map(|d| d.host.to_string_lossy().into_owned())
            .collect();
        for forbidden in ["/root", "/home", "/var", "/run", "/state", "/"] {
            assert!(
                !hosts.iter().any(|h| h == forbidden),
                "{forbidden} attached: {hosts:?}"
            );
        }
        for d in &plan.detached {
            let writable = d.attrs & MOUNT_ATTR_RDONLY == 0;
            let is_dev = d.host.starts_with("/dev");
            assert_eq!(
                writable,
                d.host == Path::new("/srv/ws/w1") || is_dev,
                "{d:?}"
            );
            assert_eq!(d.idmapped(), d.host == Path::new("/srv/ws/w1"), "{d:?}");
            assert!(d.attrs & MOUNT_ATTR_NOSUID != 0, "{d:?} allows suid");
        }
        assert!(hosts.contains(&"/srv/cache".to_string()));
        assert!(hosts.contains(&"/usr".to_string()));
        assert!(plan.steps.contains(&Step::Symlink {
            target: "usr/bin".into(),
            link: "/state/run/w1/root/bin".into()
        }));
    }

    #[test]
    fn an_overlay_workspace_is_mounted_inside_over_idmapped_layers_then_they_are_detached() {
        let mut spec = spec();
        spec.overlay = Some(crate::overlay::Layers {
            lowers: vec!["/r/cache/checkouts/ab".into()],
            data: vec![],
            upper_parent: "/r/ws/ws-1".into(),
            upper_name: "upper".into(),
            work_name: ".sandbox-work.w1.7".into(),
            trusted: false,
        });
        let plan = plan(&spec, Path::new("/r/run/w1/root"), &debian_host());
        assert!(!plan.detached.iter().any(|d| d.host == spec.workspace));
        let lower = plan
            .detached
            .iter()
            .find(|d| d.host == Path::new("/r/cache/checkouts/ab"))
            .unwrap();
        assert!(lower.idmapped() && lower.attrs & MOUNT_ATTR_RDONLY != 0);
        let rw = plan
            .detached
            .iter()
            .find(|d| d.host == Path::new("/r/ws/ws-1"))
            .unwrap();
        assert!(rw.idmapped() && rw.attrs & MOUNT_ATTR_RDONLY == 0);
        let pivot = plan
            .steps
            .iter()
            .position(|s| matches!(s, Step::PivotRoot { .. }))
            .unwrap();
        let tail = &plan.steps[pivot + 1..];
        let Step::Overlay { target, options } = &tail[0] else {
            panic!("{tail:?}")
        };
        assert_eq!(target, Path::new("/workspace"));
        assert_eq!(
            options,
            "lowerdir=/.layers/l0,upperdir=/.layers/rw/upper,workdir=/.layers/rw/.sandbox-work.w1.7,userxattr,redirect_dir=nofollow,index=off,metacopy=off"
        );
        assert_eq!(
            tail[1..4],
            [
                Step::Detach {
                    target: "/.layers/l0".into()
                },
                Step::Detach {
                    target: "/.layers/rw".into()
                },
                Step::Rmdir("/.layers".into()),
            ]
        );
        assert_eq!(tail[4], Step::RemountRootReadOnly);
    }
}
