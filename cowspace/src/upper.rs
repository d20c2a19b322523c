//! Reading an overlay workspace's changes from its private upper directory only, so diff
//! and commit cost what changed, not the size of the repository.
//!
//! Overlay's upper layer holds every created or modified file as a whole file (copy-up;
//! `metacopy=off`), every deleted path as a whiteout (a character device 0:0), and every
//! directory that replaced a base directory as an "opaque" directory
//! (`user.overlay.opaque=y` with `userxattr`; `trusted.overlay.opaque` otherwise). A
//! directory renamed from the base, in a workspace whose overlay has `redirect_dir=on`,
//! is a directory carrying `trusted.overlay.redirect` (the base path it came from,
//! absolute with a leading `/`, else relative to its parent's base path), with a
//! whiteout where it was: its base entries are the origin's, merged with what the upper
//! layer holds under it ([`UpperChange::Redirect`]).

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use cowspace_store::diff::{Change, DiffEntry, write_patch};
use cowspace_store::import::dir::read_xattrs;
use cowspace_store::{ContentId, Entry, Kind, SnapshotId, Store, TreeId};

use crate::error::{Error, Result};
use cowspace_store::tree::Target;
use cowspace_store::tree::join_path as join;

/// One change found in the upper layer, in depth-first name order.
#[derive(Debug, Clone)]
pub enum UpperChange {
    /// The path was deleted (a whiteout).
    Whiteout { path: Vec<u8> },
    /// A directory present in the upper layer; `opaque` hides everything of the base
    /// under it.
    Dir {
        path: Vec<u8>,
        mode: u32,
        xattrs: Vec<(Vec<u8>, Vec<u8>)>,
        opaque: bool,
    },
    File {
        path: Vec<u8>,
        host: PathBuf,
        mode: u32,
        xattrs: Vec<(Vec<u8>, Vec<u8>)>,
        ino: u64,
        nlink: u64,
    },
    Symlink {
        path: Vec<u8>,
        target: Vec<u8>,
        /// As a file's: names of one symlink with several (`ln -P`) share both.
        ino: u64,
        nlink: u64,
    },
    /// The directory just reported at `path` was renamed from the base's `origin`: its
    /// base entries are the origin's (follows its `Dir`).
    Redirect { path: Vec<u8>, origin: Vec<u8> },
    Special {
        path: Vec<u8>,
        kind: Kind,
        mode: u32,
        rdev: u64,
    },
}

/// The recorded xattrs of an upper-layer entry, without overlayfs's own metadata
/// (`user.overlay.*`, which overlay mounts with `userxattr` keep there).
fn user_xattrs(host: &Path) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut x = read_xattrs(host)?;
    x.retain(|(name, _)| {
        !name.starts_with(b"user.overlay.") && !name.starts_with(b"trusted.overlay.")
    });
    Ok(x)
}

fn is_opaque(dir: &Path) -> bool {
    matches!(xattr::get(dir, "trusted.overlay.opaque"), Ok(Some(v)) if v == b"y")
        || matches!(xattr::get(dir, "user.overlay.opaque"), Ok(Some(v)) if v == b"y")
}

/// Walks `upper` and returns its changes.
pub fn changes(upper: &Path) -> Result<Vec<UpperChange>> {
    // The root's own mode first (the upper directory is the workspace's root; a change
    // is kept only where it differs from the snapshot's `root_mode`).
    let meta = fs::symlink_metadata(upper).map_err(Error::io("stat", upper))?;
    let mut out = vec![UpperChange::Dir {
        path: Vec::new(),
        mode: meta.mode() & 0o7777,
        xattrs: user_xattrs(upper)?,
        opaque: false,
    }];
    walk(upper, &[], Some(&[]), &mut out)?;
    Ok(out)
}

