//! The minimal roots qemu and virtiofsd run in: what they hold, planned from the host
//! before anything starts, and carried out by [`crate::sys::vm_child_pre_exec`] in the
//! child between fork and exec.
//!
//! qemu gets a mount namespace of its own whose root is a small tmpfs holding only what
//! it opens (found with `strace -f -e trace=%file` of the command line
//! [`crate::vm::qemu::qemu_args`] builds): its libraries and firmware (`/usr` bound
//! read-only, the host's `/lib*` and `/bin` links re-made as links, or bound read-only
//! where they are directories), the guest kernel and initramfs (read-only files at
//! [`KERNEL`] and [`INITRD`]), the device nodes it may open (`/dev/null`,
//! `/dev/urandom`, and `/dev/kvm` under KVM, owned by qemu's uid) and its run directory
//! at [`RUN_DIR`], the only writable thing. No `/proc`, `/sys`, `/etc`, `/var`, `/tmp`:
//! qemu 7.2 falls back to its built-in data directory without `/proc/self/exe` and
//! needs none of the rest. Nothing of the runtime root, the store or another
//! workspace is in it.
//!
//! virtiofsd's root ([`plan_virtiofsd`]) holds the same system directories, its
//! program, `/dev/null`, `/dev/urandom`, a read-only `/proc` of its own pid namespace,
//! the run directory (writable: its socket) and [`SHARE_DIR`], where the directory it
//! serves is attached; it stays root, since it serves files of every owner.

use std::ffi::OsString;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The run directory as qemu and virtiofsd see it.
pub const RUN_DIR: &str = "/run/vm";
/// Where a virtiofsd's shared directory is attached in its root.
pub const SHARE_DIR: &str = "/share";
/// Where a virtiofsd's sandbox mounts its `/proc`.
pub const PROC_DIR: &str = "/proc";
/// The guest kernel as qemu sees it.
pub const KERNEL: &str = "/vm/vmlinuz";
/// The initramfs as qemu sees it.
pub const INITRD: &str = "/vm/initrd";
/// The host directories bound read-only (when they are directories, not links).
const SYSTEM_DIRS: [&str; 6] = ["/usr", "/bin", "/lib", "/lib64", "/lib32", "/libx32"];
/// The device nodes qemu may open whatever the accelerator.
const DEVICES: [&str; 2] = ["/dev/null", "/dev/urandom"];
/// The KVM device.
pub const DEV_KVM: &str = "/dev/kvm";
/// Size of the root tmpfs (directories, links, device nodes, empty mount points).
pub const ROOT_TMPFS_OPTS: &str = "mode=0755,size=256k,nr_inodes=256";

/// One thing put in the minimal root; paths are the root's, absolute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// An empty directory (0755).
    Dir(PathBuf),
    /// A symbolic link `at` pointing at `target`.
    Symlink {
        /// The link.
        at: PathBuf,
        /// What it points at.
        target: PathBuf,
    },
    /// A character device node (0600 when `owned`, given to qemu's uid; else 0666).
    Device {
        /// The node.
        at: PathBuf,
        /// Its device number.
        rdev: u64,
        /// Given to qemu's uid alone (`/dev/kvm`).
        owned: bool,
    },
    /// A fresh `proc`, read-only, of the child's own pid namespace (it shows that
    /// namespace's processes alone), on a directory made first.
    Proc(PathBuf),
    /// A bind mount of the host's `source` at `at` (a directory or a file, made first).
    Bind {
        /// The host path.
        source: PathBuf,
        /// Where in the root.
        at: PathBuf,
        /// A file (the mount point is an empty file) rather than a directory.
        file: bool,
        /// Writable (the run directory); every other bind is read-only, nosuid, nodev.
        writable: bool,
    },
}

/// What qemu's root is made of, in the order it is made (parents before children).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// The entries.
    pub entries: Vec<Entry>,
}

/// Why a plan could not be made.
#[derive(Debug, thiserror::Error)]
#[error("{what} {}: {source}", path.display())]
pub struct PlanError {
    /// What was looked at.
    pub what: &'static str,
    /// The host path.
    pub path: PathBuf,
    /// The cause.
    #[source]
    pub source: std::io::Error,
}

