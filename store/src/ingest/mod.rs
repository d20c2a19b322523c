//! The ingest pipeline: hashing, chunking and compression on every core, joined by
//! bounded channels, feeding one pack writer thread.
//!
//! ```text
//!             ┌──file batches (bounded)──▶ N workers ──object batches (bounded)──▶ writer ──▶ packs
//! caller ─────┤                             ▲    │ │
//!   ▲         └──objects (bounded)──────────┘    │ └─▶ objects (chunks of large files)
//!   └──────────── results (one small record per file, per batch) ◀─┘
//! ```
//!
//! Files go to the workers in batches (up to [`FILES_PER_BATCH`] files or
//! [`BATCH_BYTES`]), so a small file costs no channel hand-off of its own. A worker reads
//! a file, hashes it and, for a file larger than one chunk, cuts it with FastCDC and
//! hashes every chunk; it then offers the new chunks, in runs of up to 1 MiB compressed
//! as one group (`crate::group`), to the shared *objects* queue, which every worker
//! serves before taking more files, so the compression of one large file is spread over
//! all cores. When that queue is full the worker compresses the run itself (never
//! blocking on its own peers, so the queues cannot deadlock). Small chunks are gathered
//! per worker into groups of 64 KiB. Trees, snapshots and the chunks of streamed content
//! go through the same queue from the caller.
//!
//! Every stage returns its `Result`; the first error wins and the session's packs are
//! removed. An object already in the index, or already claimed in this session, is
//! neither compressed nor written again. When the index held no object at all when the
//! session started (a first import), the per-object index lookups are skipped: the
//! session's own claim set is then the whole truth, except for objects a concurrent
//! session commits meanwhile, which two overlapping sessions may both write whether or
//! not this shortcut is taken (the index keeps one row; gc drops the other copy).

mod worker;

use worker::{Ctx, chunk_stream, hand_over, stopped};

use std::collections::{HashSet, VecDeque};
use std::ffi::OsString;
use std::fs::File;
use std::io::{self, Read};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender, bounded, unbounded};

use crate::codec::SINGLE_CHUNK_MAX_BYTES;
use crate::error::{Error, Result};
use crate::id::{ChunkId, ContentId};
use crate::index::{self, ObjectKind};
use crate::store::Store;
use crate::writer::{NewObject, PackWriter, Pending, discard};

/// A batch of files handed to one worker ends at this many files...
pub(crate) const FILES_PER_BATCH: usize = 32;
/// ...or once its files' sizes (as the caller's stat saw them) reach this many bytes.
pub(crate) const BATCH_BYTES: u64 = 4 * 1024 * 1024;
/// File batches waiting for a worker, per worker (paths only: a few KiB each).
const BATCHES_PER_WORKER: usize = 2;
/// Object batches waiting for any worker to compress them, per worker. A batch is a run
/// of a large file's chunks (up to [`RUN_BYTES`], 1 MiB, plus one chunk) or the caller's
/// objects gathered up to [`CALLER_BATCH_BYTES`] (plus one object), so this holds at
/// most about 10 MiB per worker.
const OBJECTS_PER_WORKER: usize = 8;
/// The caller's objects (trees, manifests, streamed chunks) go to the workers in
/// batches of up to this many bytes...
const CALLER_BATCH_BYTES: usize = 256 * 1024;
/// ...or this many objects (a tree is often a few hundred bytes).
const CALLER_BATCH_OBJECTS: usize = 64;
/// A worker hands its compressed objects to the writer in batches of about this size.
const WRITER_BATCH_BYTES: usize = 1024 * 1024;
/// Object batches waiting for the pack writer (so at most about 16 MiB plus one object
/// per batch).
const MAX_QUEUED_WRITER_BATCHES: usize = 16;
/// Index lookups a worker makes inside one SQLite read transaction (one lock round trip
/// per transaction instead of per lookup); the transaction also ends whenever the
/// worker runs out of work.
const LOOKUPS_PER_READ_TXN: usize = 1024;

/// A file's stored content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileContent {
    pub id: ContentId,
    pub size: u64,
}

/// Extended attributes of a file, sorted by name.
pub(crate) use crate::xattrs::Xattrs;