/// The base path a redirected directory came from: `value` absolute (`/a/b`) from the
/// base's root, else a name in its parent's base directory `lower_parent`.
fn redirect_origin(value: &[u8], lower_parent: Option<&[u8]>) -> Option<Vec<u8>> {
    if let Some(abs) = value.strip_prefix(b"/") {
        return (!abs.is_empty()).then(|| abs.to_vec());
    }
    if value.is_empty() || value.contains(&b'/') {
        return None;
    }
    Some(join(lower_parent?, value))
}

/// `walk`s `dir` (at `prefix`), whose base directory is `lower` (`None`: nothing of the
/// base shows through, under an opaque directory).
fn walk(dir: &Path, prefix: &[u8], lower: Option<&[u8]>, out: &mut Vec<UpperChange>) -> Result<()> {
    let mut names: Vec<_> = fs::read_dir(dir)
        .map_err(Error::io("read directory", dir))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<std::io::Result<_>>()
        .map_err(Error::io("read directory", dir))?;
    names.sort();
    for name in names {
        let host = dir.join(&name);
        let path = join(prefix, name.as_bytes());
        let meta = fs::symlink_metadata(&host).map_err(Error::io("stat", &host))?;
        let ft = meta.file_type();
        if ft.is_char_device() && meta.rdev() == 0 {
            out.push(UpperChange::Whiteout { path });
        } else if ft.is_dir() {
            let opaque = is_opaque(&host);
            let redirect = match xattr::get(&host, "trusted.overlay.redirect") {
                Ok(Some(v)) => Some(redirect_origin(&v, lower).ok_or_else(|| {
                    Error::Invalid(format!(
                        "{}: an overlay redirect {:?} this version cannot follow",
                        host.display(),
                        String::from_utf8_lossy(&v)
                    ))
                })?),
                _ => None,
            };
            out.push(UpperChange::Dir {
                path: path.clone(),
                mode: meta.mode() & 0o7777,
                xattrs: user_xattrs(&host)?,
                opaque,
            });
            let below = match (&redirect, opaque) {
                (Some(origin), _) => Some(origin.clone()),
                (None, true) => None,
                (None, false) => lower.map(|l| join(l, name.as_bytes())),
            };
            if let Some(origin) = redirect {
                out.push(UpperChange::Redirect {
                    path: path.clone(),
                    origin,
                });
            }
            walk(&host, &path, below.as_deref(), out)?;
        } else if ft.is_file() {
            out.push(UpperChange::File {
                path,
                mode: meta.mode() & 0o7777,
                xattrs: user_xattrs(&host)?,
                host,
                ino: meta.ino(),
                nlink: meta.nlink(),
            });
        } else if ft.is_symlink() {
            let target = fs::read_link(&host).map_err(Error::io("read link", &host))?;
            out.push(UpperChange::Symlink {
                path,
                target: target.as_os_str().as_bytes().to_vec(),
                ino: meta.ino(),
                nlink: meta.nlink(),
            });
        } else if let Some(special) = special_change(path, &meta) {
            out.push(special);
        }
        // Sockets cannot be stored; they are left out of diffs and commits.
    }
    Ok(())
}

/// The change a fifo or device node at `path` (its metadata `meta`) makes; `None` for
/// anything else (sockets cannot be stored and are left out, as overlay leaves them).
pub(crate) fn special_change(path: Vec<u8>, meta: &fs::Metadata) -> Option<UpperChange> {
    let ft = meta.file_type();
    let (kind, rdev) = if ft.is_fifo() {
        (Kind::Fifo, 0)
    } else if ft.is_char_device() {
        (Kind::CharDevice, meta.rdev())
    } else if ft.is_block_device() {
        (Kind::BlockDevice, meta.rdev())
    } else {
        return None;
    };
    Some(UpperChange::Special {
        path,
        kind,
        mode: meta.mode() & 0o7777,
        rdev,
    })
}

/// Base trees looked up by path, loading each directory once.
pub(crate) struct BaseTrees<'s> {
    store: &'s Store,
    /// Trees shared, not copied: a lookup per file must not clone its directory.
    cache: std::collections::HashMap<Vec<u8>, Option<std::sync::Arc<cowspace_store::Tree>>>,
    root: TreeId,
}

