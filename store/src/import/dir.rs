//! Import of a directory tree.
//!
//! One thread walks (one `lstat` per entry, relative to the directory being read, and
//! `llistxattr` per directory and per file the stat cache has no xattrs for; the
//! listings of the directories it will descend into are fetched ahead on a second
//! thread, [`crate::import::prefetch`]) and hands every
//! file whose stat-cache stamp does not match to the ingest workers, in batches; they
//! open it relative to its already open directory and read its xattrs from the open
//! file. The walk and the hashing overlap. Hard links are found by (device, inode). The walk does not
//! cross into other filesystems (mount points are left out with a warning).
//!
//! A checkout whose `.git` is a file naming a repository outside it (a linked worktree)
//! gets that repository as its `.git` directory instead ([`crate::import::gitdir`]).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::import::builder::{Builder, Item, Slot};
use crate::import::exclude::Excluder;
use crate::import::gitdir::{self, LinkedGit, Part};
use crate::import::prefetch::{Listed, Prefetcher};
use crate::import::refresh::{GitFiles, refreshed_index};
use crate::import::{Finish, ImportOptions, ImportReport, Progress};
use crate::ingest::{FileContent, FileJob, Ingest, Xattrs};
use crate::lock::StoreLock;
use crate::snapshot::Source;
use crate::statcache::{self, Stamp};
use crate::store::Store;
use crate::tree::Kind;

pub use crate::xattrs::{read_xattrs, recorded_xattr};

/// Paths git tracks under `dir`, relative to `dir` (empty when git does not track
/// anything there). `dir` may be a work tree's top, a subdirectory of one, or a nested
/// repository inside the tree being imported (the walk asks again at every `.git`).
fn git_tracked(dir: &Path) -> Vec<Vec<u8>> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "core.quotepath=off", "ls-files", "-z"])
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .env_remove("GIT_INDEX_FILE")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output();
    match out {
        Ok(o) if o.status.success() => o
            .stdout
            .split(|&b| b == 0)
            .filter(|p| !p.is_empty())
            .map(|p| p.to_vec())
            .collect(),
        _ => vec![],
    }
}

