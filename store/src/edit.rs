//! Editing a snapshot: a new snapshot made from a base plus a set of changes, in time
//! proportional to the changes.
//!
//! Only the directories on the paths of changes are loaded and rewritten (path copying);
//! every other subtree keeps its id. This is how a workspace's changes are captured: the
//! caller walks what the workspace changed and tells the editor (`delete`, `put_file`,
//! `put_dir`, `clear_dir`, ...), then [`Editor::commit`] writes one snapshot whose parent
//! is the base, in one transaction with an optional compare-and-swap ref move.
//!
//! Hard links: new files may form link groups among themselves (their canonical primary
//! is chosen as at import). If the base had hard links and a change touches a group's
//! primary, the group is re-formed by a walk of the new tree (the only case whose cost is
//! not bounded by the changes; snapshots record whether they have hard links).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::id::{SnapshotId, TreeId};
use crate::import::{ImportReport, Wrote};
use crate::index::ObjectKind;
use crate::ingest::{FileContent, Ingest};
use crate::lock::StoreLock;
use crate::refs::{self, Expect};
use crate::snapshot::{SNAPSHOT_VERSION, Snapshot, Source, now_secs};
use crate::store::Store;
use crate::tree::{self, Entry, Kind};

mod links;
mod symlinks;
mod write;

use crate::tree::join_path as join;
use links::{regroup, relink};
use write::{Trees, Writer, sorted};

type Xattrs = Vec<(Vec<u8>, Vec<u8>)>;

#[derive(Debug, Clone, Copy)]
enum Content {
    Known(FileContent),
    Pending(usize),
}

#[derive(Debug)]
enum Leaf {
    File {
        mode: u32,
        content: Content,
        link: Option<u64>,
        xattrs: Xattrs,
    },
    Symlink {
        target: Vec<u8>,
        xattrs: Xattrs,
        /// Groups names of one multiply-linked symlink, as `File`'s `link` does.
        link: Option<u64>,
    },
    Special {
        kind: Kind,
        mode: u32,
        rdev: u64,
    },
}

#[derive(Debug)]
enum Child {
    Delete,
    Dir(DirEdit),
    Leaf(Leaf),
}

#[derive(Debug, Default)]
struct DirEdit {
    /// The directory's tree in the base, if it was a directory there (and not cleared).
    base: Option<TreeId>,
    mode: Option<u32>,
    xattrs: Option<Xattrs>,
    children: BTreeMap<Vec<u8>, Child>,
}

/// Builds a new snapshot from a base and changes.
pub struct Editor<'s> {
    store: &'s Store,
    _lock: StoreLock,
    ingest: Ingest<'s>,
    base_id: SnapshotId,
    base: Snapshot,
    root: DirEdit,
    slots: Vec<Option<FileContent>>,
    files_read: u64,
    started: Instant,
    changed: u64,
    touched_primary: bool,
    parents: Vec<SnapshotId>,
    git_fsmonitor: Option<String>,
    /// Stat-cache rows recorded with the snapshot: a source root and its new stamps.
    stat_cache: Option<(String, StatRows)>,
    /// [`Editor::unless_same_as`].
    unless_same: Option<SnapshotId>,
    /// Directories rebased on another base directory ([`Editor::rebase_dir`]):
    /// (origin, new path), for hard links whose primary moved with them.
    moved: Vec<(Vec<u8>, Vec<u8>)>,
    /// [`Editor::pin_for`].
    pin_holder: Option<String>,
    /// [`Editor::exclude_by`].
    filter: Option<crate::import::exclude::ChangeFilter>,
}

/// Stat-cache rows: a path under a source root, its stamp, its content.
pub type StatRows = Vec<crate::statcache::Row>;

impl std::fmt::Debug for Editor<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Editor")
            .field("base", &self.base_id)
            .finish()
    }
}

