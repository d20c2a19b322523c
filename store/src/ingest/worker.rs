//! The ingest workers: each reads files or takes the caller's objects, chunks,
//! deduplicates against the index and what this session claimed, compresses, and hands
//! finished groups to the pack writer ([`super::Ingest`] is the session side).

use super::{
    Claimed, FileContent, FileJob, FileResult, LOOKUPS_PER_READ_TXN, Obj, Suspects,
    WRITER_BATCH_BYTES, Xattrs,
};

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use crossbeam_channel::{Receiver, Sender, TryRecvError, TrySendError};
use rusqlite::Connection;

use crate::codec::{
    self, CDC_AVG_BYTES, CDC_MAX_BYTES, CDC_MIN_BYTES, Manifest, SINGLE_CHUNK_MAX_BYTES,
};
use crate::error::{Error, Result};
use crate::group::{Grouper, RUN_BYTES};
use crate::id::{ChunkId, ContentId};
use crate::index::{self, ObjectKind};
use crate::store::Store;
use crate::writer::NewObject;

pub(super) struct Ctx {
    /// `None` when the index was empty at the start of the session.
    conn: Option<Connection>,
    /// Lookups made in the open read transaction (0: none open).
    lookups: usize,
    compressor: zstd::bulk::Compressor<'static>,
    /// Small chunks waiting to be compressed together.
    group: Grouper,
    /// The claimed chunks of the large file being read, not yet handed on.
    run: Grouper,
    /// This worker's handle on a git object database.
    git: crate::gitpack::Reader,
    claimed: Claimed,
    suspects: Suspects,
    /// Where chunks of large files are offered to the other workers.
    offload: Sender<Vec<Obj>>,
    writer: Sender<Vec<NewObject>>,
    out: Vec<NewObject>,
    out_bytes: usize,
}

pub(super) fn stopped(step: &'static str, what: &str) -> Error {
    Error::Io {
        step,
        path: PathBuf::new(),
        source: io::Error::other(format!("{what} stopped")),
    }
}

/// Cuts `reader` into content-defined chunks, handing each to `put` in order: the
/// whole content's id and its manifest. A read error is reported at `path`.
pub(super) fn chunk_stream(
    reader: impl Read,
    path: PathBuf,
    mut put: impl FnMut(ChunkId, Vec<u8>) -> Result<()>,
) -> Result<(ContentId, Manifest)> {
    let mut hasher = blake3::Hasher::new();
    let mut manifest = Manifest {
        size: 0,
        chunks: Vec::new(),
    };
    for c in fastcdc::v2020::StreamCDC::new(reader, CDC_MIN_BYTES, CDC_AVG_BYTES, CDC_MAX_BYTES) {
        let c = c.map_err(|e| Error::Io {
            step: "read for chunking",
            path: path.clone(),
            source: io::Error::other(e.to_string()),
        })?;
        hasher.update(&c.data);
        let id = ChunkId::of(&c.data);
        manifest.chunks.push((id, c.length as u32));
        manifest.size += c.length as u64;
        put(id, c.data)?;
    }
    Ok((
        ContentId::from_bytes(*hasher.finalize().as_bytes()),
        manifest,
    ))
}

/// Sends a non-empty `batch` to the next stage, leaving it empty and its byte count 0.
pub(super) fn hand_over<T>(
    batch: &mut Vec<T>,
    bytes: &mut usize,
    to: &Sender<Vec<T>>,
    step: &'static str,
    stage: &str,
) -> Result<()> {
    if batch.is_empty() {
        return Ok(());
    }
    *bytes = 0;
    to.send(std::mem::take(batch))
        .map_err(|_| stopped(step, stage))
}

impl Ctx {
    pub(super) fn new(
        store: &Store,
        check_index: bool,
        claimed: Claimed,
        suspects: Suspects,
        offload: Sender<Vec<Obj>>,
        writer: Sender<Vec<NewObject>>,
    ) -> Result<Ctx> {
        let compressor =
            zstd::bulk::Compressor::new(store.config.zstd_level).map_err(|e| Error::Io {
                step: "start zstd",
                path: PathBuf::new(),
                source: e,
            })?;
        let conn = match check_index {
            true => Some(index::open_reader(&store.layout.index())?),
            false => None,
        };
        Ok(Ctx {
            conn,
            lookups: 0,
            compressor,
            group: Grouper::default(),
            run: Grouper::new(RUN_BYTES),
            git: Default::default(),
            claimed,
            suspects,
            offload,
            writer,
            out: Vec::new(),
            out_bytes: 0,
        })
    }

