//! Cgroup limits of a sandbox: memory, pids, cpu and cpuset, and its freezer (for
//! `sandbox pause`), one [`Controller`] per file.
//!
//! Each controller is used from cgroup v2 when the unified hierarchy offers it (listed in
//! its `cgroup.controllers`), else from its cgroup v1 hierarchy (`ROOT/<controller>`).
//! On this project's reference host v2 has no usable controllers, so all three are v1.
//! Every limit is read back after it is written. A missing controller is refused as
//! unsupported before anything is created.
//!
//! A [`Group`] is one directory per controller, `.../cowspace/<name>.<helper pid>`. It
//! always includes `pids` (so every process of the sandbox is accounted for and can be
//! killed); `memory` and `cpu` only when limited; `freezer` whenever the host has one
//! (it sets no limit and is not required: without it only pausing is refused).
//! Dropping a group thaws it, kills every process still in it and removes its
//! directories.

mod cpu;
pub mod cpuset;
pub mod freezer;
pub mod io;
mod memory;
mod pids;
#[cfg(test)]
mod testing;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::{AccessFlags, Pid, access};

use crate::error::{Error, Result};
pub use crate::stale::owner_is_gone;

/// Resource limits, each enforced by its cgroup controller.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Limits {
    /// Memory limit in bytes (`memory` controller).
    pub memory_bytes: Option<u64>,
    /// Most processes and threads at once (`pids` controller).
    pub pids: Option<u64>,
    /// CPU bandwidth in CPUs, e.g. 1.5 (`cpu` controller).
    pub cpus: Option<f64>,
    /// The CPUs its processes may run on, in the kernel's list format (`cpuset`).
    pub cpuset: Option<String>,
    /// Disk throughput limits (`io` / `blkio` controller).
    pub io_max: Option<io::IoMax>,
    /// Share of disk time, 1 to 10000 (`io` / `blkio` controller).
    pub io_weight: Option<u64>,
}

/// Default root of the cgroup mounts.
pub const DEFAULT_ROOT: &str = "/sys/fs/cgroup";
/// Environment variable overriding the cgroup root (tests point it at an empty dir).
pub const ROOT_ENV: &str = "COWSPACE_CGROUP_ROOT";
/// Subdirectory holding all sandbox groups in each hierarchy.
pub const PARENT_DIR: &str = "cowspace";
/// Rounds of "kill everything in the group" before giving up.
const MAX_KILL_ROUNDS: u32 = 500;
/// Pause between kill rounds and between `rmdir` retries.
const KILL_ROUND_PAUSE_MS: u64 = 10;

/// What a controller does to a sandbox's group: the files it writes, on v1 and on v2.
pub trait Controller: Sync {
    /// Writes the limit `limits` sets for this controller (nothing when it sets none)
    /// into the group directory `dir`, reading each value back.
    fn apply(&self, dir: &GroupDir<'_>, limits: &Limits) -> Result<()>;
}

/// One group directory of a sandbox, as a [`Controller`] sees it.
#[derive(Debug, Clone, Copy)]
pub struct GroupDir<'a> {
    /// The directory (`.../cowspace/<name>.<pid>`).
    pub path: &'a Path,
    /// The directory holding it (`.../cowspace`).
    pub parent: &'a Path,
    /// The version of its hierarchy.
    pub version: Version,
}

/// A cgroup controller the sandbox uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ControllerKind {
    /// Memory limit, OOM kill.
    Memory,
    /// Process count limit; also the group every sandbox is in.
    Pids,
    /// CPU bandwidth.
    Cpu,
    /// The CPUs the sandbox may run on.
    Cpuset,
    /// Pausing the sandbox (optional: see [`require`]).
    Freezer,
    /// Disk throughput and share (`io` on v2, `blkio` on v1).
    Io,
}

impl ControllerKind {
    /// All controllers, in probe order.
    pub const ALL: [ControllerKind; 6] = [
        ControllerKind::Memory,
        ControllerKind::Pids,
        ControllerKind::Cpu,
        ControllerKind::Cpuset,
        ControllerKind::Freezer,
        ControllerKind::Io,
    ];