/// Splits a `/`-separated path into checked components (empty for the root).
pub fn split_path(path: &[u8]) -> Result<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    for c in path.split(|&b| b == b'/') {
        if c.is_empty() {
            continue;
        }
        tree::check_name(c)?;
        out.push(c.to_vec());
    }
    Ok(out)
}

impl Store {
    /// Starts editing `base`.
    pub fn edit(&self, base: &SnapshotId) -> Result<Editor<'_>> {
        let snap = self.snapshot(base)?;
        let lock = StoreLock::shared(self)?;
        let ingest = Ingest::start(self)?;
        Ok(Editor {
            store: self,
            _lock: lock,
            ingest,
            base_id: *base,
            root: DirEdit {
                base: Some(snap.root),
                ..Default::default()
            },
            base: snap,
            slots: Vec::new(),
            files_read: 0,
            started: Instant::now(),
            changed: 0,
            touched_primary: false,
            moved: Vec::new(),
            filter: None,
            parents: vec![*base],
            git_fsmonitor: None,
            stat_cache: None,
            unless_same: None,
            pin_holder: None,
        })
    }
}

impl<'s> Editor<'s> {
    /// Pins the snapshot [`Editor::commit`] makes (or keeps) for `holder` (a workspace),
    /// in the commit's own transaction: from the moment its id is reported, gc keeps it
    /// until `holder`'s pins are dropped ([`Store::unpin`]).
    pub fn pin_for(&mut self, holder: &str) {
        self.pin_holder = Some(holder.to_string());
    }

    /// The fsmonitor token the new snapshot's `.git/index` carries, vouched for by the
    /// caller (see [`Snapshot::git_fsmonitor`]).
    pub fn set_git_fsmonitor(&mut self, token: Option<String>) {
        self.git_fsmonitor = token;
    }

    /// Records these parents instead of the base (e.g. a workspace's previous capture).
    pub fn set_parents(&mut self, parents: Vec<SnapshotId>) {
        self.parents = parents;
    }

    /// Makes [`Editor::commit`] write no snapshot when the tree it would record is
    /// `snap`'s (the same root tree and root mode): it then answers with `snap` itself,
    /// [`ImportReport::unchanged`] set, and moves the ref, if asked, to `snap`.
    pub fn unless_same_as(&mut self, snap: SnapshotId) {
        self.unless_same = Some(snap);
    }

