//! Reading the extended attributes a snapshot records: the `user.` namespace and file
//! capabilities, sorted by name. A filesystem without xattrs has none.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::error::{Error, Result};

/// Name and value pairs, sorted by name.
pub(crate) type Xattrs = Vec<(Vec<u8>, Vec<u8>)>;

/// Extended attributes recorded: the `user.` namespace and file capabilities.
pub fn recorded_xattr(name: &[u8]) -> bool {
    name.starts_with(b"user.") || name == b"security.capability"
}

/// Reads the recorded xattrs of a path (not following symlinks), sorted.
pub fn read_xattrs(path: &Path) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    read_recorded(path, xattr::list(path), |name| xattr::get(path, name))
}

/// Reads the recorded xattrs of an open file, sorted (`path` names it in errors).
pub(crate) fn read_file_xattrs(file: &fs::File, path: &Path) -> Result<Xattrs> {
    use xattr::FileExt;
    read_recorded(path, file.list_xattr(), |name| file.get_xattr(name))
}

/// The recorded ones of the `names` listed, each read with `get`, sorted.
fn read_recorded(
    path: &Path,
    names: io::Result<impl Iterator<Item = OsString>>,
    get: impl Fn(&OsStr) -> io::Result<Option<Vec<u8>>>,
) -> Result<Xattrs> {
    let names = match names {
        Ok(n) => n,
        Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return Ok(vec![]),
        Err(e) => return Err(Error::io("list xattrs of", path)(e)),
    };
    let mut out = Vec::new();
    for name in names {
        if !recorded_xattr(name.as_bytes()) {
            continue;
        }
        if let Some(v) = get(&name).map_err(Error::io("read xattr of", path))? {
            out.push((name.as_bytes().to_vec(), v));
        }
    }
    out.sort();
    Ok(out)
}
