//! The `pids` controller: the most processes and threads at once.

use super::{Controller, GroupDir, write_checked};
use crate::error::Result;
use crate::spec::Limits;

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
}
