//! Differences between snapshots: changed paths, and a unified patch for text files.
//!
//! Trees are compared by subtree id, so an unchanged subtree costs one comparison
//! whatever its size. An added or deleted directory lists every path under it.

use serde::Serialize;

use crate::error::Result;
use crate::id::{SnapshotId, TreeId};
use crate::store::Store;
use crate::tree::join_path as join;
use crate::tree::{Entry, Kind, Target, Tree};

/// Files larger than this are not diffed as text.
pub const MAX_TEXT_DIFF_BYTES: u64 = 8 * 1024 * 1024;

/// How a path changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    Added,
    Modified,
    Deleted,
    /// A file became a directory or a symlink, or the other way round.
    TypeChanged,
}

impl Change {
    pub fn letter(self) -> char {
        match self {
            Change::Added => 'A',
            Change::Modified => 'M',
            Change::Deleted => 'D',
            Change::TypeChanged => 'T',
        }
    }
}

/// One changed path.
#[derive(Debug, Clone, Serialize)]
pub struct DiffEntry {
    /// `/`-separated path from the root (lossy UTF-8 for display).
    pub path: String,
    pub change: Change,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub old_kind: Option<Kind>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub new_kind: Option<Kind>,
    /// The path's bytes; in JSON (as `path_hex`, lowercase hex) only when they are not
    /// UTF-8, so `path` (which then has U+FFFD in their place) cannot name the file.
    #[serde(
        rename = "path_hex",
        skip_serializing_if = "is_utf8",
        serialize_with = "as_hex"
    )]
    pub raw_path: Vec<u8>,
    #[serde(skip)]
    pub old: Option<Entry>,
    #[serde(skip)]
    pub new: Option<Entry>,
}

impl DiffEntry {
    /// The path as a human listing prints it: [`quote_path`] of its bytes (`.` for the
    /// root).
    pub fn display_path(&self) -> String {
        if self.raw_path.is_empty() {
            self.path.clone()
        } else {
            quote_path(&self.raw_path)
        }
    }
}

/// A path as git prints it with `core.quotePath` on (its default): as it is when every
/// byte is printable ASCII other than `"` and `\`, else in double quotes with `\"`,
/// `\\`, the C escapes of control characters (`\t`, `\n`, ...) and every other byte as
/// a backslash and three octal digits (`é` in UTF-8 is `\303\251`). So a name that is
/// not UTF-8 can still be named exactly, and a name holding a newline or a quote cannot
/// pass for another line or path.
pub fn quote_path(path: &[u8]) -> String {
    let plain = |b: u8| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\';
    if path.iter().all(|&b| plain(b)) {
        // All printable ASCII: valid UTF-8.
        return String::from_utf8_lossy(path).into_owned();
    }
    let mut out = String::with_capacity(path.len() * 2 + 2);
    out.push('"');
    quote_into(&mut out, path);
    out.push('"');
    out
}

/// The inside of [`quote_path`]'s quotes.
fn quote_into(out: &mut String, path: &[u8]) {
    use std::fmt::Write;
    for &b in path {
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            0x07 => out.push_str("\\a"),
            0x08 => out.push_str("\\b"),
            b'\t' => out.push_str("\\t"),
            b'\n' => out.push_str("\\n"),
            0x0b => out.push_str("\\v"),
            0x0c => out.push_str("\\f"),
            b'\r' => out.push_str("\\r"),
            0x20..0x7f => out.push(char::from(b)),
            _ => {
                let _ = write!(out, "\\{b:03o}");
            }
        }
    }
}

/// `prefix` and `path` (`a/` and a path) as one name, quoted as a whole as git does on a
/// patch's header lines when the path needs it.
fn quote_prefixed(prefix: &str, path: &[u8]) -> String {
    let mut whole = prefix.as_bytes().to_vec();
    whole.extend_from_slice(path);
    quote_path(&whole)
}

fn is_utf8(b: &[u8]) -> bool {
    std::str::from_utf8(b).is_ok()
}

fn as_hex<S: serde::Serializer>(b: &[u8], s: S) -> std::result::Result<S::Ok, S::Error> {
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    s.serialize_str(&hex)
}

/// The root directory's recorded mode and xattrs.
pub type RootMeta<'a> = (u32, &'a [(Vec<u8>, Vec<u8>)]);

