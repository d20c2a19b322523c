//! I/O of the cached open mode ([`super::OpenMode::Cached`]): the kernel opens files
//! without asking, so reads, writes, syncs and allocations arrive with handle 0 and are
//! served by inode. An unmodified file is read from its blob-cache file; its first write,
//! truncate or allocation copies it up (lazily for large files, so reads of a half-copied
//! file still take the blocks not done from the blob and a write copies its blocks
//! first), after which its upper file serves it. A copy-up leaves the bytes the kernel
//! cached unchanged, so its page cache stays right.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::sync::Arc;

use crate::filesystem::{Errno, FileKind};
use cowspace_store::ContentId;
use nix::sys::time::TimeSpec;

use super::fdio::fallocate;
use super::fs::CowFs;
use super::handles::{Copying, InodeFile};
use super::node::Node;
use crate::blobfiles::read_full_at;
use crate::filesystem::{errno_of_io, errno_of_nix, lock};

/// Files kept open by inode; the map is emptied when it reaches this size (a file is
/// opened again at its next use).
const MAX_INODE_FILES: usize = 256;

impl CowFs {
    /// The file `node`'s I/O goes to: its blob while it has no upper file, else that file.
    fn inode_file(&self, node: &Node) -> Result<Arc<File>, Errno> {
        let upper = node.upper.is_some();
        if let Some(f) = lock(&self.handles.by_inode).get(&node.ino)
            && f.upper == upper
        {
            return Ok(Arc::clone(&f.file));
        }
        let file = if upper {
            let path = self.cow.upper_of(node)?;
            let rw = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_CLOEXEC)
                .open(&path);
            match rw {
                Ok(f) => f,
                Err(_) => File::open(&path).map_err(errno_of_io)?,
            }
        } else {
            let e = node.lower.as_ref().ok_or(Errno::EIO)?;
            self.cow
                .layers
                .open_blob(&ContentId::from_bytes(e.hash), e.size)
                .map_err(|err| {
                    tracing::warn!(ino = node.ino, error = %err, "cannot open a blob");
                    errno_of_io(err)
                })?
        };
        let file = Arc::new(file);
        let mut map = lock(&self.handles.by_inode);
        if map.len() >= MAX_INODE_FILES {
            map.clear();
        }
        map.insert(
            node.ino,
            InodeFile {
                upper,
                file: Arc::clone(&file),
            },
        );
        Ok(file)
    }

    /// `node`'s copy-up if still in progress.
    fn copying(&self, node: &Node) -> Copying {
        if self.cow.lazy.is_empty() {
            return None;
        }
        node.upper
            .as_ref()
            .and_then(|fd| self.cow.lazy.get(fd.as_ref()))
    }

    /// `ino` with an upper file: copied up now if it has none (its first change; `empty`:
    /// its content is not wanted). A file deleted before its first change (the kernel
    /// still holds it open) gets a copy of its own in the work directory, linked nowhere
    /// (`O_TMPFILE`): it goes with its last user, as the deleted file would.
    pub(super) fn changed_node(&self, ino: u64, empty: bool) -> Result<Node, Errno> {
        let node = self.cow.table.get(ino)?;
        if node.upper.is_some() {
            return Ok(node);
        }
        if node.deleted && node.kind == FileKind::RegularFile {
            return self.orphan_copy(ino, empty);
        }
        let _r = self.cow.ns_read();
        self.cow.copy_up(ino, empty)
    }

    fn orphan_copy(&self, ino: u64, empty: bool) -> Result<Node, Errno> {
        let _g = lock(&self.handles.orphans);
        let node = self.cow.table.get(ino)?;
        if node.upper.is_some() {
            return Ok(node);
        }
        let e = node.lower.as_ref().ok_or(Errno::EIO)?;
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC)
            .open(self.cow.layers.work_dir().map_err(errno_of_io)?)
            .map_err(errno_of_io)?;
        if !empty {
            let mut blob = self
                .cow
                .layers
                .open_blob(&ContentId::from_bytes(e.hash), e.size)
                .map_err(errno_of_io)?;
            std::io::copy(&mut blob, &mut f).map_err(errno_of_io)?;
        }
        f.set_permissions(std::fs::Permissions::from_mode(e.mode & 0o7777))
            .map_err(errno_of_io)?;
        nix::unistd::fchown(
            &f,
            Some(nix::unistd::Uid::from_raw(self.cow.layers.uid)),
            Some(nix::unistd::Gid::from_raw(self.cow.layers.gid)),
        )
        .map_err(errno_of_nix)?;
        let t = TimeSpec::new(node.lower_secs as i64, 0);
        nix::sys::stat::futimens(&f, &t, &t).map_err(errno_of_nix)?;
        let fd = Arc::new(OwnedFd::from(f));
        self.cow.table.update(ino, |n| {
            if n.upper.is_none() {
                n.upper = Some(Arc::clone(&fd));
            }
        });
        self.cow.table.get(ino)
    }

    /// Reads into `buf` (as much as the file has from `offset`); returns the bytes read.
    pub(super) fn read_by_inode(
        &self,
        ino: u64,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, Errno> {
        let node = self.cow.table.get(ino)?;
        match self.copying(&node) {
            Some(p) => p.read_at(buf, offset).map_err(errno_of_io),
            None => read_full_at(&*self.inode_file(&node)?, buf, offset).map_err(errno_of_io),
        }
    }

    /// A write at `offset` (the kernel has placed appends at the end already).
    pub(super) fn write_by_inode(&self, ino: u64, offset: u64, data: &[u8]) -> Result<(), Errno> {
        let node = self.changed_node(ino, false)?;
        let file = self.inode_file(&node)?;
        match self.copying(&node) {
            Some(p) => p.write_at(&file, data, offset, false),
            None => file.write_all_at(data, offset),
        }
        .map_err(errno_of_io)
    }

    pub(super) fn fsync_by_inode(&self, ino: u64, datasync: bool) -> Result<(), Errno> {
        let node = self.cow.table.get(ino)?;
        // A file never written is a blob: nothing of it is unsynced.
        if node.upper.is_none() {
            return Ok(());
        }
        let file = self.inode_file(&node)?;
        if datasync {
            file.sync_data()
        } else {
            file.sync_all()
        }
        .map_err(errno_of_io)
    }

    pub(super) fn fallocate_by_inode(
        &self,
        ino: u64,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> Result<(), Errno> {
        let node = self.changed_node(ino, false)?;
        // Ranges may move or vanish: a copy-up in progress is finished first.
        if let Some(p) = self.copying(&node) {
            p.finish().map_err(errno_of_io)?;
        }
        fallocate(&*self.inode_file(&node)?, offset, length, mode).map_err(errno_of_io)
    }

    /// The kernel forgot `node`: its file is closed, and a deleted file's copy-up dropped.
    pub(super) fn forgotten(&self, node: &Node) {
        lock(&self.handles.by_inode).remove(&node.ino);
        if let Some(fd) = &node.upper
            && !self.cow.lazy.is_empty()
        {
            self.cow.lazy.forget_deleted(fd.as_ref());
        }
    }
}
