//! What a VM placement needs from the host, found or refused with the command that
//! installs it: the accelerator (and whether it is an isolation boundary), qemu,
//! virtiofsd, the guest kernel with its modules, and busybox.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::{Error, Result};

/// Overrides the guest kernel (a `vmlinuz-<version>` file; its modules are looked for
/// in `../lib/modules/<version>/kernel` beside its `boot/` directory).
pub const KERNEL_ENV: &str = "COWSPACE_VM_KERNEL";
/// Overrides the directory the setup step unpacks the kernel package into.
pub const DIR_ENV: &str = "COWSPACE_VM_DIR";
/// Where `scripts/setup.sh` unpacks Debian's cloud kernel package.
pub const DEFAULT_DIR: &str = "/var/cache/cowspace/vm/kernel";
/// Overrides the qemu binary.
pub const QEMU_ENV: &str = "COWSPACE_VM_QEMU";
/// Overrides the virtiofsd binary.
pub const VIRTIOFSD_ENV: &str = "COWSPACE_VM_VIRTIOFSD";
/// Overrides the static busybox put into the initramfs.
pub const BUSYBOX_ENV: &str = "COWSPACE_VM_BUSYBOX";

/// How to get the guest kernel.
pub const KERNEL_FIX: &str = "run scripts/setup.sh (it downloads Debian's linux-image-*-cloud-amd64 and unpacks it into /var/cache/cowspace/vm/kernel), or point COWSPACE_VM_KERNEL at a vmlinuz";

/// The accelerator qemu would use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Accel {
    /// Hardware virtualization through KVM (kvm_intel or kvm_amd).
    Kvm,
    /// qemu's software emulation.
    Tcg,
}

impl Accel {
    /// The name shown in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }
}

/// Whether the VM's hypervisor is an isolation boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Isolation {
    /// KVM on hardware virtualization: qemu's security policy covers it.
    Hypervisor,
    /// Software emulation: qemu makes no isolation promise; the caller accepted that.
    NeedsValidation,
}

impl Isolation {
    /// The name shown in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::Hypervisor => "hypervisor",
            Isolation::NeedsValidation => "needs_validation",
        }
    }
}

/// The accelerator and why it is (not) an isolation boundary.
#[derive(Debug, Clone, Serialize)]
pub struct AccelProbe {
    /// What qemu will be told to use.
    pub accel: Accel,
    /// What isolates the guest.
    pub isolation: Isolation,
    /// Why, in words.
    pub reason: String,
}

/// Probes the accelerator under `sys_module` (normally `/sys/module`).
pub fn accel_at(sys_module: &Path, dev_kvm: &Path) -> AccelProbe {
    for m in ["kvm_intel", "kvm_amd"] {
        if sys_module.join(m).exists() && dev_kvm.exists() {
            return AccelProbe {
                accel: Accel::Kvm,
                isolation: Isolation::Hypervisor,
                reason: format!(
                    "KVM on hardware virtualization ({m}): an isolation boundary under qemu's security policy"
                ),
            };
        }
    }
    let pvm = if sys_module.join("kvm_pvm").exists() {
        " (/dev/kvm here is kvm_pvm, a paravirtual KVM that boots no stock guest kernel, so it is not used)"
    } else {
        ""
    };
    AccelProbe {
        accel: Accel::Tcg,
        isolation: Isolation::NeedsValidation,
        reason: format!(
            "no hardware KVM (kvm_intel/kvm_amd){pvm}: qemu runs under TCG software emulation, which qemu's security policy says must not be relied on for guest isolation"
        ),
    }
}

/// Probes this host's accelerator.
pub fn accel() -> AccelProbe {
    accel_at(Path::new("/sys/module"), Path::new("/dev/kvm"))
}

fn missing(what: &'static str, reason: String) -> Error {
    Error::VmUnavailable { what, reason }
}

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    let mut dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    // Where `cargo install` (scripts/test.sh) puts virtiofsd.
    if let Some(cargo) = std::env::var_os("CARGO_HOME") {
        dirs.push(Path::new(&cargo).join("bin"));
    }
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(Path::new(&home).join(".cargo/bin"));
    }
    dirs.push("/usr/local/cargo/bin".into());
    dirs.push("/root/.cargo/bin".into());
    dirs.into_iter().map(|d| d.join(name)).find(|p| p.is_file())
}

fn tool(env: &str, name: &str, what: &'static str, fix: &str) -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(env) {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        return Err(missing(
            what,
            format!("{env}={} does not exist; {fix}", p.display()),
        ));
    }
    on_path(name).ok_or_else(|| missing(what, format!("no {name} on PATH; {fix}")))
}

/// The qemu binary.
pub fn qemu() -> Result<PathBuf> {
    tool(
        QEMU_ENV,
        "qemu-system-x86_64",
        "qemu",
        "install it with `apt-get install qemu-system-x86`",
    )
}

/// The virtiofsd binary.
pub fn virtiofsd() -> Result<PathBuf> {
    tool(
        VIRTIOFSD_ENV,
        "virtiofsd",
        "virtiofsd",
        "install it with `apt-get install libcap-ng-dev libseccomp-dev && cargo install virtiofsd --locked`",
    )
}

/// The static busybox for the initramfs.
pub fn busybox() -> Result<PathBuf> {
    tool(
        BUSYBOX_ENV,
        "busybox",
        "busybox",
        "install it with `apt-get install busybox-static`",
    )
}

/// The guest kernel and its modules directory.
#[derive(Debug, Clone)]
pub struct Kernel {
    /// The `vmlinuz-<version>` file.
    pub image: PathBuf,
    /// Its `lib/modules/<version>/kernel` directory.
    pub modules: PathBuf,
    /// `<version>`.
    pub version: String,
}