    /// The kernel's name of the controller.
    pub fn name(self) -> &'static str {
        match self {
            ControllerKind::Memory => "memory",
            ControllerKind::Pids => "pids",
            ControllerKind::Cpu => "cpu",
            ControllerKind::Cpuset => "cpuset",
            ControllerKind::Freezer => "freezer",
            ControllerKind::Io => "io",
        }
    }

    /// The name of its v1 hierarchy (v1's `io` is `blkio`).
    fn v1_name(self) -> &'static str {
        match self {
            ControllerKind::Io => "blkio",
            other => other.name(),
        }
    }

    /// The controller's implementation.
    pub fn controller(self) -> &'static dyn Controller {
        match self {
            ControllerKind::Memory => &memory::Memory,
            ControllerKind::Pids => &pids::Pids,
            ControllerKind::Cpu => &cpu::Cpu,
            ControllerKind::Cpuset => &cpuset::Cpuset,
            ControllerKind::Freezer => &freezer::FreezerController,
            ControllerKind::Io => &io::Io,
        }
    }

    /// A file the root of a v1 hierarchy of this controller has (the v1 `pids` root has
    /// no `pids.*` file, only the generic ones).
    fn v1_marker(self) -> &'static str {
        match self {
            ControllerKind::Memory => "memory.limit_in_bytes",
            ControllerKind::Pids => "cgroup.procs",
            ControllerKind::Cpu => "cpu.cfs_quota_us",
            ControllerKind::Cpuset => "cpuset.cpus",
            // The root of a v1 freezer hierarchy has no `freezer.*` file.
            ControllerKind::Freezer => "cgroup.procs",
            ControllerKind::Io => "blkio.throttle.read_bps_device",
        }
    }

    /// The control named in refusals.
    pub fn control(self) -> &'static str {
        match self {
            ControllerKind::Memory => "memory limit (cgroup memory controller)",
            ControllerKind::Pids => "process limit and accounting (cgroup pids controller)",
            ControllerKind::Cpu => "cpu limit (cgroup cpu controller)",
            ControllerKind::Cpuset => "cpu set (cgroup cpuset controller)",
            ControllerKind::Freezer => "pause and resume (cgroup freezer)",
            ControllerKind::Io => "I/O limit (cgroup io / blkio controller)",
        }
    }
}

/// Cgroup version a controller is used from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Version {
    /// Legacy per-controller hierarchy.
    V1,
    /// Unified hierarchy.
    V2,
}

/// Where a controller is available.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Placement {
    /// The controller.
    pub controller: ControllerKind,
    /// The version used.
    pub version: Version,
    /// The hierarchy's root directory.
    pub hierarchy: PathBuf,
}

/// The unified (v2) mount under `root`: `root` itself or `root/unified`.
fn v2_root(root: &Path) -> Option<PathBuf> {
    [root.to_path_buf(), root.join("unified")]
        .into_iter()
        .find(|p| p.join("cgroup.controllers").is_file())
}

/// Finds where `controller` can be used under `root`, or says why it cannot.
pub fn locate(root: &Path, controller: ControllerKind) -> std::result::Result<Placement, String> {
    let name = controller.name();
    let mut why = Vec::new();
    match v2_root(root) {
        // v2's freezer is `cgroup.freeze`, a core file of every non-root group, not a
        // listed controller; it is used where v2 is the only hierarchy (a hybrid host's
        // `unified` mount holds no sandbox's processes).
        Some(v2) if controller == ControllerKind::Freezer => {
            if v2 == root {
                return writable(Placement {
                    controller,
                    version: Version::V2,
                    hierarchy: v2,
                });
            }
            why.push(format!(
                "the cgroup v2 hierarchy at {} is a hybrid host's `unified` mount",
                v2.display()
            ));
        }
        Some(v2) => {
            let listed = fs::read_to_string(v2.join("cgroup.controllers")).unwrap_or_default();
            if listed.split_whitespace().any(|c| c == name) {
                return writable(Placement {
                    controller,
                    version: Version::V2,
                    hierarchy: v2,
                });
            }
            why.push(format!(
                "cgroup v2 at {} does not offer `{name}` (cgroup.controllers: {:?})",
                v2.display(),
                listed.trim()
            ));
        }
        None => why.push(format!("no cgroup v2 hierarchy under {}", root.display())),
    }
    let v1 = root.join(controller.v1_name());
    if v1.join(controller.v1_marker()).is_file() {
        return writable(Placement {
            controller,
            version: Version::V1,
            hierarchy: v1,
        });
    }
    why.push(format!(
        "no cgroup v1 `{name}` hierarchy at {}",
        v1.display()
    ));
    Err(why.join("; "))
}

