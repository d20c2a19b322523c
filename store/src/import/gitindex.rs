//! Making a git checkout's `.git/index` agree with what a workspace will serve, so the
//! first `git status` in a brand-new workspace re-hashes nothing.
//!
//! git trusts an index entry when the file's stat data (mtime, ctime, inode, size, uid,
//! gid) equals what the entry recorded, and the entry is not "racily clean" (its mtime
//! is older than the index file's). A workspace serves every file with new stat data, so
//! an index imported unchanged makes git re-read every file once. At import we know,
//! for each entry, whether git already trusted it on the source (its recorded stat
//! equals the source file's and it is not racy); for exactly those entries we write the
//! stat data the workspace will serve (given by the caller, see
//! [`crate::import::ImportOptions::served_identity`]). Entries git did not trust keep
//! their old stat data, so git still checks them: a dirty file is never hidden.
//!
//! Supported: index versions 2, 3 and 4 with SHA-1 object ids; anything else (SHA-256
//! repositories, split indexes) is left as it is.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Stat data of one index entry (git keeps each as a 32-bit value).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EntryStat {
    pub ctime_s: u32,
    pub ctime_ns: u32,
    pub mtime_s: u32,
    pub mtime_ns: u32,
    pub dev: u32,
    pub ino: u32,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u32,
}

/// The entry whose served stat (see `ImportOptions::served_identity`) an index entry is
/// made to agree with: a regular file with its permission bits, size and content, and
/// nothing else. Whoever checks or rewrites index entries later builds the same one.
pub fn served_entry(name: &[u8], mode: u32, size: u64, hash: [u8; 32]) -> crate::tree::Entry {
    crate::tree::Entry {
        name: name.to_vec(),
        kind: crate::tree::Kind::File,
        mode: mode & 0o7777,
        size,
        hash,
        data: vec![],
        xattrs: vec![],
    }
}

/// What a workspace serves for a file (see `ImportOptions::served_identity`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServedStat {
    pub ino: u64,
    pub mtime_s: u32,
    pub ctime_s: u32,
    pub uid: u32,
    pub gid: u32,
}

const OID_BYTES: usize = 20;
const HEADER_BYTES: usize = 12;

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn read_stat(b: &[u8], at: usize) -> EntryStat {
    EntryStat {
        ctime_s: be32(b, at),
        ctime_ns: be32(b, at + 4),
        mtime_s: be32(b, at + 8),
        mtime_ns: be32(b, at + 12),
        dev: be32(b, at + 16),
        ino: be32(b, at + 20),
        mode: be32(b, at + 24),
        uid: be32(b, at + 28),
        gid: be32(b, at + 32),
        size: be32(b, at + 36),
    }
}

fn write_stat(b: &mut [u8], at: usize, s: &EntryStat) {
    for (i, v) in [
        s.ctime_s, s.ctime_ns, s.mtime_s, s.mtime_ns, s.dev, s.ino, s.mode, s.uid, s.gid, s.size,
    ]
    .into_iter()
    .enumerate()
    {
        b[at + i * 4..at + i * 4 + 4].copy_from_slice(&v.to_be_bytes());
    }
}

/// Rewrites the stat data of entries for which `f` returns new values; the trailing
/// checksum is recomputed. `None` when the index is of a kind this does not handle.
pub fn rewrite(
    index: &[u8],
    mut f: impl FnMut(&[u8], &EntryStat) -> Option<EntryStat>,
) -> Option<Vec<u8>> {
    if index.len() < HEADER_BYTES + OID_BYTES || &index[..4] != b"DIRC" {
        return None;
    }
    let version = be32(index, 4);
    if !(2..=4).contains(&version) {
        return None;
    }
    let count = be32(index, 8) as usize;
    let body_end = index.len() - OID_BYTES;
    if sha1_smol::Sha1::from(&index[..body_end]).digest().bytes() != index[body_end..] {
        return None; // not SHA-1 (or damaged): leave it to git
    }
    let mut out = index.to_vec();
    let mut pos = HEADER_BYTES;
    let mut prev: Vec<u8> = Vec::new();
    for _ in 0..count {
        let fixed = 40 + OID_BYTES + 2;
        if pos + fixed > body_end {
            return None;
        }
        let flags = u16::from_be_bytes([index[pos + 60], index[pos + 61]]);
        let mut name_at = pos + fixed;
        if version >= 3 && flags & 0x4000 != 0 {
            name_at += 2;
        }
        let (path, next) = if version == 4 {
            // varint: bytes to strip from the previous path, then a NUL-terminated suffix.
            let mut i = name_at;
            let mut c = *index.get(i)?;
            i += 1;
            let mut strip = u64::from(c & 0x7f);
            while c & 0x80 != 0 {
                c = *index.get(i)?;
                i += 1;
                strip = ((strip + 1) << 7) | u64::from(c & 0x7f);
            }
            let nul = index[i..body_end].iter().position(|&b| b == 0)?;
            let keep = prev.len().checked_sub(strip as usize)?;
            let mut p = prev[..keep].to_vec();
            p.extend_from_slice(&index[i..i + nul]);
            (p, i + nul + 1)
        } else {
            let nul = index[name_at..body_end].iter().position(|&b| b == 0)?;
            let p = index[name_at..name_at + nul].to_vec();
            let len = name_at + nul - pos;
            // 1 to 8 NULs pad the entry to a multiple of 8 bytes.
            (p, pos + (len + 8) / 8 * 8)
        };
        let stage = (flags >> 12) & 0x3;
        if stage == 0
            && let Some(new) = f(&path, &read_stat(index, pos))
        {
            write_stat(&mut out, pos, &new);
        }
        prev = path;
        pos = next;
    }
    // Extensions: a split index ("link") points at another file; leave such indexes be.
    let mut ext = pos;
    while ext + 8 <= body_end {
        if &index[ext..ext + 4] == b"link" {
            return None;
        }
        let len = be32(index, ext + 4) as usize;
        ext += 8 + len;
    }
    let digest = sha1_smol::Sha1::from(&out[..body_end]).digest().bytes();
    out[body_end..].copy_from_slice(&digest);
    Some(out)
}

/// Whether the source file at `path` is what the index entry says git last saw: same
/// stat data, and the entry is not racily clean (older than the index file itself).
pub fn trusted_on_source(path: &Path, e: &EntryStat, index_mtime: (u32, u32)) -> bool {
    let Ok(m) = fs::symlink_metadata(path) else {
        return false;
    };
    let racy = (e.mtime_s, e.mtime_ns) >= index_mtime;
    !racy
        && e.mtime_s == m.mtime() as u32
        && e.mtime_ns == m.mtime_nsec() as u32
        && e.ctime_s == m.ctime() as u32
        && e.ctime_ns == m.ctime_nsec() as u32
        && e.ino == m.ino() as u32
        && e.size == m.size() as u32
        && e.uid == m.uid()
        && e.gid == m.gid()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_what_it_does_not_know() {
        assert!(rewrite(b"not an index at all, definitely not", |_, _| None).is_none());
    }
}
