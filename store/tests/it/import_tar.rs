//! Tar import: archives from GNU tar and from the `tar` crate import to exactly what
//! `tar -x` makes of them; unsafe entries are refused with nothing stored.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use cowspace_store::{ErrorKind, ImportOptions, Source, Store, StoreConfig, TreeId};
use proptest::prelude::*;

use crate::common;

/// A canonical listing of a tree: root mode, then path, kind, mode, size, content or
/// target, link count and recorded xattrs of everything under it.
fn listing(root: &Path) -> Vec<String> {
    fn xattrs(p: &Path) -> String {
        let mut v: Vec<String> = xattr::list(p)
            .map(|names| {
                names
                    .filter(|n| n.to_string_lossy().starts_with("user."))
                    .map(|n| {
                        let val = xattr::get(p, &n).ok().flatten().unwrap_or_default();
                        format!("{}={}", n.to_string_lossy(), String::from_utf8_lossy(&val))
                    })
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v.join(",")
    }
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for n in common::sorted_names(dir) {
            let p = dir.join(&n);
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            let m = fs::symlink_metadata(&p).unwrap();
            let mode = m.permissions().mode() & 0o7777;
            let ft = m.file_type();
            if ft.is_dir() {
                out.push(format!("d {rel} {mode:o} [{}]", xattrs(&p)));
                walk(root, &p, out);
            } else if ft.is_symlink() {
                out.push(format!(
                    "l {rel} -> {}",
                    fs::read_link(&p).unwrap().display()
                ));
            } else if ft.is_fifo() {
                out.push(format!("p {rel} {mode:o}"));
            } else if ft.is_char_device() || ft.is_block_device() {
                out.push(format!("c {rel} {mode:o} {}", m.rdev()));
            } else {
                let data = fs::read(&p).unwrap();
                out.push(format!(
                    "f {rel} {mode:o} {} {} nlink={} [{}]",
                    data.len(),
                    blake3::hash(&data).to_hex(),
                    m.nlink(),
                    xattrs(&p)
                ));
            }
        }
    }
    let mode = fs::metadata(root).unwrap().permissions().mode() & 0o7777;
    let mut out = vec![format!("root {mode:o}")];
    walk(root, root, &mut out);
    out
}

/// Asserts two trees are the same, showing their entries when they are not.
fn assert_same_tree(store: &Store, a: &TreeId, b: &TreeId) {
    fn dump(store: &Store, id: &TreeId, pre: &str, out: &mut Vec<String>) {
        for e in store.tree(id).unwrap().entries {
            let n = format!("{pre}{}", String::from_utf8_lossy(&e.name));
            out.push(format!(
                "{n} {:?} {:o} {} {:?} {:?}",
                e.kind,
                e.mode,
                e.size,
                String::from_utf8_lossy(&e.data),
                e.xattrs
            ));
            if let Some(s) = e.subtree() {
                dump(store, &s, &format!("{n}/"), out);
            }
        }
    }
    if a != b {
        let (mut x, mut y) = (vec![], vec![]);
        dump(store, a, "", &mut x);
        dump(store, b, "", &mut y);
        assert_eq!(x, y);
        panic!("trees {a} and {b} differ but list the same");
    }
}

fn sh(cmd: &str) {
    let st = Command::new("sh").arg("-c").arg(cmd).status().unwrap();
    assert!(st.success(), "{cmd}");
}

fn q(p: &Path) -> String {
    format!("'{}'", p.display())
}

/// What `tar -x` makes of an archive (as this user, keeping permissions and xattrs).
fn tar_x(archive: &Path, dest: &Path) {
    fs::create_dir(dest).unwrap();
    sh(&format!(
        "umask 022; tar --xattrs --xattrs-include='user.*' -xpf {} -C {}",
        q(archive),
        q(dest)
    ));
}

fn new_store(tmp: &Path) -> Store {
    Store::init(&tmp.join("root"), StoreConfig::default()).unwrap()
}

fn random_bytes(n: usize, seed: u32) -> Vec<u8> {
    (0..n as u32)
        .map(|i| (i.wrapping_add(seed).wrapping_mul(2654435761) >> 13) as u8)
        .collect()
}

fn xattrs_supported(dir: &Path) -> bool {
    let p = dir.join(".xattr-probe");
    fs::write(&p, "").unwrap();
    let ok = xattr::set(&p, "user.probe", b"1").is_ok();
    fs::remove_file(&p).unwrap();
    ok
}

/// A source tree with everything a tar can carry that our trees keep.
fn make_source(src: &Path) -> bool {
    let long_dir = format!("a/{}", "d".repeat(120));
    fs::create_dir_all(src.join(&long_dir)).unwrap();
    fs::create_dir_all(src.join("a/empty")).unwrap();
    fs::write(src.join(&long_dir).join("f".repeat(150)), "long name\n").unwrap();
    fs::write(src.join("a/hello.txt"), "hello\n").unwrap();
    fs::write(src.join("a/run.sh"), "#!/bin/sh\necho hi\n").unwrap();
    fs::set_permissions(src.join("a/run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(src.join("big.bin"), random_bytes(1_500_000, 7)).unwrap();
    fs::write(src.join("empty"), "").unwrap();
    fs::hard_link(src.join("a/hello.txt"), src.join("z-link.txt")).unwrap();
    let long_target = format!("{}a/hello.txt", "./".repeat(60));
    std::os::unix::fs::symlink(&long_target, src.join("a/long-link")).unwrap();
    std::os::unix::fs::symlink("../big.bin", src.join("a/up")).unwrap();
    nix::unistd::mkfifo(
        &src.join("pipe"),
        nix::sys::stat::Mode::from_bits_truncate(0o640),
    )
    .unwrap();
    fs::set_permissions(src.join("a/empty"), fs::Permissions::from_mode(0o700)).unwrap();
    fs::set_permissions(src, fs::Permissions::from_mode(0o750)).unwrap();
    let xattrs = xattrs_supported(src);
    if xattrs {
        xattr::set(src.join("a/hello.txt"), "user.note", b"greeting").unwrap();
        xattr::set(src.join("a"), "user.dir", b"yes").unwrap();
    }
    xattrs
}

fn gzip(src: &Path, dest: &Path) {
    let mut e = flate2::write::GzEncoder::new(
        fs::File::create(dest).unwrap(),
        flate2::Compression::default(),
    );
    e.write_all(&fs::read(src).unwrap()).unwrap();
    e.finish().unwrap();
}

fn zstd_compress(src: &Path, dest: &Path) {
    let data = zstd::encode_all(fs::read(src).unwrap().as_slice(), 3).unwrap();
    fs::write(dest, data).unwrap();
}

#[test]
fn gnu_tar_pax_archive_imports_as_tar_x_extracts_it() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir(&src).unwrap();
    let with_xattrs = make_source(&src);
    let archive = tmp.path().join("a.tar");
    sh(&format!(
        "tar --format=pax --xattrs --xattrs-include='user.*' -cf {} -C {} .",
        q(&archive),
        q(&src)
    ));
    let store = new_store(tmp.path());
    let r = store.import_tar(&archive, &ImportOptions::new()).unwrap();
    assert_eq!(r.symlinks, 2);
    let out = tmp.path().join("out");
    store.export_dir(&r.snapshot, &out).unwrap();
    let ext = tmp.path().join("ext");
    tar_x(&archive, &ext);
    let got = listing(&out);
    assert_eq!(got, listing(&ext));
    assert_eq!(got, listing(&src));
    assert!(got.contains(&"root 750".to_string()), "{got:?}");
    if with_xattrs {
        assert!(
            got.iter().any(|l| l.contains("user.note=greeting")),
            "{got:?}"
        );
        assert!(got.iter().any(|l| l.contains("user.dir=yes")), "{got:?}");
    }
    assert!(
        got.iter().any(|l| l.contains("nlink=2")),
        "hard link kept: {got:?}"
    );

    // The same files imported as a directory give the same tree.
    let d = store.import_dir(&src, &ImportOptions::new()).unwrap();
    assert_same_tree(&store, &d.root, &r.root);
    assert_eq!(d.root, r.root);

    // Provenance: the archive's path and the BLAKE3 of its bytes.
    let snap = store.snapshot(&r.snapshot).unwrap();
    let want = blake3::hash(&fs::read(&archive).unwrap())
        .to_hex()
        .to_string();
    match snap.source {
        Source::Tar { digest, path } => {
            assert_eq!(digest, want);
            assert!(path.ends_with("a.tar"));
        }
        s => panic!("source {s:?}"),
    }

    // Compressed variants (recognised by magic bytes, whatever the name) and GNU format.
    let gz = tmp.path().join("a.tar.gz");
    gzip(&archive, &gz);
    let zst = tmp.path().join("archive.bin");
    zstd_compress(&archive, &zst);
    let gnu = tmp.path().join("gnu.tar");
    sh(&format!(
        "tar --format=gnu -cf {} -C {} .",
        q(&gnu),
        q(&src)
    ));
    for (p, same_digest_as) in [(&gz, &gz), (&zst, &zst), (&gnu, &gnu)] {
        let r2 = store.import_tar(p, &ImportOptions::new()).unwrap();
        if p != &gnu || !with_xattrs {
            assert_eq!(r2.root, r.root, "{}", p.display());
        }
        let Source::Tar { digest, .. } = store.snapshot(&r2.snapshot).unwrap().source else {
            panic!()
        };
        let want = blake3::hash(&fs::read(same_digest_as).unwrap())
            .to_hex()
            .to_string();
        assert_eq!(digest, want, "digest of the compressed bytes");
    }

    // export_tar then import_tar: the same tree.
    let exported = tmp.path().join("exported.tar");
    store.export_tar(&r.snapshot, &exported).unwrap();
    let r3 = store.import_tar(&exported, &ImportOptions::new()).unwrap();
    assert_same_tree(&store, &r3.root, &r.root);
    let ext2 = tmp.path().join("ext2");
    tar_x(&exported, &ext2);
    assert_eq!(listing(&ext2), got, "GNU tar reads our export the same way");
}

/// Appends an entry with a raw name and link name (bypassing the `tar` crate's checks).
fn raw(b: &mut tar::Builder<Vec<u8>>, ty: u8, name: &[u8], link: &[u8], data: &[u8]) {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::new(ty));
    h.set_mode(0o644);
    h.set_size(data.len() as u64);
    h.set_mtime(1);
    h.set_device_major(0).unwrap();
    h.set_device_minor(0).unwrap();
    let old = h.as_old_mut();
    old.name = [0; 100];
    old.name[..name.len()].copy_from_slice(name);
    old.linkname = [0; 100];
    old.linkname[..link.len()].copy_from_slice(link);
    h.set_cksum();
    b.append(&h, data).unwrap();
}

fn file(b: &mut tar::Builder<Vec<u8>>, path: &str, mode: u32, data: &[u8]) {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(mode);
    h.set_size(data.len() as u64);
    b.append_data(&mut h, path, data).unwrap();
}

fn dir(b: &mut tar::Builder<Vec<u8>>, path: &str, mode: u32) {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Directory);
    h.set_mode(mode);
    h.set_size(0);
    b.append_data(&mut h, path, std::io::empty()).unwrap();
}

