//! What a git revision's listing (`git ls-tree -r -z`) becomes: each path checked and
//! planned as a file or a symlink of a blob, the blobs to read, then the tree built from
//! them once read ([`super::git`] reads them).

use std::collections::HashMap;

use crate::error::{Error, Result};
use crate::import::builder::{Builder, Item, Slot};
use crate::import::tar::{PathFilter, split_member};
use crate::ingest::FileContent;

/// One line of `git ls-tree -r -z` (with `-l`, the blob's size too).
#[derive(Debug)]
pub(super) struct TreeLine {
    pub(super) mode: u32,
    pub(super) kind: Vec<u8>,
    pub(super) oid: String,
    pub(super) size: Option<u64>,
    pub(super) path: Vec<u8>,
}

pub(super) fn parse_ls_tree(out: &[u8]) -> std::result::Result<Vec<TreeLine>, String> {
    let mut lines = Vec::new();
    for rec in out.split(|&b| b == 0).filter(|r| !r.is_empty()) {
        let bad = || format!("unexpected ls-tree line {:?}", String::from_utf8_lossy(rec));
        let tab = rec.iter().position(|&b| b == b'\t').ok_or_else(bad)?;
        let (meta, path) = (&rec[..tab], &rec[tab + 1..]);
        let meta = std::str::from_utf8(meta).map_err(|_| bad())?;
        let mut f = meta.split_ascii_whitespace();
        let (Some(mode), Some(kind), Some(oid), size, None) =
            (f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            return Err(bad());
        };
        let mode = u32::from_str_radix(mode, 8).map_err(|_| bad())?;
        if oid.is_empty() || !oid.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        let size = match size {
            None | Some("-") => None,
            Some(s) => Some(s.parse::<u64>().map_err(|_| bad())?),
        };
        lines.push(TreeLine {
            mode,
            kind: kind.as_bytes().to_vec(),
            oid: oid.to_string(),
            size,
            path: path.to_vec(),
        });
    }
    Ok(lines)
}

/// What a tracked path becomes, before its content is read.
pub(super) enum Planned {
    File { exec: bool, oid: String },
    Symlink { oid: String },
}

/// How each distinct blob is used.
#[derive(Default, Clone, Copy)]
pub(super) struct Uses {
    pub(super) file: bool,
    pub(super) link: bool,
}

/// What a revision's listing asks to import.
pub(super) struct Plan {
    /// Each path kept (its components) and what it becomes.
    pub(super) planned: Vec<(Vec<Vec<u8>>, Planned)>,
    /// How each distinct blob is used.
    pub(super) uses: HashMap<String, Uses>,
    /// Each distinct blob once, in the tree's order, with the size `ls-tree` gave.
    pub(super) order: Vec<(String, Option<u64>)>,
    /// What was left out (submodules).
    pub(super) warnings: Vec<String>,
}

/// Checks each listed path and plans it (or leaves it out: excluded, a submodule).
pub(super) fn plan(
    lines: Vec<TreeLine>,
    filter: &mut PathFilter<'_>,
    unsafe_entry: &dyn Fn(&[u8], String) -> Error,
) -> Result<Plan> {
    let mut out = Plan {
        planned: Vec::with_capacity(lines.len()),
        uses: HashMap::new(),
        order: Vec::new(),
        warnings: Vec::new(),
    };
    for l in lines {
        let comps = split_member(&l.path).map_err(|why| unsafe_entry(&l.path, why))?;
        if comps.is_empty() {
            return Err(unsafe_entry(&l.path, "names the root".into()));
        }
        let p = match (l.mode & 0o170000, l.kind.as_slice()) {
            (0o100000, b"blob") => Planned::File {
                exec: l.mode & 0o100 != 0,
                oid: l.oid.clone(),
            },
            (0o120000, b"blob") => Planned::Symlink { oid: l.oid.clone() },
            (0o160000, b"commit") => {
                out.warnings.push(format!(
                    "{}: a submodule (commit {}); left out",
                    String::from_utf8_lossy(&l.path),
                    l.oid
                ));
                continue;
            }
            _ => {
                return Err(unsafe_entry(
                    &l.path,
                    format!(
                        "unexpected mode {:o} for a {}",
                        l.mode,
                        String::from_utf8_lossy(&l.kind)
                    ),
                ));
            }
        };
        if filter.excludes(&comps, false) {
            continue;
        }
        let (oid, is_link) = match &p {
            Planned::File { oid, .. } => (oid, false),
            Planned::Symlink { oid } => (oid, true),
        };
        let u = out.uses.entry(oid.clone()).or_insert_with(|| {
            out.order.push((oid.clone(), l.size));
            Uses::default()
        });
        if is_link {
            u.link = true;
        } else {
            u.file = true;
        }
        out.planned.push((comps, p));
    }
    Ok(out)
}

/// The tree of the planned paths, their contents and targets read.
pub(super) fn build_tree(
    planned: Vec<(Vec<Vec<u8>>, Planned)>,
    contents: &HashMap<String, FileContent>,
    targets: &HashMap<String, Vec<u8>>,
    unsafe_entry: &dyn Fn(&[u8], String) -> Error,
) -> Result<Builder> {
    let mut builder = Builder::new(0o755);
    for (comps, p) in planned {
        let path = comps.join(&b'/');
        let item = match p {
            Planned::File { exec, oid } => Item::File {
                mode: if exec { 0o755 } else { 0o644 },
                content: Slot::Known(contents[&oid]),
                link_group: None,
                xattrs: vec![],
            },
            Planned::Symlink { oid } => {
                let target = targets[&oid].clone();
                if target.contains(&0) {
                    return Err(unsafe_entry(
                        &path,
                        "the symlink target contains a NUL byte".into(),
                    ));
                }
                Item::Symlink {
                    target,
                    xattrs: vec![],
                    link_group: None,
                }
            }
        };
        builder.insert(&comps, item).map_err(|e| match e {
            Error::Invalid(why) => unsafe_entry(&path, why),
            e => e,
        })?;
    }
    Ok(builder)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ls_tree_lines() {
        let out = b"100644 blob e69de29bb2d1d6434b8b29ae775ad8c2e48c5391       0\ta b/c d\0\
160000 commit 1234567890123456789012345678901234567890       -\tsub\0\
120000 blob 2222222222222222222222222222222222222222      12\tlink\0";
        let l = parse_ls_tree(out).unwrap();
        assert_eq!(l.len(), 3);
        assert_eq!(l[0].mode, 0o100644);
        assert_eq!(l[0].path, b"a b/c d");
        assert_eq!(l[0].size, Some(0));
        assert_eq!(l[1].size, None);
        assert_eq!(l[2].kind, b"blob");
        assert!(parse_ls_tree(b"100644 blob xyz 1\tp\0").is_err());
        // Without `-l`: no size.
        let l =
            parse_ls_tree(b"100644 blob 2222222222222222222222222222222222222222\tp\0").unwrap();
        assert_eq!((l[0].size, l[0].path.as_slice()), (None, b"p".as_slice()));
        assert!(parse_ls_tree(b"100644 blob\tp\0").is_err());
    }
}