    /// Whether the index holds `id` (batched into read transactions).
    fn indexed(&mut self, id: &[u8; 32]) -> Result<bool> {
        let Some(conn) = &self.conn else {
            return Ok(false);
        };
        if self.suspects.contains(id) {
            return Ok(false);
        }
        if self.lookups == 0 {
            conn.execute_batch("BEGIN")
                .map_err(Error::db("begin index lookups"))?;
        }
        self.lookups += 1;
        let found = index::contains(conn, id)?;
        if self.lookups >= LOOKUPS_PER_READ_TXN {
            self.end_lookups()?;
        }
        Ok(found)
    }

    fn end_lookups(&mut self) -> Result<()> {
        if self.lookups > 0
            && let Some(conn) = &self.conn
        {
            self.lookups = 0;
            conn.execute_batch("COMMIT")
                .map_err(Error::db("end index lookups"))?;
        }
        Ok(())
    }

    /// Claims an object for this session: false if it is stored already or claimed.
    fn claim(&mut self, id: &[u8; 32]) -> Result<bool> {
        if !self
            .claimed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(*id)
        {
            return Ok(false);
        }
        Ok(!self.indexed(id)?)
    }

    /// Stores an object unless it is stored already or claimed by this session.
    fn put(&mut self, kind: ObjectKind, id: [u8; 32], data: Vec<u8>) -> Result<()> {
        if !self.claim(&id)? {
            return Ok(());
        }
        self.compress(kind, id, data)
    }

    /// Compresses a claimed object and queues it for the writer.
    fn compress(&mut self, kind: ObjectKind, id: [u8; 32], data: Vec<u8>) -> Result<()> {
        if data.len() > codec::MAX_OBJECT_BYTES {
            return Err(Error::Invalid(format!(
                "object of {} bytes is too large",
                data.len()
            )));
        }
        if Grouper::takes(kind, data.len()) {
            if self.group.push(id, data) {
                self.close_group()?;
            }
            return Ok(());
        }
        let raw_len = data.len() as u32;
        let (codec, stored) = codec::compress(&mut self.compressor, data);
        self.queue(NewObject {
            id,
            kind,
            codec,
            raw_len,
            stored,
            members: Vec::new(),
        })
    }

    /// Compresses the small chunks gathered so far and queues them for the writer.
    fn close_group(&mut self) -> Result<()> {
        for o in self.group.take(&mut self.compressor) {
            self.queue(o)?;
        }
        Ok(())
    }

