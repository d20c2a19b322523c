//! The only `unsafe` of this crate: `mallopt` (see [`fix_mmap_threshold`]), `malloc_trim`
//! (see [`trim_heap`]), `sched_setscheduler` and `sched_getscheduler` (see
//! [`idle_priority`], [`trim_heap`]), `statx` (see [`is_mount_root`]), `open_tree` (see [`open_tree_clone`]) and small safe
//! wrappers of the ioctls the `reflink` and `btrfs` materializers make (`FICLONE`, btrfs
//! subvolume create / snapshot / destroy / set-flags, quota enable, qgroup limit,
//! subvolume id, filesystem id). Every wrapper takes open files (so
//! the descriptors are valid for the call) and checks the return value in one place (nix's
//! ioctl macros turn -1 into `Err(errno)`).

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;

const BTRFS_IOCTL_MAGIC: u8 = 0x94;
/// `FICLONE` is `_IOW(0x94, 9, int)`, shared with btrfs's old clone ioctl.
const FICLONE_NR: u8 = 9;
/// Longest name a `btrfs_ioctl_vol_args` carries (`BTRFS_PATH_NAME_MAX`).
const BTRFS_PATH_NAME_MAX_BYTES: usize = 4087;
/// Longest name a `btrfs_ioctl_vol_args_v2` carries (`BTRFS_SUBVOL_NAME_MAX`).
const BTRFS_SUBVOL_NAME_MAX_BYTES: usize = 4039;
/// `BTRFS_SUBVOL_RDONLY`: a read-only subvolume or snapshot.
const BTRFS_SUBVOL_RDONLY: u64 = 1 << 1;

/// `struct btrfs_ioctl_vol_args` (4096 bytes).
#[repr(C)]
struct VolArgs {
    fd: i64,
    name: [u8; BTRFS_PATH_NAME_MAX_BYTES + 1],
}

/// `struct btrfs_ioctl_vol_args_v2` (4096 bytes); the unions are kept as their largest
/// member, zeroed.
#[repr(C)]
struct VolArgsV2 {
    fd: i64,
    transid: u64,
    flags: u64,
    unused: [u64; 4],
    name: [u8; BTRFS_SUBVOL_NAME_MAX_BYTES + 1],
}

const _: () = assert!(std::mem::size_of::<VolArgs>() == 4096);
const _: () = assert!(std::mem::size_of::<VolArgsV2>() == 4096);

nix::ioctl_write_int_bad!(
    ioctl_ficlone,
    nix::request_code_write!(
        BTRFS_IOCTL_MAGIC,
        FICLONE_NR,
        std::mem::size_of::<libc::c_int>()
    )
);
nix::ioctl_write_ptr!(ioctl_subvol_create, BTRFS_IOCTL_MAGIC, 14, VolArgs);
nix::ioctl_write_ptr!(ioctl_snap_destroy, BTRFS_IOCTL_MAGIC, 15, VolArgs);
nix::ioctl_write_ptr!(ioctl_snap_create_v2, BTRFS_IOCTL_MAGIC, 23, VolArgsV2);
nix::ioctl_write_ptr!(ioctl_subvol_setflags, BTRFS_IOCTL_MAGIC, 26, u64);

fn name_bytes<const N: usize>(name: &OsStr) -> io::Result<[u8; N]> {
    let b = name.as_bytes();
    if b.is_empty() || b.len() >= N || b.contains(&b'/') || b.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("unusable subvolume name {name:?}"),
        ));
    }
    let mut out = [0u8; N];
    out[..b.len()].copy_from_slice(b);
    Ok(out)
}

/// Safe wrapper for `ioctl(dest, FICLONE, src)`: `dest` shares all of `src`'s extents
/// (replacing its own content). `dest` must be open for writing, both on one filesystem.
pub fn ficlone(dest: &File, src: &File) -> io::Result<()> {
    // SAFETY: both descriptors are owned by live `File`s for the whole call; FICLONE
    // takes the source descriptor by value and touches no memory of ours.
    unsafe { ioctl_ficlone(dest.as_raw_fd(), src.as_raw_fd()) }
        .map(drop)
        .map_err(io::Error::from)
}