impl Store {
    /// Imports the directory tree at `source` as a new snapshot.
    pub fn import_dir(&self, source: &Path, opts: &ImportOptions) -> Result<ImportReport> {
        let started = Instant::now();
        let started_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as i64)
            .unwrap_or(0);
        let meta = match fs::metadata(source) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::SourceMissing(source.to_path_buf()));
            }
            Err(e) => return Err(Error::io("stat", source)(e)),
        };
        if !meta.is_dir() {
            return Err(Error::Invalid(format!(
                "{} is not a directory (a tar archive needs a .tar, .tar.gz or .tar.zst name)",
                source.display()
            )));
        }
        let src = fs::canonicalize(source).map_err(Error::io("resolve", source))?;
        if let Ok(root) = fs::canonicalize(self.root())
            && root.starts_with(&src)
        {
            return Err(Error::RootInsideSource {
                root,
                source_dir: src,
            });
        }
        if let Some(name) = &opts.ref_name {
            crate::refs::check_ref_name(name)?;
        }
        let mut excluder = Excluder::new(opts.default_excludes, &opts.excludes)?;
        if opts.default_excludes {
            let tracked = git_tracked(&src);
            excluder.set_tracked(tracked.iter().map(|p| p.as_slice()));
        }
        let _lock = StoreLock::shared(self)?;
        // What interrupted imports stored is found stored, not compressed again.
        let resumed = self.adopt_orphans()?;
        // (A `.git` the user leaves out names nothing.)
        let linked = match excluder.excludes(b".git", b".git", false) {
            true => None,
            false => gitdir::linked_git(&src)?,
        };
        let root_key = src.to_string_lossy().into_owned();
        let cache = self.with_reader(|c| statcache::load(c, &root_key))?;

        let mut ingest = Ingest::start(self)?;
        let mut walk = Walk {
            builder: Builder::new(meta.mode() & 0o7777),
            slots: Vec::new(),
            slot_info: Vec::new(),
            slot_xattrs: Vec::new(),
            refill: Vec::new(),
            links: HashMap::new(),
            symlink_links: HashMap::new(),
            next_group: 0,
            excluded: 0,
            warnings: Vec::new(),
            allow_devices: opts.allow_devices,
            files_total: 0,
            files_done: 0,
            bytes_done: 0,
            linked: linked.clone(),
            submodules: Vec::new(),
            top: src.clone(),
            nested: Vec::new(),
        };
        walk.builder.insert(
            &[],
            Item::Dir {
                mode: meta.mode(),
                // Kept in the snapshot (`root_xattrs`).
                xattrs: read_xattrs(&src)?,
            },
        )?;
        let tree = Part::Tree {
            linked: linked.is_some(),
        };
        let mut cx = (&mut excluder, &cache, &mut ingest, opts);
        walk.walk(&src, &[], tree, meta.dev(), &mut cx)?;
        let git_files = match &linked {
            None => GitFiles {
                index: src.join(".git/index"),
                config: fs::read_to_string(src.join(".git/config")).unwrap_or_default(),
            },
            Some(l) => walk.linked_git(l, &self.layout().tmp(), &mut cx)?,
        };
        walk.graft_nested(&self.layout().tmp(), &mut cx)?;
        while let Some((slot, r)) = ingest.next_result(true) {
            walk.arrived(slot, r, opts)?;
        }
        let git_fsmonitor = match &opts.served_identity {
            Some(served) => refresh_git_index(
                &src,
                &git_files,
                &mut walk,
                served,
                opts.git_fsmonitor.as_deref(),
                &mut ingest,
            )?,
            None => None,
        };

        // Stat cache changes, committed with the snapshot.
        let files_read = walk.slot_info.len() as u64;
        let mut upserts = Vec::with_capacity(walk.slot_info.len());
        for (i, info) in walk.slot_info.iter_mut().enumerate() {
            if let (Some(c), Some((path, stamp))) = (walk.slots[i], info.take())
                && c.size == stamp.size
                && !stamp.is_racy(started_ns)
            {
                upserts.push((path, stamp, c.id, walk.slot_xattrs[i].take()));
            }
        }
        upserts.extend(walk.refill.drain(..).filter(|r| !r.1.is_racy(started_ns)));
        let deletes = statcache::unseen(&cache);
        let finish = Finish {
            builder: walk.builder,
            slots: walk.slots,
            source: Source::Dir {
                path: root_key.clone(),
            },
            policy: excluder.policy().clone(),
            excluded: walk.excluded,
            files_read,
            warnings: walk.warnings,
            started,
            opts,
            git_fsmonitor,
            resumed,
        };
        finish.run(self, ingest, |tx| {
            statcache::apply(tx, &root_key, &upserts, &deletes)
        })
    }
}

/// Where a file stands: its directory (path, and descriptor once opened) and name.
struct At<'a> {
    dir: &'a Path,
    fd: &'a mut Option<Arc<fs::File>>,
    name: std::ffi::OsString,
}

/// A multiply-linked file seen before: its link group, content slot and first path.
type LinkSeen = (u64, Slot, Vec<Vec<u8>>);
/// A multiply-linked symlink met: its link group and its first name's components.
type SymlinkSeen = (u64, Vec<Vec<u8>>);

/// What a walk needs besides the walk itself.
type WalkCx<'c, 's> = (
    &'c mut Excluder,
    &'c statcache::Entries,
    &'c mut Ingest<'s>,
    &'c ImportOptions,
);

/// Rewrites the checkout's `.git/index` (if any) so the entries git trusted on the source
/// carry the stat data workspaces will serve (see [`crate::import::gitindex`]). With a
/// `hook` command, the index also gets an fsmonitor extension marking those entries
/// valid and `.git/config` names the hook; the token is returned.
fn refresh_git_index(
    src: &Path,
    git: &GitFiles,
    walk: &mut Walk,
    served: &crate::import::ServedIdentityFn,
    hook: Option<&str>,
    ingest: &mut Ingest<'_>,
) -> Result<Option<String>> {
    use crate::import::gitindex;
    let index_comps = vec![b".git".to_vec(), b"index".to_vec()];
    let config_comps = vec![b".git".to_vec(), b"config".to_vec()];
    if walk.builder.file_at(&index_comps).is_none() {
        return Ok(None);
    }
    let config_in_tree = walk.builder.file_at(&config_comps).is_some();
    let entry_at = |comps: &[Vec<u8>]| match walk.builder.file_at(comps) {
        Some((mode, slot, _)) => {
            let content = match slot {
                Slot::Known(c) => c,
                Slot::Pending(i) => walk.slots.get(i).copied().flatten()?,
            };
            Some(gitindex::served_entry(
                comps.last()?,
                mode,
                content.size,
                *content.id.as_bytes(),
            ))
        }
        None => match walk.builder.item_at(comps)? {
            Item::Symlink { target, .. } => Some(gitindex::served_symlink(comps.last()?, target)),
            _ => None,
        },
    };
    let Some(r) = refreshed_index(src, git, config_in_tree, served, hook, entry_at) else {
        return Ok(None);
    };
    if let Some(text) = &r.config {
        let content = ingest.store_reader(text.as_bytes(), text.len() as u64)?;
        walk.builder
            .set_content(&config_comps, Slot::Known(content));
    }
    let content = ingest.store_reader(r.index.as_slice(), r.index.len() as u64)?;
    walk.builder.set_content(&index_comps, Slot::Known(content));
    Ok(r.token)
}

