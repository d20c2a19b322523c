//! The core's values as NFSv3's (RFC 1813).

use std::time::{SystemTime, UNIX_EPOCH};

use nfs3_types::nfs3::{
    fattr3, ftype3, nfsstat3, nfstime3, post_op_attr, sattr3, set_atime, set_mtime, specdata3,
    wcc_data,
};

use crate::filesystem::{Attr, Errno, FileKind, SetAttr, SetTime};

/// The `fsid` every attribute of an export carries.
pub const FSID: u64 = 0x636f_7773_7061_6365;

pub fn status(e: Errno) -> nfsstat3 {
    match e.code() {
        libc::EPERM => nfsstat3::NFS3ERR_PERM,
        libc::ENOENT => nfsstat3::NFS3ERR_NOENT,
        libc::ENXIO => nfsstat3::NFS3ERR_NXIO,
        libc::EACCES => nfsstat3::NFS3ERR_ACCES,
        libc::EEXIST => nfsstat3::NFS3ERR_EXIST,
        libc::EXDEV => nfsstat3::NFS3ERR_XDEV,
        libc::ENODEV => nfsstat3::NFS3ERR_NODEV,
        libc::ENOTDIR => nfsstat3::NFS3ERR_NOTDIR,
        libc::EISDIR => nfsstat3::NFS3ERR_ISDIR,
        libc::EINVAL => nfsstat3::NFS3ERR_INVAL,
        libc::EFBIG => nfsstat3::NFS3ERR_FBIG,
        libc::ENOSPC => nfsstat3::NFS3ERR_NOSPC,
        libc::EDQUOT => nfsstat3::NFS3ERR_DQUOT,
        libc::EROFS => nfsstat3::NFS3ERR_ROFS,
        libc::EMLINK => nfsstat3::NFS3ERR_MLINK,
        libc::ENAMETOOLONG => nfsstat3::NFS3ERR_NAMETOOLONG,
        libc::ENOTEMPTY => nfsstat3::NFS3ERR_NOTEMPTY,
        libc::ESTALE => nfsstat3::NFS3ERR_STALE,
        libc::ENOSYS | libc::EOPNOTSUPP => nfsstat3::NFS3ERR_NOTSUPP,
        libc::EIO => nfsstat3::NFS3ERR_IO,
        _ => nfsstat3::NFS3ERR_SERVERFAULT,
    }
}

pub fn ftype(k: FileKind) -> ftype3 {
    match k {
        FileKind::RegularFile => ftype3::NF3REG,
        FileKind::Directory => ftype3::NF3DIR,
        FileKind::Symlink => ftype3::NF3LNK,
        FileKind::NamedPipe => ftype3::NF3FIFO,
        FileKind::CharDevice => ftype3::NF3CHR,
        FileKind::BlockDevice => ftype3::NF3BLK,
        FileKind::Socket => ftype3::NF3SOCK,
    }
}

pub fn time(t: SystemTime) -> nfstime3 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => nfstime3 {
            seconds: u32::try_from(d.as_secs()).unwrap_or(u32::MAX),
            nseconds: d.subsec_nanos(),
        },
        // Before 1970: NFSv3 times are unsigned.
        Err(_) => nfstime3::default(),
    }
}

pub fn fattr(a: &Attr) -> fattr3 {
    let rdev = u64::from(a.rdev);
    fattr3 {
        type_: ftype(a.kind),
        mode: u32::from(a.perm),
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        size: a.size,
        used: a.blocks.saturating_mul(512),
        rdev: specdata3 {
            specdata1: libc::major(rdev),
            specdata2: libc::minor(rdev),
        },
        fsid: FSID,
        fileid: a.ino,
        atime: time(a.atime),
        mtime: time(a.mtime),
        ctime: time(a.ctime),
    }
}

pub fn post_op(a: Option<Attr>) -> post_op_attr {
    match a {
        Some(a) => post_op_attr::Some(fattr(&a)),
        None => post_op_attr::None,
    }
}

/// What a change did to directory or file attributes: only the attributes after (the
/// "before" half is optional in RFC 1813, and the cores keep no history).
pub fn wcc(after: Option<Attr>) -> wcc_data {
    wcc_data {
        before: nfs3_types::nfs3::pre_op_attr::None,
        after: post_op(after),
    }
}

pub fn set_attr(s: &sattr3) -> SetAttr {
    use nfs3_types::nfs3::Nfs3Option;
    let opt = |o: &Nfs3Option<u32>| match o {
        Nfs3Option::Some(v) => Some(*v),
        Nfs3Option::None => None,
    };
    SetAttr {
        mode: opt(&s.mode),
        uid: opt(&s.uid),
        gid: opt(&s.gid),
        size: match s.size {
            Nfs3Option::Some(v) => Some(v),
            Nfs3Option::None => None,
        },
        atime: match s.atime {
            set_atime::DONT_CHANGE => None,
            set_atime::SET_TO_SERVER_TIME => Some(SetTime::Now),
            set_atime::SET_TO_CLIENT_TIME(t) => Some(SetTime::At(t.into())),
        },
        mtime: match s.mtime {
            set_mtime::DONT_CHANGE => None,
            set_mtime::SET_TO_SERVER_TIME => Some(SetTime::Now),
            set_mtime::SET_TO_CLIENT_TIME(t) => Some(SetTime::At(t.into())),
        },
    }
}

/// Whether `s` changes anything.
pub fn changes(s: &SetAttr) -> bool {
    s.mode.is_some()
        || s.uid.is_some()
        || s.gid.is_some()
        || s.size.is_some()
        || s.atime.is_some()
        || s.mtime.is_some()
}
