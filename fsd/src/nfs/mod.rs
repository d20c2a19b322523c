//! The daemon's second protocol: a [`FileSystem`] core served over NFSv3 with its MOUNT
//! protocol (RFC 1813), on one TCP port of 127.0.0.1 (both programs on it: a client is
//! given `port` and `mountport`, no rpcbind). One listener per export; each connection
//! has a reading thread and a few answering its calls.
//!
//! The XDR types are `nfs3_types`'s; the server is written here (not `nfsserve`, its
//! forks or `fernfs`) because their filesystem traits cannot carry what the cores do:
//! hard links, listings resumed from any cookie, the caller's ids, handles of the
//! daemon's choosing; `docs/ARCHITECTURE.md` has the comparison.
//!
//! Who may use an export: only connections from the loopback address, and only with its
//! key, which is in its path (given to `MNT`) and in every handle; the key is random per
//! export and never listed (`EXPORT` answers an empty list). A sandbox's loopback is its
//! own network namespace's, so a worker cannot reach the port at all.

mod convert;
mod dirs;
mod handle;
mod mountd;
mod perm;
mod proc;
mod rpc;

use std::io::{BufReader, Cursor, Read};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use nfs3_types::rpc::{accept_stat_data, rejected_reply};

use crate::filesystem::{Context, FileSystem, lock};
pub use handle::Export;
use proc::{Nfs, NoAnswer};

/// Largest READ and WRITE (and listing reply) the server answers.
pub const MAX_IO: u32 = 1024 * 1024;

const NFS_PROGRAM: u32 = 100_003;
const MOUNT_PROGRAM: u32 = 100_005;

/// The open connections, by number.
type Conns = Arc<Mutex<std::collections::HashMap<u64, TcpStream>>>;

/// A served export; stops serving when dropped.
pub struct NfsServer {
    addr: SocketAddr,
    path: String,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
    /// Every connection, shut down when the server stops.
    conns: Conns,
}

fn random<const N: usize>() -> std::io::Result<[u8; N]> {
    let mut b = [0u8; N];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b)
}

impl NfsServer {
    /// A new export key (what [`NfsServer::serve`] takes to make the export's path and
    /// handles).
    pub fn new_key() -> std::io::Result<[u8; 16]> {
        random()
    }

