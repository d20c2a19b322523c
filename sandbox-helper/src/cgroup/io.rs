//! The `io` controller (v2) or `blkio` (v1): the most bytes and I/Os per second a
//! sandbox reads and writes (`--io-max`), and its share of disk time (`--io-weight`).
//!
//! A throttle is set per block device: on every disk of the host (a `/sys/block/*`
//! entry with a `device`: hardware, not a loop, zram or device-mapper device), and on
//! the devices the workspace's own filesystems are mounted from ([`devices_holding`]:
//! its upper layer's, such as the loop device of `init --workspaces-fs`). A loop
//! device's I/O that reaches the disk is charged to the sandbox's cgroup and throttled
//! there too (measured on Linux 6.18: limited on the disk alone, reads from a
//! loop-mounted btrfs ran at the limit once the image's pages were not cached), but a
//! loop device reads its image through the page cache: without its own throttle, reads
//! the image's cache answers would not be held. Throttled twice, such reads ran at
//! about 0.8 of the limit here.
//!
//! What v1 cannot do: buffered writes are written back by the kernel's flusher threads,
//! outside the sandbox's cgroup, so `wbps` holds for direct I/O and for writes the
//! sandbox itself flushes (`fsync`, `O_SYNC`); reads that miss the page cache are always
//! throttled. `--io-weight` needs a proportional scheduler (bfq): with `mq-deadline`,
//! `kyber` or `none` the kernel offers no weight file and the flag is refused.

use std::fs;
use std::path::{Path, PathBuf};

use super::Limits;
use super::{Controller, GroupDir, Version, write};
use crate::error::{Error, Result};

/// Where the kernel lists block devices.
const SYS_BLOCK: &str = "/sys/block";
/// The largest `--io-weight` (cgroup v2's range; v1's bfq weight is 1 to 1000).
pub const MAX_IO_WEIGHT: u64 = 10_000;

/// `--io-max`: each limit per second, `None` for no limit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IoMax {
    pub read_bps: Option<u64>,
    pub write_bps: Option<u64>,
    pub read_iops: Option<u64>,
    pub write_iops: Option<u64>,
    /// Devices (`MAJ:MIN`) throttled besides the host's disks: those the workspace's
    /// filesystems are mounted from.
    pub devices: Vec<String>,
}

impl IoMax {
    /// Parses `SIZE` (both directions' bytes per second) or `rbps=SIZE,wbps=SIZE,
    /// riops=N,wiops=N` (any of them, each once).
    pub fn parse(text: &str) -> Result<IoMax> {
        let bad = |why: &str| {
            Error::InvalidInput(format!(
                "--io-max {text:?}: {why}; give a rate in bytes per second (`20m`) or any of \
                 rbps=SIZE,wbps=SIZE,riops=N,wiops=N"
            ))
        };
        let size = |v: &str| {
            sandbox_api::size::parse(v)
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| bad(&format!("{v:?} is not a positive size")))
        };
        let mut out = IoMax::default();
        if !text.contains('=') {
            let n = size(text)?;
            out.read_bps = Some(n);
            out.write_bps = Some(n);
            return Ok(out);
        }
        for part in text.split(',') {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| bad("expected KEY=VALUE"))?;
            let slot = match k.trim() {
                "rbps" => &mut out.read_bps,
                "wbps" => &mut out.write_bps,
                "riops" => &mut out.read_iops,
                "wiops" => &mut out.write_iops,
                other => return Err(bad(&format!("unknown key {other:?}"))),
            };
            if slot.is_some() {
                return Err(bad(&format!("{k} is given twice")));
            }
            let n = if k.trim().ends_with("iops") {
                v.trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| bad(&format!("{v:?} is not a positive count")))?
            } else {
                size(v.trim())?
            };
            *slot = Some(n);
        }
        Ok(out)
    }

    /// [`IoMax::parse`], with the devices the workspace at `workspace` (and its overlay's
    /// upper layer) is mounted from ([`devices_holding`]).
    pub fn for_workspace(
        text: &str,
        workspace: &Path,
        overlay: Option<&crate::overlay::Layers>,
    ) -> Result<IoMax> {
        let mut m = IoMax::parse(text)?;
        let mut at = vec![workspace];
        if let Some(l) = overlay {
            at.push(l.upper_parent.as_path());
        }
        let table = crate::mountinfo::read().unwrap_or_default();
        m.devices = devices_holding(&table, &at);
        Ok(m)
    }

    /// `(v1 file, value)` for each limit set.
    fn v1_files(&self) -> Vec<(&'static str, u64)> {
        [
            ("blkio.throttle.read_bps_device", self.read_bps),
            ("blkio.throttle.write_bps_device", self.write_bps),
            ("blkio.throttle.read_iops_device", self.read_iops),
            ("blkio.throttle.write_iops_device", self.write_iops),
        ]
        .into_iter()
        .filter_map(|(f, v)| Some((f, v?)))
        .collect()
    }

    /// The v2 `io.max` line's keys for device `dev`.
    fn v2_line(&self, dev: &str) -> String {
        let v = |n: Option<u64>| n.map_or("max".to_string(), |n| n.to_string());
        format!(
            "{dev} rbps={} wbps={} riops={} wiops={}",
            v(self.read_bps),
            v(self.write_bps),
            v(self.read_iops),
            v(self.write_iops)
        )
    }
}

