//! The sandbox's seccomp filter (built with `seccompiler`).
//!
//! Two programs are installed: the main one answers `EPERM` to the refused system calls
//! below, to `clone`/`unshare` asking for a new user namespace, to `ioctl(TIOCSTI)`, and
//! to any call giving a file a set-user-id or set-group-id mode; the second answers
//! `ENOSYS` to `clone3` and `openat2`, whose arguments live in memory a filter cannot
//! inspect, so the C library falls back to `clone` and `openat`, which the main filter
//! checks.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use crate::error::{Error, Result};

/// System calls refused outright, with `EPERM`.
pub const REFUSED: &[(&str, i64)] = &[
    ("mount", libc::SYS_mount),
    ("umount2", libc::SYS_umount2),
    ("pivot_root", libc::SYS_pivot_root),
    ("open_tree", libc::SYS_open_tree),
    ("move_mount", libc::SYS_move_mount),
    ("fsopen", libc::SYS_fsopen),
    ("fsconfig", libc::SYS_fsconfig),
    ("fsmount", libc::SYS_fsmount),
    ("fspick", libc::SYS_fspick),
    ("mount_setattr", libc::SYS_mount_setattr),
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    ("bpf", libc::SYS_bpf),
    ("perf_event_open", libc::SYS_perf_event_open),
    ("ptrace", libc::SYS_ptrace),
    ("process_vm_writev", libc::SYS_process_vm_writev),
    ("keyctl", libc::SYS_keyctl),
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
    ("reboot", libc::SYS_reboot),
    ("swapon", libc::SYS_swapon),
    ("swapoff", libc::SYS_swapoff),
    ("setns", libc::SYS_setns),
    ("acct", libc::SYS_acct),
    ("userfaultfd", libc::SYS_userfaultfd),
    // io_uring performs opens and chmods the filter cannot see.
    ("io_uring_setup", libc::SYS_io_uring_setup),
    ("io_uring_enter", libc::SYS_io_uring_enter),
    ("io_uring_register", libc::SYS_io_uring_register),
];

fn arch() -> Result<TargetArch> {
    std::env::consts::ARCH
        .try_into()
        .map_err(|e| Error::Seccomp(format!("architecture {}: {e:?}", std::env::consts::ARCH)))
}

fn seccomp_err(e: impl std::fmt::Display) -> Error {
    Error::Seccomp(e.to_string())
}

/// A condition "argument `arg` has all bits of `mask` set".
fn has_bits(arg: u8, len: SeccompCmpArgLen, mask: u64) -> Result<SeccompCondition> {
    SeccompCondition::new(arg, len, SeccompCmpOp::MaskedEq(mask), mask).map_err(seccomp_err)
}

fn rule(conditions: Vec<SeccompCondition>) -> Result<SeccompRule> {
    SeccompRule::new(conditions).map_err(seccomp_err)
}

/// `clone` / `unshare` asking for a new user namespace (flags are argument 0).
fn new_user_ns_rule() -> Result<Vec<SeccompRule>> {
    let flag = libc::CLONE_NEWUSER as u64;
    Ok(vec![rule(vec![has_bits(
        0,
        SeccompCmpArgLen::Qword,
        flag,
    )?])?])
}

/// A mode argument (`mode_arg`) with the set-user-id or set-group-id bit, optionally
/// only when the flags argument has `O_CREAT` (`open`, `openat`).
fn set_id_mode_rules(mode_arg: u8, creat_flags_arg: Option<u8>) -> Result<Vec<SeccompRule>> {
    let mut rules = Vec::new();
    for bit in [libc::S_ISUID, libc::S_ISGID] {
        let mut conds = vec![has_bits(mode_arg, SeccompCmpArgLen::Dword, bit as u64)?];
        if let Some(flags) = creat_flags_arg {
            conds.push(has_bits(
                flags,
                SeccompCmpArgLen::Dword,
                libc::O_CREAT as u64,
            )?);
        }
        rules.push(rule(conds)?);
    }
    Ok(rules)
}

/// System calls that can give a file a set-user-id or set-group-id mode, and where the
/// mode is. Root inside owns the workspace's root-owned files through the idmapped
/// mount, so a set-id file made there would be set-id root on the host.
fn set_id_mode_syscalls() -> Vec<(i64, u8, Option<u8>)> {
    let mut v = vec![
        (libc::SYS_fchmod, 1, None),
        (libc::SYS_fchmodat, 2, None),
        (libc::SYS_fchmodat2, 2, None),
        (libc::SYS_mknodat, 2, None),
        (libc::SYS_openat, 3, Some(2)),
    ];
    #[cfg(target_arch = "x86_64")]
    v.extend([
        (libc::SYS_chmod, 1, None),
        (libc::SYS_mknod, 1, None),
        (libc::SYS_creat, 1, None),
        (libc::SYS_open, 2, Some(1)),
    ]);
    v
}

