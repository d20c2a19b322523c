//! The NFSv3 procedures (RFC 1813 section 3) and the MOUNT protocol's (appendix I),
//! answered from a [`FileSystem`] core. I/O goes by inode (handle 0): NFS has no opens.

use std::io::Cursor;

use nfs3_types::nfs3::*;
use nfs3_types::xdr_codec::{Opaque, Pack, Unpack};

use super::MAX_IO;
use super::convert::{changes, fattr, post_op, set_attr, status, time, wcc};
use super::handle::Export;
use super::perm::{self, SEARCH, WRITE, may, may_delete, may_set};
use super::rpc::Caller;
use crate::filesystem::{
    Attr, Context, DirSink, Errno, FileKind, FileSystem, Make, NAME_MAX_BYTES, RenameFlags,
    SetAttr, SetTime, with_read_buffer,
};

/// Why a call got no results.
pub enum NoAnswer {
    /// Its arguments do not parse.
    Garbage,
    /// No such procedure.
    Unavailable,
}

pub(super) type Answer = Result<(), NoAnswer>;

pub(super) fn args<T: Unpack>(cur: &mut Cursor<&[u8]>) -> Result<T, NoAnswer> {
    T::unpack(cur)
        .map(|(v, _)| v)
        .map_err(|_| NoAnswer::Garbage)
}

pub(super) fn put(out: &mut Vec<u8>, v: &impl Pack) -> Answer {
    // Packing into a Vec fails only for objects over 4 GiB, which no reply holds.
    v.pack(out).map(|_| ()).map_err(|_| NoAnswer::Garbage)
}

/// The NFSv3 program of one export.
pub struct Nfs<F: FileSystem> {
    pub fs: std::sync::Arc<F>,
    pub export: Export,
}

/// The root's inode: 1, as FUSE's.
pub const ROOT: u64 = 1;

fn to_status<T>(r: Result<T, Errno>) -> Result<T, nfsstat3> {
    r.map_err(status)
}

impl<F: FileSystem> Nfs<F> {
    pub(super) fn attr(&self, ctx: &Context, ino: u64) -> Option<Attr> {
        self.fs.getattr(ctx, ino).ok()
    }

    /// A lookup the core just took for a client: kept, or given back when the export
    /// holds the inode already.
    pub(super) fn took(&self, ino: u64) {
        if self.export.keep(ino) {
            self.fs.forget(ino, 1);
        }
    }

    /// The inode of a handle this server gave out (the root's is always valid).
    pub(super) fn ino(&self, fh: &nfs_fh3) -> Result<u64, nfsstat3> {
        let ino = self.export.ino(fh)?;
        if ino == ROOT || self.export.holds(ino) {
            Ok(ino)
        } else {
            Err(nfsstat3::NFS3ERR_STALE)
        }
    }

    /// The inode `name` names in `dir` ("." and ".." included), looked up for a client.
    pub(super) fn lookup(&self, ctx: &Context, dir: u64, name: &[u8]) -> Result<Attr, nfsstat3> {
        match name {
            b"." => to_status(self.fs.getattr(ctx, dir)),
            b".." => {
                let parent = self.parent(ctx, dir)?;
                to_status(self.fs.getattr(ctx, parent))
            }
            _ => {
                let a =
                    to_status(self.fs.lookup(ctx, dir, name))?.ok_or(nfsstat3::NFS3ERR_NOENT)?;
                self.took(a.ino);
                Ok(a)
            }
        }
    }

    /// The parent of directory `dir`: the `..` entry of its listing.
    fn parent(&self, ctx: &Context, dir: u64) -> Result<u64, nfsstat3> {
        struct Dots(Option<u64>);
        impl DirSink for Dots {
            fn add(&mut self, ino: u64, _next: u64, _kind: FileKind, name: &[u8]) -> bool {
                if name == b".." {
                    self.0 = Some(ino);
                }
                true
            }
        }
        let mut d = Dots(None);
        to_status(self.fs.readdir(ctx, dir, 1, &mut d))?;
        d.0.ok_or(nfsstat3::NFS3ERR_NOTDIR)
    }

