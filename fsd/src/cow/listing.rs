//! Directory listings of a workspace: the upper directory merged over the snapshot's, in
//! the order `readdir` hands them out, and the listings lately read, kept until a name
//! changes.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::filesystem::{Errno, FileKind};
use cowspace_store::Tree;

use super::fdio::fd_path;
use super::layers::is_whiteout;
use crate::filesystem::{errno_of_io, host_file_type, kind_file_type, lock};

/// Listings kept for `readdir` (those of the directories read lately).
const MAX_KEPT_LISTINGS: usize = 16;

/// The first cookie an entry can have (`.` and `..` are 1 and 2).
const FIRST_COOKIE: u64 = 3;

/// One entry of a directory listing (its inode number is found when asked for:
/// `readdirplus` looks every entry up anyway).
#[derive(Debug, Clone)]
pub struct Listed {
    pub name: Vec<u8>,
    pub kind: FileKind,
}

/// A directory's entries in the order `readdir` hands them out: by cookie, the offset a
/// reader resumes after, which is a function of the name alone ([`name_cookie`]). So a
/// listing read in pieces while the directory changes never shows an entry twice or
/// skips one that was there throughout, whatever changed between two pieces; `telldir`
/// positions stay valid too. (Two names of one directory share a cookie, a 62-bit hash,
/// with a chance of 2^-62 per pair; a reply ending between two such names would make the
/// next one skip the second.)
#[derive(Debug)]
pub struct Listing {
    pub entries: Vec<(u64, Listed)>,
}

impl Listing {
    /// The entries after offset `offset` (`0`, `1` and `2`: from the first).
    pub fn after(&self, offset: u64) -> &[(u64, Listed)] {
        let i = self.entries.partition_point(|(c, _)| *c <= offset);
        &self.entries[i..]
    }
}

/// The `readdir` offset of the entry after `name`: 62 bits of a hash of it, from 3 on.
pub fn name_cookie(name: &[u8]) -> u64 {
    // SipHash with fixed keys: the same for a name throughout the daemon's life, which
    // outlives every reader of its mounts.
    use std::hash::Hasher;
    let mut h = std::hash::DefaultHasher::new();
    h.write(name);
    (h.finish() >> 2).max(FIRST_COOKIE)
}

/// A listing kept, with the count of changes it was taken at.
struct Kept {
    dir: u64,
    changes: u64,
    listing: Arc<Listing>,
}

/// The listings lately read in one workspace, and the count that makes them stale.
#[derive(Default)]
pub struct Listings {
    /// Counts the operations that changed names or the upper layer (make, remove, rename,
    /// copy-up), counted when each ends: a listing kept from before one is stale.
    changes: AtomicU64,
    /// Newest first.
    kept: Mutex<VecDeque<Kept>>,
}

/// Counts a change when dropped: at the end of an operation that changes names.
pub struct NamesChange<'a>(&'a AtomicU64);

impl Drop for NamesChange<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }
}

impl Listings {
    /// A change that is counted when the guard drops.
    pub fn change(&self) -> NamesChange<'_> {
        NamesChange(&self.changes)
    }

    /// Directory `dir`'s listing in cookie order: kept from a read since which no name
    /// changed, else made now of the names `list` gives.
    pub fn get(
        &self,
        dir: u64,
        list: impl FnOnce() -> Result<Vec<Listed>, Errno>,
    ) -> Result<Arc<Listing>, Errno> {
        // Read before listing: a change that ends while the listing is taken makes it
        // stale at once.
        let count = self.changes.load(Ordering::Acquire);
        let kept = lock(&self.kept)
            .iter()
            .find(|k| k.dir == dir && k.changes == count)
            .map(|k| Arc::clone(&k.listing));
        if let Some(l) = kept {
            return Ok(l);
        }
        let mut entries: Vec<(u64, Listed)> = list()?
            .into_iter()
            .map(|e| (name_cookie(&e.name), e))
            .collect();
        entries.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.name.cmp(&b.1.name)));
        let listing = Arc::new(Listing { entries });
        let mut kept = lock(&self.kept);
        kept.retain(|k| k.dir != dir && k.changes == count);
        kept.truncate(MAX_KEPT_LISTINGS - 1);
        kept.push_front(Kept {
            dir,
            changes: count,
            listing: Arc::clone(&listing),
        });
        Ok(listing)
    }
}

/// The names of the upper directory `upper` (its whiteouts hiding the snapshot's names)
/// merged over those of the snapshot directory `tree`, sorted by name.
pub fn merged(upper: Option<&OwnedFd>, tree: Option<&Tree>) -> Result<Vec<Listed>, Errno> {
    let mut out: BTreeMap<Vec<u8>, FileKind> = BTreeMap::new();
    let mut whiteouts = HashSet::new();
    if let Some(dfd) = upper {
        let up = fd_path(dfd);
        let rd = match fs::read_dir(&up) {
            Ok(rd) => Some(rd),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(errno_of_io(e)),
        };
        for e in rd.into_iter().flatten() {
            let e = e.map_err(errno_of_io)?;
            let name = e.file_name().as_bytes().to_vec();
            let ft = match e.file_type() {
                Ok(ft) => ft,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(errno_of_io(e)),
            };
            // Only a character device can be a whiteout: the others need no stat.
            if ft.is_char_device() {
                match fs::symlink_metadata(e.path()) {
                    Ok(m) if is_whiteout(&m) => {
                        whiteouts.insert(name);
                        continue;
                    }
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(errno_of_io(e)),
                }
            }
            out.insert(name, host_file_type(ft));
        }
    }
    if let Some(t) = tree {
        for e in &t.entries {
            if out.contains_key(&e.name) || whiteouts.contains(&e.name) {
                continue;
            }
            out.insert(e.name.clone(), kind_file_type(e.kind));
        }
    }
    Ok(out
        .into_iter()
        .map(|(name, kind)| Listed { name, kind })
        .collect())
}