/// Safe wrapper for `BTRFS_IOC_SUBVOL_CREATE`: a new empty subvolume `name` in `parent`.
pub fn btrfs_subvol_create(parent: &File, name: &OsStr) -> io::Result<()> {
    let args = VolArgs {
        fd: 0,
        name: name_bytes(name)?,
    };
    // SAFETY: `parent` is a live descriptor; `args` is a fully initialised
    // `btrfs_ioctl_vol_args` that outlives the call and is only read by the kernel.
    unsafe { ioctl_subvol_create(parent.as_raw_fd(), &args) }
        .map(drop)
        .map_err(io::Error::from)
}

/// Safe wrapper for `BTRFS_IOC_SNAP_CREATE_V2`: `name` in `parent` becomes a snapshot of
/// the subvolume `source` (read-only if asked).
pub fn btrfs_snapshot(
    parent: &File,
    source: &File,
    name: &OsStr,
    readonly: bool,
) -> io::Result<()> {
    let args = VolArgsV2 {
        fd: i64::from(source.as_raw_fd()),
        transid: 0,
        flags: if readonly { BTRFS_SUBVOL_RDONLY } else { 0 },
        unused: [0; 4],
        name: name_bytes(name)?,
    };
    // SAFETY: both descriptors are live for the call; `args` is a fully initialised
    // `btrfs_ioctl_vol_args_v2` (no qgroup pointer: flags carry no QGROUP_INHERIT) that
    // outlives the call; the kernel reads it and writes `transid` only with ASYNC, unset.
    unsafe { ioctl_snap_create_v2(parent.as_raw_fd(), &args) }
        .map(drop)
        .map_err(io::Error::from)
}

/// Safe wrapper for `BTRFS_IOC_SNAP_DESTROY`: deletes the subvolume `name` in `parent`
/// with everything in it (root, or `user_subvol_rm_allowed`).
pub fn btrfs_subvol_destroy(parent: &File, name: &OsStr) -> io::Result<()> {
    let args = VolArgs {
        fd: 0,
        name: name_bytes(name)?,
    };
    // SAFETY: as for `btrfs_subvol_create`: a live descriptor and an initialised argument
    // that outlives the call.
    unsafe { ioctl_snap_destroy(parent.as_raw_fd(), &args) }
        .map(drop)
        .map_err(io::Error::from)
}

/// `struct btrfs_ioctl_quota_ctl_args`.
#[repr(C)]
struct QuotaCtlArgs {
    cmd: u64,
    status: u64,
}

/// `BTRFS_QUOTA_CTL_ENABLE`: turn qgroup accounting on for the whole filesystem.
const BTRFS_QUOTA_CTL_ENABLE: u64 = 1;
/// `BTRFS_QGROUP_LIMIT_MAX_RFER`: the limit's `max_rfer` is set.
const BTRFS_QGROUP_LIMIT_MAX_RFER: u64 = 1;
/// `BTRFS_FIRST_FREE_OBJECTID`: the inode number of a subvolume's root directory.
const BTRFS_FIRST_FREE_OBJECTID: u64 = 256;
/// `BTRFS_INO_LOOKUP_PATH_MAX`.
const BTRFS_INO_LOOKUP_PATH_MAX_BYTES: usize = 4080;

/// `struct btrfs_ioctl_qgroup_limit_args` (with its `struct btrfs_qgroup_limit`).
#[repr(C)]
struct QgroupLimitArgs {
    qgroupid: u64,
    flags: u64,
    max_rfer: u64,
    max_excl: u64,
    rsv_rfer: u64,
    rsv_excl: u64,
}

/// `struct btrfs_ioctl_ino_lookup_args`.
#[repr(C)]
struct InoLookupArgs {
    treeid: u64,
    objectid: u64,
    name: [u8; BTRFS_INO_LOOKUP_PATH_MAX_BYTES],
}

/// `struct btrfs_ioctl_fs_info_args` (1024 bytes).
#[repr(C)]
struct FsInfoArgs {
    max_id: u64,
    num_devices: u64,
    fsid: [u8; 16],
    nodesize: u32,
    sectorsize: u32,
    clone_alignment: u32,
    csum_type: u16,
    csum_size: u16,
    flags: u64,
    generation: u64,
    metadata_uuid: [u8; 16],
    reserved: [u8; 944],
}

const _: () = assert!(std::mem::size_of::<QgroupLimitArgs>() == 48);
const _: () = assert!(std::mem::size_of::<InoLookupArgs>() == 4096);
const _: () = assert!(std::mem::size_of::<FsInfoArgs>() == 1024);

