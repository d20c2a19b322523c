//! A flipped byte in a pack: `fsck` exits 8 naming the object; reads refuse it.

use std::fs;
use std::path::{Path, PathBuf};

use cowspace_tests::{TestRoot, dir_entries, noise, write_file};

const PACK_MAGIC: &[u8] = b"CWSPACK1";
/// kind, codec, pad, stored_len, raw_len, id (docs/store-format.md).
const RECORD_HEADER_BYTES: usize = 44;

/// One record of a pack: its object id, kind, and where its stored bytes are.
#[derive(Debug)]
struct Record {
    id: String,
    kind: u8,
    data_offset: usize,
    stored_len: usize,
}

fn records(pack: &[u8]) -> Vec<Record> {
    assert_eq!(&pack[..8], PACK_MAGIC, "not a pack");
    let mut out = Vec::new();
    let mut at = PACK_MAGIC.len();
    while at < pack.len() {
        let h = &pack[at..at + RECORD_HEADER_BYTES];
        let stored_len = u32::from_le_bytes(h[4..8].try_into().unwrap()) as usize;
        let id = h[12..44].iter().map(|b| format!("{b:02x}")).collect();
        out.push(Record {
            id,
            kind: h[0],
            data_offset: at + RECORD_HEADER_BYTES,
            stored_len,
        });
        at += RECORD_HEADER_BYTES + stored_len;
    }
    assert_eq!(at, pack.len(), "records do not end at the end of the pack");
    out
}

fn the_pack(r: &TestRoot) -> PathBuf {
    let packs = r.pack_files();
    assert_eq!(packs.len(), 1, "{packs:?}");
    r.root().join("store/packs").join(packs.first().unwrap())
}

/// Flips one byte in the middle of the stored bytes of the largest record of `kind`;
/// gives that record's object id.
fn flip_in_largest(pack: &Path, kind: u8) -> String {
    let mut bytes = fs::read(pack).unwrap();
    let recs = records(&bytes);
    let rec = recs
        .iter()
        .filter(|r| r.kind == kind)
        .max_by_key(|r| r.stored_len)
        .unwrap_or_else(|| panic!("no record of kind {kind}: {recs:?}"));
    let at = rec.data_offset + rec.stored_len / 2;
    assert!(at > 52 + 8, "{rec:?}");
    bytes[at] ^= 0x5a;
    fs::write(pack, bytes).unwrap();
    rec.id.clone()
}

fn corrupted_store(kind: u8) -> (TestRoot, String, String) {
    let r = TestRoot::new();
    let src = r.path("src");
    write_file(&src.join("big.bin"), noise(3, 200 * 1024));
    write_file(&src.join("small.txt"), "small\n");
    write_file(&src.join("dir/inner.txt"), "inner\n");
    let snap = r.import(&src, &["--ref", "main"])["snapshot"]
        .as_str()
        .unwrap()
        .to_owned();
    r.json(["fsck"]).ok();
    let id = flip_in_largest(&the_pack(&r), kind);
    (r, snap, id)
}

fn assert_fsck_names(r: &TestRoot, id: &str) {
    let out = r.json(["fsck"]).code(8);
    let v = out.json();
    assert_eq!(v["error"]["kind"], "corrupt", "{v}");
    assert_eq!(v["ok"], false, "{v}");
    let corrupt = v["report"]["corrupt"].as_array().unwrap();
    assert!(
        corrupt.iter().any(|c| c["id"] == id),
        "{id} not listed: {v}"
    );
    // Text mode lists it on stdout too.
    let out = r.run(["fsck"]).code(8);
    assert!(out.stdout.contains(id), "{out:?}");
}

fn assert_export_refused(r: &TestRoot, snap: &str) {
    let before = dir_entries(r.scratch());
    for tar in [false, true] {
        let dest = r.path(if tar { "out.tar" } else { "out" });
        let mut args = vec!["export", snap, dest.to_str().unwrap()];
        if tar {
            args.push("--tar");
        }
        let err = r.json(&args).error(8, "corrupt");
        assert!(
            err["message"].as_str().unwrap().contains("corrupt"),
            "{err}"
        );
        assert!(!dest.exists(), "{dest:?} left behind");
        // No temporary file or directory beside DEST, none under the root's tmp.
        assert_eq!(dir_entries(r.scratch()), before);
        let tmp = r.root().join("tmp");
        if tmp.exists() {
            assert_eq!(dir_entries(&tmp), Vec::<String>::new());
        }
    }
}

#[test]
fn a_flipped_byte_in_a_chunk_is_found_and_never_served() {
    let (r, snap, id) = corrupted_store(1);
    assert_fsck_names(&r, &id);
    assert_export_refused(&r, &snap);
    // A diff with a patch needs the content too.
    let src = r.path("src");
    write_file(&src.join("big.bin"), noise(4, 200 * 1024));
    let other = r.import(&src, &[])["snapshot"].as_str().unwrap().to_owned();
    r.json(["diff", &snap, &other, "--patch"])
        .error(8, "corrupt");
}

#[test]
fn a_flipped_byte_in_a_tree_is_found_and_never_served() {
    let (r, snap, id) = corrupted_store(3);
    assert_fsck_names(&r, &id);
    assert_export_refused(&r, &snap);
}
