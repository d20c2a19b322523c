//! The `cpu` controller: CFS bandwidth (quota per period).

use super::Limits;
use super::{Controller, GroupDir, Version, write_checked};
use crate::error::Result;

/// The CFS period used, in microseconds.
pub const PERIOD_US: u64 = 100_000;
/// The smallest quota the kernel accepts, in microseconds.
const MIN_QUOTA_US: u64 = 1_000;

/// The group's CPU bandwidth in CPUs: `cpu.cfs_period_us` and `cpu.cfs_quota_us` on
/// v1, `cpu.max` ("QUOTA PERIOD") on v2.
pub struct Cpu;

impl Controller for Cpu {
    fn apply(&self, at: &GroupDir<'_>, limits: &Limits) -> Result<()> {
        let Some(cpus) = limits.cpus else {
            return Ok(());
        };
        let quota = ((cpus * PERIOD_US as f64).round() as u64).max(MIN_QUOTA_US);
        match at.version {
            Version::V1 => {
                let period = PERIOD_US.to_string();
                write_checked(&at.path.join("cpu.cfs_period_us"), &period, &period)?;
                write_checked(
                    &at.path.join("cpu.cfs_quota_us"),
                    &quota.to_string(),
                    &quota.to_string(),
                )
            }
            Version::V2 => {
                let value = format!("{quota} {PERIOD_US}");
                write_checked(&at.path.join("cpu.max"), &value, &value)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::testing::Fixture;

    #[test]
    fn v1_writes_period_and_quota() {
        let fx = Fixture::new(Version::V1);
        Cpu.apply(&fx.dir(), &cpus(1.5)).unwrap();
        assert_eq!(fx.read("cpu.cfs_period_us"), "100000");
        assert_eq!(fx.read("cpu.cfs_quota_us"), "150000");
        assert_eq!(fx.files(), ["cpu.cfs_period_us", "cpu.cfs_quota_us"]);
    }

    #[test]
    fn v2_writes_quota_and_period_in_cpu_max() {
        let fx = Fixture::new(Version::V2);
        Cpu.apply(&fx.dir(), &cpus(1.5)).unwrap();
        assert_eq!(fx.read("cpu.max"), "150000 100000");
        assert_eq!(fx.files(), ["cpu.max"]);
    }

    #[test]
    fn a_tiny_share_gets_the_smallest_quota_the_kernel_takes() {
        for (version, file, want) in [
            (Version::V1, "cpu.cfs_quota_us", "1000"),
            (Version::V2, "cpu.max", "1000 100000"),
        ] {
            let fx = Fixture::new(version);
            Cpu.apply(&fx.dir(), &cpus(0.0001)).unwrap();
            assert_eq!(fx.read(file), want);
        }
    }

    fn cpus(n: f64) -> Limits {
        Limits {
            cpus: Some(n),
            ..Limits::default()
        }
    }
}