nix::ioctl_readwrite!(ioctl_ino_lookup, BTRFS_IOCTL_MAGIC, 18, InoLookupArgs);
nix::ioctl_read!(ioctl_fs_info, BTRFS_IOCTL_MAGIC, 31, FsInfoArgs);
nix::ioctl_readwrite!(ioctl_quota_ctl, BTRFS_IOCTL_MAGIC, 40, QuotaCtlArgs);
// The kernel declares it `_IOR` though it only reads the argument.
nix::ioctl_read!(ioctl_qgroup_limit, BTRFS_IOCTL_MAGIC, 43, QgroupLimitArgs);

/// Safe wrapper for `BTRFS_IOC_QUOTA_CTL` with `BTRFS_QUOTA_CTL_ENABLE`: qgroup
/// accounting on for the filesystem holding `any` (a no-op when it is on).
pub fn btrfs_quota_enable(any: &File) -> io::Result<()> {
    let mut args = QuotaCtlArgs {
        cmd: BTRFS_QUOTA_CTL_ENABLE,
        status: 0,
    };
    // SAFETY: a live descriptor and an initialised argument that outlives the call.
    unsafe { ioctl_quota_ctl(any.as_raw_fd(), &mut args) }
        .map(drop)
        .map_err(io::Error::from)
}

/// Safe wrapper for `BTRFS_IOC_QGROUP_LIMIT`: the subvolume open as `subvol` may refer
/// to at most `max_referenced` bytes (its level-0 qgroup's `max_rfer`).
pub fn btrfs_qgroup_limit(subvol: &File, max_referenced: u64) -> io::Result<()> {
    let mut args = QgroupLimitArgs {
        // 0: the qgroup of the subvolume the descriptor is in.
        qgroupid: 0,
        flags: BTRFS_QGROUP_LIMIT_MAX_RFER,
        max_rfer: max_referenced,
        max_excl: 0,
        rsv_rfer: 0,
        rsv_excl: 0,
    };
    // SAFETY: a live descriptor and an initialised argument that outlives the call.
    unsafe { ioctl_qgroup_limit(subvol.as_raw_fd(), &mut args) }
        .map(drop)
        .map_err(io::Error::from)
}

/// Safe wrapper for `BTRFS_IOC_INO_LOOKUP` asking for the id of the subvolume `dir` is
/// in (the one lookup unprivileged callers may make).
pub fn btrfs_subvol_id(dir: &File) -> io::Result<u64> {
    let mut args = InoLookupArgs {
        treeid: 0,
        objectid: BTRFS_FIRST_FREE_OBJECTID,
        name: [0; BTRFS_INO_LOOKUP_PATH_MAX_BYTES],
    };
    // SAFETY: a live descriptor and an initialised argument that outlives the call; the
    // kernel writes `treeid` and `name` within the struct.
    unsafe { ioctl_ino_lookup(dir.as_raw_fd(), &mut args) }.map_err(io::Error::from)?;
    Ok(args.treeid)
}

/// Safe wrapper for `BTRFS_IOC_FS_INFO`: the filesystem's id (its directory's name under
/// `/sys/fs/btrfs/`).
pub fn btrfs_fsid(any: &File) -> io::Result<[u8; 16]> {
    let mut args = FsInfoArgs {
        max_id: 0,
        num_devices: 0,
        fsid: [0; 16],
        nodesize: 0,
        sectorsize: 0,
        clone_alignment: 0,
        csum_type: 0,
        csum_size: 0,
        flags: 0,
        generation: 0,
        metadata_uuid: [0; 16],
        reserved: [0; 944],
    };
    // SAFETY: a live descriptor and an initialised argument that outlives the call; the
    // kernel fills it in.
    unsafe { ioctl_fs_info(any.as_raw_fd(), &mut args) }.map_err(io::Error::from)?;
    Ok(args.fsid)
}

/// Safe wrapper for `BTRFS_IOC_SUBVOL_SETFLAGS` making the subvolume open as `subvol`
/// read-only.
pub fn btrfs_set_readonly(subvol: &File) -> io::Result<()> {
    let flags: u64 = BTRFS_SUBVOL_RDONLY;
    // SAFETY: a live descriptor and a `u64` that outlives the call, only read.
    unsafe { ioctl_subvol_setflags(subvol.as_raw_fd(), &flags) }
        .map(drop)
        .map_err(io::Error::from)
}

