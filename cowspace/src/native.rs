//! The native lower: an overlay workspace's lower as a metadata image of the snapshot
//! over the blob cache as a data-only layer (the composefs design), so file bytes are
//! read by the kernel straight from the blob files, with no daemon in the path, and one
//! page cache serves every workspace and every snapshot holding the same content.
//!
//! Per snapshot, `<root>/cache/native/<snapshot>/` holds
//! - `image.erofs`: an EROFS image of the snapshot's metadata (written by the
//!   `composefs` crate): every directory, name, mode, owner, xattr, symlink and device
//!   node, hard links as one inode, sizes; a regular file has no bytes, only
//!   `trusted.overlay.metacopy` and `trusted.overlay.redirect` = `/ab/<64 hex>`, the path
//!   of its content's blob below `<root>/cache/blobs`; files up to [`INLINE_MAX`] carry
//!   their bytes in the image instead (no blob file to write, no redirect to follow). The image is a function of the snapshot and the owner: rebuilt, it is the
//!   same bytes.
//! - `blobs`: the content ids the image redirects to (32 bytes each, sorted): the blobs
//!   eviction keeps while the image exists ([`held_blobs`]).
//! - `meta/`: where the image is mounted (read-only, file-backed EROFS, Linux 6.12+),
//!   shared by every workspace of the snapshot; each workspace's overlay is
//!   `lowerdir=meta::<root>/cache/blobs` (a data-only layer: Linux 6.16+, no metacopy).
//!
//! The directory is built under a temporary name and renamed into place after every blob
//! it names is in the blob cache, so a built image never redirects to a missing blob.
//! Images and their blobs go only under the checkouts' lock held exclusively
//! ([`crate::checkout::lock`]: `prune`, and eviction in `gc`), and an image's mount
//! (when the last workspace of it goes, [`release`]) only under the image's own mount
//! lock held exclusively; a create holds both shared from the moment its record exists
//! until its overlay holds the image, so none of them goes under a create.
//!
//! Escaping: a snapshot's own `trusted.overlay.*` xattrs are written escaped
//! (`trusted.overlay.overlay.*`, which overlayfs shows as the original name and never
//! acts on), so a crafted repository cannot redirect a file to another blob, make a
//! directory opaque or hide a file. `user.overlay.*` xattrs mean nothing to an overlay
//! mounted with `trusted.overlay.*` (every overlay of a native workspace is).
//!
//! Identity: inode numbers are the image's (stable for a snapshot: the image is
//! deterministic); times are the view's ([`crate::served::served_time_secs`]), so the stat data the import gave `.git/index` matches here too.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsStr;
use std::fs;
use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use composefs::erofs::format::FormatVersion;
use composefs::erofs::writer::{ValidatedFileSystem, mkfs_erofs_versioned};
use composefs::fsverity::{Algorithm, FsVerityHashValue};
use composefs::generic_tree::{Directory, FileSystem, Inode, Leaf, LeafContent, LeafId, Stat};
use composefs::tree::RegularFile;
use cowspace_store::{ContentId, Entry, Kind, SnapshotId, Store, TreeId};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::error::{Error, Result};

/// `lower_kind` of workspaces on the native lower.
pub const LOWER_KIND: crate::kinds::LowerKind = crate::kinds::LowerKind::Native;

const IMAGE: &str = "image.erofs";
/// Files up to this size, counting their xattrs' bytes, carry their bytes in the image
/// itself: no blob file to write for them, and no redirect for the kernel to follow at
/// their first open (35% of the Linux tree's files; bytes read from the image's page
/// cache, one per snapshot). 3.5 KiB (48% of the files) read no faster (1.19-1.21x
/// overlayfs for both, `docs/BENCHMARKS.md`); the `composefs` 0.9.4 writer makes images
/// the kernel refuses (`EUCLEAN`) for inline files of a whole 4 KiB block.
pub const INLINE_MAX: u64 = 2048;
const BLOBS: &str = "blobs";
const META: &str = "meta";
const MOUNT_LOCK: &str = "mount.lock";