impl<'s> BaseTrees<'s> {
    pub(crate) fn new(store: &'s Store, root: TreeId) -> Self {
        BaseTrees {
            store,
            cache: Default::default(),
            root,
        }
    }

    pub(crate) fn dir(
        &mut self,
        path: &[u8],
    ) -> Result<Option<std::sync::Arc<cowspace_store::Tree>>> {
        if let Some(t) = self.cache.get(path) {
            return Ok(t.clone());
        }
        let t = if path.is_empty() {
            Some(std::sync::Arc::new(self.store.tree(&self.root)?))
        } else {
            let (parent, name) = match path.iter().rposition(|&b| b == b'/') {
                Some(i) => (&path[..i], &path[i + 1..]),
                None => (&b""[..], path),
            };
            match self
                .dir(parent)?
                .and_then(|t| t.get(name).and_then(|e| e.subtree()))
            {
                Some(sub) => Some(std::sync::Arc::new(self.store.tree(&sub)?)),
                None => None,
            }
        };
        self.cache.insert(path.to_vec(), t.clone());
        Ok(t)
    }

    pub(crate) fn entry(&mut self, path: &[u8]) -> Result<Option<Entry>> {
        let (parent, name) = match path.iter().rposition(|&b| b == b'/') {
            Some(i) => (&path[..i], &path[i + 1..]),
            None => (&b""[..], path),
        };
        Ok(self.dir(parent)?.and_then(|t| t.get(name).cloned()))
    }
}

fn family(k: Kind) -> Kind {
    if k == Kind::Hardlink { Kind::File } else { k }
}

fn content_of(host: &Path) -> Result<(ContentId, u64)> {
    let mut h = blake3::Hasher::new();
    let f = fs::File::open(host).map_err(Error::io("open", host))?;
    let n =
        std::io::copy(&mut std::io::BufReader::new(f), &mut h).map_err(Error::io("read", host))?;
    Ok((ContentId::from_bytes(*h.finalize().as_bytes()), n))
}

fn synth(path: &[u8], kind: Kind, mode: u32, size: u64, hash: [u8; 32], data: Vec<u8>) -> Entry {
    let name = path.rsplit(|&b| b == b'/').next().unwrap_or(path).to_vec();
    Entry {
        name,
        kind,
        mode,
        size,
        hash,
        data,
        xattrs: vec![],
    }
}

fn diff_entry(path: &[u8], change: Change, old: Option<Entry>, new: Option<Entry>) -> DiffEntry {
    DiffEntry {
        path: String::from_utf8_lossy(path).into_owned(),
        change,
        old_kind: old.as_ref().map(|e| e.kind),
        new_kind: new.as_ref().map(|e| e.kind),
        raw_path: path.to_vec(),
        old,
        new,
    }
}

/// The changes of an overlay workspace against its base snapshot, from its upper
/// directory; also the host path of each new or modified file (for patches).
pub fn diff(
    store: &Store,
    base: &SnapshotId,
    upper: &Path,
) -> Result<Vec<(DiffEntry, Option<PathBuf>)>> {
    diff_changes(store, base, changes(upper)?)
}

