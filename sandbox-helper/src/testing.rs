//! Test support: the recording [`Syscall`] the unit tests run the setup sequence
//! against, a sample [`Spec`] and a host to plan its view on.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::sched::CloneFlags;
use nix::sys::resource::Resource;
use nix::sys::signal::Signal;
use nix::unistd::{Gid, Uid};
use seccompiler::BpfProgram;

use crate::rootfs::{DEV_NODES, HostFs, HostKind, Plan};
use crate::spec::{Net, RoBind, Secret, Spec};
use crate::syscall::{Mount, Syscall};

/// What [`Recorder`] answers for `getrlimit` (soft, hard).
pub const RECORDED_RLIMIT: (u64, u64) = (1_024, 1_048_576);
/// What [`Recorder`] answers for `cap_last_cap`.
pub const RECORDED_CAP_LAST_CAP: u32 = 40;

/// Logs every call, in order, as one line (`"setresuid 0"`, `"mount None / None …"`),
/// and succeeds, except for the first call whose line starts with the prefix given to
/// [`Recorder::failing_at`]: that one is logged and fails with `EINVAL`.
#[derive(Debug, Default)]
pub struct Recorder {
    log: RefCell<Vec<String>>,
    fail_at: Option<&'static str>,
}

impl Recorder {
    /// A recorder that fails the first call whose line starts with `prefix`.
    pub fn failing_at(prefix: &'static str) -> Recorder {
        Recorder {
            log: RefCell::default(),
            fail_at: Some(prefix),
        }
    }

    /// The calls so far.
    pub fn calls(&self) -> Vec<String> {
        self.log.borrow().clone()
    }

    /// The position of the first call whose line starts with `prefix`.
    pub fn position(&self, prefix: &str) -> Option<usize> {
        self.log.borrow().iter().position(|l| l.starts_with(prefix))
    }

