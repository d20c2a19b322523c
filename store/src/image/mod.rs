//! OCI images as snapshots: an image's layers applied in order into one tree.
//!
//! An [`ImageSource`] hands out the image's manifests and blobs (an OCI layout
//! directory or archive, a `docker save` archive: [`layout`]; a registry: the runtime's
//! client). [`Store::import_image`] resolves the reference (an index to the manifest of
//! the platform asked for), checks every blob against its sha256 digest and declared
//! size while it streams, applies the layers with their whiteouts onto one tree
//! ([`layer`]), checks each layer's uncompressed digest against the config's `diff_ids`,
//! and stores the tree as a snapshot whose [`Source::Image`] records the image digest,
//! the manifest and the config, byte for byte. Any failure stores nothing: the ingest
//! session is dropped unfinished and no ref moves.
//!
//! Differences from a tar import, on purpose: symlinks may point anywhere (an image is a
//! root filesystem, its absolute links resolve inside the root it becomes), device nodes
//! are left out with a warning (the sandbox has its own `/dev`, and the root is mounted
//! `nodev`), set-uid bits are kept (the root is mounted `nosuid`), nothing is excluded.

pub mod info;
pub(crate) mod layer;
pub mod layout;
mod reuse;
pub mod verify;

use std::io::Read;
use std::path::Path;
use std::time::Instant;

use oci_spec::image::{ImageConfiguration, ImageIndex, ImageManifest};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::import::builder::Builder;
use crate::import::exclude::Excluder;
use crate::import::tar::{PathFilter, TarImport};
use crate::import::{Finish, ImportOptions, ImportReport, ProgressFn};
use crate::ingest::Ingest;
use crate::lock::StoreLock;
use crate::snapshot::{Policy, Source};
use crate::store::Store;
use verify::{Verdict, Verified, check_bytes, check_digest};

/// Largest manifest or index accepted (the distribution registry's own limit).
pub const MAX_MANIFEST_BYTES: u64 = 4 << 20;
/// Largest image config accepted.
pub const MAX_CONFIG_BYTES: u64 = 8 << 20;
/// Largest layer blob accepted (compressed, as declared).
pub const MAX_LAYER_BYTES: u64 = 64 << 30;
/// Most layers an image may have.
pub const MAX_LAYERS: usize = 500;
/// How many indexes may lead to the manifest (an index naming an index).
const MAX_INDEX_DEPTH: usize = 3;

/// Media types of manifests and indexes (OCI, and Docker's schema 2 equivalents).
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
/// What a registry is asked for, in order of preference.
pub const ACCEPTED_MANIFESTS: [&str; 4] = [OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST];

/// Config media types accepted (an artifact's manifest names something else).
const CONFIG_TYPES: [&str; 2] = [
    "application/vnd.oci.image.config.v1+json",
    "application/vnd.docker.container.image.v1+json",
];

/// A blob as a manifest names it: checked digest and declared size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blob {
    pub media_type: String,
    pub digest: String,
    pub size: u64,
}

impl Blob {
    fn of(d: &oci_spec::image::Descriptor, limit: u64, what: &str) -> Result<Blob> {
        let digest = d.digest().to_string();
        check_digest(&digest)?;
        if d.size() > limit {
            return Err(Error::Invalid(format!(
                "{what} {digest} declares {} bytes, more than the {limit} accepted",
                d.size()
            )));
        }
        if d.urls().as_ref().is_some_and(|u| !u.is_empty()) {
            return Err(Error::Unsupported(format!(
                "{what} {digest} is a foreign blob (fetched from URLs outside the image); \
                 such images are not supported"
            )));
        }
        Ok(Blob {
            media_type: d.media_type().to_string(),
            digest,
            size: d.size(),
        })
    }
}

/// The platform an image is chosen for: `os/architecture[/variant]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Platform {
    pub os: String,
    pub architecture: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

