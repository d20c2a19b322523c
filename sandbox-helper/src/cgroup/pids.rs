//! The `pids` controller: the most processes and threads at once.

use std::path::Path;

use super::{Version, write_checked};
use crate::error::Result;

/// Sets `pids.max` of the group at `dir` (same file on v1 and v2); `None` leaves `max`.
pub fn apply(dir: &Path, _version: Version, limit: Option<u64>) -> Result<()> {
    match limit {
        Some(n) => write_checked(&dir.join("pids.max"), &n.to_string(), &n.to_string()),
        None => Ok(()),
    }
}
