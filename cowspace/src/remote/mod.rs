//! Remotes: an S3-compatible object store as the chunk tier many hosts share.
//!
//! A remote holds immutable packs of chunks named by their content, one index object per
//! snapshot (its metadata and where each chunk is), refs moved by compare-and-swap
//! (conditional PUT), pins of snapshots that lazy workspaces read, and gc marks. The
//! layout and its invariants are in `docs/store-format.md` ("Remotes").
//!
//! - [`push`] uploads what the remote lacks (packs first, then the index, then the ref:
//!   a reader never finds an index whose packs are not all there);
//! - [`pull`] brings a snapshot and all its contents here;
//! - [`fetch`] brings every remote ref and its snapshot's metadata (no file contents);
//! - [`resolve_lazy`] makes a snapshot that is only on a remote known here from its index
//!   alone: a workspace of it is made at once and reads file contents on demand through
//!   the [`Fetcher`] every store of a runtime gets ([`attach`]);
//! - [`gc`](gc::gc) removes what no remote ref or pin needs, by a mark and a sweep a grace
//!   period apart.

pub mod client;
pub mod gc;

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cowspace_store::remote::{
    FetchCounters, IndexChunk, RemoteConfig, RemoteFetch, RemoteLoc, SnapshotIndex, push_record,
};
use cowspace_store::{Expect, SnapshotId, Store};
use serde::Serialize;

pub use client::{Cas, Client};

use crate::error::{Error, Result};

/// A remote pack is closed once it holds this many bytes (one PUT each; no multipart
/// upload is ever started, so none can be left behind by an interrupted push).
pub const REMOTE_PACK_BYTES: usize = 64 * 1024 * 1024;
/// Chunks read (verified, and a group's members compressed on their own) at once by a
/// push, on every core.
const PUSH_READ_BATCH: usize = 4096;
/// The grace period of remote gc: an object unreachable in a mark is deleted by a sweep
/// at least this long after it, if still unreachable; a push must end within half of it.
pub const GC_GRACE_SECS: i64 = 3600;

pub fn pack_key(hash: &blake3::Hash) -> String {
    let h = hash.to_hex();
    format!("packs/{}/{}.pack", &h[..2], h)
}

pub fn index_key(s: &SnapshotId) -> String {
    format!("snapshots/{}.index", s.to_hex())
}

pub fn ref_key(name: &str) -> String {
    format!("refs/{name}")
}

pub fn pin_key(s: &SnapshotId, holder: &str) -> String {
    format!("pins/{}/{holder}", s.to_hex())
}

/// A ref object's body.
#[derive(Debug, Serialize, serde::Deserialize)]
struct RefBody {
    snapshot: String,
    updated_at: i64,
}

/// Reads remote objects for a store (registered by [`attach`]); a client per remote is
/// made at its first use, from the remote's record in the root.
pub struct Fetcher {
    root: PathBuf,
    clients: Mutex<HashMap<String, Arc<Client>>>,
}

impl Fetcher {
    fn client(&self, remote: &str) -> std::result::Result<Arc<Client>, String> {
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = clients.get(remote) {
            return Ok(c.clone());
        }
        let store = Store::open(&self.root, Default::default()).map_err(|e| e.to_string())?;
        let cfg = store.remote(Some(remote)).map_err(|e| e.to_string())?;
        let c = Arc::new(Client::open(&cfg).map_err(|e| e.to_string())?);
        clients.insert(remote.to_string(), c.clone());
        Ok(c)
    }
}

impl RemoteFetch for Fetcher {
    fn get_ranges(
        &self,
        remote: &str,
        key: &str,
        ranges: &[Range<u64>],
    ) -> std::result::Result<Vec<Vec<u8>>, String> {
        let c = self.client(remote)?;
        c.get_ranges(key, ranges).map_err(|e| match e {
            Error::Store(cowspace_store::Error::Remote { why, .. }) => why,
            e => e.to_string(),
        })
    }
}

