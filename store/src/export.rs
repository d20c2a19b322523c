//! Export of a snapshot to a directory or a tar archive, byte-identical to what was
//! imported (contents, modes, symlinks, hard links, empty directories, xattrs).
//!
//! But for what an import of a git checkout adds for workspaces (docs/git.md): the
//! fsmonitor lines appended to `.git/config` and the fsmonitor extension given to
//! `.git/index` are taken out again (both together, and only while still exactly as
//! written: [`Store::as_imported`]). The index's stat data stays as the import rewrote it
//! for workspaces; it never matches an export's new files anyway, so git checks them
//! once, as after any copy of a checkout.
//!
//! Nothing is half-made: the directory is built under a temporary name beside DEST and
//! renamed into place at the end; the archive likewise. A corrupt object stops the export
//! with `Corrupt` and removes the partial output.

use std::collections::HashMap;
use std::fs;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::content::from_io;
use crate::error::{Error, Result};
use crate::id::{SnapshotId, TreeId};
use crate::store::Store;
use crate::tree::{Kind, Target, join_path};

/// Renames the finished `tmp` to `dest`, refusing a `dest` that has appeared meanwhile.
fn rename_into_place(tmp: &Path, dest: &Path) -> Result<()> {
    if fs::symlink_metadata(dest).is_ok() {
        return Err(Error::DestinationExists {
            what: "export destination",
            path: dest.into(),
        });
    }
    fs::rename(tmp, dest).map_err(Error::io("rename into place", dest))
}

/// Removes a partially written directory, making read-only directories writable first.
pub(crate) fn remove_tree(path: &Path) {
    fn open_up(p: &Path) {
        if let Ok(m) = fs::symlink_metadata(p)
            && m.is_dir()
        {
            let _ = fs::set_permissions(p, fs::Permissions::from_mode(0o700));
            if let Ok(rd) = fs::read_dir(p) {
                for e in rd.flatten() {
                    open_up(&e.path());
                }
            }
        }
    }
    open_up(path);
    let _ = fs::remove_dir_all(path);
}

fn tmp_beside(dest: &Path) -> Result<PathBuf> {
    let name = dest
        .file_name()
        .ok_or_else(|| Error::Invalid(format!("{} has no file name", dest.display())))?;
    let parent = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !parent.is_dir() {
        return Err(Error::not_found("directory", parent.display().to_string()));
    }
    let mut tmp = std::ffi::OsString::from(".");
    tmp.push(name);
    tmp.push(format!(".cowspace-tmp-{}", std::process::id()));
    Ok(parent.join(tmp))
}

fn check_dest(dest: &Path) -> Result<()> {
    if fs::symlink_metadata(dest).is_ok() {
        return Err(Error::DestinationExists {
            what: "export destination",
            path: dest.into(),
        });
    }
    Ok(())
}

/// Files an export writes with other bytes than the stored ones, by path.
type Substitutes = HashMap<Vec<u8>, Vec<u8>>;

impl Store {
    /// The files of the snapshot with root `root` an export gives back as the import
    /// found them (the module's doc): `.git/config` without the fsmonitor lines and
    /// `.git/index` without the fsmonitor extension an import added, when both are still
    /// as written. Empty for anything else.
    pub fn as_imported(&self, root: &TreeId) -> Result<Substitutes> {
        use crate::import::gitindex;
        let mut out = Substitutes::new();
        let Some(git) = self
            .tree(root)?
            .get(b".git")
            .filter(|e| e.kind == Kind::Dir)
            .and_then(|e| e.subtree())
        else {
            return Ok(out);
        };
        let git = self.tree(&git)?;
        let file = |name: &[u8]| -> Result<Option<Vec<u8>>> {
            match git.get(name).map(|e| e.target()) {
                Some(Target::File(c)) => Ok(Some(self.read_content(&c)?)),
                _ => Ok(None),
            }
        };
        let (Some(config), Some(index)) = (file(b"config")?, file(b"index")?) else {
            return Ok(out);
        };
        let ours = gitindex::fsmonitor_token(&index)
            .is_some_and(|t| t.starts_with(gitindex::FSMONITOR_TOKEN_PREFIX));
        let config = String::from_utf8(config)
            .ok()
            .and_then(|c| gitindex::strip_fsmonitor_config(&c));
        let index = gitindex::rewrite_marking(&index, |_, _| None)
            .and_then(|r| gitindex::without_fsmonitor(&r));
        if let (true, Some(config), Some(index)) = (ours, config, index) {
            out.insert(b".git/config".to_vec(), config.into_bytes());
            out.insert(b".git/index".to_vec(), index);
        }
        Ok(out)
    }

