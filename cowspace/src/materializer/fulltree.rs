//! What the `btrfs`, `reflink` and `copy` materializers share: a workspace that is a
//! whole, real directory tree (`<private_dir>/tree`, bind-mounted at the workspace's
//! path), and the stamp table that makes its diff and commit cost what changed.
//!
//! When a tree is made, the (inode, size, mtime, ctime) of every entry is written to a
//! stamp file (`<private_dir>/stamps`). Diff and commit walk the tree (one `lstat` per
//! entry) and read only entries whose stamp no longer matches: every change to a file's
//! content, mode, xattrs or link count moves its ctime, and a new file has a new inode or
//! ctime. Directories whose stamp matches kept their names (adding, removing or renaming
//! an entry moves the directory's mtime), so deleted paths are looked for only in
//! directories that changed. The changes come out in the shape of an overlay upper
//! layer's ([`UpperChange`]), so diff entries and editor calls are exactly overlay's.
//!
//! Racy stamps (git's problem): a change within the same clock tick as the stamp's
//! recording could leave every field equal. The stamp file is written only once the
//! filesystem's clock has moved past every recorded time, and an entry whose recorded
//! time is not older than the stamp file's mtime is always re-read.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use cowspace_store::import::dir::read_xattrs;
use cowspace_store::{Kind, SnapshotId, Store, TreeId};

use crate::error::{Error, Result};
use crate::materializer::WorkspaceCtx;
use crate::mounts;
use crate::registry::Record;
use crate::upper::{BaseTrees, UpperChange};
use cowspace_store::tree::Target;
use cowspace_store::tree::join_path as join;

/// The workspace's tree under its private directory.
pub fn tree_dir(rec: &Record) -> PathBuf {
    rec.private_dir.join("tree")
}

/// The stamp file of the workspace's tree.
pub fn stamps_path(rec: &Record) -> PathBuf {
    rec.private_dir.join("stamps")
}

/// How long writing a stamp file waits, at most, for the filesystem clock to pass the
/// newest recorded time (a few coarse clock ticks).
const STAMP_CLOCK_WAIT_MS: u64 = 200;
/// Copy buffer of the `copy` materializer.
const COPY_BUFFER_BYTES: usize = 256 * 1024;
/// Longest path a stamp row holds (Linux `PATH_MAX`).
const MAX_STAMP_PATH_BYTES: usize = 4096;
const STAMP_MAGIC: &[u8; 8] = b"CWSTAMP1";

/// What was true of one entry of the tree when it was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

impl Stamp {
    pub fn of(meta: &fs::Metadata) -> Stamp {
        Stamp {
            ino: meta.ino(),
            size: meta.size(),
            mtime_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
            ctime_ns: meta.ctime() * 1_000_000_000 + meta.ctime_nsec(),
        }
    }
}

/// The stamps of a tree: path (relative, `/`-separated, `""` for the root) to stamp.
#[derive(Debug, Default)]
pub struct Stamps {
    rows: HashMap<Vec<u8>, Stamp>,
    /// The stamp file's mtime: recorded times not older than this are racy.
    recorded_ns: i64,
}

impl Stamps {
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Whether the entry at `path` is still what the tree was made with.
    pub fn unchanged(&self, path: &[u8], meta: &fs::Metadata) -> bool {
        match self.rows.get(path) {
            Some(s) => *s == Stamp::of(meta) && s.mtime_ns.max(s.ctime_ns) < self.recorded_ns,
            None => false,
        }
    }

