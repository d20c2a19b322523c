//! Image sources on disk: an OCI image layout directory, an OCI archive (a tar of such a
//! directory) and a `docker save` archive.
//!
//! An archive is read in place: its members are listed once (offset and size of each),
//! then blobs are read at their offsets, so nothing is unpacked and a layer streams
//! straight from the archive file into the import. Only uncompressed archives can be
//! read so (both tools write them so).

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use oci_spec::image::ImageIndex;
use serde::Deserialize;

use crate::error::{Error, Result};
use crate::image::verify::{check_digest, sha256_of};
use crate::image::{Blob, DOCKER_MANIFEST, ImageSource, MAX_CONFIG_BYTES, MAX_MANIFEST_BYTES, Top};

/// The annotation naming a manifest of an OCI layout (`DIR:TAG`).
const REF_NAME_ANNOTATION: &str = "org.opencontainers.image.ref.name";
/// Largest `index.json` / `manifest.json` read.
const MAX_TOP_BYTES: u64 = MAX_MANIFEST_BYTES;
/// Most members an image archive may list.
const MAX_ARCHIVE_MEMBERS: usize = 100_000;

/// Opens `spec` (`PATH` or `PATH:TAG`) as an image source: a directory is an OCI layout,
/// a file an OCI or `docker save` archive (told apart by their contents).
pub fn open(spec: &str) -> Result<Box<dyn ImageSource>> {
    let (path, tag) = match Path::new(spec).exists() {
        true => (PathBuf::from(spec), None),
        false => match spec.rsplit_once(':') {
            Some((p, t)) if Path::new(p).exists() && !t.is_empty() && !t.contains('/') => {
                (PathBuf::from(p), Some(t.to_string()))
            }
            _ => return Err(Error::SourceMissing(PathBuf::from(spec))),
        },
    };
    if path.is_dir() {
        if !path.join("oci-layout").is_file() || !path.join("index.json").is_file() {
            return Err(Error::Invalid(format!(
                "{} is a directory but not an OCI image layout (no oci-layout and index.json)",
                path.display()
            )));
        }
        return Ok(Box::new(Oci {
            files: Files::Dir(path.clone()),
            name: format!("OCI layout {}", path.display()),
            tag,
        }));
    }
    let archive = Archive::list(&path)?;
    let name = path.display().to_string();
    if archive.members.contains_key("index.json") && archive.members.contains_key("oci-layout") {
        Ok(Box::new(Oci {
            files: Files::Archive(archive),
            name: format!("OCI archive {name}"),
            tag,
        }))
    } else if archive.members.contains_key("manifest.json") {
        Docker::new(archive, format!("docker archive {name}"), tag).map(|d| Box::new(d) as _)
    } else {
        Err(Error::Invalid(format!(
            "{name} is neither an OCI archive (index.json, oci-layout) nor a `docker save` \
             archive (manifest.json)"
        )))
    }
}

/// An uncompressed tar archive's members: name -> (data offset, size).
struct Archive {
    path: PathBuf,
    file: File,
    members: HashMap<String, (u64, u64)>,
}

impl Archive {
    fn list(path: &Path) -> Result<Archive> {
        let file = File::open(path).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => Error::SourceMissing(path.to_path_buf()),
            _ => Error::io("open image archive", path)(e),
        })?;
        let mut magic = [0u8; 4];
        let n = file
            .read_at(&mut magic, 0)
            .map_err(Error::io("read", path))?;
        if magic[..n].starts_with(&[0x1f, 0x8b])
            || magic[..n].starts_with(&[0x28, 0xb5, 0x2f, 0xfd])
        {
            return Err(Error::Invalid(format!(
                "{} is compressed; an image archive is read in place, so decompress it first \
                 (gunzip / unzstd)",
                path.display()
            )));
        }
        let bad = |e: io::Error| {
            Error::Invalid(format!(
                "{} is not a readable tar archive: {e}",
                path.display()
            ))
        };
        let mut members = HashMap::new();
        let mut ar = tar::Archive::new(&file);
        for entry in ar.entries_with_seek().map_err(bad)? {
            let entry = entry.map_err(bad)?;
            if !entry.header().entry_type().is_file() {
                continue;
            }
            let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
            let name = name.trim_start_matches("./").to_string();
            members.insert(name, (entry.raw_file_position(), entry.size()));
            if members.len() > MAX_ARCHIVE_MEMBERS {
                return Err(Error::Invalid(format!(
                    "{} has more than {MAX_ARCHIVE_MEMBERS} members",
                    path.display()
                )));
            }
        }
        let file = File::open(path).map_err(Error::io("open image archive", path))?;
        Ok(Archive {
            path: path.to_path_buf(),
            file,
            members,
        })
    }

    fn open(&self, name: &str) -> Result<Box<dyn Read + '_>> {
        let Some(&(pos, size)) = self.members.get(name) else {
            return Err(Error::not_found(
                "image blob",
                format!("{name} in {}", self.path.display()),
            ));
        };
        Ok(Box::new(At {
            file: &self.file,
            pos,
            end: pos + size,
        }))
    }
}