/// A content id as the `composefs` writer's object id: its redirect is the blob cache's
/// path of the content, `ab/<all 64 hex digits>` ([`cowspace_store::BlobCache::path`]).
/// The digest algorithm is never used: images carry no fs-verity digests.
#[derive(
    Clone, Debug, PartialEq, Eq, Hash, FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned,
)]
#[repr(C)]
struct BlobRef([u8; 32]);

impl From<[u8; 32]> for BlobRef {
    fn from(v: [u8; 32]) -> Self {
        BlobRef(v)
    }
}

impl FsVerityHashValue for BlobRef {
    type Digest = composefs::digest::Sha256;
    const ALGORITHM: Algorithm = Algorithm::Sha256 { lg_blocksize: 12 };
    const EMPTY: Self = BlobRef([0; 32]);

    fn to_object_pathname(&self) -> String {
        format!("{:02x}/{}", self.0[0], hex::encode(self.0))
    }
}

/// `<root>/cache/native`.
pub fn dir(store: &Store) -> PathBuf {
    store.layout().native()
}

/// Where the image of `snapshot` is mounted: a native workspace's recorded `lower`.
pub fn meta_path(store: &Store, snapshot: &SnapshotId) -> PathBuf {
    dir(store).join(snapshot.to_hex()).join(META)
}

/// The data-only layer of a native workspace whose `lower` is `meta`: the blob cache
/// of the same root (`<root>/cache/native/<snapshot>/meta` → `<root>/cache/blobs`).
pub fn data_layer(meta: &Path) -> Result<PathBuf> {
    meta.ancestors()
        .nth(3)
        .map(|cache| cache.join("blobs"))
        .ok_or_else(|| Error::Invalid(format!("{} is not a native lower", meta.display())))
}

/// Whether this host can make native workspaces; otherwise what it lacks. Tried once per
/// process for real: a small image mounted, an overlay with a data-only layer over it,
/// a file read through the redirect (`mountctl doctor` says which lower and why).
/// The answer is kept for the boot in `<root>/cache/native/.probe` (the boot id, then
/// `ok` or `no: WHY`), so a create costs no trial mount: with many workspaces mounted,
/// unmounting the trial alone takes tens of milliseconds.
pub fn probe(store: &Store) -> std::result::Result<(), String> {
    static PROBED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    PROBED
        .get_or_init(|| {
            let boot = crate::procfs::boot_id().unwrap_or_default();
            let record = dir(store).join(".probe");
            if let Ok(text) = fs::read_to_string(&record)
                && let Some((id, answer)) = text.trim_end().split_once(' ')
                && !boot.is_empty()
                && id == boot
            {
                return match answer.strip_prefix("no: ") {
                    Some(why) => Err(why.to_string()),
                    None if answer == "ok" => Ok(()),
                    None => trial(store),
                };
            }
            let answer = trial(store);
            if !boot.is_empty() && nix::unistd::geteuid().is_root() {
                let text = match &answer {
                    Ok(()) => format!("{boot} ok\n"),
                    Err(why) => format!("{boot} no: {}\n", why.replace('\n', " ")),
                };
                let tmp = dir(store).join(crate::tmpname::unique(".probe"));
                if fs::create_dir_all(dir(store)).is_ok() && fs::write(&tmp, text).is_ok() {
                    let _ = fs::rename(&tmp, &record);
                }
            }
            answer
        })
        .clone()
}

