//! A real Linux NFS client: a qemu guest (the kernel `run --vm` uses, which has
//! `nfsv3.ko`; this host's kernel has no NFS client) mounts a workspace the daemon's
//! NFS server exports on 127.0.0.1, through qemu's user network (the host's loopback is
//! the guest's 10.0.2.2), and works in it: reads, a 100,000-name listing, a hard link,
//! a directory rename, a write and a removal. The host then finds each change in the
//! workspace's private layer. Root with qemu and the guest kernel; skipped otherwise,
//! except under `CI=true`.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cowspace_fsd::cow::CowNfs;
use sandbox_helper::vm::initramfs::Cpio;
use sandbox_helper::vm::probe;

use crate::common::Env;

const MANY: usize = 100_000;

/// pjdfstest's passed count over NFS recorded in docs/CONFORMANCE.md.
const NFS_PJDFSTEST_PASSED: u64 = 328;

/// The guest kernel's modules an NFSv3 mount over virtio-net needs, in load order.
const MODULES: [&str; 14] = [
    "drivers/virtio/virtio_ring.ko",
    "drivers/virtio/virtio.ko",
    "drivers/virtio/virtio_mmio.ko",
    "net/core/failover.ko",
    "drivers/net/net_failover.ko",
    "drivers/net/virtio_net.ko",
    "net/sunrpc/sunrpc.ko",
    "fs/nfs_common/grace.ko",
    "fs/lockd/lockd.ko",
    "fs/nfs_common/nfs_acl.ko",
    "fs/netfs/netfs.ko",
    "fs/fscache/fscache.ko",
    "fs/nfs/nfs.ko",
    "fs/nfs/nfsv3.ko",
];

/// The guest's `/init`: network, the NFS mount of the export, `work` in it (its lines
/// `say`ing results on the console), the unmount.
fn init_script(port: u16, export: &str, work: &str) -> String {
    format!(
        r#"#!/bin/busybox sh
/bin/busybox mount -t proc proc /proc
/bin/busybox --install -s /bin
export PATH=/bin
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
say() {{ echo "NFSVM $*" > /dev/ttyS0; }}
say booted
for m in {modules}; do insmod /lib/modules/$m || say "FAIL insmod $m"; done
tries=0
until [ -e /sys/class/net/eth0 ]; do
  tries=$((tries + 1))
  [ $tries -gt 400 ] && {{ say "FAIL no eth0"; poweroff -f; }}
  sleep 0.05
done
say network
ip link set lo up
ip addr add 10.0.2.15/24 dev eth0
ip link set eth0 up
mkdir -p /mnt
if mount -t nfs -o vers=3,proto=tcp,port={port},mountport={port},mountproto=tcp,nolock,soft,timeo=600,retrans=2,addr=10.0.2.2,mountaddr=10.0.2.2 10.0.2.2:{export} /mnt; then
  say mounted
{work}
  cd /
  umount /mnt && say unmounted
else
  say "FAIL mount"
fi
say done
poweroff -f
"#,
        modules = MODULES
            .iter()
            .map(|m| m.rsplit('/').next().unwrap())
            .collect::<Vec<_>>()
            .join(" "),
    )
}

/// The work of the first test: reads, a large listing, a link, a rename, a write, a
/// removal, then reads while the host restarts the server.
const WORK: &str = r#"  cd /mnt
  say "read $(cat a)"
  say "many $(ls many | wc -l)"
  ln a a2 && say "links $(stat -c %h a) $(stat -c %i a) $(stat -c %i a2)"
  mv d d2 && say "renamed $(cat d2/b)"
  echo written > new && say "wrote $(cat new)"
  rm many/f000000 && say "removed $(ls many | wc -l)"
  dd if=/dev/zero of=big bs=1M count=16 2>/dev/null && sync && say "big $(stat -c %s big)"
  say reading
  ok=0; failed=0; i=0
  while [ $i -lt 30 ]; do
    echo 3 > /proc/sys/vm/drop_caches
    if cat big > /dev/null 2>/dev/null; then ok=$((ok + 1)); last=ok; else failed=$((failed + 1)); last=failed; fi
    i=$((i + 1))
    sleep 0.2
  done
  say "reads ok=$ok failed=$failed last=$last"
  say "after $(cat a)""#;

