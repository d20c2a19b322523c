//! The `memory` controller: a hard limit and the OOM-kill counter.

use std::path::Path;

use super::{Version, read, write_checked};
use crate::error::Result;

/// Sets the memory limit of the group at `dir` (and, on v1, the memory+swap limit, so
/// swap cannot extend it), checking the values read back.
pub fn apply(dir: &Path, version: Version, bytes: Option<u64>) -> Result<()> {
    let Some(bytes) = bytes else { return Ok(()) };
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .unwrap_or(4096) as u64;
    let expect = (bytes / page * page).to_string();
    match version {
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