fn trial(store: &Store) -> std::result::Result<(), String> {
    for want in ["erofs", "overlay"] {
        if !crate::procfs::has_filesystem(want) {
            return Err(format!(
                "the kernel has no {want} filesystem (modprobe {want})"
            ));
        }
    }
    if !nix::unistd::geteuid().is_root() {
        return Err("mounting an EROFS image needs root".into());
    }
    let base = store
        .layout()
        .tmp()
        .join(format!("native-probe-{}", std::process::id()));
    let result = (|| {
        let data = base.join("data");
        let content = b"native\n";
        let id = *blake3::hash(content).as_bytes();
        let blob = data.join(BlobRef(id).to_object_pathname());
        fs::create_dir_all(blob.parent().expect("blob paths have a parent"))
            .map_err(|e| format!("cannot create {}: {e}", base.display()))?;
        fs::write(&blob, content).map_err(|e| format!("cannot write {}: {e}", blob.display()))?;
        let mut root: Directory<RegularFile<BlobRef>> = Directory::new(stat(0o40755, vec![], b""));
        root.insert(OsStr::new("f"), Inode::leaf(LeafId(0)));
        let leaves = vec![Leaf {
            stat: stat(0o100644, vec![], b"f"),
            content: LeafContent::Regular(RegularFile::ExternalNoVerity(
                BlobRef(id),
                content.len() as u64,
            )),
        }];
        let image = base.join(IMAGE);
        write_image(FileSystem { root, leaves }, &image).map_err(|e| e.to_string())?;
        let dirs = ["meta", "upper", "work", "mnt"].map(|d| base.join(d));
        for d in &dirs {
            fs::create_dir_all(d).map_err(|e| format!("cannot create {}: {e}", d.display()))?;
        }
        mount_image(&image, &dirs[0]).map_err(|e| {
            format!("a file-backed EROFS mount failed (Linux 6.12+ with CONFIG_EROFS_FS_BACKED_BY_FILE): {e}")
        })?;
        let overlay = crate::mounts::mount_overlay_with_data(
            &dirs[0],
            Some(&data),
            &dirs[1],
            &dirs[2],
            &dirs[3],
            true,
        )
        .map_err(|e| format!("an overlay with a data-only lower layer failed (Linux 6.16+): {e}"));
        let read = overlay.and_then(|()| {
            let got = fs::read(dirs[3].join("f"));
            let _ = crate::mounts::unmount(&dirs[3]);
            match got {
                Ok(b) if b == content => Ok(()),
                Ok(_) => Err("a read through a data-only layer gave other bytes".to_string()),
                Err(e) => Err(format!("a read through a data-only layer failed: {e}")),
            }
        });
        let _ = crate::mounts::unmount(&dirs[0]);
        read
    })();
    crate::checkout::remove_tree(&base);
    result
}

/// Locks a create holds until its overlay holds the image (see [`ensure`]).
#[derive(Debug)]
pub struct InUse {
    _images: fs::File,
    _mount: fs::File,
}

/// Makes sure the image of `snapshot` is built and mounted at [`meta_path`]. Returns the
/// locks to hold until the workspace's overlay is mounted: the checkouts' lock shared
/// (no prune or eviction meanwhile) and the image's mount lock shared (the removal of
/// another workspace of the snapshot unmounts an image no live workspace uses under it
/// held exclusively, [`release`], and so never waits for another snapshot's build). The
/// caller has recorded its workspace first, so a prune after this keeps the image.
pub fn ensure(store: &Store, snapshot: &SnapshotId) -> Result<InUse> {
    let images = crate::checkout::lock(store, false)?;
    build_if_missing(store, snapshot)?;
    let meta = meta_path(store, snapshot);
    let mount = mount_locked(&meta)?;
    mount
        .lock_shared()
        .map_err(Error::io("lock", meta.with_file_name(MOUNT_LOCK)))?;
    Ok(InUse {
        _images: images,
        _mount: mount,
    })
}

/// Whether the image of `snapshot` is built (a create then only mounts it).
pub fn is_built(store: &Store, snapshot: &SnapshotId) -> bool {
    top(store, snapshot).join(IMAGE).is_file()
}

/// `<root>/cache/native/<snapshot>`.
fn top(store: &Store, snapshot: &SnapshotId) -> PathBuf {
    dir(store).join(snapshot.to_hex())
}

fn build_if_missing(store: &Store, snapshot: &SnapshotId) -> Result<()> {
    if is_built(store, snapshot) {
        return Ok(());
    }
    build(store, snapshot, &top(store, snapshot))
}

/// Most files (and bytes) of a snapshot whose image `--lower auto` builds during the
/// create itself (about a second here: writing the missing blobs is most of it). A
/// larger snapshot without an image gets the view lower while the daemon builds the
/// image in the background ([`prepare`]); later creates find it built.
/// `COWSPACE_NATIVE_EAGER_FILES` overrides the file count.
pub const EAGER_FILES: u64 = 10_000;
/// See [`EAGER_FILES`].
pub const EAGER_BYTES: u64 = 512 << 20;

