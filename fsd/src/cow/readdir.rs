//! Listings of a workspace's directories for the kernel: `readdir` (never negotiated so,
//! but answered) and `readdirplus`, whose entries carry attributes and each take a
//! lookup. Offsets are the entries' cookies (`listing.rs`).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use fuser::{Errno, FileType, Generation, INodeNo, ReplyDirectory, ReplyDirectoryPlus};

use super::fs::CowFs;
use super::listing::Listing;
use super::node::{Node, ROOT_INO};
use crate::fusecore::TTL;

/// The inode number of `node`'s `..` (the root's is itself).
fn parent_of(node: &Node) -> u64 {
    if node.ino == ROOT_INO {
        node.ino
    } else {
        node.parent
    }
}

impl CowFs {
    /// Directory `ino` and its listing.
    fn dir_listing(&self, ino: u64) -> Result<(Node, Arc<Listing>), Errno> {
        let node = self.cow.table.get(ino)?;
        if node.kind != FileType::Directory {
            return Err(Errno::ENOTDIR);
        }
        let listing = self.cow.listing(&node)?;
        Ok((node, listing))
    }

    /// `readdirplus`: entries with their attributes, each (but `.` and `..`) taking a
    /// lookup as `lookup` would.
    pub(super) fn do_readdirplus(&self, ino: u64, offset: u64, mut reply: ReplyDirectoryPlus) {
        let (node, listing) = match self.dir_listing(ino) {
            Ok(x) => x,
            Err(e) => return reply.error(e),
        };
        // "." and ".." take no lookup in the kernel; every other entry takes one. (The
        // directory's attributes only for a read from the start: half of a walk's reads
        // are the empty one that ends a directory.)
        if offset < 2 {
            let dir_attr = match self.cow.attr(&node) {
                Ok(a) => a,
                Err(e) => return reply.error(e),
            };
            for i in offset..2 {
                let mut a = dir_attr;
                let full = if i == 0 {
                    reply.add(a.ino, 1, ".", &TTL, &a, Generation(0))
                } else {
                    a.ino = INodeNo(parent_of(&node));
                    reply.add(a.ino, 2, "..", &TTL, &a, Generation(0))
                };
                if full {
                    return reply.ok();
                }
            }
        }
        let mut added_any = offset < 2;
        let lookups = match self.cow.lookups_in(&node) {
            Ok(l) => l,
            Err(e) => return reply.error(e),
        };
        for (off, e) in listing.after(offset) {
            // The name as it is now (it may have changed since the listing was taken).
            let child = match lookups.lookup(&e.name) {
                Ok(Some(c)) => c,
                Ok(None) => continue,
                Err(err) if !added_any => return reply.error(err),
                Err(_) => break,
            };
            let attr = match self.cow.attr(&child) {
                Ok(a) => a,
                Err(err) => {
                    self.cow.table.forget(child.ino, 1);
                    if !added_any {
                        return reply.error(err);
                    }
                    break;
                }
            };
            let full = reply.add(
                attr.ino,
                *off,
                OsStr::from_bytes(&e.name),
                &TTL,
                &attr,
                Generation(0),
            );
            if full {
                // Not sent: give the lookup back.
                self.cow.table.forget(child.ino, 1);
                break;
            }
            added_any = true;
        }
        reply.ok();
    }

    /// `readdir`: entries from after `offset`, each numbered as it is now.
    pub(super) fn do_readdir(&self, ino: u64, offset: u64, mut reply: ReplyDirectory) {
        let (node, listing) = match self.dir_listing(ino) {
            Ok(x) => x,
            Err(e) => return reply.error(e),
        };
        for i in offset..2 {
            let full = if i == 0 {
                reply.add(INodeNo(node.ino), 1, FileType::Directory, ".")
            } else {
                reply.add(INodeNo(parent_of(&node)), 2, FileType::Directory, "..")
            };
            if full {
                return reply.ok();
            }
        }
        // Only without readdirplus (never negotiated so): numbers found one by one.
        let _r = self.cow.ns_read();
        let dir_path = match self.cow.table.path_of(&node) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        for (off, e) in listing.after(offset) {
            let ino = match self.cow.ino_at(&node, &dir_path, &e.name) {
                Ok(Some(ino)) => ino,
                Ok(None) => continue,
                Err(err) => return reply.error(err),
            };
            if reply.add(INodeNo(ino), *off, e.kind, OsStr::from_bytes(&e.name)) {
                break;
            }
        }
        reply.ok();
    }
}