fn link(b: &mut tar::Builder<Vec<u8>>, ty: tar::EntryType, path: &str, target: &str) {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(ty);
    h.set_mode(0o777);
    h.set_size(0);
    b.append_link(&mut h, path, target).unwrap();
}

fn finish(b: tar::Builder<Vec<u8>>, dest: &Path) -> PathBuf {
    fs::write(dest, b.into_inner().unwrap()).unwrap();
    dest.to_path_buf()
}

#[test]
fn entries_in_any_order_and_later_duplicates_win() {
    let tmp = tempfile::tempdir().unwrap();
    let mut b = tar::Builder::new(Vec::new());
    file(&mut b, "d/f", 0o600, b"file before its dir\n");
    dir(&mut b, "d/", 0o710);
    dir(&mut b, "./", 0o711);
    file(&mut b, "dup", 0o644, b"first\n");
    file(&mut b, "dup", 0o755, b"second wins\n");
    let long = format!("x/{}/{}", "y".repeat(110), "z".repeat(120));
    file(&mut b, &long, 0o644, b"gnu long name\n");
    link(
        &mut b,
        tar::EntryType::Symlink,
        "s",
        &format!("{}d/f", "./".repeat(70)),
    );
    link(&mut b, tar::EntryType::Link, "h1", "d/f");
    link(&mut b, tar::EntryType::Link, "x/h2", "h1");
    dir(&mut b, "empty/", 0o755);
    let archive = finish(b, &tmp.path().join("t.tar"));

    let store = new_store(tmp.path());
    let r = store.import_tar(&archive, &ImportOptions::new()).unwrap();
    let out = tmp.path().join("out");
    store.export_dir(&r.snapshot, &out).unwrap();
    let ext = tmp.path().join("ext");
    tar_x(&archive, &ext);
    let got = listing(&out);
    assert_eq!(got, listing(&ext));
    assert!(got.contains(&"root 711".to_string()), "{got:?}");
    assert!(got.contains(&"d d 710 []".to_string()), "{got:?}");
    assert!(
        got.iter().any(|l| l.starts_with("f dup 755 12 ")),
        "{got:?}"
    );
    assert!(got.iter().any(|l| l.contains("nlink=3")), "{got:?}");
    assert_eq!(
        r.files, 3,
        "dup, the long name and one file for the link group"
    );
}

