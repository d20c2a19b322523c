//! The `nfs` materializer: the fuse materializer's workspace (the same core, private
//! layer and daemon), served by the daemon over NFSv3 on 127.0.0.1 instead of FUSE and
//! mounted by the kernel's NFS client (`fsd/src/nfs/`). For hosts whose kernel has an
//! NFS client but no usable `/dev/fuse`; refused where the kernel has none (this
//! machine's kind: `CONFIG_NFS_FS` unset), never replaced by another materializer.

use std::path::Path;

use cowspace_store::{SnapshotId, Store};

use crate::error::Result;
use crate::kinds::{Choice, LowerKind, LowerPlan};
use crate::materializer::fuse::Fuse;
use crate::materializer::{ChangesLiveIn, Materializer, MaterializerKind, WorkspaceCtx};

/// Mount options: NFSv3 over TCP to the daemon's port for both programs (no rpcbind),
/// no lock manager (the daemon has none; locks stay local), and `soft` with a bounded
/// timeout so a dead daemon gives its callers `EIO` after about 30 s instead of hanging
/// them, as a dead FUSE daemon gives `ENOTCONN`.
pub fn mount_options(port: u16) -> String {
    format!(
        "vers=3,proto=tcp,port={port},mountport={port},mountproto=tcp,nolock,soft,\
         timeo=100,retrans=2,addr=127.0.0.1,mountaddr=127.0.0.1"
    )
}

/// Whether this host's kernel has an NFS client: `nfs` in `/proc/filesystems`, or its
/// module among the running kernel's (loaded by the first mount).
pub fn kernel_has_nfs_client(proc_filesystems: &str, modules: &Path) -> bool {
    proc_filesystems
        .lines()
        .any(|l| l.split_whitespace().last() == Some("nfs"))
        || ["nfs.ko", "nfs.ko.xz", "nfs.ko.zst", "nfs.ko.gz"]
            .iter()
            .any(|f| modules.join("kernel/fs/nfs").join(f).exists())
}

#[derive(Default)]
pub struct Nfs {
    /// Its workspaces are the fuse materializer's, served another way by the same daemon.
    pub served: Fuse,
}

impl Materializer for Nfs {
    fn kind(&self) -> MaterializerKind {
        MaterializerKind::Nfs
    }

    fn probe(&self, _store: &Store) -> std::result::Result<(), String> {
        let release = nix::sys::utsname::uname()
            .map(|u| u.release().to_string_lossy().into_owned())
            .unwrap_or_default();
        let filesystems = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
        let modules = Path::new("/lib/modules").join(&release);
        if !kernel_has_nfs_client(&filesystems, &modules) {
            return Err(format!(
                "this host's kernel ({release}) has no NFS client (no nfs in /proc/filesystems, \
                 no {}/kernel/fs/nfs/nfs.ko): use --materializer fuse, or a kernel built with \
                 CONFIG_NFS_FS and CONFIG_NFS_V3",
                modules.display()
            ));
        }
        if !nix::unistd::geteuid().is_root() {
            return Err(
                "mounting an NFS export needs root (CAP_SYS_ADMIN in the initial user namespace)"
                    .into(),
            );
        }
        Ok(())
    }

    fn lower(
        &self,
        store: &Store,
        snapshot: &SnapshotId,
        asked: Choice<LowerKind>,
    ) -> Result<LowerPlan> {
        self.served.lower(store, snapshot, asked)
    }

    fn mount(&self, cx: &WorkspaceCtx<'_>) -> Result<()> {
        self.served.mount(cx)
    }

    fn unmount(&self, cx: &WorkspaceCtx<'_>, force: bool) -> Result<()> {
        self.served.unmount(cx, force)
    }

    fn is_mounted(&self, cx: &WorkspaceCtx<'_>) -> Result<bool> {
        self.served.is_mounted(cx)
    }

    fn changes_live_in(&self) -> ChangesLiveIn {
        ChangesLiveIn::Upper
    }

    fn settle(&self, cx: &WorkspaceCtx<'_>) -> Result<()> {
        self.served.settle(cx)
    }

    fn served_by_daemon(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_nfs_client_is_found_in_the_filesystems_or_the_modules() {
        let none = tempfile::tempdir().unwrap();
        assert!(!kernel_has_nfs_client(
            "nodev\tproc\nnodev\tfuse\n",
            none.path()
        ));
        assert!(kernel_has_nfs_client(
            "nodev\tproc\nnodev\tnfs\n",
            none.path()
        ));
        assert!(!kernel_has_nfs_client("nodev\tnfsd\n", none.path()));
        let m = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(m.path().join("kernel/fs/nfs")).unwrap();
        std::fs::write(m.path().join("kernel/fs/nfs/nfs.ko.xz"), b"").unwrap();
        assert!(kernel_has_nfs_client("", m.path()));
    }

    #[test]
    fn mounts_ask_both_programs_on_the_daemons_port_and_fail_instead_of_hanging() {
        let o = mount_options(2049);
        for want in [
            "vers=3",
            "port=2049",
            "mountport=2049",
            "nolock",
            "soft",
            "addr=127.0.0.1",
        ] {
            assert!(o.split(',').any(|w| w == want), "{want} in {o}");
        }
    }
}