/// The guest kernel: `$COWSPACE_VM_KERNEL`, else the newest `boot/vmlinuz-*` under
/// `$COWSPACE_VM_DIR` (default [`DEFAULT_DIR`]).
pub fn kernel() -> Result<Kernel> {
    let image = match std::env::var_os(KERNEL_ENV) {
        Some(p) => {
            let p = PathBuf::from(p);
            if !p.is_file() {
                return Err(missing(
                    "guest kernel",
                    format!("{KERNEL_ENV}={} does not exist; {KERNEL_FIX}", p.display()),
                ));
            }
            p
        }
        None => {
            let dir = std::env::var_os(DIR_ENV)
                .map(PathBuf::from)
                .unwrap_or_else(|| DEFAULT_DIR.into());
            let mut found: Vec<PathBuf> = std::fs::read_dir(dir.join("boot"))
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("vmlinuz-"))
                })
                .collect();
            found.sort();
            found.pop().ok_or_else(|| {
                missing(
                    "guest kernel",
                    format!("no guest kernel in {}/boot; {KERNEL_FIX}", dir.display()),
                )
            })?
        }
    };
    let version = image
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("vmlinuz-"))
        .ok_or_else(|| {
            Error::InvalidInput(format!(
                "guest kernel {}: expected a file named vmlinuz-<version> (its modules are found by that version)",
                image.display()
            ))
        })?
        .to_string();
    let root = image
        .parent()
        .and_then(Path::parent)
        .unwrap_or(Path::new("/"));
    let modules = root.join("lib/modules").join(&version).join("kernel");
    if !modules.is_dir() {
        return Err(missing(
            "guest kernel modules",
            format!(
                "no modules for {version} at {}; {KERNEL_FIX}",
                modules.display()
            ),
        ));
    }
    Ok(Kernel {
        image,
        modules,
        version,
    })
}

/// Whether `kernel` can limit the sandbox's processes: its `boot/config-<version>`
/// (beside the image) says `CONFIG_CGROUPS=y` and `CONFIG_CGROUP_PIDS=y` (the guest
/// mounts cgroup2 and enables `pids` there). The reason it cannot, otherwise.
pub fn pids_controller(kernel: &Kernel) -> std::result::Result<(), String> {
    let config = kernel
        .image
        .with_file_name(format!("config-{}", kernel.version));
    let text = std::fs::read_to_string(&config).map_err(|e| {
        format!(
            "the guest kernel's configuration {} cannot be read ({e}): whether it has the cgroup pids controller is unknown",
            config.display()
        )
    })?;
    config_has_pids(&text).map_err(|missing| {
        format!(
            "the guest kernel {} has no cgroup pids controller ({missing} is not set in {}); leave --pids out or use a kernel with it",
            kernel.version,
            config.display()
        )
    })
}

/// The first of the options `--pids` needs that the kernel configuration `text` lacks.
pub fn config_has_pids(text: &str) -> std::result::Result<(), &'static str> {
    for opt in ["CONFIG_CGROUPS", "CONFIG_CGROUP_PIDS"] {
        let set = text
            .lines()
            .any(|l| l.strip_prefix(opt).is_some_and(|rest| rest == "=y"));
        if !set {
            return Err(opt);
        }
    }
    Ok(())
}

/// The host's TSC frequency in kHz (the first `cpu MHz` of `/proc/cpuinfo`), which is
/// the guest's under TCG (qemu reads the host's time stamp counter for the guest's).
pub fn host_tsc_khz() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let mhz: f64 = info
        .lines()
        .find(|l| l.starts_with("cpu MHz"))?
        .split(':')
        .nth(1)?
        .trim()
        .parse()
        .ok()?;
    (mhz > 0.0).then(|| (mhz * 1000.0).round() as u64)
}

/// The first line `BIN --version` prints, if it runs.
pub fn version_of(bin: &Path) -> Option<String> {
    let out = std::process::Command::new(bin)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .map(|l| l.trim().to_string())
}

/// The BLAKE3 of a file (hex), if it can be read.
pub fn file_hash(path: &Path) -> Option<String> {
    let mut h = blake3::Hasher::new();
    h.update_reader(std::fs::File::open(path).ok()?).ok()?;
    Some(h.finalize().to_hex().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accel_is_tcg_without_hardware_kvm_and_names_pvm() {
        let d = tempfile::tempdir().unwrap();
        let kvm = d.path().join("kvm");
        std::fs::write(&kvm, b"").unwrap();
        std::fs::create_dir(d.path().join("kvm_pvm")).unwrap();
        let p = accel_at(d.path(), &kvm);
        assert_eq!(p.accel, Accel::Tcg);
        assert_eq!(p.isolation, Isolation::NeedsValidation);
        assert!(p.reason.contains("kvm_pvm"), "{}", p.reason);
        std::fs::create_dir(d.path().join("kvm_amd")).unwrap();
        let p = accel_at(d.path(), &kvm);
        assert_eq!((p.accel, p.isolation), (Accel::Kvm, Isolation::Hypervisor));
    }

    #[test]
    fn pids_need_cgroups_and_the_pids_controller_built_in() {
        assert_eq!(
            config_has_pids("CONFIG_CGROUPS=y\nCONFIG_CGROUP_PIDS=y\n"),
            Ok(())
        );
        assert_eq!(
            config_has_pids("CONFIG_CGROUPS=y\n# CONFIG_CGROUP_PIDS is not set\n"),
            Err("CONFIG_CGROUP_PIDS")
        );
        assert_eq!(
            config_has_pids("CONFIG_CGROUPS=y\nCONFIG_CGROUP_PIDS=m\n"),
            Err("CONFIG_CGROUP_PIDS")
        );
        assert_eq!(config_has_pids(""), Err("CONFIG_CGROUPS"));
    }
}