/// The host side of the plan: the files qemu needs.
#[derive(Debug, Clone)]
pub struct Needs<'a> {
    /// The qemu binary.
    pub qemu: &'a Path,
    /// The guest kernel.
    pub kernel: &'a Path,
    /// The initramfs.
    pub initrd: &'a Path,
    /// The run directory.
    pub run_dir: &'a Path,
    /// `/dev/kvm` is opened (the accelerator is KVM).
    pub kvm: bool,
}

impl Plan {
    fn dir(&mut self, at: &Path) {
        // Parents first; "/" is the tmpfs itself.
        let mut parents: Vec<&Path> = at.ancestors().filter(|p| *p != Path::new("/")).collect();
        parents.reverse();
        for p in parents {
            if !self.has(p) {
                self.entries.push(Entry::Dir(p.to_path_buf()));
            }
        }
    }

    fn has(&self, at: &Path) -> bool {
        self.entries.iter().any(|e| match e {
            Entry::Dir(p) | Entry::Proc(p) => p == at,
            Entry::Symlink { at: p, .. } | Entry::Device { at: p, .. } => p == at,
            Entry::Bind { at: p, .. } => p == at,
        })
    }

    fn parent_dir(&mut self, at: &Path) {
        if let Some(parent) = at.parent() {
            self.dir(parent);
        }
    }

    /// Whether `path` (a host path) is inside one of the bound system directories.
    fn covers(&self, path: &Path) -> bool {
        self.entries.iter().any(|e| {
            matches!(e, Entry::Bind { source, at, writable: false, file: false }
                if source == at && path.starts_with(source))
        })
    }

    /// The bind mounts' sources (for the docs and the tests).
    pub fn sources(&self) -> Vec<&Path> {
        self.entries
            .iter()
            .filter_map(|e| match e {
                Entry::Bind { source, .. } => Some(source.as_path()),
                _ => None,
            })
            .collect()
    }
}

fn lstat(what: &'static str, path: &Path) -> Result<std::fs::Metadata, PlanError> {
    std::fs::symlink_metadata(path).map_err(|source| PlanError {
        what,
        path: path.to_path_buf(),
        source,
    })
}

/// The system directories (bound read-only, or re-made as the host's links) and
/// `program` (bound alone when it lives outside them), under `host`.
fn base(host: &Path, program: &Path, what: &'static str) -> Result<Plan, PlanError> {
    let on_host = |p: &str| host.join(p.trim_start_matches('/'));
    let mut plan = Plan::default();
    for d in SYSTEM_DIRS {
        let Ok(meta) = std::fs::symlink_metadata(on_host(d)) else {
            continue;
        };
        let at = PathBuf::from(d);
        if meta.file_type().is_symlink() {
            let target = std::fs::read_link(on_host(d)).map_err(|source| PlanError {
                what: "read the link",
                path: on_host(d),
                source,
            })?;
            plan.entries.push(Entry::Symlink { at, target });
        } else if meta.is_dir() {
            plan.entries.push(Entry::Bind {
                source: at.clone(),
                at,
                file: false,
                writable: false,
            });
        }
    }
    // A program outside the system directories (a build of its own, `cargo install`'s
    // `~/.cargo/bin`) is bound alone.
    if !plan.covers(program) {
        lstat(what, &on_host(&program.to_string_lossy()))?;
        plan.bind(program, program, true, false);
    }
    Ok(plan)
}

impl Plan {
    /// `/dev` with `devices` (host character devices; `owned` the one given to the
    /// jail's uid alone).
    fn devices(
        &mut self,
        host: &Path,
        devices: &[&str],
        owned: Option<&str>,
    ) -> Result<(), PlanError> {
        self.dir(Path::new("/dev"));
        for &d in devices {
            let on_host = host.join(d.trim_start_matches('/'));
            let meta = std::fs::metadata(&on_host).map_err(|source| PlanError {
                what: "find the device",
                path: on_host.clone(),
                source,
            })?;
            if !meta.file_type().is_char_device() {
                return Err(PlanError {
                    what: "find the device",
                    path: on_host,
                    source: std::io::Error::other("not a character device"),
                });
            }
            self.entries.push(Entry::Device {
                at: d.into(),
                rdev: meta.rdev(),
                owned: Some(d) == owned,
            });
        }
        Ok(())
    }

    /// A bind of the host's `source` at `at`, its parent directories made first.
    fn bind(&mut self, source: &Path, at: &Path, file: bool, writable: bool) {
        self.parent_dir(at);
        self.entries.push(Entry::Bind {
            source: source.to_path_buf(),
            at: at.to_path_buf(),
            file,
            writable,
        });
    }
}