#[test]
fn default_and_user_excludes_apply() {
    let tmp = tempfile::tempdir().unwrap();
    let mut b = tar::Builder::new(Vec::new());
    file(&mut b, "src/main.rs", 0o644, b"fn main() {}\n");
    file(&mut b, "node_modules/x/index.js", 0o644, b"x\n");
    file(&mut b, "node_modules/y/index.js", 0o644, b"y\n");
    file(&mut b, "web/node_modules/z.js", 0o644, b"z\n");
    file(&mut b, "notes.log", 0o644, b"log\n");
    file(&mut b, "keep/Cargo.lock", 0o644, b"lock\n");
    let archive = finish(b, &tmp.path().join("t.tar"));
    let store = new_store(tmp.path());
    let mut opts = ImportOptions::new();
    opts.excludes = vec!["*.log".into(), "*.lock".into()];
    let r = store.import_tar(&archive, &opts).unwrap();
    assert_eq!(
        r.excluded, 3,
        "two node_modules dirs once each, one log file"
    );
    let out = tmp.path().join("out");
    store.export_dir(&r.snapshot, &out).unwrap();
    assert!(out.join("src/main.rs").exists());
    assert!(out.join("keep/Cargo.lock").exists(), "lockfiles are kept");
    assert!(!out.join("node_modules").exists());
    assert!(!out.join("web/node_modules").exists());
    assert!(!out.join("notes.log").exists());
}