    /// The store the new snapshot is written to.
    pub fn store(&self) -> &'s Store {
        self.store
    }

    /// The base snapshot.
    pub fn base(&self) -> &Snapshot {
        &self.base
    }

    /// The base's entry at `path`, if any (for comparisons by the caller).
    pub fn base_entry(&self, path: &[u8]) -> Result<Option<Entry>> {
        let comps = split_path(path)?;
        let mut tree = self.store.tree(&self.base.root)?;
        for (i, c) in comps.iter().enumerate() {
            let Some(e) = tree.get(c).cloned() else {
                return Ok(None);
            };
            if i + 1 == comps.len() {
                return Ok(Some(e));
            }
            match e.subtree() {
                Some(t) => tree = self.store.tree(&t)?,
                None => return Ok(None),
            }
        }
        Ok(None)
    }

    /// The directory edit for `comps`, created along the way. Components that were not
    /// directories in the base become new directories.
    fn dir_mut(&mut self, comps: &[Vec<u8>]) -> Result<&mut DirEdit> {
        let store = self.store;
        let mut node = &mut self.root;
        for name in comps {
            let needs_new = !matches!(node.children.get(name), Some(Child::Dir(_)));
            if needs_new {
                let base = match node.children.get(name) {
                    Some(Child::Delete) | Some(Child::Leaf(_)) => None,
                    _ => match node.base {
                        Some(t) => store.tree(&t)?.get(name).and_then(|e| e.subtree()),
                        None => None,
                    },
                };
                node.children.insert(
                    name.clone(),
                    Child::Dir(DirEdit {
                        base,
                        ..Default::default()
                    }),
                );
            }
            node = match node.children.get_mut(name) {
                Some(Child::Dir(d)) => d,
                _ => unreachable!("just inserted"),
            };
        }
        Ok(node)
    }

    /// Leaves out the changes the base's recorded exclusion policy excludes (new paths
    /// only; [`crate::import::exclude::ChangeFilter`]): every `put_*` of such a path is a
    /// no-op. Deletions always apply.
    pub fn exclude_by(&mut self, filter: crate::import::exclude::ChangeFilter) {
        self.filter = Some(filter);
    }

    /// Paths [`Editor::exclude_by`] left out so far (a directory counts once).
    pub fn left_out(&self) -> u64 {
        self.filter.as_ref().map_or(0, |f| f.left_out_count())
    }

    fn is_left_out(&mut self, path: &[u8], is_dir: bool) -> Result<bool> {
        match self.filter.as_mut() {
            Some(f) => f.left_out(self.store, path, is_dir),
            None => Ok(false),
        }
    }

    fn set(&mut self, path: &[u8], child: Child) -> Result<()> {
        if !matches!(child, Child::Delete) && self.is_left_out(path, false)? {
            return Ok(());
        }
        let comps = split_path(path)?;
        let Some((last, parents)) = comps.split_last() else {
            return Err(Error::Invalid("the root cannot be replaced".into()));
        };
        if self.base.counts.hardlinks > 0 {
            self.touched_primary = true;
        }
        self.changed += 1;
        let dir = self.dir_mut(parents)?;
        dir.children.insert(last.clone(), child);
        Ok(())
    }

    /// Deletes whatever is at `path` (and everything under it).
    pub fn delete(&mut self, path: &[u8]) -> Result<()> {
        self.set(path, Child::Delete)
    }

    /// Makes `path` a directory with this mode and xattrs, keeping the base's entries
    /// under it if it was a directory there.
    pub fn put_dir(&mut self, path: &[u8], mode: u32, xattrs: Xattrs) -> Result<()> {
        if self.is_left_out(path, true)? {
            return Ok(());
        }
        let comps = split_path(path)?;
        self.changed += 1;
        let dir = self.dir_mut(&comps)?;
        dir.mode = Some(mode & 0o7777);
        dir.xattrs = Some(xattrs);
        Ok(())
    }

    /// Makes the directory at `path` (already put) take its base entries from the
    /// base's directory `origin` instead of its own (an overlay directory renamed from
    /// `origin`, a redirect): `origin`'s subtree is kept by id, later changes under
    /// `path` apply on top of it. The origin's own removal is the caller's (`delete`).
    pub fn rebase_dir(&mut self, path: &[u8], origin: &[u8]) -> Result<()> {
        if self.is_left_out(path, true)? {
            return Ok(());
        }
        let tree = match self.base_entry(origin)? {
            Some(e) if e.kind == Kind::Dir => e.subtree(),
            _ => {
                return Err(Error::Invalid(format!(
                    "{:?} was renamed from {:?}, which is no directory of the base",
                    String::from_utf8_lossy(path),
                    String::from_utf8_lossy(origin)
                )));
            }
        };
        let comps = split_path(path)?;
        if comps.is_empty() {
            return Err(Error::Invalid("the root cannot be renamed".into()));
        }
        if self.base.counts.hardlinks > 0 {
            self.touched_primary = true;
        }
        self.changed += 1;
        let dir = self.dir_mut(&comps)?;
        dir.base = tree;
        self.moved.push((origin.to_vec(), path.to_vec()));
        Ok(())
    }

    /// Makes `path` an empty directory: nothing of the base under it survives (an overlay
    /// "opaque" directory); later `put_*` calls fill it.
    pub fn clear_dir(&mut self, path: &[u8], mode: u32, xattrs: Xattrs) -> Result<()> {
        if self.is_left_out(path, true)? {
            return Ok(());
        }
        let comps = split_path(path)?;
        match comps.split_last() {
            None => {
                self.root = DirEdit {
                    base: None,
                    ..Default::default()
                };
            }
            Some((last, parents)) => {
                let dir = self.dir_mut(parents)?;
                dir.children
                    .insert(last.clone(), Child::Dir(DirEdit::default()));
            }
        }
        if self.base.counts.hardlinks > 0 {
            self.touched_primary = true;
        }
        self.put_dir(path, mode, xattrs)
    }

    /// Stores the file at `host_path` as `path` (read by the ingest workers).
    /// `link` groups names of one multiply-linked file (e.g. its host inode number).
    pub fn put_file(
        &mut self,
        path: &[u8],
        host_path: PathBuf,
        mode: u32,
        xattrs: Xattrs,
        link: Option<u64>,
    ) -> Result<()> {
        self.put_file_read(path, host_path, mode, xattrs, link)
            .map(drop)
    }

    /// [`Editor::put_file`], returning the number under which [`Editor::read_contents`]
    /// gives the content read.
    pub fn put_file_read(
        &mut self,
        path: &[u8],
        host_path: PathBuf,
        mode: u32,
        xattrs: Xattrs,
        link: Option<u64>,
    ) -> Result<usize> {
        let slot = self.slots.len();
        self.slots.push(None);
        if self.is_left_out(path, false)? {
            // Never read; its slot stays empty.
            return Ok(slot);
        }
        self.files_read += 1;
        self.ingest.submit_path(slot, host_path, u64::MAX)?;
        self.drain(false)?;
        self.set(
            path,
            Child::Leaf(Leaf::File {
                mode: mode & 0o7777,
                content: Content::Pending(slot),
                link,
                xattrs,
            }),
        )?;
        Ok(slot)
    }

    /// The contents of every file put so far by [`Editor::put_file_read`], by its
    /// number, once all are read.
    pub fn read_contents(&mut self) -> Result<Vec<Option<FileContent>>> {
        self.drain(true)?;
        Ok(self.slots.clone())
    }

    /// Stat-cache rows for the files of source root `root`, recorded in the same
    /// transaction as the snapshot (see [`crate::statcache`]).
    pub fn record_stat_cache(&mut self, root: String, rows: StatRows) {
        self.stat_cache = Some((root, rows));
    }

    /// Stores `bytes` as the file at `path`.
    pub fn put_bytes(&mut self, path: &[u8], bytes: &[u8], mode: u32) -> Result<()> {
        let content = self.ingest.store_reader(bytes, bytes.len() as u64)?;
        self.set(
            path,
            Child::Leaf(Leaf::File {
                mode: mode & 0o7777,
                content: Content::Known(content),
                link: None,
                xattrs: vec![],
            }),
        )
    }

    /// Puts a file whose content is already stored (e.g. unchanged content, new mode).
    pub fn put_stored_file(
        &mut self,
        path: &[u8],
        content: FileContent,
        mode: u32,
        xattrs: Xattrs,
    ) -> Result<()> {
        if !self.store.contains(content.id.as_bytes())? {
            return Err(Error::not_found("content", content.id.to_hex()));
        }
        self.set(
            path,
            Child::Leaf(Leaf::File {
                mode: mode & 0o7777,
                content: Content::Known(content),
                link: None,
                xattrs,
            }),
        )
    }

    pub fn put_symlink(&mut self, path: &[u8], target: Vec<u8>, xattrs: Xattrs) -> Result<()> {
        self.put_linked_symlink(path, target, xattrs, None)
    }

    /// [`Editor::put_symlink`] of one name of a symlink that may have several: `link`
    /// groups the names of one multiply-linked symlink (e.g. its host inode number), as
    /// [`Editor::put_file`]'s does; the commit records them as one link group.
    pub fn put_linked_symlink(
        &mut self,
        path: &[u8],
        target: Vec<u8>,
        xattrs: Xattrs,
        link: Option<u64>,
    ) -> Result<()> {
        if target.is_empty() || target.len() > tree::MAX_TARGET_BYTES {
            return Err(Error::Invalid(format!(
                "symlink {:?} has an unusable target",
                String::from_utf8_lossy(path)
            )));
        }
        self.set(
            path,
            Child::Leaf(Leaf::Symlink {
                target,
                xattrs,
                link,
            }),
        )
    }

    pub fn put_special(&mut self, path: &[u8], kind: Kind, mode: u32, rdev: u64) -> Result<()> {
        self.set(
            path,
            Child::Leaf(Leaf::Special {
                kind,
                mode: mode & 0o7777,
                rdev,
            }),
        )
    }

    /// Number of changes recorded so far.
    pub fn changes(&self) -> u64 {
        self.changed
    }

    fn drain(&mut self, wait: bool) -> Result<()> {
        while let Some((slot, r)) = self.ingest.next_result(wait) {
            self.slots[slot] = Some(r?.0);
        }
        Ok(())
    }

    /// Writes the new snapshot (parent: the base) and, if asked, moves `ref_name` from
    /// `expect` to it in the same transaction.
    pub fn commit(
        mut self,
        message: &str,
        source: Source,
        ref_name: Option<(&str, Expect)>,
    ) -> Result<ImportReport> {
        self.drain(true)?;
        let mut counts = self.base.counts;
        counts.excluded = self.left_out();
        let mut primaries = HashMap::new();
        let mut symlink_primaries = HashMap::new();
        collect_primaries(&self.root, &[], &mut primaries, &mut symlink_primaries);
        let root_edit = std::mem::take(&mut self.root);
        let mut written = HashMap::new();
        let mut w = Writer {
            store: self.store,
            slots: &self.slots,
            primaries: &primaries,
            symlink_primaries: &symlink_primaries,
            linked_symlinks: false,
            counts: &mut counts,
            written: &mut written,
        };
        let mut root = w.write_dir(&root_edit, &[], &mut self.ingest)?;
        if w.linked_symlinks {
            // Link groups of symlinks this edit touched are formed again from the
            // whole tree (before files' groups: those passes keep symlinks as they are).
            let mut put = HashMap::new();
            collect_put_symlinks(&root_edit, &[], &mut put);
            root = symlinks::regroup(
                self.store,
                &mut written,
                &mut self.ingest,
                &root,
                &put,
                &mut counts,
            )?;
        }
        let root_mode = root_edit.mode.unwrap_or(self.base.root_mode);
        let root_xattrs = root_edit
            .xattrs
            .as_ref()
            .map(sorted)
            .unwrap_or_else(|| self.base.root_xattrs.clone());
        if self.touched_primary {
            let trees = Trees {
                store: self.store,
                written: &written,
            };
            let mut put = std::collections::HashSet::new();
            collect_put_files(&root_edit, &[], &mut put);
            root = if self.moved.is_empty() {
                relink(&trees, &mut self.ingest, &root, &put, &mut counts)?
            } else {
                regroup(
                    &trees,
                    &mut self.ingest,
                    &root,
                    &put,
                    &self.moved,
                    &mut counts,
                )?
            };
        }
        if let Some((name, _)) = ref_name {
            refs::check_ref_name(name)?;
        }
        if let Some(same) = self.unless_same.take() {
            let before = self.store.snapshot(&same)?;
            if before.root == root
                && before.root_mode == root_mode
                && before.root_xattrs == root_xattrs
            {
                return self.keep(same, before, ref_name);
            }
        }
        let snap = Snapshot {
            version: SNAPSHOT_VERSION,
            root,
            root_mode,
            parents: std::mem::take(&mut self.parents),
            created_at: now_secs(),
            message: message.to_string(),
            source,
            policy: self.base.policy.clone(),
            counts,
            git_fsmonitor: self.git_fsmonitor.take(),
            root_xattrs,
        };
        let (id, bytes) = snap.encode_with_id()?;
        self.ingest
            .put(ObjectKind::Snapshot, *id.as_bytes(), &bytes)?;
        let w = self.write_pending(&id, ref_name)?;
        Ok(w.report(id, snap, ref_name))
    }

    /// Commits what was ingested, with the ref move to `id` and the stat-cache rows, in
    /// one transaction: (objects written, bytes stored, raw bytes).
    fn write_pending(
        mut self,
        id: &SnapshotId,
        ref_name: Option<(&str, Expect)>,
    ) -> Result<Written> {
        let pinned_by = self.pin_holder.clone();
        let pending = self.ingest.finish()?;
        let wrote = Wrote::of(&pending, self.files_read, self.started);
        let stat_cache = self.stat_cache.take();
        let pin_holder = self.pin_holder.take();
        self.store.commit(pending, |tx| {
            if let Some((name, expect)) = ref_name {
                refs::compare_and_swap(tx, name, expect, id)?;
            }
            if let Some(holder) = &pin_holder {
                crate::gc::pin_in(tx, id, holder)?;
            }
            if let Some((root, rows)) = &stat_cache {
                crate::statcache::apply(tx, root, rows, &[])?;
            }
            Ok(())
        })?;
        Ok(Written { pinned_by, wrote })
    }

    /// The end of a [`Editor::commit`] that found nothing changed since `id`
    /// ([`Editor::unless_same_as`]): what was written meanwhile (trees the store has
    /// already) and the ref move to `id` are committed; no snapshot is.
    fn keep(
        self,
        id: SnapshotId,
        snap: Snapshot,
        ref_name: Option<(&str, Expect)>,
    ) -> Result<ImportReport> {
        let excluded = self.left_out();
        let w = self.write_pending(&id, ref_name)?;
        Ok(ImportReport {
            excluded,
            unchanged: true,
            ..w.report(id, snap, ref_name)
        })
    }
}

