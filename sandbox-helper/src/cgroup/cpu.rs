//! The `cpu` controller: CFS bandwidth (quota per period).

use std::path::Path;

use super::{Version, write_checked};
use crate::error::Result;

/// The CFS period used, in microseconds.
pub const PERIOD_US: u64 = 100_000;
/// The smallest quota the kernel accepts, in microseconds.
const MIN_QUOTA_US: u64 = 1_000;

/// Sets the group's CPU bandwidth to `cpus` CPUs (`cpu.cfs_*` on v1, `cpu.max` on v2).
pub fn apply(dir: &Path, version: Version, cpus: Option<f64>) -> Result<()> {
    let Some(cpus) = cpus else { return Ok(()) };
    let quota = ((cpus * PERIOD_US as f64).round() as u64).max(MIN_QUOTA_US);
    match version {
        Version::V1 => {
            let period = PERIOD_US.to_string();
            write_checked(&dir.join("cpu.cfs_period_us"), &period, &period)?;
            write_checked(
                &dir.join("cpu.cfs_quota_us"),
                &quota.to_string(),
                &quota.to_string(),
            )
        }
        Version::V2 => {
            let value = format!("{quota} {PERIOD_US}");
            write_checked(&dir.join("cpu.max"), &value, &value)
        }
    }
}
