//! READDIR and READDIRPLUS: a directory's entries from any cookie (the core's offsets,
//! which are functions of the name, so a listing resumed while the directory changes
//! shows each remaining name once), as many as the client's byte budget takes.

use nfs3_types::nfs3::*;
use nfs3_types::xdr_codec::List;

use super::MAX_IO;
use super::convert::{fattr, post_op, status};
use super::handle::Export;
use super::proc::Nfs;
use crate::filesystem::{Attr, Context, DirPlusSink, DirSink, FileKind, FileSystem};

/// Directory listings' reply budget: bytes of an entry besides its name (fileid, name
/// length, cookie, the list's "more" word).
const ENTRY_BYTES: usize = 8 + 4 + 8 + 4;
/// ... and with attributes and a handle (`fattr3` 84, the handle 4 + 24, two "present"
/// words).
const ENTRY_PLUS_BYTES: usize = ENTRY_BYTES + 4 + 84 + 4 + 4 + 24;

impl<F: FileSystem> Nfs<F> {
    pub(super) fn readdir(&self, ctx: &Context, a: READDIR3args) -> READDIR3res<'static> {
        struct Sink {
            entries: Vec<entry3<'static>>,
            room: usize,
            full: bool,
        }
        impl DirSink for Sink {
            fn add(&mut self, ino: u64, next: u64, _kind: FileKind, name: &[u8]) -> bool {
                let size = ENTRY_BYTES + name.len().div_ceil(4) * 4;
                if size > self.room {
                    self.full = true;
                    return true;
                }
                self.room -= size;
                self.entries.push(entry3 {
                    fileid: ino,
                    name: filename3::from(name.to_vec()),
                    cookie: next,
                });
                false
            }
        }
        let dir = match self.ino(&a.dir) {
            Ok(d) => d,
            Err(s) => return Nfs3Result::Err((s, READDIR3resfail::default())),
        };
        // The reply's header (status, attributes, verifier, eof) out of the budget.
        let room = (a.count.min(MAX_IO) as usize).saturating_sub(128);
        let mut sink = Sink {
            entries: Vec::new(),
            room,
            full: false,
        };
        match self.fs.readdir(ctx, dir, a.cookie, &mut sink) {
            Ok(()) if sink.full && sink.entries.is_empty() => {
                Nfs3Result::Err((nfsstat3::NFS3ERR_TOOSMALL, READDIR3resfail::default()))
            }
            Ok(()) => Nfs3Result::Ok(READDIR3resok {
                dir_attributes: post_op(self.attr(ctx, dir)),
                cookieverf: cookieverf3::default(),
                reply: dirlist3 {
                    eof: !sink.full,
                    entries: List(sink.entries),
                },
            }),
            Err(e) => Nfs3Result::Err((
                status(e),
                READDIR3resfail {
                    dir_attributes: post_op(self.attr(ctx, dir)),
                },
            )),
        }
    }

    pub(super) fn readdirplus(
        &self,
        ctx: &Context,
        a: READDIRPLUS3args,
    ) -> READDIRPLUS3res<'static> {
        struct Sink<'e> {
            export: &'e Export,
            entries: Vec<entryplus3<'static>>,
            room: usize,
            full: bool,
            took: Vec<u64>,
        }
        impl DirPlusSink for Sink<'_> {
            fn add(&mut self, next: u64, name: &[u8], attr: &Attr) -> bool {
                let size = ENTRY_PLUS_BYTES + name.len().div_ceil(4) * 4;
                if size > self.room {
                    self.full = true;
                    return true;
                }
                self.room -= size;
                // "." and ".." take no lookup: no handle is given for them.
                let dots = name == b"." || name == b"..";
                if !dots {
                    self.took.push(attr.ino);
                }
                self.entries.push(entryplus3 {
                    fileid: attr.ino,
                    name: filename3::from(name.to_vec()),
                    cookie: next,
                    name_attributes: post_op_attr::Some(fattr(attr)),
                    name_handle: if dots {
                        post_op_fh3::None
                    } else {
                        post_op_fh3::Some(self.export.handle(attr.ino))
                    },
                });
                false
            }
        }
        let dir = match self.ino(&a.dir) {
            Ok(d) => d,
            Err(s) => return Nfs3Result::Err((s, READDIRPLUS3resfail::default())),
        };
        let room = (a.maxcount.min(MAX_IO) as usize).saturating_sub(128);
        let mut sink = Sink {
            export: &self.export,
            entries: Vec::new(),
            room,
            full: false,
            took: Vec::new(),
        };
        let r = self.fs.readdirplus(ctx, dir, a.cookie, &mut sink);
        for ino in std::mem::take(&mut sink.took) {
            self.took(ino);
        }
        match r {
            Ok(()) if sink.full && sink.entries.is_empty() => {
                Nfs3Result::Err((nfsstat3::NFS3ERR_TOOSMALL, READDIRPLUS3resfail::default()))
            }
            Ok(()) => Nfs3Result::Ok(READDIRPLUS3resok {
                dir_attributes: post_op(self.attr(ctx, dir)),
                cookieverf: cookieverf3::default(),
                reply: dirlistplus3 {
                    eof: !sink.full,
                    entries: List(sink.entries),
                },
            }),
            Err(e) => Nfs3Result::Err((
                status(e),
                READDIRPLUS3resfail {
                    dir_attributes: post_op(self.attr(ctx, dir)),
                },
            )),
        }
    }
}