    /// Writes `rows` to `dest` (temporary file, then renamed into place), once the
    /// filesystem's clock has passed every recorded time.
    pub fn write(rows: &HashMap<Vec<u8>, Stamp>, dest: &Path) -> Result<()> {
        let mut buf = Vec::with_capacity(16 + rows.len() * 64);
        buf.extend_from_slice(STAMP_MAGIC);
        buf.extend_from_slice(&(rows.len() as u64).to_le_bytes());
        let mut newest = i64::MIN;
        for (path, s) in rows {
            assert!(path.len() <= MAX_STAMP_PATH_BYTES, "stamp path too long");
            buf.extend_from_slice(&(path.len() as u32).to_le_bytes());
            buf.extend_from_slice(path);
            buf.extend_from_slice(&s.ino.to_le_bytes());
            buf.extend_from_slice(&s.size.to_le_bytes());
            buf.extend_from_slice(&s.mtime_ns.to_le_bytes());
            buf.extend_from_slice(&s.ctime_ns.to_le_bytes());
            newest = newest.max(s.mtime_ns).max(s.ctime_ns);
        }
        let sum = blake3::hash(&buf);
        buf.extend_from_slice(sum.as_bytes());
        let tmp = dest.with_extension(crate::tmpname::unique("tmp"));
        let mut f = fs::File::create(&tmp).map_err(Error::io("create", &tmp))?;
        f.write_all(&buf).map_err(Error::io("write", &tmp))?;
        let deadline =
            std::time::Instant::now() + std::time::Duration::from_millis(STAMP_CLOCK_WAIT_MS);
        loop {
            let m = f.metadata().map_err(Error::io("stat", &tmp))?;
            if m.mtime() * 1_000_000_000 + m.mtime_nsec() > newest {
                break;
            }
            if std::time::Instant::now() > deadline {
                // Still correct: entries not older than the file's mtime are re-read.
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
            f.set_modified(std::time::SystemTime::now())
                .map_err(Error::io("touch", &tmp))?;
        }
        drop(f);
        fs::rename(&tmp, dest).map_err(Error::io("rename into place", dest))
    }

    /// Reads a stamp file, checking its checksum and layout.
    pub fn load(path: &Path) -> Result<Stamps> {
        let buf = fs::read(path).map_err(Error::io("read", path))?;
        let meta = fs::metadata(path).map_err(Error::io("stat", path))?;
        let corrupt = |what: &str| Error::Io {
            step: "read stamp file",
            path: path.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string()),
        };
        if buf.len() < 16 + 32 || &buf[..8] != STAMP_MAGIC {
            return Err(corrupt("not a stamp file"));
        }
        let (body, sum) = buf.split_at(buf.len() - 32);
        if blake3::hash(body).as_bytes() != sum {
            return Err(corrupt("checksum mismatch"));
        }
        let truncated = || corrupt("truncated");
        let mut at = STAMP_MAGIC.len();
        let count = u64::from_le_bytes(take_array(body, &mut at).ok_or_else(truncated)?) as usize;
        let mut rows = HashMap::with_capacity(count.min(body.len() / 36));
        for _ in 0..count {
            let len = u32::from_le_bytes(take_array(body, &mut at).ok_or_else(truncated)?) as usize;
            if len > MAX_STAMP_PATH_BYTES {
                return Err(corrupt("path too long"));
            }
            let path = body.get(at..at + len).ok_or_else(truncated)?.to_vec();
            at += len;
            let mut next_u64 = || {
                take_array(body, &mut at)
                    .map(u64::from_le_bytes)
                    .ok_or_else(truncated)
            };
            let stamp = Stamp {
                ino: next_u64()?,
                size: next_u64()?,
                mtime_ns: next_u64()? as i64,
                ctime_ns: next_u64()? as i64,
            };
            rows.insert(path, stamp);
        }
        if at != body.len() {
            return Err(corrupt("trailing bytes"));
        }
        Ok(Stamps {
            rows,
            recorded_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
        })
    }
}

/// The `N` bytes of `body` at `*at`, moving `at` past them; `None` past the end.
fn take_array<const N: usize>(body: &[u8], at: &mut usize) -> Option<[u8; N]> {
    let (head, _) = body.get(*at..)?.split_first_chunk::<N>()?;
    *at += N;
    Some(*head)
}

/// How a made tree gets its file contents from the checkout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fill {
    /// `FICLONE`: the file shares the checkout file's extents (same filesystem).
    Clone,
    /// A plain byte copy (read and write; no `copy_file_range`, which may clone).
    Copy,
}

