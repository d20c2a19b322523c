//! Small files are compressed together in groups (`store/src/group.rs`): denser than
//! one by one, read back exactly, damage found per member and repaired by a re-import.

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;

use cowspace_store::{ImportOptions, Store, StoreConfig};

use crate::common;

/// `n` source-like files of 30 B to 30 KiB that resemble each other, as a repository's
/// do, plus an incompressible one and one larger than a group member.
fn tree(dir: &Path, n: usize, tag: &str) {
    fs::create_dir_all(dir.join("sub")).unwrap();
    for i in 0..n {
        let body: String = (0..(i * 7) % 300)
            .map(|j| {
                format!(
                    "    let value_{j} = compute_{}(input, {j});\n",
                    (i + j) % 11
                )
            })
            .collect();
        let text = format!("// {tag} file {i}\nfn f{i}(input: u32) -> u32 {{\n{body}    0\n}}\n");
        let dir = if i % 3 == 0 {
            dir.join("sub")
        } else {
            dir.to_path_buf()
        };
        fs::write(dir.join(format!("f{i}.rs")), text).unwrap();
    }
    fs::write(dir.join("noise.bin"), common::noise(7, 20_000)).unwrap();
    fs::write(dir.join("large.txt"), "a larger file\n".repeat(10_000)).unwrap();
}

/// What the files would take compressed one by one at the store's level.
fn one_by_one(dir: &Path) -> u64 {
    let mut n = 0;
    for e in walk(dir) {
        let data = fs::read(&e).unwrap();
        let c = zstd::bulk::compress(&data, 3).unwrap();
        n += c.len().min(data.len()) as u64;
    }
    n
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn small_files_stored_together_read_back_exactly_and_take_less() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    tree(&src, 400, "a");
    let store = Store::init(&tmp.path().join("root"), StoreConfig::default()).unwrap();
    let r = store.import_dir(&src, &ImportOptions::new()).unwrap();

    let stats = store.stats().unwrap();
    let alone = one_by_one(&src);
    assert!(
        stats.stored_bytes * 10 < alone * 7,
        "grouped {} bytes against {} one by one",
        stats.stored_bytes,
        alone
    );
    // The count is of the bytes on disk: a group's bytes once, not once per member.
    assert!(stats.stored_bytes <= stats.pack_file_bytes, "{stats:?}");

    let report = store.fsck().unwrap();
    assert!(report.is_clean(), "{report:?}");
    let out = tmp.path().join("out");
    store.export_dir(&r.snapshot, &out).unwrap();
    assert_eq!(common::listing(&src), common::listing(&out));
    for f in walk(&src) {
        let rel = f.strip_prefix(&src).unwrap();
        assert_eq!(fs::read(&f).unwrap(), fs::read(out.join(rel)).unwrap());
    }

    // A second import of other files with some of the same contents dedups against
    // members of the first import's groups.
    let more = tmp.path().join("more");
    tree(&more, 400, "a");
    fs::write(more.join("f1.rs"), "changed\n").unwrap();
    let r2 = store.import_dir(&more, &ImportOptions::new()).unwrap();
    assert_eq!(
        r2.objects_written, 3,
        "the changed file and two trees: {r2:?}"
    );
    let out2 = tmp.path().join("out2");
    store.export_dir(&r2.snapshot, &out2).unwrap();
    assert_eq!(common::listing(&more), common::listing(&out2));
}

