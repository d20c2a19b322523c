//! Running a [`super::Plan`]'s steps inside the sandbox, through the [`Syscall`] seam.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use nix::mount::MsFlags;

use super::{OLD_ROOT, Step, StepError};
use crate::syscall::{Mount, Syscall};

/// Runs `steps` through `sys`. `mounts[i]` is the detached mount of `Plan::detached[i]`.
pub fn apply(sys: &dyn Syscall, steps: &[Step], mounts: &[OwnedFd]) -> Result<(), StepError> {
    for step in steps {
        apply_one(sys, step, mounts).map_err(|source| StepError {
            step: step.describe(),
            source,
        })?;
    }
    Ok(())
}

fn apply_one(sys: &dyn Syscall, step: &Step, mounts: &[OwnedFd]) -> io::Result<()> {
    match step {
        Step::MakePrivate => sys.mount(&Mount::plain(
            Path::new("/"),
            MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        )),
        Step::Tmpfs {
            target,
            flags,
            options,
        } => sys.mount(&Mount {
            source: Some("tmpfs"),
            fstype: Some("tmpfs"),
            data: Some(options),
            ..Mount::plain(target, *flags)
        }),
        Step::Mkdir { path, mode } => sys.mkdir(path, *mode),
        Step::File { path, contents } => sys.write_file(path, contents),
        Step::Symlink { target, link } => sys.symlink(target, link),
        Step::Attach { mount, target } => {
            let fd = mounts.get(*mount).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("detached mount {mount} missing"),
                )
            })?;
            sys.attach(fd.as_fd(), target)
        }
        Step::Proc { target } => sys.mount(&Mount {
            source: Some("proc"),
            fstype: Some("proc"),
            ..Mount::plain(
                target,
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            )
        }),
        Step::Devpts { target } => sys.mount(&Mount {
            source: Some("devpts"),
            fstype: Some("devpts"),
            data: Some("newinstance,ptmxmode=0666,mode=0620"),
            ..Mount::plain(target, MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC)
        }),
        Step::PivotRoot { new_root } => {
            let put_old = new_root.join(OLD_ROOT);
            sys.mkdir(&put_old, 0o700)?;
            sys.pivot_root(new_root, &put_old)?;
            sys.chdir(Path::new("/"))?;
            let old = Path::new("/").join(OLD_ROOT);
            sys.umount_detach(&old)?;
            sys.rmdir(&old)
        }
        Step::PivotRootKeepingOld { new_root } => {
            let put_old = new_root.join(OLD_ROOT);
            sys.mkdir(&put_old, 0o700)?;
            sys.pivot_root(new_root, &put_old)?;
            sys.chdir(Path::new("/"))
        }
        Step::DetachOldRoot => {
            let old = Path::new("/").join(OLD_ROOT);
            sys.umount_detach(&old)?;
            sys.rmdir(&old)
        }
        Step::RemountRootReadOnly => sys.mount(&Mount::plain(
            Path::new("/"),
            MsFlags::MS_REMOUNT
                | MsFlags::MS_BIND
                | MsFlags::MS_RDONLY
                | MsFlags::MS_NOSUID
                | MsFlags::MS_NODEV,
        )),
        Step::RemountReadOnly { target } => sys.mount(&Mount::plain(
            target,
            MsFlags::MS_REMOUNT
                | MsFlags::MS_RDONLY
                | MsFlags::MS_NOSUID
                | MsFlags::MS_NODEV
                | MsFlags::MS_NOEXEC,
        )),
        Step::Overlay { target, options } => sys.mount(&Mount {
            source: Some("cowspace"),
            fstype: Some("overlay"),
            data: Some(options),
            ..Mount::plain(
                target,
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOATIME,
            )
        }),
        Step::Detach { target } => {
            sys.umount_detach(target)?;
            sys.rmdir(target)
        }
        Step::Rmdir(path) => sys.rmdir(path),
        Step::Unlink(path) => match sys.unlink(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        },
        Step::Chdir(path) => sys.chdir(path),
    }
}

#[cfg(test)]
mod tests {
    use super::super::plan;
    use super::*;
    use crate::testing::{Recorder, debian_host, detached_fds, spec};

    #[test]
    fn applying_pivots_after_every_mount_then_detaches_old_root_and_locks_root() {
        let plan = plan(&spec(), Path::new("/r"), &debian_host());
        let fds = detached_fds(&plan);
        let rec = Recorder::default();
        apply(&rec, &plan.steps, &fds).unwrap();
        let log = rec.calls();
        assert!(log[0].starts_with("mount None / None"), "{}", log[0]);
        assert!(log[0].contains("MS_PRIVATE") && log[0].contains("MS_REC"));
        let pivot = log
            .iter()
            .position(|l| l == "pivot_root /r /r/.oldroot")
            .unwrap();
        let tail: Vec<_> = log[pivot..].to_vec();
        assert_eq!(
            tail[..4],
            [
                "pivot_root /r /r/.oldroot",
                "chdir /",
                "umount_detach /.oldroot",
                "rmdir /.oldroot"
            ]
        );
        assert!(tail[4].starts_with("mount None / None") && tail[4].contains("MS_RDONLY"));
        assert_eq!(tail[5], "chdir /workspace");
        assert_eq!(tail.len(), 6);
        assert!(
            log[..pivot]
                .iter()
                .all(|l| !l.contains("/.oldroot") || l.starts_with("mkdir"))
        );
        assert!(log.contains(&"attach /r/workspace".to_string()));
        assert!(log.contains(&"mkdir /r/deps".to_string()));
        assert!(log.contains(&"attach /r/deps/cache".to_string()));
        let secret = log
            .iter()
            .position(|l| l == "write /r/run/secrets/token")
            .unwrap();
        let locked = log
            .iter()
            .position(|l| l.starts_with("mount None /r/run/secrets") && l.contains("MS_RDONLY"))
            .unwrap();
        assert!(
            secret < locked && locked < pivot,
            "secrets written, then locked, before pivot"
        );
        let proc_at = log
            .iter()
            .position(|l| l.contains("Some(\"proc\")"))
            .unwrap();
        assert!(proc_at < pivot);
    }

    #[test]
    fn a_failing_step_is_named() {
        let plan = plan(&spec(), Path::new("/r"), &debian_host());
        let fds = detached_fds(&plan);
        let err = apply(&Recorder::failing_at("pivot_root"), &plan.steps, &fds).unwrap_err();
        assert_eq!(err.step, "pivot_root");
        assert_eq!(err.source.raw_os_error(), Some(libc::EINVAL));
    }
}
