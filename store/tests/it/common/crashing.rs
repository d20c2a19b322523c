//! `CrashingPacks`: a pack backend in memory that tells the bytes written from the
//! bytes made durable, and can crash at a chosen point.
//!
//! A point is any call that changes what is on disk or makes it durable: `create`,
//! `write_all`, a sink's or a hold's `sync`, `remove`, `sync_dir`. Armed with
//! [`CrashingPacks::crash_at`], the backend fails that point and every call after it,
//! as if the process had died there. [`CrashingPacks::crash`] then does the worst a
//! power cut may do: a pack keeps only the bytes its last sync covered, a pack created
//! since the last `sync_dir` is gone, and a pack removed stays removed (whether or not
//! a `sync_dir` followed).

use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use cowspace_store::pack::{PackBackend, PackHold, PackId, PackSink};

#[derive(Debug, Default)]
struct Pack {
    written: Vec<u8>,
    /// How many bytes of `written` the last sync covered.
    durable_len: usize,
    /// Whether the name is there now, and whether a `sync_dir` made it durable.
    named: bool,
    named_durably: bool,
}

#[derive(Debug, Default)]
struct State {
    packs: BTreeMap<PackId, Pack>,
    points: u64,
    crash_at: Option<u64>,
    crashed: bool,
}

impl State {
    /// Counts a point; fails it when it is the one to crash at, or after the crash.
    fn point(&mut self) -> io::Result<()> {
        let this = self.points;
        self.points += 1;
        if self.crash_at == Some(this) {
            self.crashed = true;
        }
        self.alive()
    }

    fn alive(&self) -> io::Result<()> {
        if self.crashed {
            return Err(io::Error::other("simulated crash"));
        }
        Ok(())
    }

    fn pack(&mut self, id: &PackId) -> io::Result<&mut Pack> {
        self.packs
            .get_mut(id)
            .filter(|p| p.named)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no pack {id}")))
    }
}

/// The shared state; [`CrashingPacks::backend`] gives the store its handle.
#[derive(Clone, Debug, Default)]
pub struct CrashingPacks(Arc<Mutex<State>>);

impl CrashingPacks {
    pub fn new() -> CrashingPacks {
        CrashingPacks::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The backend to open a store with.
    pub fn backend(&self) -> Arc<dyn PackBackend> {
        Arc::new(self.clone())
    }

    /// How many points have passed so far.
    pub fn points(&self) -> u64 {
        self.state().points
    }

    /// Fails point `point` (counted from the start, see [`CrashingPacks::points`]) and
    /// everything after it.
    pub fn crash_at(&self, point: u64) {
        self.state().crash_at = Some(point);
    }

    /// Whether the armed crash has happened.
    pub fn crashed(&self) -> bool {
        self.state().crashed
    }

    /// The power cut: everything not durable is dropped (removals are kept), and the
    /// backend works again (disarmed) for the next "boot".
    pub fn crash(&self) {
        let mut s = self.state();
        s.packs.retain(|_, p| p.named && p.named_durably);
        for p in s.packs.values_mut() {
            p.written.truncate(p.durable_len);
        }
        s.crash_at = None;
        s.crashed = false;
    }

    /// The packs there now and their lengths.
    pub fn packs(&self) -> Vec<(PackId, usize)> {
        let s = self.state();
        let named = s.packs.iter().filter(|(_, p)| p.named);
        named.map(|(id, p)| (id.clone(), p.written.len())).collect()
    }
}

struct Sink {
    packs: CrashingPacks,
    id: PackId,
}

impl Sink {
    fn sync_pack(packs: &CrashingPacks, id: &PackId) -> io::Result<()> {
        let mut s = packs.state();
        s.point()?;
        let p = s.pack(id)?;
        p.durable_len = p.written.len();
        Ok(())
    }
}

impl PackSink for Sink {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        let mut s = self.packs.state();
        s.point()?;
        s.pack(&self.id)?.written.extend_from_slice(buf);
        Ok(())
    }

    fn sync(&mut self) -> io::Result<()> {
        Sink::sync_pack(&self.packs, &self.id)
    }

    fn into_hold(self: Box<Self>) -> Box<dyn PackHold> {
        self
    }
}

impl PackHold for Sink {
    fn sync(&self) -> io::Result<()> {
        Sink::sync_pack(&self.packs, &self.id)
    }
}

impl PackBackend for CrashingPacks {
    fn create(&self, pack: &PackId) -> io::Result<Box<dyn PackSink>> {
        let mut s = self.state();
        s.point()?;
        if s.packs.get(pack).is_some_and(|p| p.named) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                pack.to_string(),
            ));
        }
        let p = s.packs.entry(pack.clone()).or_default();
        (p.written, p.durable_len, p.named) = (Vec::new(), 0, true);
        Ok(Box::new(Sink {
            packs: self.clone(),
            id: pack.clone(),
        }))
    }

    fn read_at(&self, pack: &PackId, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let mut s = self.state();
        s.alive()?;
        let p = s.pack(pack)?;
        let start = usize::try_from(offset).map_err(io::Error::other)?;
        let bytes = p
            .written
            .get(start..start + buf.len())
            .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
        buf.copy_from_slice(bytes);
        Ok(())
    }

    fn len(&self, pack: &PackId) -> io::Result<u64> {
        let mut s = self.state();
        s.alive()?;
        Ok(s.pack(pack)?.written.len() as u64)
    }

    fn remove(&self, pack: &PackId) -> io::Result<()> {
        let mut s = self.state();
        s.point()?;
        if let Some(p) = s.packs.get_mut(pack) {
            p.named = false;
        }
        Ok(())
    }

    fn list(&self) -> io::Result<Vec<PackId>> {
        let s = self.state();
        s.alive()?;
        let named = s.packs.iter().filter(|(_, p)| p.named);
        Ok(named.map(|(id, _)| id.clone()).collect())
    }

    fn sync_dir(&self) -> io::Result<()> {
        let mut s = self.state();
        s.point()?;
        s.packs.retain(|_, p| p.named);
        for p in s.packs.values_mut() {
            p.named_durably = true;
        }
        Ok(())
    }

    fn location(&self, pack: &PackId) -> String {
        format!("memory:{pack}")
    }
}
