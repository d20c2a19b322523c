//! The `memory` controller: a hard limit and the OOM-kill counter.

use std::path::Path;

use super::Limits;
use super::{Controller, GroupDir, Version, read, write_checked};
use crate::error::Result;

/// The memory limit of the group (and the memory+swap limit on v1, no swap on v2, so
/// swap cannot extend it), checked against the page-rounded value read back.
pub struct Memory;

impl Controller for Memory {
    fn apply(&self, at: &GroupDir<'_>, limits: &Limits) -> Result<()> {
        let Some(bytes) = limits.memory_bytes else {
            return Ok(());
        };
        let dir = at.path;
        let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .unwrap_or(4096) as u64;
        let expect = (bytes / page * page).to_string();
        match at.version {
            Version::V1 => {
                write_checked(
                    &dir.join("memory.limit_in_bytes"),
                    &bytes.to_string(),
                    &expect,
                )?;
                let memsw = dir.join("memory.memsw.limit_in_bytes");
                if memsw.exists() {
                    write_checked(&memsw, &bytes.to_string(), &expect)?;
                }
            }
            Version::V2 => {
                write_checked(&dir.join("memory.max"), &bytes.to_string(), &expect)?;
                let swap = dir.join("memory.swap.max");
                if swap.exists() {
                    write_checked(&swap, "0", "0")?;
                }
            }
        }
        Ok(())
    }
}

/// The number of OOM kills in the group (`oom_kill` of `memory.oom_control` on v1,
/// of `memory.events` on v2).
pub fn oom_kills(dir: &Path, version: Version) -> Option<u64> {
    let file = match version {
        Version::V1 => "memory.oom_control",
        Version::V2 => "memory.events",
    };
    let text = read(&dir.join(file), "read oom counter").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::testing::Fixture;

    const LIMIT: u64 = 64 << 20;

    fn limited(bytes: u64) -> Limits {
        Limits {
            memory_bytes: Some(bytes),
            ..Limits::default()
        }
    }

    /// v1: `memory.limit_in_bytes`, and the memory+swap limit when offered; v2:
    /// `memory.max`, and no swap when offered.
    #[test]
    fn each_version_sets_its_limit_and_keeps_swap_from_extending_it() {
        for (version, limit, swap, swap_value) in [
            (
                Version::V1,
                "memory.limit_in_bytes",
                "memory.memsw.limit_in_bytes",
                LIMIT.to_string(),
            ),
            (
                Version::V2,
                "memory.max",
                "memory.swap.max",
                "0".to_string(),
            ),
        ] {
            let fx = Fixture::new(version);
            Memory.apply(&fx.dir(), &limited(LIMIT)).unwrap();
            assert_eq!(fx.read(limit), LIMIT.to_string(), "{version:?}");
            assert_eq!(fx.files(), [limit], "{version:?}: no swap file made");
            fx.offer(swap, "max");
            Memory.apply(&fx.dir(), &limited(LIMIT)).unwrap();
            assert_eq!(fx.read(swap), swap_value, "{version:?}");
        }
    }

    /// The kernel rounds the limit down to pages; a value read back unrounded (here,
    /// a plain file's) is refused on both versions.
    #[test]
    fn a_limit_read_back_other_than_page_rounded_is_refused() {
        for version in [Version::V1, Version::V2] {
            let fx = Fixture::new(version);
            let err = Memory.apply(&fx.dir(), &limited(LIMIT + 1)).unwrap_err();
            assert!(err.to_string().contains(&LIMIT.to_string()), "{err}");
        }
    }

    #[test]
    fn oom_kills_are_read_from_each_versions_file() {
        let fx = Fixture::new(Version::V1);
        fx.offer(
            "memory.oom_control",
            "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",
        );
        assert_eq!(oom_kills(fx.dir().path, Version::V1), Some(3));
        let fx = Fixture::new(Version::V2);
        fx.offer("memory.events", "low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\n");
        assert_eq!(oom_kills(fx.dir().path, Version::V2), Some(2));
        assert_eq!(oom_kills(fx.dir().path, Version::V1), None);
    }
}