/// Gives every allocation of at least `bytes` its own fresh mapping, for the daemon's
/// life. glibc otherwise raises its mmap threshold (up to 32 MiB) after the first large
/// block is freed, and from then on serves fuser's 16 MiB per-thread request buffers from
/// the heap, where `calloc` must zero (touch) every page: each FUSE thread then held
/// 16 MiB resident (1.6 GB with 64 fuse workspaces) instead of the pages it used.
pub fn fix_mmap_threshold(bytes: usize) -> io::Result<()> {
    let value =
        libc::c_int::try_from(bytes).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: mallopt only changes allocator parameters; it takes plain integers and
    // touches no memory of ours. Called once at start, before the FUSE threads exist.
    match unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, value) } {
        1 => Ok(()),
        _ => Err(io::Error::other("mallopt(M_MMAP_THRESHOLD) refused")),
    }
}

/// Gives the heap's free pages back to the system. glibc returns the pages of its
/// per-thread arenas only when asked: without this, the inode tables of the fuse
/// workspaces that came and went stay resident, and the daemon's RSS stays at the
/// largest sum it ever held rather than what it holds now.
///
/// A thread at idle priority (the teardown thread) trims at normal priority:
/// `malloc_trim` holds each arena's lock while it gives that arena's pages back, and an
/// idle thread preempted there would keep every thread allocating from the arena waiting.
pub fn trim_heap() {
    // SAFETY: sched_getscheduler takes a pid (0: the calling thread) and touches no
    // memory.
    let idle = unsafe { libc::sched_getscheduler(0) } == libc::SCHED_IDLE;
    if idle {
        let _ = idle_priority(false);
    }
    // SAFETY: malloc_trim only releases free heap memory; it takes a plain integer
    // and touches no memory of ours.
    unsafe {
        libc::malloc_trim(0);
    }
    if idle {
        let _ = idle_priority(true);
    }
}

/// Makes the calling thread run only when nothing else wants a CPU (`SCHED_IDLE`), or
/// (`idle` false) as any other thread (`SCHED_OTHER`).
pub fn idle_priority(idle: bool) -> io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    let policy = if idle {
        libc::SCHED_IDLE
    } else {
        libc::SCHED_OTHER
    };
    // SAFETY: `param` is a valid `sched_param` for the call; pid 0 is the calling thread.
    let r = unsafe { libc::sched_setscheduler(0, policy, &param) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether `path` (its last component not followed) is the root of a mount, from
/// `statx(2)`'s `STATX_ATTR_MOUNT_ROOT` (Linux 5.8+): `None` when the kernel does not say.
/// It asks for no attributes, so no filesystem is asked anything: a FUSE mount whose
/// daemon is gone or stuck answers from what the kernel holds.
pub fn is_mount_root(path: &std::path::Path) -> io::Result<Option<bool>> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let mut st = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: `c` is a valid NUL-terminated path and `st` a writable `statx` buffer, both
    // outliving the call; the kernel writes only into `st`.
    let r = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW | libc::AT_STATX_DONT_SYNC,
            0,
            st.as_mut_ptr(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statx returned 0, so it filled the buffer (zeroed before, in any case).
    let st = unsafe { st.assume_init() };
    let bit = libc::STATX_ATTR_MOUNT_ROOT as u64;
    Ok((st.stx_attributes_mask & bit != 0).then_some(st.stx_attributes & bit != 0))
}

/// A detached clone of the mount at `path` (`open_tree(2)` with `OPEN_TREE_CLONE`): a
/// mount of its own, attached nowhere, that keeps the superblock alive until the
/// descriptor is closed. Linux 5.2+; needs `CAP_SYS_ADMIN`.
pub fn open_tree_clone(path: &std::path::Path) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // <linux/mount.h>: OPEN_TREE_CLONE; OPEN_TREE_CLOEXEC is O_CLOEXEC.
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    let flags = OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint;
    // SAFETY: `c` is a valid NUL-terminated path that outlives the call; the syscall
    // writes no memory of ours and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, c.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd =
        i32::try_from(fd).map_err(|_| io::Error::other("open_tree: descriptor out of range"))?;
    // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}
