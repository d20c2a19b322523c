//! The `cpuset` controller: the CPUs a sandbox's processes may run on (`--cpuset-cpus`).
//! Unlike an affinity mask, a process cannot widen it for itself.

use std::path::Path;

use super::Limits;
use super::{Controller, GroupDir, Version, read, write, write_checked};
use crate::error::{Error, Result};

/// Most CPU numbers a list may name.
pub const MAX_CPU_NUMBER: u32 = 4095;

/// Parses a CPU list (`0-2,5`) into sorted, distinct CPU numbers.
pub fn parse_list(text: &str) -> std::result::Result<Vec<u32>, String> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',') {
        let part = part.trim();
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (u32, u32) = match (a.trim().parse(), b.trim().parse()) {
            (Ok(a), Ok(b)) if a <= b && b <= MAX_CPU_NUMBER => (a, b),
            _ => {
                return Err(format!(
                    "{part:?} is not a CPU number or range (like 0-2,5)"
                ));
            }
        };
        cpus.extend(a..=b);
    }
    cpus.sort_unstable();
    cpus.dedup();
    if cpus.is_empty() {
        return Err("no CPU named".into());
    }
    Ok(cpus)
}

/// Formats CPU numbers as the kernel prints a list (`0-2,5`).
pub fn format_list(cpus: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    out.join(",")
}

/// The CPUs of this host that are online (`/sys/devices/system/cpu/online`).
pub fn online() -> Result<Vec<u32>> {
    let path = Path::new("/sys/devices/system/cpu/online");
    let text = read(path, "read the online CPUs")?;
    parse_list(&text).map_err(|e| Error::InvalidInput(format!("{}: {e}", path.display())))
}

/// On v1 a new group's `cpuset.cpus` and `cpuset.mems` start empty and no task may join
/// it: the parent's values are copied into `dir` first (for `cowspace/`, from the
/// hierarchy's root).
pub fn inherit(dir: &Path, parent: &Path) -> Result<()> {
    for file in ["cpuset.mems", "cpuset.cpus"] {
        let mine = read(&dir.join(file), "read")?;
        if mine.is_empty() {
            let theirs = read(&parent.join(file), "read the parent's")?;
            write(&dir.join(file), &theirs, "inherit the parent's")?;
        }
    }
    Ok(())
}

/// The group's CPUs, a list in the kernel's format in `cpuset.cpus` (on v1 after the
/// parent's CPUs and memory nodes are inherited), read back.
pub struct Cpuset;

impl Controller for Cpuset {
    fn apply(&self, at: &GroupDir<'_>, limits: &Limits) -> Result<()> {
        let Some(cpus) = limits.cpuset.as_deref() else {
            return Ok(());
        };
        if at.version == Version::V1 {
            inherit(at.path, at.parent)?;
        }
        write_checked(&at.path.join("cpuset.cpus"), cpus, cpus)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::testing::Fixture;

    #[test]
    fn v1_inherits_the_parents_cpus_and_mems_then_sets_its_own() {
        let fx = Fixture::new(Version::V1);
        fx.offer("cpuset.cpus", "");
        fx.offer("cpuset.mems", "");
        fx.offer_in_parent("cpuset.cpus", "0-3");
        fx.offer_in_parent("cpuset.mems", "0");
        Cpuset.apply(&fx.dir(), &cpuset("1")).unwrap();
        assert_eq!(fx.read("cpuset.mems"), "0");
        assert_eq!(fx.read("cpuset.cpus"), "1");
    }

    #[test]
    fn v2_sets_only_its_cpus() {
        let fx = Fixture::new(Version::V2);
        Cpuset.apply(&fx.dir(), &cpuset("0-1")).unwrap();
        assert_eq!(fx.read("cpuset.cpus"), "0-1");
        assert_eq!(fx.files(), ["cpuset.cpus"]);
    }

    #[test]
    fn lists_parse_and_print_as_the_kernel_does() {
        assert_eq!(parse_list("0-2,5").unwrap(), vec![0, 1, 2, 5]);
        assert_eq!(format_list(&parse_list("5,0,1,2,2").unwrap()), "0-2,5");
        assert_eq!(format_list(&[3]), "3");
        for bad in ["", "a", "3-1", "1,,2", "-1", "99999"] {
            assert!(parse_list(bad).is_err(), "{bad:?}");
        }
    }

    fn cpuset(list: &str) -> Limits {
        Limits {
            cpuset: Some(list.into()),
            ..Limits::default()
        }
    }
}
