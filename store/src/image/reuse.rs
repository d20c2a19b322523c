//! Layers an image shares with one already in the store are not fetched again.
//!
//! The tree an image's first k layers make depends on those layers alone, and a layer is
//! named by its `diff_id` (the sha256 of its uncompressed tar, checked when it was
//! applied). So when an image in the store (a snapshot a ref names, whose source is an
//! image) has `diff_ids` that begin the new image's, its tree is the new image's after
//! those layers: the import starts from it ([`seed`]) and fetches only the layers after
//! them. This is the chain-id rule of container runtimes; the store needs no table for
//! it, since every image snapshot records its config.

use std::collections::HashMap;

use oci_spec::image::ImageConfiguration;

use crate::error::Result;
use crate::id::{ContentId, SnapshotId, TreeId};
use crate::import::builder::{Item, Slot};
use crate::import::tar::TarImport;
use crate::ingest::FileContent;
use crate::snapshot::Source;
use crate::store::Store;
use crate::tree::Kind;

/// An image in the store whose layers begin the new image's.
pub(crate) struct Prefix {
    pub snapshot: SnapshotId,
    /// How many of the new image's layers it holds.
    pub layers: usize,
    root: TreeId,
    root_mode: u32,
    root_xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

/// The image a ref names whose `diff_ids` are the longest run that begins `diff_ids`.
pub(crate) fn stored_prefix(store: &Store, diff_ids: &[String]) -> Result<Option<Prefix>> {
    let mut best: Option<Prefix> = None;
    for (_, id) in store.refs()? {
        let Ok(snap) = store.snapshot(&id) else {
            continue;
        };
        let Source::Image { config, .. } = &snap.source else {
            continue;
        };
        let Ok(c) = ImageConfiguration::from_reader(config.as_bytes()) else {
            continue;
        };
        let theirs = c.rootfs().diff_ids();
        if theirs.is_empty()
            || theirs.len() > diff_ids.len()
            || diff_ids[..theirs.len()] != theirs[..]
        {
            continue;
        }
        if best.as_ref().is_none_or(|b| theirs.len() > b.layers) {
            best = Some(Prefix {
                snapshot: id,
                layers: theirs.len(),
                root: snap.root,
                root_mode: snap.root_mode,
                root_xattrs: snap.root_xattrs.clone(),
            });
        }
    }
    Ok(best)
}

/// Puts `prefix`'s tree into the import's builder, as its layers had left it.
pub(crate) fn seed(store: &Store, state: &mut TarImport<'_>, prefix: &Prefix) -> Result<()> {
    state.builder.set_root_mode(prefix.root_mode);
    state.builder.set_root_xattrs(prefix.root_xattrs.clone());
    let mut groups: HashMap<Vec<u8>, u64> = HashMap::new();
    let mut path: Vec<Vec<u8>> = Vec::new();
    walk(store, state, &prefix.root, &mut path, &mut groups)
}

fn walk(
    store: &Store,
    state: &mut TarImport<'_>,
    tree: &TreeId,
    path: &mut Vec<Vec<u8>>,
    groups: &mut HashMap<Vec<u8>, u64>,
) -> Result<()> {
    let t = store.tree(tree)?;
    for e in &t.entries {
        path.push(e.name.clone());
        let content = || {
            Slot::Known(FileContent {
                id: ContentId::from_bytes(e.hash),
                size: e.size,
            })
        };
        match e.kind {
            Kind::Dir => {
                state.builder.insert(
                    path,
                    Item::Dir {
                        mode: e.mode,
                        xattrs: e.xattrs.clone(),
                    },
                )?;
                walk(store, state, &TreeId::from_bytes(e.hash), path, groups)?;
            }
            Kind::File => {
                state.builder.insert(
                    path,
                    Item::File {
                        mode: e.mode,
                        content: content(),
                        link_group: groups.get(&path.join(&b'/')).copied(),
                        xattrs: e.xattrs.clone(),
                    },
                )?;
            }
            Kind::Hardlink => {
                // `data` is the primary's path; the primary comes first in the walk's
                // order, so it is in the builder already.
                let group = match groups.get(&e.data) {
                    Some(g) => *g,
                    None => {
                        let g = state.next_group;
                        state.next_group += 1;
                        let comps: Vec<Vec<u8>> =
                            e.data.split(|b| *b == b'/').map(<[u8]>::to_vec).collect();
                        state.builder.set_link_group(&comps, g);
                        groups.insert(e.data.clone(), g);
                        g
                    }
                };
                state.builder.insert(
                    path,
                    Item::File {
                        mode: e.mode,
                        content: content(),
                        link_group: Some(group),
                        xattrs: e.xattrs.clone(),
                    },
                )?;
            }
            Kind::Symlink => {
                // A symlink with several names: its names share a builder group, found
                // by its key (after a NUL byte, which no path holds).
                let link_group = e.link_group().map(|key| {
                    let slot = [&[0u8][..], &key].concat();
                    match groups.get(&slot) {
                        Some(g) => *g,
                        None => {
                            let g = state.next_group;
                            state.next_group += 1;
                            groups.insert(slot, g);
                            g
                        }
                    }
                });
                state.builder.insert(
                    path,
                    Item::Symlink {
                        target: e.data.clone(),
                        xattrs: e.xattrs.clone(),
                        link_group,
                    },
                )?;
            }
            kind => {
                state.builder.insert(
                    path,
                    Item::Special {
                        kind,
                        mode: e.mode,
                        rdev: e.rdev().unwrap_or(0),
                    },
                )?;
            }
        }
        path.pop();
    }
    Ok(())
}