/// The guest's initramfs: busybox, `script` as `/init`, the modules, and `extra` files
/// (path, mode, bytes; their directories are made).
fn initramfs(
    dir: &Path,
    kernel: &probe::Kernel,
    script: &str,
    extra: &[(String, u32, Vec<u8>)],
) -> std::path::PathBuf {
    let mut a = Cpio::default();
    for d in [
        "bin",
        "dev",
        "proc",
        "sys",
        "lib",
        "lib/modules",
        "mnt",
        "tmp",
    ] {
        a.dir(d);
    }
    a.char_dev("dev/console", 0o600, 5, 1);
    let busybox = fs::read(probe::busybox().expect("busybox")).unwrap();
    a.file("bin/busybox", 0o755, &busybox);
    a.file("init", 0o755, script.as_bytes());
    for m in MODULES {
        let name = m.rsplit('/').next().unwrap();
        let bytes = fs::read(kernel.modules.join(m))
            .unwrap_or_else(|e| panic!("the guest kernel's {m}: {e}"));
        a.file(&format!("lib/modules/{name}"), 0o644, &bytes);
    }
    let mut made = std::collections::BTreeSet::new();
    for (path, mode, bytes) in extra {
        let mut at = String::new();
        for part in path.split('/').collect::<Vec<_>>().split_last().unwrap().1 {
            at = if at.is_empty() {
                part.to_string()
            } else {
                format!("{at}/{part}")
            };
            if made.insert(at.clone()) && !["bin", "lib", "tmp", "mnt"].contains(&at.as_str()) {
                a.dir(&at);
            }
        }
        a.file(path, *mode, bytes);
    }
    let p = dir.join("initrd.cpio");
    fs::write(&p, a.finish()).unwrap();
    p
}

/// Kills the guest on drop, whatever happened.
struct Guest(std::process::Child);

impl Drop for Guest {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The guest kernel and qemu; `None` (the test skipped) where they or root are missing,
/// never under `CI=true`.
fn guest_tools() -> Option<(probe::Kernel, std::path::PathBuf)> {
    match (probe::kernel(), probe::qemu()) {
        (Ok(k), Ok(q)) if nix::unistd::geteuid().is_root() => Some((k, q)),
        (k, q) => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CI=true: this test must run (root, qemu, the guest kernel): {k:?} {q:?}"
            );
            eprintln!("skipped: needs root, qemu and the guest kernel");
            None
        }
    }
}