/// Whether `--lower auto` should build the image of a snapshot of `files` files and
/// `bytes` bytes during the create.
pub fn eager(files: u64, bytes: u64) -> bool {
    let max_files = std::env::var("COWSPACE_NATIVE_EAGER_FILES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(EAGER_FILES);
    files <= max_files && bytes <= EAGER_BYTES
}

/// Builds the image of `snapshot` (and writes its missing blobs) without mounting it,
/// under the checkouts' lock held shared: what the daemon runs in the background.
pub fn prepare(store: &Store, snapshot: &SnapshotId) -> Result<()> {
    let _shared = crate::checkout::lock(store, false)?;
    build_if_missing(store, snapshot)
}

/// Mounts the image beside `meta` at `meta` unless it is mounted there already (after a
/// reboot, after the last workspace of it went). Serialized per snapshot by its mount
/// lock, so two creates never stack two mounts.
pub fn ensure_mounted(meta: &Path) -> Result<()> {
    if crate::mounts::is_mounted(meta)? {
        return Ok(());
    }
    mount_locked(meta).map(drop)
}

/// [`ensure_mounted`], returning the image's mount lock, held exclusively.
fn mount_locked(meta: &Path) -> Result<fs::File> {
    let top = meta.parent().expect("meta has a parent");
    let lock = crate::lockfile::lock(&top.join(MOUNT_LOCK), true)?;
    if crate::mounts::is_mounted(meta)? {
        return Ok(lock);
    }
    let image = top.join(IMAGE);
    if !image.is_file() {
        return Err(Error::Invalid(format!(
            "the native lower {} has no image (it was pruned while in use?); \
             `mountctl recover WS` builds it again",
            top.display()
        )));
    }
    fs::create_dir_all(meta).map_err(Error::io("create directory", meta))?;
    mount_image(&image, meta)?;
    Ok(lock)
}

/// After a workspace of the image mounted at `meta` went: unmounts the image when
/// `in_use` (asked under the image's mount lock held exclusively) says no live
/// workspace uses it any more. The image stays for the next create, until `gc`.
pub fn release(meta: &Path, in_use: impl FnOnce() -> Result<bool>) -> Result<()> {
    let top = meta.parent().expect("meta has a parent");
    if !top.is_dir() {
        return Ok(());
    }
    let _lock = crate::lockfile::lock(&top.join(MOUNT_LOCK), true)?;
    if !in_use()? && crate::mounts::is_mounted(meta)? {
        crate::mounts::unmount_lazy(meta)?;
    }
    Ok(())
}

/// Mounts the EROFS image file `image` read-only at `target` (file-backed, no loop
/// device).
fn mount_image(image: &Path, target: &Path) -> Result<()> {
    use rustix::mount::{
        FsMountFlags, FsOpenFlags, MountAttrFlags, MoveMountFlags, fsconfig_create,
        fsconfig_set_flag, fsconfig_set_string, fsmount, fsopen, move_mount,
    };
    let err = |e: rustix::io::Errno| Error::Mount {
        target: target.to_path_buf(),
        source: nix::Error::from_raw(e.raw_os_error()),
    };
    let fs_fd = fsopen("erofs", FsOpenFlags::FSOPEN_CLOEXEC).map_err(err)?;
    fsconfig_set_flag(fs_fd.as_fd(), "ro").map_err(err)?;
    fsconfig_set_string(fs_fd.as_fd(), "source", image).map_err(err)?;
    fsconfig_create(fs_fd.as_fd()).map_err(err)?;
    let mnt = fsmount(
        fs_fd.as_fd(),
        FsMountFlags::FSMOUNT_CLOEXEC,
        MountAttrFlags::MOUNT_ATTR_RDONLY | MountAttrFlags::MOUNT_ATTR_NOATIME,
    )
    .map_err(err)?;
    move_mount(
        mnt.as_fd(),
        "",
        rustix::fs::CWD,
        target,
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )
    .map_err(err)
}

/// The owner every entry of an image gets: this process's (the view serves its own
/// owner the same way), asked once.
fn owner() -> (u32, u32) {
    static OWNER: OnceLock<(u32, u32)> = OnceLock::new();
    *OWNER.get_or_init(|| {
        (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        )
    })
}

fn stat(mode: u32, xattrs: Vec<(Vec<u8>, Vec<u8>)>, path: &[u8]) -> Stat {
    let (uid, gid) = owner();
    Stat {
        st_mode: mode,
        st_uid: uid,
        st_gid: gid,
        st_mtim_sec: crate::served::served_time_secs(path) as i64,
        st_mtim_nsec: 0,
        xattrs: xattrs
            .into_iter()
            .map(|(k, v)| (Box::from(OsStr::from_bytes(&k)), Box::from(v)))
            .collect::<BTreeMap<_, _>>(),
    }
}

fn write_image(fs_tree: FileSystem<RegularFile<BlobRef>>, dest: &Path) -> Result<()> {
    let validated = ValidatedFileSystem::new(fs_tree)
        .map_err(|e| Error::Invalid(format!("the snapshot's metadata image: {e:#}")))?;
    // Version 2: extended inodes (every time kept exactly) and no whiteout table.
    let image = mkfs_erofs_versioned(&validated, FormatVersion::V2);
    let mut f = fs::File::create(dest).map_err(Error::io("create", dest))?;
    f.write_all(&image).map_err(Error::io("write", dest))?;
    f.sync_all().map_err(Error::io("sync", dest))
}

/// Builds `top` (the snapshot's native directory) under a temporary name: blobs first,
/// then the image, then the rename into place.
fn build(store: &Store, snapshot: &SnapshotId, top: &Path) -> Result<()> {
    let parent = top.parent().expect("native dirs have a parent");
    fs::create_dir_all(parent).map_err(Error::io("create directory", parent))?;
    let tmp = parent.join(crate::tmpname::unique(&format!(
        ".tmp-{}",
        snapshot.short()
    )));
    let made = (|| {
        crate::checkout::remove_tree(&tmp);
        fs::create_dir(&tmp).map_err(Error::io("create directory", &tmp))?;
        let snap = store.snapshot(snapshot)?;
        let mut b = Builder {
            store,
            leaves: Vec::new(),
            primaries: HashMap::new(),
            symlinks: HashMap::new(),
            blobs: Vec::new(),
            blob_ids: HashSet::new(),
        };
        let mut root = Directory::new(stat(
            libc::S_IFDIR | snap.root_mode,
            snap.root_xattrs.clone(),
            b"",
        ));
        b.fill(&mut root, &snap.root, b"")?;
        let items: Vec<(ContentId, u64)> = b
            .blobs
            .iter()
            .map(|(id, size)| (ContentId::from_bytes(*id), *size))
            .collect();
        let threads = std::thread::available_parallelism()
            .map_or(2, |n| n.get())
            .min(8);
        store.blob_cache().ensure_all(&items, threads)?;
        let mut list = Vec::with_capacity(b.blobs.len() * 32);
        for (id, _) in &b.blobs {
            list.extend_from_slice(id);
        }
        let list_path = tmp.join(BLOBS);
        fs::write(&list_path, &list).map_err(Error::io("write", &list_path))?;
        write_image(
            FileSystem {
                root,
                leaves: b.leaves,
            },
            &tmp.join(IMAGE),
        )?;
        fs::create_dir(tmp.join(META)).map_err(Error::io("create directory", &tmp))
    })();
    if let Err(e) = made {
        crate::checkout::remove_tree(&tmp);
        return Err(e);
    }
    match fs::rename(&tmp, top) {
        Ok(()) => Ok(()),
        // Another process built it first: use theirs.
        Err(_) if top.join(IMAGE).is_file() => {
            crate::checkout::remove_tree(&tmp);
            Ok(())
        }
        Err(e) => {
            crate::checkout::remove_tree(&tmp);
            Err(Error::io("rename native lower into place", top)(e))
        }
    }
}

struct Builder<'a> {
    store: &'a Store,
    leaves: Vec<Leaf<RegularFile<BlobRef>>>,
    /// Leaf of each regular file (by path), for hard links naming it.
    primaries: HashMap<Vec<u8>, LeafId>,
    /// Leaf of each symlink with several names, by its link group key.
    symlinks: HashMap<[u8; 32], LeafId>,
    /// Content id → size of every blob the image redirects to.
    /// The blobs the image redirects to, in the tree's order (the store keeps a
    /// directory's small files together, so writing them in this order decompresses
    /// each group of them once), and their set.
    blobs: Vec<([u8; 32], u64)>,
    blob_ids: HashSet<[u8; 32]>,
}