/// Reads `file` from `pos` to `end` (positioned reads: nothing shared moves).
struct At<'a> {
    file: &'a File,
    pos: u64,
    end: u64,
}

impl Read for At<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = usize::try_from(self.end - self.pos).unwrap_or(usize::MAX);
        let want = buf.len().min(left);
        if want == 0 {
            return Ok(0);
        }
        let n = self.file.read_at(&mut buf[..want], self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

/// Where an OCI layout's files are.
enum Files {
    Dir(PathBuf),
    Archive(Archive),
}

impl Files {
    fn open(&self, name: &str) -> Result<Box<dyn Read + '_>> {
        match self {
            Files::Dir(dir) => {
                let p = dir.join(name);
                match File::open(&p) {
                    Ok(f) => Ok(Box::new(f)),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => Err(Error::not_found(
                        "image blob",
                        format!("{name} in {}", dir.display()),
                    )),
                    Err(e) => Err(Error::io("open", p)(e)),
                }
            }
            Files::Archive(a) => a.open(name),
        }
    }

    fn read_small(&self, name: &str, limit: u64) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.open(name)?
            .take(limit + 1)
            .read_to_end(&mut out)
            .map_err(Error::io("read", name.to_string()))?;
        if out.len() as u64 > limit {
            return Err(Error::Invalid(format!(
                "{name} is larger than {limit} bytes"
            )));
        }
        Ok(out)
    }
}

/// The path of a blob in an OCI layout (the digest checked first: it becomes a path).
fn blob_path(digest: &str) -> Result<String> {
    check_digest(digest)?;
    Ok(format!("blobs/sha256/{}", &digest["sha256:".len()..]))
}

/// An OCI image layout, as a directory or an archive.
struct Oci {
    files: Files,
    name: String,
    tag: Option<String>,
}

impl ImageSource for Oci {
    fn describe(&self) -> String {
        self.name.clone()
    }

    fn top(&mut self) -> Result<Top> {
        let bytes = self.files.read_small("index.json", MAX_TOP_BYTES)?;
        let index: ImageIndex = serde_json::from_slice(&bytes).map_err(|e| {
            Error::Invalid(format!(
                "{}: index.json is not a valid image index: {e}",
                self.name
            ))
        })?;
        let tag_of = |d: &oci_spec::image::Descriptor| {
            d.annotations()
                .as_ref()
                .and_then(|a| a.get(REF_NAME_ANNOTATION).cloned())
        };
        let chosen: Vec<_> = match &self.tag {
            Some(t) => index
                .manifests()
                .iter()
                .filter(|d| tag_of(d).as_deref() == Some(t))
                .collect(),
            None => index.manifests().iter().collect(),
        };
        match chosen.as_slice() {
            [d] => Blob::of(d, MAX_MANIFEST_BYTES, "manifest").map(Top::Named),
            [] if self.tag.is_some() => Err(Error::not_found(
                "image tag",
                format!(
                    "{} in {}",
                    self.tag.as_deref().unwrap_or_default(),
                    self.name
                ),
            )),
            _ => {
                let tags: Vec<String> = index.manifests().iter().filter_map(tag_of).collect();
                Err(Error::Invalid(format!(
                    "{} holds {} images; name one as PATH:TAG (tags: {})",
                    self.name,
                    index.manifests().len(),
                    if tags.is_empty() {
                        "none".into()
                    } else {
                        tags.join(", ")
                    }
                )))
            }
        }
    }

