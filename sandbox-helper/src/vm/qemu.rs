//! The command lines of one VM's two host processes: `virtiofsd` serving the workspace
//! and `qemu-system-x86_64 -M microvm` running the guest.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::probe::Accel;

/// The virtio-fs tag the guest mounts at `/workspace`.
pub const FS_TAG: &str = "workspace";
/// The one virtio-serial port: its host socket's file name and its name in the guest
/// (the guest agent's channel, [`super::proto`]).
pub const AGENT_PORT: (&str, &str) = ("agent.sock", "cowspace.agent");
/// The guest's address on qemu's user network (`--publish`).
pub const GUEST_ADDR: &str = "10.0.2.15";
/// TCG's translation cache (qemu defaults to 1 GiB; the cgroup limit counts it).
pub const TCG_TB_MIB: u64 = 128;

/// The files of one VM in its run directory.
#[derive(Debug, Clone)]
pub struct RunFiles {
    /// The per-run directory.
    pub dir: PathBuf,
}

impl RunFiles {
    /// virtiofsd's vhost-user socket.
    pub fn fs_sock(&self) -> PathBuf {
        self.dir.join("fs.sock")
    }
    /// The guest's serial console (kernel messages, `/init`'s failures).
    pub fn console(&self) -> PathBuf {
        self.dir.join("console.log")
    }
    /// The vhost-user socket of read-only bind `i`'s virtiofsd.
    pub fn ro_sock(&self, i: usize) -> PathBuf {
        self.dir.join(format!("ro{i}.sock"))
    }
    /// The host end of the agent's virtio-serial port.
    pub fn agent(&self) -> PathBuf {
        self.dir.join(AGENT_PORT.0)
    }
    /// qemu's monitor (QMP), for the keeper's `stop` / `cont` ([`super::qmp`]).
    pub fn qmp(&self) -> PathBuf {
        self.dir.join("qmp.sock")
    }
}

/// `virtiofsd` sharing `workspace` (in its own mount, pid and network namespaces with
/// the workspace as its root, so it reaches nothing else of the host; no caching in the
/// guest so the host sees every write at once; no `--tag`: qemu 7.1–8.0 crash on it).
pub fn virtiofsd_args(files: &RunFiles, workspace: &Path) -> Vec<OsString> {
    share_args(&files.fs_sock(), workspace, false)
}

/// `virtiofsd` serving read-only bind `i` (`--readonly`), its source attached at
/// `dir`.
pub fn ro_virtiofsd_args(files: &RunFiles, i: usize, dir: &Path) -> Vec<OsString> {
    share_args(&files.ro_sock(i), dir, true)
}

/// The virtio-fs tag of read-only bind `i`.
pub fn ro_tag(i: usize) -> String {
    format!("ro{i}")
}

fn share_args(sock_path: &Path, dir: &Path, readonly: bool) -> Vec<OsString> {
    let mut shared = OsString::from("--shared-dir=");
    shared.push(dir);
    let mut sock = OsString::from("--socket-path=");
    sock.push(sock_path);
    let mut a = vec![
        sock,
        shared,
        "--sandbox=namespace".into(),
        "--cache=never".into(),
        "--inode-file-handles=never".into(),
        "--announce-submounts".into(),
        "--log-level=error".into(),
    ];
    if readonly {
        a.push("--readonly".into());
    }
    a
}

/// A guest's network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuestNet {
    /// No interface at all (`--net none`).
    None,
    /// Only `lo` (`--net loopback`).
    Loopback,
    /// `lo`, and `eth0` on qemu's user network with `restrict=on` (the guest reaches
    /// nothing outside), each (host port, guest port) forwarded from 127.0.0.1 of the
    /// host (`--publish`).
    Published(Vec<(u16, u16)>),
}

/// What the guest is given.
#[derive(Debug, Clone)]
pub struct Machine<'a> {
    /// The accelerator.
    pub accel: Accel,
    /// Guest RAM in MiB.
    pub memory_mib: u64,
    /// Virtual CPUs.
    pub cpus: u32,
    /// Kernel image.
    pub kernel: &'a Path,
    /// Initramfs.
    pub initrd: &'a Path,
    /// The guest's network.
    pub net: GuestNet,
    /// Read-only binds (one more virtio-fs device each, tag [`ro_tag`]).
    pub ro_binds: usize,
    /// The guest's TSC frequency, given to the kernel under TCG (`tsc_early_khz=`): its
    /// own calibration against the emulated PIT is timed, fails on a loaded host, and
    /// the boot then hangs.
    pub tsc_khz: Option<u64>,
    /// `--pids`: the guest's limit on the sandbox's processes (`cowspace.pids=N`).
    pub pids: Option<u64>,
    /// The guest's name (`-name`): the host path of the run directory, so that the
    /// host's process list says whose qemu it is (qemu's own paths are its root's).
    pub label: &'a Path,
}

