//! Files in and out of a workspace, safely, also while its sandbox runs
//! (`docs/files.md`).
//!
//! **Resolution.** The worker controls the tree: `src/` may be a symlink to `/etc` by
//! the time the host writes `src/config.py` (the `docker cp` race, CVE-2018-15664). So
//! every path is resolved with `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS |
//! RESOLVE_NO_XDEV)` from a descriptor of the workspace's root: a link is followed only
//! within the workspace, as it would resolve inside the sandbox (`/etc` means the
//! workspace's own `etc`), `..` stops at the root, and nothing crosses into another
//! mount. Every operation then acts through the descriptors it resolved (`*at` calls on
//! a parent directory's descriptor and a single final name, opened with `O_NOFOLLOW`);
//! nothing is walked again by path between a check and its use. A final component that
//! is a symlink is never written through: `write` replaces it, `append` refuses it.
//!
//! **Ownership.** While the workspace's namespace sandbox runs, the host path is the
//! overlay the sandbox shares, on layers idmapped to the sandbox's user namespace: host
//! root has no id there (a raw create fails with `EOVERFLOW`). Every operation then runs
//! on a thread of its own whose filesystem ids (`setfsuid`/`setfsgid`, per thread) are
//! the sandbox's root's host ids, so what it creates belongs to root inside; it has the
//! permissions that root-inside's files give their owner (no capability over others'
//! files). Without a sandbox, operations act as this process.
//!
//! **Limits.** A read or write moves at most [`MAX_IO_BYTES`] per call (callers stream
//! larger files in ranges); only regular files are read or written (a fifo, socket or
//! device is refused, never opened for I/O); a listing holds at most
//! [`MAX_LIST_ENTRIES`] entries.

use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::runtime::Runtime;

/// The stem of an atomic write's temporary name (watchers do not report these).
pub const TEMP_PREFIX: &str = ".cowspace-write";
/// Most bytes one read or write moves.
pub const MAX_IO_BYTES: u64 = 64 << 20;
/// Most entries one listing returns.
pub const MAX_LIST_ENTRIES: usize = 1_000_000;
/// Deepest directory a recursive listing or removal descends.
pub const MAX_DEPTH: usize = 256;

/// One entry as the files API reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileInfo {
    /// Relative to the workspace's root (`.` for the root); U+FFFD in place of bytes
    /// that are not UTF-8, with the exact bytes in `path_hex`.
    pub path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path_hex: Option<String>,
    /// `file`, `dir`, `symlink`, `fifo`, `socket`, `char_device`, `block_device`.
    pub kind: &'static str,
    pub size: u64,
    /// Permission bits (`0o7777`).
    pub mode: u32,
    /// Seconds since the epoch.
    pub mtime: i64,
    /// Owner and group as seen inside the sandbox when one runs (else the host's).
    pub uid: u32,
    pub gid: u32,
    /// A symlink's target.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

impl FileInfo {
    /// The entry's path with its exact bytes (`path_hex` when it is not UTF-8).
    pub fn exact_path(&self) -> PathBuf {
        match self.path_hex.as_deref().map(hex::decode) {
            Some(Ok(b)) => PathBuf::from(OsString::from_vec(b)),
            _ => PathBuf::from(&self.path),
        }
    }
}

/// A workspace's files, opened for one caller.
#[derive(Debug)]
pub struct Files {
    root: OwnedFd,
    /// Where the workspace is on the host (to see it go).
    path: PathBuf,
    /// The sandbox's root's host ids, while a namespace sandbox runs.
    ids: Option<(u32, u32)>,
    workspace: String,
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(rustix::io::Errno) -> Error + 'a {
    move |e| Error::io(what, path)(std::io::Error::from(e))
}

/// A path inside the workspace, as the caller gave it (`src/a.py`, `/src/a.py`, `.`),
/// checked: no NUL, no `..` that would climb above the root. Returns its components.
pub fn inside_path(p: impl AsRef<Path>) -> Result<PathBuf> {
    let p = p.as_ref();
    if p.as_os_str().as_bytes().contains(&0) {
        return Err(Error::Invalid(format!("path {p:?}: contains a NUL byte")));
    }
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return Err(Error::Invalid(format!(
                        "path {p:?}: `..` climbs above the workspace's root; give a path \
                         inside it"
                    )));
                }
            }
            Component::Normal(n) => out.push(n),
            Component::Prefix(_) => {
                return Err(Error::Invalid(format!("path {p:?}: not a Unix path")));
            }
        }
    }
    Ok(out)
}