/// Fills the existing empty directory `dest` with the snapshot, taking file contents from
/// its checkout, and returns the stamp of every entry (`""`: `dest` itself). Modes and
/// xattrs come from the snapshot (the checkout's files share their blob's inode and
/// carry none).
pub fn build(
    store: &Store,
    snapshot: &SnapshotId,
    checkout: &Path,
    dest: &Path,
    fill: Fill,
) -> Result<HashMap<Vec<u8>, Stamp>> {
    let snap = store.snapshot(snapshot)?;
    let mut b = Builder {
        store,
        checkout,
        dest,
        fill,
        stamps: HashMap::new(),
        links: Vec::new(),
        symlink_groups: HashMap::new(),
        buf: Vec::new(),
    };
    b.dir(&snap.root, &[])?;
    refresh_git_index(store, &snap.root, dest, &mut b.stamps)?;
    // A hard link moved its primary's ctime: stamp every linked name again.
    for (path, primary) in std::mem::take(&mut b.links) {
        for p in [path, primary] {
            let host = dest.join(OsStr::from_bytes(&p));
            let m = fs::symlink_metadata(&host).map_err(Error::io("stat", &host))?;
            b.stamps.insert(p, Stamp::of(&m));
        }
    }
    cowspace_store::export::set_xattrs(dest, &snap.root_xattrs)?;
    fs::set_permissions(dest, fs::Permissions::from_mode(snap.root_mode & 0o7777))
        .map_err(Error::io("chmod", dest))?;
    let m = fs::symlink_metadata(dest).map_err(Error::io("stat", dest))?;
    b.stamps.insert(Vec::new(), Stamp::of(&m));
    Ok(b.stamps)
}

/// Makes the built tree's `.git/index` (if any) agree with the files just made, so the
/// first `git status` in the workspace re-hashes nothing.
///
/// The snapshot's index carries, for every entry git trusted at import, the stat data
/// the view serves ([`crate::view::served_file_stat`]); a whole tree has its own inodes
/// and times. Exactly those entries (their recorded stat equals what the view would
/// serve for the snapshot's file at that path) get the stat data of the built file;
/// every other entry keeps what it had, so git still checks it. The index is rewritten
/// in place (its directory's mtime stays) and its stamp taken again, so an untouched
/// workspace still diffs empty (commit keeps the snapshot's index). The fsmonitor hook
/// the import named is taken out of the tree's config and index.
fn refresh_git_index(
    store: &Store,
    root: &TreeId,
    dest: &Path,
    stamps: &mut HashMap<Vec<u8>, Stamp>,
) -> Result<()> {
    use cowspace_store::import::gitindex::{self, EntryStat};
    const INDEX: &[u8] = b".git/index";
    let index_path = dest.join(OsStr::from_bytes(INDEX));
    match fs::symlink_metadata(&index_path) {
        Ok(m) if m.is_file() && m.nlink() == 1 => {}
        _ => return Ok(()),
    }
    let started = std::time::Instant::now();
    let bytes = fs::read(&index_path).map_err(Error::io("read", &index_path))?;
    let served = crate::served::served_identity(store.root())?;
    let mut base = BaseTrees::new(store, *root);
    let mut failed = None;
    let mut trusted = 0u64;
    let rewritten = gitindex::rewrite_marking(&bytes, |path, e| {
        let entry = match base.entry(path) {
            Ok(Some(entry)) if entry.kind == Kind::File => entry,
            Ok(_) => return None,
            Err(err) => {
                failed.get_or_insert(err);
                return None;
            }
        };
        let synth = gitindex::served_entry(&entry.name, entry.mode, entry.size, entry.hash);
        let served = served(path, &synth);
        let trusted_at_import = e.ino == served.ino as u32
            && (e.mtime_s, e.mtime_ns, e.ctime_s, e.ctime_ns)
                == (served.mtime_s, 0, served.ctime_s, 0)
            && e.size == entry.size as u32;
        if !trusted_at_import {
            return None;
        }
        let m = fs::symlink_metadata(dest.join(OsStr::from_bytes(path))).ok()?;
        if !m.is_file() || m.size() != entry.size {
            return None;
        }
        trusted += 1;
        Some(EntryStat {
            ctime_s: m.ctime() as u32,
            ctime_ns: m.ctime_nsec() as u32,
            mtime_s: m.mtime() as u32,
            mtime_ns: m.mtime_nsec() as u32,
            dev: 0,
            ino: m.ino() as u32,
            mode: e.mode,
            uid: m.uid(),
            gid: m.gid(),
            size: e.size,
        })
    });
    if let Some(err) = failed {
        return Err(err);
    }
    let Some(rewritten) = rewritten.filter(|_| trusted > 0) else {
        return Ok(());
    };
    // git's fsmonitor hook (docs/git.md) would walk this whole tree to learn what
    // changed, which costs more than git's own look at every file: both the config lines
    // the import added and the index's extension go, as written, and only together.
    let config_path = dest.join(".git/config");
    let unhooked = fs::read_to_string(&config_path)
        .ok()
        .and_then(|text| gitindex::strip_fsmonitor_config(&text))
        .and_then(|text| Some((text, gitindex::without_fsmonitor(&rewritten)?)));
    let new = match unhooked {
        Some((config, index)) => {
            // In place too, and stamped again: an untouched workspace diffs empty.
            fs::write(&config_path, config).map_err(Error::io("write", &config_path))?;
            let m = fs::symlink_metadata(&config_path).map_err(Error::io("stat", &config_path))?;
            stamps.insert(b".git/config".to_vec(), Stamp::of(&m));
            index
        }
        None => rewritten.bytes,
    };
    // In place: the index is a file of this private, not yet shown tree.
    let mut f = fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&index_path)
        .map_err(Error::io("open", &index_path))?;
    f.write_all(&new).map_err(Error::io("write", &index_path))?;
    drop(f);
    let m = fs::symlink_metadata(&index_path).map_err(Error::io("stat", &index_path))?;
    stamps.insert(INDEX.to_vec(), Stamp::of(&m));
    tracing::debug!(entries = trusted, tree = %dest.display(), ms = started.elapsed().as_millis() as u64,
        "git index agrees with the built tree");
    Ok(())
}