    /// Serves `fs` on 127.0.0.1, port `port` (0: one the kernel picks), as the export
    /// of `key`: a server started again with the same key and port gives clients the
    /// same path and root handle.
    pub fn serve<F: FileSystem>(
        fs: Arc<F>,
        port: u16,
        key: [u8; 16],
    ) -> std::io::Result<NfsServer> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, port))?;
        let addr = listener.local_addr()?;
        let export = Export::new(key, random()?);
        let path = export.path();
        let nfs = Arc::new(Nfs { fs, export });
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let conns: Conns = Arc::default();
        let held = Arc::clone(&conns);
        let accept = std::thread::Builder::new()
            .name("nfs-accept".into())
            .spawn(move || {
                let mut next = 0u64;
                for conn in listener.incoming() {
                    if stopping.load(Ordering::Relaxed) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    match conn.peer_addr() {
                        Ok(peer) if peer.ip().is_loopback() => {}
                        other => {
                            tracing::warn!(peer = ?other, "NFS connection not from the loopback refused");
                            continue;
                        }
                    }
                    next += 1;
                    let id = next;
                    if let Ok(c) = conn.try_clone() {
                        lock(&held).insert(id, c);
                    }
                    let nfs = Arc::clone(&nfs);
                    let stopping = Arc::clone(&stopping);
                    let held = Arc::clone(&held);
                    let _ = std::thread::Builder::new()
                        .name("nfs-conn".into())
                        .spawn(move || {
                            serve_connection(&nfs, conn, &stopping);
                            lock(&held).remove(&id);
                        });
                }
            })?;
        Ok(NfsServer {
            addr,
            path,
            stop,
            accept: Some(accept),
            conns,
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The path `MNT` takes (a capability: whoever knows it can use the export).
    pub fn export_path(&self) -> &str {
        &self.path
    }
}

impl Drop for NfsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the accept loop, which sees the flag.
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        for (_, c) in lock(&self.conns).drain() {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// Calls of one connection answered at once (the Linux client sends many before the
/// first reply; RPC replies go by xid, in any order).
const WORKERS_PER_CONNECTION: usize = 4;

/// Answers the calls of one connection until it closes, sends what is not a call, or
/// the server stops: one thread reads records, [`WORKERS_PER_CONNECTION`] answer them.
fn serve_connection<F: FileSystem>(nfs: &Nfs<F>, conn: TcpStream, stop: &AtomicBool) {
    let _ = conn.set_nodelay(true);
    let Ok(writer) = conn.try_clone() else {
        return;
    };
    let writer = Mutex::new(writer);
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(WORKERS_PER_CONNECTION * 4);
    let rx = Mutex::new(rx);
    std::thread::scope(|scope| {
        for _ in 0..WORKERS_PER_CONNECTION {
            scope.spawn(|| {
                loop {
                    // The lock is held only while waiting for the next record.
                    let Ok(record) = lock(&rx).recv() else {
                        return;
                    };
                    let reply = match answer(nfs, &record) {
                        Some(r) => r,
                        None => {
                            tracing::debug!("not an RPC call; NFS connection closed");
                            let _ = lock(&writer).shutdown(std::net::Shutdown::Both);
                            return;
                        }
                    };
                    if rpc::write_record(&mut *lock(&writer), &reply).is_err() {
                        return;
                    }
                }
            });
        }
        let mut reader = BufReader::with_capacity(256 * 1024, conn);
        while !stop.load(Ordering::Relaxed) {
            match rpc::read_record(&mut reader) {
                Ok(Some(r)) => {
                    if tx.send(r).is_err() {
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(error = %e, "NFS connection closed");
                    break;
                }
            }
        }
        drop(tx);
    });
}

/// The reply to one record; `None` when it is not an RPC call at all.
fn answer<F: FileSystem>(nfs: &Nfs<F>, record: &[u8]) -> Option<Vec<u8>> {
    let call = match rpc::parse_call(record) {
        Ok(c) => c,
        Err(rpc::Refused::Garbage) => return None,
        Err(rpc::Refused::Denied { xid, why }) => return Some(rpc::reply_header(xid, Err(why))),
    };
    let ctx = Context {
        uid: call.caller.uid,
        gid: call.caller.gid,
        pid: 0,
    };
    let mut cur = Cursor::new(record);
    cur.set_position(call.args_at as u64);
    let mut results = Vec::new();
    let done = match (call.prog, call.vers) {
        (NFS_PROGRAM, 3) => {
            // A panic in a core answers this call with a server error, not the daemon's end.
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                nfs.call(call.proc, &call.caller, &ctx, &mut cur, &mut results)
            }))
            .unwrap_or_else(|_| {
                results.clear();
                Err(NoAnswer::Garbage)
            })
        }
        (MOUNT_PROGRAM, 3) => nfs.mount(call.proc, &mut cur, &mut results),
        (NFS_PROGRAM | MOUNT_PROGRAM, _) => {
            let data = accept_stat_data::PROG_MISMATCH { low: 3, high: 3 };
            return Some(rpc::reply_header(call.xid, Ok(data)));
        }
        _ => {
            return Some(rpc::reply_header(
                call.xid,
                Ok(accept_stat_data::PROG_UNAVAIL),
            ));
        }
    };
    let data = match done {
        Ok(()) => accept_stat_data::SUCCESS,
        Err(NoAnswer::Garbage) => accept_stat_data::GARBAGE_ARGS,
        Err(NoAnswer::Unavailable) => accept_stat_data::PROC_UNAVAIL,
    };
    let ok = matches!(data, accept_stat_data::SUCCESS);
    let mut reply = rpc::reply_header(call.xid, Ok::<_, rejected_reply>(data));
    if ok {
        reply.extend_from_slice(&results);
    }
    Some(reply)
}
