//! `setattr`: mode, owner, size and times of a workspace object, copied up first.

use std::time::SystemTime;

use fuser::{Errno, FileHandle, TimeOrNow};
use nix::fcntl::AT_FDCWD;
use nix::sys::stat::UtimensatFlags;
use nix::sys::time::TimeSpec;

use super::fs::CowFs;
use super::ops::errno;

/// What a `setattr` changes.
pub(super) struct SetAttr {
    pub(super) mode: Option<u32>,
    pub(super) uid: Option<u32>,
    pub(super) gid: Option<u32>,
    pub(super) size: Option<u64>,
    pub(super) atime: Option<TimeOrNow>,
    pub(super) mtime: Option<TimeOrNow>,
    pub(super) fh: Option<FileHandle>,
}

impl CowFs {
    pub(super) fn setattr_inner(&self, ino: u64, s: SetAttr) -> Result<fuser::FileAttr, Errno> {
        let SetAttr {
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
            fh,
        } = s;
        let node = self.cow.table.get(ino)?;
        let node = self.changed_node(node.ino, size == Some(0))?;
        let path = self.cow.upper_of(&node)?;
        // A copy-up in progress: size and times change under its lock.
        let pending = node
            .upper
            .as_ref()
            .and_then(|fd| self.cow.lazy.get(fd.as_ref()));
        if uid.is_some() || gid.is_some() {
            let fd = node.upper.as_ref().ok_or(Errno::EIO)?;
            nix::unistd::fchownat(
                fd.as_ref(),
                "",
                uid.map(nix::unistd::Uid::from_raw),
                gid.map(nix::unistd::Gid::from_raw),
                nix::fcntl::AtFlags::AT_EMPTY_PATH,
            )
            .map_err(|e| Errno::from_i32(e as i32))?;
        }
        if let Some(m) = mode {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(m & 0o7777))
                .map_err(errno)?;
        }
        if let Some(len) = size {
            let by_handle = fh.and_then(|fh| self.handle_file(fh.0).ok());
            match (&pending, by_handle) {
                (Some(p), _) => p.truncate(len).map_err(errno)?,
                (None, Some(f)) if f.set_len(len).is_ok() => {}
                _ => nix::unistd::truncate(&path, len as i64)
                    .map_err(|e| Errno::from_i32(e as i32))?,
            }
        }
        if atime.is_some() || mtime.is_some() {
            let ts = |t: Option<TimeOrNow>| match t {
                None => TimeSpec::UTIME_OMIT,
                Some(TimeOrNow::Now) => TimeSpec::UTIME_NOW,
                Some(TimeOrNow::SpecificTime(t)) => {
                    match t.duration_since(SystemTime::UNIX_EPOCH) {
                        Ok(d) => TimeSpec::new(d.as_secs() as i64, d.subsec_nanos() as i64),
                        Err(e) => {
                            let d = e.duration();
                            let (s, n) = (d.as_secs() as i64, d.subsec_nanos() as i64);
                            if n == 0 {
                                TimeSpec::new(-s, 0)
                            } else {
                                TimeSpec::new(-s - 1, 1_000_000_000 - n)
                            }
                        }
                    }
                }
            };
            let set = || {
                nix::sys::stat::utimensat(
                    AT_FDCWD,
                    &path,
                    &ts(atime),
                    &ts(mtime),
                    UtimensatFlags::FollowSymlink,
                )
            };
            match &pending {
                Some(p) => p.locked(set),
                None => set(),
            }
            .map_err(|e| Errno::from_i32(e as i32))?;
        }
        self.cow.attr(&self.cow.table.get(ino)?)
    }
}
