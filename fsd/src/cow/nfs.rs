//! Workspaces served over NFS ([`crate::nfs`]): the export of a workspace's core
//! ([`CowNfs`]), and an `nfs` workspace, that export mounted by the kernel's client.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};

use cowspace_store::{SnapshotId, Store};

use super::{OpenMode, fs, open_core, ops};
use crate::error::{Error, Result};
use crate::registry::Record;

/// A workspace served over NFSv3 on 127.0.0.1 ([`crate::nfs`]); stops serving on drop.
pub struct CowNfs {
    server: crate::nfs::NfsServer,
    cow: Arc<ops::Cow>,
}

impl CowNfs {
    /// Serves the workspace of `snapshot` with private state in `private_dir` on `port`
    /// of 127.0.0.1 (0: the port it was served on before, else one the kernel picks).
    /// I/O goes by inode, as in the cached open mode. The export's key and port are kept
    /// in `private_dir/nfs-export`, so serving it again gives clients the same path and
    /// root handle.
    pub fn serve(
        store: Arc<Store>,
        snapshot: SnapshotId,
        private_dir: &Path,
        port: u16,
    ) -> Result<CowNfs> {
        let cow = open_core(store, snapshot, private_dir)?;
        let fs = fs::CowFs::new(
            Arc::clone(&cow),
            OpenMode::Cached,
            false,
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU64::new(0)),
            false,
        );
        let record = private_dir.join("nfs-export");
        let served = (|| {
            let (key, was) = match read_export(&record)? {
                Some((key, was)) => (key, was),
                None => (crate::nfs::NfsServer::new_key()?, 0),
            };
            let port = if port == 0 { was } else { port };
            let server = crate::nfs::NfsServer::serve(Arc::new(fs), port, key)?;
            let tmp = private_dir.join("nfs-export.tmp");
            std::fs::write(
                &tmp,
                format!("{} {}\n", hex::encode(key), server.addr().port()),
            )?;
            std::fs::rename(&tmp, &record)?;
            Ok(server)
        })();
        let server = served.map_err(|e| {
            cow.lazy.stop();
            Error::Io {
                step: "serve the workspace over NFS from",
                path: private_dir.to_path_buf(),
                source: e,
            }
        })?;
        Ok(CowNfs { server, cow })
    }

    pub fn addr(&self) -> std::net::SocketAddr {
        self.server.addr()
    }

    /// The path a client mounts (`MNT`): a capability.
    pub fn export_path(&self) -> &str {
        self.server.export_path()
    }

    /// Finishes every copy-up in progress: diff and commit read the upper directly.
    pub fn finish_copies(&self) -> Result<()> {
        self.cow
            .lazy
            .finish_all()
            .map_err(Error::io("finish copy-ups in", &self.cow.layers.upper))
    }
}

/// The key and port a workspace was exported with, if it was.
fn read_export(record: &Path) -> std::io::Result<Option<([u8; 16], u16)>> {
    let text = match std::fs::read_to_string(record) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let bad = || {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "{}: not \"KEY PORT\"; remove it to export the workspace under a new key",
                record.display()
            ),
        )
    };
    let (key, port) = text.trim().split_once(' ').ok_or_else(bad)?;
    let key: [u8; 16] = hex::decode(key)
        .ok()
        .and_then(|k| k.try_into().ok())
        .ok_or_else(bad)?;
    Ok(Some((key, port.parse().map_err(|_| bad())?)))
}

impl Drop for CowNfs {
    fn drop(&mut self) {
        // The copier stops between two batches; what is left stays recorded.
        self.cow.lazy.stop();
    }
}

/// An `nfs` workspace: its export, mounted at its path; unmounted (lazily if busy) and no
/// longer served on drop.
pub(super) struct NfsMount {
    pub(super) served: CowNfs,
    path: PathBuf,
}

impl NfsMount {
    pub(super) fn mount(store: Arc<Store>, rec: &Record) -> Result<NfsMount> {
        let snapshot: SnapshotId = rec.snapshot.parse()?;
        let served = CowNfs::serve(store, snapshot, &rec.private_dir, 0)?;
        let source = format!("127.0.0.1:{}", served.export_path());
        let options = cowspace::materializer::nfs::mount_options(served.addr().port());
        nix::mount::mount(
            Some(source.as_str()),
            &rec.path,
            Some("nfs"),
            nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
            Some(options.as_str()),
        )
        .map_err(|e| Error::Io {
            step: "mount the workspace's NFS export at",
            path: rec.path.clone(),
            source: e.into(),
        })?;
        Ok(NfsMount {
            served,
            path: rec.path.clone(),
        })
    }
}

impl Drop for NfsMount {
    fn drop(&mut self) {
        if crate::mounts::is_mounted(&self.path).unwrap_or(false)
            && crate::mounts::unmount(&self.path).is_err()
        {
            let _ = crate::mounts::unmount_lazy(&self.path);
        }
        // Then `served` stops (dropped after this): nothing is mounted from it any more.
    }
}
