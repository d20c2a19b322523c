//! Git objects that are not loose (in packs, or behind alternates), read on every ingest
//! worker through `gix-odb` instead of through one `git cat-file` process.
//!
//! A clone's objects are packed, and one `cat-file` inflates and resolves the deltas of
//! every blob on one core (the Linux tree: 3.1 s of `cat-file` alone, 7.1-7.8 s for the
//! whole import against 3.3 s from the same tree on disk; 5.1 s with this, see
//! `docs/BENCHMARKS.md`). `gix-odb` decodes them in this process, on each worker that
//! asks, with no pipe between. Each worker keeps its own handle, with its own cache of
//! delta bases. An object `gix-odb` cannot find (a promisor remote's, a storage it does
//! not read) is left to `git cat-file`, which says why if it cannot either.
//!
//! What is checked, as `cat-file` checks it: the object is a blob. (Neither recomputes
//! the object's SHA-1; a pack's entries are inflated with their zlib checksums.)

use std::path::{Path, PathBuf};
use std::sync::Arc;

use gix_object::Find;

use crate::error::{Error, Result};

/// A repository's object database, shared by the workers of one import (each makes its
/// own handle on it).
pub(crate) struct Odb {
    store: Arc<gix_odb::Store>,
    objects: PathBuf,
}

impl Odb {
    /// The object database under `objects` (`.git/objects`), or `None` when `gix-odb`
    /// cannot open it (then every object comes from `git cat-file`).
    pub fn open(objects: &Path) -> Option<Arc<Odb>> {
        let store = gix_odb::Store::at_opts(
            objects.to_path_buf(),
            gix_hash::Kind::Sha1,
            &mut std::iter::empty(),
            Default::default(),
        )
        .ok()?;
        Some(Arc::new(Odb {
            store: Arc::new(store),
            objects: objects.to_path_buf(),
        }))
    }
}

/// A blob wanted from an [`Odb`].
#[derive(Clone)]
pub(crate) struct Wanted {
    pub odb: Arc<Odb>,
    pub oid: gix_hash::ObjectId,
}

/// A worker's handle on the last [`Odb`] it read from (compared by address), with its
/// own delta-base cache.
#[derive(Default)]
pub(crate) struct Reader {
    open: Option<(Arc<Odb>, gix_odb::HandleArc)>,
    buf: Vec<u8>,
}

/// Delta bases kept per worker (entries of the pack cache).
const PACK_CACHE_ENTRIES: usize = 64;

impl Reader {
    /// The bytes of the blob `w` names; `Err` of kind `NotFound` when the database does
    /// not have it (then `git cat-file` is asked).
    pub fn blob(&mut self, w: &Wanted) -> Result<Vec<u8>> {
        let open = match self.open.take() {
            Some((o, h)) if Arc::ptr_eq(&o, &w.odb) => (o, h),
            _ => {
                let mut h = gix_odb::Cache::from(w.odb.store.to_handle_arc());
                h.set_pack_cache(|| {
                    Box::new(
                        gix_pack::cache::lru::StaticLinkedList::<PACK_CACHE_ENTRIES>::default(),
                    )
                });
                (w.odb.clone(), h)
            }
        };
        let (_, h) = self.open.insert(open);
        let hex = || w.oid.to_hex().to_string();
        let git_err = |why: String| Error::Git {
            step: "read object",
            repo: w.odb.objects.clone(),
            why,
        };
        let data = h
            .try_find(&w.oid, &mut self.buf)
            .map_err(|e| git_err(format!("{}: {e}", hex())))?
            .ok_or_else(|| Error::not_found("git object", hex()))?;
        if data.kind != gix_object::Kind::Blob {
            return Err(git_err(format!("{} is a {}, not a blob", hex(), data.kind)));
        }
        // The blob's bytes are in `buf` (after a header, for a loose object): given
        // without a copy.
        let (at, len) = (data.data.as_ptr() as usize, data.data.len());
        let buf_at = self.buf.as_ptr() as usize;
        if at < buf_at || at + len > buf_at + self.buf.len() {
            // Not where this reads it from (no reader of this version does that):
            // `git cat-file` reads it instead.
            return Err(Error::not_found("git object", hex()));
        }
        let start = at - buf_at;
        let mut out = std::mem::take(&mut self.buf);
        out.truncate(start + len);
        out.drain(..start);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn git(dir: &Path, args: &[&str]) -> Vec<u8> {
        let out = Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("HOME", dir)
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@example.com")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@example.com")
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {out:?}");
        out.stdout
    }

    fn oid(dir: &Path, rev: &str) -> gix_hash::ObjectId {
        let hex = git(dir, &["rev-parse", rev]);
        gix_hash::ObjectId::from_hex(String::from_utf8(hex).unwrap().trim().as_bytes()).unwrap()
    }

    /// Packed blobs, some stored as deltas, read as `git cat-file` gives them; a tree is
    /// refused; an id the database lacks is "not found" (left to `cat-file`).
    #[test]
    fn packed_blobs_read_as_git_gives_them() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = tmp.path();
        git(repo, &["init", "-q"]);
        let mut blobs = Vec::new();
        for v in 0..3 {
            let text: String = (0..5000)
                .map(|i| format!("line {i} {}\n", if i % 500 == 0 { v } else { 0 }))
                .collect();
            std::fs::write(repo.join("f.txt"), text).unwrap();
            git(repo, &["add", "-A"]);
            git(repo, &["commit", "-qm", "v"]);
            blobs.push(oid(repo, "HEAD:f.txt"));
        }
        git(repo, &["repack", "-q", "-a", "-d", "-f"]);
        git(repo, &["prune-packed"]);
        let odb = Odb::open(&repo.join(".git/objects")).unwrap();
        let mut r = Reader::default();
        for b in &blobs {
            let want = git(repo, &["cat-file", "blob", &b.to_hex().to_string()]);
            let got = r
                .blob(&Wanted {
                    odb: odb.clone(),
                    oid: *b,
                })
                .unwrap();
            assert_eq!(got, want);
        }
        let tree = Wanted {
            odb: odb.clone(),
            oid: oid(repo, "HEAD^{tree}"),
        };
        assert!(
            r.blob(&tree)
                .unwrap_err()
                .to_string()
                .contains("not a blob")
        );
        let absent = Wanted {
            odb,
            oid: gix_hash::ObjectId::from_hex(&[b'1'; 40]).unwrap(),
        };
        assert_eq!(
            r.blob(&absent).unwrap_err().kind(),
            crate::ErrorKind::NotFound
        );
    }
}
