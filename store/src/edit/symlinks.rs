//! Link groups of symlinks after an edit: every name of a multiply-linked symlink
//! records its group's key ([`crate::tree::Entry::link_group`]), derived from the
//! group's first name in depth-first name order. An edit that put, removed or moved such
//! a name forms the groups again here, from the whole new tree, so one set of names has
//! one encoding whatever the edit's order.

use std::collections::{BTreeMap, HashMap};

use super::join;
use super::links::dfs_cmp;
use super::write::symlink_count;
use crate::error::Result;
use crate::id::{ID_BYTES, TreeId};
use crate::index::ObjectKind;
use crate::ingest::Ingest;
use crate::snapshot::Counts;
use crate::store::Store;
use crate::tree::{Kind, Target, Tree, symlink_group_key};

/// Which names are one symlink.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Group {
    /// Names put by this edit with the same link (one inode of the workspace).
    Put(u64),
    /// Names kept from the base that recorded this key there.
    Base([u8; ID_BYTES]),
}

/// Gives every symlink of the tree at `root` the key of its group, or none when it is
/// the only name left of its group. `put`: the symlinks this edit put, with their link.
/// A name put by this edit never joins a group of the base (as a file's copy does not:
/// `links::relink`). Trees are read from `written` first (this edit's), and the trees
/// written here are added to it.
pub(super) fn regroup(
    store: &Store,
    written: &mut HashMap<TreeId, Tree>,
    ingest: &mut Ingest<'_>,
    root: &TreeId,
    put: &HashMap<Vec<u8>, Option<u64>>,
    counts: &mut Counts,
) -> Result<TreeId> {
    let mut groups: BTreeMap<Group, Vec<Vec<u8>>> = BTreeMap::new();
    let mut current: HashMap<Vec<u8>, [u8; ID_BYTES]> = HashMap::new();
    scan(store, written, root, &[], put, &mut groups, &mut current)?;
    let mut desired: HashMap<Vec<u8>, [u8; ID_BYTES]> = HashMap::new();
    for (_, mut names) in groups {
        names.sort_by(|a, b| dfs_cmp(a, b));
        let key = if names.len() > 1 {
            symlink_group_key(&names[0])
        } else {
            [0; ID_BYTES]
        };
        for n in names {
            desired.insert(n, key);
        }
    }
    // Only the names whose key changes lead to rewritten directories.
    desired.retain(|p, key| current.get(p).copied().unwrap_or([0; ID_BYTES]) != *key);
    if desired.is_empty() {
        return Ok(*root);
    }
    let mut dirs = std::collections::HashSet::new();
    for p in desired.keys() {
        let mut d = p.as_slice();
        while let Some(i) = d.iter().rposition(|&c| c == b'/') {
            d = &d[..i];
            dirs.insert(d.to_vec());
        }
    }
    let mut w = Rewrite {
        store,
        written,
        ingest,
        desired: &desired,
        dirs: &dirs,
        counts,
    };
    w.rewrite(root, &[])
}

fn tree(store: &Store, written: &HashMap<TreeId, Tree>, id: &TreeId) -> Result<Tree> {
    match written.get(id) {
        Some(t) => Ok(t.clone()),
        None => store.tree(id),
    }
}

fn scan(
    store: &Store,
    written: &HashMap<TreeId, Tree>,
    id: &TreeId,
    prefix: &[u8],
    put: &HashMap<Vec<u8>, Option<u64>>,
    groups: &mut BTreeMap<Group, Vec<Vec<u8>>>,
    current: &mut HashMap<Vec<u8>, [u8; ID_BYTES]>,
) -> Result<()> {
    for e in tree(store, written, id)?.entries {
        let p = join(prefix, &e.name);
        match e.target() {
            Target::Dir(sub) => scan(store, written, &sub, &p, put, groups, current)?,
            Target::Symlink => {
                let group = match put.get(&p) {
                    Some(link) => link.map(Group::Put),
                    None => e.link_group().map(Group::Base),
                };
                if let Some(key) = e.link_group() {
                    current.insert(p.clone(), key);
                }
                if let Some(g) = group {
                    groups.entry(g).or_default().push(p);
                }
            }
            _ => {}
        }
    }
    Ok(())
}

struct Rewrite<'a, 'i> {
    store: &'a Store,
    written: &'a mut HashMap<TreeId, Tree>,
    ingest: &'a mut Ingest<'i>,
    /// Path -> the key it gets (zero: none).
    desired: &'a HashMap<Vec<u8>, [u8; ID_BYTES]>,
    /// The directories on the way to those paths.
    dirs: &'a std::collections::HashSet<Vec<u8>>,
    counts: &'a mut Counts,
}

impl Rewrite<'_, '_> {
    /// Rewrites the directories in `dirs` (and the root) whose symlinks get another key.
    fn rewrite(&mut self, id: &TreeId, prefix: &[u8]) -> Result<TreeId> {
        let mut t = tree(self.store, self.written, id)?;
        let mut changed = false;
        for e in &mut t.entries {
            let p = join(prefix, &e.name);
            match e.target() {
                Target::Dir(sub) if self.dirs.contains(&p) => {
                    let new = self.rewrite(&sub, &p)?;
                    if new != sub {
                        e.hash = *new.as_bytes();
                        changed = true;
                    }
                }
                Target::Symlink => {
                    if let Some(key) = self.desired.get(&p) {
                        debug_assert_eq!(e.kind, Kind::Symlink);
                        let n = symlink_count(self.counts, e, &p);
                        *n = n.saturating_sub(1);
                        e.hash = *key;
                        *symlink_count(self.counts, e, &p) += 1;
                        changed = true;
                    }
                }
                _ => {}
            }
        }
        if !changed {
            return Ok(*id);
        }
        let (new, bytes) = t.encode_with_id();
        self.ingest.put(ObjectKind::Tree, *new.as_bytes(), &bytes)?;
        self.written.insert(new, t);
        Ok(new)
    }
}
