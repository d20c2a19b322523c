//! Building trees from the entries an import found, then writing them bottom-up.
//!
//! Every import source (directory, git, tar) produces the same [`Item`]s under
//! root-relative paths; the builder turns them into canonical trees, so one set of
//! files gets one snapshot root whatever produced it.
//!
//! Hard links: members of one link group become one `File` entry (the member that comes
//! first in depth-first name order, so the choice is canonical) and `Hardlink` entries
//! naming that path.

use std::collections::{BTreeMap, HashMap};

use crate::error::{Error, Result};
use crate::id::TreeId;
use crate::index::ObjectKind;
use crate::ingest::{FileContent, Ingest};
use crate::snapshot::Counts;
use crate::tree::join_path as join;
use crate::tree::{self, Entry, Kind, Tree};

/// Deepest directory nesting accepted.
pub const MAX_DEPTH: usize = 4096;

/// What stands at a path.
#[derive(Debug, Clone)]
pub enum Item {
    Dir {
        mode: u32,
        xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    },
    /// A regular file whose content is known or will arrive in `slot`.
    File {
        mode: u32,
        content: Slot,
        link_group: Option<u64>,
        xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    },
    Symlink {
        target: Vec<u8>,
        xattrs: Vec<(Vec<u8>, Vec<u8>)>,
        /// Names of one multiply-linked symlink share a group, as `File`'s do.
        link_group: Option<u64>,
    },
    Special {
        kind: Kind,
        mode: u32,
        rdev: u64,
    },
}

/// A file's content: known, or awaited from the ingest pipeline.
#[derive(Debug, Clone, Copy)]
pub enum Slot {
    Known(FileContent),
    Pending(usize),
}

#[derive(Debug)]
enum Node {
    Dir {
        mode: u32,
        xattrs: Vec<(Vec<u8>, Vec<u8>)>,
        children: BTreeMap<Vec<u8>, Node>,
    },
    Leaf(Item),
}

/// An in-memory directory tree under construction.
#[derive(Debug)]
pub struct Builder {
    root: Node,
    root_mode: u32,
    root_xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// Whether any file is in a link group (else there are no primaries to find).
    has_links: bool,
}

impl Builder {
    pub fn new(root_mode: u32) -> Builder {
        Builder {
            root: Node::Dir {
                mode: root_mode,
                xattrs: vec![],
                children: BTreeMap::new(),
            },
            root_mode,
            root_xattrs: Vec::new(),
            has_links: false,
        }
    }

    /// The root directory's xattrs (kept in the snapshot, not in a tree).
    pub fn set_root_xattrs(&mut self, mut xattrs: Vec<(Vec<u8>, Vec<u8>)>) {
        xattrs.sort();
        self.root_xattrs = xattrs;
    }

    /// The root directory's xattrs.
    pub fn root_xattrs(&self) -> &[(Vec<u8>, Vec<u8>)] {
        &self.root_xattrs
    }

    pub fn set_root_mode(&mut self, mode: u32) {
        self.root_mode = mode & 0o7777;
    }

    /// Adds (or replaces) the item at `path` (components, each a valid name). Missing
    /// parent directories are created with mode 0755. Replacing a directory by a
    /// non-directory drops what was under it (later tar entries win).
    pub fn insert(&mut self, path: &[Vec<u8>], item: Item) -> Result<()> {
        let Some((last, parents)) = path.split_last() else {
            // The root itself: its mode and xattrs are the snapshot's.
            if let Item::Dir { mode, xattrs } = item {
                self.set_root_mode(mode);
                self.set_root_xattrs(xattrs);
            }
            return Ok(());
        };
        if path.len() > MAX_DEPTH {
            return Err(Error::Invalid(format!(
                "path deeper than {MAX_DEPTH} levels"
            )));
        }
        let mut node = &mut self.root;
        for name in parents {
            tree::check_name(name)?;
            let Node::Dir { children, .. } = node else {
                unreachable!("walk stays in dirs")
            };
            let child = children.entry(name.clone()).or_insert_with(|| Node::Dir {
                mode: 0o755,
                xattrs: vec![],
                children: BTreeMap::new(),
            });
            if !matches!(child, Node::Dir { .. }) {
                *child = Node::Dir {
                    mode: 0o755,
                    xattrs: vec![],
                    children: BTreeMap::new(),
                };
            }
            node = child;
        }
        tree::check_name(last)?;
        let Node::Dir { children, .. } = node else {
            unreachable!("walk stays in dirs")
        };
        match item {
            Item::Dir { mode, xattrs } => match children.get_mut(last) {
                Some(Node::Dir {
                    mode: m, xattrs: x, ..
                }) => {
                    *m = mode & 0o7777;
                    *x = xattrs;
                }
                _ => {
                    children.insert(
                        last.clone(),
                        Node::Dir {
                            mode: mode & 0o7777,
                            xattrs,
                            children: BTreeMap::new(),
                        },
                    );
                }
            },
            leaf => {
                if let Item::File {
                    link_group: Some(_),
                    ..
                }
                | Item::Symlink {
                    link_group: Some(_),
                    ..
                } = leaf
                {
                    self.has_links = true;
                }
                children.insert(last.clone(), Node::Leaf(leaf));
            }
        }
        Ok(())
    }