struct Builder<'a> {
    store: &'a Store,
    checkout: &'a Path,
    dest: &'a Path,
    fill: Fill,
    stamps: HashMap<Vec<u8>, Stamp>,
    /// (hard link, its primary)
    links: Vec<(Vec<u8>, Vec<u8>)>,
    /// The first name made of each multiply-linked symlink, by its link group.
    symlink_groups: HashMap<[u8; 32], Vec<u8>>,
    buf: Vec<u8>,
}

impl Builder<'_> {
    fn dir(&mut self, tree: &TreeId, prefix: &[u8]) -> Result<()> {
        for e in self.store.tree(tree)?.entries {
            let path = join(prefix, &e.name);
            let host = self.dest.join(OsStr::from_bytes(&path));
            match e.target() {
                Target::Dir(sub) => {
                    fs::create_dir(&host).map_err(Error::io("create directory", &host))?;
                    self.dir(&sub, &path)?;
                    cowspace_store::export::set_xattrs(&host, &e.xattrs)?;
                    fs::set_permissions(&host, fs::Permissions::from_mode(e.mode))
                        .map_err(Error::io("chmod", &host))?;
                }
                Target::File(_) => self.file(&path, &host, &e)?,
                Target::Hardlink(_) => {
                    let primary = self.dest.join(OsStr::from_bytes(&e.data));
                    fs::hard_link(&primary, &host).map_err(Error::io("hard link", &host))?;
                    self.links.push((path.clone(), e.data.clone()));
                }
                Target::Symlink => match e
                    .link_group()
                    .and_then(|g| self.symlink_groups.get(&g).cloned())
                {
                    // A further name of a symlink: linked to the symlink itself
                    // (`linkat` without `AT_SYMLINK_FOLLOW`, as `hard_link` calls it).
                    Some(first) => {
                        let primary = self.dest.join(OsStr::from_bytes(&first));
                        fs::hard_link(&primary, &host).map_err(Error::io("hard link", &host))?;
                        self.links.push((path.clone(), first));
                    }
                    None => {
                        std::os::unix::fs::symlink(OsStr::from_bytes(&e.data), &host)
                            .map_err(Error::io("create symlink", &host))?;
                        if let Some(g) = e.link_group() {
                            self.symlink_groups.insert(g, path.clone());
                        }
                    }
                },
                Target::Fifo | Target::CharDevice | Target::BlockDevice => {
                    cowspace_store::export::create_special(&host, &e)?
                }
            }
            let m = fs::symlink_metadata(&host).map_err(Error::io("stat", &host))?;
            self.stamps.insert(path, Stamp::of(&m));
        }
        Ok(())
    }

    fn file(&mut self, path: &[u8], host: &Path, e: &cowspace_store::Entry) -> Result<()> {
        let src_path = self.checkout.join(OsStr::from_bytes(path));
        let mut src = fs::File::open(&src_path).map_err(Error::io("open", &src_path))?;
        let mut dst = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(host)
            .map_err(Error::io("create", host))?;
        match self.fill {
            Fill::Clone if e.size > 0 => {
                crate::sys::ficlone(&dst, &src).map_err(Error::io("clone (FICLONE) into", host))?
            }
            Fill::Clone => {}
            Fill::Copy => {
                if self.buf.is_empty() {
                    self.buf = vec![0; COPY_BUFFER_BYTES];
                }
                loop {
                    let n = src
                        .read(&mut self.buf)
                        .map_err(Error::io("read", &src_path))?;
                    if n == 0 {
                        break;
                    }
                    dst.write_all(&self.buf[..n])
                        .map_err(Error::io("write", host))?;
                }
            }
        }
        use xattr::FileExt;
        for (k, v) in &e.xattrs {
            dst.set_xattr(OsStr::from_bytes(k), v)
                .map_err(Error::io("set xattr on", host))?;
        }
        dst.set_permissions(fs::Permissions::from_mode(e.mode))
            .map_err(Error::io("chmod", host))?;
        // The checkout is a cache: check what it gave before relying on it.
        let size = dst.metadata().map_err(Error::io("stat", host))?.len();
        if size != e.size {
            return Err(Error::Io {
                step: "fill from checkout",
                path: src_path,
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{size} bytes where the snapshot has {}", e.size),
                ),
            });
        }
        Ok(())
    }
}

