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

/// `fsck` names the snapshots, refs and paths that need the damaged object; `fsck
/// --repair` quarantines it; a plain import of the source rewrites it; the snapshot
/// then exports as its source is.
fn located_repaired_by_reimport(kind: u8, path: &str) {
    let (r, snap, id) = corrupted_store(kind);
    let v = r.json(["fsck"]).code(8).json();
    let damage = v["report"]["damage"].as_array().unwrap();
    let d = damage
        .iter()
        .find(|d| d["id"] == id.as_str())
        .expect("located");
    assert_eq!(d["needed_by"][0]["snapshot"], snap.as_str(), "{v}");
    assert_eq!(
        d["needed_by"][0]["refs"],
        serde_json::json!(["main"]),
        "{v}"
    );
    assert_eq!(d["needed_by"][0]["paths"], serde_json::json!([path]), "{v}");
    let out = r.run(["fsck"]).code(8);
    assert!(
        out.stdout.contains(&format!(
            "needed by snapshot {} (ref main): {path}",
            &snap[..12]
        )),
        "{out:?}"
    );
    assert!(
        out.stderr.contains("fsck --repair"),
        "the hint names the repair: {out:?}"
    );

    let v = r.json(["fsck", "--repair"]).code(8).json();
    assert_eq!(v["repair"]["quarantined"], serde_json::json!([id]), "{v}");
    assert_eq!(v["report"]["suspects"], serde_json::json!([id]), "{v}");
    r.import(&r.path("src"), &["--ref", "main"]);
    let v = r.json(["fsck"]).ok().json();
    assert_eq!(v["report"]["suspects"], serde_json::json!([]), "{v}");
    let out = r.path("out");
    r.json(["export", &snap, out.to_str().unwrap()]).ok();
    cowspace_tests::assert_same_tree(&r.path("src"), &out);
}

#[test]
fn a_corrupt_chunk_is_located_and_repaired_by_a_reimport() {
    located_repaired_by_reimport(1, "big.bin");
}

#[test]
fn a_corrupt_tree_is_located_and_repaired_by_a_reimport() {
    located_repaired_by_reimport(3, ".");
}