struct Walk {
    builder: Builder,
    slots: Vec<Option<FileContent>>,
    /// For files read: their relative path and stamp (for the stat cache).
    slot_info: Vec<Option<(Vec<u8>, Stamp)>>,
    /// For files read: the xattrs read with them (for the stat cache).
    slot_xattrs: Vec<Option<crate::xattrs::Xattrs>>,
    /// Stat cache hits whose row had no xattrs: the row again, with the xattrs read.
    refill: Vec<statcache::Row>,
    /// (dev, ino) of multiply-linked files -> (link group, content slot, first path).
    links: HashMap<(u64, u64), LinkSeen>,
    /// (dev, ino) of multiply-linked symlinks -> (link group, first path).
    symlink_links: HashMap<(u64, u64), SymlinkSeen>,
    next_group: u64,
    excluded: u64,
    warnings: Vec<String>,
    allow_devices: bool,
    files_total: u64,
    files_done: u64,
    bytes_done: u64,
    /// The repository a linked checkout names (its submodules' `.git` files are made to
    /// name the snapshot's `.git`), and the submodule repositories found so.
    linked: Option<LinkedGit>,
    submodules: Vec<gitdir::NestedGitFile>,
    /// The source's top (canonical), and the nested checkouts found whose `.git` leads
    /// out of it: where their `.git` was, and the repository it names.
    top: PathBuf,
    nested: Vec<(Vec<Vec<u8>>, LinkedGit)>,
}

impl Walk {
    /// Makes the tree's `.git` of the repository a linked checkout names (see
    /// [`gitdir`]): its common directory, then the checkout's own git directory.
    fn linked_git(
        &mut self,
        l: &LinkedGit,
        tmp: &Path,
        cx: &mut WalkCx<'_, '_>,
    ) -> Result<GitFiles> {
        let dot = [b".git".to_vec()];
        self.graft(&dot, l, cx)?;
        // Submodules: their repositories' work trees, as the snapshot places them.
        for sub in std::mem::take(&mut self.submodules) {
            let mut at = dot.to_vec();
            at.extend(sub.repo.iter().cloned());
            let repo = sub
                .repo
                .iter()
                .fold(l.git_dir.clone(), |p, c| p.join(OsStr::from_bytes(c)));
            self.set_worktree(at, &repo.join("config"), &sub.worktree, false, tmp, cx)?;
        }
        let (config, changed) = l.snapshot_config();
        if changed {
            let comps = [b".git".to_vec(), b"config".to_vec()];
            let content = cx.2.store_reader(config.as_bytes(), config.len() as u64)?;
            self.builder.set_content(&comps, Slot::Known(content));
        }
        Ok(GitFiles {
            index: l.index(),
            config,
        })
    }

    /// Puts the repository `l` names at `at` (a `.git`): its common directory, then its
    /// own git directory (see [`gitdir`]).
    fn graft(&mut self, at: &[Vec<u8>], l: &LinkedGit, cx: &mut WalkCx<'_, '_>) -> Result<()> {
        let meta = fs::metadata(&l.common_dir).map_err(Error::io("stat", &l.common_dir))?;
        let item = Item::Dir {
            mode: meta.mode(),
            xattrs: read_xattrs(&l.common_dir)?,
        };
        self.builder.insert(at, item)?;
        if l.common_dir != l.git_dir {
            self.walk(&l.common_dir, at, Part::Common, meta.dev(), cx)?;
        }
        let dev = fs::metadata(&l.git_dir)
            .map_err(Error::io("stat", &l.git_dir))?
            .dev();
        self.walk(&l.git_dir, at, Part::GitDir, dev, cx)
    }

