//! What a helper left behind is named `NAME.PID` (cgroups, overlay work directories,
//! VM run directories): whether its helper is gone. A leaf, below the cgroup and overlay
//! code that both sweep such entries.

use std::fs;

/// Whether a `NAME.PID` entry belongs to a helper that is gone. A zombie is gone: a
/// killed keeper is reparented (its caller exited), and a pid 1 that does not reap
/// orphans promptly (or at all, in some containers) would keep it from ever counting.
pub fn owner_is_gone(entry: &str) -> bool {
    match entry
        .rsplit_once('.')
        .and_then(|(_, pid)| pid.parse::<i32>().ok())
    {
        Some(pid) if pid > 0 => match fs::read_to_string(format!("/proc/{pid}/stat")) {
            // The state follows the last `)` (the command name may hold one).
            Ok(stat) => stat
                .rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X')),
            Err(_) => true,
        },
        _ => false,
    }
}