impl Platform {
    /// This host's, in the Go names images use.
    pub fn host() -> Platform {
        let architecture = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            "x86" => "386",
            "powerpc64" => "ppc64le",
            a => a,
        };
        Platform {
            os: "linux".into(),
            architecture: architecture.into(),
            variant: None,
        }
    }

    /// Parses `os/arch` or `os/arch/variant`.
    pub fn parse(s: &str) -> Result<Platform> {
        let parts: Vec<&str> = s.split('/').collect();
        let ok =
            |p: &&str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        match parts.as_slice() {
            [os, arch] if ok(os) && ok(arch) => Ok(Platform {
                os: os.to_string(),
                architecture: arch.to_string(),
                variant: None,
            }),
            [os, arch, v] if ok(os) && ok(arch) && ok(v) => Ok(Platform {
                os: os.to_string(),
                architecture: arch.to_string(),
                variant: Some(v.to_string()),
            }),
            _ => Err(Error::Invalid(format!(
                "platform {s:?} is not OS/ARCH or OS/ARCH/VARIANT (for example linux/amd64)"
            ))),
        }
    }

    fn matches(&self, os: &str, arch: &str, variant: Option<&str>) -> bool {
        self.os == os
            && self.architecture == arch
            && (self.variant.is_none() || self.variant.as_deref() == variant)
    }
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

/// What a source's reference names first.
#[derive(Debug)]
pub enum Top {
    /// A manifest or index by descriptor (an OCI layout's `index.json` entry).
    Named(Blob),
    /// A manifest or index fetched by tag or digest (a registry), with the media type
    /// the source gave and, for a reference by digest, the digest it must have.
    Fetched {
        bytes: Vec<u8>,
        media_type: Option<String>,
        expected: Option<String>,
    },
}

/// Where an image's manifests and blobs come from. Implementations need not check
/// digests: the import checks every byte they return.
pub trait ImageSource {
    /// The source as messages name it (`OCI layout /x`, `127.0.0.1:5000/busybox:1`).
    fn describe(&self) -> String;
    /// What the reference names (a manifest or an index).
    fn top(&mut self) -> Result<Top>;
    /// A manifest or index named by an index (a registry serves these apart from blobs).
    fn manifest(&mut self, blob: &Blob) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        let what = self.describe();
        self.blob(blob)?
            .take(blob.size + 1)
            .read_to_end(&mut out)
            .map_err(Error::io("read manifest", what))?;
        Ok(out)
    }
    /// The blob's bytes, streamed. A missing blob is [`Error::NotFound`].
    fn blob(&mut self, blob: &Blob) -> Result<Box<dyn Read + '_>>;
}

/// How to import an image.
#[derive(Clone, Default)]
pub struct ImageOptions {
    /// Move this ref to the image's snapshot (compare-and-swap, like an import's).
    pub ref_name: Option<String>,
    pub message: String,
    /// The platform to pick from an index (default: the host's).
    pub platform: Option<Platform>,
    /// The reference as the user gave it (recorded).
    pub reference: String,
    pub progress: Option<ProgressFn>,
}

/// One layer as imported.
#[derive(Debug, Clone, Serialize)]
pub struct LayerReport {
    pub digest: String,
    pub size: u64,
    pub diff_id: String,
    /// Not fetched: an image in the store holds it (see [`ImageReport::reused_from`]).
    pub reused: bool,
}

/// What an image import made.
#[derive(Debug, Clone, Serialize)]
pub struct ImageReport {
    #[serde(flatten)]
    pub import: ImportReport,
    /// The digest of what the reference named (an index, or the manifest).
    pub digest: String,
    /// The digest of the platform's manifest.
    pub manifest_digest: String,
    pub platform: String,
    pub layers: Vec<LayerReport>,
    /// The image in the store whose layers begin this one's: its tree was the start,
    /// and those layers were not fetched.
    pub reused_from: Option<crate::id::SnapshotId>,
}

/// The kind of a manifest-like document, from its media type or its fields.
#[derive(Debug, PartialEq, Eq)]
enum DocKind {
    Index,
    Manifest,
}