/// A file for the workers to read.
pub(crate) struct FileJob {
    /// Where its result goes (see [`Ingest::next_result`]).
    pub slot: usize,
    /// Its path: opened when `at` is not given, and named in errors.
    pub path: PathBuf,
    /// Its directory, already open, and its name there: the file is opened relative to
    /// it, which spares the kernel a walk of the whole path per file.
    pub at: Option<(Arc<File>, OsString)>,
    /// Also read its recorded extended attributes (from the open file).
    pub xattrs: bool,
    /// The file is a git loose object: what is stored is the blob it holds, inflated
    /// here (see [`crate::gitloose`]).
    pub git_loose: bool,
    /// Not a file: a git blob read from its repository's object database here (see
    /// [`crate::gitpack`]); `path` names it in errors.
    pub git_object: Option<crate::gitpack::Wanted>,
}

type FileResult = (usize, Result<(FileContent, Xattrs)>);

/// Work for any worker.
enum Obj {
    /// An object of the caller's, to store unless it is stored or claimed already.
    Put {
        kind: ObjectKind,
        id: [u8; 32],
        data: Vec<u8>,
    },
    /// A run of one large file's chunks, claimed by this session and known to be
    /// missing from the index: only compression, as one group, is left to do.
    Run(Vec<([u8; 32], Vec<u8>)>),
}

/// Objects claimed by this session (so two workers never both compress one chunk).
type Claimed = Arc<Mutex<HashSet<[u8; 32]>>>;
/// Objects quarantined by `fsck --repair`: stored, but not to be trusted (see
/// [`crate::repair`]); a session writes them again from its own bytes.
type Suspects = Arc<HashSet<[u8; 32]>>;

/// One write session: the pipeline plus the pack writer.
pub(crate) struct Ingest<'s> {
    store: &'s Store,
    files: Option<Sender<Vec<FileJob>>>,
    objects: Option<Sender<Vec<Obj>>>,
    /// Objects put by the caller not yet handed over, and their bytes.
    objs: Vec<Obj>,
    objs_bytes: usize,
    results: Receiver<Vec<FileResult>>,
    workers: Vec<JoinHandle<Result<()>>>,
    writer: Option<JoinHandle<Result<Pending>>>,
    /// Files not yet handed over, and their sizes' sum.
    batch: Vec<FileJob>,
    batch_bytes: u64,
    /// Results received and not yet taken.
    ready: VecDeque<FileResult>,
    submitted: usize,
    received: usize,
}

