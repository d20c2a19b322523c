//! The kinds a workspace record names (its materializer and its lower): a leaf, so the
//! registry and the native lower need not import the materializers.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The materializers cowspace knows (recorded by name: `overlay`, `fuse`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MaterializerKind {
    Overlay,
    Fuse,
    Btrfs,
    Reflink,
    Copy,
}

impl MaterializerKind {
    pub const ALL: [MaterializerKind; 5] = [
        MaterializerKind::Overlay,
        MaterializerKind::Fuse,
        MaterializerKind::Btrfs,
        MaterializerKind::Reflink,
        MaterializerKind::Copy,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            MaterializerKind::Overlay => "overlay",
            MaterializerKind::Fuse => "fuse",
            MaterializerKind::Btrfs => "btrfs",
            MaterializerKind::Reflink => "reflink",
            MaterializerKind::Copy => "copy",
        }
    }

    pub fn parse(s: &str) -> Result<MaterializerKind> {
        MaterializerKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "unknown materializer {s:?}; choose auto, overlay, fuse, btrfs, reflink or copy"
                ))
            })
    }
}

impl std::str::FromStr for MaterializerKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<MaterializerKind> {
        MaterializerKind::parse(s)
    }
}

impl std::fmt::Display for MaterializerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a workspace is made from (its record's `lower_kind`, recorded by name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LowerKind {
    /// An overlay over the snapshot's metadata image and the blob cache
    /// ([`crate::native`]).
    Native,
    /// An overlay over the daemon's read-only snapshot view.
    View,
    /// A directory of hard links into the blob cache: overlay's, and what `reflink` and
    /// `copy` copy.
    Checkout,
    /// The read-only btrfs subvolume `btrfs` snapshots.
    Subvolume,
    /// The store itself, read by the daemon (`fuse`).
    Store,
}

impl LowerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            LowerKind::Native => "native",
            LowerKind::View => "view",
            LowerKind::Checkout => "checkout",
            LowerKind::Subvolume => "subvolume",
            LowerKind::Store => "store",
        }
    }
}

impl std::fmt::Display for LowerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