fn doc_kind(bytes: &[u8], given: Option<&str>, what: &str) -> Result<DocKind> {
    let v: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| Error::Invalid(format!("{what} is not JSON: {e}")))?;
    let field = v.get("mediaType").and_then(|m| m.as_str());
    let media = field.or(given.filter(|g| !g.is_empty() && *g != "application/json"));
    match media {
        Some(OCI_INDEX | DOCKER_LIST) => Ok(DocKind::Index),
        Some(OCI_MANIFEST | DOCKER_MANIFEST) => Ok(DocKind::Manifest),
        Some(m) if m.contains("v1+prettyjws") || m.ends_with("manifest.v1+json") => {
            Err(Error::Unsupported(format!(
                "{what} is a Docker schema 1 manifest ({m}), which is not supported; \
                 re-push the image with a current tool"
            )))
        }
        None if v.get("manifests").is_some() => Ok(DocKind::Index),
        None if v.get("layers").is_some() => Ok(DocKind::Manifest),
        other => Err(Error::Invalid(format!(
            "{what} is neither an image manifest nor an index (media type {})",
            other.unwrap_or("absent")
        ))),
    }
}

/// The resolved image: its manifest, config and where they came from.
struct Resolved {
    digest: String,
    manifest_digest: String,
    manifest_bytes: Vec<u8>,
    manifest: ImageManifest,
}

fn resolve(source: &mut dyn ImageSource, platform: &Platform) -> Result<Resolved> {
    let name = source.describe();
    let (mut bytes, mut given, digest) = match source.top()? {
        Top::Named(blob) => {
            if blob.size > MAX_MANIFEST_BYTES {
                return Err(Error::Invalid(format!(
                    "{name}: manifest {} declares {} bytes, more than the {MAX_MANIFEST_BYTES} accepted",
                    blob.digest, blob.size
                )));
            }
            let bytes = source.manifest(&blob)?;
            check_bytes("the manifest", &bytes, &blob.digest, blob.size)?;
            (bytes, Some(blob.media_type), blob.digest)
        }
        Top::Fetched {
            bytes,
            media_type,
            expected,
        } => {
            let found = verify::sha256_of(&bytes);
            if let Some(e) = expected
                && e != found
            {
                return Err(Error::corrupt(
                    "image manifest",
                    e,
                    format!("{name} served a manifest hashing to {found}"),
                ));
            }
            (bytes, media_type, found)
        }
    };
    let mut manifest_digest = digest.clone();
    for _ in 0..MAX_INDEX_DEPTH {
        let what = format!("{name}: {manifest_digest}");
        match doc_kind(&bytes, given.as_deref(), &what)? {
            DocKind::Manifest => {
                let manifest: ImageManifest = serde_json::from_slice(&bytes).map_err(|e| {
                    Error::Invalid(format!("{what} is not a valid image manifest: {e}"))
                })?;
                return Ok(Resolved {
                    digest,
                    manifest_digest,
                    manifest_bytes: bytes,
                    manifest,
                });
            }
            DocKind::Index => {
                let index: ImageIndex = serde_json::from_slice(&bytes).map_err(|e| {
                    Error::Invalid(format!("{what} is not a valid image index: {e}"))
                })?;
                let mut offered = Vec::new();
                let mut chosen = None;
                for m in index.manifests() {
                    let Some(p) = m.platform() else { continue };
                    let (os, arch) = (p.os().to_string(), p.architecture().to_string());
                    if chosen.is_none() && platform.matches(&os, &arch, p.variant().as_deref()) {
                        chosen = Some(m.clone());
                    }
                    let mut s = format!("{os}/{arch}");
                    if let Some(v) = p.variant() {
                        s = format!("{s}/{v}");
                    }
                    offered.push(s);
                }
                let Some(desc) = chosen else {
                    return Err(Error::not_found(
                        "image for this platform",
                        format!(
                            "{platform} in {what} (it offers {}); choose one with --platform",
                            if offered.is_empty() {
                                "none".into()
                            } else {
                                offered.join(", ")
                            }
                        ),
                    ));
                };
                let blob = Blob::of(&desc, MAX_MANIFEST_BYTES, "manifest")?;
                bytes = source.manifest(&blob)?;
                check_bytes("the manifest", &bytes, &blob.digest, blob.size)?;
                given = Some(blob.media_type);
                manifest_digest = blob.digest;
            }
        }
    }
    Err(Error::Invalid(format!(
        "{name}: more than {MAX_INDEX_DEPTH} indexes lead to a manifest"
    )))
}

