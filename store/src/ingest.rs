//! The ingest pipeline: hashing, chunking and compression on every core, joined by
//! bounded channels, feeding one pack writer thread.
//!
//! ```text
//! caller ──jobs (bounded)──▶ N workers ──objects (bounded)──▶ writer ──▶ packs
//!    ▲                          │
//!    └────── results ───────────┘   (one small record per file)
//! ```
//!
//! Every stage returns its `Result`; the first error wins and the session's packs are
//! removed. An object already in the index, or already claimed in this session, is
//! neither compressed nor written again.

use std::collections::HashSet;
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender, bounded, unbounded};
use rusqlite::Connection;

use crate::codec::{
    self, CDC_AVG_BYTES, CDC_MAX_BYTES, CDC_MIN_BYTES, Manifest, SINGLE_CHUNK_MAX_BYTES,
};
use crate::error::{Error, Result};
use crate::id::{ChunkId, ContentId};
use crate::index::{self, ObjectKind};
use crate::store::Store;
use crate::writer::{NewObject, PackWriter, Pending, discard};

/// Jobs waiting for a worker, per worker.
const JOBS_PER_WORKER: usize = 4;
/// Compressed objects waiting for the writer.
const MAX_QUEUED_OBJECTS: usize = 64;

/// A file's stored content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileContent {
    pub id: ContentId,
    pub size: u64,
}

enum Job {
    /// Read, chunk and store a file; report its content under `slot`.
    Path { slot: usize, path: PathBuf },
    /// Compress and store one chunk whose id the caller computed.
    Chunk { id: ChunkId, data: Vec<u8> },
}

/// Objects claimed by this session (so two workers never both compress one chunk).
type Claimed = Arc<Mutex<HashSet<[u8; 32]>>>;

struct Ctx {
    conn: Connection,
    compressor: zstd::bulk::Compressor<'static>,
    claimed: Claimed,
    objects: Sender<NewObject>,
}

impl Ctx {
    fn new(store: &Store, claimed: Claimed, objects: Sender<NewObject>) -> Result<Ctx> {
        let compressor =
            zstd::bulk::Compressor::new(store.config.zstd_level).map_err(|e| Error::Io {
                step: "start zstd",
                path: PathBuf::new(),
                source: e,
            })?;
        Ok(Ctx {
            conn: index::open_reader(&store.layout.index())?,
            compressor,
            claimed,
            objects,
        })
    }

    /// Stores an object unless it is stored already or claimed by this session.
    fn put(&mut self, kind: ObjectKind, id: [u8; 32], data: &[u8]) -> Result<()> {
        if !self
            .claimed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id)
        {
            return Ok(());
        }
        if index::contains(&self.conn, &id)? {
            return Ok(());
        }
        if data.len() > codec::MAX_OBJECT_BYTES {
            return Err(Error::Invalid(format!(
                "object of {} bytes is too large",
                data.len()
            )));
        }
        let (codec, stored) = codec::compress(&mut self.compressor, data);
        let obj = NewObject {
            id,
            kind,
            codec,
            raw_len: data.len() as u32,
            stored,
        };
        self.objects.send(obj).map_err(|_| Error::Io {
            step: "hand object to pack writer",
            path: PathBuf::new(),
            source: io::Error::other("writer stopped"),
        })
    }

    /// Chunks and stores everything `r` yields; `first` is what was already read of it.
    fn store_stream(&mut self, first: Vec<u8>, r: impl Read) -> Result<FileContent> {
        let reader = io::Cursor::new(first).chain(r);
        let mut hasher = blake3::Hasher::new();
        let mut chunks = Vec::new();
        let mut size = 0u64;
        for c in fastcdc::v2020::StreamCDC::new(reader, CDC_MIN_BYTES, CDC_AVG_BYTES, CDC_MAX_BYTES)
        {
            let c = c.map_err(|e| Error::Io {
                step: "read for chunking",
                path: PathBuf::new(),
                source: io::Error::other(e.to_string()),
            })?;
            hasher.update(&c.data);
            let id = ChunkId::of(&c.data);
            self.put(ObjectKind::Chunk, *id.as_bytes(), &c.data)?;
            chunks.push((id, c.length as u32));
            size += c.length as u64;
        }
        if chunks.len() <= 1 {
            let id = match chunks.first() {
                Some((id, _)) => ContentId::from(*id),
                None => self.store_small(&[])?.id,
            };
            return Ok(FileContent { id, size });
        }
        let id = ContentId::from_bytes(*hasher.finalize().as_bytes());
        let manifest = Manifest { size, chunks };
        self.put(ObjectKind::Manifest, *id.as_bytes(), &manifest.encode())?;
        Ok(FileContent { id, size })
    }

    fn store_small(&mut self, data: &[u8]) -> Result<FileContent> {
        let id = ChunkId::of(data);
        self.put(ObjectKind::Chunk, *id.as_bytes(), data)?;
        Ok(FileContent {
            id: id.into(),
            size: data.len() as u64,
        })
    }

    fn store_file(&mut self, path: &PathBuf) -> Result<FileContent> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(Error::io("open", path))?;
        let mut first = Vec::with_capacity(
            file.metadata()
                .map(|m| m.len().min(SINGLE_CHUNK_MAX_BYTES) as usize + 1)
                .unwrap_or(0),
        );
        let mut limited = (&file).take(SINGLE_CHUNK_MAX_BYTES + 1);
        limited
            .read_to_end(&mut first)
            .map_err(Error::io("read", path))?;
        if first.len() as u64 <= SINGLE_CHUNK_MAX_BYTES {
            return self.store_small(&first);
        }
        self.store_stream(first, io::BufReader::with_capacity(1 << 20, file))
            .map_err(|e| match e {
                Error::Io { step, source, .. } => Error::Io {
                    step,
                    path: path.clone(),
                    source,
                },
                e => e,
            })
    }
}