    /// The directory of handle `fh`, if `who` may make and remove names in it.
    fn writable_dir(&self, who: &Caller, ctx: &Context, fh: &nfs_fh3) -> Result<u64, nfsstat3> {
        let dir = self.ino(fh)?;
        may(who, &to_status(self.fs.getattr(ctx, dir))?, WRITE | SEARCH)?;
        Ok(dir)
    }

    /// Applies `change` to `ino` when it changes anything.
    fn apply(&self, ctx: &Context, ino: u64, change: SetAttr) -> Result<(), nfsstat3> {
        if changes(&change) {
            to_status(self.fs.setattr(ctx, ino, 0, change))?;
        }
        Ok(())
    }

    /// Answers procedure `proc` with the arguments at `cur`, its results into `out`.
    pub fn call(
        &self,
        proc: u32,
        who: &Caller,
        ctx: &Context,
        cur: &mut Cursor<&[u8]>,
        out: &mut Vec<u8>,
    ) -> Answer {
        match proc {
            0 => Ok(()),
            1 => {
                let a: GETATTR3args = args(cur)?;
                let r = self
                    .ino(&a.object)
                    .and_then(|ino| to_status(self.fs.getattr(ctx, ino)));
                let res: GETATTR3res = match r {
                    Ok(attr) => Nfs3Result::Ok(GETATTR3resok {
                        obj_attributes: fattr(&attr),
                    }),
                    Err(s) => Nfs3Result::Err((s, nfs3_types::xdr_codec::Void)),
                };
                put(out, &res)
            }
            2 => put(out, &self.setattr(who, ctx, args(cur)?)),
            3 => put(out, &self.lookup3(ctx, args(cur)?)),
            4 => put(out, &self.access(who, ctx, args(cur)?)),
            5 => {
                let a: READLINK3args = args(cur)?;
                let r = self
                    .ino(&a.symlink)
                    .and_then(|ino| Ok((ino, to_status(self.fs.readlink(ctx, ino))?)));
                let res: READLINK3res = match r {
                    Ok((ino, t)) => Nfs3Result::Ok(READLINK3resok {
                        symlink_attributes: post_op(self.attr(ctx, ino)),
                        data: nfspath3(Opaque::owned(t)),
                    }),
                    Err(s) => Nfs3Result::Err((s, READLINK3resfail::default())),
                };
                put(out, &res)
            }
            6 => {
                let a: READ3args = args(cur)?;
                with_read_buffer(a.count.min(MAX_IO), |buf| {
                    put(out, &self.read(ctx, &a, buf))
                })
            }
            7 => put(out, &self.write(ctx, args(cur)?)),
            8 => put(out, &self.create(who, ctx, args(cur)?)),
            9 => {
                let a: MKDIR3args = args(cur)?;
                let change = set_attr(&a.attributes);
                let mode = change.mode.unwrap_or(0o755);
                put(
                    out,
                    &self.made(
                        who,
                        ctx,
                        &a.where_,
                        Make::Dir { mode },
                        SetAttr {
                            mode: None,
                            ..change
                        },
                    ),
                )
            }
            10 => {
                let a: SYMLINK3args = args(cur)?;
                let target = a.symlink.symlink_data.0.to_vec();
                let change = set_attr(&a.symlink.symlink_attributes);
                // A symlink's mode is not its own.
                let change = SetAttr {
                    mode: None,
                    ..change
                };
                put(
                    out,
                    &self.made(
                        who,
                        ctx,
                        &a.where_,
                        Make::Symlink { target: &target },
                        change,
                    ),
                )
            }
            11 => {
                let a: MKNOD3args = args(cur)?;
                let (kind, attrs, rdev) = match &a.what {
                    mknoddata3::NF3CHR(d) => (
                        libc::S_IFCHR,
                        &d.dev_attributes,
                        libc::makedev(d.spec.specdata1, d.spec.specdata2),
                    ),
                    mknoddata3::NF3BLK(d) => (
                        libc::S_IFBLK,
                        &d.dev_attributes,
                        libc::makedev(d.spec.specdata1, d.spec.specdata2),
                    ),
                    mknoddata3::NF3SOCK(s) => (libc::S_IFSOCK, s, 0),
                    mknoddata3::NF3FIFO(s) => (libc::S_IFIFO, s, 0),
                    mknoddata3::default => return Err(NoAnswer::Garbage),
                };
                let change = set_attr(attrs);
                let mode = kind | change.mode.unwrap_or(0o644);
                put(
                    out,
                    &self.made(
                        who,
                        ctx,
                        &a.where_,
                        Make::Special { mode, rdev },
                        SetAttr {
                            mode: None,
                            ..change
                        },
                    ),
                )
            }
            12 | 13 => {
                let a: REMOVE3args = args(cur)?;
                let dir = proc == 13;
                let r = self.ino(&a.object.dir).and_then(|d| {
                    let name = a.object.name.as_ref();
                    let victim = self.lookup(ctx, d, name)?;
                    may_delete(who, &to_status(self.fs.getattr(ctx, d))?, &victim)?;
                    to_status(self.fs.remove(ctx, d, name, dir)).map(|()| d)
                });
                let after = |d: Option<u64>| wcc(d.and_then(|d| self.attr(ctx, d)));
                let dir_ino = self.ino(&a.object.dir).ok();
                // RMDIR's results are REMOVE's, byte for byte: a status and the
                // directory's wcc_data.
                let res: REMOVE3res = match r {
                    Ok(d) => Nfs3Result::Ok(REMOVE3resok {
                        dir_wcc: after(Some(d)),
                    }),
                    Err(s) => Nfs3Result::Err((
                        s,
                        REMOVE3resfail {
                            dir_wcc: after(dir_ino),
                        },
                    )),
                };
                put(out, &res)
            }
            14 => put(out, &self.rename(who, ctx, args(cur)?)),
            15 => put(out, &self.link(who, ctx, args(cur)?)),
            16 => put(out, &self.readdir(ctx, args(cur)?)),
            17 => put(out, &self.readdirplus(ctx, args(cur)?)),
            18 => {
                let a: FSSTAT3args = args(cur)?;
                let r = self
                    .ino(&a.fsroot)
                    .and_then(|ino| Ok((ino, to_status(self.fs.statfs(ctx, ino))?)));
                let res: FSSTAT3res = match r {
                    Ok((ino, s)) => {
                        let b = u64::from(s.frsize.max(1));
                        Nfs3Result::Ok(FSSTAT3resok {
                            obj_attributes: post_op(self.attr(ctx, ino)),
                            tbytes: s.blocks * b,
                            fbytes: s.bfree * b,
                            abytes: s.bavail * b,
                            tfiles: s.files,
                            ffiles: s.ffree,
                            afiles: s.ffree,
                            invarsec: 0,
                        })
                    }
                    Err(st) => Nfs3Result::Err((st, FSSTAT3resfail::default())),
                };
                put(out, &res)
            }
            19 => {
                let a: FSINFO3args = args(cur)?;
                let r = self.ino(&a.fsroot);
                let res: FSINFO3res = match r {
                    Ok(ino) => Nfs3Result::Ok(FSINFO3resok {
                        obj_attributes: post_op(self.attr(ctx, ino)),
                        rtmax: MAX_IO,
                        rtpref: MAX_IO,
                        rtmult: 4096,
                        wtmax: MAX_IO,
                        wtpref: MAX_IO,
                        wtmult: 4096,
                        dtpref: 64 * 1024,
                        maxfilesize: i64::MAX as u64,
                        time_delta: nfstime3 {
                            seconds: 0,
                            nseconds: 1,
                        },
                        properties: FSF3_LINK | FSF3_SYMLINK | FSF3_HOMOGENEOUS | FSF3_CANSETTIME,
                    }),
                    Err(s) => Nfs3Result::Err((s, FSINFO3resfail::default())),
                };
                put(out, &res)
            }
            20 => {
                let a: PATHCONF3args = args(cur)?;
                let res: PATHCONF3res = match self.ino(&a.object) {
                    Ok(ino) => Nfs3Result::Ok(PATHCONF3resok {
                        obj_attributes: post_op(self.attr(ctx, ino)),
                        linkmax: u32::MAX,
                        name_max: NAME_MAX_BYTES,
                        no_trunc: true,
                        chown_restricted: true,
                        case_insensitive: false,
                        case_preserving: true,
                    }),
                    Err(s) => Nfs3Result::Err((s, PATHCONF3resfail::default())),
                };
                put(out, &res)
            }
            21 => {
                let a: COMMIT3args = args(cur)?;
                let r = self
                    .ino(&a.file)
                    .and_then(|ino| to_status(self.fs.fsync(ctx, ino, 0, false)).map(|()| ino));
                let res: COMMIT3res = match r {
                    Ok(ino) => Nfs3Result::Ok(COMMIT3resok {
                        file_wcc: wcc(self.attr(ctx, ino)),
                        verf: writeverf3(self.export.write_verifier),
                    }),
                    Err(s) => Nfs3Result::Err((
                        s,
                        COMMIT3resfail {
                            file_wcc: wcc(None),
                        },
                    )),
                };
                put(out, &res)
            }
            _ => Err(NoAnswer::Unavailable),
        }
    }