/// The change of the root directory's own mode or xattrs (`path` `.`, `raw_path`
/// empty), if `old` and `new` differ: the root has no tree entry, its mode and xattrs
/// are the snapshot's `root_mode` and `root_xattrs`.
pub fn root_change(old: RootMeta<'_>, new: RootMeta<'_>) -> Option<DiffEntry> {
    let mut nx = new.1.to_vec();
    nx.sort();
    if old.0 & 0o7777 == new.0 & 0o7777 && old.1 == nx.as_slice() {
        return None;
    }
    let dir = |(mode, xattrs): RootMeta<'_>| Entry {
        name: Vec::new(),
        kind: Kind::Dir,
        mode: mode & 0o7777,
        size: 0,
        hash: [0; 32],
        data: Vec::new(),
        xattrs: xattrs.to_vec(),
    };
    Some(DiffEntry {
        path: ".".into(),
        change: Change::Modified,
        old_kind: Some(Kind::Dir),
        new_kind: Some(Kind::Dir),
        raw_path: Vec::new(),
        old: Some(dir(old)),
        new: Some(dir(new)),
    })
}

fn family(k: Kind) -> Kind {
    if k == Kind::Hardlink { Kind::File } else { k }
}

fn entry(path: Vec<u8>, change: Change, old: Option<&Entry>, new: Option<&Entry>) -> DiffEntry {
    DiffEntry {
        path: String::from_utf8_lossy(&path).into_owned(),
        change,
        old_kind: old.map(|e| e.kind),
        new_kind: new.map(|e| e.kind),
        raw_path: path,
        old: old.cloned(),
        new: new.cloned(),
    }
}

impl Store {
    /// The changes from snapshot `a` to snapshot `b`, in path order.
    pub fn diff_snapshots(&self, a: &SnapshotId, b: &SnapshotId) -> Result<Vec<DiffEntry>> {
        let (sa, sb) = (self.snapshot(a)?, self.snapshot(b)?);
        let (ra, rb) = (sa.root, sb.root);
        let mut out: Vec<DiffEntry> = root_change(
            (sa.root_mode, &sa.root_xattrs),
            (sb.root_mode, &sb.root_xattrs),
        )
        .into_iter()
        .collect();
        self.diff_trees(Some(&ra), Some(&rb), &[], &mut out)?;
        Ok(out)
    }

    /// Appends the changes between two trees (either may be absent) under `prefix`.
    pub fn diff_trees(
        &self,
        a: Option<&TreeId>,
        b: Option<&TreeId>,
        prefix: &[u8],
        out: &mut Vec<DiffEntry>,
    ) -> Result<()> {
        if a == b {
            return Ok(());
        }
        let ta = a.map(|id| self.tree(id)).transpose()?.unwrap_or_default();
        let tb = b.map(|id| self.tree(id)).transpose()?.unwrap_or_default();
        self.diff_loaded(&ta, &tb, prefix, out)
    }

    fn diff_loaded(
        &self,
        ta: &Tree,
        tb: &Tree,
        prefix: &[u8],
        out: &mut Vec<DiffEntry>,
    ) -> Result<()> {
        let (mut i, mut j) = (0, 0);
        // Both entry lists are sorted by name: one merge pass.
        loop {
            let (x, y) = match (ta.entries.get(i), tb.entries.get(j)) {
                (None, None) => break,
                (Some(x), None) => {
                    self.one_side(x, prefix, Change::Deleted, out)?;
                    i += 1;
                    continue;
                }
                (None, Some(y)) => {
                    self.one_side(y, prefix, Change::Added, out)?;
                    j += 1;
                    continue;
                }
                (Some(x), Some(y)) => (x, y),
            };
            match x.name.cmp(&y.name) {
                std::cmp::Ordering::Less => {
                    self.one_side(x, prefix, Change::Deleted, out)?;
                    i += 1;
                }
                std::cmp::Ordering::Greater => {
                    self.one_side(y, prefix, Change::Added, out)?;
                    j += 1;
                }
                std::cmp::Ordering::Equal => {
                    let path = join(prefix, &x.name);
                    match (x.kind, y.kind) {
                        (Kind::Dir, Kind::Dir) => {
                            if x.mode != y.mode || x.xattrs != y.xattrs {
                                out.push(entry(path.clone(), Change::Modified, Some(x), Some(y)));
                            }
                            if x.hash != y.hash {
                                self.diff_trees(
                                    x.subtree().as_ref(),
                                    y.subtree().as_ref(),
                                    &path,
                                    out,
                                )?;
                            }
                        }
                        (kx, ky) if family(kx) != family(ky) => {
                            out.push(entry(path.clone(), Change::TypeChanged, Some(x), Some(y)));
                            if kx == Kind::Dir {
                                self.diff_trees(x.subtree().as_ref(), None, &path, out)?;
                            }
                            if ky == Kind::Dir {
                                self.diff_trees(None, y.subtree().as_ref(), &path, out)?;
                            }
                        }
                        _ => {
                            if x.hash != y.hash
                                || x.mode != y.mode
                                || x.size != y.size
                                || x.xattrs != y.xattrs
                                // A name that joined or left a group of hard links (a
                                // file, then a hard link, or the other way round): a
                                // commit records it, so it is listed both ways.
                                || x.kind != y.kind
                                || (x.kind != Kind::Hardlink && x.data != y.data)
                                || (x.kind == Kind::Symlink && x.data != y.data)
                            {
                                out.push(entry(path, Change::Modified, Some(x), Some(y)));
                            }
                        }
                    }
                    i += 1;
                    j += 1;
                }
            }
        }
        Ok(())
    }