/// The changes (as an upper layer would record them) against the base snapshot as diff
/// entries, with the host path of each new or modified file. Shared with the
/// materializers that find their changes another way (`materializer::fulltree`).
pub fn diff_changes(
    store: &Store,
    base: &SnapshotId,
    changes: Vec<UpperChange>,
) -> Result<Vec<(DiffEntry, Option<PathBuf>)>> {
    let snap = store.snapshot(base)?;
    let mut base_trees = BaseTrees::new(store, snap.root);
    let mut out: Vec<(DiffEntry, Option<PathBuf>)> = Vec::new();
    let mut list_base = |store: &Store,
                         tree: Option<TreeId>,
                         prefix: &[u8],
                         change: Change,
                         out: &mut Vec<(DiffEntry, Option<PathBuf>)>|
     -> Result<()> {
        let mut tmp = Vec::new();
        if change == Change::Deleted {
            store.diff_trees(tree.as_ref(), None, prefix, &mut tmp)?;
        } else {
            store.diff_trees(None, tree.as_ref(), prefix, &mut tmp)?;
        }
        out.extend(tmp.into_iter().map(|d| (d, None)));
        Ok(())
    };
    // Under an opaque directory, base entries not present in the upper are deleted.
    let upper_paths: std::collections::HashSet<Vec<u8>> = changes
        .iter()
        .map(|c| match c {
            UpperChange::Whiteout { path }
            | UpperChange::Dir { path, .. }
            | UpperChange::File { path, .. }
            | UpperChange::Symlink { path, .. }
            | UpperChange::Redirect { path, .. }
            | UpperChange::Special { path, .. } => path.clone(),
        })
        .collect();
    // Upper directories whose base is not the one at their path (opaque: none;
    // redirected: their origin), and whiteouts: a redirected directory's listing of
    // its origin does not descend into them.
    let own_base: std::collections::HashSet<Vec<u8>> = changes
        .iter()
        .filter_map(|c| match c {
            UpperChange::Dir {
                path, opaque: true, ..
            }
            | UpperChange::Redirect { path, .. }
            | UpperChange::Whiteout { path } => Some(path.clone()),
            _ => None,
        })
        .collect();
    for c in &changes {
        match c {
            UpperChange::Redirect { path, origin } => {
                // The origin's entries appear at `path`: each one the upper layer does
                // not report itself is new there (the origin's own deletion is its
                // whiteout's).
                let origin_tree = base_trees.entry(origin)?.and_then(|e| e.subtree());
                redirected_entries(
                    store,
                    origin_tree,
                    path,
                    &upper_paths,
                    &own_base,
                    &mut base_trees,
                    &mut out,
                )?;
            }
            UpperChange::Dir {
                path, mode, xattrs, ..
            } if path.is_empty() => {
                out.extend(
                    cowspace_store::diff::root_change(
                        (snap.root_mode, &snap.root_xattrs),
                        (*mode, xattrs),
                    )
                    .map(|d| (d, None)),
                );
            }
            UpperChange::Whiteout { path } => {
                if let Some(old) = base_trees.entry(path)? {
                    out.push((
                        diff_entry(path, Change::Deleted, Some(old.clone()), None),
                        None,
                    ));
                    if old.kind == Kind::Dir {
                        list_base(store, old.subtree(), path, Change::Deleted, &mut out)?;
                    }
                }
            }
            UpperChange::Dir {
                path,
                mode,
                xattrs,
                opaque,
            } => {
                let old = base_trees.entry(path)?;
                let new = Entry {
                    xattrs: xattrs.clone(),
                    ..synth(path, Kind::Dir, *mode, 0, [0; 32], vec![])
                };
                match &old {
                    None => out.push((diff_entry(path, Change::Added, None, Some(new)), None)),
                    Some(o) if o.kind != Kind::Dir => out.push((
                        diff_entry(path, Change::TypeChanged, Some(o.clone()), Some(new)),
                        None,
                    )),
                    Some(o) => {
                        if o.mode != *mode || o.xattrs != *xattrs {
                            out.push((
                                diff_entry(path, Change::Modified, Some(o.clone()), Some(new)),
                                None,
                            ));
                        }
                        if *opaque {
                            for e in base_trees
                                .dir(path)?
                                .map(|t| t.entries.clone())
                                .unwrap_or_default()
                            {
                                let p = join(path, &e.name);
                                if !upper_paths.contains(&p) {
                                    out.push((
                                        diff_entry(&p, Change::Deleted, Some(e.clone()), None),
                                        None,
                                    ));
                                    if e.kind == Kind::Dir {
                                        list_base(
                                            store,
                                            e.subtree(),
                                            &p,
                                            Change::Deleted,
                                            &mut out,
                                        )?;
                                    }
                                }
                            }
                        }
                    }
                }
            }
            UpperChange::File {
                path,
                host,
                mode,
                xattrs,
                ..
            } => {
                let old = base_trees.entry(path)?;
                let (id, size) = content_of(host)?;
                let mut new = synth(path, Kind::File, *mode, size, *id.as_bytes(), vec![]);
                new.xattrs = xattrs.clone();
                push_leaf(
                    &mut out,
                    path,
                    old,
                    new,
                    Some(host.clone()),
                    store,
                    &mut list_base,
                )?;
            }
            UpperChange::Symlink { path, target, .. } => {
                let old = base_trees.entry(path)?;
                let new = synth(
                    path,
                    Kind::Symlink,
                    0o777,
                    target.len() as u64,
                    [0; 32],
                    target.clone(),
                );
                push_leaf(&mut out, path, old, new, None, store, &mut list_base)?;
            }
            UpperChange::Special {
                path,
                kind,
                mode,
                rdev,
            } => {
                let old = base_trees.entry(path)?;
                let data = if matches!(kind, Kind::CharDevice | Kind::BlockDevice) {
                    rdev.to_le_bytes().to_vec()
                } else {
                    vec![]
                };
                let new = synth(path, *kind, *mode, 0, [0; 32], data);
                push_leaf(&mut out, path, old, new, None, store, &mut list_base)?;
            }
        }
    }
    out.sort_by(|a, b| a.0.raw_path.cmp(&b.0.raw_path));
    out.dedup_by(|a, b| a.0.raw_path == b.0.raw_path);
    Ok(out)
}

