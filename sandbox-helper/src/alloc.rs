//! Host-wide leases: a dedicated host uid range and unique published ports per sandbox.
//!
//! A lease is an exclusive `flock` on a file under the state directory, held for the
//! sandbox's lifetime. The kernel drops the lock when the helper exits, however it exits,
//! so a crash never leaves a stale lease behind, and two helpers sharing a state
//! directory can never hold the same uid range or port.

use std::fs::{File, OpenOptions};
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use crate::error::{Error, Result};

/// First host uid (and gid) handed to sandboxes; far above any regular account.
pub const HOST_ID_BASE: u32 = 1_000_000_000;
/// Ids per sandbox: inside ids 0..65535 map to `base..base+65535`.
pub const IDS_PER_SANDBOX: u32 = 65_536;
/// Number of uid ranges, i.e. most sandboxes at once on one host.
pub const MAX_ID_SLOTS: u32 = 4_096;
/// Host ports handed out by `--publish` (below Linux's default ephemeral range).
pub const PUBLISH_PORTS: std::ops::RangeInclusive<u16> = 20_000..=32_767;
/// Most ports tried per `--publish` before giving up.
pub const MAX_PORT_PROBES: usize = 512;

/// A leased host uid/gid range.
#[derive(Debug)]
pub struct IdLease {
    /// Slot number.
    pub slot: u32,
    _lock: Flock<File>,
}

impl IdLease {
    /// First host id of the range (inside id 0 maps here).
    pub fn base(&self) -> u32 {
        HOST_ID_BASE + self.slot * IDS_PER_SANDBOX
    }
}

/// A leased host port, already bound on 127.0.0.1.
#[derive(Debug)]
pub struct PortLease {
    /// The port inside the sandbox.
    pub internal: u16,
    /// The host port on 127.0.0.1.
    pub host: u16,
    /// The bound listener (kept from the bind check, so nobody can take the port).
    pub listener: TcpListener,
    _lock: Flock<File>,
}

/// A leased host port whose listener was closed, for a forwarder that binds the port
/// itself (qemu's `hostfwd`): the lock stays, so no other sandbox is given the port.
#[derive(Debug)]
pub struct HeldPort {
    /// The port inside the sandbox.
    pub internal: u16,
    /// The host port on 127.0.0.1.
    pub host: u16,
    _lock: Flock<File>,
}

impl PortLease {
    /// Closes the listener and keeps the lease.
    pub fn into_held(self) -> HeldPort {
        drop(self.listener);
        HeldPort {
            internal: self.internal,
            host: self.host,
            _lock: self._lock,
        }
    }
}

fn start_index(key: impl Hash, modulo: u64) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    std::process::id().hash(&mut h);
    h.finish() % modulo
}

fn lock_dir(state: &Path, sub: &str) -> Result<PathBuf> {
    let dir = state.join(sub);
    std::fs::create_dir_all(&dir).map_err(|source| Error::StateDir {
        path: dir.clone(),
        source,
    })?;
    Ok(dir)
}

/// Tries to take the lock at `path`; `Ok(None)` when someone else holds it.
fn try_lock(path: &Path) -> Result<Option<Flock<File>>> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|source| Error::StateDir {
            path: path.to_path_buf(),
            source,
        })?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Ok(Some(lock)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, e)) => Err(Error::StateDir {
            path: path.to_path_buf(),
            source: e.into(),
        }),
    }
}

/// Leases a uid range for sandbox `name`, probing slots from one derived from the name.
pub fn lease_ids(state: &Path, name: &str) -> Result<IdLease> {
    let dir = lock_dir(state, "ids")?;
    let first = start_index(name, MAX_ID_SLOTS as u64) as u32;
    for i in 0..MAX_ID_SLOTS {
        let slot = (first + i) % MAX_ID_SLOTS;
        if let Some(lock) = try_lock(&dir.join(format!("{slot}.lock")))? {
            return Ok(IdLease { slot, _lock: lock });
        }
    }
    Err(Error::Busy(format!(
        "all {MAX_ID_SLOTS} host uid ranges are leased"
    )))
}

/// Leases one unique, bound host port on 127.0.0.1 for each of `internal`.
pub fn lease_ports(state: &Path, name: &str, internal: &[u16]) -> Result<Vec<PortLease>> {
    let dir = lock_dir(state, "ports")?;
    let span = (*PUBLISH_PORTS.end() - *PUBLISH_PORTS.start()) as u64 + 1;
    let mut leases: Vec<PortLease> = Vec::new();
    for &port in internal {
        let first = start_index((name, port), span);
        let mut found = None;
        for i in 0..MAX_PORT_PROBES as u64 {
            let host = *PUBLISH_PORTS.start() + ((first + i) % span) as u16;
            let Some(mut lock) = try_lock(&dir.join(format!("{host}.lock")))? else {
                continue;
            };
            // The bind is the check that nothing else on the host uses the port.
            let Ok(listener) = TcpListener::bind((Ipv4Addr::LOCALHOST, host)) else {
                continue;
            };
            let note = format!("{name} {port} {}\n", std::process::id());
            lock.set_len(0)
                .and_then(|()| lock.write_all(note.as_bytes()))
                .map_err(|source| Error::StateDir {
                    path: dir.join(format!("{host}.lock")),
                    source,
                })?;
            found = Some(PortLease {
                internal: port,
                host,
                listener,
                _lock: lock,
            });
            break;
        }
        let lease = found.ok_or_else(|| {
            Error::Busy(format!(
                "no free host port for --publish {port} after {MAX_PORT_PROBES} tries"
            ))
        })?;
        leases.push(lease);
    }
    Ok(leases)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_leases_never_share_a_range_and_a_dropped_one_is_reusable() {
        let tmp = tempfile::tempdir().unwrap();
        let a = lease_ids(tmp.path(), "same").unwrap();
        let b = lease_ids(tmp.path(), "same").unwrap();
        assert_ne!(a.slot, b.slot);
        assert!(b.base().abs_diff(a.base()) >= IDS_PER_SANDBOX);
        let slot = a.slot;
        drop(a);
        let c = lease_ids(tmp.path(), "same").unwrap();
        assert_eq!(c.slot, slot, "the first slot is free again");
    }

    #[test]
    fn two_port_leases_for_the_same_internal_port_differ_and_are_bound() {
        let tmp = tempfile::tempdir().unwrap();
        let a = lease_ports(tmp.path(), "w", &[3000]).unwrap();
        let b = lease_ports(tmp.path(), "w", &[3000]).unwrap();
        assert_ne!(a[0].host, b[0].host);
        assert!(PUBLISH_PORTS.contains(&a[0].host));
        assert!(
            TcpListener::bind((Ipv4Addr::LOCALHOST, a[0].host)).is_err(),
            "port not held"
        );
    }
}
