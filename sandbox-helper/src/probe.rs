//! What this host can enforce: checked before every run, and shown by `probe`.

use std::path::Path;

use crate::cgroup::{self, ControllerKind};
use crate::error::{Error, Result};

/// One control and whether this host can enforce it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Check {
    /// The control.
    pub control: &'static str,
    /// Whether it can be enforced.
    pub available: bool,
    /// How (when available) or what the host lacks (when not).
    pub detail: String,
}

fn check(control: &'static str, result: std::result::Result<String, String>) -> Check {
    match result {
        Ok(detail) => Check {
            control,
            available: true,
            detail,
        },
        Err(detail) => Check {
            control,
            available: false,
            detail,
        },
    }
}

fn root() -> std::result::Result<String, String> {
    if nix::unistd::geteuid().is_root() {
        Ok("running as root".into())
    } else {
        Err(
            "the helper must run as root (it maps a dedicated host uid range and writes cgroups)"
                .into(),
        )
    }
}

fn user_namespaces() -> std::result::Result<String, String> {
    let path = "/proc/sys/user/max_user_namespaces";
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    match text.trim().parse::<u64>() {
        Ok(0) => Err(format!("{path} is 0")),
        Ok(n) => Ok(format!("up to {n}")),
        Err(_) => Err(format!("{path}: unreadable value {text:?}")),
    }
}

fn seccomp() -> std::result::Result<String, String> {
    let status = std::fs::read_to_string("/proc/self/status").map_err(|e| e.to_string())?;
    if status.lines().any(|l| l.starts_with("Seccomp:")) {
        Ok("seccomp filters (BPF)".into())
    } else {
        Err("the kernel has no seccomp (no `Seccomp:` in /proc/self/status)".into())
    }
}

/// Every control, for `sandbox-helper probe`.
pub fn probe(cgroup_root: &Path) -> Vec<Check> {
    let mut out = vec![
        check("root privileges", root()),
        check(
            "user, mount, pid, net, ipc, uts, cgroup namespaces",
            user_namespaces(),
        ),
        check("seccomp filter", seccomp()),
        check(
            "no_new_privs and capability bounding set",
            Ok("prctl".into()),
        ),
    ];
    for c in ControllerKind::ALL {
        out.push(check(
            c.control(),
            cgroup::locate(cgroup_root, c).map(|p| {
                format!("cgroup {:?} at {}", p.version, p.hierarchy.display()).to_lowercase()
            }),
        ));
    }
    out.push(check(
        "idmapped workspace mount",
        Ok(
            "checked per workspace at run time (needs a filesystem that supports idmapped mounts)"
                .into(),
        ),
    ));
    out.push(check(
        "published ports",
        Ok("proxy threads that connect inside the sandbox's network namespace (setns)".into()),
    ));
    out
}

/// Refuses unless root, user namespaces and seccomp are available.
pub fn require_base() -> Result<()> {
    for (control, result) in [
        ("root privileges", root()),
        ("user namespace", user_namespaces()),
        ("seccomp filter", seccomp()),
    ] {
        result.map_err(|reason| Error::Unsupported { control, reason })?;
    }
    Ok(())
}