    fn setattr(&self, who: &Caller, ctx: &Context, a: SETATTR3args) -> SETATTR3res {
        let r = self.ino(&a.object).and_then(|ino| {
            let now = to_status(self.fs.getattr(ctx, ino))?;
            if let Nfs3Option::Some(guard) = a.guard {
                let ct = time(now.ctime);
                if (ct.seconds, ct.nseconds) != (guard.seconds, guard.nseconds) {
                    return Err(nfsstat3::NFS3ERR_NOT_SYNC);
                }
            }
            let change = set_attr(&a.new_attributes);
            may_set(who, &now, &change)?;
            to_status(self.fs.setattr(ctx, ino, 0, change))
        });
        match r {
            Ok(attr) => Nfs3Result::Ok(SETATTR3resok {
                obj_wcc: wcc(Some(attr)),
            }),
            Err(s) => {
                let after = self.ino(&a.object).ok().and_then(|i| self.attr(ctx, i));
                Nfs3Result::Err((
                    s,
                    SETATTR3resfail {
                        obj_wcc: wcc(after),
                    },
                ))
            }
        }
    }

    fn lookup3(&self, ctx: &Context, a: LOOKUP3args) -> LOOKUP3res {
        let dir = match self.ino(&a.what.dir) {
            Ok(d) => d,
            Err(s) => return Nfs3Result::Err((s, LOOKUP3resfail::default())),
        };
        match self.lookup(ctx, dir, a.what.name.as_ref()) {
            Ok(attr) => Nfs3Result::Ok(LOOKUP3resok {
                object: self.export.handle(attr.ino),
                obj_attributes: post_op(Some(attr)),
                dir_attributes: post_op(self.attr(ctx, dir)),
            }),
            Err(s) => Nfs3Result::Err((
                s,
                LOOKUP3resfail {
                    dir_attributes: post_op(self.attr(ctx, dir)),
                },
            )),
        }
    }