/// Gives `store` the means to read objects that are only on a remote.
pub fn attach(store: &Store) {
    store.set_fetcher(Arc::new(Fetcher {
        root: store.root().to_path_buf(),
        clients: Mutex::new(HashMap::new()),
    }));
}

/// Opens a root's store, able to read from its remotes.
pub fn open_store(root: &std::path::Path) -> Result<Store> {
    let store = Store::open(root, Default::default())?;
    attach(&store);
    Ok(store)
}

/// A remote's client by name (the default for `None`).
pub fn client(store: &Store, name: Option<&str>) -> Result<Client> {
    Client::open(&store.remote(name)?)
}

/// `remote add`: checks the URL, that credentials are there and that the remote answers,
/// then records it (nothing is recorded when a check fails).
pub fn add(
    store: &Store,
    name: &str,
    url: &str,
    endpoint: Option<&str>,
    region: Option<&str>,
) -> Result<RemoteConfig> {
    client::parse_url(url)?;
    if let Some(e) = endpoint
        && !(e.starts_with("http://") || e.starts_with("https://"))
    {
        return Err(Error::Invalid(format!(
            "endpoint {e:?}: write it as http://HOST:PORT or https://HOST"
        )));
    }
    let cfg = RemoteConfig {
        name: name.into(),
        url: url.into(),
        endpoint: endpoint.map(str::to_string),
        region: region.map(str::to_string),
        default: false,
        added_at: 0,
    };
    Client::open(&cfg)?.probe()?;
    Ok(store.add_remote(&cfg)?)
}

/// `remote list`: every remote with what this root fetched from it (the CLI's `--json`
/// and the control socket's `remotes` answer).
pub fn list_json(store: &Store) -> Result<serde_json::Value> {
    let mut rows = Vec::new();
    for r in store.remotes()? {
        let encode = |e: serde_json::Error| {
            Error::Invalid(format!("remote {} cannot be listed as JSON: {e}", r.name))
        };
        let mut v = serde_json::to_value(&r).map_err(encode)?;
        v["fetched"] = serde_json::to_value(store.fetch_counters(&r.name)?).map_err(encode)?;
        rows.push(v);
    }
    Ok(serde_json::Value::Array(rows))
}

/// `doctor`'s `remotes` row: whether each remote answers one listing request, and how
/// fast.
pub fn doctor(store: &Store) -> serde_json::Value {
    let Ok(remotes) = store.remotes() else {
        return serde_json::json!([]);
    };
    let rows: Vec<serde_json::Value> = remotes
        .iter()
        .map(|r| {
            let t = Instant::now();
            let answer = Client::open(r).and_then(|c| c.probe());
            let ms = t.elapsed().as_secs_f64() * 1e3;
            serde_json::json!({
                "name": r.name, "url": r.url, "endpoint": r.endpoint, "default": r.default,
                "answers": answer.is_ok(), "ms": ms,
                "why": answer.err().map(|e| e.to_string()),
            })
        })
        .collect();
    serde_json::Value::Array(rows)
}

/// What a push did.
#[derive(Debug, Serialize)]
pub struct PushReport {
    pub remote: String,
    pub snapshot: String,
    #[serde(rename = "ref")]
    pub ref_name: Option<String>,
    /// Whether the remote ref moved (false: it was there already).
    pub ref_moved: bool,
    pub packs_uploaded: u64,
    pub chunks_uploaded: u64,
    pub bytes_uploaded: u64,
    /// Chunks the remote had already.
    pub chunks_reused: u64,
    pub index_bytes: u64,
    pub ms: f64,
}

/// Keys a gc mark names (not to be reused by a push: a later sweep may delete them).
fn marked_keys(c: &Client) -> Result<HashSet<String>> {
    let mut out = HashSet::new();
    for (key, _, _) in c.list("gc/marks/")? {
        if let Some((bytes, _)) = c.get(&key)?
            && let Ok(m) = serde_json::from_slice::<gc::Mark>(&bytes)
        {
            out.extend(m.keys);
        }
    }
    Ok(out)
}

