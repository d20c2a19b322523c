//! Crash safety of imports: `mountctl import` is SIGKILLed at points spread over an
//! import's duration; after each kill the store passes fsck, lists only complete
//! snapshots and keeps every snapshot the killed process reported.
//!
//! The kill points come from timing, so which phase each kill hits varies from run to
//! run; the assertions hold for every phase, and none is about time.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cowspace_tests::{
    Node, TestRoot, assert_same_listing, mountctl_bin, noise, scan_tree, write_file,
};
use serde_json::Value;

const FILES: usize = 3000;
const DIRS: usize = 40;
/// Every this-many-th file is large (several chunks).
const LARGE_EVERY: usize = 300;
const LARGE_FILE_BYTES: usize = 1280 * 1024;
const SMALL_FILE_MAX_BYTES: usize = 16 * 1024;
const KILL_POINTS: u32 = 10;
/// Kill points spread from 0 to this times an uninterrupted import's duration, so that
/// some land after the commit (killed imports start cold: nothing of theirs is cached).
const KILL_SPREAD: f64 = 1.6;
const REF: &str = "crash/main";

fn file_path(tree: &Path, i: usize) -> std::path::PathBuf {
    tree.join(format!("d{:02}/sub{}/file-{i:04}.dat", i % DIRS, i % 3))
}

/// Writes file `i` for `generation`: half noise, half a repeated pattern, so it both
/// compresses and dedups partly.
fn write_nth(tree: &Path, i: usize, generation: u64) {
    let seed = (i as u64) << 16 | generation;
    let len = if i.is_multiple_of(LARGE_EVERY) {
        LARGE_FILE_BYTES
    } else {
        (seed.wrapping_mul(2_654_435_761) % SMALL_FILE_MAX_BYTES as u64) as usize
    };
    let mut data = noise(seed, len / 2);
    data.extend(std::iter::repeat_n(b"cowspace ", len / 2 / 9 + 1).flatten());
    data.truncate(len);
    write_file(&file_path(tree, i), data);
}

fn make_tree(tree: &Path) {
    for i in 0..FILES {
        write_nth(tree, i, 0);
    }
}

/// Changes a tenth of the files (one large one among them) for the next round, so every
/// import has new data to write.
fn mutate(tree: &Path, round: u32) {
    let generation = u64::from(round) + 1;
    for i in (0..FILES).filter(|i| i % 10 == round as usize % 10) {
        write_nth(tree, i, generation);
    }
    write_nth(
        tree,
        LARGE_EVERY * (round as usize % (FILES / LARGE_EVERY)),
        generation,
    );
}

