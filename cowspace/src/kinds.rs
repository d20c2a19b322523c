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
    /// The fuse materializer's workspace served by the daemon over NFSv3 on 127.0.0.1
    /// and mounted by the kernel's NFS client.
    Nfs,
}

impl MaterializerKind {
    pub const ALL: [MaterializerKind; 6] = [
        MaterializerKind::Overlay,
        MaterializerKind::Fuse,
        MaterializerKind::Btrfs,
        MaterializerKind::Reflink,
        MaterializerKind::Copy,
        MaterializerKind::Nfs,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            MaterializerKind::Overlay => "overlay",
            MaterializerKind::Fuse => "fuse",
            MaterializerKind::Btrfs => "btrfs",
            MaterializerKind::Reflink => "reflink",
            MaterializerKind::Copy => "copy",
            MaterializerKind::Nfs => "nfs",
        }
    }

    pub fn parse(s: &str) -> Result<MaterializerKind> {
        MaterializerKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "unknown materializer {s:?}; choose auto, overlay, fuse, btrfs, reflink, copy or nfs"
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

impl LowerKind {
    /// A lower a create may ask for by name (`native`, `view`, `checkout`); the others
    /// are chosen by their materializers.
    pub fn parse_asked(s: &str) -> Result<LowerKind> {
        match s {
            "native" => Ok(LowerKind::Native),
            "view" => Ok(LowerKind::View),
            "checkout" => Ok(LowerKind::Checkout),
            other => Err(Error::Invalid(format!(
                "lower {other:?}: choose auto, native, view or checkout"
            ))),
        }
    }
}

/// A choice a create may leave to cowspace (`auto`) or make (`overlay`, `native`, ...):
/// parsed once where the words arrive, matched everywhere else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Choice<T> {
    #[default]
    Auto,
    Exactly(T),
}

impl<T: Copy> Choice<T> {
    /// The choice made, if any.
    pub fn exactly(self) -> Option<T> {
        match self {
            Choice::Auto => None,
            Choice::Exactly(t) => Some(t),
        }
    }
}

impl std::str::FromStr for Choice<MaterializerKind> {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(Choice::Auto),
            other => MaterializerKind::parse(other).map(Choice::Exactly),
        }
    }
}

impl std::str::FromStr for Choice<LowerKind> {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(Choice::Auto),
            other => LowerKind::parse_asked(other).map(Choice::Exactly),
        }
    }
}

impl std::fmt::Display for Choice<MaterializerKind> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Choice::Auto => f.write_str("auto"),
            Choice::Exactly(k) => f.write_str(k.as_str()),
        }
    }
}

impl std::fmt::Display for Choice<LowerKind> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Choice::Auto => f.write_str("auto"),
            Choice::Exactly(k) => f.write_str(k.as_str()),
        }
    }
}

/// The same words on the wire as before the choice was typed: `"auto"`, `"overlay"`, ...
impl<T> Serialize for Choice<T>
where
    Choice<T>: std::fmt::Display,
{
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de, T> Deserialize<'de> for Choice<T>
where
    Choice<T>: std::str::FromStr<Err = Error>,
{
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse()
            .map_err(|e: Error| serde::de::Error::custom(e.to_string()))
    }
}

/// The lower a materializer chose for a create ([`crate::materializer::Materializer::lower`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LowerPlan {
    pub kind: LowerKind,
    /// What the record's `lower` names: a view directory, a metadata image, a checkout,
    /// a subvolume or the store.
    pub path: std::path::PathBuf,
    /// The workspace gets the view now and the daemon builds the native lower for the
    /// next creates (a large snapshot's first overlay workspace).
    pub native_later: bool,
}

impl LowerPlan {
    pub fn new(kind: LowerKind, path: std::path::PathBuf) -> LowerPlan {
        LowerPlan {
            kind,
            path,
            native_later: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_materializers_are_listed_in_declaration_order() {
        for (i, k) in MaterializerKind::ALL.into_iter().enumerate() {
            assert_eq!(k as usize, i, "{k}");
        }
    }

    #[test]
    fn choices_keep_their_words_on_the_wire() {
        let c: Choice<MaterializerKind> = serde_json::from_str("\"fuse\"").unwrap();
        assert_eq!(c, Choice::Exactly(MaterializerKind::Fuse));
        assert_eq!(serde_json::to_string(&c).unwrap(), "\"fuse\"");
        let a: Choice<LowerKind> = serde_json::from_str("\"auto\"").unwrap();
        assert_eq!(a, Choice::Auto);
        assert_eq!(serde_json::to_string(&a).unwrap(), "\"auto\"");
        let e = serde_json::from_str::<Choice<LowerKind>>("\"subvolume\"").unwrap_err();
        assert!(
            e.to_string()
                .contains("choose auto, native, view or checkout"),
            "{e}"
        );
        let e = serde_json::from_str::<Choice<MaterializerKind>>("\"zfs\"").unwrap_err();
        assert!(e.to_string().contains("unknown materializer"), "{e}");
    }
}