/// The `MAJ:MIN` of every disk of the host under `sys_block` (entries with a `device`
/// link: hardware, not loop, zram or device-mapper devices).
pub fn disks(sys_block: &Path) -> Vec<String> {
    let mut out: Vec<String> = fs::read_dir(sys_block)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.path().join("device").exists())
                .filter_map(|e| fs::read_to_string(e.path().join("dev")).ok())
                .map(|d| d.trim().to_string())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// The weight file of the hierarchy root `hierarchy` (`version`), if the host's
/// scheduler offers one.
pub fn weight_file(hierarchy: &Path, version: Version) -> Option<PathBuf> {
    let names: &[&str] = match version {
        Version::V1 => &["blkio.bfq.weight", "blkio.weight"],
        // The root of v2 has no io.weight; its children do once `io` is enabled.
        Version::V2 => &["io.bfq.weight", "io.weight"],
    };
    names
        .iter()
        .map(|n| hierarchy.join(n))
        .find(|p| p.is_file())
}

/// Why `--io-max` / `--io-weight` cannot be enforced with the hierarchy `hierarchy`,
/// if they cannot.
pub fn unenforceable(hierarchy: &Path, version: Version, limits: &Limits) -> Option<String> {
    if limits.io_weight.is_some()
        && version == Version::V1
        && weight_file(hierarchy, version).is_none()
    {
        let schedulers: Vec<String> = disks_named(Path::new(SYS_BLOCK))
            .into_iter()
            .map(|(name, sched)| format!("{name}: {sched}"))
            .collect();
        return Some(format!(
            "{} has no blkio.weight or blkio.bfq.weight: the disks' I/O schedulers have no \
             proportional share (schedulers: {}; bfq has one)",
            hierarchy.display(),
            if schedulers.is_empty() {
                "none found".into()
            } else {
                schedulers.join(", ")
            }
        ));
    }
    if limits.io_max.is_some() && disks(Path::new(SYS_BLOCK)).is_empty() {
        return Some(format!(
            "no disk under {SYS_BLOCK} to throttle (only loop, zram or device-mapper devices)"
        ));
    }
    None
}

