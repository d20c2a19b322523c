//! Writing packs: one [`PackWriter`] per write session, fed by the ingest pipeline.
//!
//! The commit protocol (the order is what makes crashes harmless):
//! 1. records are appended to fresh pack files (never to a committed pack);
//! 2. at the end of the session each pack is fsync'ed and the pack directory too;
//! 3. one SQLite transaction records the packs, their objects and what the session made
//!    (snapshot, ref move, stat cache) — see [`crate::Store::commit`].
//!
//! A crash before 3 leaves only orphan pack files, which no index row names.

use std::collections::HashSet;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::index::{Location, ObjectKind};
use crate::pack::{
    Codec, GROUP_KIND, MAX_PACK_BYTES, PACK_MAGIC, PackBackend, PackHold, PackId, PackSink,
    record_header,
};

/// An object written in this session, to be recorded in the index.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub id: [u8; 32],
    pub loc: Location,
}

/// What a finished session wrote: synced packs and their objects.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    pub packs: Vec<(PackId, u64)>,
    pub rows: Vec<Row>,
    /// The packs' holds, kept until the commit ended (dropped with this).
    pub holds: Holds,
}

/// Holds of a session's packs ([`PackHold`]).
#[derive(Default)]
pub(crate) struct Holds(pub Vec<Box<dyn PackHold>>);

impl std::fmt::Debug for Holds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} pack holds", self.0.len())
    }
}

impl Pending {
    /// Bytes stored (compressed) by this session.
    pub fn stored_bytes(&self) -> u64 {
        stored_bytes(&self.rows)
    }
}

/// Bytes stored for `rows`, a group's once (its members' rows are consecutive).
pub(crate) fn stored_bytes(rows: &[Row]) -> u64 {
    let mut last = None;
    let mut n = 0;
    for r in rows {
        let at = (&r.loc.pack, r.loc.offset);
        if r.loc.codec != Codec::Part || last != Some(at) {
            n += u64::from(r.loc.stored_len);
        }
        last = Some(at);
    }
    n
}

/// An object on its way into a pack: one object, or a group ([`crate::group`]) when it
/// has members (then `id` is the group's, `kind` its members', `raw_len` the group's).
pub(crate) struct NewObject {
    pub id: [u8; 32],
    pub kind: ObjectKind,
    pub codec: Codec,
    pub raw_len: u32,
    pub stored: Vec<u8>,
    pub members: Vec<Member>,
}

/// A chunk in a group: its id, length and offset in the group's raw bytes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Member {
    pub id: [u8; 32],
    pub len: u32,
    pub part: u32,
}

struct OpenPack {
    id: PackId,
    sink: Box<dyn PackSink>,
    len: u64,
}

/// Appends objects to packs, rotating at [`MAX_PACK_BYTES`].
pub(crate) struct PackWriter {
    backend: Arc<dyn PackBackend>,
    current: Option<OpenPack>,
    pending: Pending,
    seen: HashSet<[u8; 32]>,
}

impl PackWriter {
    pub fn new(backend: Arc<dyn PackBackend>) -> PackWriter {
        PackWriter {
            backend,
            current: None,
            pending: Pending::default(),
            seen: HashSet::new(),
        }
    }

    fn io_err(&self, step: &'static str, pack: &PackId) -> impl FnOnce(std::io::Error) -> Error {
        Error::io(step, self.backend.location(pack))
    }

    /// Appends one object or group (a repeat within the session is dropped; a group
    /// whose members were all written already is too).
    pub fn add(&mut self, obj: NewObject) -> Result<()> {
        let members: Vec<Member> = obj
            .members
            .iter()
            .filter(|m| self.seen.insert(m.id))
            .copied()
            .collect();
        if obj.members.is_empty() && !self.seen.insert(obj.id) {
            return Ok(());
        }
        if !obj.members.is_empty() && members.is_empty() {
            return Ok(());
        }
        if self
            .current
            .as_ref()
            .is_some_and(|p| p.len >= MAX_PACK_BYTES)
        {
            self.seal()?;
        }
        let open = match self.current.take() {
            Some(p) => p,
            None => {
                let id = PackId::generate();
                let mut sink = self
                    .backend
                    .create(&id)
                    .map_err(self.io_err("create pack", &id))?;
                sink.write_all(PACK_MAGIC)
                    .map_err(self.io_err("write pack", &id))?;
                OpenPack {
                    id,
                    sink,
                    len: PACK_MAGIC.len() as u64,
                }
            }
        };
        let p = self.current.insert(open);
        let stored_len = u32::try_from(obj.stored.len())
            .map_err(|_| Error::Invalid("object larger than 4 GiB".into()))?;
        let kind = match obj.members.is_empty() {
            true => obj.kind as u8,
            false => GROUP_KIND,
        };
        let header = record_header(kind, obj.codec, stored_len, obj.raw_len, &obj.id);
        let location = self.backend.location(&p.id);
        let io = |e| Error::Io {
            step: "write pack",
            path: location.clone().into(),
            source: e,
        };
        p.sink.write_all(&header).map_err(io)?;
        p.sink.write_all(&obj.stored).map_err(io)?;
        let offset = p.len + header.len() as u64;
        p.len = offset + u64::from(stored_len);
        if obj.members.is_empty() {
            let loc = Location {
                kind: obj.kind,
                pack: p.id.clone(),
                offset,
                stored_len,
                raw_len: obj.raw_len,
                codec: obj.codec,
                part: 0,
            };
            self.pending.rows.push(Row { id: obj.id, loc });
        }
        for m in members {
            let loc = Location {
                kind: obj.kind,
                pack: p.id.clone(),
                offset,
                stored_len,
                raw_len: m.len,
                codec: Codec::Part,
                part: m.part,
            };
            self.pending.rows.push(Row { id: m.id, loc });
        }
        Ok(())
    }

    fn seal(&mut self) -> Result<()> {
        if let Some(mut p) = self.current.take() {
            p.sink.sync().map_err(self.io_err("sync pack", &p.id))?;
            self.pending.packs.push((p.id, p.len));
            self.pending.holds.0.push(p.sink.into_hold());
        }
        Ok(())
    }

    /// Syncs every pack and the directory; the result may now be committed.
    pub fn finish(mut self) -> Result<Pending> {
        self.seal()?;
        if !self.pending.packs.is_empty() {
            self.backend
                .sync_dir()
                .map_err(Error::io("sync pack directory", "packs"))?;
        }
        Ok(std::mem::take(&mut self.pending))
    }

    /// Removes every pack this session made (after an error; they are orphans anyway).
    pub fn abort(mut self) {
        if let Some(p) = self.current.take() {
            drop(p.sink);
            let _ = self.backend.remove(&p.id);
        }
        for (p, _) in &self.pending.packs {
            let _ = self.backend.remove(p);
        }
    }
}

/// Removes the packs of a finished session that was not committed.
pub(crate) fn discard(backend: &dyn PackBackend, pending: &Pending) {
    for (p, _) in &pending.packs {
        let _ = backend.remove(p);
    }
}