    /// Writes the snapshot's tree to a new directory `dest` (which must not exist).
    pub fn export_dir(&self, snapshot: &SnapshotId, dest: &Path) -> Result<()> {
        check_dest(dest)?;
        let snap = self.snapshot(snapshot)?;
        let subst = self.as_imported(&snap.root)?;
        let tmp = tmp_beside(dest)?;
        let result = (|| {
            fs::create_dir(&tmp).map_err(Error::io("create directory", &tmp))?;
            let mut links = SymlinkLinks::new();
            self.export_tree(&snap.root, &tmp, &tmp, b"", &subst, &mut links)?;
            set_xattrs(&tmp, &snap.root_xattrs)?;
            fs::set_permissions(&tmp, fs::Permissions::from_mode(snap.root_mode))
                .map_err(Error::io("chmod", &tmp))?;
            rename_into_place(&tmp, dest)
        })();
        if result.is_err() {
            remove_tree(&tmp);
        }
        result
    }

    /// Writes tree `id` into `dir`, which is `rel` (`/`-separated, empty for the top)
    /// under the export's top directory `top`.
    fn export_tree(
        &self,
        id: &TreeId,
        dir: &Path,
        top: &Path,
        rel: &[u8],
        subst: &Substitutes,
        links: &mut SymlinkLinks,
    ) -> Result<()> {
        let tree = self.tree(id)?;
        for e in &tree.entries {
            let path = dir.join(std::ffi::OsStr::from_bytes(&e.name));
            let rel = join_path(rel, &e.name);
            match e.target() {
                Target::Dir(sub) => {
                    fs::create_dir(&path).map_err(Error::io("create directory", &path))?;
                    self.export_tree(&sub, &path, top, &rel, subst, links)?;
                    set_xattrs(&path, &e.xattrs)?;
                    fs::set_permissions(&path, fs::Permissions::from_mode(e.mode))
                        .map_err(Error::io("chmod", &path))?;
                }
                Target::File(content) => {
                    let mut f = fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(&path)
                        .map_err(Error::io("create file", &path))?;
                    if let Some(bytes) = subst.get(&rel) {
                        f.write_all(bytes).map_err(Error::io("write", &path))?;
                    } else {
                        let mut r = self.content_reader(&content)?;
                        let n = io::copy(&mut r, &mut f).map_err(|err| from_io(err, &path))?;
                        if n != e.size {
                            return Err(Error::corrupt(
                                "tree",
                                id,
                                format!("entry {:?} says {} bytes, content has {n}", path, e.size),
                            ));
                        }
                    }
                    f.flush().map_err(Error::io("write", &path))?;
                    drop(f);
                    set_xattrs(&path, &e.xattrs)?;
                    fs::set_permissions(&path, fs::Permissions::from_mode(e.mode))
                        .map_err(Error::io("chmod", &path))?;
                }
                Target::Hardlink(_) => {
                    let primary = top.join(std::ffi::OsStr::from_bytes(&e.data));
                    fs::hard_link(&primary, &path).map_err(Error::io("hard link", &path))?;
                }
                Target::Symlink => match e.link_group().and_then(|g| links.get(&g)) {
                    // A further name of a symlink: a link of the symlink itself
                    // (`hard_link` is `linkat` without `AT_SYMLINK_FOLLOW`).
                    Some(first) => {
                        let first = top.join(std::ffi::OsStr::from_bytes(first));
                        fs::hard_link(&first, &path).map_err(Error::io("hard link", &path))?;
                    }
                    None => {
                        std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(&e.data), &path)
                            .map_err(Error::io("create symlink", &path))?;
                        if let Some(g) = e.link_group() {
                            links.insert(g, rel.clone());
                        }
                    }
                },
                Target::Fifo | Target::CharDevice | Target::BlockDevice => {
                    create_special(&path, e)?
                }
            }
        }
        Ok(())
    }

    /// Writes the snapshot as a tar archive to a new file `dest` (which must not exist).
    pub fn export_tar(&self, snapshot: &SnapshotId, dest: &Path) -> Result<()> {
        check_dest(dest)?;
        let snap = self.snapshot(snapshot)?;
        let subst = self.as_imported(&snap.root)?;
        let tmp = tmp_beside(dest)?;
        let result = (|| {
            let file = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)
                .map_err(Error::io("create archive", &tmp))?;
            let w = self.tar_snapshot(&snap, &subst, io::BufWriter::new(file), &tmp)?;
            let file = w
                .into_inner()
                .map_err(|e| Error::io("write archive", &tmp)(e.into_error()))?;
            file.sync_all().map_err(Error::io("sync archive", &tmp))?;
            rename_into_place(&tmp, dest)
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result
    }

    /// Writes the snapshot as a tar archive to `out` (stdout, say) and gives it back;
    /// `label` names it in errors. What a reader has of a failed write is half an
    /// archive: only [`Store::export_tar`] makes the whole or nothing.
    pub fn export_tar_to<W: Write>(
        &self,
        snapshot: &SnapshotId,
        out: W,
        label: &Path,
    ) -> Result<W> {
        let snap = self.snapshot(snapshot)?;
        let subst = self.as_imported(&snap.root)?;
        let mut w = self.tar_snapshot(&snap, &subst, out, label)?;
        w.flush().map_err(Error::io("write archive", label))?;
        Ok(w)
    }

    fn tar_snapshot<W: Write>(
        &self,
        snap: &crate::snapshot::Snapshot,
        subst: &Substitutes,
        out: W,
        label: &Path,
    ) -> Result<W> {
        let mut b = tar::Builder::new(out);
        let mut root = tar::Header::new_gnu();
        root.set_entry_type(tar::EntryType::Directory);
        root.set_mode(snap.root_mode);
        root.set_size(0);
        root.set_mtime(snap.created_at.max(0) as u64);
        b.append_data(&mut root, "./", io::empty())
            .map_err(Error::io("write archive", label))?;
        let mtime = snap.created_at.max(0) as u64;
        let mut cx = TarCx {
            subst,
            links: SymlinkLinks::new(),
        };
        self.tar_tree(&mut b, &snap.root, &[], mtime, label, &mut cx)?;
        b.into_inner().map_err(Error::io("write archive", label))
    }

    fn tar_tree<W: Write>(
        &self,
        b: &mut tar::Builder<W>,
        id: &TreeId,
        prefix: &[u8],
        mtime: u64,
        archive: &Path,
        cx: &mut TarCx<'_>,
    ) -> Result<()> {
        let subst = cx.subst;
        let tree = self.tree(id)?;
        let werr = |e| Error::io("write archive", archive)(e);
        for e in &tree.entries {
            let mut path = prefix.to_vec();
            if !path.is_empty() {
                path.push(b'/');
            }
            path.extend_from_slice(&e.name);
            let p = Path::new(std::ffi::OsStr::from_bytes(&path));
            if !e.xattrs.is_empty() {
                append_pax_xattrs(b, &e.xattrs).map_err(werr)?;
            }
            let mut h = tar::Header::new_gnu();
            h.set_mode(e.mode);
            h.set_mtime(mtime);
            h.set_uid(0);
            h.set_gid(0);
            h.set_size(0);
            match e.target() {
                Target::Dir(sub) => {
                    h.set_entry_type(tar::EntryType::Directory);
                    let mut dirpath = path.clone();
                    dirpath.push(b'/');
                    b.append_data(
                        &mut h,
                        Path::new(std::ffi::OsStr::from_bytes(&dirpath)),
                        io::empty(),
                    )
                    .map_err(werr)?;
                    self.tar_tree(b, &sub, &path, mtime, archive, cx)?;
                }
                Target::File(content) => {
                    h.set_entry_type(tar::EntryType::Regular);
                    if let Some(bytes) = subst.get(&path) {
                        h.set_size(bytes.len() as u64);
                        b.append_data(&mut h, p, &bytes[..]).map_err(werr)?;
                    } else {
                        h.set_size(e.size);
                        let r = self.content_reader(&content)?;
                        b.append_data(&mut h, p, r)
                            .map_err(|err| from_io(err, archive))?;
                    }
                }
                Target::Hardlink(_) => {
                    h.set_entry_type(tar::EntryType::Link);
                    b.append_link(&mut h, p, Path::new(std::ffi::OsStr::from_bytes(&e.data)))
                        .map_err(werr)?;
                }
                Target::Symlink => match e.link_group().and_then(|g| cx.links.get(&g)) {
                    // A further name of a symlink: a tar hard link to its first name
                    // (extracted by `link(2)`, which links the symlink itself).
                    Some(first) => {
                        h.set_entry_type(tar::EntryType::Link);
                        b.append_link(&mut h, p, Path::new(std::ffi::OsStr::from_bytes(first)))
                            .map_err(werr)?;
                    }
                    None => {
                        h.set_entry_type(tar::EntryType::Symlink);
                        append_symlink(b, &mut h, p, &e.data).map_err(werr)?;
                        if let Some(g) = e.link_group() {
                            cx.links.insert(g, path.clone());
                        }
                    }
                },
                Target::Fifo | Target::CharDevice | Target::BlockDevice => {
                    h.set_entry_type(match e.kind {
                        Kind::Fifo => tar::EntryType::Fifo,
                        Kind::CharDevice => tar::EntryType::Char,
                        _ => tar::EntryType::Block,
                    });
                    if let Some(rdev) = e.rdev() {
                        let (maj, min) = (libc::major(rdev), libc::minor(rdev));
                        h.set_device_major(maj).map_err(werr)?;
                        h.set_device_minor(min).map_err(werr)?;
                    }
                    b.append_data(&mut h, p, io::empty()).map_err(werr)?;
                }
            }
        }
        Ok(())
    }
}