/// The changes of the full-tree workspace `rec` made from `base` ([`changes`] of its
/// tree with its stamps).
pub fn changes_of(store: &Store, base: &SnapshotId, rec: &Record) -> Result<Vec<UpperChange>> {
    let stamps = Stamps::load(&stamps_path(rec))?;
    changes(store, base, &tree_dir(rec), &stamps)
}

/// The changes of the tree `tree` (made from `base`, stamped in `stamps`), as an upper
/// layer would record them: every new or changed entry (directories only when new or
/// their own mode or xattrs may have changed) and every deleted path, parents first.
/// Reads only entries whose stamp changed.
pub fn changes(
    store: &Store,
    base: &SnapshotId,
    tree: &Path,
    stamps: &Stamps,
) -> Result<Vec<UpperChange>> {
    let snap = store.snapshot(base)?;
    let mut w = Walk {
        base: BaseTrees::new(store, snap.root),
        stamps,
        out: Vec::new(),
    };
    let meta = fs::symlink_metadata(tree).map_err(Error::io("stat", tree))?;
    w.dir(tree, &[], &meta)?;
    let mut out = w.out;
    if snap.counts.hardlinks > 0 {
        link_partners(store, &snap.root, tree, &mut out)?;
    }
    Ok(out)
}

/// A changed file (or symlink) with more names than the changes hold is still linked to
/// names of the snapshot that did not change (a directory holding one name was renamed, one name was
/// renamed over another file): those names join the changes, so the commit keeps them
/// one file, as the tree shows them.
fn link_partners(
    store: &Store,
    root: &TreeId,
    tree: &Path,
    out: &mut Vec<UpperChange>,
) -> Result<()> {
    let mut seen: HashMap<u64, (u64, u64)> = HashMap::new();
    let mut paths = std::collections::HashSet::new();
    for c in out.iter() {
        if let UpperChange::File {
            path, ino, nlink, ..
        }
        | UpperChange::Symlink {
            path, ino, nlink, ..
        } = c
        {
            paths.insert(path.clone());
            if *nlink > 1 {
                seen.entry(*ino).or_insert((*nlink, 0)).1 += 1;
            }
        }
    }
    seen.retain(|_, (nlink, found)| *found < *nlink);
    if seen.is_empty() {
        return Ok(());
    }
    // Every name of a link group of the snapshot.
    let mut names = Vec::new();
    let mut stack = vec![(*root, Vec::new())];
    while let Some((id, prefix)) = stack.pop() {
        for e in store.tree(&id)?.entries {
            let p = join(&prefix, &e.name);
            match e.target() {
                Target::Dir(sub) => stack.push((sub, p)),
                Target::Hardlink(_) => {
                    names.push(e.data.clone());
                    names.push(p);
                }
                Target::Symlink if e.link_group().is_some() => names.push(p),
                _ => {}
            }
        }
    }
    names.sort();
    names.dedup();
    for name in names {
        if paths.contains(&name) {
            continue;
        }
        let host = tree.join(OsStr::from_bytes(&name));
        let Ok(m) = fs::symlink_metadata(&host) else {
            continue;
        };
        if m.is_file() && seen.contains_key(&m.ino()) {
            out.push(UpperChange::File {
                path: name,
                xattrs: read_xattrs(&host)?,
                host,
                mode: m.mode() & 0o7777,
                ino: m.ino(),
                nlink: m.nlink(),
            });
        } else if m.file_type().is_symlink() && seen.contains_key(&m.ino()) {
            let target = fs::read_link(&host).map_err(Error::io("read link", &host))?;
            out.push(UpperChange::Symlink {
                path: name,
                target: target.as_os_str().as_bytes().to_vec(),
                ino: m.ino(),
                nlink: m.nlink(),
            });
        }
    }
    Ok(())
}

