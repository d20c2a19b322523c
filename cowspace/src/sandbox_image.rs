//! `--image NAME`: an image in the store as a sandbox's root filesystem.
//!
//! The runtime resolves NAME (a ref or snapshot id) to an image snapshot, makes sure
//! its native lower is built and mounted ([`crate::native`]: one EROFS metadata mount
//! per image, shared by every sandbox and workspace of it) and hands the helper that
//! mount and the blob cache (`--image-meta`, `--image-data`); the helper mounts the
//! sandbox's root as an overlay of them with a private writable layer
//! (`sandbox-helper/src/image.rs`). The image config's `Env` goes under the sandbox's
//! own environment (the runtime's additions and `--env` win); `WorkingDir` is reported,
//! and the workspace stays the working directory unless `--image-workdir` asks for the
//! image's (`--workdir DIR` and `exec --workdir` name any other); `User`
//! (`UID[:GID]`, or names found in the image's `/etc/passwd` and `/etc/group`) is the
//! uid and gid of the sandbox's user namespace that commands run as, and one that
//! cannot be resolved is refused (7) naming it.
//!
//! While a long-lived sandbox runs, its record names the image (`image.snapshot`): gc
//! keeps that image's lower and blobs. The metadata mount stays while a ref names the
//! image, and goes once none does and no live workspace or sandbox uses it
//! ([`crate::image::held`]). A one-shot run holds the native lower's locks
//! (the checkouts' lock shared) for its whole run instead.

use std::path::PathBuf;

use cowspace_store::SnapshotId;
use cowspace_store::image::info::ImageInfo;
use serde_json::{Value, json};

use crate::error::{Error, ErrorKind, Result};
use crate::runtime::{Runtime, live_sandbox};

/// An image resolved for a sandbox, its native lower mounted.
#[derive(Debug)]
pub(crate) struct SandboxImage {
    /// The image's snapshot.
    pub snapshot: SnapshotId,
    /// The metadata image's mount.
    pub meta: PathBuf,
    /// The blob cache (the data-only layer).
    pub data: PathBuf,
    /// The image config's `Env`.
    pub env: Vec<String>,
    /// The image config's `WorkingDir`.
    pub working_dir: Option<String>,
    /// The image config's `User` as uid and gid inside; `None` for root.
    pub user: Option<(u32, u32)>,
    /// The locks that keep the lower from going until they drop.
    pub _in_use: crate::native::InUse,
}

impl SandboxImage {
    /// The helper's flags for this image.
    pub fn helper_flags(&self) -> Vec<std::ffi::OsString> {
        let flag = |name: &str, p: &std::path::Path| {
            let mut f = std::ffi::OsString::from(format!("{name}="));
            f.push(p.as_os_str());
            f
        };
        let mut flags = vec![
            flag("--image-meta", &self.meta),
            flag("--image-data", &self.data),
        ];
        if let Some((u, g)) = self.user {
            flags.push(format!("--image-user={u}:{g}").into());
        }
        flags
    }

    /// What a sandbox's record and status say of its image.
    pub fn describe(&self, name: &str) -> Value {
        json!({
            "name": name,
            "snapshot": self.snapshot.to_hex(),
            "working_dir": self.working_dir,
            "user": self.user.map(|(u, g)| format!("{u}:{g}")),
        })
    }
}

/// Ids a sandbox's user namespace maps (`sandbox-helper`'s `IDS_PER_SANDBOX`).
const IDS_INSIDE: u32 = 65_536;
/// Largest `/etc/passwd` or `/etc/group` of an image read to resolve its `User`.
const MAX_ACCOUNTS_FILE_BYTES: u64 = 4 << 20;

/// The id of `name` in an `/etc/passwd` or `/etc/group` text (field 3), and for passwd
/// its primary gid (field 4).
fn lookup(file: &str, name: &str) -> Option<(u32, Option<u32>)> {
    file.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() >= 3 && f[0] == name)
            .then(|| Some((f[2].parse().ok()?, f.get(3).and_then(|g| g.parse().ok()))))?
    })
}

/// The primary gid of `uid` in an `/etc/passwd` text.
fn gid_of_uid(passwd: &str, uid: u32) -> Option<u32> {
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() >= 4 && f[2].parse() == Ok(uid)).then(|| f[3].parse().ok())?
    })
}