/// The first name written of each multiply-linked symlink, by its link group
/// ([`crate::tree::Entry::link_group`]): its further names are links to it.
type SymlinkLinks = std::collections::HashMap<[u8; 32], Vec<u8>>;

/// What a tar export carries from directory to directory.
struct TarCx<'a> {
    subst: &'a Substitutes,
    links: SymlinkLinks,
}

/// Appends a symlink with its target byte for byte: `append_link` would normalise it
/// (`./x` and `a//b` are valid targets that must come back unchanged). A target longer
/// than the header field goes in a GNU long-link record, as GNU tar writes it.
fn append_symlink<W: Write>(
    b: &mut tar::Builder<W>,
    h: &mut tar::Header,
    path: &Path,
    target: &[u8],
) -> io::Result<()> {
    const LINKNAME_BYTES: usize = 100;
    if target.len() > LINKNAME_BYTES {
        let mut k = tar::Header::new_gnu();
        k.as_old_mut().name[..13].copy_from_slice(b"././@LongLink");
        k.set_entry_type(tar::EntryType::GNULongLink);
        k.set_mode(0o644);
        k.set_uid(0);
        k.set_gid(0);
        k.set_mtime(0);
        k.set_size(target.len() as u64 + 1);
        k.set_cksum();
        b.append(&k, [target, b"\0"].concat().as_slice())?;
    }
    h.set_link_name_literal(&target[..target.len().min(LINKNAME_BYTES)])?;
    b.append_data(h, path, io::empty())
}