struct Walk<'s, 't> {
    base: BaseTrees<'s>,
    stamps: &'t Stamps,
    out: Vec<UpperChange>,
}

impl Walk<'_, '_> {
    fn dir(&mut self, host: &Path, path: &[u8], meta: &fs::Metadata) -> Result<()> {
        let same = self.stamps.unchanged(path, meta);
        // The root's own mode lives in the snapshot, not in a tree entry: its change is
        // kept where it differs from `root_mode` (`upper::capture_changes`).
        if !same {
            self.out.push(UpperChange::Dir {
                path: path.to_vec(),
                mode: meta.mode() & 0o7777,
                xattrs: read_xattrs(host)?,
                opaque: false,
            });
        }
        let mut names: Vec<_> = fs::read_dir(host)
            .map_err(Error::io("read directory", host))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<std::io::Result<_>>()
            .map_err(Error::io("read directory", host))?;
        names.sort();
        for name in &names {
            let child = host.join(name);
            let cpath = join(path, name.as_bytes());
            let m = fs::symlink_metadata(&child).map_err(Error::io("stat", &child))?;
            let ft = m.file_type();
            if ft.is_dir() {
                self.dir(&child, &cpath, &m)?;
                continue;
            }
            if self.stamps.unchanged(&cpath, &m) {
                continue;
            }
            let mode = m.mode() & 0o7777;
            if ft.is_file() {
                self.out.push(UpperChange::File {
                    path: cpath,
                    xattrs: read_xattrs(&child)?,
                    host: child,
                    mode,
                    ino: m.ino(),
                    nlink: m.nlink(),
                });
            } else if ft.is_symlink() {
                let target = fs::read_link(&child).map_err(Error::io("read link", &child))?;
                self.out.push(UpperChange::Symlink {
                    path: cpath,
                    target: target.as_os_str().as_bytes().to_vec(),
                    ino: m.ino(),
                    nlink: m.nlink(),
                });
            } else if let Some(special) = crate::upper::special_change(cpath, &m) {
                self.out.push(special);
            }
            // Sockets cannot be stored; they are left out, as overlay leaves them out.
        }
        if !same && let Some(t) = self.base.dir(path)? {
            // Names that left this directory (an unchanged directory kept its names).
            let present: std::collections::HashSet<&[u8]> =
                names.iter().map(|n| n.as_bytes()).collect();
            for e in &t.entries {
                if !present.contains(e.name.as_slice()) {
                    self.out.push(UpperChange::Whiteout {
                        path: join(path, &e.name),
                    });
                }
            }
        }
        Ok(())
    }
}