/// Plans qemu's root for `needs`, looking at the host below `host` (`/`; a test's
/// directory in unit tests) for what the system directories and devices are.
pub fn plan(host: &Path, needs: &Needs<'_>) -> Result<Plan, PlanError> {
    let mut plan = base(host, needs.qemu, "find qemu")?;
    let kvm = needs.kvm.then_some(DEV_KVM);
    let devices: Vec<&str> = DEVICES.into_iter().chain(kvm).collect();
    plan.devices(host, &devices, kvm)?;
    for (source, at) in [(needs.kernel, KERNEL), (needs.initrd, INITRD)] {
        plan.bind(source, Path::new(at), true, false);
    }
    // The run directory, writable, at [`RUN_DIR`].
    plan.bind(needs.run_dir, Path::new(RUN_DIR), false, true);
    Ok(plan)
}

/// Plans a virtiofsd's root: the system directories, the program, `/dev/null` and
/// `/dev/urandom`, a read-only `/proc` of its own pid namespace at [`PROC_DIR`] (it
/// reads `/proc` before it enters its own sandbox, which mounts another there), the run
/// directory (its socket) at [`RUN_DIR`], and an empty [`SHARE_DIR`] where the
/// directory it serves is attached. From its exec to its own sandbox (which unshares a
/// mount namespace and forks the server, whose `pivot_root` into [`SHARE_DIR`] moves
/// both processes' roots), it sees nothing of the host but that.
pub fn plan_virtiofsd(host: &Path, virtiofsd: &Path, run_dir: &Path) -> Result<Plan, PlanError> {
    let mut plan = base(host, virtiofsd, "find virtiofsd")?;
    plan.devices(host, &DEVICES, None)?;
    plan.entries.push(Entry::Proc(PROC_DIR.into()));
    plan.bind(run_dir, Path::new(RUN_DIR), false, true);
    plan.dir(Path::new(SHARE_DIR));
    Ok(plan)
}