/// Creates the fifo or device node `e` at `path` with its exact permission bits (not
/// masked by the umask).
pub fn create_special(path: &Path, e: &crate::tree::Entry) -> Result<()> {
    let mode = nix::sys::stat::Mode::from_bits_truncate(e.mode);
    match e.kind {
        Kind::Fifo => nix::unistd::mkfifo(path, mode)
            .map_err(|errno| Error::io("create fifo", path)(errno.into()))?,
        Kind::CharDevice | Kind::BlockDevice => {
            let sflag = if e.kind == Kind::CharDevice {
                nix::sys::stat::SFlag::S_IFCHR
            } else {
                nix::sys::stat::SFlag::S_IFBLK
            };
            nix::sys::stat::mknod(path, sflag, mode, e.rdev().unwrap_or(0))
                .map_err(|errno| Error::io("create device node", path)(errno.into()))?
        }
        other => {
            return Err(Error::Invalid(format!(
                "{} is not a special file",
                other.as_str()
            )));
        }
    }
    fs::set_permissions(path, fs::Permissions::from_mode(e.mode)).map_err(Error::io("chmod", path))
}

/// Sets recorded extended attributes on `path`.
pub fn set_xattrs(path: &Path, xattrs: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
    for (k, v) in xattrs {
        xattr::set(path, std::ffi::OsStr::from_bytes(k), v)
            .map_err(Error::io("set xattr on", path))?;
    }
    Ok(())
}

/// Writes a pax extended header carrying `SCHILY.xattr.*` records for the next entry.
fn append_pax_xattrs<W: Write>(
    b: &mut tar::Builder<W>,
    xattrs: &[(Vec<u8>, Vec<u8>)],
) -> io::Result<()> {
    let mut data = Vec::new();
    for (k, v) in xattrs {
        let mut body = b"SCHILY.xattr.".to_vec();
        body.extend_from_slice(k);
        body.push(b'=');
        body.extend_from_slice(v);
        body.push(b'\n');
        // The length prefix counts itself: find the fixed point.
        let mut len = body.len() + 2;
        loop {
            let total = body.len() + 1 + len.to_string().len();
            if total == len {
                break;
            }
            len = total;
        }
        data.extend_from_slice(format!("{len} ").as_bytes());
        data.extend_from_slice(&body);
    }
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(tar::EntryType::XHeader);
    h.set_size(data.len() as u64);
    h.set_mode(0o644);
    h.set_path("././@PaxHeader")?;
    h.set_cksum();
    b.append(&h, data.as_slice())
}