impl Builder<'_> {
    fn fill(
        &mut self,
        dir: &mut Directory<RegularFile<BlobRef>>,
        tree: &TreeId,
        path: &[u8],
    ) -> Result<()> {
        for e in self.store.tree(tree)?.entries {
            let child = if path.is_empty() {
                e.name.clone()
            } else {
                [path, b"/", &e.name].concat()
            };
            let name = OsStr::from_bytes(&e.name);
            let inode = match e.kind {
                Kind::Dir => {
                    let mut sub =
                        Directory::new(stat(libc::S_IFDIR | e.mode, e.xattrs.clone(), &child));
                    self.fill(&mut sub, &e.subtree().expect("dir"), &child)?;
                    Inode::Directory(Box::new(sub))
                }
                Kind::File => match self.primaries.get(&child) {
                    Some(id) => Inode::leaf(*id),
                    None => {
                        let id = self.file(&e, &child)?;
                        self.primaries.insert(child, id);
                        Inode::leaf(id)
                    }
                },
                Kind::Hardlink => match self.primaries.get(&e.data) {
                    Some(id) => Inode::leaf(*id),
                    None => {
                        // The primary comes later in the walk: it will find this leaf.
                        let id = self.file(&e, &e.data)?;
                        self.primaries.insert(e.data.clone(), id);
                        Inode::leaf(id)
                    }
                },
                // Every name of a symlink with several shares one leaf (one inode, its
                // link count the number of names).
                Kind::Symlink => {
                    match e.link_group().map(|g| (g, self.symlinks.get(&g).copied())) {
                        Some((_, Some(id))) => Inode::leaf(id),
                        linked => {
                            let inode = self.leaf(
                                &e,
                                libc::S_IFLNK,
                                &child,
                                LeafContent::Symlink(Box::from(OsStr::from_bytes(&e.data))),
                            );
                            if let Some((g, None)) = linked {
                                self.symlinks.insert(g, LeafId(self.leaves.len() - 1));
                            }
                            inode
                        }
                    }
                }
                Kind::Fifo => self.leaf(&e, libc::S_IFIFO, &child, LeafContent::Fifo),
                Kind::CharDevice => self.leaf(
                    &e,
                    libc::S_IFCHR,
                    &child,
                    LeafContent::CharacterDevice(e.rdev().unwrap_or(0)),
                ),
                Kind::BlockDevice => self.leaf(
                    &e,
                    libc::S_IFBLK,
                    &child,
                    LeafContent::BlockDevice(e.rdev().unwrap_or(0)),
                ),
            };
            dir.insert(name, inode);
        }
        Ok(())
    }

    fn leaf(
        &mut self,
        e: &Entry,
        kind: u32,
        path: &[u8],
        content: LeafContent<RegularFile<BlobRef>>,
    ) -> Inode<RegularFile<BlobRef>> {
        self.leaves.push(Leaf {
            stat: stat(kind | e.mode, e.xattrs.clone(), path),
            content,
        });
        Inode::leaf(LeafId(self.leaves.len() - 1))
    }

    /// A regular file's leaf: its size and a redirect to its blob (nothing for an empty
    /// file).
    fn file(&mut self, e: &Entry, path: &[u8]) -> Result<LeafId> {
        let xattr_bytes: u64 = e
            .xattrs
            .iter()
            .map(|(k, v)| (k.len() + v.len() + 4) as u64)
            .sum();
        let content = match e.content() {
            Some(id) if e.size + xattr_bytes > INLINE_MAX => {
                if self.blob_ids.insert(*id.as_bytes()) {
                    self.blobs.push((*id.as_bytes(), e.size));
                }
                RegularFile::ExternalNoVerity(BlobRef(*id.as_bytes()), e.size)
            }
            Some(id) if e.size > 0 => {
                RegularFile::Inline(self.store.read_content(&id)?.into_boxed_slice())
            }
            _ => RegularFile::Inline(Box::from(&[][..])),
        };
        self.leaves.push(Leaf {
            stat: stat(libc::S_IFREG | e.mode, e.xattrs.clone(), path),
            content: LeafContent::Regular(content),
        });
        Ok(LeafId(self.leaves.len() - 1))
    }
}

