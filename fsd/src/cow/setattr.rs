//! `setattr`: mode, owner, size and times of a workspace object, copied up first.

use std::fs::File;
use std::sync::Arc;
use std::time::SystemTime;

use crate::filesystem::{Attr, Errno, SetAttr, SetTime};
use nix::fcntl::AT_FDCWD;
use nix::sys::stat::UtimensatFlags;
use nix::sys::time::TimeSpec;

use super::node::Node;
use super::ops::Cow;
use crate::filesystem::{errno_of_io, errno_of_nix};

/// Applies `change` to `node` (copied up already; `by_handle`: the file of the request's
/// handle, if any) and gives node `ino`'s attributes after.
pub(super) fn set_attr(
    cow: &Cow,
    ino: u64,
    node: Node,
    by_handle: Option<Arc<File>>,
    change: SetAttr,
) -> Result<Attr, Errno> {
    let path = cow.upper_of(&node)?;
    // A copy-up in progress: size and times change under its lock.
    let pending = node.upper.as_ref().and_then(|fd| cow.lazy.get(fd.as_ref()));
    if change.uid.is_some() || change.gid.is_some() {
        let fd = node.upper.as_ref().ok_or(Errno::EIO)?;
        nix::unistd::fchownat(
            fd.as_ref(),
            "",
            change.uid.map(nix::unistd::Uid::from_raw),
            change.gid.map(nix::unistd::Gid::from_raw),
            nix::fcntl::AtFlags::AT_EMPTY_PATH,
        )
        .map_err(errno_of_nix)?;
    }
    if let Some(m) = change.mode {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(m & 0o7777))
            .map_err(errno_of_io)?;
    }
    if let Some(len) = change.size {
        match (&pending, by_handle) {
            (Some(p), _) => p.truncate(len).map_err(errno_of_io)?,
            (None, Some(f)) if f.set_len(len).is_ok() => {}
            _ => nix::unistd::truncate(&path, len as i64).map_err(errno_of_nix)?,
        }
    }
    if change.atime.is_some() || change.mtime.is_some() {
        let ts = |t: Option<SetTime>| match t {
            None => TimeSpec::UTIME_OMIT,
            Some(SetTime::Now) => TimeSpec::UTIME_NOW,
            Some(SetTime::At(t)) => match t.duration_since(SystemTime::UNIX_EPOCH) {
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
            },
        };
        let set = || {
            nix::sys::stat::utimensat(
                AT_FDCWD,
                &path,
                &ts(change.atime),
                &ts(change.mtime),
                UtimensatFlags::FollowSymlink,
            )
        };
        match &pending {
            Some(p) => p.locked(set),
            None => set(),
        }
        .map_err(errno_of_nix)?;
    }
    cow.attr(&cow.table.get(ino)?)
}