/// `push SNAP|REF [--remote NAME] [--force]`.
pub fn push(store: &Store, remote: Option<&str>, spec: &str, force: bool) -> Result<PushReport> {
    let started = Instant::now();
    let cfg = store.remote(remote)?;
    let c = Client::open(&cfg)?;
    let snap = store.resolve(spec)?;
    let ref_name = store.get_ref(spec).ok().flatten().map(|_| spec.to_string());
    let closure = store.closure(&snap)?;
    let mut report = PushReport {
        remote: cfg.name.clone(),
        snapshot: snap.to_hex(),
        ref_name: ref_name.clone(),
        ref_moved: false,
        packs_uploaded: 0,
        chunks_uploaded: 0,
        bytes_uploaded: 0,
        chunks_reused: 0,
        index_bytes: 0,
        ms: 0.0,
    };

    // 1. What the remote has: known locations whose pack is there and no gc mark names.
    let mut known = store.remote_locations(&cfg.name, &closure.chunks)?;
    let marked = marked_keys(&c)?;
    let mut packs_ok: HashMap<String, bool> = HashMap::new();
    for loc in known.values() {
        if !packs_ok.contains_key(&loc.key) {
            let ok = !marked.contains(&loc.key) && c.exists(&loc.key)?;
            packs_ok.insert(loc.key.clone(), ok);
        }
    }
    known.retain(|_, l| packs_ok.get(&l.key).copied().unwrap_or(false));
    report.chunks_reused = known.len() as u64;

    // 2. Chunks that are neither here nor on this remote come from where they are.
    let absent: Vec<[u8; 32]> = closure
        .chunks
        .iter()
        .filter(|id| !known.contains_key(*id))
        .copied()
        .collect();
    store.fetch_objects(&absent)?;

    // 3. Upload the rest in packs named by their bytes; each pack's locations are
    // recorded here once it is on the remote, so a push that is interrupted and run again
    // uploads only what did not arrive.
    let mut buf: Vec<u8> = cowspace_store::pack::PACK_MAGIC.to_vec();
    let mut in_buf: Vec<([u8; 32], RemoteLoc)> = Vec::new();
    let mut flush = |buf: &mut Vec<u8>,
                     in_buf: &mut Vec<([u8; 32], RemoteLoc)>,
                     report: &mut PushReport|
     -> Result<()> {
        if in_buf.is_empty() {
            return Ok(());
        }
        let key = pack_key(&blake3::hash(buf));
        let len = buf.len() as u64;
        c.put_new(
            &key,
            std::mem::replace(buf, cowspace_store::pack::PACK_MAGIC.to_vec()),
        )?;
        for (_, l) in in_buf.iter_mut() {
            l.key = key.clone();
        }
        store.record_remote_objects(&cfg.name, in_buf)?;
        report.packs_uploaded += 1;
        report.chunks_uploaded += in_buf.len() as u64;
        report.bytes_uploaded += len;
        for (id, l) in in_buf.drain(..) {
            known.insert(id, l);
        }
        Ok(())
    };
    // Read (and, for a group's members, compressed on their own) on every core, a
    // batch at a time.
    let batches = absent.chunks(PUSH_READ_BATCH).map(|b| {
        store
            .stored_objects(b)
            .map(|objs| b.iter().zip(objs).collect::<Vec<_>>())
    });
    for batch in batches {
        for (id, (loc, stored)) in batch? {
            let offset = buf.len() as u64 + cowspace_store::pack::RECORD_HEADER_BYTES;
            push_record(&mut buf, loc.kind, &loc, id, &stored);
            in_buf.push((
                *id,
                RemoteLoc {
                    remote: cfg.name.clone(),
                    key: String::new(),
                    offset,
                    stored_len: loc.stored_len,
                    raw_len: loc.raw_len,
                    codec: loc.codec,
                },
            ));
            if buf.len() >= REMOTE_PACK_BYTES {
                flush(&mut buf, &mut in_buf, &mut report)?;
            }
        }
    }
    flush(&mut buf, &mut in_buf, &mut report)?;

    // 4. The index, once every pack it names is there.
    let mut meta = cowspace_store::pack::PACK_MAGIC.to_vec();
    for (id, _) in &closure.meta {
        let (loc, stored) = store.stored_object(id)?.ok_or_else(|| {
            Error::Store(cowspace_store::Error::NotFound {
                what: "object",
                name: hex::encode(id),
            })
        })?;
        push_record(&mut meta, loc.kind, &loc, id, &stored);
    }
    let mut packs: Vec<String> = Vec::new();
    let mut pack_ix: HashMap<String, u32> = HashMap::new();
    let mut chunks = Vec::with_capacity(closure.chunks.len());
    for id in &closure.chunks {
        // Every chunk is on the remote by now: found there, or uploaded above.
        let l = known.get(id).ok_or_else(|| {
            Error::Store(cowspace_store::Error::Remote {
                remote: cfg.name.clone(),
                object: format!("chunk {}", hex::encode(id)),
                why: "neither found on the remote nor uploaded by this push".into(),
            })
        })?;
        let ix = *pack_ix.entry(l.key.clone()).or_insert_with(|| {
            packs.push(l.key.clone());
            (packs.len() - 1) as u32
        });
        chunks.push(IndexChunk {
            id: *id,
            pack: ix,
            offset: l.offset,
            stored_len: l.stored_len,
            raw_len: l.raw_len,
            codec: l.codec,
        });
    }
    let index = SnapshotIndex {
        snapshot: snap,
        packs,
        meta,
        chunks,
    }
    .encode();
    report.index_bytes = index.len() as u64;
    if started.elapsed().as_secs() as i64 > GC_GRACE_SECS / 2 {
        return Err(Error::Invalid(format!(
            "the push took longer than half the remote's gc grace period ({} s): a gc may \
             have removed packs it reuses; run the push again (it uploads only what is missing)",
            GC_GRACE_SECS / 2
        )));
    }
    // Already there: a complete index of the same snapshot (indexes are written last).
    c.put_new(&index_key(&snap), index)?;

    // 5. The ref, by compare-and-swap.
    if let Some(name) = &ref_name {
        report.ref_moved = move_remote_ref(store, &c, name, &snap, force)?;
    }
    report.ms = started.elapsed().as_secs_f64() * 1e3;
    Ok(report)
}

