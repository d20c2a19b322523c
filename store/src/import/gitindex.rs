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

/// The entry whose served stat a symlink's index entry is made to agree with: the tree's
/// symlink entry for `target`.
pub fn served_symlink(name: &[u8], target: &[u8]) -> crate::tree::Entry {
    crate::tree::Entry {
        name: name.to_vec(),
        kind: crate::tree::Kind::Symlink,
        mode: 0o777,
        size: target.len() as u64,
        hash: [0; 32],
        data: target.to_vec(),
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

/// The big-endian u32 at `at` (in bounds: callers check the length first).
fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
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
    f: impl FnMut(&[u8], &EntryStat) -> Option<EntryStat>,
) -> Option<Vec<u8>> {
    rewrite_marking(index, f).map(|r| r.bytes)
}

/// An index rewritten by [`rewrite_marking`].
pub struct Rewritten {
    pub bytes: Vec<u8>,
    /// Per entry, in index order: whether its stat data was rewritten.
    pub rewritten: Vec<bool>,
    /// Where the extensions start (the end of the entries).
    extensions_at: usize,
    /// Where each entry of stage 0 (not a merge conflict) starts.
    stage0_at: Vec<Option<usize>>,
}

impl Rewritten {
    /// Gives every entry of stage 0 that was not rewritten the modification time 0 (and
    /// recomputes the checksum). Its stat data no longer matches any served file, so git
    /// still looks at it, as before; but git no longer takes it for "racily clean" (its
    /// time was newer than the index's, which workspaces serve from 2001), which made git
    /// write the whole index again at the first command in every workspace.
    pub fn unracy_unverified(&mut self) {
        for (i, at) in self.stage0_at.iter().enumerate() {
            if let Some(at) = at
                && !self.rewritten[i]
            {
                self.bytes[at + 8..at + 16].fill(0);
            }
        }
        let body_end = self.bytes.len() - OID_BYTES;
        let digest = sha1_smol::Sha1::from(&self.bytes[..body_end])
            .digest()
            .bytes();
        self.bytes[body_end..].copy_from_slice(&digest);
    }
}

/// [`rewrite`], also saying which entries were rewritten.
pub fn rewrite_marking(
    index: &[u8],
    mut f: impl FnMut(&[u8], &EntryStat) -> Option<EntryStat>,
) -> Option<Rewritten> {
    rewrite_numbered(index, |_, path, e| f(path, e))
}

/// [`rewrite_marking`], telling `f` each entry's position in the index too.
pub fn rewrite_numbered(
    index: &[u8],
    mut f: impl FnMut(usize, &[u8], &EntryStat) -> Option<EntryStat>,
) -> Option<Rewritten> {
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
    let mut rewritten = Vec::with_capacity(count.min(index.len() / 62));
    let mut stage0_at = Vec::with_capacity(rewritten.capacity());
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
        stage0_at.push((stage == 0).then_some(pos));
        let new = if stage == 0 {
            f(rewritten.len(), &path, &read_stat(index, pos))
        } else {
            None
        };
        if let Some(new) = &new {
            write_stat(&mut out, pos, new);
        }
        rewritten.push(new.is_some());
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
    Some(Rewritten {
        bytes: out,
        rewritten,
        extensions_at: pos,
        stage0_at,
    })
}

/// The prefix of the fsmonitor tokens cowspace writes and answers (`mountctl
/// git-fsmonitor`; docs/git.md).
pub const FSMONITOR_TOKEN_PREFIX: &str = "cowspace:1:";

/// The index's extensions in order: (signature, body range).
fn extensions(index: &[u8], at: usize) -> Option<Vec<([u8; 4], std::ops::Range<usize>)>> {
    let body_end = index.len().checked_sub(OID_BYTES)?;
    let mut out = Vec::new();
    let mut ext = at;
    while ext + 8 <= body_end {
        let sig: [u8; 4] = index[ext..ext + 4].try_into().ok()?;
        let len = be32(index, ext + 4) as usize;
        let end = ext.checked_add(8 + len)?;
        if end > body_end {
            return None;
        }
        out.push((sig, ext + 8..end));
        ext = end;
    }
    (ext == body_end).then_some(out)
}

/// An EWAH bitmap (git's `ewah/` serialisation) with the bits `set` of `len`: one
/// run-length word (no run) followed by every word as a literal.
fn ewah(len: usize, set: impl Fn(usize) -> bool) -> Vec<u8> {
    let words = len.div_ceil(64);
    let mut out = Vec::with_capacity(12 + 8 * (words + 1));
    out.extend_from_slice(&(len as u32).to_be_bytes());
    out.extend_from_slice(&(words as u32 + 1).to_be_bytes());
    // Marker word: bit 0 the running bit, 32 bits of run length, then the number of
    // literal words that follow.
    out.extend_from_slice(&((words as u64) << 33).to_be_bytes());
    for w in 0..words {
        let mut word = 0u64;
        for b in 0..64 {
            let i = w * 64 + b;
            if i < len && set(i) {
                word |= 1 << b;
            }
        }
        out.extend_from_slice(&word.to_be_bytes());
    }
    out.extend_from_slice(&0u32.to_be_bytes()); // the marker word's position
    out
}

/// Gives a rewritten index git's fsmonitor extension (version 2) with `token`, every
/// entry rewritten marked valid (git will not look at its file until the fsmonitor hook
/// names it) and every other entry dirty. An fsmonitor extension already there is
/// replaced; an end-of-entries extension, which hashes the extension headers, is
/// written again last.
pub fn with_fsmonitor(r: &Rewritten, token: &str) -> Option<Vec<u8>> {
    if token.is_empty() || token.contains('\0') {
        return None;
    }
    let mut fsmn = Vec::new();
    fsmn.extend_from_slice(&2u32.to_be_bytes());
    fsmn.extend_from_slice(token.as_bytes());
    fsmn.push(0);
    let bitmap = ewah(r.rewritten.len(), |i| !r.rewritten[i]);
    fsmn.extend_from_slice(&(bitmap.len() as u32).to_be_bytes());
    fsmn.extend_from_slice(&bitmap);
    set_fsmonitor(r, Some(&fsmn))
}

/// A rewritten index without an fsmonitor extension (an end-of-entries extension is
/// written again last).
pub fn without_fsmonitor(r: &Rewritten) -> Option<Vec<u8>> {
    set_fsmonitor(r, None)
}

fn set_fsmonitor(r: &Rewritten, fsmn: Option<&[u8]>) -> Option<Vec<u8>> {
    let index = &r.bytes;
    let exts = extensions(index, r.extensions_at)?;
    let mut out = index[..r.extensions_at].to_vec();
    let mut headers = sha1_smol::Sha1::new();
    let mut had_eoie = false;
    let mut push = |out: &mut Vec<u8>, sig: &[u8; 4], body: &[u8]| {
        let len = (body.len() as u32).to_be_bytes();
        headers.update(sig);
        headers.update(&len);
        out.extend_from_slice(sig);
        out.extend_from_slice(&len);
        out.extend_from_slice(body);
    };
    for (sig, range) in &exts {
        match sig {
            b"FSMN" => {}
            b"EOIE" => had_eoie = true,
            _ => push(&mut out, sig, &index[range.clone()]),
        }
    }
    if let Some(fsmn) = fsmn {
        push(&mut out, b"FSMN", fsmn);
    }
    if had_eoie {
        let digest = headers.digest().bytes();
        out.extend_from_slice(b"EOIE");
        out.extend_from_slice(&24u32.to_be_bytes());
        out.extend_from_slice(&(r.extensions_at as u32).to_be_bytes());
        out.extend_from_slice(&digest);
    }
    let digest = sha1_smol::Sha1::from(&out).digest().bytes();
    out.extend_from_slice(&digest);
    Some(out)
}

/// The first line of the `.git/config` lines [`fsmonitor_config`] writes.
const FSMONITOR_CONFIG_MARKER: &str =
    "# cowspace: git asks the workspace what changed (docs/git.md)\n";

/// The `.git/config` lines that make git ask `hook` (a shell command) what changed.
pub fn fsmonitor_config(hook: &str) -> String {
    let quoted = hook.replace('\\', "\\\\").replace('"', "\\\"");
    format!(
        "{FSMONITOR_CONFIG_MARKER}[core]\n\tfsmonitor = \"{quoted}\"\n\tfsmonitorHookVersion = 2\n\tcheckStat = minimal\n"
    )
}

/// `.git/config` text without the lines [`fsmonitor_config`] appended, when it ends with
/// them exactly; `None` otherwise (edited since, or never there).
pub fn strip_fsmonitor_config(text: &str) -> Option<String> {
    let at = text.rfind(FSMONITOR_CONFIG_MARKER)?;
    let tail = &text[at + FSMONITOR_CONFIG_MARKER.len()..];
    // Imports of earlier versions wrote no `checkStat`.
    let body = tail.strip_prefix("[core]\n\tfsmonitor = \"")?;
    let hook = body
        .strip_suffix("\"\n\tfsmonitorHookVersion = 2\n\tcheckStat = minimal\n")
        .or_else(|| body.strip_suffix("\"\n\tfsmonitorHookVersion = 2\n"))?;
    if hook.contains('\n') {
        return None;
    }
    Some(text[..at].to_string())
}

/// The token of the index's fsmonitor extension (version 2), if it has one.
pub fn fsmonitor_token(index: &[u8]) -> Option<String> {
    read_fsmonitor(index).map(|(token, _)| token)
}

/// The index's fsmonitor extension (version 2): its token, and per entry whether it is
/// marked dirty (git looks at its file whatever the hook says).
pub fn read_fsmonitor(index: &[u8]) -> Option<(String, Vec<bool>)> {
    let r = rewrite_marking(index, |_, _| None)?;
    let exts = extensions(&r.bytes, r.extensions_at)?;
    let (_, range) = exts.iter().find(|(sig, _)| sig == b"FSMN")?;
    let body = &r.bytes[range.clone()];
    if body.len() < 5 || be32(body, 0) != 2 {
        return None;
    }
    let nul = body[4..].iter().position(|&b| b == 0)?;
    let token = String::from_utf8(body[4..4 + nul].to_vec()).ok()?;
    let at = 4 + nul + 1;
    let size = be32(body.get(at..at + 4)?, 0) as usize;
    let dirty = ewah_bits(body.get(at + 4..at + 4 + size)?, r.rewritten.len())?;
    Some((token, dirty))
}

/// The bits of an EWAH bitmap (git's `ewah/` serialisation) as `len` flags; `None` when
/// it is malformed or sets a bit at or past `len`.
fn ewah_bits(b: &[u8], len: usize) -> Option<Vec<bool>> {
    let words = be32(b.get(..8)?, 4) as usize;
    let word = |k: usize| -> Option<u64> {
        Some(u64::from_be_bytes(
            b.get(8 + 8 * k..16 + 8 * k)?.try_into().ok()?,
        ))
    };
    let mut out = vec![false; len];
    let mut set = |bit: usize| -> Option<()> {
        *out.get_mut(bit)? = true;
        Some(())
    };
    let (mut k, mut pos) = (0usize, 0usize);
    while k < words {
        let marker = word(k)?;
        k += 1;
        let run = ((marker >> 1) & 0xffff_ffff) as usize;
        let literals = (marker >> 33) as usize;
        if marker & 1 == 1 {
            for bit in pos..pos.checked_add(run.checked_mul(64)?)? {
                if bit < len {
                    set(bit)?;
                }
            }
        }
        pos = pos.checked_add(run.checked_mul(64)?)?;
        for _ in 0..literals {
            let w = word(k)?;
            k += 1;
            for i in 0..64 {
                if w >> i & 1 == 1 {
                    set(pos + i)?;
                }
            }
            pos += 64;
        }
    }
    Some(out)
}

/// A token no other index has: `kind` (`import`, `capture`), `seed` (a path, an id),
/// the time and this process.
pub fn new_fsmonitor_token(kind: &str, seed: &[u8]) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let mut h = blake3::Hasher::new();
    h.update(seed);
    h.update(&now.as_nanos().to_le_bytes());
    h.update(&std::process::id().to_le_bytes());
    let hex = h.finalize().to_hex();
    format!("{FSMONITOR_TOKEN_PREFIX}{kind}:{}", &hex[..32])
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

    /// A version 2 index of one entry `a` with the given extensions (signature, body).
    fn index_with(exts: &[(&[u8; 4], Vec<u8>)]) -> Vec<u8> {
        let mut b = b"DIRC".to_vec();
        b.extend_from_slice(&2u32.to_be_bytes());
        b.extend_from_slice(&1u32.to_be_bytes());
        b.extend_from_slice(&[0; 40]); // stat data
        b.extend_from_slice(&[7; OID_BYTES]);
        b.extend_from_slice(&1u16.to_be_bytes()); // flags: name length 1
        b.push(b'a');
        while !(b.len() - HEADER_BYTES).is_multiple_of(8) || b.last() != Some(&0) {
            b.push(0);
        }
        for (sig, body) in exts {
            b.extend_from_slice(*sig);
            b.extend_from_slice(&(body.len() as u32).to_be_bytes());
            b.extend_from_slice(body);
        }
        let digest = sha1_smol::Sha1::from(&b).digest().bytes();
        b.extend_from_slice(&digest);
        b
    }

    #[test]
    fn fsmonitor_extension_replaces_the_old_one_and_eoie_is_written_again_last() {
        let eoie = vec![0; 24];
        let old = index_with(&[
            (b"TREE", b"tree-body".to_vec()),
            (b"FSMN", b"old".to_vec()),
            (b"EOIE", eoie),
        ]);
        let r = rewrite_marking(&old, |_, e| Some(*e)).unwrap();
        assert_eq!(r.rewritten, vec![true]);
        let new = with_fsmonitor(&r, "cowspace:1:import:t").unwrap();
        assert_eq!(
            fsmonitor_token(&new).as_deref(),
            Some("cowspace:1:import:t")
        );
        let body_end = new.len() - OID_BYTES;
        assert_eq!(
            sha1_smol::Sha1::from(&new[..body_end]).digest().bytes(),
            new[body_end..]
        );
        let exts = extensions(&new, r.extensions_at).unwrap();
        let sigs: Vec<&[u8; 4]> = exts.iter().map(|(s, _)| s).collect();
        assert_eq!(sigs, [b"TREE", b"FSMN", b"EOIE"]);
        // EOIE: where the extensions start, and the hash of the headers before it.
        let body = &new[exts[2].1.clone()];
        assert_eq!(be32(body, 0) as usize, r.extensions_at);
        let mut h = sha1_smol::Sha1::new();
        for (sig, range) in &exts[..2] {
            h.update(sig);
            h.update(&(range.len() as u32).to_be_bytes());
        }
        assert_eq!(&body[4..], h.digest().bytes());
    }

    #[test]
    fn the_config_lines_come_off_only_as_written() {
        let user = "[core]\n\tbare = false\n";
        let with = format!(
            "{user}{}",
            fsmonitor_config("'/x y/mountctl' git-fsmonitor")
        );
        assert_eq!(strip_fsmonitor_config(&with).as_deref(), Some(user));
        assert_eq!(strip_fsmonitor_config(user), None);
        let edited = format!("{with}[user]\n\tname = a\n");
        assert_eq!(strip_fsmonitor_config(&edited), None);
        assert!(with.ends_with("\tcheckStat = minimal\n"), "{with}");
        // What imports of earlier versions appended (no checkStat) comes off too.
        let earlier = with.replace("\tcheckStat = minimal\n", "");
        assert_eq!(strip_fsmonitor_config(&earlier).as_deref(), Some(user));
    }

    #[test]
    fn entries_not_rewritten_get_time_zero() {
        let mut old = index_with(&[]);
        old[HEADER_BYTES + 8..HEADER_BYTES + 16].copy_from_slice(&[9; 8]);
        let body_end = old.len() - OID_BYTES;
        let digest = sha1_smol::Sha1::from(&old[..body_end]).digest().bytes();
        old[body_end..].copy_from_slice(&digest);
        let mut r = rewrite_marking(&old, |_, _| None).unwrap();
        r.unracy_unverified();
        let e = read_stat(&r.bytes, HEADER_BYTES);
        assert_eq!((e.mtime_s, e.mtime_ns), (0, 0));
        // Still a valid index (checksum), and a rewritten entry keeps its new time.
        assert!(rewrite(&r.bytes, |_, _| None).is_some());
        let mut r = rewrite_marking(&old, |_, e| Some(*e)).unwrap();
        r.unracy_unverified();
        assert_eq!(read_stat(&r.bytes, HEADER_BYTES).mtime_s, 0x0909_0909);
    }

    #[test]
    fn without_fsmonitor_drops_the_extension() {
        let old = index_with(&[(b"TREE", b"t".to_vec()), (b"FSMN", b"old".to_vec())]);
        let r = rewrite_marking(&old, |_, _| None).unwrap();
        let new = without_fsmonitor(&r).unwrap();
        assert_eq!(fsmonitor_token(&new), None);
        let exts = extensions(&new, r.extensions_at).unwrap();
        assert_eq!(exts.len(), 1);
        assert_eq!(&exts[0].0, b"TREE");
    }

    #[test]
    fn the_bitmap_reads_back() {
        let bits = ewah(130, |i| i % 7 == 0 || i == 129);
        let back = ewah_bits(&bits, 130).unwrap();
        assert_eq!(
            back,
            (0..130).map(|i| i % 7 == 0 || i == 129).collect::<Vec<_>>()
        );
        // A bit past the entries is refused; so is a truncated bitmap.
        assert!(ewah_bits(&bits, 129).is_none());
        assert!(ewah_bits(&bits[..bits.len() - 8], 130).is_none());
        // git's own runs: a marker with the running bit set covers whole words.
        let mut run = Vec::new();
        run.extend_from_slice(&128u32.to_be_bytes());
        run.extend_from_slice(&1u32.to_be_bytes());
        run.extend_from_slice(&((2u64 << 1) | 1).to_be_bytes());
        run.extend_from_slice(&0u32.to_be_bytes());
        assert_eq!(ewah_bits(&run, 128).unwrap(), vec![true; 128]);
    }

    #[test]
    fn the_dirty_bitmap_marks_entries_not_rewritten() {
        // 70 entries: a bitmap of two literal words.
        let bits = ewah(70, |i| i == 3 || i == 69);
        assert_eq!(be32(&bits, 0), 70);
        assert_eq!(be32(&bits, 4), 3);
        let word = |k: usize| u64::from_be_bytes(bits[8 + 8 * k..16 + 8 * k].try_into().unwrap());
        assert_eq!(word(0), 2 << 33, "marker: no run, two literal words");
        assert_eq!(word(1), 1 << 3);
        assert_eq!(word(2), 1 << 5);
        assert_eq!(be32(&bits, 32), 0);
    }

    #[test]
    fn rejects_what_it_does_not_know() {
        assert!(rewrite(b"not an index at all, definitely not", |_, _| None).is_none());
    }
}