/// A blob a built image redirects to that is not in the blob cache (or not whole):
/// reads of the files that have those bytes fail in that snapshot's workspaces.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MissingBlob {
    pub snapshot: String,
    pub content: String,
    pub size: u64,
    pub blob: PathBuf,
}

/// Every blob the built images name that is missing from the blob cache (`fsck`).
pub fn missing_blobs(store: &Store) -> Result<Vec<MissingBlob>> {
    let mut out = Vec::new();
    let Ok(rd) = fs::read_dir(dir(store)) else {
        return Ok(out);
    };
    let cache = store.blob_cache();
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Ok(snapshot) = name.parse::<SnapshotId>() else {
            continue;
        };
        let Ok(bytes) = fs::read(e.path().join(BLOBS)) else {
            continue;
        };
        for id in bytes.chunks_exact(32) {
            let id = ContentId::from_bytes(id.try_into().expect("32 bytes"));
            let size: u64 = store
                .content_chunks(&id)?
                .iter()
                .map(|(_, n)| u64::from(*n))
                .sum();
            let blob = cache.path(&id);
            if fs::metadata(&blob).map(|m| m.len()).ok() != Some(size) {
                out.push(MissingBlob {
                    snapshot: snapshot.to_hex(),
                    content: id.to_hex(),
                    size,
                    blob,
                });
            }
        }
    }
    Ok(out)
}

