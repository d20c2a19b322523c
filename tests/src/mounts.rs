//! The mount table, unmounting, the daemons of a root, and filesystems on loop files: what
//! every root-only test needs to leave nothing behind.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// How long [`unmount`] retries a busy mount before detaching it lazily.
const UNMOUNT_WAIT_MS: u64 = 5_000;
/// The size of a loop filesystem's image. Sparse: the host pays only for what is written
/// (the 64 MiB workload with its commits and checkouts stays far below it).
const LOOP_IMAGE_BYTES: u64 = 2 << 30;

/// Mount points at or under `dir` (from `/proc/self/mountinfo`, as given or canonical),
/// deepest first.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let canon = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let mut v: Vec<PathBuf> = cowspace::mounts::mounts()
        .unwrap_or_default()
        .into_iter()
        .map(|m| m.target)
        .filter(|t| t.starts_with(dir) || t.starts_with(&canon))
        .collect();
    v.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    v.dedup();
    v
}

/// Unmounts `target`, retrying while it is busy (a daemon that was just told to stop may
/// still be exiting), then detaches it lazily.
pub fn unmount(target: &Path) {
    let deadline = Instant::now() + Duration::from_millis(UNMOUNT_WAIT_MS);
    loop {
        let ok = Command::new("umount")
            .arg(target)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok || !mounts_under(target).contains(&target.to_path_buf()) {
            return;
        }
        if Instant::now() > deadline {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(target)
                .stderr(Stdio::null())
                .status();
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Pids of running `fsd` processes whose command line names `--root ROOT` (as given or
/// canonical).
pub fn fsd_pids_of(root: &Path) -> Vec<u32> {
    let canon = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
    let mut pids = Vec::new();
    let Ok(rd) = fs::read_dir("/proc") else {
        return pids;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(cmd) = fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
        let is_fsd = args.first().is_some_and(|a0| {
            Path::new(OsStr::new(std::str::from_utf8(a0).unwrap_or(""))).file_name()
                == Some(OsStr::new("fsd"))
        });
        let names_root = args.windows(2).any(|w| {
            let p = Path::new(std::str::from_utf8(w[1]).unwrap_or(""));
            w[0] == b"--root" && (p == root || p == canon)
        });
        if is_fsd && names_root {
            pids.push(pid);
        }
    }
    pids
}

/// Runs `program args` and gives its trimmed stdout, or what failed (with its stderr).
pub fn run_checked(program: &str, args: &[&OsStr]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{program} {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// A filesystem the tests make on a loop file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LoopKind {
    /// btrfs (subvolumes; also reflinks).
    Btrfs,
    /// xfs with `reflink=1`.
    Xfs,
}

impl LoopKind {
    /// `btrfs` or `xfs`.
    pub fn name(self) -> &'static str {
        match self {
            LoopKind::Btrfs => "btrfs",
            LoopKind::Xfs => "xfs",
        }
    }

    fn mkfs(self) -> (&'static str, &'static [&'static str]) {
        match self {
            LoopKind::Btrfs => ("mkfs.btrfs", &["-q"]),
            LoopKind::Xfs => ("mkfs.xfs", &["-q", "-m", "reflink=1"]),
        }
    }
}

/// A btrfs or xfs (reflink=1) filesystem on a sparse loop file in its own temporary
/// directory, mounted at [`LoopFs::mnt`] (mode 0755, so dummy users reach it). Dropping it
/// (also while a test panics) unmounts everything under it (lazily when still busy),
/// detaches the loop device and deletes the image.
///
/// Making one takes about a tenth of a second, so each test makes its own: nothing is
/// shared between tests, and nothing outlives the test that made it.
#[derive(Debug)]
pub struct LoopFs {
    kind: LoopKind,
    mnt: PathBuf,
    mounted: bool,
    dev: Option<String>,
    /// Last: the image goes after the device is detached.
    dir: TempDir,
}

impl LoopFs {
    /// Makes and mounts a `kind` filesystem in a fresh directory under the system's
    /// temporary directory.
    pub fn new(kind: LoopKind) -> Result<LoopFs, String> {
        LoopFs::new_in(&std::env::temp_dir(), kind)
    }

    /// Makes and mounts a `kind` filesystem in a fresh directory under `parent`.
    pub fn new_in(parent: &Path, kind: LoopKind) -> Result<LoopFs, String> {
        let (mkfs, mkfs_args) = kind.mkfs();
        if Command::new(mkfs).arg("-V").output().is_err() {
            return Err(format!(
                "{mkfs} is not installed (scripts/setup.sh installs it)"
            ));
        }
        let dir = tempfile::Builder::new()
            .prefix(&format!("cowspace-{}-", kind.name()))
            .tempdir_in(parent)
            .map_err(|e| format!("a temporary directory in {}: {e}", parent.display()))?;
        let mnt = dir.path().join("mnt");
        let image = dir.path().join("image");
        let mut me = LoopFs {
            kind,
            mnt: mnt.clone(),
            mounted: false,
            dev: None,
            dir,
        };
        for d in [me.dir.path(), &mnt] {
            fs::create_dir_all(d)
                .and_then(|()| fs::set_permissions(d, fs::Permissions::from_mode(0o755)))
                .map_err(|e| format!("mkdir {}: {e}", d.display()))?;
        }
        fs::File::create(&image)
            .and_then(|f| f.set_len(LOOP_IMAGE_BYTES))
            .map_err(|e| format!("create {}: {e}", image.display()))?;
        let mut args: Vec<&OsStr> = mkfs_args.iter().map(OsStr::new).collect();
        args.push(image.as_os_str());
        run_checked(mkfs, &args)?;
        let dev = run_checked(
            "losetup",
            &[OsStr::new("-f"), OsStr::new("--show"), image.as_os_str()],
        )?;
        me.dev = Some(dev.clone());
        run_checked("mount", &[OsStr::new(&dev), mnt.as_os_str()])?;
        me.mounted = true;
        fs::set_permissions(&mnt, fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("chmod {}: {e}", mnt.display()))?;
        Ok(me)
    }

    /// Where the filesystem is mounted.
    pub fn mnt(&self) -> &Path {
        &self.mnt
    }

    /// What it is.
    pub fn kind(&self) -> LoopKind {
        self.kind
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        if self.mounted {
            for m in mounts_under(&self.mnt) {
                unmount(&m);
            }
        }
        if let Some(dev) = self.dev.take() {
            // A lazily detached filesystem keeps the device until it is released;
            // `losetup -d` then marks it to be freed at that moment.
            let _ = Command::new("losetup")
                .args(["-d", &dev])
                .stderr(Stdio::null())
                .status();
        }
    }
}