/// The snapshot a remote ref names, with the ref object's ETag.
pub fn read_ref(c: &Client, name: &str) -> Result<Option<(SnapshotId, Option<String>)>> {
    cowspace_store::refs::check_ref_name(name)?;
    let Some((bytes, etag)) = c.get(&ref_key(name))? else {
        return Ok(None);
    };
    let body: RefBody = serde_json::from_slice(&bytes).map_err(|e| {
        Error::Store(cowspace_store::Error::Corrupt {
            what: "remote ref",
            id: name.into(),
            why: format!("not a ref object: {e}"),
        })
    })?;
    let id: SnapshotId = body.snapshot.parse()?;
    Ok(Some((id, etag)))
}

/// Whether `old` is `new` or one of its ancestors (as far as they are known here).
fn descends(store: &Store, new: &SnapshotId, old: &SnapshotId) -> bool {
    let mut stack = vec![*new];
    let mut seen = HashSet::new();
    while let Some(s) = stack.pop() {
        if &s == old {
            return true;
        }
        if seen.len() > 100_000 || !seen.insert(s) {
            continue;
        }
        if let Ok(snap) = store.snapshot(&s) {
            stack.extend(snap.parents.iter().copied());
        }
    }
    false
}

/// Moves remote ref `name` to `snap`: created when absent, moved when it is at an
/// ancestor of `snap` (or with `force`), by a conditional PUT. After a lost race the ref
/// is read again: at `snap`, the write was ours (a retried request); elsewhere, another
/// host won and this is a conflict. Returns whether the ref moved.
fn move_remote_ref(
    store: &Store,
    c: &Client,
    name: &str,
    snap: &SnapshotId,
    force: bool,
) -> Result<bool> {
    let body = serde_json::to_vec(&RefBody {
        snapshot: snap.to_hex(),
        updated_at: cowspace_store::snapshot::now_secs(),
    })
    .map_err(|e| Error::Invalid(format!("remote ref {name} cannot be encoded: {e}")))?;
    let current = read_ref(c, name)?;
    let cas = match &current {
        Some((at, _)) if at == snap => return Ok(false),
        Some((at, _)) if !force && !descends(store, snap, at) => {
            return Err(conflict(&c.name, name, at, snap));
        }
        Some((_, etag)) => c.put_if(&ref_key(name), body, etag.clone())?,
        None => c.put_new(&ref_key(name), body)?,
    };
    if cas == Cas::Written {
        return Ok(true);
    }
    match read_ref(c, name)? {
        Some((at, _)) if &at == snap => Ok(true),
        Some((at, _)) => Err(conflict(&c.name, name, &at, snap)),
        None => Err(Error::RemoteRef {
            remote: c.name.clone(),
            name: name.into(),
            why: "another host deleted it while this push moved it".into(),
        }),
    }
}

