//! Writing an edit's directories: each changed directory becomes a new tree (its
//! unchanged children keep their ids), counted for the snapshot.

use std::collections::{BTreeMap, HashMap};

use super::{Child, Content, DirEdit, Leaf, Xattrs, join};
use crate::error::{Error, Result};
use crate::id::TreeId;
use crate::index::ObjectKind;
use crate::ingest::{FileContent, Ingest};
use crate::snapshot::Counts;
use crate::store::Store;
use crate::tree::{Entry, Kind, Target, Tree};

pub(super) struct Writer<'a, 's> {
    pub(super) store: &'s Store,
    pub(super) slots: &'a [Option<FileContent>],
    pub(super) primaries: &'a HashMap<u64, Vec<u8>>,
    /// The first name of each link group of the symlinks this edit puts.
    pub(super) symlink_primaries: &'a HashMap<u64, Vec<u8>>,
    /// Whether this edit put, removed or moved a name of a multiply-linked symlink (its
    /// groups are then formed again: `symlinks::regroup`).
    pub(super) linked_symlinks: bool,
    pub(super) counts: &'a mut Counts,
    /// Trees written by this session (not readable from the store until committed).
    pub(super) written: &'a mut HashMap<TreeId, Tree>,
}

impl Writer<'_, '_> {
    /// Adds what the entries of a base tree contribute to the counts (a directory
    /// rebased on another base directory brings them: [`Editor::rebase_dir`]).
    /// `prefix`: where the tree is now (a symlink counts by the name it has there).
    fn count_entries(&mut self, tree: &TreeId, prefix: &[u8]) -> Result<()> {
        for e in self.store.tree(tree)?.entries {
            let p = join(prefix, &e.name);
            match e.target() {
                Target::Dir(sub) => {
                    self.counts.dirs += 1;
                    self.count_entries(&sub, &p)?;
                }
                Target::File(_) => {
                    self.counts.files += 1;
                    self.counts.bytes += e.size;
                }
                Target::Hardlink(_) => self.counts.hardlinks += 1,
                Target::Symlink => {
                    self.linked_symlinks |= e.link_group().is_some();
                    *symlink_count(self.counts, &e, &p) += 1;
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Subtracts what a base entry (at `path` in the base) contributed to the counts.
    fn uncount(&mut self, e: &Entry, path: &[u8]) -> Result<()> {
        match e.target() {
            Target::Dir(tree) => {
                self.counts.dirs = self.counts.dirs.saturating_sub(1);
                for sub in self.store.tree(&tree)?.entries {
                    let p = join(path, &sub.name);
                    self.uncount(&sub, &p)?;
                }
            }
            Target::File(_) => {
                self.counts.files = self.counts.files.saturating_sub(1);
                self.counts.bytes = self.counts.bytes.saturating_sub(e.size);
            }
            Target::Hardlink(_) => self.counts.hardlinks = self.counts.hardlinks.saturating_sub(1),
            Target::Symlink => {
                self.linked_symlinks |= e.link_group().is_some();
                let n = symlink_count(self.counts, e, path);
                *n = n.saturating_sub(1);
            }
            _ => {}
        }
        Ok(())
    }

    pub(super) fn write_dir(
        &mut self,
        d: &DirEdit,
        path: &[u8],
        ingest: &mut Ingest<'_>,
    ) -> Result<TreeId> {
        let base = match d.base {
            Some(t) => self.store.tree(&t)?,
            None => Tree::default(),
        };
        let mut entries: BTreeMap<Vec<u8>, Entry> = base
            .entries
            .into_iter()
            .map(|e| (e.name.clone(), e))
            .collect();
        for (name, child) in &d.children {
            let child_path = join(path, name);
            let old = entries.remove(name);
            let was_dir_kept = matches!((&old, child), (Some(o), Child::Dir(sub)) if o.kind == Kind::Dir && sub.base == o.subtree());
            if let Some(o) = &old {
                if was_dir_kept {
                    self.counts.dirs = self.counts.dirs.saturating_sub(1);
                } else {
                    self.uncount(o, &child_path)?;
                }
            }
            let entry = match child {
                Child::Delete => continue,
                Child::Dir(sub) => {
                    // Entries of a kept base subtree are counted already; only the
                    // changed ones are re-counted by the recursion. A subtree taken from
                    // elsewhere in the base (a rebased directory) is counted here.
                    if !was_dir_kept && let Some(b) = &sub.base {
                        self.count_entries(b, &child_path)?;
                    }
                    let id = self.write_dir(sub, &child_path, ingest)?;
                    self.counts.dirs += 1;
                    Entry {
                        name: name.clone(),
                        kind: Kind::Dir,
                        mode: sub.mode.or(old.as_ref().map(|o| o.mode)).unwrap_or(0o755),
                        size: 0,
                        hash: *id.as_bytes(),
                        data: vec![],
                        xattrs: sub
                            .xattrs
                            .clone()
                            .or(old.as_ref().map(|o| o.xattrs.clone()))
                            .unwrap_or_default(),
                    }
                }
                Child::Leaf(Leaf::File {
                    mode,
                    content,
                    link,
                    xattrs,
                }) => {
                    let c = match content {
                        Content::Known(c) => *c,
                        Content::Pending(i) => self.slots[*i].ok_or_else(|| {
                            Error::Invalid(format!(
                                "no content arrived for {:?} (internal)",
                                String::from_utf8_lossy(&child_path)
                            ))
                        })?,
                    };
                    let primary = link.and_then(|g| self.primaries.get(&g));
                    let (kind, data) = match primary {
                        Some(p) if *p != child_path => {
                            self.counts.hardlinks += 1;
                            (Kind::Hardlink, p.clone())
                        }
                        _ => {
                            self.counts.files += 1;
                            self.counts.bytes += c.size;
                            (Kind::File, vec![])
                        }
                    };
                    Entry {
                        name: name.clone(),
                        kind,
                        mode: *mode,
                        size: c.size,
                        hash: *c.id.as_bytes(),
                        data,
                        xattrs: sorted(xattrs),
                    }
                }
                Child::Leaf(Leaf::Symlink {
                    target,
                    xattrs,
                    link,
                }) => {
                    let mut e = Entry::symlink(name.clone(), target.clone(), sorted(xattrs));
                    if let Some(first) = link.and_then(|g| self.symlink_primaries.get(&g)) {
                        // Its group is checked once the whole tree is written (a group
                        // of one name is no group).
                        e.hash = crate::tree::symlink_group_key(first);
                        self.linked_symlinks = true;
                    }
                    *symlink_count(self.counts, &e, &child_path) += 1;
                    e
                }
                Child::Leaf(Leaf::Special { kind, mode, rdev }) => {
                    Entry::special(name.clone(), *kind, *mode, *rdev)
                }
            };
            entries.insert(name.clone(), entry);
        }
        let mut tree = Tree {
            entries: entries.into_values().collect(),
        };
        tree.sort();
        let (id, bytes) = tree.encode_with_id();
        ingest.put(ObjectKind::Tree, *id.as_bytes(), &bytes)?;
        self.written.insert(id, tree);
        Ok(id)
    }
}

/// Whether the symlink `e` at `path` is a further name of a multiply-linked symlink
/// (not its group's first name): counted with the hard links, as a file's are.
pub(super) fn is_further_name(e: &Entry, path: &[u8]) -> bool {
    e.link_group()
        .is_some_and(|g| g != crate::tree::symlink_group_key(path))
}

/// The count a symlink at `path` is in: `hardlinks` for a further name, else `symlinks`.
pub(super) fn symlink_count<'c>(counts: &'c mut Counts, e: &Entry, path: &[u8]) -> &'c mut u64 {
    if is_further_name(e, path) {
        &mut counts.hardlinks
    } else {
        &mut counts.symlinks
    }
}

/// Reads trees from this session's writes first, then from the store.
pub(super) struct Trees<'a> {
    pub(super) store: &'a Store,
    pub(super) written: &'a HashMap<TreeId, Tree>,
}

impl Trees<'_> {
    pub(super) fn tree(&self, id: &TreeId) -> Result<Tree> {
        match self.written.get(id) {
            Some(t) => Ok(t.clone()),
            None => self.store.tree(id),
        }
    }
}

pub(super) fn sorted(x: &Xattrs) -> Xattrs {
    let mut v = x.clone();
    v.sort();
    v
}
