//! The one place where a store error becomes an errno for the kernel.

use cowspace_store::{Error, ErrorKind};
use fuser::Errno;

/// The errno the view answers for a store error.
///
/// `NotFound` → `ENOENT`; `Corrupt` → `EIO`, logged naming the object (the data is never
/// served); everything else → `EIO`, logged. `what` names the operation for the log.
pub fn errno_of(what: &str, err: &Error) -> Errno {
    match err.kind() {
        ErrorKind::NotFound => Errno::ENOENT,
        ErrorKind::Corrupt => {
            tracing::error!(op = what, error = %err, "corrupt store object; refusing to serve it");
            Errno::EIO
        }
        kind => {
            tracing::error!(op = what, kind = kind.as_str(), error = %err, "store read failed");
            Errno::EIO
        }
    }
}

/// The errno for a failed I/O on a blob-cache file.
pub fn errno_of_io(what: &str, err: &std::io::Error) -> Errno {
    tracing::error!(op = what, error = %err, "blob cache I/O failed");
    Errno::from_i32(err.raw_os_error().unwrap_or(nix::libc::EIO))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_map_to_errnos() {
        let nf = Error::NotFound {
            what: "tree",
            name: "x".into(),
        };
        assert_eq!(errno_of("t", &nf), Errno::ENOENT);
        let c = Error::Corrupt {
            what: "chunk",
            id: "ab".into(),
            why: "hashes to cd".into(),
        };
        assert_eq!(errno_of("t", &c), Errno::EIO);
        assert_eq!(errno_of("t", &Error::Busy("gc".into())), Errno::EIO);
    }
}