fn conflict(remote: &str, name: &str, at: &SnapshotId, snap: &SnapshotId) -> Error {
    Error::RemoteRef {
        remote: remote.into(),
        name: name.into(),
        why: format!(
            "it is at {}, which {} does not descend from (another host moved it)",
            at.to_hex(),
            snap.to_hex()
        ),
    }
}

/// Makes snapshot `snap` of remote `c` known here from its index (metadata only).
/// Returns whether file contents are still only on the remote.
pub fn register(store: &Store, c: &Client, snap: &SnapshotId) -> Result<bool> {
    if store.contains(snap.as_bytes())? {
        return Ok(store.is_partial(snap)?.is_some());
    }
    let key = index_key(snap);
    let bytes = c.get(&key)?.ok_or_else(|| {
        Error::Store(cowspace_store::Error::NotFound {
            what: "snapshot",
            name: format!(
                "{} on remote {} (no complete push of it)",
                snap.to_hex(),
                c.name
            ),
        })
    })?;
    let index = SnapshotIndex::decode(&bytes.0, snap, &key)?;
    Ok(store.register_index(&c.name, &key, &index)?)
}

/// What `spec` names on a remote: `REMOTE/REF`, a ref of the default remote (or of
/// `remote`), or a full snapshot id.
fn remote_target(
    store: &Store,
    remote: Option<&str>,
    spec: &str,
) -> Result<(Client, SnapshotId, Option<String>)> {
    if remote.is_none()
        && let Some((r, rest)) = spec.split_once('/')
        && store.remotes()?.iter().any(|x| x.name == r)
    {
        return remote_target(store, Some(r), rest);
    }
    let c = client(store, remote)?;
    if spec.len() == 64 && spec.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Ok((c, spec.to_ascii_lowercase().parse()?, None));
    }
    match read_ref(&c, spec)? {
        Some((s, _)) => Ok((c, s, Some(spec.to_string()))),
        None => Err(Error::Store(cowspace_store::Error::NotFound {
            what: "ref",
            name: format!("{spec} on remote {}", c.name),
        })),
    }
}