    fn queue(&mut self, o: NewObject) -> Result<()> {
        self.out_bytes += o.stored.len();
        self.out.push(o);
        if self.out_bytes >= WRITER_BATCH_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    /// Hands the compressed objects to the writer.
    fn flush(&mut self) -> Result<()> {
        let to = &self.writer;
        let step = "hand objects to pack writer";
        hand_over(&mut self.out, &mut self.out_bytes, to, step, "writer")
    }

    fn handle(&mut self, o: Obj) -> Result<()> {
        match o {
            Obj::Put { kind, id, data } => self.put(kind, id, data),
            Obj::Run(run) => self.compress_run(run),
        }
    }

    /// Compresses a run of one large file's chunks as one group, if that pays.
    fn compress_run(&mut self, run: Vec<([u8; 32], Vec<u8>)>) -> Result<()> {
        for o in crate::group::compress(run, &mut self.compressor) {
            self.queue(o)?;
        }
        Ok(())
    }

    /// Stores a chunk of a multi-chunk file: hashed here; gathered with the file's next
    /// new chunks into a run, which whichever worker is free compresses (here when none
    /// is).
    fn put_chunk(&mut self, id: ChunkId, data: Vec<u8>) -> Result<()> {
        if !self.claim(id.as_bytes())? {
            return Ok(());
        }
        if self.run.push(*id.as_bytes(), data) {
            self.hand_on_run()?;
        }
        Ok(())
    }

    /// Offers the run gathered so far to the other workers.
    fn hand_on_run(&mut self) -> Result<()> {
        let run = self.run.take_raw();
        if run.is_empty() {
            return Ok(());
        }
        match self.offload.try_send(vec![Obj::Run(run)]) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(v) | TrySendError::Disconnected(v)) => {
                v.into_iter().try_for_each(|o| self.handle(o))
            }
        }
    }

    /// Chunks and stores everything `r` yields; `first` is what was already read of it.
    fn store_stream(&mut self, first: Vec<u8>, r: impl Read) -> Result<FileContent> {
        let reader = io::Cursor::new(first).chain(r);
        let (id, manifest) =
            chunk_stream(reader, PathBuf::new(), |id, data| self.put_chunk(id, data))?;
        self.hand_on_run()?;
        let size = manifest.size;
        if manifest.chunks.len() <= 1 {
            let id = match manifest.chunks.first() {
                Some((id, _)) => ContentId::from(*id),
                None => self.store_small(Vec::new())?.id,
            };
            return Ok(FileContent { id, size });
        }
        self.put(ObjectKind::Manifest, *id.as_bytes(), manifest.encode())?;
        Ok(FileContent { id, size })
    }

    fn store_small(&mut self, data: Vec<u8>) -> Result<FileContent> {
        let id = ChunkId::of(&data);
        let size = data.len() as u64;
        self.put(ObjectKind::Chunk, *id.as_bytes(), data)?;
        Ok(FileContent {
            id: id.into(),
            size,
        })
    }

    fn store_file(&mut self, job: &FileJob) -> Result<(FileContent, Xattrs)> {
        let path = &job.path;
        if let Some(w) = &job.git_object {
            let data = self.git.blob(w)?;
            let content = match data.len() as u64 <= SINGLE_CHUNK_MAX_BYTES {
                true => self.store_small(data)?,
                false => self.store_stream(data, io::empty())?,
            };
            return Ok((content, Vec::new()));
        }
        let file = match &job.at {
            Some((dir, name)) => {
                use nix::fcntl::OFlag;
                let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
                nix::fcntl::openat(
                    dir.as_ref(),
                    name.as_os_str(),
                    flags,
                    nix::sys::stat::Mode::empty(),
                )
                .map(File::from)
                .map_err(|e| Error::io("open", path)(io::Error::from(e)))?
            }
            None => std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(path)
                .map_err(Error::io("open", path))?,
        };
        if job.git_loose {
            return Ok((self.store_git_loose(file, path)?, Vec::new()));
        }
        let xattrs = match job.xattrs {
            true => crate::xattrs::read_file_xattrs(&file, path)?,
            false => Vec::new(),
        };
        let size_hint = file.metadata().map(|m| m.len()).unwrap_or(0);
        Ok((self.store_read(&file, size_hint, path)?, xattrs))
    }

    /// Stores the blob a git loose object holds; its length and zlib checksum are
    /// checked before the content is reported.
    fn store_git_loose(&mut self, file: File, path: &PathBuf) -> Result<FileContent> {
        let mut blob = crate::gitloose::Blob::open(file, path)?;
        let size = blob.size();
        let content = self
            .store_read(&mut blob, size, path)
            .map_err(|e| match e {
                // (A stream that fails to inflate is a corrupt object, as git says.)
                Error::Io { source, .. } => crate::gitloose::corrupt(path, source.to_string()),
                e => e,
            })?;
        blob.finish(content.size)?;
        Ok(content)
    }

    /// Stores everything `r` yields (about `size_hint` bytes); read errors name `path`.
    fn store_read(
        &mut self,
        mut r: impl Read,
        size_hint: u64,
        path: &PathBuf,
    ) -> Result<FileContent> {
        let mut first = Vec::with_capacity(size_hint.min(SINGLE_CHUNK_MAX_BYTES) as usize + 1);
        (&mut r)
            .take(SINGLE_CHUNK_MAX_BYTES + 1)
            .read_to_end(&mut first)
            .map_err(Error::io("read", path))?;
        if first.len() as u64 <= SINGLE_CHUNK_MAX_BYTES {
            return self.store_small(first);
        }
        // FastCDC reads into its own buffer: no second buffer in between.
        self.store_stream(first, r).map_err(|e| match e {
            Error::Io { step, source, .. } => Error::Io {
                step,
                path: path.clone(),
                source,
            },
            e => e,
        })
    }

    /// A worker's loop: objects first (they hold memory and finish other workers'
    /// files), then file batches; ends when the caller closed the file queue and no
    /// object is left.
    pub(super) fn run(
        mut self,
        files: Receiver<Vec<FileJob>>,
        objects: Receiver<Vec<Obj>>,
        results: Sender<Vec<FileResult>>,
    ) -> Result<()> {
        let mut files_open = true;
        loop {
            match objects.try_recv() {
                Ok(v) => {
                    v.into_iter().try_for_each(|o| self.handle(o))?;
                    continue;
                }
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => {}
            }
            if !files_open {
                break;
            }
            let batch = match files.try_recv() {
                Ok(b) => Some(b),
                Err(TryRecvError::Disconnected) => {
                    files_open = false;
                    continue;
                }
                Err(TryRecvError::Empty) => {
                    // Nothing to do right now: let go of what is held, then wait.
                    self.flush()?;
                    self.end_lookups()?;
                    crossbeam_channel::select! {
                        recv(objects) -> v => {
                            if let Ok(v) = v {
                                v.into_iter().try_for_each(|o| self.handle(o))?;
                            }
                            None
                        }
                        recv(files) -> b => match b {
                            Ok(b) => Some(b),
                            Err(_) => {
                                files_open = false;
                                None
                            }
                        },
                    }
                }
            };
            if let Some(batch) = batch {
                let done: Vec<FileResult> = batch
                    .into_iter()
                    .map(|job| (job.slot, self.store_file(&job)))
                    .collect();
                let _ = results.send(done);
            }
        }
        self.end_lookups()?;
        self.close_group()?;
        self.flush()
    }
}