    /// What the caller may do to the object, from its mode bits (the server's own rule:
    /// root may do anything but execute what no one may).
    fn access(&self, who: &Caller, ctx: &Context, a: ACCESS3args) -> ACCESS3res {
        let attr = match self
            .ino(&a.object)
            .and_then(|i| to_status(self.fs.getattr(ctx, i)))
        {
            Ok(x) => x,
            Err(s) => return Nfs3Result::Err((s, ACCESS3resfail::default())),
        };
        let bits = perm::bits(who, &attr);
        let dir = attr.kind == FileKind::Directory;
        let mut ok = 0;
        if bits & 4 != 0 {
            ok |= ACCESS3_READ;
        }
        if bits & 2 != 0 {
            ok |= ACCESS3_MODIFY | ACCESS3_EXTEND;
            if dir {
                ok |= ACCESS3_DELETE;
            }
        }
        if bits & 1 != 0 {
            ok |= if dir { ACCESS3_LOOKUP } else { ACCESS3_EXECUTE };
        }
        Nfs3Result::Ok(ACCESS3resok {
            obj_attributes: post_op(Some(attr)),
            access: a.access & ok,
        })
    }

    /// A READ into `buf` (the serving thread's kept buffer: no allocation per call).
    fn read<'b>(&self, ctx: &Context, a: &READ3args, buf: &'b mut [u8]) -> READ3res<'b> {
        let r = self.ino(&a.file).and_then(|ino| {
            let attr = to_status(self.fs.getattr(ctx, ino))?;
            if attr.kind == FileKind::Directory {
                return Err(nfsstat3::NFS3ERR_ISDIR);
            }
            let n = to_status(self.fs.read(ctx, ino, 0, a.offset, buf))?;
            let eof = a.offset + n as u64 >= attr.size;
            Ok((attr, n, eof))
        });
        match r {
            Ok((attr, n, eof)) => Nfs3Result::Ok(READ3resok {
                file_attributes: post_op(Some(attr)),
                count: n as u32,
                eof,
                data: Opaque::borrowed(&buf[..n]),
            }),
            Err(s) => Nfs3Result::Err((s, READ3resfail::default())),
        }
    }

    /// A write: `UNSTABLE` ones reach the upper file (the host's page cache) and are
    /// made durable by `COMMIT`; the others are synced before the reply.
    fn write(&self, ctx: &Context, a: WRITE3args) -> WRITE3res {
        let count = (a.count as usize).min(a.data.len());
        let r = self.ino(&a.file).and_then(|ino| {
            to_status(self.fs.write(ctx, ino, 0, a.offset, &a.data[..count]))?;
            let committed = match a.stable {
                stable_how::UNSTABLE => stable_how::UNSTABLE,
                how => {
                    to_status(self.fs.fsync(ctx, ino, 0, how == stable_how::DATA_SYNC))?;
                    how
                }
            };
            Ok((ino, committed))
        });
        match r {
            Ok((ino, committed)) => Nfs3Result::Ok(WRITE3resok {
                file_wcc: wcc(self.attr(ctx, ino)),
                count: count as u32,
                committed,
                verf: writeverf3(self.export.write_verifier),
            }),
            Err(s) => Nfs3Result::Err((s, WRITE3resfail::default())),
        }
    }

    /// CREATE; its results are MKDIR's, byte for byte (the new handle, its attributes,
    /// the directory's wcc_data).
    fn create(&self, who: &Caller, ctx: &Context, a: CREATE3args) -> MKDIR3res {
        let dir = match self.writable_dir(who, ctx, &a.where_.dir) {
            Ok(d) => d,
            Err(s) => return Nfs3Result::Err((s, MKDIR3resfail::default())),
        };
        let name = a.where_.name.as_ref();
        let r = match &a.how {
            createhow3::UNCHECKED(s) | createhow3::GUARDED(s) => {
                let change = set_attr(s);
                let made = self.fs.make(
                    ctx,
                    dir,
                    name,
                    Make::File {
                        mode: change.mode.unwrap_or(0o644),
                    },
                );
                match made {
                    Ok(attr) => {
                        self.took(attr.ino);
                        self.apply(
                            ctx,
                            attr.ino,
                            SetAttr {
                                mode: None,
                                ..change
                            },
                        )
                        .map(|()| attr.ino)
                    }
                    // UNCHECKED: an existing file is opened, its size set as asked.
                    Err(e) if e == Errno::EEXIST && matches!(a.how, createhow3::UNCHECKED(_)) => {
                        self.lookup(ctx, dir, name).and_then(|attr| {
                            let size = SetAttr {
                                size: change.size,
                                ..SetAttr::default()
                            };
                            self.apply(ctx, attr.ino, size).map(|()| attr.ino)
                        })
                    }
                    Err(e) => Err(status(e)),
                }
            }
            createhow3::EXCLUSIVE(verf) => {
                // The verifier is kept as the file's times until the client's SETATTR;
                // a retransmitted create finds it there and succeeds.
                let v = u64::from_be_bytes(verf.0);
                let stamp = std::time::UNIX_EPOCH
                    + std::time::Duration::new(v >> 32, (v & 0xffff_ffff) as u32 % 1_000_000_000);
                match self.fs.make(ctx, dir, name, Make::File { mode: 0o600 }) {
                    Ok(attr) => {
                        self.took(attr.ino);
                        let t = SetAttr {
                            atime: Some(SetTime::At(stamp)),
                            mtime: Some(SetTime::At(stamp)),
                            ..SetAttr::default()
                        };
                        self.apply(ctx, attr.ino, t).map(|()| attr.ino)
                    }
                    Err(e) if e == Errno::EEXIST => self.lookup(ctx, dir, name).and_then(|attr| {
                        if time(attr.mtime) == time(stamp) {
                            Ok(attr.ino)
                        } else {
                            Err(nfsstat3::NFS3ERR_EXIST)
                        }
                    }),
                    Err(e) => Err(status(e)),
                }
            }
        };
        self.new_object(ctx, r, dir)
    }

    /// MKDIR, SYMLINK and MKNOD: `what` made at `at`, then `change` applied.
    fn made(
        &self,
        who: &Caller,
        ctx: &Context,
        at: &diropargs3,
        what: Make<'_>,
        change: SetAttr,
    ) -> MKDIR3res {
        let dir = match self.writable_dir(who, ctx, &at.dir) {
            Ok(d) => d,
            Err(s) => return Nfs3Result::Err((s, MKDIR3resfail::default())),
        };
        let r = to_status(self.fs.make(ctx, dir, at.name.as_ref(), what)).and_then(|attr| {
            self.took(attr.ino);
            self.apply(ctx, attr.ino, change).map(|()| attr.ino)
        });
        self.new_object(ctx, r, dir)
    }

    /// The results of a call that made object `r` in `dir` (CREATE, MKDIR, SYMLINK, MKNOD
    /// encode them alike).
    fn new_object(&self, ctx: &Context, r: Result<u64, nfsstat3>, dir: u64) -> MKDIR3res {
        match r {
            Ok(ino) => Nfs3Result::Ok(MKDIR3resok {
                obj: post_op_fh3::Some(self.export.handle(ino)),
                obj_attributes: post_op(self.attr(ctx, ino)),
                dir_wcc: wcc(self.attr(ctx, dir)),
            }),
            Err(s) => Nfs3Result::Err((
                s,
                MKDIR3resfail {
                    dir_wcc: wcc(self.attr(ctx, dir)),
                },
            )),
        }
    }

    fn rename(&self, who: &Caller, ctx: &Context, a: RENAME3args) -> RENAME3res {
        let dirs = self.ino(&a.from.dir).and_then(|f| {
            let t = self.writable_dir(who, ctx, &a.to.dir)?;
            let victim = self.lookup(ctx, f, a.from.name.as_ref())?;
            may_delete(who, &to_status(self.fs.getattr(ctx, f))?, &victim)?;
            if let Ok(replaced) = self.lookup(ctx, t, a.to.name.as_ref()) {
                may_delete(who, &to_status(self.fs.getattr(ctx, t))?, &replaced)?;
            }
            Ok((f, t))
        });
        let r = dirs.and_then(|(f, t)| {
            to_status(self.fs.rename(
                ctx,
                f,
                a.from.name.as_ref(),
                t,
                a.to.name.as_ref(),
                RenameFlags::default(),
            ))
        });
        let from = wcc(self.ino(&a.from.dir).ok().and_then(|d| self.attr(ctx, d)));
        let to = wcc(self.ino(&a.to.dir).ok().and_then(|d| self.attr(ctx, d)));
        match r {
            Ok(()) => Nfs3Result::Ok(RENAME3resok {
                fromdir_wcc: from,
                todir_wcc: to,
            }),
            Err(s) => Nfs3Result::Err((
                s,
                RENAME3resfail {
                    fromdir_wcc: from,
                    todir_wcc: to,
                },
            )),
        }
    }

    fn link(&self, who: &Caller, ctx: &Context, a: LINK3args) -> LINK3res {
        let r = self.ino(&a.file).and_then(|ino| {
            let dir = self.writable_dir(who, ctx, &a.link.dir)?;
            let attr = to_status(
                self.fs
                    .make(ctx, dir, a.link.name.as_ref(), Make::Link { ino }),
            )?;
            self.took(attr.ino);
            Ok((attr, dir))
        });
        match r {
            Ok((attr, dir)) => Nfs3Result::Ok(LINK3resok {
                file_attributes: post_op(Some(attr)),
                linkdir_wcc: wcc(self.attr(ctx, dir)),
            }),
            Err(s) => Nfs3Result::Err((
                s,
                LINK3resfail {
                    file_attributes: post_op(
                        self.ino(&a.file).ok().and_then(|i| self.attr(ctx, i)),
                    ),
                    linkdir_wcc: wcc(None),
                },
            )),
        }
    }
}