    /// Puts the repositories of nested checkouts whose `.git` leads out of the tree
    /// where their `.git` was; a `core.worktree` in their config becomes `..`, the
    /// checkout holding that `.git`.
    fn graft_nested(&mut self, tmp: &Path, cx: &mut WalkCx<'_, '_>) -> Result<()> {
        for (at, l) in std::mem::take(&mut self.nested) {
            self.graft(&at, &l, cx)?;
            self.set_worktree(at, &l.config(), "..", true, tmp, cx)?;
        }
        Ok(())
    }

    /// Gives the config of the repository at `at` in the tree (read from `source`)
    /// `core.worktree = value`: always, or `only_if_set` when it has one. Nothing when
    /// the tree holds no such config or the file cannot be read.
    fn set_worktree(
        &mut self,
        mut at: Vec<Vec<u8>>,
        source: &Path,
        value: &str,
        only_if_set: bool,
        tmp: &Path,
        cx: &mut WalkCx<'_, '_>,
    ) -> Result<()> {
        at.push(b"config".to_vec());
        let Ok(text) = fs::read_to_string(source) else {
            return Ok(());
        };
        if (only_if_set && !text.contains("worktree")) || self.builder.file_at(&at).is_none() {
            return Ok(());
        }
        if let Some(fixed) = gitdir::with_worktree(&text, value, tmp) {
            let content = cx.2.store_reader(fixed.as_bytes(), fixed.len() as u64)?;
            self.builder.set_content(&at, Slot::Known(content));
        }
        Ok(())
    }

    /// Whether the entry at `comps` (in `dir`) is the `.git` of a nested checkout whose
    /// repository lies outside the tree: then it is noted, to be put there in its place
    /// ([`Walk::graft_nested`]). One that names a repository gone is kept as it is, with
    /// a warning.
    fn nested_repository(&mut self, part: Part, dir: &Path, comps: &[Vec<u8>]) -> bool {
        if !matches!(part, Part::Tree { .. })
            || comps.len() < 2
            || comps.last().is_none_or(|n| n != b".git")
        {
            return false;
        }
        match gitdir::linked_git_at(dir, &self.top) {
            Ok(Some(l)) => {
                self.nested.push((comps.to_vec(), l));
                true
            }
            Ok(None) => false,
            Err(e) => {
                self.warnings.push(format!("{e}; kept as it is"));
                false
            }
        }
    }