/// One write session: the pipeline plus the pack writer.
pub(crate) struct Ingest<'s> {
    store: &'s Store,
    jobs: Option<Sender<Job>>,
    results: Receiver<(usize, Result<FileContent>)>,
    workers: Vec<JoinHandle<Result<()>>>,
    writer: Option<JoinHandle<Result<Pending>>>,
    inline: Option<Ctx>,
    submitted: usize,
    received: usize,
}

impl<'s> Ingest<'s> {
    pub fn start(store: &'s Store) -> Result<Ingest<'s>> {
        let n = store.config.worker_count();
        let (job_tx, job_rx) = bounded::<Job>(n * JOBS_PER_WORKER);
        let (res_tx, res_rx) = unbounded();
        let (obj_tx, obj_rx) = bounded::<NewObject>(MAX_QUEUED_OBJECTS);
        let claimed: Claimed = Arc::default();

        let backend = store.backend.clone();
        let writer = std::thread::Builder::new()
            .name("cowspace-pack-writer".into())
            .spawn(move || {
                let mut w = PackWriter::new(backend);
                let mut failed = None;
                for obj in obj_rx {
                    if failed.is_none()
                        && let Err(e) = w.add(obj)
                    {
                        failed = Some(e);
                    }
                }
                match failed {
                    Some(e) => {
                        w.abort();
                        Err(e)
                    }
                    None => w.finish(),
                }
            })
            .map_err(Error::io("start thread", "pack writer"))?;

        let mut workers = Vec::with_capacity(n);
        for i in 0..n {
            let mut ctx = Ctx::new(store, claimed.clone(), obj_tx.clone())?;
            let jobs = job_rx.clone();
            let results = res_tx.clone();
            let h = std::thread::Builder::new()
                .name(format!("cowspace-ingest-{i}"))
                .spawn(move || -> Result<()> {
                    for job in jobs {
                        match job {
                            Job::Path { slot, path } => {
                                let r = ctx.store_file(&path);
                                let _ = results.send((slot, r));
                            }
                            Job::Chunk { id, data } => {
                                ctx.put(ObjectKind::Chunk, *id.as_bytes(), &data)?;
                            }
                        }
                    }
                    Ok(())
                })
                .map_err(Error::io("start thread", "ingest worker"))?;
            workers.push(h);
        }
        let inline = Ctx::new(store, claimed, obj_tx)?;
        Ok(Ingest {
            store,
            jobs: Some(job_tx),
            results: res_rx,
            workers,
            writer: Some(writer),
            inline: Some(inline),
            submitted: 0,
            received: 0,
        })
    }

    fn send(&self, job: Job) -> Result<()> {
        self.jobs
            .as_ref()
            .expect("session open")
            .send(job)
            .map_err(|_| Error::Io {
                step: "hand job to ingest workers",
                path: PathBuf::new(),
                source: io::Error::other("workers stopped"),
            })
    }

    /// Queues a file to be stored; its content arrives from [`Ingest::next_result`].
    pub fn submit_path(&mut self, slot: usize, path: PathBuf) -> Result<()> {
        self.submitted += 1;
        self.send(Job::Path { slot, path })
    }

    /// Results not yet taken.
    pub fn outstanding(&self) -> usize {
        self.submitted - self.received
    }

    /// Takes one finished file, if any is ready (`wait`: block until one is).
    pub fn next_result(&mut self, wait: bool) -> Option<(usize, Result<FileContent>)> {
        if self.outstanding() == 0 {
            return None;
        }
        let r = if wait {
            self.results.recv().ok()
        } else {
            self.results.try_recv().ok()
        };
        if r.is_some() {
            self.received += 1;
        }
        r
    }

    /// Stores a stream's bytes here (hashing on this thread, compression on the workers).
    pub fn store_reader(&mut self, mut r: impl Read, size_hint: u64) -> Result<FileContent> {
        let mut first = Vec::with_capacity(size_hint.min(SINGLE_CHUNK_MAX_BYTES) as usize + 1);
        (&mut r)
            .take(SINGLE_CHUNK_MAX_BYTES + 1)
            .read_to_end(&mut first)
            .map_err(Error::io("read", "stream"))?;
        if first.len() as u64 <= SINGLE_CHUNK_MAX_BYTES {
            let id = ChunkId::of(&first);
            let size = first.len() as u64;
            self.send(Job::Chunk { id, data: first })?;
            return Ok(FileContent {
                id: id.into(),
                size,
            });
        }
        // Large content: cut here, hand chunks to the workers, write the manifest inline.
        let reader = io::Cursor::new(first).chain(r);
        let mut hasher = blake3::Hasher::new();
        let mut chunks = Vec::new();
        let mut size = 0u64;
        for c in fastcdc::v2020::StreamCDC::new(reader, CDC_MIN_BYTES, CDC_AVG_BYTES, CDC_MAX_BYTES)
        {
            let c = c.map_err(|e| Error::Io {
                step: "read for chunking",
                path: PathBuf::from("stream"),
                source: io::Error::other(e.to_string()),
            })?;
            hasher.update(&c.data);
            let id = ChunkId::of(&c.data);
            chunks.push((id, c.length as u32));
            size += c.length as u64;
            self.send(Job::Chunk { id, data: c.data })?;
        }
        let id = ContentId::from_bytes(*hasher.finalize().as_bytes());
        let manifest = Manifest { size, chunks };
        self.put(ObjectKind::Manifest, *id.as_bytes(), &manifest.encode())?;
        Ok(FileContent { id, size })
    }

    /// Stores one object from this thread (trees, snapshots, manifests).
    pub fn put(&mut self, kind: ObjectKind, id: [u8; 32], data: &[u8]) -> Result<()> {
        self.inline
            .as_mut()
            .expect("session open")
            .put(kind, id, data)
    }

    fn shut_down(&mut self) -> Result<Pending> {
        self.jobs = None;
        let mut first_err = None;
        for w in self.workers.drain(..) {
            match w.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(_) => {
                    first_err.get_or_insert(Error::Io {
                        step: "ingest worker",
                        path: PathBuf::new(),
                        source: io::Error::other("panicked"),
                    });
                }
            }
        }
        self.inline = None; // closes the last object sender
        let pending = match self.writer.take().map(|w| w.join()) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(Error::Io {
                step: "pack writer",
                path: PathBuf::new(),
                source: io::Error::other("panicked"),
            }),
            None => Ok(Pending::default()),
        };
        match (first_err, pending) {
            (None, r) => r,
            (Some(e), Ok(p)) => {
                discard(self.store.backend.as_ref(), &p);
                Err(e)
            }
            (Some(e), Err(_)) => Err(e),
        }
    }

    /// Ends the session: every queued object is in a synced pack, ready to commit.
    pub fn finish(mut self) -> Result<Pending> {
        self.shut_down()
    }
}

impl Drop for Ingest<'_> {
    fn drop(&mut self) {
        if self.writer.is_some()
            && let Ok(p) = self.shut_down()
        {
            discard(self.store.backend.as_ref(), &p);
        }
    }
}