/// The entries of the base tree `tree` (a redirected directory's origin) at `prefix`,
/// as added, but those the upper layer reports itself (`upper_paths`), and nothing
/// under an upper directory with a base of its own or a whiteout (`own_base`).
#[allow(clippy::too_many_arguments)]
fn redirected_entries(
    store: &Store,
    tree: Option<TreeId>,
    prefix: &[u8],
    upper_paths: &std::collections::HashSet<Vec<u8>>,
    own_base: &std::collections::HashSet<Vec<u8>>,
    base_trees: &mut BaseTrees<'_>,
    out: &mut Vec<(DiffEntry, Option<PathBuf>)>,
) -> Result<()> {
    let Some(tree) = tree else { return Ok(()) };
    for e in store.tree(&tree)?.entries.iter() {
        let p = join(prefix, &e.name);
        if own_base.contains(&p) {
            continue;
        }
        if !upper_paths.contains(&p) {
            let old = base_trees.entry(&p)?;
            let change = if old.is_some() {
                Change::Modified
            } else {
                Change::Added
            };
            out.push((diff_entry(&p, change, old, Some(e.clone())), None));
        }
        if e.kind == Kind::Dir {
            redirected_entries(
                store,
                e.subtree(),
                &p,
                upper_paths,
                own_base,
                base_trees,
                out,
            )?;
        }
    }
    Ok(())
}

type ListBase<'a> = dyn FnMut(
        &Store,
        Option<TreeId>,
        &[u8],
        Change,
        &mut Vec<(DiffEntry, Option<PathBuf>)>,
    ) -> Result<()>
    + 'a;

fn push_leaf(
    out: &mut Vec<(DiffEntry, Option<PathBuf>)>,
    path: &[u8],
    old: Option<Entry>,
    new: Entry,
    host: Option<PathBuf>,
    store: &Store,
    list_base: &mut ListBase<'_>,
) -> Result<()> {
    match old {
        None => out.push((diff_entry(path, Change::Added, None, Some(new)), host)),
        Some(o) if family(o.kind) != family(new.kind) => {
            let was_dir = o.kind == Kind::Dir;
            let sub = o.subtree();
            out.push((
                diff_entry(path, Change::TypeChanged, Some(o), Some(new)),
                host,
            ));
            if was_dir {
                list_base(store, sub, path, Change::Deleted, out)?;
            }
        }
        Some(o) => {
            let same = o.hash == new.hash
                && o.mode == new.mode
                && o.size == new.size
                && o.xattrs == new.xattrs
                && (o.kind != Kind::Symlink || o.data == new.data)
                && (!matches!(o.kind, Kind::CharDevice | Kind::BlockDevice) || o.data == new.data);
            if !same {
                out.push((diff_entry(path, Change::Modified, Some(o), Some(new)), host));
            }
        }
    }
    Ok(())
}

