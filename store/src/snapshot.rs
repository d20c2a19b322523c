//! Snapshots: an immutable root tree plus where it came from.
//!
//! Encoded as JSON with a fixed field order (serde keeps struct order), hashed with a
//! keyed BLAKE3 ([`SnapshotId::of_encoding`]). Decoding re-encodes and compares, so an
//! id always names exactly one byte string.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::id::{SnapshotId, TreeId};

/// Current snapshot encoding version.
pub const SNAPSHOT_VERSION: u32 = 1;

/// Where a snapshot's tree came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Source {
    /// A directory on the host (its absolute path at import time).
    Dir { path: String },
    /// A git revision: the repository, the revision asked for and the commit it resolved to.
    Git {
        repo: String,
        rev: String,
        commit: String,
    },
    /// A tar archive and the BLAKE3 of its bytes as read.
    Tar { path: String, digest: String },
    /// A workspace's changes captured on top of its base.
    Workspace { id: String },
    /// An OCI image (`crate::image`): the reference as given, the digest it resolved to
    /// (an index or a manifest), the platform's manifest digest, and the manifest and
    /// config exactly as fetched (their sha256 is checkable against the digests).
    Image {
        reference: String,
        digest: String,
        manifest_digest: String,
        platform: String,
        manifest: String,
        config: String,
    },
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Dir { path } => write!(f, "directory {path}"),
            Source::Git { repo, rev, .. } => write!(f, "git {repo} {rev}"),
            Source::Tar { path, .. } => write!(f, "tar {path}"),
            Source::Workspace { id } => write!(f, "commit of workspace {id}"),
            Source::Image {
                reference, digest, ..
            } => write!(f, "image {reference} ({digest})"),
        }
    }
}

/// The exclusion policy an import used (recorded so a snapshot explains itself).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Policy {
    /// Whether the default exclusions of heavy regenerable artifacts applied.
    pub default_excludes: bool,
    /// Extra patterns given by the user.
    pub excludes: Vec<String>,
    /// The dirty-state policy, for git checkouts (`refuse`, `patch`, `snapshot`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dirty: Option<String>,
}

/// What a snapshot holds, counted at import.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Counts {
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    /// Sum of the sizes of regular files (hard links counted once).
    pub bytes: u64,
    /// Paths left out by the exclusion policy (directories count once).
    pub excluded: u64,
    /// Further names of hard-linked files (`hardlink` entries).
    pub hardlinks: u64,
}

/// An immutable point: a root tree and its provenance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub version: u32,
    pub root: TreeId,
    /// Permission bits of the root directory.
    pub root_mode: u32,
    pub parents: Vec<SnapshotId>,
    /// Seconds since the Unix epoch (UTC).
    pub created_at: i64,
    pub message: String,
    pub source: Source,
    pub policy: Policy,
    pub counts: Counts,
    /// The fsmonitor token the import gave the tree's `.git/index` (see
    /// [`crate::import::gitindex::with_fsmonitor`]): git's view of the index entries it
    /// marks valid is exactly this snapshot's files. `None` for every other snapshot,
    /// including captures, whose index may describe an earlier tree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_fsmonitor: Option<String>,
    /// The root directory's recorded xattrs (as a tree entry's: `user.*`,
    /// `security.capability`), sorted by name; absent when there are none, so snapshots
    /// without them keep their encoding and id.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub root_xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Snapshot {
    /// The canonical encoding and its id.
    pub fn encode_with_id(&self) -> Result<(SnapshotId, Vec<u8>)> {
        let bytes = serde_json::to_vec(self)
            .map_err(|e| Error::Invalid(format!("a snapshot cannot be encoded: {e}")))?;
        Ok((SnapshotId::of_encoding(&bytes), bytes))
    }

    /// Decodes and checks the encoding is canonical.
    pub fn decode(id: &SnapshotId, bytes: &[u8]) -> Result<Snapshot> {
        let snap: Snapshot = serde_json::from_slice(bytes)
            .map_err(|e| Error::corrupt("snapshot", id, format!("undecodable: {e}")))?;
        if snap.version != SNAPSHOT_VERSION {
            return Err(Error::corrupt(
                "snapshot",
                id,
                format!("unknown version {}", snap.version),
            ));
        }
        if serde_json::to_vec(&snap).ok().as_deref() != Some(bytes) {
            return Err(Error::corrupt("snapshot", id, "encoding is not canonical"));
        }
        Ok(snap)
    }
}

/// Seconds since the epoch, now.
pub fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_canonical() {
        let s = Snapshot {
            version: SNAPSHOT_VERSION,
            root: TreeId::of_encoding(b"x"),
            root_mode: 0o755,
            parents: vec![],
            created_at: 1,
            message: "m".into(),
            source: Source::Dir { path: "/x".into() },
            policy: Policy::default(),
            counts: Counts::default(),
            git_fsmonitor: None,
            root_xattrs: vec![],
        };
        let (id, bytes) = s.encode_with_id().unwrap();
        assert_eq!(Snapshot::decode(&id, &bytes).unwrap(), s);
        let spaced = String::from_utf8(bytes).unwrap().replace(':', ": ");
        assert!(Snapshot::decode(&id, spaced.as_bytes()).is_err());
    }
}
