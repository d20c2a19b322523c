//! The `pids` controller: the most processes and threads at once.

use std::path::Path;

use super::Limits;
use super::{Controller, GroupDir, write_checked};
use crate::error::Result;

/// `pids.max`, the same file on v1 and v2; no limit leaves `max`.
pub struct Pids;

impl Controller for Pids {
    fn apply(&self, dir: &GroupDir<'_>, limits: &Limits) -> Result<()> {
        match limits.pids {
            Some(n) => write_checked(&dir.path.join("pids.max"), &n.to_string(), &n.to_string()),
            None => Ok(()),
        }
    }
}

/// How many times the kernel refused a fork or clone in the group because it was at its
/// limit (`max` of `pids.events`, the same file on v1 and v2).
pub fn refused_forks(dir: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(dir.join("pids.events")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("max ")?.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::Version;
    use crate::cgroup::testing::Fixture;

    #[test]
    fn the_limit_goes_to_pids_max_on_both_versions() {
        for version in [Version::V1, Version::V2] {
            let fx = Fixture::new(version);
            let lim = Limits {
                pids: Some(50),
                ..Limits::default()
            };
            Pids.apply(&fx.dir(), &lim).unwrap();
            assert_eq!(fx.read("pids.max"), "50", "{version:?}");
            assert_eq!(fx.files(), ["pids.max"], "{version:?}");
        }
    }

    #[test]
    fn refused_forks_are_read_from_pids_events() {
        let fx = Fixture::new(Version::V1);
        assert_eq!(refused_forks(fx.dir().path), None);
        fx.offer("pids.events", "max 7\n");
        assert_eq!(refused_forks(fx.dir().path), Some(7));
    }
}
