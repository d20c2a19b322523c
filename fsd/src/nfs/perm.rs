//! What the server refuses whoever asks through the client. A Linux client checks reads,
//! writes and lookups itself with `ACCESS` answers, but the ownership rules of `SETATTR`
//! and the directory rules of creating, removing and renaming names (write and search
//! permission, the sticky bit) are the server's, as they are knfsd's.

use nfs3_types::nfs3::nfsstat3;

use super::rpc::Caller;
use crate::filesystem::{Attr, FileKind, SetAttr, SetTime};

pub const READ: u32 = 4;
pub const WRITE: u32 = 2;
pub const SEARCH: u32 = 1;

/// Whether `who` is in group `gid`.
fn in_group(who: &Caller, gid: u32) -> bool {
    who.gid == gid || who.groups.contains(&gid)
}

/// The permission bits (`rwx`) of `attr` that apply to `who`.
pub fn bits(who: &Caller, attr: &Attr) -> u32 {
    let mode = u32::from(attr.perm);
    if who.uid == 0 {
        // Root reads and writes anything, and executes what anyone may.
        let x = attr.kind == FileKind::Directory || mode & 0o111 != 0;
        READ | WRITE | if x { SEARCH } else { 0 }
    } else if who.uid == attr.uid {
        (mode >> 6) & 7
    } else if in_group(who, attr.gid) {
        (mode >> 3) & 7
    } else {
        mode & 7
    }
}

/// `ACCES` unless `who` has every bit of `want` on `attr`.
pub fn may(who: &Caller, attr: &Attr, want: u32) -> Result<(), nfsstat3> {
    if bits(who, attr) & want == want {
        Ok(())
    } else {
        Err(nfsstat3::NFS3ERR_ACCES)
    }
}

/// Whether `who` may make `change` to `attr` (`chmod`, `chown`, `truncate`, `utimes`).
pub fn may_set(who: &Caller, attr: &Attr, change: &SetAttr) -> Result<(), nfsstat3> {
    if who.uid == 0 {
        return Ok(());
    }
    let owner = who.uid == attr.uid;
    if change.uid.is_some_and(|u| u != attr.uid) {
        return Err(nfsstat3::NFS3ERR_PERM);
    }
    if change
        .gid
        .is_some_and(|g| g != attr.gid && !(owner && in_group(who, g)))
    {
        return Err(nfsstat3::NFS3ERR_PERM);
    }
    if change.mode.is_some() && !owner {
        return Err(nfsstat3::NFS3ERR_PERM);
    }
    for t in [change.atime, change.mtime].into_iter().flatten() {
        match t {
            SetTime::At(_) if !owner => return Err(nfsstat3::NFS3ERR_PERM),
            SetTime::Now if !owner => may(who, attr, WRITE)?,
            _ => {}
        }
    }
    if change.size.is_some() {
        may(who, attr, WRITE)?;
    }
    Ok(())
}

/// Whether `who` may remove (or rename away) `victim` from directory `dir`: write and
/// search permission on it, and with its sticky bit, owning the directory or the victim.
pub fn may_delete(who: &Caller, dir: &Attr, victim: &Attr) -> Result<(), nfsstat3> {
    may(who, dir, WRITE | SEARCH)?;
    if dir.perm & 0o1000 != 0 && who.uid != 0 && who.uid != dir.uid && who.uid != victim.uid {
        return Err(nfsstat3::NFS3ERR_PERM);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    fn attr(uid: u32, gid: u32, perm: u16, kind: FileKind) -> Attr {
        Attr {
            ino: 2,
            size: 0,
            blocks: 0,
            atime: UNIX_EPOCH,
            mtime: UNIX_EPOCH,
            ctime: UNIX_EPOCH,
            kind,
            perm,
            nlink: 1,
            uid,
            gid,
            rdev: 0,
            blksize: 4096,
        }
    }

    fn who(uid: u32, gid: u32, groups: &[u32]) -> Caller {
        Caller {
            uid,
            gid,
            groups: groups.to_vec(),
        }
    }

    #[test]
    fn owners_groups_and_others_get_their_bits_and_root_all_but_execute() {
        let f = attr(10, 20, 0o640, FileKind::RegularFile);
        assert_eq!(bits(&who(10, 1, &[]), &f), READ | WRITE);
        assert_eq!(bits(&who(11, 20, &[]), &f), READ);
        assert_eq!(bits(&who(11, 1, &[20]), &f), READ);
        assert_eq!(bits(&who(11, 1, &[]), &f), 0);
        assert_eq!(bits(&who(0, 0, &[]), &f), READ | WRITE);
        assert!(may(&who(11, 1, &[]), &f, READ).is_err());
    }

    #[test]
    fn only_owners_chmod_only_root_chowns_and_sticky_dirs_keep_others_names() {
        let f = attr(10, 20, 0o666, FileKind::RegularFile);
        let chmod = SetAttr {
            mode: Some(0o600),
            ..SetAttr::default()
        };
        assert!(may_set(&who(10, 20, &[]), &f, &chmod).is_ok());
        assert_eq!(
            may_set(&who(11, 20, &[]), &f, &chmod),
            Err(nfsstat3::NFS3ERR_PERM)
        );
        let chown = SetAttr {
            uid: Some(11),
            ..SetAttr::default()
        };
        assert_eq!(
            may_set(&who(10, 20, &[]), &f, &chown),
            Err(nfsstat3::NFS3ERR_PERM)
        );
        let chgrp = SetAttr {
            gid: Some(30),
            ..SetAttr::default()
        };
        assert!(may_set(&who(10, 20, &[30]), &f, &chgrp).is_ok());
        let touch = SetAttr {
            mtime: Some(SetTime::Now),
            ..SetAttr::default()
        };
        assert!(
            may_set(&who(11, 1, &[]), &f, &touch).is_ok(),
            "write permission suffices for now"
        );
        let stamp = SetAttr {
            mtime: Some(SetTime::At(UNIX_EPOCH)),
            ..SetAttr::default()
        };
        assert_eq!(
            may_set(&who(11, 1, &[]), &f, &stamp),
            Err(nfsstat3::NFS3ERR_PERM)
        );

        let sticky = attr(0, 0, 0o1777, FileKind::Directory);
        let theirs = attr(12, 12, 0o644, FileKind::RegularFile);
        assert_eq!(
            may_delete(&who(11, 11, &[]), &sticky, &theirs),
            Err(nfsstat3::NFS3ERR_PERM)
        );
        assert!(may_delete(&who(12, 12, &[]), &sticky, &theirs).is_ok());
        let closed = attr(0, 0, 0o755, FileKind::Directory);
        assert_eq!(
            may_delete(&who(12, 12, &[]), &closed, &theirs),
            Err(nfsstat3::NFS3ERR_ACCES)
        );
    }
}
