//! The one reader of `/proc` for this crate: a process's stat line, name, command line and
//! children; the boot id; the kernel's filesystems.

use std::fs;

/// What `/proc/PID/stat` says of a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// The state letter (field 3): `R`, `S`, `Z`, ...
    pub state: char,
    /// The kernel's per-process flags (field 9).
    pub flags: u64,
    /// When it started, in clock ticks after boot (field 22).
    pub start_ticks: u64,
}

impl ProcStat {
    /// Dead or dying: a zombie (it waits only to be reaped) or being torn down.
    pub fn is_zombie(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// Parses a `/proc/PID/stat` line. The command name (field 2) is in parentheses and may
/// hold spaces and parentheses itself, so fields are counted after its last `)`.
pub fn parse_stat(stat: &str) -> Option<ProcStat> {
    let (_, rest) = stat.rsplit_once(") ")?;
    let mut fields = rest.split_ascii_whitespace();
    // `rest` starts at field 3 (state); the flags are field 9, the start time field 22.
    let state = fields.next()?.chars().next()?;
    let flags = fields.nth(5)?.parse().ok()?;
    let start_ticks = fields.nth(12)?.parse().ok()?;
    Some(ProcStat {
        state,
        flags,
        start_ticks,
    })
}

/// The stat of process `pid` (`None`: gone, or unreadable).
pub fn stat(pid: i32) -> Option<ProcStat> {
    parse_stat(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The stat of this process.
pub fn own_stat() -> Option<ProcStat> {
    parse_stat(&fs::read_to_string("/proc/self/stat").ok()?)
}

/// The name of process `pid` (`comm`, without its newline).
pub fn comm(pid: i32) -> Option<String> {
    let c = fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    Some(c.trim_end().to_string())
}

/// The arguments of process `pid`.
pub fn cmdline(pid: i32) -> Option<Vec<Vec<u8>>> {
    let raw = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let mut args: Vec<Vec<u8>> = raw.split(|b| *b == 0).map(<[u8]>::to_vec).collect();
    if raw.ends_with(&[0]) {
        args.pop();
    }
    Some(args)
}

/// The children of process `pid` (of its main thread).
pub fn children(pid: i32) -> Vec<i32> {
    fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|c| c.parse().ok())
        .collect()
}

/// This boot's id.
pub fn boot_id() -> Option<String> {
    let id = fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    Some(id.trim().to_string()).filter(|s| !s.is_empty())
}

/// Whether the kernel has the filesystem `name` (`/proc/filesystems`).
pub fn has_filesystem(name: &str) -> bool {
    fs::read_to_string("/proc/filesystems")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().last() == Some(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_is_read_after_the_last_parenthesis() {
        // pid (comm) state ppid pgrp session tty tpgid flags ... starttime (22nd)
        let line = "42 (a) b) c) S 1 42 42 0 -1 4194560 10 0 0 0 1 2 0 0 20 0 1 0 777 1000 10";
        let s = parse_stat(line).unwrap();
        assert_eq!(s.state, 'S');
        assert_eq!(s.flags, 4194560);
        assert_eq!(s.start_ticks, 777);
        assert!(!s.is_zombie());
        assert!(parse_stat("garbage").is_none());
    }

    #[test]
    fn this_process_is_readable() {
        let me = std::process::id() as i32;
        assert_eq!(
            stat(me).unwrap().start_ticks,
            own_stat().unwrap().start_ticks
        );
        assert!(comm(me).is_some());
        assert!(!cmdline(me).unwrap().is_empty());
        assert!(boot_id().is_some());
        assert!(has_filesystem("proc"));
        assert!(!has_filesystem("no-such-filesystem"));
    }
}