/// Builds an archive: a big file (so chunks reach the pack writer), then `bad`.
fn with_bad(dest: &Path, bad: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> PathBuf {
    let mut b = tar::Builder::new(Vec::new());
    dir(&mut b, "./", 0o755);
    file(&mut b, "big.bin", 0o644, &random_bytes(2_000_000, 99));
    dir(&mut b, "a/", 0o755);
    file(&mut b, "a/f", 0o644, b"f\n");
    raw(&mut b, b'5', b"a/sub/", b"", b"");
    bad(&mut b);
    file(&mut b, "after", 0o644, b"never reached\n");
    finish(b, dest)
}

#[test]
fn unsafe_entries_are_refused_and_nothing_is_stored() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let store = new_store(tmp.path());
    // One good import first, so the store is not trivially empty.
    let good = with_bad(&tmp.path().join("good.tar"), |_| {});
    store.import_tar(&good, &ImportOptions::new()).unwrap();
    let before_ids = store.snapshot_ids().unwrap();
    let before_packs = common::pack_files(&root).len();

    type Bad = Box<dyn FnOnce(&mut tar::Builder<Vec<u8>>)>;
    let long_name = format!("{}/x", "n".repeat(256));
    let cases: Vec<(&str, &str, Bad)> = vec![
        (
            "absolute",
            "/etc/evil",
            Box::new(|b| raw(b, b'0', b"/etc/evil", b"", b"x")),
        ),
        (
            "dotdot",
            "a/../../evil",
            Box::new(|b| raw(b, b'0', b"a/../../evil", b"", b"x")),
        ),
        (
            "hardlink absent",
            "hl",
            Box::new(|b| raw(b, b'1', b"hl", b"nothere", b"")),
        ),
        (
            "hardlink outside",
            "hl",
            Box::new(|b| raw(b, b'1', b"hl", b"../etc/passwd", b"")),
        ),
        (
            "hardlink absolute",
            "hl",
            Box::new(|b| raw(b, b'1', b"hl", b"/etc/passwd", b"")),
        ),
        (
            "hardlink to a dir",
            "hl",
            Box::new(|b| raw(b, b'1', b"hl", b"a/sub", b"")),
        ),
        (
            "hardlink to later file",
            "hl",
            Box::new(|b| {
                raw(b, b'1', b"hl", b"later", b"");
                raw(b, b'0', b"later", b"", b"x");
            }),
        ),
        (
            "symlink escaping",
            "a/esc",
            Box::new(|b| raw(b, b'2', b"a/esc", b"../../etc", b"")),
        ),
        (
            "symlink absolute",
            "a/abs",
            Box::new(|b| raw(b, b'2', b"a/abs", b"/etc/passwd", b"")),
        ),
        (
            "write through symlink",
            "l/f",
            Box::new(|b| {
                raw(b, b'2', b"l", b"a", b"");
                raw(b, b'0', b"l/f", b"", b"x");
            }),
        ),
        (
            "char device",
            "dev/null",
            Box::new(|b| raw(b, b'3', b"dev/null", b"", b"")),
        ),
        (
            "block device",
            "sda",
            Box::new(|b| raw(b, b'4', b"sda", b"", b"")),
        ),
        (
            "unknown type",
            "weird",
            Box::new(|b| raw(b, b'Z', b"weird", b"", b"")),
        ),
        (
            "volume label",
            "label",
            Box::new(|b| raw(b, b'V', b"label", b"", b"")),
        ),
        (
            "name too long",
            "nnnn",
            Box::new(move |b| file(b, &long_name, 0o644, b"x")),
        ),
    ];
    for (what, entry, bad) in cases {
        let archive = with_bad(&tmp.path().join(format!("{what}.tar")), bad);
        let e = store
            .import_tar(&archive, &ImportOptions::new())
            .expect_err(what);
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{what}: {e}");
        assert!(e.to_string().contains(entry), "{what}: {e}");
        assert_eq!(store.snapshot_ids().unwrap(), before_ids, "{what}");
        assert_eq!(
            common::pack_files(&root).len(),
            before_packs,
            "{what}: the session's packs are removed"
        );
    }
    // A fresh open sees exactly what was there.
    let reopened = Store::open(&root, StoreConfig::default()).unwrap();
    assert_eq!(reopened.snapshots().unwrap().len(), before_ids.len());

    // Allowed when asked for.
    let dev = with_bad(&tmp.path().join("dev.tar"), |b| {
        raw(b, b'3', b"null", b"", b"")
    });
    let mut opts = ImportOptions::new();
    opts.allow_devices = true;
    store.import_tar(&dev, &opts).unwrap();
    let esc = with_bad(&tmp.path().join("esc.tar"), |b| {
        raw(b, b'2', b"a/esc", b"../../etc", b"")
    });
    let mut opts = ImportOptions::new();
    opts.allow_external_symlinks = true;
    let r = store.import_tar(&esc, &opts).unwrap();
    assert_eq!(r.symlinks, 1);
    // A symlink pointing up but staying inside is fine by default.
    let inside = with_bad(&tmp.path().join("inside.tar"), |b| {
        raw(b, b'2', b"a/sub/up", b"../../big.bin", b"")
    });
    store.import_tar(&inside, &ImportOptions::new()).unwrap();
}

