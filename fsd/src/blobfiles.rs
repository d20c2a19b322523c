//! Opening blob-cache files, remembering which contents this process has placed there,
//! so a known one is opened directly without asking the store's index. A blob file is
//! complete and verified whenever it exists (it appears by rename).

use std::collections::HashSet;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Mutex;

use cowspace_store::{ContentId, Store};

/// Contents remembered as placed (cleared when full; about 48 MiB at the limit). Above
/// it, every open would go back to the store.
const MAX_ENSURED_CONTENTS: usize = 1 << 20;

/// Why a blob file could not be opened.
#[derive(Debug)]
pub enum OpenBlobError {
    /// Placing it from the store failed.
    Store(cowspace_store::Error),
    /// Opening the file failed.
    Io(io::Error),
}

/// The contents this process has placed in the blob cache.
#[derive(Default)]
pub struct EnsuredBlobs {
    set: Mutex<HashSet<ContentId>>,
}

impl EnsuredBlobs {
    /// Opens the blob-cache file of `content` for reading, placing it first unless this
    /// process placed it before (or, given `size`, a file of that length is there).
    pub fn open(
        &self,
        store: &Store,
        content: &ContentId,
        size: Option<u64>,
    ) -> Result<File, OpenBlobError> {
        let cache = store.blob_cache();
        if let Some(size) = size {
            // Given the length, a file of that length is it: no need to remember it (a
            // fuse workspace's set grew to 4 MiB after a read of the Linux tree).
            match open_read(&cache.path(content)) {
                Ok(f) if f.metadata().is_ok_and(|m| m.len() == size) => return Ok(f),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(OpenBlobError::Io(e)),
            }
            let path = cache.ensure(content).map_err(OpenBlobError::Store)?;
            return open_read(&path).map_err(OpenBlobError::Io);
        }
        let known = self
            .set
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(content);
        if known {
            match open_read(&cache.path(content)) {
                Ok(f) => return Ok(f),
                // Evicted since: placed again below.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(OpenBlobError::Io(e)),
            }
        }
        let path = cache.ensure(content).map_err(OpenBlobError::Store)?;
        let f = open_read(&path).map_err(OpenBlobError::Io)?;
        self.remember(content);
        Ok(f)
    }

    fn remember(&self, content: &ContentId) {
        let mut set = self.set.lock().unwrap_or_else(|p| p.into_inner());
        if set.len() >= MAX_ENSURED_CONTENTS {
            set.clear();
        }
        set.insert(*content);
    }
}

/// Opens a blob-cache file for reading without updating its access time (`O_NOATIME`,
/// where this process may: it owns the file or has `CAP_FOWNER`). Nothing reads those
/// times, and updating them cost an ext4 inode write per file: 3.6% of the samples
/// (`perf`) while a fresh fuse workspace's every file was read, none once opened so.
pub fn open_read(path: &std::path::Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let open = |flags| {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(flags)
            .open(path)
    };
    match open(libc::O_NOATIME | libc::O_CLOEXEC) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => open(libc::O_CLOEXEC),
        r => r,
    }
}

/// Reads into `buf` at `offset` until it is full or the file ends; the bytes read (the
/// read paths of the view and of fuse workspaces).
pub fn read_full_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], offset + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    use std::time::{Duration, SystemTime};

    #[test]
    fn blob_reads_leave_access_times_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("blob");
        std::fs::write(&path, b"contents").unwrap();
        // An access time before the modification: a read updates it under `relatime`.
        let old = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_times(std::fs::FileTimes::new().set_accessed(old))
            .unwrap();
        let mut s = String::new();
        open_read(&path).unwrap().read_to_string(&mut s).unwrap();
        assert_eq!(s, "contents");
        let atime = std::fs::metadata(&path).unwrap().atime();
        if nix::unistd::geteuid().is_root()
            || std::fs::metadata(&path).unwrap().uid() == nix::unistd::geteuid().as_raw()
        {
            assert_eq!(atime, 1_000_000, "O_NOATIME was not used");
        }
    }
}