    fn blob(&mut self, blob: &Blob) -> Result<Box<dyn Read + '_>> {
        self.files.open(&blob_path(&blob.digest)?)
    }
}

/// One image of a `docker save` archive's `manifest.json`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DockerEntry {
    config: String,
    #[serde(default)]
    repo_tags: Option<Vec<String>>,
    layers: Vec<String>,
}

/// A `docker save` archive (the format before OCI layouts): it names layers by path,
/// not digest. The manifest is made here: the config's digest is computed, and each
/// layer (an uncompressed tar) is named by the config's `diff_id` for it, which the
/// import then checks like any digest.
struct Docker {
    archive: Archive,
    name: String,
    manifest: Vec<u8>,
    /// Digest -> member.
    blobs: HashMap<String, String>,
}

impl Docker {
    fn new(archive: Archive, name: String, tag: Option<String>) -> Result<Docker> {
        let files = Files::Archive(archive);
        let bytes = files.read_small("manifest.json", MAX_TOP_BYTES)?;
        let entries: Vec<DockerEntry> = serde_json::from_slice(&bytes).map_err(|e| {
            Error::Invalid(format!(
                "{name}: manifest.json is not a docker save manifest: {e}"
            ))
        })?;
        let chosen: Vec<&DockerEntry> = match &tag {
            Some(t) => entries
                .iter()
                .filter(|e| {
                    e.repo_tags
                        .iter()
                        .flatten()
                        .any(|r| r == t || r.rsplit_once(':').map(|x| x.1) == Some(t))
                })
                .collect(),
            None => entries.iter().collect(),
        };
        let [entry] = chosen.as_slice() else {
            return Err(Error::Invalid(format!(
                "{name} holds {} images matching; name one as PATH:REPO:TAG",
                chosen.len()
            )));
        };
        let config = files.read_small(&entry.config, MAX_CONFIG_BYTES)?;
        let config_digest = sha256_of(&config);
        let v: serde_json::Value = serde_json::from_slice(&config)
            .map_err(|e| Error::Invalid(format!("{name}: the image config is not JSON: {e}")))?;
        let diff_ids: Vec<String> = v["rootfs"]["diff_ids"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|d| d.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        if diff_ids.len() != entry.layers.len() {
            return Err(Error::Invalid(format!(
                "{name}: {} layers listed, the config has {} diff_ids",
                entry.layers.len(),
                diff_ids.len()
            )));
        }
        let Files::Archive(archive) = files else {
            unreachable!("made above")
        };
        let mut blobs = HashMap::new();
        blobs.insert(config_digest.clone(), entry.config.clone());
        let mut layers = Vec::new();
        for (path, diff_id) in entry.layers.iter().zip(&diff_ids) {
            let Some(&(_, size)) = archive.members.get(path.as_str()) else {
                return Err(Error::not_found("image layer", format!("{path} in {name}")));
            };
            check_digest(diff_id)?;
            blobs.insert(diff_id.clone(), path.clone());
            layers.push(serde_json::json!({
                "mediaType": "application/vnd.docker.image.rootfs.diff.tar",
                "digest": diff_id, "size": size,
            }));
        }
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": DOCKER_MANIFEST,
            "config": {
                "mediaType": "application/vnd.docker.container.image.v1+json",
                "digest": config_digest, "size": config.len(),
            },
            "layers": layers,
        }))
        .map_err(|e| Error::Invalid(format!("{name}: its manifest cannot be encoded: {e}")))?;
        Ok(Docker {
            archive,
            name,
            manifest,
            blobs,
        })
    }
}

impl ImageSource for Docker {
    fn describe(&self) -> String {
        self.name.clone()
    }

    fn top(&mut self) -> Result<Top> {
        Ok(Top::Fetched {
            bytes: self.manifest.clone(),
            media_type: Some(DOCKER_MANIFEST.into()),
            expected: None,
        })
    }

    fn blob(&mut self, blob: &Blob) -> Result<Box<dyn Read + '_>> {
        match self.blobs.get(&blob.digest) {
            Some(member) => self.archive.open(member),
            None => Err(Error::not_found(
                "image blob",
                format!("{} in {}", blob.digest, self.name),
            )),
        }
    }
}