#[test]
fn not_an_archive_is_invalid_input() {
    let tmp = tempfile::tempdir().unwrap();
    let store = new_store(tmp.path());
    let p = tmp.path().join("x.tar");
    fs::write(&p, vec![b'x'; 4096]).unwrap();
    let e = store.import_tar(&p, &ImportOptions::new()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    let e = store
        .import_tar(&tmp.path().join("missing.tar"), &ImportOptions::new())
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    // Truncated: a header promising more bytes than follow.
    let mut b = tar::Builder::new(Vec::new());
    file(&mut b, "big", 0o644, &random_bytes(100_000, 1));
    let mut bytes = b.into_inner().unwrap();
    bytes.truncate(50_000);
    fs::write(&p, bytes).unwrap();
    let e = store.import_tar(&p, &ImportOptions::new()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert_eq!(common::pack_files(&tmp.path().join("root")).len(), 0);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// Random file sets, packed with the `tar` crate in a random order and without
    /// directory entries, import to the same tree as the same files written to disk.
    #[test]
    fn random_file_sets_match_a_directory_import(
        files in proptest::collection::btree_map(
            "[a-c]{1,2}(/[a-c é]{1,3}){0,2}",
            (proptest::collection::vec(any::<u8>(), 0..2000), any::<bool>()),
            1..12,
        ),
        seed in any::<u64>(),
    ) {
        // Keep only paths that are not a prefix directory of another.
        let paths: Vec<&String> = files.keys().collect();
        let files: Vec<(&String, &(Vec<u8>, bool))> = files
            .iter()
            .filter(|(p, _)| !paths.iter().any(|q| q.starts_with(&format!("{p}/"))))
            .collect();
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        fs::create_dir(&src).unwrap();
        let mut order: Vec<usize> = (0..files.len()).collect();
        let len = order.len();
        for i in 0..len {
            let j = (seed.wrapping_mul(6364136223846793005).wrapping_add(i as u64) % len as u64) as usize;
            order.swap(i, j);
        }
        let mut b = tar::Builder::new(Vec::new());
        for &i in &order {
            let (path, (data, exec)) = files[i];
            let mode = if *exec { 0o755 } else { 0o644 };
            let p = src.join(path);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(&p, data).unwrap();
            fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
            file(&mut b, path, mode, data);
        }
        let archive = finish(b, &tmp.path().join("r.tar"));
        let store = new_store(tmp.path());
        let t = store.import_tar(&archive, &ImportOptions::new()).unwrap();
        let d = store.import_dir(&src, &ImportOptions::new()).unwrap();
        prop_assert_eq!(t.root, d.root);
        let out = tmp.path().join("out");
        store.export_dir(&t.snapshot, &out).unwrap();
        let mut a = listing(&out);
        let mut b = listing(&src);
        a.remove(0);
        b.remove(0);
        prop_assert_eq!(a, b);
    }
}