fn writable(p: Placement) -> std::result::Result<Placement, String> {
    match access(&p.hierarchy, AccessFlags::W_OK) {
        Ok(()) => Ok(p),
        Err(e) => Err(format!("{} is not writable: {e}", p.hierarchy.display())),
    }
}

/// The controllers a sandbox with `limits` needs (always `pids`).
pub fn needed(limits: &Limits) -> Vec<ControllerKind> {
    let mut out = vec![ControllerKind::Pids];
    if limits.memory_bytes.is_some() {
        out.push(ControllerKind::Memory);
    }
    if limits.cpus.is_some() {
        out.push(ControllerKind::Cpu);
    }
    if limits.cpuset.is_some() {
        out.push(ControllerKind::Cpuset);
    }
    if limits.io_max.is_some() || limits.io_weight.is_some() {
        out.push(ControllerKind::Io);
    }
    out
}

/// Checks that every controller `limits` needs is usable; refuses as unsupported if not.
/// The freezer is added when the host has one (a sandbox starts without it: only its
/// pause is then refused, by [`freezer::Freezer::find`] finding none).
pub fn require(root: &Path, limits: &Limits) -> Result<Vec<Placement>> {
    let mut out = needed(limits)
        .into_iter()
        .map(|c| {
            locate(root, c).map_err(|reason| Error::Unsupported {
                control: c.control(),
                reason,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    // Located is not enough: the weight needs a scheduler that has one, the throttle a
    // disk.
    if let Some(p) = out.iter().find(|p| p.controller == ControllerKind::Io)
        && let Some(reason) = io::unenforceable(&p.hierarchy, p.version, limits)
    {
        return Err(Error::Unsupported {
            control: ControllerKind::Io.control(),
            reason,
        });
    }
    if let Ok(f) = locate(root, ControllerKind::Freezer) {
        out.push(f);
    }
    Ok(out)
}

/// The limits of a sandbox's groups as the kernel reports them now: `memory_bytes`,
/// `pids` and `cpu_quota_us`/`cpu_period_us` when set (`null` when unlimited).
pub fn read_back(dirs: &[PathBuf]) -> serde_json::Value {
    let get = |name: &str| {
        dirs.iter()
            .find_map(|d| fs::read_to_string(d.join(name)).ok())
            .map(|s| s.trim().to_string())
    };
    let num = |s: Option<String>| s.and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok());
    let memory = num(get("memory.limit_in_bytes")).or_else(|| num(get("memory.max")));
    // v1 reports "unlimited" as a huge page-aligned number.
    let memory = memory.filter(|m| *m < (1u64 << 62));
    let pids = num(get("pids.max"));
    let (quota, period) = match get("cpu.max") {
        Some(v2) => {
            let mut it = v2.split_whitespace();
            (
                it.next().and_then(|q| q.parse::<u64>().ok()),
                it.next().and_then(|p| p.parse::<u64>().ok()),
            )
        }
        None => (
            get("cpu.cfs_quota_us")
                .and_then(|q| q.parse::<i64>().ok())
                .filter(|q| *q > 0)
                .map(|q| q as u64),
            num(get("cpu.cfs_period_us")),
        ),
    };
    serde_json::json!({
        "memory_bytes": memory,
        "pids": pids,
        "cpu_quota_us": quota,
        "cpu_period_us": quota.and(period),
        "cpuset_cpus": get("cpuset.cpus").filter(|c| !c.is_empty()),
        "io_max": io::read_back(dirs),
    })
}

fn write(path: &Path, value: &str, step: &'static str) -> Result<()> {
    fs::write(path, value).map_err(|source| Error::Cgroup {
        step,
        path: path.to_path_buf(),
        source,
    })
}

fn read(path: &Path, step: &'static str) -> Result<String> {
    fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|source| Error::Cgroup {
            step,
            path: path.to_path_buf(),
            source,
        })
}

/// Writes `value` to `path`, reads it back and checks it with `expect`.
fn write_checked(path: &Path, value: &str, expect: &str) -> Result<()> {
    write(path, value, "write limit")?;
    let got = read(path, "read limit back")?;
    if got != expect {
        return Err(Error::CgroupReadBack {
            path: path.to_path_buf(),
            wanted: expect.into(),
            got,
        });
    }
    Ok(())
}

/// One sandbox's cgroups, one directory per controller.
#[derive(Debug)]
pub struct Group {
    dirs: Vec<(Placement, PathBuf)>,
}

impl Group {
    /// Creates the sandbox's groups in `placements` (from [`require`]) and sets `limits`.
    pub fn create(placements: &[Placement], name: &str, limits: &Limits) -> Result<Group> {
        let mut group = Group { dirs: Vec::new() };
        let leaf = format!("{name}.{}", std::process::id());
        for p in placements {
            let parent = p.hierarchy.join(PARENT_DIR);
            // v2's freezer is no controller to enable.
            let enable = p.version == Version::V2 && p.controller != ControllerKind::Freezer;
            if enable {
                enable_v2(&p.hierarchy, p.controller)?;
            }
            fs::create_dir_all(&parent).map_err(|source| Error::Cgroup {
                step: "create",
                path: parent.clone(),
                source,
            })?;
            if enable {
                enable_v2(&parent, p.controller)?;
            }
            if p.controller == ControllerKind::Cpuset && p.version == Version::V1 {
                cpuset::inherit(&parent, &p.hierarchy)?;
            }
            let dir = parent.join(&leaf);
            // On v2 every controller shares the one group directory.
            if !group.dirs.iter().any(|(_, d)| *d == dir) {
                fs::create_dir(&dir).map_err(|source| Error::Cgroup {
                    step: "create",
                    path: dir.clone(),
                    source,
                })?;
            }
            group.dirs.push((p.clone(), dir.clone()));
            let at = GroupDir {
                path: &dir,
                parent: &parent,
                version: p.version,
            };
            p.controller.controller().apply(&at, limits)?;
        }
        Ok(group)
    }

    /// The group's directories (one per hierarchy).
    pub fn dirs(&self) -> Vec<&Path> {
        let mut out: Vec<&Path> = Vec::new();
        for (_, d) in &self.dirs {
            if !out.contains(&d.as_path()) {
                out.push(d);
            }
        }
        out
    }

    /// The `tasks` files of the group's v1 directories, opened for writing by this (root)
    /// process, for the sandbox's init to write `0` into: a single-threaded process that
    /// moves itself that way is moved without the kernel's thread-group lock, whose
    /// first taking waits for an RCU grace period (7-10 ms measured here for
    /// `cgroup.procs`, against 0.3 ms). The kernel checks the permission against the
    /// opener's credentials, so init needs no write access of its own.
    pub fn self_joins(&self) -> Result<Vec<fs::File>> {
        self.dirs
            .iter()
            .filter(|(p, _)| p.version == Version::V1)
            .map(|(_, dir)| {
                let path = dir.join("tasks");
                fs::OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map_err(|source| Error::Cgroup {
                        step: "open for the sandbox to join",
                        path,
                        source,
                    })
            })
            .collect()
    }

    /// Moves process `pid` into every directory of the group that it does not join by
    /// itself (the v2 ones; see [`Group::self_joins`]).
    pub fn add(&self, pid: Pid) -> Result<()> {
        for (i, (p, dir)) in self.dirs.iter().enumerate() {
            if p.version == Version::V1 || self.dirs[..i].iter().any(|(_, d)| d == dir) {
                continue;
            }
            write(
                &dir.join("cgroup.procs"),
                &pid.to_string(),
                "move the sandbox into",
            )?;
        }
        Ok(())
    }

    /// How many processes of the group the kernel OOM-killed, when a memory group exists.
    pub fn oom_kills(&self) -> Option<u64> {
        self.dirs
            .iter()
            .find(|(p, _)| p.controller == ControllerKind::Memory)
            .and_then(|(p, dir)| memory::oom_kills(dir, p.version))
    }

    /// How many forks the kernel refused at the group's process limit, when a pids
    /// group exists.
    pub fn refused_forks(&self) -> Option<u64> {
        self.dirs
            .iter()
            .find(|(p, _)| p.controller == ControllerKind::Pids)
            .and_then(|(_, dir)| pids::refused_forks(dir))
    }

    /// The pids in the group now.
    pub fn pids(&self) -> Vec<Pid> {
        let mut out: Vec<Pid> = self
            .dirs
            .iter()
            .filter_map(|(_, d)| fs::read_to_string(d.join("cgroup.procs")).ok())
            .flat_map(|s| {
                s.lines()
                    .filter_map(|l| l.trim().parse().ok())
                    .collect::<Vec<i32>>()
            })
            .map(Pid::from_raw)
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Kills every process in the group (repeatedly, so forks racing the kill die too)
    /// and removes the directories. Returns the pids that would not die, if any.
    pub fn destroy(&mut self) -> Result<()> {
        // A frozen task does not die of SIGKILL until thawed.
        for (_, d) in &self.dirs {
            freezer::thaw_dir(d);
        }
        for _ in 0..MAX_KILL_ROUNDS {
            let pids = self.pids();
            if pids.is_empty() {
                break;
            }
            for pid in pids {
                let _ = kill(pid, Signal::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(KILL_ROUND_PAUSE_MS));
        }
        while let Some((_, dir)) = self.dirs.pop() {
            let mut last = None;
            for _ in 0..MAX_KILL_ROUNDS {
                match fs::remove_dir(&dir) {
                    Ok(()) => {
                        last = None;
                        break;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        last = None;
                        break;
                    }
                    Err(e) => last = Some(e),
                }
                std::thread::sleep(Duration::from_millis(KILL_ROUND_PAUSE_MS));
            }
            if let Some(source) = last {
                return Err(Error::Cgroup {
                    step: "remove",
                    path: dir,
                    source,
                });
            }
        }
        Ok(())
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if let Err(e) = self.destroy() {
            eprintln!("sandbox-helper: cleanup: {e}");
        }
    }
}

/// Kills and removes groups left by helpers that died without cleaning up (`SIGKILL`
/// of the helper: its sandbox died with it, its directories did not).
pub fn reap_stale(placements: &[Placement]) {
    for p in placements {
        let Ok(entries) = fs::read_dir(p.hierarchy.join(PARENT_DIR)) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if entry.path().is_dir() && owner_is_gone(&name) {
                let mut stale = Group {
                    dirs: vec![(p.clone(), entry.path())],
                };
                if let Err(e) = stale.destroy() {
                    eprintln!("sandbox-helper: removing a stale cgroup: {e}");
                }
            }
        }
    }
}

/// Enables `controller` for the children of the v2 group `dir`.
fn enable_v2(dir: &Path, controller: ControllerKind) -> Result<()> {
    let path = dir.join("cgroup.subtree_control");
    let on = read(&path, "read subtree_control")?;
    if on.split_whitespace().any(|c| c == controller.name()) {
        return Ok(());
    }
    write(
        &path,
        &format!("+{}", controller.name()),
        "enable controller in",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_controller_without_a_limit_writes_nothing() {
        for kind in ControllerKind::ALL {
            for version in [Version::V1, Version::V2] {
                let fx = testing::Fixture::new(version);
                kind.controller()
                    .apply(&fx.dir(), &Limits::default())
                    .unwrap();
                assert!(fx.files().is_empty(), "{kind:?} {version:?}");
            }
        }
    }

    #[test]
    fn an_empty_root_refuses_every_controller_with_a_reason() {
        let tmp = tempfile::tempdir().unwrap();
        for c in ControllerKind::ALL {
            let why = locate(tmp.path(), c).unwrap_err();
            assert!(why.contains("no cgroup v1"), "{why}");
        }
        let err = require(
            tmp.path(),
            &Limits {
                memory_bytes: Some(1 << 30),
                ..Limits::default()
            },
        )
        .unwrap_err();
        assert_eq!(err.kind(), crate::Kind::Unsupported);
        assert!(err.to_string().contains("pids"), "{err}");
    }

    /// The v2 file protocol against a directory laid out like a unified hierarchy (plain
    /// files stand in for the kernel's; the real v2 path is not available on this host).
    #[test]
    fn v2_group_writes_its_limits_and_enables_controllers() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        fs::write(root.join("cgroup.controllers"), "cpu cpuset memory pids\n").unwrap();
        fs::write(root.join("cgroup.subtree_control"), "").unwrap();
        fs::create_dir(root.join(PARENT_DIR)).unwrap();
        fs::write(root.join(PARENT_DIR).join("cgroup.subtree_control"), "").unwrap();
        let limits = Limits {
            memory_bytes: Some(64 << 20),
            pids: Some(50),
            cpus: Some(1.5),
            cpuset: Some("0".into()),
            ..Limits::default()
        };
        let placements = require(root, &limits).unwrap();
        assert!(placements.iter().all(|p| p.version == Version::V2));
        let group = Group::create(&placements, "w", &limits).unwrap();
        let leaf = root
            .join(PARENT_DIR)
            .join(format!("w.{}", std::process::id()));
        let read = |f: &str| fs::read_to_string(leaf.join(f)).unwrap();
        assert_eq!(read("memory.max"), (64u64 << 20).to_string());
        assert_eq!(read("pids.max"), "50");
        assert_eq!(read("cpu.max"), "150000 100000");
        assert_eq!(read("cpuset.cpus"), "0");
        // A plain file keeps only the last "+controller" written to it.
        let enabled =
            fs::read_to_string(root.join(PARENT_DIR).join("cgroup.subtree_control")).unwrap();
        assert!(enabled.starts_with('+'), "{enabled}");
        assert_eq!(group.dirs(), vec![leaf.as_path()]);
        // A child of this test (if an assertion fails, the group's drop kills it).
        let mut sleeper = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = Pid::from_raw(sleeper.id() as i32);
        fs::write(leaf.join("cgroup.procs"), "").unwrap();
        group.add(pid).unwrap();
        assert_eq!(
            read("cgroup.procs"),
            pid.to_string(),
            "written once, not per controller"
        );
        fs::remove_dir_all(&leaf).unwrap();
        drop(group); // finds its directory gone: nothing to kill or remove
        sleeper.kill().unwrap();
        sleeper.wait().unwrap();
    }

    #[test]
    fn v2_is_preferred_when_it_offers_the_controller() {
        let tmp = tempfile::tempdir().unwrap();
        let unified = tmp.path().join("unified");
        fs::create_dir_all(&unified).unwrap();
        fs::write(unified.join("cgroup.controllers"), "hugetlb pids\n").unwrap();
        fs::create_dir_all(tmp.path().join("memory")).unwrap();
        fs::write(tmp.path().join("memory/memory.limit_in_bytes"), "").unwrap();
        assert_eq!(
            locate(tmp.path(), ControllerKind::Pids).unwrap().version,
            Version::V2
        );
        assert_eq!(
            locate(tmp.path(), ControllerKind::Memory).unwrap().version,
            Version::V1
        );
        let why = locate(tmp.path(), ControllerKind::Cpu).unwrap_err();
        assert!(why.contains("does not offer `cpu`"), "{why}");
    }
}