    /// The item at `path`, if it is a regular file.
    pub fn file_at(&self, path: &[Vec<u8>]) -> Option<(u32, Slot, Option<u64>)> {
        match self.lookup(path)? {
            Node::Leaf(Item::File {
                mode,
                content,
                link_group,
                ..
            }) => Some((*mode, *content, *link_group)),
            _ => None,
        }
    }

    /// The item at `path`, if it is not a directory (tar import: hard-link targets'
    /// xattrs, symlinks standing where a parent directory is expected).
    pub fn item_at(&self, path: &[Vec<u8>]) -> Option<&Item> {
        match self.lookup(path)? {
            Node::Leaf(item) => Some(item),
            Node::Dir { .. } => None,
        }
    }

    /// Replaces the content of the regular file at `path`.
    pub fn set_content(&mut self, path: &[Vec<u8>], new: Slot) {
        if let Some(Node::Leaf(Item::File { content, .. })) = self.lookup_mut(path) {
            *content = new;
        }
    }

    /// Sets the xattrs of the regular file at `path` (read after it was inserted).
    pub fn set_xattrs(&mut self, path: &[Vec<u8>], new: Vec<(Vec<u8>, Vec<u8>)>) {
        if let Some(Node::Leaf(Item::File { xattrs, .. })) = self.lookup_mut(path) {
            *xattrs = new;
        }
    }

    /// Puts `path` into link group `group` (it must be a regular file or a symlink).
    pub fn set_link_group(&mut self, path: &[Vec<u8>], group: u64) {
        if let Some(Node::Leaf(Item::File { link_group, .. } | Item::Symlink { link_group, .. })) =
            self.lookup_mut(path)
        {
            *link_group = Some(group);
            self.has_links = true;
        }
    }

    /// Whiteouts of image layers: removes what stands at `path` (`whole`), or everything
    /// under the directory at `path` (an opaque directory), except what `touched` (given
    /// `/`-joined root-relative paths) says the layer being applied put there itself:
    /// such a path is kept, and if it is a directory only its untouched children go.
    pub fn remove_lower(&mut self, path: &[Vec<u8>], whole: bool, touched: &dyn Fn(&[u8]) -> bool) {
        let joined = path.join(&b'/');
        if whole {
            let Some((last, parents)) = path.split_last() else {
                return;
            };
            let Some(Node::Dir { children, .. }) = self.lookup_mut(parents) else {
                return;
            };
            if !touched(&joined) {
                children.remove(last);
            } else if let Some(node) = children.get_mut(last) {
                prune(node, &joined, touched);
            }
        } else if let Some(node) = self.lookup_mut(path) {
            prune(node, &joined, touched);
        }
    }

    fn lookup(&self, path: &[Vec<u8>]) -> Option<&Node> {
        let mut node = &self.root;
        for name in path {
            let Node::Dir { children, .. } = node else {
                return None;
            };
            node = children.get(name)?;
        }
        Some(node)
    }

    fn lookup_mut(&mut self, path: &[Vec<u8>]) -> Option<&mut Node> {
        let mut node = &mut self.root;
        for name in path {
            let Node::Dir { children, .. } = node else {
                return None;
            };
            node = children.get_mut(name)?;
        }
        Some(node)
    }

    /// Writes every tree through `ingest` and returns the root id, root mode, counts and
    /// whether any entry (or the root) has an xattr. `slots` holds the contents that
    /// arrived for pending files.
    pub fn write(
        &self,
        ingest: &mut Ingest<'_>,
        slots: &[Option<FileContent>],
    ) -> Result<(TreeId, u32, Counts, bool)> {
        // Pass 1: the primary path of each link group (first in depth-first order).
        let mut primaries = Primaries::new();
        if self.has_links {
            collect_primaries(&self.root, &[], &mut primaries);
        }
        let mut tally = Tally {
            counts: Counts::default(),
            xattrs: !self.root_xattrs.is_empty(),
        };
        let id = write_node(&self.root, ingest, slots, &primaries, &[], &mut tally, 0)?;
        Ok((id, self.root_mode, tally.counts, tally.xattrs))
    }
}

/// Removes the children of `node` (at `path`) that `touched` does not name, recursively.
fn prune(node: &mut Node, path: &[u8], touched: &dyn Fn(&[u8]) -> bool) {
    let Node::Dir { children, .. } = node else {
        return;
    };
    children.retain(|name, child| {
        let p = join(path, name);
        if !touched(&p) {
            return false;
        }
        prune(child, &p, touched);
        true
    });
}