/// The home directory of `uid` in an `/etc/passwd` text (field 6), when absolute.
fn home_of(passwd: &str, uid: u32) -> Option<String> {
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() >= 6 && f[2].parse() == Ok(uid) && f[5].starts_with('/')).then(|| f[5].to_string())
    })
}

/// Resolves an image config's `User` (`USER`, `UID`, `USER:GROUP`, `UID:GID`, mixed)
/// with the image's `passwd` and `group` texts; `Err` says what could not be resolved.
/// A uid without a group gets its passwd entry's gid, else 0 (as container runtimes do).
fn resolve_user(user: &str, passwd: &str, group: &str) -> std::result::Result<(u32, u32), String> {
    let (u, g) = match user.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (user, None),
    };
    let (uid, primary) = match u.parse::<u32>() {
        Ok(n) => (n, gid_of_uid(passwd, n)),
        Err(_) => {
            lookup(passwd, u).ok_or_else(|| format!("no user {u:?} in the image's /etc/passwd"))?
        }
    };
    let gid = match g {
        Some(g) => match g.parse::<u32>() {
            Ok(n) => n,
            Err(_) => {
                lookup(group, g)
                    .ok_or_else(|| format!("no group {g:?} in the image's /etc/group"))?
                    .0
            }
        },
        None => primary.unwrap_or(0),
    };
    if uid >= IDS_INSIDE || gid >= IDS_INSIDE {
        return Err(format!(
            "uid {uid} / gid {gid}: a sandbox maps ids 0 to {}",
            IDS_INSIDE - 1
        ));
    }
    Ok((uid, gid))
}

/// The text of `path` in `snapshot`, or empty when it is not a regular file there.
fn snapshot_text(
    store: &cowspace_store::Store,
    snapshot: &SnapshotId,
    path: &str,
) -> Result<String> {
    use std::io::Read;
    let Ok(cowspace_store::browse::Found::Leaf(e)) = store.lookup(snapshot, path) else {
        return Ok(String::new());
    };
    let Some(content) = e.content().filter(|_| e.kind == cowspace_store::Kind::File) else {
        return Ok(String::new());
    };
    let mut text = String::new();
    store
        .content_reader(&content)?
        .take(MAX_ACCOUNTS_FILE_BYTES)
        .read_to_string(&mut text)
        .map_err(Error::io(
            "read",
            format!("{path} of image {}", snapshot.to_hex()),
        ))?;
    Ok(text)
}

/// The controls the helper gets for an image: no name (the helper takes the mounted
/// lower), the image's `Env` under the others, and with `--image-workdir` the image's
/// `WorkingDir` as `--workdir`. A name the runtime did not resolve (a VM's) goes on, for
/// the helper to refuse: it is never dropped.
pub(crate) fn controls_for(
    mut c: crate::sandbox::SandboxOptions,
    image: Option<&SandboxImage>,
) -> crate::sandbox::SandboxOptions {
    if let Some(i) = image {
        c.image = None;
        c.env = i.env.iter().cloned().chain(c.env).collect();
        if c.image_workdir {
            c.workdir = i.working_dir.clone();
        }
    }
    c.image_workdir = false;
    c
}