/// For `create` of something not stored here: a snapshot a remote has, made known from
/// its index. `None` when no remote is configured or none has it.
pub fn resolve_lazy(store: &Store, spec: &str) -> Result<Option<SnapshotId>> {
    if store.remotes()?.is_empty() {
        return Ok(None);
    }
    match remote_target(store, None, spec) {
        Ok((c, snap, ref_name)) => {
            register(store, &c, &snap)?;
            // As `fetch` would: the remote ref, as REMOTE/REF here.
            if let Some(name) = ref_name {
                store.set_ref(&format!("{}/{name}", c.name), &snap, Expect::Any)?;
            }
            Ok(Some(snap))
        }
        Err(e) if e.kind() == cowspace_store::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// What a pull did.
#[derive(Debug, Serialize)]
pub struct PullReport {
    pub remote: String,
    pub snapshot: String,
    #[serde(rename = "ref")]
    pub ref_name: Option<String>,
    pub fetched: FetchCounters,
    pub ms: f64,
}

/// `pull SNAP|REF [--remote NAME]`: the snapshot and every content it needs, here; a ref
/// pulled moves the local ref of the same name (created, or moved forward).
pub fn pull(store: &Store, remote: Option<&str>, spec: &str) -> Result<PullReport> {
    let started = Instant::now();
    let (c, snap, ref_name) = remote_target(store, remote, spec)?;
    register(store, &c, &snap)?;
    let fetched = store.fetch_snapshot(&snap)?;
    if let Some(name) = &ref_name {
        match store.get_ref(name)? {
            None => store.set_ref(name, &snap, Expect::Absent)?,
            Some(at) if at == snap => {}
            Some(at) if descends(store, &snap, &at) => {
                store.set_ref(name, &snap, Expect::At(at))?
            }
            Some(at) => {
                return Err(Error::Store(cowspace_store::Error::RefConflict {
                    name: name.clone(),
                    expected: snap.to_hex(),
                    actual: Some(at.to_hex()),
                }));
            }
        }
    }
    Ok(PullReport {
        remote: c.name.clone(),
        snapshot: snap.to_hex(),
        ref_name,
        fetched,
        ms: started.elapsed().as_secs_f64() * 1e3,
    })
}

/// One ref `fetch` brought.
#[derive(Debug, Serialize)]
pub struct FetchedRef {
    /// The local name: `REMOTE/REF`.
    pub local: String,
    pub snapshot: String,
    /// Whether file contents are still only on the remote.
    pub partial: bool,
}

/// `fetch [--remote NAME]`: every ref of the remote as the local ref `REMOTE/REF`, with
/// its snapshot's metadata (file contents are read when used).
pub fn fetch(store: &Store, remote: Option<&str>) -> Result<Vec<FetchedRef>> {
    let c = client(store, remote)?;
    let mut out = Vec::new();
    for (key, _, _) in c.list("refs/")? {
        let Some(name) = key.strip_prefix("refs/") else {
            continue;
        };
        let Some((snap, _)) = read_ref(&c, name)? else {
            continue;
        };
        let partial = register(store, &c, &snap)?;
        let local = format!("{}/{name}", c.name);
        store.set_ref(&local, &snap, Expect::Any)?;
        out.push(FetchedRef {
            local,
            snapshot: snap.to_hex(),
            partial,
        });
    }
    Ok(out)
}

/// Pins `snap` on its remote for workspace `holder` (remote gc keeps what a pin needs),
/// when some of its contents are only there.
pub fn pin(store: &Store, snap: &SnapshotId, holder: &str) -> Result<()> {
    if let Some(remote) = store.is_partial(snap)? {
        // A pin that is there already is this workspace's: nothing to do.
        client(store, Some(&remote))?.put_new(&pin_key(snap, holder), b"{}".to_vec())?;
    }
    Ok(())
}

/// Drops the remote pin of workspace `holder`, when its snapshot came from a remote. Best
/// effort: a remote that does not answer keeps the pin (and what it needs) until it is
/// deleted by hand; the failure is logged.
pub fn unpin(store: &Store, snap: &SnapshotId, holder: &str) {
    let Ok(Some(remote)) = store.remote_of(snap) else {
        return;
    };
    if let Err(e) = client(store, Some(&remote)).and_then(|c| c.delete(&pin_key(snap, holder))) {
        tracing::warn!(snapshot = %snap.to_hex(), "dropping the remote pin of workspace {holder}: {e}");
    }
}
