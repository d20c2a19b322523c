//! Extended attributes of a workspace's objects: a snapshot entry's from its tree, an
//! upper object's from the upper file; overlay's and the daemon's own names hidden and
//! refused ([`reserved_xattr`]); POSIX ACLs not kept.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use fuser::{Errno, FileType, INodeNo, ReplyEmpty, ReplyXattr};

use super::fs::CowFs;
use super::layers::reserved_xattr;
use crate::fusecore::{errno_of_io, reply_sized};

impl CowFs {
    pub(super) fn do_getxattr(&self, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        if reserved_xattr(name.as_bytes()) {
            return reply.error(Errno::NO_XATTR);
        }
        let node = match self.cow.table.get(ino.0) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        if node.upper.is_some() {
            if node.kind == FileType::Symlink {
                return reply.error(Errno::NO_XATTR);
            }
            match self.cow.upper_of(&node).map(|p| xattr::get_deref(p, name)) {
                Ok(Ok(Some(v))) => reply_sized(&v, size, reply),
                Ok(Ok(None)) => reply.error(Errno::NO_XATTR),
                Ok(Err(e)) => reply.error(errno_of_io(e)),
                Err(e) => reply.error(e),
            }
        } else {
            let found = node.lower.as_ref().and_then(|e| {
                e.xattrs()
                    .iter()
                    .find(|(n, _)| n.as_slice() == name.as_bytes())
            });
            match found {
                Some((_, v)) => reply_sized(v, size, reply),
                None => reply.error(Errno::NO_XATTR),
            }
        }
    }

    pub(super) fn do_listxattr(&self, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let node = match self.cow.table.get(ino.0) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let mut names = Vec::new();
        if node.upper.is_some() {
            if node.kind != FileType::Symlink {
                let list = match self.cow.upper_of(&node).map(xattr::list_deref) {
                    Ok(Ok(l)) => l,
                    Ok(Err(e)) => return reply.error(errno_of_io(e)),
                    Err(e) => return reply.error(e),
                };
                for n in list {
                    if !reserved_xattr(n.as_bytes()) {
                        names.extend_from_slice(n.as_bytes());
                        names.push(0);
                    }
                }
            }
        } else if let Some(e) = &node.lower {
            for (n, _) in e.xattrs() {
                names.extend_from_slice(n);
                names.push(0);
            }
        }
        reply_sized(&names, size, reply);
    }

    pub(super) fn do_setxattr(
        &self,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        reply: ReplyEmpty,
    ) {
        if name.as_bytes().starts_with(b"system.") {
            // POSIX ACLs are not kept (tools then set the mode with chmod, which the
            // kernel's attribute cache sees). Asked before the reserved names, which
            // include the upper files' own ACLs: `cp -a` and `mv` (which copies a
            // directory of the snapshot: rename says `EXDEV`) take "not supported" in
            // silence, and warned "Operation not permitted" for every file.
            return reply.error(Errno::EOPNOTSUPP);
        }
        if reserved_xattr(name.as_bytes()) {
            return reply.error(Errno::EPERM);
        }
        let r = self.cow.table.get(ino.0).and_then(|n| {
            let n = {
                let _r = self.cow.ns_read();
                self.cow.copy_up(n.ino, false)?
            };
            let p = self.cow.upper_of(&n)?;
            let exists = matches!(xattr::get_deref(&p, name), Ok(Some(_)));
            if flags & libc::XATTR_CREATE != 0 && exists {
                return Err(Errno::EEXIST);
            }
            if flags & libc::XATTR_REPLACE != 0 && !exists {
                return Err(Errno::NO_XATTR);
            }
            xattr::set_deref(&p, name, value).map_err(errno_of_io)
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    pub(super) fn do_removexattr(&self, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        if reserved_xattr(name.as_bytes()) {
            return reply.error(Errno::NO_XATTR);
        }
        let r = self.cow.table.get(ino.0).and_then(|n| {
            let n = {
                let _r = self.cow.ns_read();
                self.cow.copy_up(n.ino, false)?
            };
            let p = self.cow.upper_of(&n)?;
            xattr::remove_deref(&p, name).map_err(errno_of_io)
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
}
