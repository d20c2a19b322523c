//! Hard-link groups after an edit: re-formed when a change touched a group's primary
//! ([`relink`]) or directories of the base moved ([`regroup`]).

use std::collections::{BTreeMap, HashMap};

use super::join;
use super::write::Trees;
use crate::error::Result;
use crate::id::TreeId;
use crate::index::ObjectKind;
use crate::ingest::Ingest;
use crate::snapshot::Counts;
use crate::tree::{Kind, Target};

/// Re-forms hard-link groups after an edit that may have removed or changed a primary:
/// a `hardlink` entry kept from the base whose primary is no longer a file with the same
/// content, or was put by this edit (a new object at that name, though it may hold the
/// same bytes: a copy-up, a chmod of one name where links do not survive it), becomes a
/// file itself, and later names of its group point at it. Walks the whole tree.
pub(super) fn relink(
    store: &Trees<'_>,
    ingest: &mut Ingest<'_>,
    root: &TreeId,
    put: &std::collections::HashSet<Vec<u8>>,
    counts: &mut Counts,
) -> Result<TreeId> {
    // Pass 1: every regular file's (path -> content), and every hardlink.
    let mut files: HashMap<Vec<u8>, [u8; 32]> = HashMap::new();
    let mut links = Vec::new();
    scan_links(store, root, &[], &mut files, &mut links)?;
    if links.is_empty() {
        return Ok(*root);
    }
    let mut renamed: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
    let mut w = Rewrite {
        store,
        ingest,
        files: &files,
        put,
        renamed: &mut renamed,
        counts,
    };
    w.rewrite(root, &[])
}

/// `path` with the longest `moved` origin it lies in (or is) replaced by that origin's
/// new path: where a name of the base is after directories were moved.
fn moved_path(path: &[u8], moved: &[(Vec<u8>, Vec<u8>)]) -> Option<Vec<u8>> {
    let under = |p: &[u8], dir: &[u8]| {
        p == dir || (p.len() > dir.len() && p.starts_with(dir) && p[dir.len()] == b'/')
    };
    let (origin, new) = moved
        .iter()
        .filter(|(o, _)| under(path, o))
        .max_by_key(|(o, _)| o.len())?;
    let mut out = new.clone();
    out.extend_from_slice(&path[origin.len()..]);
    Some(out)
}

/// Depth-first name order of two root-relative paths (the order in which a group's
/// primary comes first).
pub(super) fn dfs_cmp(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    a.split(|&c| c == b'/').cmp(b.split(|&c| c == b'/'))
}

/// Re-forms every hard-link group after an edit that moved directories of the base
/// (`moved`): a `hardlink` entry whose primary moved follows it (same content, not put
/// by this edit), and each group's primary becomes again its first member in
/// depth-first name order (moves can reorder a group). Names whose primary is gone form
/// groups among themselves, as in [`relink`]. Walks the whole tree.
pub(super) fn regroup(
    store: &Trees<'_>,
    ingest: &mut Ingest<'_>,
    root: &TreeId,
    put: &std::collections::HashSet<Vec<u8>>,
    moved: &[(Vec<u8>, Vec<u8>)],
    counts: &mut Counts,
) -> Result<TreeId> {
    let mut files: HashMap<Vec<u8>, [u8; 32]> = HashMap::new();
    let mut links: Vec<(Vec<u8>, Vec<u8>, [u8; 32])> = Vec::new();
    scan_links(store, root, &[], &mut files, &mut links)?;
    if links.is_empty() {
        return Ok(*root);
    }
    // Group key: the primary file's current path, or (gone) the old primary path.
    let mut groups: BTreeMap<(bool, Vec<u8>), Vec<Vec<u8>>> = BTreeMap::new();
    for (path, data, hash) in &links {
        let live = |p: &Vec<u8>| files.get(p) == Some(hash) && !put.contains(p);
        let primary = if put.contains(path) {
            // A member of a group this edit made: its primary is a file it put.
            files.contains_key(data).then(|| data.clone())
        } else if live(data) {
            Some(data.clone())
        } else {
            moved_path(data, moved).filter(live)
        };
        let key = match primary {
            Some(p) => (true, p),
            None => (false, data.clone()),
        };
        groups.entry(key).or_default().push(path.clone());
    }
    let mut desired: HashMap<Vec<u8>, Option<Vec<u8>>> = HashMap::new();
    for ((live, key), mut members) in groups {
        if live {
            members.push(key);
        }
        members.sort_by(|a, b| dfs_cmp(a, b));
        let first = members[0].clone();
        for m in members {
            let want = (m != first).then(|| first.clone());
            desired.insert(m, want);
        }
    }
    let mut w = Regroup {
        store,
        ingest,
        desired: &desired,
        counts,
    };
    w.rewrite(root, &[])
}