/// A unified patch of an overlay workspace's changes.
pub fn patch(store: &Store, changes: &[(DiffEntry, Option<PathBuf>)]) -> Result<String> {
    let mut out = String::new();
    for (c, host) in changes {
        let old = c.old.as_ref().filter(|e| e.kind != Kind::Dir);
        let new = c.new.as_ref().filter(|e| e.kind != Kind::Dir);
        if old.is_none() && new.is_none() {
            continue;
        }
        let big = cowspace_store::diff::MAX_TEXT_DIFF_BYTES;
        let ob = match old.map(|e| (e, e.target())) {
            Some((e, Target::File(c) | Target::Hardlink(c))) if e.size <= big => {
                Some(store.read_content(&c)?)
            }
            Some((e, Target::Symlink)) => Some(e.data.clone()),
            _ => None,
        };
        let nb = match (new.map(|e| (e, e.target())), host) {
            (Some((e, _)), Some(h)) if e.size <= big => {
                Some(fs::read(h).map_err(Error::io("read", h))?)
            }
            // Stored content (`diff WS SNAP`: a path the workspace holds as its base).
            (Some((e, Target::File(c) | Target::Hardlink(c))), None) if e.size <= big => {
                Some(store.read_content(&c)?)
            }
            (Some((e, Target::Symlink)), _) => Some(e.data.clone()),
            _ => None,
        };
        write_patch(
            &mut out,
            &c.raw_path,
            old,
            ob.as_deref(),
            new,
            nb.as_deref(),
        );
    }
    Ok(out)
}

/// Feeds an overlay upper directory's changes into `ed` (an editor of the base).
pub fn capture(ed: &mut cowspace_store::Editor<'_>, upper: &Path) -> Result<()> {
    capture_changes(ed, changes(upper)?)
}

/// Feeds changes (as an upper layer would record them) into `ed`.
pub fn capture_changes(
    ed: &mut cowspace_store::Editor<'_>,
    changes: Vec<UpperChange>,
) -> Result<()> {
    for c in changes {
        match c {
            UpperChange::Dir {
                path, mode, xattrs, ..
            } if path.is_empty() => {
                // The root's mode and xattrs are the snapshot's `root_mode`, `root_xattrs`.
                let base = ed.base();
                if cowspace_store::diff::root_change(
                    (base.root_mode, &base.root_xattrs),
                    (mode, &xattrs),
                )
                .is_some()
                {
                    ed.put_dir(&path, mode, xattrs)?;
                }
            }
            UpperChange::Whiteout { path } => ed.delete(&path)?,
            UpperChange::Redirect { path, origin } => ed.rebase_dir(&path, &origin)?,
            UpperChange::Dir {
                path,
                mode,
                xattrs,
                opaque: true,
            } => ed.clear_dir(&path, mode, xattrs)?,
            UpperChange::Dir {
                path,
                mode,
                xattrs,
                opaque: false,
            } => ed.put_dir(&path, mode, xattrs)?,
            UpperChange::File {
                path,
                host,
                mode,
                xattrs,
                ino,
                nlink,
            } => ed.put_file(&path, host, mode, xattrs, (nlink > 1).then_some(ino))?,
            UpperChange::Symlink {
                path,
                target,
                ino,
                nlink,
            } => ed.put_linked_symlink(&path, target, vec![], (nlink > 1).then_some(ino))?,
            UpperChange::Special {
                path,
                kind,
                mode,
                rdev,
            } => ed.put_special(&path, kind, mode, rdev)?,
        }
    }
    Ok(())
}