/// `qemu-system-x86_64` for `m`, its devices wired to `files`.
pub fn qemu_args(m: &Machine<'_>, files: &RunFiles) -> Vec<OsString> {
    let mut a: Vec<OsString> = Vec::new();
    let mut push = |s: String| a.push(s.into());
    // ACPI on: the Debian kernel finds virtio-mmio devices only through the DSDT.
    push("-M".into());
    push("microvm,acpi=on,isa-serial=on,x-option-roms=off,rtc=on,memory-backend=mem".into());
    match m.accel {
        Accel::Kvm => {
            push("-accel".into());
            push("kvm".into());
            push("-cpu".into());
            push("host".into());
        }
        Accel::Tcg => {
            push("-accel".into());
            push(format!("tcg,thread=multi,tb-size={TCG_TB_MIB}"));
            push("-cpu".into());
            push("max".into());
        }
    }
    push("-smp".into());
    push(m.cpus.to_string());
    push("-m".into());
    push(format!("{}M", m.memory_mib));
    push("-object".into());
    push(format!(
        "memory-backend-memfd,id=mem,size={}M,share=on",
        m.memory_mib
    ));
    push("-name".into());
    // A comma ends an option's value unless doubled.
    push(m.label.to_string_lossy().replace(',', ",,"));
    for s in [
        "-nodefaults",
        "-no-user-config",
        "-nographic",
        "-no-reboot",
        "-sandbox",
        "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
    ] {
        push(s.into());
    }
    let mut append = String::from("console=ttyS0 quiet reboot=t panic=-1 rdinit=/init");
    match &m.net {
        GuestNet::None | GuestNet::Loopback => {
            push("-nic".into());
            push("none".into());
            if m.net == GuestNet::Loopback {
                append.push_str(" cowspace.net=loopback");
            }
        }
        GuestNet::Published(fwd) => {
            let mut n = String::from("user,id=n0,restrict=on");
            for (host, guest) in fwd {
                n.push_str(&format!(
                    ",hostfwd=tcp:127.0.0.1:{host}-{GUEST_ADDR}:{guest}"
                ));
            }
            push("-netdev".into());
            push(n);
            push("-device".into());
            push("virtio-net-device,netdev=n0".into());
            append.push_str(" cowspace.net=user");
        }
    }
    if let Some(n) = m.pids {
        append.push_str(&format!(" cowspace.pids={n}"));
    }
    if let (Accel::Tcg, Some(khz)) = (m.accel, m.tsc_khz) {
        append.push_str(&format!(" tsc_early_khz={khz}"));
    }
    a.push("-kernel".into());
    a.push(m.kernel.as_os_str().to_owned());
    a.push("-initrd".into());
    a.push(m.initrd.as_os_str().to_owned());
    a.push("-append".into());
    a.push(append.into());
    a.push("-serial".into());
    a.push(path_opt("file:", &files.console()));
    a.push("-chardev".into());
    a.push(path_opt("socket,id=fs0,path=", &files.fs_sock()));
    a.push("-device".into());
    a.push(format!("vhost-user-fs-device,chardev=fs0,tag={FS_TAG},queue-size=1024").into());
    for i in 0..m.ro_binds {
        a.push("-chardev".into());
        a.push(path_opt(
            &format!("socket,id=ro{i},path="),
            &files.ro_sock(i),
        ));
        a.push("-device".into());
        a.push(
            format!(
                "vhost-user-fs-device,chardev=ro{i},tag={},queue-size=1024",
                ro_tag(i)
            )
            .into(),
        );
    }
    a.push("-device".into());
    a.push("virtio-serial-device,max_ports=2".into());
    a.push("-chardev".into());
    a.push(path_opt(
        "socket,id=agent,server=on,wait=off,path=",
        &files.agent(),
    ));
    a.push("-device".into());
    a.push(format!("virtserialport,chardev=agent,name={}", AGENT_PORT.1).into());
    // The monitor, in the run directory only root and qemu's uid reach.
    a.push("-qmp".into());
    let mut qmp = path_opt("unix:", &files.qmp());
    qmp.push(",server=on,wait=off");
    a.push(qmp);
    a
}

fn path_opt(prefix: &str, p: &Path) -> OsString {
    let mut s = OsString::from(prefix);
    s.push(p);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcg_line_caps_the_translation_cache_and_sandboxes_qemu() {
        let files = RunFiles {
            dir: "/run/x".into(),
        };
        let m = Machine {
            accel: Accel::Tcg,
            memory_mib: 256,
            cpus: 1,
            kernel: Path::new("/k"),
            initrd: Path::new("/i"),
            net: GuestNet::None,
            ro_binds: 0,
            tsc_khz: Some(2_600_000),
            pids: None,
            label: Path::new("/var/lib/x,y/run"),
        };
        let line: Vec<String> = qemu_args(&m, &files)
            .into_iter()
            .map(|s| s.into_string().unwrap())
            .collect();
        let joined = line.join(" ");
        assert!(joined.contains(&format!("tb-size={TCG_TB_MIB}")));
        assert!(joined.contains("-sandbox on,"));
        assert!(joined.contains("size=256M,share=on"));
        assert!(joined.contains("-nic none"));
        assert!(!joined.contains("cowspace.net=loopback"));
        assert!(joined.contains("tsc_early_khz=2600000"));
        assert!(!joined.contains("cowspace.pids"));
        assert!(joined.contains("-name /var/lib/x,,y/run "), "{joined}");
        assert!(joined.contains("name=cowspace.agent"));
        assert!(
            joined.contains("-qmp unix:/run/x/qmp.sock,server=on,wait=off"),
            "{joined}"
        );
        let published = Machine {
            net: GuestNet::Published(vec![(20001, 3000)]),
            ..m.clone()
        };
        let joined: String = qemu_args(&published, &files)
            .into_iter()
            .map(|s| s.into_string().unwrap() + " ")
            .collect();
        assert!(
            joined.contains(
                "-netdev user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:20001-10.0.2.15:3000 "
            ),
            "{joined}"
        );
        assert!(!joined.contains("-nic none"));
        assert!(joined.contains("cowspace.net=user"));
        let limited = Machine {
            pids: Some(32),
            ..m.clone()
        };
        let joined: String = qemu_args(&limited, &files)
            .into_iter()
            .map(|s| s.into_string().unwrap() + " ")
            .collect();
        assert!(joined.contains(" cowspace.pids=32 "), "{joined}");
        assert!(
            !virtiofsd_args(&files, Path::new("/w"))
                .iter()
                .any(|a| a.to_str().unwrap().starts_with("--tag"))
        );
    }
}