/// Boots `initrd` with `kernel` under `qemu`, its console written to `console`, with
/// qemu's user network (the host's loopback at 10.0.2.2).
fn boot(qemu: &Path, kernel: &probe::Kernel, initrd: &Path, console: &Path) -> Guest {
    let mut append = String::from("console=ttyS0 panic=-1 rdinit=/init");
    let accel = match probe::accel().accel {
        probe::Accel::Kvm => "kvm",
        probe::Accel::Tcg => {
            // Under emulation the guest cannot calibrate its clock: it is told the host's.
            if let Some(khz) = probe::host_tsc_khz() {
                append.push_str(&format!(" tsc_early_khz={khz}"));
            }
            "tcg,thread=multi"
        }
    };
    Guest(
        Command::new(qemu)
            .args([
                "-M",
                "microvm,acpi=on,isa-serial=on,x-option-roms=off,rtc=on",
            ])
            .args(["-accel", accel, "-cpu", "max", "-smp", "2", "-m", "512M"])
            .args(["-nodefaults", "-no-user-config", "-nographic", "-no-reboot"])
            .args([
                "-netdev",
                "user,id=n0",
                "-device",
                "virtio-net-device,netdev=n0",
            ])
            .arg("-kernel")
            .arg(&kernel.image)
            .arg("-initrd")
            .arg(initrd)
            .arg("-append")
            .arg(&append)
            .arg("-serial")
            .arg(format!("file:{}", console.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start qemu"),
    )
}

/// Waits for the guest to power off (`tick` called between looks at its console).
fn wait(guest: &mut Guest, console: &Path, limit: Duration, mut tick: impl FnMut(&str)) -> String {
    let deadline = Instant::now() + limit;
    loop {
        tick(&fs::read_to_string(console).unwrap_or_default());
        if let Some(status) = guest.0.try_wait().unwrap() {
            eprintln!("guest exited: {status}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the guest did not finish; its console:\n{}",
            fs::read_to_string(console).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    fs::read_to_string(console).unwrap_or_default()
}

/// What the guest `say`s, line by line.
fn said(log: &str) -> Vec<&str> {
    log.lines()
        .filter_map(|l| l.trim().strip_prefix("NFSVM "))
        .collect()
}

#[test]
fn a_linux_guest_mounts_a_workspace_over_nfs_and_its_changes_reach_the_host() {
    let ci = std::env::var("CI").as_deref() == Ok("true");
    let Some((kernel, qemu)) = guest_tools() else {
        return;
    };
    let env = Env::new("nfs-vm");
    let src = env.dir("src");
    fs::write(src.join("a"), b"hello").unwrap();
    fs::create_dir_all(src.join("d")).unwrap();
    fs::write(src.join("d/b"), b"bee").unwrap();
    fs::create_dir_all(src.join("many")).unwrap();
    for i in 0..MANY {
        fs::write(src.join(format!("many/f{i:06}")), b"").unwrap();
    }
    let snap = env.import(&src);
    let private = env.dir("private");
    let served = CowNfs::serve(Arc::clone(&env.store), snap, &private, 0).unwrap();
    let run = env.dir("run");
    let script = init_script(served.addr().port(), served.export_path(), WORK);
    let initrd = initramfs(&run, &kernel, &script, &[]);
    let console = run.join("console.log");
    let mut guest = boot(&qemu, &kernel, &initrd, &console);
    let mut served = Some(served);
    let mut restarted = false;
    let limit = Duration::from_secs(if ci { 900 } else { 600 });
    let log = wait(&mut guest, &console, limit, |text| {
        // The daemon stops and serves the workspace again while the guest reads.
        if !restarted && text.contains("NFSVM reading") {
            std::thread::sleep(Duration::from_millis(1500));
            drop(served.take());
            std::thread::sleep(Duration::from_millis(300));
            served = Some(CowNfs::serve(Arc::clone(&env.store), snap, &private, 0).unwrap());
            restarted = true;
        }
    });
    let said = said(&log);
    eprintln!("the guest said:\n{}", said.join("\n"));
    let has = |want: &str| said.iter().any(|l| l.starts_with(want));
    assert!(has("mounted"), "the guest did not mount the export:\n{log}");
    assert!(!said.iter().any(|l| l.starts_with("FAIL")), "{log}");
    assert!(has("read hello"), "{log}");
    assert!(has(&format!("many {MANY}")), "{log}");
    let links = said.iter().find(|l| l.starts_with("links ")).expect(&log);
    let f: Vec<&str> = links.split(' ').collect();
    assert_eq!(f[1], "2", "a and a2: {links}");
    assert_eq!(f[2], f[3], "a and a2 are one inode: {links}");
    assert!(has("renamed bee"), "{log}");
    assert!(has("wrote written"), "{log}");
    assert!(has(&format!("removed {}", MANY - 1)), "{log}");
    assert!(has("unmounted"), "{log}");
    assert!(
        restarted,
        "the guest never read while the daemon restarted: {log}"
    );
    // Reads across the restart resumed or failed with an error, never hung; the last
    // ones, after it, read.
    let reads = said.iter().find(|l| l.starts_with("reads ")).expect(&log);
    assert!(reads.ends_with("last=ok"), "{reads}");
    assert!(
        has("after hello"),
        "the mount works after the restart: {log}"
    );
    let served = served.expect("served again");

    // Every change is in the workspace's private layer, as a fuse workspace keeps it.
    served.finish_copies().unwrap();
    let upper = private.join("upper");
    assert_eq!(fs::read(upper.join("new")).unwrap(), b"written\n");
    assert_eq!(fs::read(upper.join("d2/b")).unwrap(), b"bee");
    let (a, a2) = (
        fs::metadata(upper.join("a")).unwrap(),
        fs::metadata(upper.join("a2")).unwrap(),
    );
    assert_eq!(a.ino(), a2.ino(), "a2 is a hard link of a in the upper");
    drop(guest);
}

/// pjdfstest in a Linux guest on a workspace mounted over NFS: the conformance gate of
/// the NFS server (`docs/CONFORMANCE.md`; kernel NFS's own semantics are the baseline:
/// NFSv3 has no `fallocate`, so that feature is not asked for).
#[test]
fn pjdfstest_in_a_linux_guest_over_nfs_passes_its_baseline() {
    let ci = std::env::var("CI").as_deref() == Ok("true");
    let Some((kernel, qemu)) = guest_tools() else {
        return;
    };
    let pjdfstest = std::env::var_os("PJDFSTEST")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            let home = std::env::var_os("CARGO_HOME")
                .map(std::path::PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")))?;
            Some(home.join("bin/pjdfstest")).filter(|p| p.exists())
        });
    let Some(pjdfstest) = pjdfstest else {
        assert!(
            !ci,
            "CI=true: pjdfstest must be installed (scripts/setup.sh)"
        );
        eprintln!("skipped: pjdfstest not installed");
        return;
    };
    let env = Env::new("nfs-pjd");
    let src = env.dir("src");
    fs::write(src.join("README"), b"pjdfstest runs in pjd/\n").unwrap();
    let snap = env.import(&src);
    let private = env.dir("private");
    let served = CowNfs::serve(Arc::clone(&env.store), snap, &private, 0).unwrap();
    let config =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/pjdfstest.toml"))
            .unwrap()
            .replace("posix_fallocate = {}", "");
    let lib = |p: &str| {
        (
            p.trim_start_matches('/').to_string(),
            0o755,
            fs::read(p).unwrap_or_else(|e| panic!("{p}: {e}")),
        )
    };
    let extra = vec![
        ("bin/pjdfstest".to_string(), 0o755, fs::read(&pjdfstest).unwrap()),
        lib("/lib64/ld-linux-x86-64.so.2"),
        lib("/lib/x86_64-linux-gnu/libc.so.6"),
        lib("/lib/x86_64-linux-gnu/libgcc_s.so.1"),
        (
            "etc/passwd".to_string(),
            0o644,
            b"root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\ntests:x:1000:1000:tests:/:/bin/sh\n".to_vec(),
        ),
        (
            "etc/group".to_string(),
            0o644,
            b"root:x:0:\nnogroup:x:65534:\ntests:x:1000:\n".to_vec(),
        ),
        ("etc/pjdfstest.toml".to_string(), 0o644, config.into_bytes()),
    ];
    let work = r#"  mkdir /mnt/pjd && cd /mnt/pjd
  LD_LIBRARY_PATH=/lib/x86_64-linux-gnu /bin/pjdfstest -c /etc/pjdfstest.toml -p /mnt/pjd > /tmp/pjd.out 2>&1
  say "pjdfstest exit $?"
  sed 's/\x1b\[[0-9;]*m//g' /tmp/pjd.out | grep -a -E 'Summary|FAILED|failed' | while read -r l; do say "pjd $l"; done
  cd /"#;
    let run = env.dir("run");
    let script = init_script(served.addr().port(), served.export_path(), work);
    let initrd = initramfs(&run, &kernel, &script, &extra);
    let console = run.join("console.log");
    let mut guest = boot(&qemu, &kernel, &initrd, &console);
    let log = wait(
        &mut guest,
        &console,
        Duration::from_secs(if ci { 1500 } else { 1200 }),
        |_| {},
    );
    let said = said(&log);
    eprintln!("the guest said:\n{}", said.join("\n"));
    assert!(said.contains(&"mounted"), "{log}");
    let summary = said
        .iter()
        .find_map(|l| l.strip_prefix("pjd Summary: "))
        .unwrap_or_else(|| panic!("pjdfstest gave no summary:\n{log}"));
    let count = |what: &str| -> u64 {
        summary
            .split(',')
            .find_map(|p| {
                p.trim()
                    .strip_suffix(what)
                    .map(|n| n.trim().parse().unwrap())
            })
            .unwrap_or_else(|| panic!("no {what} in {summary:?}"))
    };
    let (passed, failed, skipped) = (count("passed"), count("failed"), count("skipped"));
    eprintln!("pjdfstest over NFS: {passed} passed, {failed} failed, {skipped} skipped");
    assert!(passed + failed > 300, "pjdfstest ran its tests: {summary}");
    // The counts docs/CONFORMANCE.md records for nfs: fewer passed is a regression.
    assert!(
        passed >= NFS_PJDFSTEST_PASSED,
        "pjdfstest over NFS passed {passed}, the baseline {NFS_PJDFSTEST_PASSED}: {summary}"
    );
    drop(guest);
    drop(served);
}
