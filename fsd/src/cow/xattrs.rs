//! Extended attributes of a workspace's objects: a snapshot entry's from its tree, an
//! upper object's from the upper file; overlay's and the daemon's own names hidden and
//! refused ([`reserved_xattr`]); POSIX ACLs not kept.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use super::fs::CowFs;
use super::layers::reserved_xattr;
use crate::filesystem::{Errno, FileKind, errno_of_io};

impl CowFs {
    pub(super) fn do_getxattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>, Errno> {
        if reserved_xattr(name) {
            return Err(Errno::NO_XATTR);
        }
        let node = self.cow.table.get(ino)?;
        if node.upper.is_some() {
            if node.kind == FileKind::Symlink {
                return Err(Errno::NO_XATTR);
            }
            let path = self.cow.upper_of(&node)?;
            xattr::get_deref(path, OsStr::from_bytes(name))
                .map_err(errno_of_io)?
                .ok_or(Errno::NO_XATTR)
        } else {
            node.lower
                .as_ref()
                .and_then(|e| e.xattrs().iter().find(|(n, _)| n.as_slice() == name))
                .map(|(_, v)| v.clone())
                .ok_or(Errno::NO_XATTR)
        }
    }

    pub(super) fn do_listxattr(&self, ino: u64) -> Result<Vec<u8>, Errno> {
        let node = self.cow.table.get(ino)?;
        let mut names = Vec::new();
        if node.upper.is_some() {
            if node.kind != FileKind::Symlink {
                let list = xattr::list_deref(self.cow.upper_of(&node)?).map_err(errno_of_io)?;
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
        Ok(names)
    }

    pub(super) fn do_setxattr(
        &self,
        ino: u64,
        name: &[u8],
        value: &[u8],
        flags: i32,
    ) -> Result<(), Errno> {
        if name.starts_with(b"system.") {
            // POSIX ACLs are not kept (tools then set the mode with chmod, which the
            // kernel's attribute cache sees). Asked before the reserved names, which
            // include the upper files' own ACLs: `cp -a` and `mv` (which copies a
            // directory of the snapshot: rename says `EXDEV`) take "not supported" in
            // silence, and warned "Operation not permitted" for every file.
            return Err(Errno::EOPNOTSUPP);
        }
        if reserved_xattr(name) {
            return Err(Errno::EPERM);
        }
        let name = OsStr::from_bytes(name);
        let n = self.cow.table.get(ino)?;
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
    }

    pub(super) fn do_removexattr(&self, ino: u64, name: &[u8]) -> Result<(), Errno> {
        if reserved_xattr(name) {
            return Err(Errno::NO_XATTR);
        }
        let n = self.cow.table.get(ino)?;
        let n = {
            let _r = self.cow.ns_read();
            self.cow.copy_up(n.ino, false)?
        };
        let p = self.cow.upper_of(&n)?;
        xattr::remove_deref(&p, OsStr::from_bytes(name)).map_err(errno_of_io)
    }
}
