//! Images as a runtime keeps them: an OCI image imported from a layout directory or an
//! archive, or pulled from a registry ([`registry`]), is a snapshot of the store whose
//! source records the image (digest, manifest, config); a ref names it. `list`, `show`
//! and `remove` work on the refs that name images.

mod held;
pub mod registry;

use std::path::Path;

use cowspace_store::error::Error as StoreError;
use cowspace_store::image::info::ImageInfo;
use cowspace_store::image::{ImageOptions, ImageReport, Platform, layout};
use cowspace_store::{SnapshotId, Store, StoreConfig};
use serde::Serialize;

use crate::error::Result;

/// How to import or pull an image.
#[derive(Clone, Default)]
pub struct ImageRequest {
    /// The ref to move to the image (`pull` without one: [`registry::Reference::default_ref`]).
    pub ref_name: Option<String>,
    /// `OS/ARCH[/VARIANT]` to pick from an index (default: the host's).
    pub platform: Option<String>,
    pub message: String,
}

fn options(
    req: &ImageRequest,
    reference: String,
    ref_name: Option<String>,
) -> Result<ImageOptions> {
    Ok(ImageOptions {
        ref_name,
        message: req.message.clone(),
        platform: req.platform.as_deref().map(Platform::parse).transpose()?,
        reference,
        progress: None,
    })
}

/// After an image import: the snapshot's xattr note, as for any import.
fn record(store: &Store, report: &ImageReport) {
    match report.import.has_xattrs {
        Some(has) => crate::plain::record_import(store, &report.import.snapshot, has),
        None => {
            let _ = crate::plain::has_xattrs(store, &report.import.snapshot);
        }
    }
}

/// Imports the image at `source` (`PATH` or `PATH:TAG`: an OCI layout directory, an OCI
/// archive or a `docker save` archive) into the runtime root `root`.
pub fn import(root: &Path, source: &str, req: &ImageRequest) -> Result<ImageReport> {
    let store = Store::open(root, StoreConfig::default())?;
    let opts = options(req, source.to_string(), req.ref_name.clone())?;
    if let Some(n) = &opts.ref_name {
        // Before the source is read: a bad name is the first thing to fix.
        cowspace_store::refs::check_ref_name(n)?;
    }
    let mut src = layout::open(source)?;
    let report = store.import_image(src.as_mut(), &opts)?;
    record(&store, &report);
    Ok(report)
}

/// Pulls `reference` (`HOST[:PORT]/REPO[:TAG][@DIGEST]`) from its registry into the
/// runtime root `root`.
pub fn pull(root: &Path, reference: &str, req: &ImageRequest) -> Result<ImageReport> {
    let r = registry::Reference::parse(reference)?;
    let ref_name = Some(req.ref_name.clone().unwrap_or_else(|| r.default_ref()));
    let store = Store::open(root, StoreConfig::default())?;
    let opts = options(req, r.to_string(), ref_name)?;
    if let Some(n) = &opts.ref_name {
        cowspace_store::refs::check_ref_name(n)?;
    }
    let mut src = registry::Registry::new(r)?;
    let report = store.import_image(&mut src, &opts)?;
    record(&store, &report);
    Ok(report)
}

/// An image as `image list` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct ImageEntry {
    /// The ref naming it.
    pub name: String,
    pub snapshot: SnapshotId,
    pub reference: String,
    pub digest: String,
    pub platform: String,
    /// Sum of the layers' compressed sizes.
    pub size: u64,
    pub layers: usize,
    pub created_at: i64,
}

/// Every ref that names an image, by name.
pub fn list(root: &Path) -> Result<Vec<ImageEntry>> {
    let store = Store::open(root, StoreConfig::default())?;
    let mut out = Vec::new();
    for (name, id) in store.refs()? {
        let snap = store.snapshot(&id)?;
        let Some(info) = ImageInfo::of(&snap) else {
            continue;
        };
        let info = info?;
        out.push(ImageEntry {
            name,
            snapshot: id,
            reference: info.reference,
            digest: info.digest,
            platform: info.platform,
            size: info.size,
            layers: info.layers.len(),
            created_at: snap.created_at,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// What `image show` gives.
#[derive(Debug, Clone, Serialize)]
pub struct ImageShown {
    pub snapshot: SnapshotId,
    #[serde(flatten)]
    pub info: ImageInfo,
}

/// The image `name` (a ref or a snapshot id) names; a snapshot that is no image is
/// refused, naming what it is.
pub fn show(root: &Path, name: &str) -> Result<ImageShown> {
    let store = Store::open(root, StoreConfig::default())?;
    let id = store.resolve(name)?;
    let snap = store.snapshot(&id)?;
    match ImageInfo::of(&snap) {
        Some(info) => Ok(ImageShown {
            snapshot: id,
            info: info?,
        }),
        None => Err(not_an_image(name, &id).into()),
    }
}

fn not_an_image(name: &str, id: &SnapshotId) -> StoreError {
    StoreError::Invalid(format!(
        "{} names snapshot {}, which is not an image (imported from a directory, a tar or \
         git): `mountctl image list` shows the images",
        cowspace_store::error::shown(name),
        id.short()
    ))
}

/// Removes the ref `name` of an image (its snapshot goes with the next `gc` when nothing
/// else holds it). A ref of another kind of snapshot is refused.
pub fn remove(root: &Path, name: &str) -> Result<SnapshotId> {
    let store = Store::open(root, StoreConfig::default())?;
    let id = store.get_ref(name)?.ok_or_else(|| StoreError::NotFound {
        what: "image",
        name: name.to_string(),
    })?;
    let snap = store.snapshot(&id)?;
    if ImageInfo::of(&snap).is_none() {
        return Err(not_an_image(name, &id).into());
    }
    store.delete_ref(name, id)?;
    Ok(id)
}
