//! Writing back what the kernel holds unwritten in a workspace served in the cached open
//! mode, before diff and commit read its upper directory.
//!
//! There is no writeback cache: `write` reaches the daemon at once. Only pages dirtied
//! through shared writable mappings wait in the kernel, and FUSE writes a mapping's pages
//! when the mapping is closed. So the files that can hold unwritten bytes are exactly the
//! ones some live process maps shared and writable. They are found in `/proc/*/maps` by
//! the mount's device and each is `fsync`ed: FUSE's fsync writes the file's dirty pages
//! and waits until the daemon has them. `syncfs` alone starts that writeback but, on
//! current kernels, does not wait for FUSE's (measured: the bytes reached the upper file
//! up to 10 ms after it returned).

use std::collections::HashSet;
use std::ffi::OsString;
use std::fs::File;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

use super::ops::Cow;

/// One shared writable mapping of a file of the mount.
#[derive(Debug, PartialEq, Eq)]
struct Mapped {
    pid: u32,
    /// The mapping's address range as `/proc/PID/maps` prints it (`start-end`).
    range: String,
    ino: u64,
}

/// Writes back every page of the workspace mounted at `mount` that a process dirtied
/// through a shared mapping, and waits until the daemon has written them.
pub(super) fn write_back(mount: &Path, cow: &Cow) -> Result<()> {
    let dir = File::open(mount).map_err(Error::io("open", mount))?;
    let dev = dir.metadata().map_err(Error::io("stat", mount))?.dev();
    nix::unistd::syncfs(&dir).map_err(|e| Error::Io {
        step: "write back the pages of",
        path: mount.to_path_buf(),
        source: e.into(),
    })?;
    for m in shared_writable(libc::major(dev), libc::minor(dev)) {
        let Some(file) = open_mapped(mount, cow, &m) else {
            // The process or its mapping is gone: closing a mapping writes its pages.
            continue;
        };
        file.sync_data().map_err(|e| Error::Io {
            step: "write back the mapped pages of",
            path: mount.join(format!("(inode {})", m.ino)),
            source: e,
        })?;
    }
    Ok(())
}

/// The mapped file: through `/proc/PID/map_files` (exact, even for a file deleted since;
/// needs `CAP_SYS_ADMIN`), else by its path in the mount.
fn open_mapped(mount: &Path, cow: &Cow, m: &Mapped) -> Option<File> {
    let proc_path = format!("/proc/{}/map_files/{}", m.pid, m.range);
    if let Ok(f) = File::open(&proc_path) {
        return Some(f);
    }
    let node = cow.table.find(m.ino)?;
    let rel = cow.table.path_of(&node).ok()?;
    let path = mount.join(PathBuf::from(OsString::from_vec(rel)));
    match File::open(&path) {
        Ok(f) => Some(f),
        Err(e) => {
            tracing::debug!(path = %path.display(), error = %e, "a mapped file is gone");
            None
        }
    }
}

/// The shared writable mappings, by every process this one may inspect, of files on the
/// device `major:minor` (one per inode).
fn shared_writable(major: u32, minor: u32) -> Vec<Mapped> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        // A process that exits meanwhile, or that this one may not inspect, is skipped.
        let Ok(maps) = std::fs::read_to_string(p.path().join("maps")) else {
            continue;
        };
        for m in parse_maps(pid, &maps, major, minor) {
            if seen.insert(m.ino) {
                out.push(m);
            }
        }
    }
    out
}

/// The shared writable mappings listed in `maps` (the text of `/proc/PID/maps`) of files
/// on device `major:minor`.
fn parse_maps(pid: u32, maps: &str, major: u32, minor: u32) -> Vec<Mapped> {
    let mut out = Vec::new();
    for line in maps.lines() {
        let mut f = line.split_ascii_whitespace();
        let (Some(range), Some(perms), Some(_offset), Some(dev), Some(ino)) =
            (f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            continue;
        };
        let p = perms.as_bytes();
        if p.len() < 4 || p[1] != b'w' || p[3] != b's' {
            continue;
        }
        let Some((maj, min)) = dev.split_once(':') else {
            continue;
        };
        let (Ok(maj), Ok(min), Ok(ino)) = (
            u32::from_str_radix(maj, 16),
            u32::from_str_radix(min, 16),
            ino.parse::<u64>(),
        ) else {
            continue;
        };
        if maj == major && min == minor && ino != 0 {
            out.push(Mapped {
                pid,
                range: range.to_string(),
                ino,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_shared_writable_mappings_of_the_device_are_taken() {
        let maps = "\
55d0c0a00000-55d0c0a01000 r--p 00000000 08:01 1234 /usr/bin/python3
7f0000000000-7f0000001000 rw-s 00000000 00:2d 77 /ws/d/m
7f0000002000-7f0000003000 r--s 00000000 00:2d 78 /ws/d/ro
7f0000004000-7f0000005000 rw-p 00000000 00:2d 79 /ws/d/private
7f0000006000-7f0000007000 rw-s 00000000 00:2e 80 /other/fs
7f0000008000-7f0000009000 rw-s 00000000 00:00 0 /dev/zero (deleted)
7f000000a000-7f000000b000 rw-s 00001000 00:2d 81 /ws/gone (deleted)
";
        let got = parse_maps(9, maps, 0, 0x2d);
        assert_eq!(
            got,
            vec![
                Mapped {
                    pid: 9,
                    range: "7f0000000000-7f0000001000".into(),
                    ino: 77
                },
                Mapped {
                    pid: 9,
                    range: "7f000000a000-7f000000b000".into(),
                    ino: 81
                },
            ]
        );
    }

    #[test]
    fn malformed_lines_are_skipped() {
        let maps = "garbage\n7f-80 rw-s 0 zz:2d 5 /x\n7f-80 rw-s 0 00:2d notanumber\n";
        assert!(parse_maps(1, maps, 0, 0x2d).is_empty());
    }
}