/// Starts `mountctl --json import TREE --ref REF`, kills it after `delay` (if still
/// running), and gives the snapshot it reported, if it got that far.
fn import_killed_after(r: &TestRoot, tree: &Path, delay: Duration) -> Option<String> {
    let mut child = Command::new(mountctl_bin())
        .arg("--root")
        .arg(r.root())
        .args(["--json", "import"])
        .arg(tree)
        .args(["--ref", REF])
        .env_remove("COWSPACE_ROOT")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start mountctl import");
    std::thread::sleep(delay);
    // SIGKILL, by this child's pid; an error only means it has exited already.
    let _ = child.kill();
    let out = child.wait_with_output().expect("wait for mountctl import");
    let stdout = String::from_utf8_lossy(&out.stdout);
    if out.status.success() {
        let v: Value = serde_json::from_str(stdout.trim())
            .unwrap_or_else(|e| panic!("import succeeded with bad JSON ({e}): {stdout}"));
        return Some(v["snapshot"].as_str().expect("snapshot id").to_owned());
    }
    // Killed: it may have printed its report just before the signal.
    assert!(
        out.status.code().is_none(),
        "import failed by itself: {:?}\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str::<Value>(stdout.trim())
        .ok()
        .and_then(|v| v["snapshot"].as_str().map(str::to_owned))
}

/// Exports `snap` and compares it with `expected`; removes the export.
fn assert_exports_as(r: &TestRoot, snap: &str, expected: &BTreeMap<String, Node>) {
    assert_exports_to(r, snap, expected, "export");
}

/// [`assert_exports_as`] through `<scratch>/NAME`.
fn assert_exports_to(r: &TestRoot, snap: &str, expected: &BTreeMap<String, Node>, name: &str) {
    let out = r.path(name);
    r.run(["export", snap, out.to_str().unwrap()]).ok();
    assert_same_listing(expected, &scan_tree(&out), &format!("snapshot {snap}"));
    std::fs::remove_dir_all(&out).unwrap();
}

/// fsck passes (orphan packs allowed); gives the orphan packs it reported.
fn fsck_clean(r: &TestRoot, when: &str) -> Vec<Value> {
    let out = r.json(["fsck"]);
    assert_eq!(out.code, 0, "fsck after {when}: {out:?}");
    let v = out.json();
    assert_eq!(v["ok"], true, "{when}: {v}");
    v["report"]["orphan_packs"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[test]
fn imports_killed_at_any_point_leave_a_consistent_store() {
    let started = Instant::now();
    let r = TestRoot::new();
    let tree = r.path("tree");
    make_tree(&tree);
    eprintln!("crash: tree made in {:?}", started.elapsed());

    // How long an uninterrupted import takes here, in a root of its own.
    let probe = TestRoot::new();
    let t = Instant::now();
    probe.import(&tree, &[]);
    let full = t.elapsed();
    drop(probe);

    // Every snapshot seen so far with the tree it must export as.
    let mut known: BTreeMap<String, BTreeMap<String, Node>> = BTreeMap::new();
    let mut reported: BTreeSet<String> = BTreeSet::new();
    let mut completed = 0;
    for round in 0..KILL_POINTS {
        if round > 0 {
            mutate(&tree, round);
        }
        let delay = full.mul_f64(KILL_SPREAD * f64::from(round) / f64::from(KILL_POINTS - 1));
        let printed = import_killed_after(&r, &tree, delay);
        let when = format!("kill {round} after {delay:?} (full import {full:?})");

        let killed_at = Instant::now();
        let orphans = fsck_clean(&r, &when);
        let listed = r.snapshot_ids();
        for old in known.keys() {
            assert!(listed.contains(old), "{when}: snapshot {old} lost");
        }
        if let Some(p) = &printed {
            assert!(
                listed.contains(p),
                "{when}: reported snapshot {p} is not listed"
            );
            reported.insert(p.clone());
        }
        // A new snapshot can only be this round's import, complete.
        let new: Vec<&String> = listed.iter().filter(|s| !known.contains_key(*s)).collect();
        assert!(new.len() <= 1, "{when}: several new snapshots {new:?}");
        if let Some(&s) = new.first() {
            completed += 1;
            let now = scan_tree(&tree);
            assert_exports_as(&r, s, &now);
            known.insert(s.clone(), now);
        }
        // The ref names a listed snapshot.
        match r.refs().get(REF) {
            Some(at) => assert!(listed.contains(at), "{when}: {REF} -> unlisted {at}"),
            None => assert!(listed.is_empty(), "{when}: snapshots but no {REF}"),
        }
        eprintln!(
            "crash: {when}: {} snapshots, {} orphan packs, printed {printed:?}; checked in {:?}",
            listed.len(),
            orphans.len(),
            killed_at.elapsed()
        );
    }

    // A normal import still works and sets the ref.
    let last = r.import(&tree, &["--ref", REF]);
    let last = last["snapshot"].as_str().unwrap().to_owned();
    assert_eq!(r.refs()[REF], last);
    known.insert(last.clone(), scan_tree(&tree));
    let orphans = fsck_clean(&r, "the final import").len() as u64;

    // gc removes the orphan packs; the ref chain keeps every snapshot.
    let v = r.json(["gc", "--grace", "0"]).ok().json();
    assert_eq!(v["orphan_packs_removed"], orphans, "{v}");
    assert!(fsck_clean(&r, "gc").is_empty(), "orphans left after gc");
    let listed = r.snapshot_ids();
    for snap in known.keys() {
        assert!(
            listed.contains(snap),
            "gc removed {snap} of the ref's chain"
        );
    }
    // Each earlier snapshot was exported when it appeared, and fsck has verified every
    // object since; export the newest once more after gc rewrote the store.
    assert_exports_as(&r, &last, &known[&last]);
    eprintln!(
        "crash: {completed} of {KILL_POINTS} killed imports completed, {} reported, {orphans} \
         orphan packs removed; {:?} in all",
        reported.len(),
        started.elapsed()
    );
}

/// Per round of the gc crash test: a snapshot only a ref keeps (files `live*`) and an
/// unreferenced one whose pack also holds those files (plus large `dead*` files), so a
/// gc both deletes snapshots and rewrites a pack that is mostly garbage.
fn gc_round_garbage(r: &TestRoot, round: u64) -> (String, BTreeMap<String, Node>) {
    let both = r.path(&format!("both-{round}"));
    let live = r.path(&format!("live-{round}"));
    for i in 0..200u64 {
        let data = noise(round << 20 | i, 4096);
        write_file(&both.join(format!("live{i}")), &data);
        write_file(&live.join(format!("live{i}")), &data);
    }
    for i in 0..8u64 {
        write_file(
            &both.join(format!("dead{i}")),
            noise(round << 20 | 1000 | i, 512 * 1024),
        );
    }
    r.import(&both, &[]);
    let kept = r.import(&live, &["--ref", "gc/main"]);
    let listing = scan_tree(&live);
    (kept["snapshot"].as_str().unwrap().to_owned(), listing)
}

#[test]
fn gc_killed_at_any_point_leaves_a_consistent_store() {
    const GC_KILL_POINTS: u32 = 8;
    // How long such a gc takes here.
    let probe = TestRoot::new();
    gc_round_garbage(&probe, 0);
    let t = Instant::now();
    let v = probe.json(["gc", "--grace", "0"]).ok().json();
    let full = t.elapsed();
    assert!(
        v["packs_rewritten"].as_u64().unwrap() >= 1,
        "no pack rewritten: {v}"
    );
    assert!(v["packs_removed"].as_u64().unwrap() + v["packs_rewritten"].as_u64().unwrap() >= 1);
    drop(probe);

    let r = TestRoot::new();
    let mut kept: Vec<(String, BTreeMap<String, Node>)> = Vec::new();
    for round in 0..GC_KILL_POINTS {
        kept.push(gc_round_garbage(&r, u64::from(round)));
        let delay = full.mul_f64(KILL_SPREAD * f64::from(round) / f64::from(GC_KILL_POINTS - 1));
        let mut child = Command::new(mountctl_bin())
            .arg("--root")
            .arg(r.root())
            .args(["--json", "gc", "--grace", "0"])
            .env_remove("COWSPACE_ROOT")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start mountctl gc");
        std::thread::sleep(delay);
        let _ = child.kill();
        let status = child.wait().expect("wait for mountctl gc");
        let when = format!("gc kill {round} after {delay:?} (full gc {full:?}): {status:?}");
        fsck_clean(&r, &when);
        // Every snapshot on the ref's chain is intact; the newest exports exactly.
        let listed = r.snapshot_ids();
        for (snap, _) in &kept {
            assert!(listed.contains(snap), "{when}: {snap} lost");
        }
        let (newest, listing) = kept.last().unwrap();
        assert_eq!(&r.refs()["gc/main"], newest, "{when}");
        assert_exports_as(&r, newest, listing);
        eprintln!("crash: {when}: {} snapshots", listed.len());
    }
    // A gc that runs to the end leaves only the chain, no orphans, and every snapshot
    // of the chain exports as it was imported.
    r.json(["gc", "--grace", "0"]).ok();
    assert!(
        fsck_clean(&r, "the last gc").is_empty(),
        "orphans left after gc"
    );
    let listed = r.snapshot_ids();
    assert_eq!(
        listed,
        kept.iter().map(|(s, _)| s.clone()).collect::<BTreeSet<_>>()
    );
    for (snap, listing) in &kept {
        assert_exports_as(&r, snap, listing);
    }
}

/// Tiny imports per round of the repack crash test (each makes a pack of its own).
const TINY_PER_ROUND: u32 = 24;

/// `TINY_PER_ROUND` imports of a small tree changing one file each time, on ref
/// `repack/main`: each snapshot with its listing.
fn tiny_round(r: &TestRoot, round: u32) -> Vec<(String, BTreeMap<String, Node>)> {
    let src = r.path("tiny");
    write_file(&src.join("same.txt"), "in every snapshot\n");
    (0..TINY_PER_ROUND)
        .map(|i| {
            write_file(&src.join("n.txt"), format!("round {round} import {i}\n"));
            let v = r.import(&src, &["--ref", "repack/main"]);
            (v["snapshot"].as_str().unwrap().to_owned(), scan_tree(&src))
        })
        .collect()
}

/// `mountctl --json ARGS...` as a child with no output kept.
fn spawn_quiet(r: &TestRoot, args: &[&str]) -> std::process::Child {
    Command::new(mountctl_bin())
        .arg("--root")
        .arg(r.root())
        .arg("--json")
        .args(args)
        .env_remove("COWSPACE_ROOT")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start mountctl")
}

#[test]
fn repack_killed_at_any_point_beside_an_import_and_a_reader_leaves_a_consistent_store() {
    const REPACK_KILL_POINTS: u32 = 8;
    // How long a repack of one round's packs takes here.
    let probe = TestRoot::new();
    tiny_round(&probe, 0);
    let t = Instant::now();
    let v = probe.json(["repack"]).ok().json();
    let full = t.elapsed();
    assert_eq!(v["packs_after"], 1, "{v}");
    drop(probe);

    let r = TestRoot::new();
    let big = r.path("big");
    for i in 0..300 {
        write_nth(&big, i, 0);
    }
    let mut kept: Vec<(String, BTreeMap<String, Node>)> = Vec::new();
    for round in 0..REPACK_KILL_POINTS {
        kept.extend(tiny_round(&r, round));
        write_nth(&big, round as usize, u64::from(round) + 1);
        let big_listing = scan_tree(&big);
        let delay =
            full.mul_f64(KILL_SPREAD * f64::from(round) / f64::from(REPACK_KILL_POINTS - 1));
        let (oldest, oldest_listing) = kept[0].clone();
        let stop = std::sync::atomic::AtomicBool::new(false);
        let when = format!("repack kill {round} after {delay:?} (full repack {full:?})");
        std::thread::scope(|s| {
            // A reader exporting the oldest snapshot over and over: never refused.
            let reader = s.spawn(|| {
                let mut n = 0u32;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) || n == 0 {
                    assert_exports_to(&r, &oldest, &oldest_listing, "export-reader");
                    n += 1;
                }
                n
            });
            // An import beside it: waits for the repack's lock or runs before it.
            let import = spawn_quiet(&r, &["import", big.to_str().unwrap(), "--ref", "big"]);
            let mut repack = spawn_quiet(&r, &["repack", "--wait"]);
            std::thread::sleep(delay);
            let _ = repack.kill();
            let status = repack.wait().expect("wait for repack");
            let out = import.wait_with_output().expect("wait for import");
            stop.store(true, std::sync::atomic::Ordering::SeqCst);
            let reads = reader.join().expect("reader");
            assert!(
                out.status.success(),
                "{when}: the import beside the repack failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            eprintln!("crash: {when}: {status:?}, {reads} exports read meanwhile");
        });
        fsck_clean(&r, &when);
        let listed = r.snapshot_ids();
        for (snap, _) in &kept {
            assert!(listed.contains(snap), "{when}: {snap} lost");
        }
        let (newest, listing) = kept.last().unwrap();
        assert_eq!(&r.refs()["repack/main"], newest, "{when}");
        assert_exports_as(&r, newest, listing);
        assert_exports_as(&r, &r.refs()["big"], &big_listing);
    }
    // A repack that runs to the end leaves few packs; gc then leaves no orphan; every
    // snapshot exports as it was imported.
    let before = r.pack_files().len();
    let v = r.json(["repack"]).ok().json();
    let after = v["packs_after"].as_u64().unwrap() as usize;
    assert!(after < before, "{before} packs before, {v}");
    r.json(["gc", "--grace", "3600"]).ok();
    assert!(fsck_clean(&r, "the last repack and gc").is_empty());
    for (snap, listing) in &kept {
        assert_exports_as(&r, snap, listing);
    }
}

/// The chunk ids of the complete chunk records of a pack file (a killed writer's last
/// record may be cut short).
fn pack_chunks(pack: &Path) -> BTreeSet<String> {
    /// kind, codec, pad, stored_len, raw_len, id (docs/store-format.md).
    const HEADER: usize = 44;
    let bytes = std::fs::read(pack).unwrap();
    let mut out = BTreeSet::new();
    let mut at = 8;
    while at + HEADER <= bytes.len() {
        let h = &bytes[at..at + HEADER];
        let stored = u32::from_le_bytes(h[4..8].try_into().unwrap()) as usize;
        if at + HEADER + stored > bytes.len() {
            break;
        }
        if h[0] == 1 {
            out.insert(h[12..44].iter().map(|b| format!("{b:02x}")).collect());
        }
        at += HEADER + stored;
    }
    out
}

/// How long an import of `tree` into a new root takes with the tree in the page cache
/// (the second of two).
fn warm_import_time(tree: &Path) -> Duration {
    let mut took = Duration::ZERO;
    for _ in 0..2 {
        let probe = TestRoot::new();
        let t = Instant::now();
        probe.import(tree, &[]);
        took = t.elapsed();
    }
    took
}

/// The pack files of a root, by path.
fn pack_paths(r: &TestRoot) -> BTreeSet<std::path::PathBuf> {
    r.pack_files()
        .into_iter()
        .map(|p| r.root().join("store/packs").join(p))
        .collect()
}

#[test]
fn an_import_killed_at_any_point_then_run_again_stores_no_chunk_twice() {
    const RESUME_KILL_POINTS: u32 = 6;
    let tree_root = TestRoot::new();
    let tree = tree_root.path("tree");
    make_tree(&tree);
    let listing = scan_tree(&tree);
    let full = warm_import_time(&tree);

    let mut resumed_rounds = 0;
    for round in 0..RESUME_KILL_POINTS {
        let r = TestRoot::new();
        // Spread over the import itself: most rounds are cut short.
        let delay = full.mul_f64(f64::from(round + 1) / f64::from(RESUME_KILL_POINTS + 1));
        let printed = import_killed_after(&r, &tree, delay);
        let when = format!("import killed after {delay:?} (full import {full:?})");
        // Only what no commit recorded counts (a kill may land after the commit, before
        // the report was printed).
        let orphans: Vec<std::path::PathBuf> = fsck_clean(&r, &when)
            .iter()
            .map(|p| {
                r.root()
                    .join("store/packs")
                    .join(format!("{}.pack", p.as_str().unwrap()))
            })
            .collect();
        let left = pack_paths(&r);
        let left_chunks: BTreeSet<String> = orphans.iter().flat_map(|p| pack_chunks(p)).collect();

        let v = r.import(&tree, &["--ref", REF]);
        let again = v["snapshot"].as_str().unwrap().to_owned();
        if printed.is_none() && !left_chunks.is_empty() {
            resumed_rounds += 1;
            assert!(
                v["resumed"]["chunks"].as_u64().unwrap_or(0) > 0,
                "{when}: the import again took over nothing: {v}"
            );
        }
        // The packs the second import wrote hold no chunk the killed one had stored.
        for p in pack_paths(&r).difference(&left) {
            let twice: Vec<_> = pack_chunks(p).intersection(&left_chunks).cloned().collect();
            assert!(twice.is_empty(), "{when}: stored twice: {twice:?}");
        }
        fsck_clean(&r, &when);
        assert_exports_as(&r, &again, &listing);
        // gc leaves no orphan and loses nothing the snapshot needs.
        r.json(["gc", "--grace", "0"]).ok();
        assert!(fsck_clean(&r, &format!("gc after {when}")).is_empty());
        assert_exports_as(&r, &again, &listing);
        eprintln!(
            "crash: {when}: {} chunks left, {} taken over",
            left_chunks.len(),
            v["resumed"]["chunks"]
        );
    }
    assert!(
        resumed_rounds > 0,
        "no round interrupted an import that had stored chunks"
    );
}

#[test]
fn an_interrupted_import_says_what_it_leaves() {
    let trees = TestRoot::new();
    let tree = trees.path("tree");
    make_tree(&tree);
    // The signal goes once the import has written its first pack (its handler is
    // installed by then); one that arrives after the import ended finds nothing to
    // interrupt, so a few tries.
    for _ in 0..5 {
        let r = TestRoot::new();
        let mut child = Command::new(mountctl_bin())
            .arg("--root")
            .arg(r.root())
            .arg("import")
            .arg(&tree)
            .args(["--ref", REF])
            .env_remove("COWSPACE_ROOT")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start mountctl import");
        let packs = r.root().join("store/packs");
        let writing = Instant::now();
        while cowspace_tests::dir_entries(&packs).is_empty()
            && child.try_wait().unwrap().is_none()
            && writing.elapsed() < Duration::from_secs(60)
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        let _ = Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status();
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.code() != Some(130) {
            continue;
        }
        assert!(
            stderr.contains("import interrupted") && stderr.contains("no snapshot was made"),
            "{stderr}"
        );
        assert!(stderr.contains("the next import"), "{stderr}");
        assert!(
            r.snapshot_ids().is_empty(),
            "no snapshot after an interrupt"
        );
        fsck_clean(&r, "an interrupted import");
        return;
    }
    panic!("no interrupt landed during an import");
}
