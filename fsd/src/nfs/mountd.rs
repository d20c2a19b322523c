//! The MOUNT program (RFC 1813 appendix I): `MNT` of the export's path (or a directory
//! below it) gives its handle; nothing is listed.

use std::io::Cursor;

use nfs3_types::mount::{dirpath, fhandle3, mountres3, mountres3_ok, mountstat3};
use nfs3_types::xdr_codec::Opaque;

use super::proc::{Answer, Nfs, NoAnswer, ROOT, args, put};
use crate::filesystem::{Context, FileKind, FileSystem};

impl<F: FileSystem> Nfs<F> {
    /// The directory `path` names: the export's path, or a directory below it (as a
    /// client mounting a subdirectory asks).
    fn mount_point(&self, path: &[u8]) -> Option<u64> {
        let export = self.export.path();
        let rest = path.strip_prefix(export.as_bytes())?;
        if !rest.is_empty() && !rest.starts_with(b"/") {
            return None;
        }
        let ctx = Context {
            uid: 0,
            gid: 0,
            pid: 0,
        };
        let mut ino = ROOT;
        for part in rest.split(|b| *b == b'/').filter(|p| !p.is_empty()) {
            if part == b"." || part == b".." {
                return None;
            }
            let a = self.lookup(&ctx, ino, part).ok()?;
            if a.kind != FileKind::Directory {
                return None;
            }
            ino = a.ino;
        }
        Some(ino)
    }

    /// The MOUNT program: `MNT` of the export's path gives the root's handle.
    pub fn mount(&self, proc: u32, cur: &mut Cursor<&[u8]>, out: &mut Vec<u8>) -> Answer {
        match proc {
            0 => Ok(()),
            1 => {
                let path: dirpath = args(cur)?;
                let res = match self.mount_point(path.0.as_ref()) {
                    Some(ino) => mountres3::Ok(mountres3_ok {
                        fhandle: fhandle3(Opaque::owned(self.export.handle(ino).data.to_vec())),
                        auth_flavors: vec![nfs3_types::rpc::auth_flavor::AUTH_UNIX as u32],
                    }),
                    // Not this export: the same answer as a path that does not exist,
                    // whatever the caller guessed.
                    None => mountres3::Err(mountstat3::MNT3ERR_NOENT),
                };
                put(out, &res)
            }
            // DUMP: no list of mounts is kept; EXPORT: the path is a capability, never listed.
            2 | 5 => put(out, &false),
            3 => {
                let _: dirpath = args(cur)?;
                Ok(())
            }
            4 => Ok(()),
            _ => Err(NoAnswer::Unavailable),
        }
    }
}
