//! What the numbers were measured on: kernel, CPU, cores, memory, filesystems.

use std::path::Path;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Machine {
    /// `uname -r`.
    pub kernel: String,
    /// PRETTY_NAME from /etc/os-release.
    pub os: String,
    pub cpu_model: String,
    /// Logical CPUs available to this process.
    pub cores: usize,
    pub memory_bytes: u64,
    /// The directory runs work in (stores, copies, checkouts) and its filesystem.
    pub work_dir: String,
    pub work_fs: String,
    /// The directory the corpora are cached in and its filesystem.
    pub cache_dir: String,
    pub cache_fs: String,
    /// Whether this process runs as root (needed for mounts and cold page cache).
    pub root: bool,
    /// The CPU idle driver, and for `haltpoll` (a virtual machine's) how long an idle
    /// vCPU polls before it halts: it sets the cost of every cross-CPU wakeup, so of
    /// every FUSE round trip (`mountctl doctor` says more).
    #[serde(default)]
    pub cpuidle: String,
}

impl Machine {
    pub fn probe(work_dir: &Path, cache_dir: &Path) -> Self {
        Self {
            kernel: read_trim("/proc/sys/kernel/osrelease"),
            os: os_release(),
            cpu_model: cpu_model(),
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            memory_bytes: mem_total(),
            work_dir: work_dir.display().to_string(),
            work_fs: fs_of(work_dir),
            cache_dir: cache_dir.display().to_string(),
            cache_fs: fs_of(cache_dir),
            root: nix::unistd::geteuid().is_root(),
            cpuidle: cpuidle(),
        }
    }
}

fn cpuidle() -> String {
    let driver = read_trim("/sys/devices/system/cpu/cpuidle/current_driver");
    if driver != "haltpoll" {
        return driver;
    }
    let ns = read_trim("/sys/module/haltpoll/parameters/guest_halt_poll_ns");
    format!("haltpoll, guest_halt_poll_ns {ns}")
}

fn read_trim(p: &str) -> String {
    std::fs::read_to_string(p)
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

fn os_release() -> String {
    std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("PRETTY_NAME="))
                .map(|v| v.trim_matches('"').to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

fn mem_total() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| {
                    l.split_whitespace()
                        .nth(1)
                        .and_then(|kib| kib.parse::<u64>().ok())
                })
        })
        .map_or(0, |kib| kib * 1024)
}

/// The filesystem type and source of the mount holding `path` (longest matching
/// mount point in /proc/self/mounts).
pub fn fs_of(path: &Path) -> String {
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") else {
        return "unknown".into();
    };
    mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.len() >= 3).then(|| (f[0], f[1].replace("\\040", " "), f[2]))
        })
        .filter(|(_, mp, _)| path.starts_with(mp))
        .max_by_key(|(_, mp, _)| mp.len())
        .map_or_else(
            || "unknown".into(),
            |(src, mp, ty)| format!("{ty} ({src} on {mp})"),
        )
}