impl<'s> Ingest<'s> {
    pub fn start(store: &'s Store) -> Result<Ingest<'s>> {
        let n = store.config.worker_count();
        let (file_tx, file_rx) = bounded::<Vec<FileJob>>(n * BATCHES_PER_WORKER);
        let (obj_tx, obj_rx) = bounded::<Vec<Obj>>(n * OBJECTS_PER_WORKER);
        let (res_tx, res_rx) = unbounded();
        let (out_tx, out_rx) = bounded::<Vec<NewObject>>(MAX_QUEUED_WRITER_BATCHES);
        let claimed: Claimed = Arc::default();
        let check_index = store.with_reader(index::has_objects)?;
        let suspects: Suspects = Arc::new(match check_index {
            true => store.suspects()?,
            false => HashSet::new(),
        });

        let backend = store.backend.clone();
        let writer = std::thread::Builder::new()
            .name("cowspace-pack-writer".into())
            .spawn(move || {
                let mut w = PackWriter::new(backend);
                let mut failed = None;
                for obj in out_rx.iter().flatten() {
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
            let ctx = Ctx::new(
                store,
                check_index,
                claimed.clone(),
                suspects.clone(),
                obj_tx.clone(),
                out_tx.clone(),
            )?;
            let (files, objects, results) = (file_rx.clone(), obj_rx.clone(), res_tx.clone());
            let h = std::thread::Builder::new()
                .name(format!("cowspace-ingest-{i}"))
                .spawn(move || ctx.run(files, objects, results))
                .map_err(Error::io("start thread", "ingest worker"))?;
            workers.push(h);
        }
        Ok(Ingest {
            store,
            files: Some(file_tx),
            objects: Some(obj_tx),
            objs: Vec::new(),
            objs_bytes: 0,
            results: res_rx,
            workers,
            writer: Some(writer),
            batch: Vec::new(),
            batch_bytes: 0,
            ready: VecDeque::new(),
            submitted: 0,
            received: 0,
        })
    }

    /// Hands the files gathered so far to the workers.
    fn flush_batch(&mut self) -> Result<()> {
        if self.batch.is_empty() {
            return Ok(());
        }
        self.batch_bytes = 0;
        let batch = std::mem::take(&mut self.batch);
        let step = "hand files to ingest workers";
        // No sender: the session was shut down, as good as workers that stopped.
        self.files
            .as_ref()
            .ok_or_else(|| stopped(step, "workers"))?
            .send(batch)
            .map_err(|_| stopped(step, "workers"))
    }

    /// Queues a file to be stored; its content arrives from [`Ingest::next_result`].
    /// `size` is what the caller's stat saw (`u64::MAX` when not known: the file is
    /// handed over at once).
    pub fn submit_path(&mut self, slot: usize, path: PathBuf, size: u64) -> Result<()> {
        let job = FileJob {
            slot,
            path,
            at: None,
            xattrs: false,
            git_loose: false,
            git_object: None,
        };
        self.submit(job, size)
    }

    /// Queues a file to be stored, as [`Ingest::submit_path`].
    pub fn submit(&mut self, job: FileJob, size: u64) -> Result<()> {
        self.submitted += 1;
        self.batch.push(job);
        self.batch_bytes = self.batch_bytes.saturating_add(size);
        if self.batch.len() >= FILES_PER_BATCH || self.batch_bytes >= BATCH_BYTES {
            self.flush_batch()?;
        }
        Ok(())
    }

    /// Results not yet taken.
    pub fn outstanding(&self) -> usize {
        self.submitted - self.received
    }

    /// Takes one finished file, if any is ready (`wait`: hand over the files still
    /// gathered and block until one is), with the xattrs read if the job asked for them.
    pub fn next_result(&mut self, wait: bool) -> Option<FileResult> {
        if self.outstanding() == 0 {
            return None;
        }
        if self.ready.is_empty() {
            let got = if wait {
                if let Err(e) = self.flush_batch() {
                    // The workers are gone: report it against the files still owed.
                    self.received = self.submitted;
                    return Some((self.batch.first().map_or(0, |b| b.slot), Err(e)));
                }
                self.results.recv().ok()
            } else {
                self.results.try_recv().ok()
            };
            self.ready.extend(got.into_iter().flatten());
        }
        let r = self.ready.pop_front();
        if r.is_some() {
            self.received += 1;
        }
        r
    }

    /// Queues one object for the workers (trees, snapshots, manifests, streamed chunks).
    pub fn put(&mut self, kind: ObjectKind, id: [u8; 32], data: &[u8]) -> Result<()> {
        self.put_owned(kind, id, data.to_vec())
    }

    /// Queues one object, as [`Ingest::put`], without a copy.
    pub fn put_owned(&mut self, kind: ObjectKind, id: [u8; 32], data: Vec<u8>) -> Result<()> {
        self.objs_bytes += data.len();
        self.objs.push(Obj::Put { kind, id, data });
        if self.objs.len() >= CALLER_BATCH_OBJECTS || self.objs_bytes >= CALLER_BATCH_BYTES {
            self.flush_objects()?;
        }
        Ok(())
    }

    /// Hands the objects put so far to the workers.
    fn flush_objects(&mut self) -> Result<()> {
        let step = "hand objects to ingest workers";
        // No sender: the session was shut down, as good as workers that stopped.
        let to = self
            .objects
            .as_ref()
            .ok_or_else(|| stopped(step, "workers"))?;
        hand_over(&mut self.objs, &mut self.objs_bytes, to, step, "workers")
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
            self.put_owned(ObjectKind::Chunk, *id.as_bytes(), first)?;
            return Ok(FileContent {
                id: id.into(),
                size,
            });
        }
        // Large content: cut here, hand chunks to the workers, then the manifest.
        let reader = io::Cursor::new(first).chain(r);
        let (id, manifest) = chunk_stream(reader, PathBuf::from("stream"), |id, data| {
            self.put_owned(ObjectKind::Chunk, *id.as_bytes(), data)
        })?;
        let size = manifest.size;
        self.put_owned(ObjectKind::Manifest, *id.as_bytes(), manifest.encode())?;
        Ok(FileContent { id, size })
    }

    fn shut_down(&mut self) -> Result<Pending> {
        self.files = None;
        self.objects = None;
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
        self.flush_batch()?;
        self.flush_objects()?;
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
