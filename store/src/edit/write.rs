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
    pub(super) counts: &'a mut Counts,
    /// Trees written by this session (not readable from the store until committed).
    pub(super) written: &'a mut HashMap<TreeId, Tree>,
}

impl Writer<'_, '_> {
    /// Adds what the entries of a base tree contribute to the counts (a directory
    /// rebased on another base directory brings them: [`Editor::rebase_dir`]).
    fn count_entries(&mut self, tree: &TreeId) -> Result<()> {
        for e in self.store.tree(tree)?.entries {
            match e.target() {
                Target::Dir(sub) => {
                    self.counts.dirs += 1;
                    self.count_entries(&sub)?;
                }
                Target::File(_) => {
                    self.counts.files += 1;
                    self.counts.bytes += e.size;
                }
                Target::Hardlink(_) => self.counts.hardlinks += 1,
                Target::Symlink => self.counts.symlinks += 1,
                _ => {}
            }
        }
        Ok(())
    }

    /// Subtracts what a base entry contributed to the counts.
    fn uncount(&mut self, e: &Entry) -> Result<()> {
        match e.target() {
            Target::Dir(tree) => {
                self.counts.dirs = self.counts.dirs.saturating_sub(1);
                for sub in self.store.tree(&tree)?.entries {
                    self.uncount(&sub)?;
                }
            }
            Target::File(_) => {
                self.counts.files = self.counts.files.saturating_sub(1);
                self.counts.bytes = self.counts.bytes.saturating_sub(e.size);
            }
            Target::Hardlink(_) => self.counts.hardlinks = self.counts.hardlinks.saturating_sub(1),
            Target::Symlink => self.counts.symlinks = self.counts.symlinks.saturating_sub(1),
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
                    self.uncount(o)?;
                }
            }
            let entry = match child {
                Child::Delete => continue,
                Child::Dir(sub) => {
                    // Entries of a kept base subtree are counted already; only the
                    // changed ones are re-counted by the recursion. A subtree taken from
                    // elsewhere in the base (a rebased directory) is counted here.
                    if !was_dir_kept && let Some(b) = &sub.base {
                        self.count_entries(b)?;
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
                Child::Leaf(Leaf::Symlink { target, xattrs }) => {
                    self.counts.symlinks += 1;
                    Entry::symlink(name.clone(), target.clone(), sorted(xattrs))
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