/// What [`Editor::write_pending`] wrote.
struct Written {
    pinned_by: Option<String>,
    wrote: Wrote,
}

impl Written {
    /// The report of the commit that made (or kept) `snap` as `id`.
    fn report(
        self,
        id: SnapshotId,
        snap: Snapshot,
        ref_name: Option<(&str, Expect)>,
    ) -> ImportReport {
        let ref_name = ref_name.map(|(n, _)| n.to_string());
        ImportReport {
            pinned_by: self.pinned_by,
            ..ImportReport::new(id, snap, ref_name, self.wrote)
        }
    }
}

/// The paths of every file this edit puts (new objects, whatever they held before).
fn collect_put_files(d: &DirEdit, prefix: &[u8], out: &mut std::collections::HashSet<Vec<u8>>) {
    for (name, c) in &d.children {
        let p = join(prefix, name);
        match c {
            Child::Leaf(Leaf::File { .. }) => {
                out.insert(p);
            }
            Child::Dir(sub) => collect_put_files(sub, &p, out),
            _ => {}
        }
    }
}

/// The first name (in depth-first name order) of each link group of the files, and of
/// the symlinks, this edit puts.
fn collect_primaries(
    d: &DirEdit,
    prefix: &[u8],
    out: &mut HashMap<u64, Vec<u8>>,
    symlinks: &mut HashMap<u64, Vec<u8>>,
) {
    for (name, c) in &d.children {
        let p = join(prefix, name);
        match c {
            Child::Leaf(Leaf::File { link: Some(g), .. }) => {
                out.entry(*g).or_insert(p);
            }
            Child::Leaf(Leaf::Symlink { link: Some(g), .. }) => {
                symlinks.entry(*g).or_insert(p);
            }
            Child::Dir(sub) => collect_primaries(sub, &p, out, symlinks),
            _ => {}
        }
    }
}

/// The paths of every symlink this edit puts, with its link group.
fn collect_put_symlinks(d: &DirEdit, prefix: &[u8], out: &mut HashMap<Vec<u8>, Option<u64>>) {
    for (name, c) in &d.children {
        let p = join(prefix, name);
        match c {
            Child::Leaf(Leaf::Symlink { link, .. }) => {
                out.insert(p, *link);
            }
            Child::Dir(sub) => collect_put_symlinks(sub, &p, out),
            _ => {}
        }
    }
}