fn scan_links(
    store: &Trees<'_>,
    id: &TreeId,
    prefix: &[u8],
    files: &mut HashMap<Vec<u8>, [u8; 32]>,
    links: &mut Vec<(Vec<u8>, Vec<u8>, [u8; 32])>,
) -> Result<()> {
    for e in store.tree(id)?.entries {
        let p = join(prefix, &e.name);
        match e.target() {
            Target::Dir(sub) => scan_links(store, &sub, &p, files, links)?,
            Target::File(_) => {
                files.insert(p, e.hash);
            }
            Target::Hardlink(_) => links.push((p, e.data.clone(), e.hash)),
            _ => {}
        }
    }
    Ok(())
}

struct Regroup<'a, 'i> {
    store: &'a Trees<'a>,
    ingest: &'a mut Ingest<'i>,
    /// Path -> `None` (a file: its group's primary) or `Some(primary)` (a link to it).
    desired: &'a HashMap<Vec<u8>, Option<Vec<u8>>>,
    counts: &'a mut Counts,
}

impl Regroup<'_, '_> {
    fn rewrite(&mut self, id: &TreeId, prefix: &[u8]) -> Result<TreeId> {
        let mut tree = self.store.tree(id)?;
        let mut changed = false;
        for e in &mut tree.entries {
            let p = join(prefix, &e.name);
            if let Target::Dir(sub) = e.target() {
                let new = self.rewrite(&sub, &p)?;
                if new != sub {
                    e.hash = *new.as_bytes();
                    changed = true;
                }
                continue;
            }
            let Some(want) = self.desired.get(&p) else {
                continue;
            };
            match (e.kind, want) {
                (Kind::File, Some(primary)) => {
                    e.kind = Kind::Hardlink;
                    e.data = primary.clone();
                    self.counts.files = self.counts.files.saturating_sub(1);
                    self.counts.bytes = self.counts.bytes.saturating_sub(e.size);
                    self.counts.hardlinks += 1;
                }
                (Kind::Hardlink, None) => {
                    e.kind = Kind::File;
                    e.data.clear();
                    self.counts.hardlinks = self.counts.hardlinks.saturating_sub(1);
                    self.counts.files += 1;
                    self.counts.bytes += e.size;
                }
                (Kind::Hardlink, Some(primary)) if e.data != *primary => {
                    e.data = primary.clone();
                }
                _ => continue,
            }
            changed = true;
        }
        if !changed {
            return Ok(*id);
        }
        let (new, bytes) = tree.encode_with_id();
        self.ingest.put(ObjectKind::Tree, *new.as_bytes(), &bytes)?;
        Ok(new)
    }
}

struct Rewrite<'a, 'b, 'i> {
    store: &'a Trees<'a>,
    ingest: &'a mut Ingest<'i>,
    files: &'a HashMap<Vec<u8>, [u8; 32]>,
    put: &'a std::collections::HashSet<Vec<u8>>,
    renamed: &'b mut HashMap<Vec<u8>, Vec<u8>>,
    counts: &'a mut Counts,
}

impl Rewrite<'_, '_, '_> {
    fn rewrite(&mut self, id: &TreeId, prefix: &[u8]) -> Result<TreeId> {
        let store = self.store;
        let mut tree = store.tree(id)?;
        let mut changed = false;
        for e in &mut tree.entries {
            let p = join(prefix, &e.name);
            match e.target() {
                Target::Dir(sub) => {
                    let new = self.rewrite(&sub, &p)?;
                    if new != sub {
                        e.hash = *new.as_bytes();
                        changed = true;
                    }
                }
                Target::Hardlink(_) => {
                    // Put by this edit: a member of one of its own groups. Kept from the
                    // base: linked still if its primary is the same file, not a new one.
                    let intact = self.put.contains(&p)
                        || (self.files.get(&e.data).is_some_and(|h| *h == e.hash)
                            && !self.put.contains(&e.data));
                    if intact {
                        continue;
                    }
                    match self.renamed.get(&e.data) {
                        Some(new_primary) => {
                            e.data = new_primary.clone();
                        }
                        None => {
                            self.renamed.insert(e.data.clone(), p.clone());
                            e.kind = Kind::File;
                            e.data.clear();
                            self.counts.hardlinks = self.counts.hardlinks.saturating_sub(1);
                            self.counts.files += 1;
                            self.counts.bytes += e.size;
                        }
                    }
                    changed = true;
                }
                _ => {}
            }
        }
        if !changed {
            return Ok(*id);
        }
        let (new, bytes) = tree.encode_with_id();
        self.ingest.put(ObjectKind::Tree, *new.as_bytes(), &bytes)?;
        Ok(new)
    }
}