/// Writes the blobs of `missing` again from the store (`fsck --repair`); workspaces
/// read those files again at their next open.
pub fn restore_blobs(store: &Store, missing: &[MissingBlob]) -> Result<()> {
    let items: Vec<(ContentId, u64)> = missing
        .iter()
        .map(|m| Ok((m.content.parse::<ContentId>()?, m.size)))
        .collect::<Result<_>>()?;
    Ok(store.blob_cache().ensure_all(&items, 2)?)
}

/// The blobs every built image redirects to: eviction keeps them. Called under the
/// checkouts' lock held exclusively.
pub fn held_blobs(store: &Store) -> Result<HashSet<ContentId>> {
    let mut held = HashSet::new();
    let Ok(rd) = fs::read_dir(dir(store)) else {
        return Ok(held);
    };
    for e in rd.flatten() {
        let list = e.path().join(BLOBS);
        let Ok(bytes) = fs::read(&list) else {
            continue;
        };
        for id in bytes.chunks_exact(32) {
            held.insert(ContentId::from_bytes(id.try_into().expect("32 bytes")));
        }
    }
    Ok(held)
}

/// Removes the images (and their mounts) of snapshots not in `used`, and leftovers of
/// builds that were cut short. Called under the checkouts' lock held exclusively.
/// Returns how many images were removed.
pub fn prune(store: &Store, used: &HashSet<String>) -> Result<u64> {
    let mut removed = 0;
    let Ok(rd) = fs::read_dir(dir(store)) else {
        return Ok(0);
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if used.contains(&name) || name.starts_with(".probe") {
            continue;
        }
        let meta = e.path().join(META);
        if crate::mounts::is_mounted(&meta).unwrap_or(false) {
            // Overlays hold their own references to the image's mount.
            crate::mounts::unmount_lazy(&meta)?;
        }
        crate::checkout::remove_tree(&e.path());
        if !name.starts_with(".tmp-") {
            removed += 1;
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redirect_is_the_blob_cache_path_of_the_content() {
        let mut id = [0u8; 32];
        id[0] = 0xab;
        id[31] = 0x01;
        let hex = hex::encode(id);
        assert_eq!(BlobRef(id).to_object_pathname(), format!("ab/{hex}"));
        // The same relative path as the blob cache's (`<blobs>/ab/<64 hex>`).
        let root = Path::new("/r");
        let cache = root.join("cache/blobs");
        assert_eq!(
            cache.join(BlobRef(id).to_object_pathname()),
            cache.join(&hex[..2]).join(&hex)
        );
        assert_eq!(
            data_layer(Path::new("/r/cache/native/00ff/meta")).unwrap(),
            cache
        );
    }
}