    /// Walks the directory `root` into the tree at `prefix`, leaving out what `part`
    /// leaves out and what lies on another filesystem than `root_dev`.
    fn walk(
        &mut self,
        root: &Path,
        prefix: &[Vec<u8>],
        part: Part,
        root_dev: u64,
        cx: &mut WalkCx<'_, '_>,
    ) -> Result<()> {
        let (excluder, cache, ingest, opts) = (&mut *cx.0, cx.1, &mut *cx.2, cx.3);
        // The listings of the directories pushed below, fetched ahead on a second thread.
        let ahead = Prefetcher::start();
        let mut next_id = 0u64;
        // Depth-first with an explicit stack: (listing id, absolute dir, relative
        // components).
        let mut stack: Vec<(u64, PathBuf, Vec<Vec<u8>>)> =
            vec![(next_id, root.to_path_buf(), prefix.to_vec())];
        while let Some((id, dir, rel)) = stack.pop() {
            let entries = ahead
                .take(id, &dir)
                .map_err(Error::io("read directory", &dir))?;
            // Opened when a file here must be read: the workers open files relative to it.
            let mut dir_fd: Option<Arc<fs::File>> = None;
            // The directory's relative path.
            let dir_path = rel.join(&b'/');
            // A nested repository (or submodule): what it tracks is spared too.
            if !rel.is_empty()
                && excluder.policy().default_excludes
                && entries.iter().any(|e| e.name.as_bytes() == b".git")
            {
                let tracked: Vec<Vec<u8>> = git_tracked(&dir)
                    .into_iter()
                    .map(|p| [dir_path.as_slice(), b"/", p.as_slice()].concat())
                    .collect();
                excluder.set_tracked(tracked.iter().map(|p| p.as_slice()));
            }
            // One entry's components and relative path at a time, made in place (a
            // re-import's walk is mostly this bookkeeping): the directory's, then its name.
            let mut comps = rel.clone();
            let mut rel_path = Vec::new();
            for Listed { name, meta, xattrs } in entries {
                let abs = dir.join(&name);
                comps.truncate(rel.len());
                comps.push(name.as_bytes().to_vec());
                if part.leaves_out(&comps[prefix.len()..]) {
                    continue;
                }
                rel_path.clear();
                if !dir_path.is_empty() {
                    rel_path.extend_from_slice(&dir_path);
                    rel_path.push(b'/');
                }
                rel_path.extend_from_slice(name.as_bytes());
                let comps = comps.as_slice();
                // lstat relative to the directory read (no walk of the whole path).
                let meta = meta.map_err(Error::io("stat", &abs))?;
                let ft = meta.file_type();
                if excluder.excludes(&rel_path, name.as_bytes(), ft.is_dir()) {
                    self.excluded += 1;
                    continue;
                }
                if ft.is_dir() {
                    if meta.dev() != root_dev {
                        self.warnings.push(format!(
                            "{}: another filesystem is mounted here; left out",
                            abs.display()
                        ));
                        continue;
                    }
                    let xattrs = match xattrs {
                        Some(x) => x?,
                        None => read_xattrs(&abs)?,
                    };
                    self.builder.insert(
                        comps,
                        Item::Dir {
                            mode: meta.mode(),
                            xattrs,
                        },
                    )?;
                    next_id += 1;
                    ahead.submit(next_id, abs.clone());
                    stack.push((next_id, abs, comps.to_vec()));
                } else if ft.is_file() {
                    if part == (Part::Tree { linked: true })
                        && comps.len() > 1
                        && name.as_bytes() == b".git"
                        && let Some(sub) = self.linked.as_ref().and_then(|l| l.nested(&abs, comps))
                    {
                        // A submodule's `.git` file: made to name the snapshot's `.git`.
                        let text = sub.content.as_bytes();
                        let content = ingest.store_reader(text, text.len() as u64)?;
                        let item = Item::File {
                            mode: meta.mode(),
                            content: Slot::Known(content),
                            link_group: None,
                            xattrs: vec![],
                        };
                        self.builder.insert(comps, item)?;
                        self.submodules.push(sub);
                        continue;
                    }
                    if self.nested_repository(part, &dir, comps) {
                        continue;
                    }
                    let at = At {
                        dir: &dir,
                        fd: &mut dir_fd,
                        name,
                    };
                    self.file(&abs, at, comps, &rel_path, &meta, cache, ingest, opts)?;
                } else if ft.is_symlink() {
                    if self.nested_repository(part, &dir, comps) {
                        continue;
                    }
                    let target = fs::read_link(&abs).map_err(Error::io("read link", &abs))?;
                    let target = target.as_os_str().as_bytes().to_vec();
                    if target.is_empty() || target.len() > crate::tree::MAX_TARGET_BYTES {
                        return Err(Error::Invalid(format!(
                            "symlink {} has an unusable target",
                            abs.display()
                        )));
                    }
                    let link_group = self.symlink_link(&meta, comps);
                    self.builder.insert(
                        comps,
                        Item::Symlink {
                            target,
                            xattrs: vec![],
                            link_group,
                        },
                    )?;
                } else if ft.is_fifo() {
                    let item = Item::Special {
                        kind: Kind::Fifo,
                        mode: meta.mode(),
                        rdev: 0,
                    };
                    self.builder.insert(comps, item)?;
                } else if ft.is_char_device() || ft.is_block_device() {
                    if !self.allow_devices {
                        return Err(Error::Invalid(format!(
                            "{} is a device node; devices are imported only when allowed (--allow-devices)",
                            abs.display()
                        )));
                    }
                    let kind = if ft.is_char_device() {
                        Kind::CharDevice
                    } else {
                        Kind::BlockDevice
                    };
                    let item = Item::Special {
                        kind,
                        mode: meta.mode(),
                        rdev: meta.rdev(),
                    };
                    self.builder.insert(comps, item)?;
                } else {
                    self.warnings.push(format!(
                        "{}: a socket cannot be stored; left out",
                        abs.display()
                    ));
                }
            }
            // Take finished files as they come so results do not pile up.
            while let Some((slot, r)) = ingest.next_result(false) {
                self.arrived(slot, r, opts)?;
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn file(
        &mut self,
        abs: &Path,
        at: At<'_>,
        comps: &[Vec<u8>],
        rel_path: &[u8],
        meta: &fs::Metadata,
        cache: &statcache::Entries,
        ingest: &mut Ingest<'_>,
        opts: &ImportOptions,
    ) -> Result<()> {
        let stamp = Stamp::of(meta);
        // Still in the tree: its row is not deleted.
        let cached = cache.get(rel_path);
        if let Some(c) = cached {
            c.seen.set(true);
        }
        self.files_total += 1;
        if meta.nlink() > 1
            && let Some((group, slot, first)) = self.links.get(&(stamp.dev, stamp.ino)).cloned()
        {
            let first_is_file = self.builder.file_at(&first).is_some();
            if first_is_file {
                let xattrs = read_xattrs(abs)?;
                self.builder.set_link_group(&first, group);
                let item = Item::File {
                    mode: meta.mode(),
                    content: slot,
                    link_group: Some(group),
                    xattrs,
                };
                return self.builder.insert(comps, item);
            }
        }
        // A file read by the workers has its xattrs read there too, from the open file;
        // a hit takes them from the cache when its row has them.
        let (slot, xattrs) = match cached {
            Some(c) if c.stamp == stamp => {
                self.files_done += 1;
                let known = FileContent {
                    id: c.content,
                    size: stamp.size,
                };
                let xattrs = match &c.xattrs {
                    Some(x) => x.clone(),
                    None => {
                        let x = read_xattrs(abs)?;
                        // The row is given them for the next import.
                        self.refill
                            .push((rel_path.to_vec(), stamp, known.id, Some(x.clone())));
                        x
                    }
                };
                (Slot::Known(known), xattrs)
            }
            _ => {
                let i = self.slots.len();
                self.slots.push(None);
                self.slot_info.push(Some((rel_path.to_vec(), stamp)));
                self.slot_xattrs.push(None);
                let fd = match at.fd {
                    Some(fd) => fd.clone(),
                    None => {
                        let fd =
                            fs::File::open(at.dir).map_err(Error::io("open directory", at.dir))?;
                        at.fd.insert(Arc::new(fd)).clone()
                    }
                };
                let job = FileJob {
                    slot: i,
                    path: abs.to_path_buf(),
                    at: Some((fd, at.name)),
                    xattrs: true,
                    git_loose: false,
                    git_object: None,
                };
                ingest.submit(job, meta.len())?;
                (Slot::Pending(i), vec![])
            }
        };
        if let Some(p) = &opts.progress {
            p(Progress {
                files_done: self.files_done,
                files_total: self.files_total,
                bytes_done: self.bytes_done,
            });
        }
        if meta.nlink() > 1 {
            let group = self.next_group;
            self.next_group += 1;
            self.links
                .insert((stamp.dev, stamp.ino), (group, slot, comps.to_vec()));
        }
        let item = Item::File {
            mode: meta.mode(),
            content: slot,
            link_group: None,
            xattrs,
        };
        self.builder.insert(comps, item)
    }

    /// The link group of a symlink with several names (`ln -P`): the names met of one
    /// inode share one (the first is put in it when the second is met).
    fn symlink_link(&mut self, meta: &fs::Metadata, comps: &[Vec<u8>]) -> Option<u64> {
        if meta.nlink() < 2 {
            return None;
        }
        let key = (meta.dev(), meta.ino());
        if let Some((group, first)) = self.symlink_links.get(&key) {
            let (group, first) = (*group, first.clone());
            self.builder.set_link_group(&first, group);
            return Some(group);
        }
        let group = self.next_group;
        self.next_group += 1;
        self.symlink_links.insert(key, (group, comps.to_vec()));
        None
    }

    fn arrived(
        &mut self,
        slot: usize,
        r: Result<(FileContent, Xattrs)>,
        opts: &ImportOptions,
    ) -> Result<()> {
        let (c, xattrs) = r?;
        self.slots[slot] = Some(c);
        if !xattrs.is_empty()
            && let Some(Some((rel_path, _))) = self.slot_info.get(slot)
        {
            let comps: Vec<Vec<u8>> = rel_path.split(|&b| b == b'/').map(<[u8]>::to_vec).collect();
            self.builder.set_xattrs(&comps, xattrs.clone());
        }
        self.slot_xattrs[slot] = Some(xattrs);
        self.files_done += 1;
        self.bytes_done += c.size;
        if let Some(p) = &opts.progress {
            p(Progress {
                files_done: self.files_done,
                files_total: self.files_total,
                bytes_done: self.bytes_done,
            });
        }
        Ok(())
    }
}