    fn call(&self, line: String) -> io::Result<()> {
        let fails = self.fail_at.is_some_and(|p| line.starts_with(p))
            && !self
                .log
                .borrow()
                .iter()
                .any(|l| self.fail_at.is_some_and(|p| l.starts_with(p)));
        self.log.borrow_mut().push(line);
        if fails {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        Ok(())
    }
}

impl Syscall for Recorder {
    fn mount(&self, m: &Mount<'_>) -> io::Result<()> {
        let (s, f) = (m.source, m.fstype);
        self.call(format!(
            "mount {s:?} {} {f:?} {:?}",
            m.target.display(),
            m.flags
        ))
    }
    fn mkdir(&self, p: &Path, _: u32) -> io::Result<()> {
        self.call(format!("mkdir {}", p.display()))
    }
    fn write_file(&self, p: &Path, _: &[u8]) -> io::Result<()> {
        self.call(format!("write {}", p.display()))
    }
    fn symlink(&self, t: &Path, l: &Path) -> io::Result<()> {
        self.call(format!("symlink {} -> {}", l.display(), t.display()))
    }
    fn attach(&self, _: BorrowedFd<'_>, t: &Path) -> io::Result<()> {
        self.call(format!("attach {}", t.display()))
    }
    fn pivot_root(&self, n: &Path, o: &Path) -> io::Result<()> {
        self.call(format!("pivot_root {} {}", n.display(), o.display()))
    }
    fn umount_detach(&self, t: &Path) -> io::Result<()> {
        self.call(format!("umount_detach {}", t.display()))
    }
    fn rmdir(&self, p: &Path) -> io::Result<()> {
        self.call(format!("rmdir {}", p.display()))
    }
    fn unlink(&self, p: &Path) -> io::Result<()> {
        self.call(format!("unlink {}", p.display()))
    }
    fn chdir(&self, p: &Path) -> io::Result<()> {
        self.call(format!("chdir {}", p.display()))
    }
    fn setsid(&self) -> io::Result<()> {
        self.call("setsid".into())
    }
    fn setresgid(&self, gid: Gid) -> io::Result<()> {
        self.call(format!("setresgid {gid}"))
    }
    fn setgroups(&self, groups: &[Gid]) -> io::Result<()> {
        self.call(format!("setgroups {groups:?}"))
    }
    fn setresuid(&self, uid: Uid) -> io::Result<()> {
        self.call(format!("setresuid {uid}"))
    }
    fn set_pdeathsig(&self, signal: Signal) -> io::Result<()> {
        self.call(format!("set_pdeathsig {signal}"))
    }
    fn sethostname(&self, name: &str) -> io::Result<()> {
        self.call(format!("sethostname {name}"))
    }
    fn unshare(&self, flags: CloneFlags) -> io::Result<()> {
        self.call(format!("unshare {flags:?}"))
    }
    fn setns(&self, _: BorrowedFd<'_>, nstype: CloneFlags) -> io::Result<()> {
        self.call(format!("setns {nstype:?}"))
    }
    fn loopback_up(&self) -> io::Result<()> {
        self.call("loopback_up".into())
    }
    fn allow_ping_sockets(&self, ids: u32) -> io::Result<()> {
        self.call(format!("allow_ping_sockets {ids}"))
    }
    fn getrlimit(&self, resource: Resource) -> io::Result<(u64, u64)> {
        self.call(format!("getrlimit {resource:?}"))
            .map(|()| RECORDED_RLIMIT)
    }
    fn setrlimit(&self, resource: Resource, soft: u64, hard: u64) -> io::Result<()> {
        self.call(format!("setrlimit {resource:?} {soft} {hard}"))
    }
    fn cap_last_cap(&self) -> io::Result<u32> {
        self.call("cap_last_cap".into())
            .map(|()| RECORDED_CAP_LAST_CAP)
    }
    fn capbset_drop(&self, cap: u32) -> io::Result<()> {
        self.call(format!("capbset_drop {cap}"))
    }
    fn ambient_clear_all(&self) -> io::Result<()> {
        self.call("ambient_clear_all".into())
    }
    fn set_no_new_privs(&self) -> io::Result<()> {
        self.call("set_no_new_privs".into())
    }
    fn install_seccomp(&self, programs: &[BpfProgram]) -> io::Result<()> {
        self.call(format!("install_seccomp {}", programs.len()))
    }
}

/// A sandbox `w1` of workspace `/srv/ws/w1` with one secret and one read-only bind.
pub fn spec() -> Spec {
    Spec {
        name: "w1".into(),
        workspace: "/srv/ws/w1".into(),
        net: Net::None,
        limits: Default::default(),
        publish: vec![],
        egress: None,
        inject: None,
        env: Default::default(),
        secrets: vec![Secret {
            name: "token".into(),
            contents: b"s3cr3t".to_vec(),
        }],
        ro_binds: vec![RoBind {
            source: "/srv/cache".into(),
            target: "/deps/cache".into(),
        }],
        cap_net_raw: false,
        keep: false,
        share_host_mount: false,
        command: vec!["/bin/true".into()],
        overlay: None,
        suspend_host_mount: false,
        idle_timeout: None,
        image: None,
        user: None,
        workdir: crate::spec::DEFAULT_WORKDIR.into(),
    }
}

/// A host as [`crate::rootfs::plan`] sees it: the paths that exist and their kinds.
pub struct FakeHost(BTreeMap<PathBuf, HostKind>);

impl HostFs for FakeHost {
    fn kind(&self, path: &Path) -> Option<HostKind> {
        self.0.get(path).cloned()
    }
}

/// A merged-/usr host with the `/etc` files and `/dev` nodes a sandbox takes.
pub fn debian_host() -> FakeHost {
    let mut m = BTreeMap::new();
    m.insert("/usr".into(), HostKind::Dir);
    m.insert("/bin".into(), HostKind::Symlink("usr/bin".into()));
    m.insert("/lib".into(), HostKind::Symlink("usr/lib".into()));
    m.insert("/etc/ld.so.cache".into(), HostKind::File);
    m.insert("/etc/ssl".into(), HostKind::Dir);
    for node in DEV_NODES {
        m.insert(Path::new("/dev").join(node), HostKind::File);
    }
    FakeHost(m)
}

/// A stand-in descriptor (`/dev/null`) for each detached mount of `plan`.
pub fn detached_fds(plan: &Plan) -> Vec<OwnedFd> {
    let null = |_| std::fs::File::open("/dev/null").unwrap().into();
    plan.detached.iter().map(null).collect()
}