fn shown(p: &Path) -> (String, Option<String>) {
    let b = p.as_os_str().as_bytes();
    let text = if b.is_empty() {
        ".".to_string()
    } else {
        String::from_utf8_lossy(b).into_owned()
    };
    let hex = std::str::from_utf8(b).is_err().then(|| hex::encode(b));
    (text, hex)
}

fn kind_of(mode: u32) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFREG => "file",
        libc::S_IFDIR => "dir",
        libc::S_IFLNK => "symlink",
        libc::S_IFIFO => "fifo",
        libc::S_IFSOCK => "socket",
        libc::S_IFCHR => "char_device",
        libc::S_IFBLK => "block_device",
        _ => "unknown",
    }
}

/// The names in the directory `dir` (but `.` and `..`), each with its type as the
/// directory reports it.
fn read_names(dir: &OwnedFd) -> rustix::io::Result<Vec<(OsString, rustix::fs::FileType)>> {
    let readable = rustix::fs::openat(
        dir,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut d = rustix::fs::Dir::new(readable)?;
    let mut out = Vec::new();
    while let Some(entry) = d.read() {
        let entry = entry?;
        let n = entry.file_name().to_bytes();
        if n != b"." && n != b".." {
            out.push((OsString::from_vec(n.to_vec()), entry.file_type()));
        }
    }
    Ok(out)
}

const RESOLVE: ResolveFlags = ResolveFlags::IN_ROOT
    .union(ResolveFlags::NO_MAGICLINKS)
    .union(ResolveFlags::NO_XDEV);

impl Runtime {
    /// The files of workspace `ws` (an active one), acting as the sandbox's root while
    /// its namespace sandbox runs.
    pub fn files(&self, ws: &str) -> Result<Files> {
        let rec = self.status(ws)?;
        if rec.status == crate::registry::Status::Removed {
            return Err(Error::NoWorkspace(format!("{ws} (it was removed)")));
        }
        if rec.status != crate::registry::Status::Active {
            return Err(Error::WrongState {
                id: rec.id.clone(),
                status: rec.status.as_str().to_string(),
                op: "files (`mountctl recover WS` mounts a stopped workspace again)",
            });
        }
        let root = rustix::fs::open(
            &rec.path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        )
        .map_err(io_err("open the workspace", &rec.path))?;
        let ids = match (&rec.sandbox, crate::runtime::live_sandbox(&rec)) {
            (Some(s), Some(_)) if s["provider"] != "vm" => {
                s["host_uid_base"].as_u64().map(|b| (b as u32, b as u32))
            }
            _ => None,
        };
        Ok(Files {
            root,
            path: rec.path.clone(),
            ids,
            workspace: rec.id,
        })
    }
}

impl Files {
    /// The host uid and gid operations act as (the sandbox's root's), while its sandbox
    /// runs.
    pub fn acting_ids(&self) -> Option<(u32, u32)> {
        self.ids
    }

    /// Runs `f` with this workspace's filesystem ids: on a thread of its own with the
    /// sandbox's root's ids while a sandbox runs (`setfsuid` is per thread), else here.
    fn act<T: Send>(&self, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
        let Some((uid, gid)) = self.ids else {
            return f();
        };
        std::thread::scope(|s| {
            s.spawn(move || {
                // Group first: with the uid changed first the thread could no longer
                // change its group.
                nix::unistd::setfsgid(nix::unistd::Gid::from_raw(gid));
                nix::unistd::setfsuid(nix::unistd::Uid::from_raw(uid));
                let now = (
                    nix::unistd::setfsuid(nix::unistd::Uid::from_raw(uid)).as_raw(),
                    nix::unistd::setfsgid(nix::unistd::Gid::from_raw(gid)).as_raw(),
                );
                if now != (uid, gid) {
                    return Err(Error::Invalid(format!(
                        "could not act as the sandbox's root (host ids {uid}:{gid}): run as root"
                    )));
                }
                f()
            })
            .join()
            .unwrap_or_else(|_| Err(Error::Invalid("a files operation panicked".into())))
        })
    }

    /// The directory at `rel` (resolved within the workspace).
    fn dir(&self, rel: &Path) -> Result<OwnedFd> {
        let p: &Path = if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            rel
        };
        rustix::fs::openat2(
            &self.root,
            p,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            RESOLVE,
        )
        .map_err(|e| self.err(e, "open the directory", rel))
    }

    /// Whether the workspace's path still shows the tree these files were opened on
    /// (it goes when the workspace is removed or unmounted).
    pub fn still_there(&self) -> bool {
        let Ok(now) = rustix::fs::stat(&self.path) else {
            return false;
        };
        let Ok(ours) = rustix::fs::fstat(&self.root) else {
            return false;
        };
        (now.st_dev, now.st_ino) == (ours.st_dev, ours.st_ino)
    }

    /// The directory `rel` (inside-path form), resolved within the workspace (for the
    /// watcher, which watches it by this descriptor).
    pub(crate) fn open_dir(&self, rel: &Path) -> Result<OwnedFd> {
        self.dir(rel)
    }

    /// The names in the directory `rel`, each with whether it is a directory (not
    /// following symlinks).
    pub(crate) fn list_rel(&self, rel: &Path) -> Result<Vec<(OsString, bool)>> {
        let dir = self.dir(rel)?;
        let names = read_names(&dir).map_err(|e| self.err(e, "read the directory", rel))?;
        Ok(names
            .into_iter()
            .map(|(name, t)| {
                let is_dir = match t {
                    rustix::fs::FileType::Directory => true,
                    rustix::fs::FileType::Unknown => {
                        rustix::fs::statat(&dir, &name, AtFlags::SYMLINK_NOFOLLOW)
                            .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR)
                    }
                    _ => false,
                };
                (name, is_dir)
            })
            .collect())
    }

    /// The parent directory of `rel` (resolved within the workspace) and its last name.
    fn parent(&self, rel: &Path) -> Result<(OwnedFd, OsString)> {
        let Some(name) = rel.file_name() else {
            return Err(Error::Invalid(format!(
                "{}: the workspace's root itself cannot be the target",
                self.workspace
            )));
        };
        let dir = self.dir(rel.parent().unwrap_or(Path::new("")))?;
        Ok((dir, name.to_os_string()))
    }

    fn err(&self, e: rustix::io::Errno, what: &'static str, rel: &Path) -> Error {
        let shown = format!("{}:{}", self.workspace, shown(rel).0);
        match e {
            rustix::io::Errno::NOENT => Error::NoFile(shown),
            rustix::io::Errno::XDEV => Error::Invalid(format!(
                "{shown}: the path crosses into another mount, which the files API does not enter"
            )),
            rustix::io::Errno::LOOP => Error::Invalid(format!(
                "{shown}: a symlink at the end of the path, or too many links: the files API \
                 never writes through a symlink; name its target"
            )),
            other => Error::io(what, PathBuf::from(shown))(std::io::Error::from(other)),
        }
    }

    fn info(&self, dir: &OwnedFd, name: &OsStr, rel: &Path) -> Result<FileInfo> {
        let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| self.err(e, "stat", rel))?;
        let mode = st.st_mode;
        let target = if mode & libc::S_IFMT == libc::S_IFLNK {
            rustix::fs::readlinkat(dir, name, Vec::new())
                .ok()
                .map(|t| String::from_utf8_lossy(t.as_bytes()).into_owned())
        } else {
            None
        };
        let (path, path_hex) = shown(rel);
        let inside = |id: u32| match self.ids {
            Some((base, _)) if id >= base => id - base,
            _ => id,
        };
        Ok(FileInfo {
            path,
            path_hex,
            kind: kind_of(mode),
            size: st.st_size as u64,
            mode: mode & 0o7777,
            mtime: st.st_mtime,
            uid: inside(st.st_uid),
            gid: inside(st.st_gid),
            target,
        })
    }

    /// What is at `path` (a symlink itself, not its target).
    pub fn stat(&self, path: impl AsRef<Path>) -> Result<FileInfo> {
        let rel = inside_path(path)?;
        self.act(|| {
            if rel.as_os_str().is_empty() {
                let root = self.dir(&rel)?;
                return self.info(&root, OsStr::new("."), &rel);
            }
            let (dir, name) = self.parent(&rel)?;
            self.info(&dir, &name, &rel)
        })
    }

    /// The entries of the directory at `path` (sorted by name); `recursive`: every
    /// entry below it, depth first, without following symlinks.
    pub fn list(&self, path: impl AsRef<Path>, recursive: bool) -> Result<Vec<FileInfo>> {
        let rel = inside_path(path)?;
        self.act(|| {
            let dir = self.dir(&rel)?;
            let mut out = Vec::new();
            self.list_into(dir, &rel, recursive, 0, &mut out)?;
            Ok(out)
        })
    }

    fn list_into(
        &self,
        dir: OwnedFd,
        rel: &Path,
        recursive: bool,
        depth: usize,
        out: &mut Vec<FileInfo>,
    ) -> Result<()> {
        if depth > MAX_DEPTH {
            return Err(Error::Invalid(format!(
                "{}: deeper than {MAX_DEPTH} directories",
                shown(rel).0
            )));
        }
        let mut names: Vec<OsString> = read_names(&dir)
            .map_err(|e| self.err(e, "read the directory", rel))?
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        names.sort();
        for name in names {
            if out.len() >= MAX_LIST_ENTRIES {
                return Err(Error::Invalid(format!(
                    "more than {MAX_LIST_ENTRIES} entries: list a smaller directory"
                )));
            }
            let child = rel.join(&name);
            let info = self.info(&dir, &name, &child)?;
            let is_dir = info.kind == "dir";
            out.push(info);
            if recursive && is_dir {
                let sub = rustix::fs::openat(
                    &dir,
                    &name,
                    OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| self.err(e, "open the directory", &child))?;
                self.list_into(sub, &child, true, depth + 1, out)?;
            }
        }
        Ok(())
    }

    /// Up to `len` bytes (at most [`MAX_IO_BYTES`]) of the regular file at `path` from
    /// `offset`. A symlink is followed within the workspace.
    pub fn read(&self, path: impl AsRef<Path>, offset: u64, len: Option<u64>) -> Result<Vec<u8>> {
        let rel = inside_path(path)?;
        let len = len.unwrap_or(MAX_IO_BYTES);
        if len > MAX_IO_BYTES {
            return Err(Error::Invalid(format!(
                "a read of {len} bytes: at most {MAX_IO_BYTES} per call; read in ranges"
            )));
        }
        self.act(|| {
            // O_NONBLOCK: a fifo is opened without waiting for a writer, then refused.
            let fd = rustix::fs::openat2(
                &self.root,
                &rel,
                OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOCTTY,
                Mode::empty(),
                RESOLVE,
            )
            .map_err(|e| self.err(e, "open", &rel))?;
            let st = rustix::fs::fstat(&fd).map_err(|e| self.err(e, "stat", &rel))?;
            if st.st_mode & libc::S_IFMT != libc::S_IFREG {
                return Err(Error::Invalid(format!(
                    "{}:{} is a {}: only regular files are read",
                    self.workspace,
                    shown(&rel).0,
                    kind_of(st.st_mode)
                )));
            }
            let size = st.st_size as u64;
            let want = len.min(size.saturating_sub(offset)) as usize;
            let mut buf = vec![0u8; want];
            let mut done = 0;
            while done < want {
                let n = rustix::io::pread(&fd, &mut buf[done..], offset + done as u64)
                    .map_err(|e| self.err(e, "read", &rel))?;
                if n == 0 {
                    break;
                }
                done += n;
            }
            buf.truncate(done);
            Ok(buf)
        })
    }

    /// Creates or replaces the regular file at `path` with `data` (at most
    /// [`MAX_IO_BYTES`]), atomically (a temporary file in the same directory, renamed
    /// over it); `append` adds to an existing regular file instead. `mode` defaults to
    /// the replaced file's, else 0644. Its parent directory must exist.
    pub fn write(
        &self,
        path: impl AsRef<Path>,
        data: &[u8],
        mode: Option<u32>,
        append: bool,
    ) -> Result<FileInfo> {
        let rel = inside_path(path)?;
        if data.len() as u64 > MAX_IO_BYTES {
            return Err(Error::Invalid(format!(
                "a write of {} bytes: at most {MAX_IO_BYTES} per call; append the rest",
                data.len()
            )));
        }
        if let Some(m) = mode
            && m > 0o7777
        {
            return Err(Error::Invalid(format!(
                "mode {m:o}: expected permission bits (at most 7777)"
            )));
        }
        self.act(|| {
            let (dir, name) = self.parent(&rel)?;
            let existing = rustix::fs::statat(&dir, &name, AtFlags::SYMLINK_NOFOLLOW).ok();
            if let Some(st) = &existing {
                let k = st.st_mode & libc::S_IFMT;
                if k == libc::S_IFDIR {
                    return Err(Error::Invalid(format!(
                        "{}:{} is a directory: remove it first, or write to a path inside it",
                        self.workspace,
                        shown(&rel).0
                    )));
                }
                if k != libc::S_IFREG && k != libc::S_IFLNK {
                    return Err(Error::Invalid(format!(
                        "{}:{} is a {}: only regular files are written",
                        self.workspace,
                        shown(&rel).0,
                        kind_of(st.st_mode)
                    )));
                }
            }
            let write_all = |fd: &OwnedFd| -> Result<()> {
                let mut done = 0;
                while done < data.len() {
                    done += rustix::io::write(fd, &data[done..])
                        .map_err(|e| self.err(e, "write", &rel))?;
                }
                Ok(())
            };
            if append {
                let fd = rustix::fs::openat(
                    &dir,
                    &name,
                    OFlags::WRONLY
                        | OFlags::APPEND
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC
                        | OFlags::CREATE,
                    Mode::from_raw_mode(mode.unwrap_or(0o644)),
                )
                .map_err(|e| self.err(e, "open for appending", &rel))?;
                let st = rustix::fs::fstat(&fd).map_err(|e| self.err(e, "stat", &rel))?;
                if st.st_mode & libc::S_IFMT != libc::S_IFREG {
                    return Err(Error::Invalid(format!(
                        "{}:{} is not a regular file",
                        self.workspace,
                        shown(&rel).0
                    )));
                }
                write_all(&fd)?;
                return self.info(&dir, &name, &rel);
            }
            let mode = mode.unwrap_or(match &existing {
                Some(st) if st.st_mode & libc::S_IFMT == libc::S_IFREG => st.st_mode & 0o7777,
                _ => 0o644,
            });
            let tmp = OsString::from(crate::tmpname::unique(TEMP_PREFIX));
            let fd = rustix::fs::openat(
                &dir,
                &tmp,
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )
            .map_err(|e| self.err(e, "create", &rel))?;
            let done = write_all(&fd)
                .and_then(|()| {
                    rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode))
                        .map_err(|e| self.err(e, "chmod", &rel))
                })
                .and_then(|()| {
                    rustix::fs::renameat(&dir, &tmp, &dir, &name)
                        .map_err(|e| self.err(e, "rename into place", &rel))
                });
            if done.is_err() {
                let _ = rustix::fs::unlinkat(&dir, &tmp, AtFlags::empty());
            }
            done?;
            self.info(&dir, &name, &rel)
        })
    }

    /// Makes the directory at `path`; `parents`: and every missing one above it, and no
    /// error when it exists.
    pub fn mkdir(
        &self,
        path: impl AsRef<Path>,
        parents: bool,
        mode: Option<u32>,
    ) -> Result<FileInfo> {
        let rel = inside_path(path)?;
        let mode = Mode::from_raw_mode(mode.unwrap_or(0o755) & 0o7777);
        self.act(|| {
            let comps: Vec<&OsStr> = rel.iter().collect();
            if comps.is_empty() {
                return Err(Error::Invalid("the workspace's root exists already".into()));
            }
            let upto = if parents { 0 } else { comps.len() - 1 };
            for i in upto..comps.len() {
                let prefix: PathBuf = comps[..i].iter().collect();
                let dir = self.dir(&prefix)?;
                match rustix::fs::mkdirat(&dir, comps[i], mode) {
                    Ok(()) => {}
                    Err(rustix::io::Errno::EXIST) if parents => {}
                    Err(e) => return Err(self.err(e, "mkdir", &prefix.join(comps[i]))),
                }
            }
            let (dir, name) = self.parent(&rel)?;
            let info = self.info(&dir, &name, &rel)?;
            if info.kind != "dir" {
                return Err(Error::Invalid(format!(
                    "{}:{} exists and is a {}",
                    self.workspace, info.path, info.kind
                )));
            }
            Ok(info)
        })
    }

    /// Removes what is at `path` (a symlink itself, never its target); a directory only
    /// when empty unless `recursive`.
    pub fn remove(&self, path: impl AsRef<Path>, recursive: bool) -> Result<()> {
        let rel = inside_path(path)?;
        self.act(|| {
            let (dir, name) = self.parent(&rel)?;
            let st = rustix::fs::statat(&dir, &name, AtFlags::SYMLINK_NOFOLLOW)
                .map_err(|e| self.err(e, "stat", &rel))?;
            if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
                return rustix::fs::unlinkat(&dir, &name, AtFlags::empty())
                    .map_err(|e| self.err(e, "remove", &rel));
            }
            if recursive {
                self.empty_dir(&dir, &name, &rel, 0)?;
            }
            rustix::fs::unlinkat(&dir, &name, AtFlags::REMOVEDIR).map_err(|e| match e {
                rustix::io::Errno::NOTEMPTY => Error::Invalid(format!(
                    "{}:{} is a directory that is not empty: remove it recursively",
                    self.workspace,
                    shown(&rel).0
                )),
                e => self.err(e, "remove", &rel),
            })
        })
    }

    /// Removes everything inside the directory `name` of `parent`, through descriptors.
    fn empty_dir(&self, parent: &OwnedFd, name: &OsStr, rel: &Path, depth: usize) -> Result<()> {
        if depth > MAX_DEPTH {
            return Err(Error::Invalid(format!(
                "{}: deeper than {MAX_DEPTH} directories",
                shown(rel).0
            )));
        }
        let fd = rustix::fs::openat(
            parent,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| self.err(e, "open the directory", rel))?;
        let names = read_names(&fd).map_err(|e| self.err(e, "read the directory", rel))?;
        for (n, _) in names {
            let child = rel.join(&n);
            let st = rustix::fs::statat(&fd, &n, AtFlags::SYMLINK_NOFOLLOW)
                .map_err(|e| self.err(e, "stat", &child))?;
            if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
                self.empty_dir(&fd, &n, &child, depth + 1)?;
                rustix::fs::unlinkat(&fd, &n, AtFlags::REMOVEDIR)
            } else {
                rustix::fs::unlinkat(&fd, &n, AtFlags::empty())
            }
            .map_err(|e| self.err(e, "remove", &child))?;
        }
        Ok(())
    }

    /// Renames `from` to `to` (both inside the workspace); replaces a file at `to`.
    pub fn rename(&self, from: impl AsRef<Path>, to: impl AsRef<Path>) -> Result<FileInfo> {
        let a = inside_path(from)?;
        let b = inside_path(to)?;
        self.act(|| {
            let (da, na) = self.parent(&a)?;
            let (db, nb) = self.parent(&b)?;
            rustix::fs::renameat(&da, &na, &db, &nb).map_err(|e| self.err(e, "rename", &a))?;
            self.info(&db, &nb, &b)
        })
    }

    /// Makes a symlink at `path` pointing to `target` (kept as given: it is resolved
    /// inside the sandbox, and by this API within the workspace).
    pub fn symlink(&self, path: impl AsRef<Path>, target: impl AsRef<Path>) -> Result<FileInfo> {
        let rel = inside_path(path)?;
        let target = target.as_ref();
        let bytes = target.as_os_str().as_bytes();
        if bytes.is_empty() || bytes.contains(&0) {
            return Err(Error::Invalid(format!(
                "symlink target {target:?}: empty or with a NUL"
            )));
        }
        self.act(|| {
            let (dir, name) = self.parent(&rel)?;
            rustix::fs::symlinkat(target, &dir, &name).map_err(|e| self.err(e, "symlink", &rel))?;
            self.info(&dir, &name, &rel)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inside_paths_never_climb_above_the_root() {
        assert_eq!(inside_path("/src/a.py").unwrap(), PathBuf::from("src/a.py"));
        assert_eq!(
            inside_path("src/./b/../a.py").unwrap(),
            PathBuf::from("src/a.py")
        );
        assert_eq!(inside_path(".").unwrap(), PathBuf::new());
        for bad in ["..", "../etc/passwd", "src/../../x", "a\0b"] {
            let e = inside_path(bad).unwrap_err();
            assert_eq!(e.kind().as_str(), "invalid_input", "{bad}");
        }
    }

    #[test]
    fn names_that_are_not_utf8_are_carried_exactly() {
        let p = PathBuf::from(OsString::from_vec(b"raw\xff".to_vec()));
        let (text, hex) = shown(&p);
        assert_eq!(text, "raw\u{fffd}");
        assert_eq!(hex.as_deref(), Some("726177ff"));
    }
}