#[test]
fn a_damaged_group_names_the_members_it_spoils_and_a_reimport_repairs_them() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    tree(&src, 200, "b");
    let root = tmp.path().join("root");
    let store = Store::init(&root, StoreConfig::default()).unwrap();
    let r = store.import_dir(&src, &ImportOptions::new()).unwrap();
    drop(store);

    // A byte in the middle of the pack's first group record.
    let pack = common::pack_files(&root)
        .into_iter()
        .max_by_key(|p| fs::metadata(p).unwrap().len())
        .unwrap();
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&pack)
        .unwrap();
    let mut at = 8u64;
    let mut h = [0u8; 44];
    loop {
        f.read_exact_at(&mut h, at).unwrap();
        let stored_len = u64::from(u32::from_le_bytes(h[4..8].try_into().unwrap()));
        if h[0] == 5 {
            at += 44 + stored_len / 2;
            break;
        }
        at += 44 + stored_len;
    }
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).unwrap();
    b[0] ^= 0x55;
    f.write_all_at(&b, at).unwrap();
    drop(f);

    let store = Store::open(&root, StoreConfig::default()).unwrap();
    let report = store.fsck().unwrap();
    let chunks = report.corrupt.iter().filter(|p| p.what == "chunk").count();
    // Which members the damage reaches depends on where it lands (a flipped literal
    // spoils one member, a flipped sequence the rest of the frame): each is named.
    assert!(chunks >= 1, "{report:?}");
    assert!(
        report.corrupt.iter().all(|p| p.what == "chunk"),
        "{report:?}"
    );
    let out = tmp.path().join("out");
    assert!(store.export_dir(&r.snapshot, &out).is_err());

    let repaired = store.repair(&report, true).unwrap();
    assert_eq!(
        repaired.quarantined.len(),
        report.corrupt.len(),
        "{repaired:?}"
    );
    store.import_dir(&src, &ImportOptions::new()).unwrap();
    let report = store.fsck().unwrap();
    assert!(report.is_clean(), "{report:?}");
    store.export_dir(&r.snapshot, &out).unwrap();
    assert_eq!(common::listing(&src), common::listing(&out));
}

/// Records of a pack: (kind, raw_len) each.
fn records(pack: &Path) -> Vec<(u8, u32)> {
    let bytes = fs::read(pack).unwrap();
    let mut at = 8;
    let mut out = Vec::new();
    while at < bytes.len() {
        let h = &bytes[at..at + 44];
        let stored = u32::from_le_bytes(h[4..8].try_into().unwrap()) as usize;
        out.push((h[0], u32::from_le_bytes(h[8..12].try_into().unwrap())));
        at += 44 + stored;
    }
    out
}

#[test]
fn a_large_file_is_compressed_in_runs_and_an_edit_adds_only_what_it_changed() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir(&src).unwrap();
    // 4 MiB of text that varies (so FastCDC finds many cuts) and compresses.
    let text: String = (0..120_000u32)
        .map(|i| format!("#define REG_{i:06} 0x{:08x}\n", i.wrapping_mul(2654435761)))
        .collect();
    fs::write(src.join("regs.h"), &text).unwrap();
    let root = tmp.path().join("root");
    let store = Store::init(&root, StoreConfig::default()).unwrap();
    let r = store.import_dir(&src, &ImportOptions::new()).unwrap();
    let recs: Vec<(u8, u32)> = common::pack_files(&root)
        .iter()
        .flat_map(|p| records(p))
        .collect();
    assert!(
        recs.iter().any(|(k, raw)| *k == 5 && *raw > 512 * 1024),
        "the file's chunks went into runs: {recs:?}"
    );
    let out = tmp.path().join("out");
    store.export_dir(&r.snapshot, &out).unwrap();
    assert_eq!(fs::read(out.join("regs.h")).unwrap(), text.as_bytes());
    assert!(store.fsck().unwrap().is_clean());

    // One line changed in the middle: only the chunks around it are new.
    let edited = text.replacen("#define REG_060000", "#define REG_EDITED", 1);
    fs::write(src.join("regs.h"), &edited).unwrap();
    let r2 = store.import_dir(&src, &ImportOptions::new()).unwrap();
    assert!(r2.new_bytes_raw < 600 * 1024, "{r2:?}");
    let out2 = tmp.path().join("out2");
    store.export_dir(&r2.snapshot, &out2).unwrap();
    assert_eq!(fs::read(out2.join("regs.h")).unwrap(), edited.as_bytes());
    assert!(store.fsck().unwrap().is_clean());
}