impl Runtime {
    /// Resolves `--image NAME` of `o` (nothing without it): refused before anything
    /// starts when NAME is unknown (not found), not an image (invalid input) or asks for
    /// a user the sandbox cannot run as (unsupported).
    pub(crate) fn sandbox_image(
        &self,
        o: &crate::sandbox::SandboxOptions,
    ) -> Result<Option<SandboxImage>> {
        let Some(name) = &o.image else {
            if o.image_workdir {
                return Err(Error::Invalid(
                    "--image-workdir needs --image NAME (the image whose WorkingDir to use)".into(),
                ));
            }
            return Ok(None);
        };
        if o.image_workdir && o.workdir.is_some() {
            return Err(Error::Invalid(
                "--workdir and --image-workdir exclude each other: give one".into(),
            ));
        }
        let store = self.store();
        let snapshot = store.resolve(name)?;
        let snap = store.snapshot(&snapshot)?;
        let Some(info) = ImageInfo::of(&snap) else {
            return Err(Error::Answered {
                kind: ErrorKind::InvalidInput,
                message: format!(
                    "--image {name}: snapshot {} is not an image (it was not imported with \
                     `mountctl image import` or `image pull`)",
                    snapshot.to_hex()
                ),
                hint: Some("`mountctl image list` shows the images of this store".into()),
            });
        };
        let info = info?;
        if o.image_workdir && info.working_dir.as_deref().is_none_or(str::is_empty) {
            return Err(Error::Answered {
                kind: ErrorKind::InvalidInput,
                message: format!("--image-workdir: image {name} sets no WorkingDir in its config"),
                hint: Some(
                    "give the directory with --workdir DIR, or leave both out for /workspace"
                        .into(),
                ),
            });
        }
        // A user other than root gets its passwd home as `HOME` (the image's `Env` and
        // `--env` may set another).
        let mut env = Vec::new();
        let user = match info.user.as_deref() {
            None => None,
            Some(user) => {
                let passwd = snapshot_text(store, &snapshot, "etc/passwd")?;
                let group = snapshot_text(store, &snapshot, "etc/group")?;
                let ids = resolve_user(user, &passwd, &group).map_err(|why| Error::Answered {
                    kind: ErrorKind::Unsupported,
                    message: format!(
                        "--image {name}: the image's config asks for User {user:?}, which \
                         the sandbox cannot run as: {why}"
                    ),
                    hint: Some(
                        "give the image a User it defines (UID:GID numbers always work)".into(),
                    ),
                })?;
                if ids != (0, 0)
                    && let Some(home) = home_of(&passwd, ids.0)
                {
                    env.push(format!("HOME={home}"));
                }
                (ids != (0, 0)).then_some(ids)
            }
        };
        env.extend(info.env);
        crate::native::probe(store).map_err(|why| Error::Unsupported {
            name: "sandbox image root".into(),
            why,
        })?;
        let in_use = crate::native::ensure(store, &snapshot)?;
        let meta = crate::native::meta_path(store, &snapshot);
        let data = crate::native::data_layer(&meta)?;
        Ok(Some(SandboxImage {
            snapshot,
            meta,
            data,
            env,
            working_dir: info.working_dir,
            user,
            _in_use: in_use,
        }))
    }

    /// The images (snapshot hex) live long-lived sandboxes run on.
    pub(crate) fn images_in_use(&self) -> Result<std::collections::HashSet<String>> {
        Ok(self
            .reg()
            .list(false)?
            .into_iter()
            .filter(|r| live_sandbox(r).is_some())
            .filter_map(|r| {
                r.sandbox
                    .as_ref()
                    .and_then(|s| s["image"]["snapshot"].as_str().map(str::to_string))
            })
            .collect())
    }

    /// After a sandbox on image `snapshot` (hex) ended: its metadata mount goes once no
    /// live workspace or sandbox uses it and no ref names the image
    /// (`crate::image::held`).
    pub(crate) fn release_image(&self, snapshot: &str) -> Result<()> {
        let Ok(id) = snapshot.parse::<SnapshotId>() else {
            return Ok(());
        };
        let meta = crate::native::meta_path(self.store(), &id);
        crate::native::release(&meta, || {
            // One registry guard at a time (the registry's mutex is not reentrant).
            let workspaces = self
                .reg()
                .live_using(snapshot, crate::materializer::LowerKind::Native)?;
            Ok(workspaces > 0
                || self.images_in_use()?.contains(snapshot)
                || self.image_named(snapshot)?)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1001::/home/app:/bin/sh\n";
    const GROUP: &str = "root:x:0:\nstaff:x:50:\n";

    #[test]
    fn users_resolve_by_number_or_by_the_images_own_names() {
        let r = |u: &str| resolve_user(u, PASSWD, GROUP);
        assert_eq!(r("0"), Ok((0, 0)));
        assert_eq!(r("root"), Ok((0, 0)));
        assert_eq!(r("app"), Ok((1000, 1001)));
        assert_eq!(r("1000"), Ok((1000, 1001)));
        assert_eq!(r("1234"), Ok((1234, 0)));
        assert_eq!(r("app:staff"), Ok((1000, 50)));
        assert_eq!(r("1000:7"), Ok((1000, 7)));
        assert!(r("nobody").unwrap_err().contains("nobody"));
        assert!(r("app:wheel").unwrap_err().contains("wheel"));
        assert!(r("70000").unwrap_err().contains("70000"));
        assert_eq!(home_of(PASSWD, 1000).as_deref(), Some("/home/app"));
        assert_eq!(home_of(PASSWD, 7), None);
    }
}