/// The block devices (`MAJ:MIN`, a partition's whole disk) the filesystems holding
/// `paths` are mounted from, by the mount table `mountinfo`: mounts whose source is
/// not a block device (overlay, FUSE, tmpfs) add none.
pub fn devices_holding(mountinfo: &str, paths: &[&Path]) -> Vec<String> {
    use std::os::unix::fs::FileTypeExt;
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    for p in paths {
        // The mount holding `p`: the longest target above it, the last of equals (on top).
        let Some(line) = sandbox_api::mountinfo::lines(mountinfo)
            .filter(|l| p.starts_with(&l.target))
            .max_by_key(|l| l.target.len())
        else {
            continue;
        };
        let source = sandbox_api::mountinfo::unescape(line.source);
        let Ok(meta) = fs::metadata(&source) else {
            continue;
        };
        if !meta.file_type().is_block_device() {
            continue;
        }
        let (major, minor) = (
            nix::sys::stat::major(meta.rdev()),
            nix::sys::stat::minor(meta.rdev()),
        );
        let sys = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
        // A partition is throttled at its disk (v1 takes whole devices only).
        let dev = if sys.join("partition").exists() {
            fs::read_to_string(sys.join("../dev"))
                .map(|d| d.trim().to_string())
                .unwrap_or_else(|_| format!("{major}:{minor}"))
        } else {
            format!("{major}:{minor}")
        };
        if !out.contains(&dev) {
            out.push(dev);
        }
    }
    out
}

