//! Faults injected at the pack backend: a failed write or sync leaves the store as it
//! was (fsck clean, every earlier snapshot intact, nothing half-committed).

use crate::common;

use std::fs;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cowspace_store::pack::{LocalPacks, PackBackend, PackId, PackSink};
use cowspace_store::{ErrorKind, ImportOptions, Store, StoreConfig};

/// Fails the write that would take the session past `budget` bytes, or the sync.
struct Faulty {
    inner: LocalPacks,
    budget: AtomicU64,
    fail_sync: bool,
}

struct FaultySink {
    inner: Box<dyn PackSink>,
    owner: Arc<Faulty>,
}

impl PackSink for FaultySink {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        let left = self.owner.budget.load(Ordering::SeqCst);
        if (buf.len() as u64) > left {
            // Write part of it, as a full disk would.
            self.inner.write_all(&buf[..left as usize])?;
            self.owner.budget.store(0, Ordering::SeqCst);
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                "injected: disk full",
            ));
        }
        self.owner
            .budget
            .fetch_sub(buf.len() as u64, Ordering::SeqCst);
        self.inner.write_all(buf)
    }
    fn sync(&mut self) -> io::Result<()> {
        if self.owner.fail_sync {
            return Err(io::Error::other("injected: fsync failed"));
        }
        self.inner.sync()
    }
}

struct Handle(Arc<Faulty>);

impl PackBackend for Handle {
    fn create(&self, pack: &PackId) -> io::Result<Box<dyn PackSink>> {
        Ok(Box::new(FaultySink {
            inner: self.0.inner.create(pack)?,
            owner: self.0.clone(),
        }))
    }
    fn read_at(&self, pack: &PackId, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.0.inner.read_at(pack, offset, buf)
    }
    fn len(&self, pack: &PackId) -> io::Result<u64> {
        self.0.inner.len(pack)
    }
    fn remove(&self, pack: &PackId) -> io::Result<()> {
        self.0.inner.remove(pack)
    }
    fn list(&self) -> io::Result<Vec<PackId>> {
        self.0.inner.list()
    }
    fn sync_dir(&self) -> io::Result<()> {
        self.0.inner.sync_dir()
    }
    fn location(&self, pack: &PackId) -> String {
        self.0.inner.location(pack)
    }
}

fn make_tree(dir: &Path, variant: u8) {
    fs::create_dir_all(dir.join("sub")).unwrap();
    for i in 0..200u32 {
        let body: Vec<u8> = (0..(i * 97 % 5000))
            .map(|j| (j as u8) ^ variant ^ (i as u8))
            .collect();
        fs::write(dir.join("sub").join(format!("f{i}")), body).unwrap();
    }
    let big: Vec<u8> = (0..1_500_000u32)
        .map(|j| (j.wrapping_mul(2654435761) >> 11) as u8 ^ variant)
        .collect();
    fs::write(dir.join("big"), big).unwrap();
}

#[test]
fn failed_pack_writes_leave_the_store_unchanged() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    Store::init(&root, StoreConfig::default()).unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    make_tree(&a, 1);
    make_tree(&b, 2);
    let good = Store::open(&root, StoreConfig::default()).unwrap();
    let mut opts = ImportOptions::new();
    opts.ref_name = Some("main".into());
    let first = good.import_dir(&a, &opts).unwrap();

    // Fail at many points of the second import's pack writes, then once at fsync.
    let budgets = [0u64, 10, 100, 5_000, 50_000, 100_000];
    for (i, budget) in budgets.iter().map(|b| Some(*b)).chain([None]).enumerate() {
        let faulty = Arc::new(Faulty {
            inner: LocalPacks::new(root.join("store/packs")),
            budget: AtomicU64::new(budget.unwrap_or(u64::MAX)),
            fail_sync: budget.is_none(),
        });
        let store =
            Store::open_with_backend(&root, StoreConfig::default(), Arc::new(Handle(faulty)))
                .unwrap();
        let err = store
            .import_dir(&b, &opts)
            .expect_err("the injected fault must surface");
        assert_eq!(err.kind(), ErrorKind::Io, "case {i}: {err}");
        assert!(err.to_string().contains("injected"), "case {i}: {err}");

        let check = Store::open(&root, StoreConfig::default()).unwrap();
        let report = check.fsck().unwrap();
        assert!(report.is_clean(), "case {i}: {report:?}");
        assert_eq!(
            check.snapshot_ids().unwrap(),
            vec![first.snapshot],
            "case {i}"
        );
        assert_eq!(
            check.get_ref("main").unwrap(),
            Some(first.snapshot),
            "case {i}"
        );
        let out = tmp.path().join(format!("out{i}"));
        check.export_dir(&first.snapshot, &out).unwrap();
        assert_eq!(common::listing(&a), common::listing(&out), "case {i}");
    }

    // The store still works, and gc clears whatever the failed sessions left.
    let second = good.import_dir(&b, &opts).unwrap();
    assert_eq!(second.parents, vec![first.snapshot]);
    let gc = good
        .gc(cowspace_store::gc::GcOptions {
            grace_secs: 0,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(gc.snapshots_removed.len(), 0, "the chain of main survives");
    let report = good.fsck().unwrap();
    assert!(
        report.is_clean() && report.orphan_packs.is_empty(),
        "{report:?}"
    );
}

/// `fsck` while another process commits: snapshots written after fsck listed the objects
/// and named by a ref or a pin it reads later are not reported missing (they were, 9
/// times in 60, before fsck looked them up again).
#[test]
fn fsck_beside_commits_reports_no_snapshot_missing() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    Store::init(&root, StoreConfig::default()).unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (root, src, done) = (root.clone(), src.clone(), done.clone());
        std::thread::spawn(move || {
            let store = Store::open(&root, StoreConfig::default()).unwrap();
            let mut opts = ImportOptions::new();
            opts.ref_name = Some("main".into());
            for i in 0..40 {
                std::fs::write(src.join(format!("f{i}")), format!("{i}\n")).unwrap();
                let snap = store.import_dir(&src, &opts).unwrap().snapshot;
                store.pin(&snap, &format!("ws-{i}")).unwrap();
            }
            done.store(true, std::sync::atomic::Ordering::SeqCst);
        })
    };
    let reader = Store::open(&root, StoreConfig::default()).unwrap();
    let mut runs = 0;
    while !done.load(std::sync::atomic::Ordering::SeqCst) {
        let report = reader.fsck().unwrap();
        assert!(
            report.missing.is_empty(),
            "fsck beside commits: {:?}",
            report.missing
        );
        runs += 1;
    }
    writer.join().unwrap();
    assert!(reader.fsck().unwrap().is_clean());
    eprintln!("{runs} fsck runs beside 40 commits, none reported a snapshot missing");
}