/// Builds the two BPF programs, in the order they must be installed.
pub fn programs() -> Result<Vec<BpfProgram>> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        REFUSED.iter().map(|&(_, nr)| (nr, Vec::new())).collect();
    rules.insert(libc::SYS_unshare, new_user_ns_rule()?);
    rules.insert(libc::SYS_clone, new_user_ns_rule()?);
    // TIOCSTI pushes input into a terminal: with the host's terminal on stdin, keystrokes
    // typed into the host's shell after the sandbox ends.
    // The type of ioctl request numbers differs between C libraries.
    #[allow(clippy::unnecessary_cast)]
    let tiocsti = SeccompCondition::new(
        1,
        SeccompCmpArgLen::Dword,
        SeccompCmpOp::Eq,
        libc::TIOCSTI as u64,
    )
    .map_err(seccomp_err)?;
    rules.insert(libc::SYS_ioctl, vec![rule(vec![tiocsti])?]);
    for (nr, mode_arg, flags_arg) in set_id_mode_syscalls() {
        rules.insert(nr, set_id_mode_rules(mode_arg, flags_arg)?);
    }
    let refuse = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch()?,
    )
    .map_err(seccomp_err)?;
    // Arguments in memory cannot be inspected: ENOSYS makes the C library fall back to
    // `clone` and `openat`, which the filter above checks.
    let opaque = SeccompFilter::new(
        [
            (libc::SYS_clone3, Vec::new()),
            (libc::SYS_openat2, Vec::new()),
        ]
        .into_iter()
        .collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch()?,
    )
    .map_err(seccomp_err)?;
    [refuse, opaque]
        .into_iter()
        .map(|f| BpfProgram::try_from(f).map_err(seccomp_err))
        .collect()
}

/// Installs `programs` on the calling thread (needs `no_new_privs` or `CAP_SYS_ADMIN`).
pub fn install(programs: &[BpfProgram]) -> std::io::Result<()> {
    for p in programs {
        seccompiler::apply_filter(p).map_err(|e| std::io::Error::other(e.to_string()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filter_compiles_and_covers_the_required_calls() {
        let programs = programs().unwrap();
        assert_eq!(programs.len(), 2);
        assert!(programs[0].len() > REFUSED.len());
        for name in [
            "mount",
            "umount2",
            "pivot_root",
            "kexec_load",
            "init_module",
            "finit_module",
            "delete_module",
            "bpf",
            "perf_event_open",
            "ptrace",
            "keyctl",
            "add_key",
            "request_key",
            "reboot",
            "swapon",
            "swapoff",
            "setns",
        ] {
            assert!(
                REFUSED.iter().any(|(n, _)| *n == name),
                "{name} not refused"
            );
        }
    }

    /// Installs the filter on a short-lived thread (filters and `no_new_privs` are per
    /// thread unless synchronised) and checks refused and allowed calls.
    #[test]
    fn installed_filter_refuses_with_eperm() {
        let programs = programs().unwrap();
        let handle = std::thread::spawn(move || {
            nix::sys::prctl::set_no_new_privs().unwrap();
            install(&programs).unwrap();
            let refused = nix::unistd::pivot_root("/", "/");
            let unshare_user = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER);
            let (r, _w) = nix::unistd::pipe().unwrap();
            // Unfiltered, TIOCSTI on a pipe fails with ENOTTY.
            let tiocsti = crate::sys::tiocsti(std::os::fd::AsFd::as_fd(&r), b'x');
            assert_eq!(tiocsti.unwrap_err().raw_os_error(), Some(libc::EPERM));
            let dir = tempfile::tempdir().unwrap();
            let file = dir.path().join("f");
            std::fs::write(&file, "x").unwrap();
            use std::os::unix::fs::PermissionsExt;
            let perm = |m| std::fs::set_permissions(&file, std::fs::Permissions::from_mode(m));
            assert_eq!(perm(0o4755).unwrap_err().raw_os_error(), Some(libc::EPERM));
            assert_eq!(perm(0o2755).unwrap_err().raw_os_error(), Some(libc::EPERM));
            perm(0o755).unwrap();
            let create = |m| {
                use std::os::unix::fs::OpenOptionsExt;
                std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .mode(m)
                    .open(dir.path().join("g"))
            };
            assert_eq!(
                create(0o4755).unwrap_err().raw_os_error(),
                Some(libc::EPERM)
            );
            create(0o644).unwrap();
            let allowed = nix::unistd::getpid();
            (refused, unshare_user, allowed)
        });
        let (refused, unshare_user, allowed) = handle.join().unwrap();
        assert_eq!(refused, Err(nix::errno::Errno::EPERM));
        assert_eq!(unshare_user, Err(nix::errno::Errno::EPERM));
        assert!(allowed.as_raw() > 0);
    }
}