    fn one_side(
        &self,
        e: &Entry,
        prefix: &[u8],
        change: Change,
        out: &mut Vec<DiffEntry>,
    ) -> Result<()> {
        let path = join(prefix, &e.name);
        let (old, new) = if change == Change::Deleted {
            (Some(e), None)
        } else {
            (None, Some(e))
        };
        out.push(entry(path.clone(), change, old, new));
        if e.kind == Kind::Dir {
            let sub = e.subtree();
            if change == Change::Deleted {
                self.diff_trees(sub.as_ref(), None, &path, out)?;
            } else {
                self.diff_trees(None, sub.as_ref(), &path, out)?;
            }
        }
        Ok(())
    }

    /// The bytes a patch shows for an entry: file content or symlink target.
    fn patch_bytes(&self, e: &Entry) -> Result<Option<Vec<u8>>> {
        match e.target() {
            Target::File(c) | Target::Hardlink(c) if e.size <= MAX_TEXT_DIFF_BYTES => {
                Ok(Some(self.read_content(&c)?))
            }
            Target::Symlink => Ok(Some(e.data.clone())),
            _ => Ok(None),
        }
    }

    /// A unified patch (git style) of the given changes.
    pub fn patch(&self, changes: &[DiffEntry]) -> Result<String> {
        let mut out = String::new();
        for c in changes {
            let old = c.old.as_ref().filter(|e| e.kind != Kind::Dir);
            let new = c.new.as_ref().filter(|e| e.kind != Kind::Dir);
            if old.is_none() && new.is_none() {
                continue;
            }
            let ob = old.map(|e| self.patch_bytes(e)).transpose()?.flatten();
            let nb = new.map(|e| self.patch_bytes(e)).transpose()?.flatten();
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
}

fn git_mode(e: &Entry) -> String {
    match e.kind {
        Kind::Symlink => "120000".into(),
        _ if e.mode & 0o111 != 0 => "100755".into(),
        _ => "100644".into(),
    }
}

fn is_text(b: &[u8]) -> bool {
    !b[..b.len().min(8192)].contains(&0) && std::str::from_utf8(b).is_ok()
}

/// Appends one file's patch: header, mode lines, and a unified diff or a binary note.
pub fn write_patch(
    out: &mut String,
    path: &[u8],
    old: Option<&Entry>,
    old_bytes: Option<&[u8]>,
    new: Option<&Entry>,
    new_bytes: Option<&[u8]>,
) {
    use std::fmt::Write;
    let _ = writeln!(
        out,
        "diff --git {} {}",
        quote_prefixed("a/", path),
        quote_prefixed("b/", path)
    );
    match (old, new) {
        (None, Some(n)) => {
            let _ = writeln!(out, "new file mode {}", git_mode(n));
        }
        (Some(o), None) => {
            let _ = writeln!(out, "deleted file mode {}", git_mode(o));
        }
        (Some(o), Some(n)) if git_mode(o) != git_mode(n) => {
            let _ = writeln!(out, "old mode {}\nnew mode {}", git_mode(o), git_mode(n));
        }
        _ => {}
    }
    let (a, b) = (old_bytes.unwrap_or(b""), new_bytes.unwrap_or(b""));
    if a == b {
        return;
    }
    let too_big = (old.is_some() && old_bytes.is_none()) || (new.is_some() && new_bytes.is_none());
    // The names on the patch's header lines: an absent side is /dev/null.
    let side = |prefix: &str, present: bool| {
        if present {
            quote_prefixed(prefix, path)
        } else {
            "/dev/null".to_string()
        }
    };
    let (an, bn) = (side("a/", old.is_some()), side("b/", new.is_some()));
    if too_big || !is_text(a) || !is_text(b) {
        let _ = writeln!(out, "Binary files {an} and {bn} differ");
        return;
    }
    let (a, b) = (
        std::str::from_utf8(a).unwrap_or(""),
        std::str::from_utf8(b).unwrap_or(""),
    );
    let diff = similar::TextDiff::from_lines(a, b);
    let _ = write!(
        out,
        "{}",
        diff.unified_diff().context_radius(3).header(&an, &bn)
    );
}