/// Reads a small blob (the config) whole, checked.
fn read_small(source: &mut dyn ImageSource, blob: &Blob, what: &str) -> Result<Vec<u8>> {
    let verdict = Verdict::default();
    let mut out = Vec::new();
    let r = Verified::new(
        source.blob(blob)?,
        &blob.digest,
        blob.size,
        what.into(),
        verdict.clone(),
    )
    .read_to_end(&mut out);
    if let Some(e) = verdict.borrow_mut().take() {
        return Err(e);
    }
    r.map_err(Error::io("read", what.to_string()))?;
    Ok(out)
}

impl Store {
    /// Imports the image `source` names as a snapshot (see the module docs).
    pub fn import_image(
        &self,
        source: &mut dyn ImageSource,
        opts: &ImageOptions,
    ) -> Result<ImageReport> {
        let started = Instant::now();
        if let Some(name) = &opts.ref_name {
            crate::refs::check_ref_name(name)?;
        }
        let name = source.describe();
        let platform = opts.platform.clone().unwrap_or_else(Platform::host);
        let resolved = resolve(source, &platform)?;
        let manifest = &resolved.manifest;
        let config_blob = Blob::of(manifest.config(), MAX_CONFIG_BYTES, "config")?;
        if !CONFIG_TYPES.contains(&config_blob.media_type.as_str()) {
            return Err(Error::Unsupported(format!(
                "{name}: the manifest's config is {}, not an image config: this is not a \
                 container image",
                config_blob.media_type
            )));
        }
        let layers = manifest
            .layers()
            .iter()
            .map(|d| Blob::of(d, MAX_LAYER_BYTES, "layer"))
            .collect::<Result<Vec<_>>>()?;
        if layers.len() > MAX_LAYERS {
            return Err(Error::Invalid(format!(
                "{name}: {} layers, more than the {MAX_LAYERS} accepted",
                layers.len()
            )));
        }
        let config_bytes = read_small(source, &config_blob, "the image config")?;
        let config = ImageConfiguration::from_reader(config_bytes.as_slice()).map_err(|e| {
            Error::Invalid(format!(
                "{name}: the image config {} is not a valid image configuration (JSON): {e}",
                config_blob.digest
            ))
        })?;
        let (os, arch) = (config.os().to_string(), config.architecture().to_string());
        if !platform.matches(&os, &arch, config.variant().as_deref()) {
            return Err(Error::Unsupported(format!(
                "{name} is an image for {os}/{arch}, not {platform}; pass --platform {os}/{arch} \
                 to import it anyway"
            )));
        }
        let diff_ids = config.rootfs().diff_ids();
        if diff_ids.len() != layers.len() {
            return Err(Error::Invalid(format!(
                "{name}: the manifest has {} layers, the config's rootfs.diff_ids {}",
                layers.len(),
                diff_ids.len()
            )));
        }
        let manifest_text = String::from_utf8(resolved.manifest_bytes.clone())
            .map_err(|_| Error::Invalid(format!("{name}: the manifest is not UTF-8")))?;
        let config_text = String::from_utf8(config_bytes)
            .map_err(|_| Error::Invalid(format!("{name}: the image config is not UTF-8")))?;

        let import_opts = ImportOptions {
            ref_name: opts.ref_name.clone(),
            message: opts.message.clone(),
            default_excludes: false,
            allow_external_symlinks: true,
            progress: opts.progress.clone(),
            ..Default::default()
        };
        let excluder = Excluder::new(false, &[])?;
        let _lock = StoreLock::shared(self)?;
        let resumed = self.adopt_orphans()?;
        // Dropped unfinished on any error below: the session's packs are removed.
        let mut ingest = Ingest::start(self)?;
        let layer_names: Vec<String> = layers
            .iter()
            .map(|l| format!("layer {}", l.digest))
            .collect();
        let mut state = TarImport {
            archive: Path::new(""),
            archive_name: String::new(),
            opts: &import_opts,
            builder: Builder::new(0o755),
            next_group: 0,
            symlinks: 0,
            files: 0,
            bytes: 0,
            warnings: Vec::new(),
            drop_devices: true,
        };
        let mut filter = PathFilter::new(&excluder);
        let mut reports = Vec::with_capacity(layers.len());
        let prefix = reuse::stored_prefix(self, diff_ids)?;
        if let Some(p) = &prefix {
            reuse::seed(self, &mut state, p)?;
        }
        let skip = prefix.as_ref().map_or(0, |p| p.layers);
        for (i, ((layer, diff_id), lname)) in
            layers.iter().zip(diff_ids).zip(&layer_names).enumerate()
        {
            if !layer.media_type.contains(".layer.") && !layer.media_type.contains(".rootfs.diff.")
            {
                return Err(Error::Unsupported(format!(
                    "{name}: layer {} has media type {}, not a tar layer",
                    layer.digest, layer.media_type
                )));
            }
            if layer.media_type.contains("encrypted") {
                return Err(Error::Unsupported(format!(
                    "{name}: layer {} is encrypted ({}); encrypted images are not supported",
                    layer.digest, layer.media_type
                )));
            }
            if i < skip {
                reports.push(LayerReport {
                    digest: layer.digest.clone(),
                    size: layer.size,
                    diff_id: diff_id.clone(),
                    reused: true,
                });
                continue;
            }
            state.archive = Path::new(lname.as_str());
            state.archive_name = format!("{lname} of {name}");
            let verdict = Verdict::default();
            let raw = Verified::new(
                source.blob(layer)?,
                &layer.digest,
                layer.size,
                lname.clone(),
                verdict.clone(),
            );
            let applied = layer::apply(&mut state, raw, &mut filter, &mut ingest);
            if let Some(e) = verdict.borrow_mut().take() {
                return Err(e);
            }
            if applied.is_err() {
                // The layer failed before its end, so its digest was never checked: a
                // blob that is not the one named (a flipped byte breaks the gzip stream
                // first) is reported as that, not as a damaged archive.
                let verdict = Verdict::default();
                let mut again = Verified::new(
                    source.blob(layer)?,
                    &layer.digest,
                    layer.size,
                    lname.clone(),
                    verdict.clone(),
                );
                let _ = std::io::copy(&mut again, &mut std::io::sink());
                if let Some(e) = verdict.borrow_mut().take() {
                    return Err(e);
                }
            }
            let found = applied?;
            if &found != diff_id {
                return Err(Error::corrupt(
                    "image layer",
                    &layer.digest,
                    format!(
                        "{name}: its uncompressed tar hashes to {found}, the config's diff_id says {diff_id}"
                    ),
                ));
            }
            reports.push(LayerReport {
                digest: layer.digest.clone(),
                size: layer.size,
                diff_id: found,
                reused: false,
            });
        }
        let finish = Finish {
            builder: state.builder,
            slots: Vec::new(),
            source: Source::Image {
                reference: opts.reference.clone(),
                digest: resolved.digest.clone(),
                manifest_digest: resolved.manifest_digest.clone(),
                platform: format!("{os}/{arch}"),
                manifest: manifest_text,
                config: config_text,
            },
            policy: Policy::default(),
            excluded: 0,
            files_read: state.files,
            warnings: state.warnings,
            started,
            opts: &import_opts,
            git_fsmonitor: None,
            resumed,
        };
        let report = finish.run(self, ingest, |_| Ok(()))?;
        Ok(ImageReport {
            import: report,
            digest: resolved.digest,
            manifest_digest: resolved.manifest_digest,
            platform: format!("{os}/{arch}"),
            layers: reports,
            reused_from: prefix.map(|p| p.snapshot),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn platforms() {
        assert_eq!(
            Platform::parse("linux/arm64/v8").unwrap().to_string(),
            "linux/arm64/v8"
        );
        assert!(Platform::parse("linux").is_err());
        assert!(Platform::parse("linux/../x").is_err());
        let p = Platform::parse("linux/arm64").unwrap();
        assert!(p.matches("linux", "arm64", Some("v8")));
        assert!(!p.matches("linux", "amd64", None));
    }

    #[test]
    fn document_kinds() {
        assert_eq!(
            doc_kind(br#"{"manifests":[]}"#, None, "x").unwrap(),
            DocKind::Index
        );
        assert_eq!(
            doc_kind(b"{}", Some(OCI_MANIFEST), "x").unwrap(),
            DocKind::Manifest
        );
        assert!(doc_kind(b"not json", None, "x").is_err());
        assert_eq!(
            doc_kind(
                br#"{"mediaType":"application/vnd.docker.distribution.manifest.v1+prettyjws"}"#,
                None,
                "x"
            )
            .unwrap_err()
            .kind(),
            crate::ErrorKind::Unsupported
        );
    }
}