/// Link group -> (its first path in depth-first name order, its number of names).
type Primaries = HashMap<u64, (Vec<u8>, u64)>;

fn collect_primaries(node: &Node, path: &[u8], out: &mut Primaries) {
    let Node::Dir { children, .. } = node else {
        return;
    };
    for (name, child) in children {
        let p = join(path, name);
        match child {
            Node::Leaf(
                Item::File {
                    link_group: Some(g),
                    ..
                }
                | Item::Symlink {
                    link_group: Some(g),
                    ..
                },
            ) => {
                out.entry(*g).or_insert((p, 0)).1 += 1;
            }
            Node::Dir { .. } => collect_primaries(child, &p, out),
            _ => {}
        }
    }
}

fn content_of(
    slot: &Slot,
    slots: &[Option<FileContent>],
    path: impl FnOnce() -> Vec<u8>,
) -> Result<FileContent> {
    match slot {
        Slot::Known(c) => Ok(*c),
        Slot::Pending(i) => slots.get(*i).copied().flatten().ok_or_else(|| {
            Error::Invalid(format!(
                "no content arrived for {:?} (internal)",
                String::from_utf8_lossy(&path())
            ))
        }),
    }
}

/// What writing the trees counted: the snapshot's counts, and whether any entry has an
/// xattr.
struct Tally {
    counts: Counts,
    xattrs: bool,
}

fn write_node(
    node: &Node,
    ingest: &mut Ingest<'_>,
    slots: &[Option<FileContent>],
    primaries: &Primaries,
    path: &[u8],
    tally: &mut Tally,
    depth: usize,
) -> Result<TreeId> {
    let Node::Dir { children, .. } = node else {
        unreachable!("only directories are written")
    };
    if depth > MAX_DEPTH {
        return Err(Error::Invalid(format!(
            "directory deeper than {MAX_DEPTH} levels"
        )));
    }
    let mut entries = Vec::with_capacity(children.len());
    for (name, child) in children {
        // The child's root-relative path: made only where needed (directories, links).
        let child_path = || join(path, name);
        let entry = match child {
            Node::Dir { mode, xattrs, .. } => {
                let id = write_node(
                    child,
                    ingest,
                    slots,
                    primaries,
                    &child_path(),
                    tally,
                    depth + 1,
                )?;
                tally.counts.dirs += 1;
                Entry {
                    name: name.clone(),
                    kind: Kind::Dir,
                    mode: *mode,
                    size: 0,
                    hash: *id.as_bytes(),
                    data: vec![],
                    xattrs: xattrs.clone(),
                }
            }
            Node::Leaf(Item::File {
                mode,
                content,
                link_group,
                xattrs,
            }) => {
                let c = content_of(content, slots, child_path)?;
                let primary = link_group.and_then(|g| primaries.get(&g)).map(|(p, _)| p);
                let (kind, data) = match primary {
                    Some(p) if *p != child_path() => {
                        tally.counts.hardlinks += 1;
                        (Kind::Hardlink, p.clone())
                    }
                    _ => {
                        tally.counts.files += 1;
                        tally.counts.bytes += c.size;
                        (Kind::File, vec![])
                    }
                };
                Entry {
                    name: name.clone(),
                    kind,
                    mode: mode & 0o7777,
                    size: c.size,
                    hash: *c.id.as_bytes(),
                    data,
                    xattrs: xattrs.clone(),
                }
            }
            Node::Leaf(Item::Symlink {
                target,
                xattrs,
                link_group,
            }) => {
                let mut e = Entry::symlink(name.clone(), target.clone(), xattrs.clone());
                match link_group.and_then(|g| primaries.get(&g)) {
                    // A symlink with several names: each records its group's key, and
                    // all but the first count as hard links.
                    Some((first, names)) if *names > 1 => {
                        e.hash = crate::tree::symlink_group_key(first);
                        if *first == child_path() {
                            tally.counts.symlinks += 1;
                        } else {
                            tally.counts.hardlinks += 1;
                        }
                    }
                    _ => tally.counts.symlinks += 1,
                }
                e
            }
            Node::Leaf(Item::Special { kind, mode, rdev }) => {
                Entry::special(name.clone(), *kind, mode & 0o7777, *rdev)
            }
            Node::Leaf(Item::Dir { .. }) => unreachable!("directories are nodes"),
        };
        tally.xattrs |= !entry.xattrs.is_empty();
        entries.push(entry);
    }
    let mut tree = Tree { entries };
    tree.sort();
    let (id, bytes) = tree.encode_with_id();
    ingest.put_owned(ObjectKind::Tree, *id.as_bytes(), bytes)?;
    Ok(id)
}
