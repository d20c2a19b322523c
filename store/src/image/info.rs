//! What an image snapshot records, read back: digest, platform, layers and the parts of
//! its config a sandbox uses (`Env`, `WorkingDir`, `User`) or a user looks at.

use oci_spec::image::{ImageConfiguration, ImageManifest};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::image::Blob;
use crate::snapshot::{Snapshot, Source};

/// An image's recorded metadata.
#[derive(Debug, Clone, Serialize)]
pub struct ImageInfo {
    pub reference: String,
    pub digest: String,
    pub manifest_digest: String,
    pub platform: String,
    /// Sum of the layers' compressed sizes.
    pub size: u64,
    pub layers: Vec<Blob>,
    pub env: Vec<String>,
    pub working_dir: Option<String>,
    pub user: Option<String>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub exposed_ports: Vec<String>,
}

impl ImageInfo {
    /// The image metadata of `snap`, or `None` when it is not an image.
    pub fn of(snap: &Snapshot) -> Option<Result<ImageInfo>> {
        let Source::Image {
            reference,
            digest,
            manifest_digest,
            platform,
            manifest,
            config,
        } = &snap.source
        else {
            return None;
        };
        Some((|| {
            let bad = |what: &str, e: String| {
                Error::corrupt("image snapshot", digest, format!("recorded {what}: {e}"))
            };
            let m: ImageManifest =
                serde_json::from_str(manifest).map_err(|e| bad("manifest", e.to_string()))?;
            let c = ImageConfiguration::from_reader(config.as_bytes())
                .map_err(|e| bad("config", e.to_string()))?;
            let layers: Vec<Blob> = m
                .layers()
                .iter()
                .map(|d| Blob {
                    media_type: d.media_type().to_string(),
                    digest: d.digest().to_string(),
                    size: d.size(),
                })
                .collect();
            let cfg = c.config().clone().unwrap_or_default();
            let mut ports = cfg.exposed_ports().clone().unwrap_or_default();
            ports.sort();
            Ok(ImageInfo {
                reference: reference.clone(),
                digest: digest.clone(),
                manifest_digest: manifest_digest.clone(),
                platform: platform.clone(),
                size: layers.iter().map(|l| l.size).sum(),
                layers,
                env: cfg.env().clone().unwrap_or_default(),
                working_dir: cfg.working_dir().clone().filter(|w| !w.is_empty()),
                user: cfg.user().clone().filter(|u| !u.is_empty()),
                entrypoint: cfg.entrypoint().clone().unwrap_or_default(),
                cmd: cfg.cmd().clone().unwrap_or_default(),
                exposed_ports: ports,
            })
        })())
    }
}
