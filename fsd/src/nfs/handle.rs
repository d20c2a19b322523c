//! File handles and the export's identity. A handle is the export's key (16 random
//! bytes, the capability to use the export: only the mounter learns it, from the mount
//! path) and the core's inode number. Handles do not survive a daemon restart yet: the
//! next daemon has other keys, and its cores know only the inodes looked up again.

use std::collections::HashSet;
use std::sync::Mutex;

use nfs3_types::nfs3::{nfs_fh3, nfsstat3};
use nfs3_types::xdr_codec::Opaque;

use crate::filesystem::lock;

/// Length of every handle this server makes.
const HANDLE_LEN: usize = 24;

/// One export: its key, the inodes clients were given, and its write verifier.
pub struct Export {
    key: [u8; 16],
    /// Inodes a client holds a handle of, each holding one lookup in the core (NFS has
    /// no `forget`: they are held while the export is served).
    held: Mutex<HashSet<u64>>,
    /// Changes with every server instance, so clients send again what a restart may
    /// have lost of their unstable writes.
    pub write_verifier: [u8; 8],
}

impl Export {
    pub fn new(key: [u8; 16], write_verifier: [u8; 8]) -> Export {
        Export {
            key,
            held: Mutex::default(),
            write_verifier,
        }
    }

    /// The export's path for `MNT`: the key as hex (a capability, like the handles).
    pub fn path(&self) -> String {
        format!("/{}", hex::encode(self.key))
    }

    /// The handle of `ino`.
    pub fn handle(&self, ino: u64) -> nfs_fh3 {
        let mut h = Vec::with_capacity(HANDLE_LEN);
        h.extend_from_slice(&self.key);
        h.extend_from_slice(&ino.to_le_bytes());
        nfs_fh3 {
            data: Opaque::owned(h),
        }
    }

    /// The inode of handle `fh`: `BADHANDLE` when it is none of this server's shape,
    /// `STALE` when it is another export's (or another daemon's).
    pub fn ino(&self, fh: &nfs_fh3) -> Result<u64, nfsstat3> {
        let d = fh.data.as_ref();
        if d.len() != HANDLE_LEN {
            return Err(nfsstat3::NFS3ERR_BADHANDLE);
        }
        if d[..16] != self.key {
            return Err(nfsstat3::NFS3ERR_STALE);
        }
        let mut n = [0u8; 8];
        n.copy_from_slice(&d[16..]);
        Ok(u64::from_le_bytes(n))
    }

    /// `ino` was looked up once more for a client: whether that lookup is to be given
    /// back (the export already holds one).
    pub fn keep(&self, ino: u64) -> bool {
        !lock(&self.held).insert(ino)
    }

    /// Whether a client was given a handle of `ino` by this server.
    pub fn holds(&self, ino: u64) -> bool {
        lock(&self.held).contains(&ino)
    }
}
