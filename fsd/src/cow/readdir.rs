//! Listings of a workspace's directories for the kernel: `readdir` (never negotiated so,
//! but answered) and `readdirplus`, whose entries carry attributes and each take a
//! lookup. Offsets are the entries' cookies (`listing.rs`).

use std::sync::Arc;

use super::fs::CowFs;
use super::listing::Listing;
use super::node::{Node, ROOT_INO};
use crate::filesystem::{DirPlusSink, DirSink, Errno, FileKind};

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
        if node.kind != FileKind::Directory {
            return Err(Errno::ENOTDIR);
        }
        let listing = self.cow.listing(&node)?;
        Ok((node, listing))
    }

    /// `readdirplus`: entries with their attributes, each (but `.` and `..`) taking a
    /// lookup as `lookup` would.
    pub(super) fn do_readdirplus(
        &self,
        ino: u64,
        offset: u64,
        out: &mut dyn DirPlusSink,
    ) -> Result<(), Errno> {
        let (node, listing) = self.dir_listing(ino)?;
        // "." and ".." take no lookup in the kernel; every other entry takes one. (The
        // directory's attributes only for a read from the start: half of a walk's reads
        // are the empty one that ends a directory.)
        if offset < 2 {
            let dir_attr = self.cow.attr(&node)?;
            for i in offset..2 {
                let mut a = dir_attr;
                let full = if i == 0 {
                    out.add(1, b".", &a)
                } else {
                    a.ino = parent_of(&node);
                    out.add(2, b"..", &a)
                };
                if full {
                    return Ok(());
                }
            }
        }
        let mut added_any = offset < 2;
        let lookups = self.cow.lookups_in(&node)?;
        for (off, e) in listing.after(offset) {
            // The name as it is now (it may have changed since the listing was taken).
            let child = match lookups.lookup(&e.name) {
                Ok(Some(c)) => c,
                Ok(None) => continue,
                Err(err) if !added_any => return Err(err),
                Err(_) => break,
            };
            let attr = match self.cow.attr(&child) {
                Ok(a) => a,
                Err(err) => {
                    self.cow.table.forget(child.ino, 1);
                    if !added_any {
                        return Err(err);
                    }
                    break;
                }
            };
            let full = out.add(*off, &e.name, &attr);
            if full {
                // Not sent: give the lookup back.
                self.cow.table.forget(child.ino, 1);
                break;
            }
            added_any = true;
        }
        Ok(())
    }

    /// `readdir`: entries from after `offset`, each numbered as it is now.
    pub(super) fn do_readdir(
        &self,
        ino: u64,
        offset: u64,
        out: &mut dyn DirSink,
    ) -> Result<(), Errno> {
        let (node, listing) = self.dir_listing(ino)?;
        for i in offset..2 {
            let full = if i == 0 {
                out.add(node.ino, 1, FileKind::Directory, b".")
            } else {
                out.add(parent_of(&node), 2, FileKind::Directory, b"..")
            };
            if full {
                return Ok(());
            }
        }
        // Only without readdirplus (never negotiated so): numbers found one by one.
        let _r = self.cow.ns_read();
        let dir_path = self.cow.table.path_of(&node)?;
        for (off, e) in listing.after(offset) {
            let ino = match self.cow.ino_at(&node, &dir_path, &e.name) {
                Ok(Some(ino)) => ino,
                Ok(None) => continue,
                Err(err) => return Err(err),
            };
            if out.add(ino, *off, e.kind, &e.name) {
                break;
            }
        }
        Ok(())
    }
}