/// `path` as a NUL-free string under `stage` (where the root is assembled).
pub fn staged(stage: &Path, at: &Path) -> OsString {
    let mut s = stage.as_os_str().to_owned();
    s.push(at.as_os_str());
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn needs<'a>(kvm: bool) -> Needs<'a> {
        Needs {
            qemu: Path::new("/usr/bin/qemu-system-x86_64"),
            kernel: Path::new("/var/cache/cowspace/vm/kernel/boot/vmlinuz"),
            initrd: Path::new("/var/lib/cowspace/cache/vm/initrd-abc.cpio"),
            run_dir: Path::new("/var/lib/cowspace/run/sandbox/vm/ws.1"),
            kvm,
        }
    }

    /// Where `p` binds something writable.
    fn writable(p: &Plan) -> Vec<PathBuf> {
        p.entries
            .iter()
            .filter_map(|e| match e {
                Entry::Bind {
                    at, writable: true, ..
                } => Some(at.clone()),
                _ => None,
            })
            .collect()
    }

    /// A host with merged /usr (links), or with a real /lib64 directory.
    fn host(merged: bool) -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("usr/lib")).unwrap();
        std::fs::create_dir_all(t.path().join("dev")).unwrap();
        if merged {
            std::os::unix::fs::symlink("usr/lib", t.path().join("lib")).unwrap();
            std::os::unix::fs::symlink("usr/bin", t.path().join("bin")).unwrap();
        } else {
            std::fs::create_dir(t.path().join("lib64")).unwrap();
        }
        // The devices are the host's own (a test cannot mknod unprivileged).
        for d in ["null", "urandom", "kvm"] {
            if Path::new("/dev").join(d).exists() {
                std::os::unix::fs::symlink(Path::new("/dev").join(d), t.path().join("dev").join(d))
                    .unwrap();
            }
        }
        t
    }

    #[test]
    fn the_root_binds_only_the_system_the_kernel_the_initrd_and_the_run_directory() {
        let h = host(true);
        let p = plan(h.path(), &needs(false)).unwrap();
        let n = needs(false);
        assert_eq!(
            p.sources(),
            vec![Path::new("/usr"), n.kernel, n.initrd, n.run_dir]
        );
        // Only the run directory is writable, and not at its host path.
        assert_eq!(writable(&p), vec![PathBuf::from(RUN_DIR)]);
        // Merged /usr: the links are links, not binds.
        assert!(p.entries.contains(&Entry::Symlink {
            at: "/lib".into(),
            target: "usr/lib".into()
        }));
        // No /dev/kvm without KVM; /dev/null is a device of its own.
        assert!(!p.has(Path::new(DEV_KVM)));
        assert!(p.has(Path::new("/dev/null")));
        // Nothing of the runtime root appears under its own name.
        for e in &p.entries {
            let at = match e {
                Entry::Dir(a) | Entry::Proc(a) => a,
                Entry::Symlink { at, .. } | Entry::Device { at, .. } | Entry::Bind { at, .. } => at,
            };
            assert!(!at.starts_with("/var"), "{e:?}");
            assert!(at.is_absolute(), "{e:?}");
        }
        // Every entry's parent is made before it.
        for (i, e) in p.entries.iter().enumerate() {
            let at = match e {
                Entry::Dir(a) | Entry::Proc(a) => a,
                Entry::Symlink { at, .. } | Entry::Device { at, .. } | Entry::Bind { at, .. } => at,
            };
            let parent = at.parent().unwrap();
            assert!(
                parent == Path::new("/")
                    || p.entries[..i].contains(&Entry::Dir(parent.to_path_buf())),
                "{e:?} before its parent"
            );
        }
    }

    #[test]
    fn kvm_adds_its_device_for_qemu_alone_and_a_qemu_elsewhere_is_bound_by_itself() {
        let h = host(false);
        if !Path::new(DEV_KVM).exists() {
            eprintln!("skipped: no /dev/kvm on this host");
            return;
        }
        let own = tempfile::tempdir().unwrap();
        let qemu = own.path().join("qemu-system-x86_64");
        let n = Needs {
            qemu: &qemu,
            ..needs(true)
        };
        // Not on this "host": refused, naming what is missing.
        let err = plan(h.path(), &n).unwrap_err();
        assert_eq!(err.what, "find qemu", "{err}");
        let on_host = h.path().join(qemu.strip_prefix("/").unwrap());
        std::fs::create_dir_all(on_host.parent().unwrap()).unwrap();
        std::fs::write(&on_host, "").unwrap();
        let p = plan(h.path(), &n).unwrap();
        assert!(p.entries.contains(&Entry::Bind {
            source: "/lib64".into(),
            at: "/lib64".into(),
            file: false,
            writable: false
        }));
        assert!(p.entries.contains(&Entry::Bind {
            source: qemu.clone(),
            at: qemu.clone(),
            file: true,
            writable: false
        }));
        assert!(p.entries.iter().any(|e| matches!(e,
            Entry::Device { at, owned: true, .. } if at == Path::new(DEV_KVM))));
        assert!(p.entries.iter().any(|e| matches!(e,
            Entry::Device { at, owned: false, .. } if at == Path::new("/dev/null"))));
    }

    #[test]
    fn virtiofsd_gets_the_system_its_program_a_proc_of_its_own_its_run_directory_and_a_share_point()
    {
        let h = host(true);
        let own = Path::new("/root/.cargo/bin/virtiofsd");
        let run = Path::new("/var/lib/cowspace/run/sandbox/vm/ws.1");
        let err = plan_virtiofsd(h.path(), own, run).unwrap_err();
        assert_eq!(err.what, "find virtiofsd", "{err}");
        let on_host = h.path().join(own.strip_prefix("/").unwrap());
        std::fs::create_dir_all(on_host.parent().unwrap()).unwrap();
        std::fs::write(&on_host, "").unwrap();
        let p = plan_virtiofsd(h.path(), own, run).unwrap();
        assert_eq!(p.sources(), vec![Path::new("/usr"), own, run]);
        assert_eq!(writable(&p), vec![PathBuf::from(RUN_DIR)]);
        assert!(p.entries.contains(&Entry::Proc(PROC_DIR.into())));
        assert!(p.entries.contains(&Entry::Dir(SHARE_DIR.into())));
        assert!(!p.has(Path::new(DEV_KVM)));
        assert!(p.has(Path::new("/dev/null")));
        for e in &p.entries {
            if let Entry::Dir(a) | Entry::Proc(a) = e {
                assert!(!a.starts_with("/var"), "{e:?}");
            }
        }
    }
}