/// Shows the workspace's tree at its path (a bind mount), creating the path.
pub fn show(rec: &Record) -> Result<()> {
    fs::create_dir_all(&rec.path).map_err(Error::io("create directory", &rec.path))?;
    if mounts::is_mounted(&rec.path)? {
        return Ok(());
    }
    mounts::mount_bind(&tree_dir(rec), &rec.path)
}

/// Whether the workspace's tree was completely made (its stamps are written last).
pub fn made(rec: &Record) -> bool {
    tree_dir(rec).is_dir() && stamps_path(rec).is_file()
}

/// The diff of a full-tree workspace.
pub fn diff(
    store: &Store,
    base: &SnapshotId,
    rec: &Record,
) -> Result<Vec<(cowspace_store::diff::DiffEntry, Option<PathBuf>)>> {
    let stamps = Stamps::load(&stamps_path(rec))?;
    let changes = changes(store, base, &tree_dir(rec), &stamps)?;
    crate::upper::diff_changes(store, base, changes)
}

/// The capture of a full-tree workspace into `ed` (an editor of its base).
pub fn capture(cx: &WorkspaceCtx<'_>, ed: &mut cowspace_store::Editor<'_>) -> Result<()> {
    let rec = cx.rec;
    let stamps = Stamps::load(&stamps_path(rec))?;
    let changes = changes(cx.store, &cx.base()?, &tree_dir(rec), &stamps)?;
    crate::upper::capture_changes(ed, changes)
}

/// The filesystem type of `path` by name, for messages.
pub fn fs_name(path: &Path) -> String {
    use nix::sys::statfs;
    match statfs::statfs(path) {
        Ok(s) => {
            let t = s.filesystem_type();
            let known = [
                (statfs::BTRFS_SUPER_MAGIC, "btrfs"),
                (statfs::XFS_SUPER_MAGIC, "xfs"),
                (statfs::EXT4_SUPER_MAGIC, "ext4"),
                (statfs::TMPFS_MAGIC, "tmpfs"),
                (statfs::OVERLAYFS_SUPER_MAGIC, "overlayfs"),
                (statfs::FUSE_SUPER_MAGIC, "fuse"),
            ];
            known
                .iter()
                .find(|(m, _)| *m == t)
                .map(|(_, n)| n.to_string())
                .unwrap_or_else(|| format!("filesystem type {:#x}", t.0))
        }
        Err(e) => format!("an unknown filesystem ({e})"),
    }
}

/// The lower of `reflink` and `copy`: the snapshot's checkout (the daemon's view cannot
/// be cloned from, and the workspace must not depend on the daemon).
pub fn checkout_lower(
    kind: crate::materializer::MaterializerKind,
    store: &Store,
    snapshot: &SnapshotId,
    asked: crate::kinds::Choice<crate::kinds::LowerKind>,
) -> Result<crate::kinds::LowerPlan> {
    use crate::kinds::{Choice, LowerKind, LowerPlan};
    match asked {
        Choice::Auto | Choice::Exactly(LowerKind::Checkout) => Ok(LowerPlan::new(
            LowerKind::Checkout,
            crate::checkout::checkout_path(store, snapshot),
        )),
        Choice::Exactly(other) => Err(Error::Invalid(format!(
            "lower {other}: the {} materializer copies the snapshot's checkout (lower checkout or auto)",
            kind.as_str()
        ))),
    }
}

/// Makes `<private_dir>/tree` a copy of the checkout `rec.lower` (cloned or copied) and
/// writes its stamps, unless a previous mount made it completely (recover). A partial
/// tree left by a crash is removed first.
pub fn make_copied(cx: &WorkspaceCtx<'_>, fill: Fill) -> Result<()> {
    let rec = cx.rec;
    if made(rec) {
        return Ok(());
    }
    let tree = tree_dir(rec);
    crate::checkout::remove_tree(&tree);
    let _ = fs::remove_file(stamps_path(rec));
    fs::create_dir_all(&rec.private_dir)
        .map_err(Error::io("create directory", &rec.private_dir))?;
    fs::create_dir(&tree).map_err(Error::io("create directory", &tree))?;
    let stamps = build(cx.store, &cx.base()?, &rec.lower, &tree, fill)?;
    Stamps::write(&stamps, &stamps_path(rec))
}