/// `(name, scheduler line)` of each disk.
fn disks_named(sys_block: &Path) -> Vec<(String, String)> {
    fs::read_dir(sys_block)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.path().join("device").exists())
                .map(|e| {
                    let s =
                        fs::read_to_string(e.path().join("queue/scheduler")).unwrap_or_default();
                    (
                        e.file_name().to_string_lossy().into_owned(),
                        s.trim().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `io` / `blkio`.
pub struct Io;

impl Controller for Io {
    fn apply(&self, dir: &GroupDir<'_>, limits: &Limits) -> Result<()> {
        let mut devs = disks(Path::new(SYS_BLOCK));
        for d in limits.io_max.iter().flat_map(|m| &m.devices) {
            if !devs.contains(d) {
                devs.push(d.clone());
            }
        }
        apply_to(dir, limits, &devs)
    }
}

/// [`Io::apply`] on the devices `devs` (`MAJ:MIN`).
fn apply_to(dir: &GroupDir<'_>, limits: &Limits, devs: &[String]) -> Result<()> {
    if let Some(m) = &limits.io_max {
        for dev in devs {
            match dir.version {
                Version::V1 => {
                    for (file, n) in m.v1_files() {
                        let path = dir.path.join(file);
                        write(&path, &format!("{dev} {n}"), "write limit")?;
                        check_listed(&path, &format!("{dev} {n}"))?;
                    }
                }
                Version::V2 => {
                    let path = dir.path.join("io.max");
                    write(&path, &m.v2_line(dev), "write limit")?;
                }
            }
        }
    }
    if let Some(w) = limits.io_weight {
        let name = match dir.version {
            Version::V1 => ["blkio.bfq.weight", "blkio.weight"],
            Version::V2 => ["io.bfq.weight", "io.weight"],
        };
        let path = name
            .iter()
            .map(|n| dir.path.join(n))
            .find(|p| p.is_file())
            .ok_or_else(|| Error::Unsupported {
                control: "I/O weight (cgroup io/blkio weight)",
                reason: format!("{} has no weight file", dir.path.display()),
            })?;
        let value = if dir.version == Version::V2 {
            format!("default {w}")
        } else {
            w.to_string()
        };
        write(&path, &value, "write limit")?;
    }
    Ok(())
}

/// Checks that the v1 per-device file `path` lists `line` (it lists every device set).
fn check_listed(path: &Path, line: &str) -> Result<()> {
    let got = super::read(path, "read limit back")?;
    if got.lines().any(|l| l.trim() == line) {
        return Ok(());
    }
    Err(Error::CgroupReadBack {
        path: path.to_path_buf(),
        wanted: line.into(),
        got,
    })
}

/// The throttle as the group's directories `dirs` report it (v1 files), for the
/// sandbox's status: `None` when none is set.
pub fn read_back(dirs: &[PathBuf]) -> serde_json::Value {
    let first = |file: &str| -> Option<(String, u64)> {
        let text = dirs
            .iter()
            .find_map(|d| fs::read_to_string(d.join(file)).ok())?;
        let mut it = text.lines().next()?.split_whitespace();
        Some((it.next()?.to_string(), it.next()?.parse().ok()?))
    };
    let r = first("blkio.throttle.read_bps_device");
    let w = first("blkio.throttle.write_bps_device");
    let ri = first("blkio.throttle.read_iops_device");
    let wi = first("blkio.throttle.write_iops_device");
    if r.is_none() && w.is_none() && ri.is_none() && wi.is_none() {
        return serde_json::Value::Null;
    }
    let mut devices: Vec<String> = dirs
        .iter()
        .filter_map(|d| fs::read_to_string(d.join("blkio.throttle.read_bps_device")).ok())
        .chain(
            dirs.iter()
                .filter_map(|d| fs::read_to_string(d.join("blkio.throttle.write_bps_device")).ok()),
        )
        .flat_map(|t| {
            t.lines()
                .filter_map(|l| l.split_whitespace().next().map(str::to_string))
                .collect::<Vec<_>>()
        })
        .collect();
    devices.sort();
    devices.dedup();
    serde_json::json!({
        "read_bps": r.map(|x| x.1),
        "write_bps": w.map(|x| x.1),
        "read_iops": ri.map(|x| x.1),
        "write_iops": wi.map(|x| x.1),
        "devices": devices,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::testing::Fixture;

    #[test]
    fn io_max_parses_a_rate_or_keys_and_refuses_the_rest() {
        let m = IoMax::parse("20m").unwrap();
        assert_eq!((m.read_bps, m.write_bps), (Some(20 << 20), Some(20 << 20)));
        let m = IoMax::parse("rbps=1m,wiops=100").unwrap();
        assert_eq!(m.read_bps, Some(1 << 20));
        assert_eq!(m.write_iops, Some(100));
        assert_eq!(m.write_bps, None);
        for bad in [
            "",
            "0",
            "x",
            "rbps=1m,rbps=2m",
            "bps=1m",
            "riops=1k",
            "rbps",
        ] {
            let e = IoMax::parse(bad).unwrap_err().to_string();
            assert!(e.contains("--io-max"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_throttle_is_written_per_device_and_read_back() {
        let fx = Fixture::new(Version::V1);
        for f in [
            "blkio.throttle.read_bps_device",
            "blkio.throttle.write_bps_device",
        ] {
            fx.offer(f, "");
        }
        let lim = Limits {
            io_max: Some(IoMax::parse("10m").unwrap()),
            ..Limits::default()
        };
        // The fixture's files keep the last line written, as a one-device kernel would.
        apply_to(&fx.dir(), &lim, &["254:0".to_string()]).unwrap();
        assert_eq!(fx.read("blkio.throttle.read_bps_device"), "254:0 10485760");
        assert_eq!(fx.read("blkio.throttle.write_bps_device"), "254:0 10485760");
        let v = read_back(&[fx.dir().path.to_path_buf()]);
        assert_eq!(v["read_bps"], 10 << 20, "{v}");
        assert_eq!(v["devices"], serde_json::json!(["254:0"]), "{v}");
    }

    #[test]
    fn only_disks_are_throttled() {
        let d = tempfile::tempdir().unwrap();
        for (name, dev, hw) in [
            ("vda", "254:0", true),
            ("loop0", "7:0", false),
            ("zram0", "253:0", false),
        ] {
            let p = d.path().join(name);
            fs::create_dir_all(&p).unwrap();
            fs::write(p.join("dev"), format!("{dev}\n")).unwrap();
            if hw {
                fs::create_dir(p.join("device")).unwrap();
            }
        }
        assert_eq!(disks(d.path()), ["254:0"]);
    }
}
