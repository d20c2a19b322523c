//! The native lower (an EROFS metadata image over the blob cache as a data-only overlay
//! layer): a crafted snapshot whose entries carry overlay xattrs of their own cannot
//! redirect a file to another blob, hide a file or make a directory opaque; the
//! workspace shows those xattrs as the snapshot has them, and a commit keeps them. File
//! bytes come from the blob file's page cache, shared by workspaces of two snapshots
//! holding the same content. Root only (mounts).

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use cowspace::runtime::{CommitOptions, CreateOptions, Runtime};
use cowspace_store::browse::Found;
use cowspace_store::{Entry, Expect, FileContent, Source};

/// The entry at `path` of `snap`.
fn entry(store: &cowspace_store::Store, snap: &cowspace_store::SnapshotId, path: &str) -> Entry {
    match store.lookup(snap, path).unwrap() {
        Found::Leaf(e) => e,
        Found::Dir { entry, .. } => entry.expect("not the root"),
    }
}

fn create(rt: &Runtime, snapshot: &str) -> cowspace::registry::Record {
    rt.create(&CreateOptions {
        snapshot: snapshot.into(),
        materializer: Some("overlay".parse().unwrap()),
        lower: Some("native".parse().unwrap()),
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("create --lower native: {e}"))
}

fn xattrs(p: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<_> = xattr::list(p)
        .unwrap()
        .map(|n| {
            let v = xattr::get(p, &n).unwrap().unwrap_or_default();
            (n.to_string_lossy().into_owned(), v)
        })
        .collect();
    out.sort();
    out
}

#[test]
fn overlay_xattrs_in_a_snapshot_are_content_not_instructions() {
    if !crate::common::can_run() {
        return;
    }
    let env = crate::common::Env::new("cowspace-native-");
    let _cleanup = crate::common::Cleanup(env.store.root().to_path_buf());
    let src = env.dir("src");
    fs::write(src.join("victim"), "my own bytes\n").unwrap();
    fs::write(src.join("secret"), "another file's bytes\n").unwrap();
    fs::create_dir_all(src.join("dir")).unwrap();
    fs::write(src.join("dir/inside"), "inside\n").unwrap();
    fs::write(src.join("hidden"), "still here\n").unwrap();
    let base = env.import(&src);

    // Craft what an import never records: the store's own editor puts overlay xattrs on
    // entries, naming the blob of `secret` as `victim`'s data.
    let b = entry(&env.store, &base, "secret");
    let secret_id = b.content().unwrap();
    let redirect = format!("/{}/{}", &secret_id.to_hex()[..2], secret_id.to_hex());
    let victim = entry(&env.store, &base, "victim");
    let mut crafted = vec![
        (b"trusted.overlay.metacopy".to_vec(), vec![]),
        (
            b"trusted.overlay.redirect".to_vec(),
            redirect.clone().into_bytes(),
        ),
        (b"user.overlay.metacopy".to_vec(), vec![]),
        (b"user.overlay.redirect".to_vec(), redirect.into_bytes()),
    ];
    crafted.sort();
    let mut ed = env.store.edit(&base).unwrap();
    ed.put_stored_file(
        b"victim",
        FileContent {
            id: victim.content().unwrap(),
            size: victim.size,
        },
        0o644,
        crafted.clone(),
    )
    .unwrap();
    let opaque = vec![
        (b"trusted.overlay.opaque".to_vec(), b"y".to_vec()),
        (b"user.overlay.opaque".to_vec(), b"y".to_vec()),
    ];
    ed.put_dir(b"dir", 0o755, opaque.clone()).unwrap();
    let hidden = entry(&env.store, &base, "hidden");
    ed.put_stored_file(
        b"hidden",
        FileContent {
            id: hidden.content().unwrap(),
            size: hidden.size,
        },
        0o644,
        vec![(b"trusted.overlay.whiteout".to_vec(), vec![])],
    )
    .unwrap();
    let snap = ed
        .commit(
            "crafted",
            Source::Workspace { id: "test".into() },
            Some(("crafted", Expect::Any)),
        )
        .unwrap()
        .snapshot;

    let rt = Runtime::open(env.store.root()).unwrap();
    let ws = create(&rt, &snap.to_hex());
    assert_eq!(ws.lower_kind, cowspace::materializer::LowerKind::Native);
    // Its own bytes, its own xattrs, shown as the snapshot has them.
    assert_eq!(
        fs::read_to_string(ws.path.join("victim")).unwrap(),
        "my own bytes\n"
    );
    let shown: Vec<(Vec<u8>, Vec<u8>)> = xattrs(&ws.path.join("victim"))
        .into_iter()
        .map(|(k, v)| (k.into_bytes(), v))
        .collect();
    assert_eq!(shown, crafted);
    // Not opaque: what the directory holds is there; not a whiteout: the file is there.
    assert_eq!(
        fs::read_to_string(ws.path.join("dir/inside")).unwrap(),
        "inside\n"
    );
    assert_eq!(
        fs::read_to_string(ws.path.join("hidden")).unwrap(),
        "still here\n"
    );
    // A write elsewhere, then the commit keeps the crafted xattrs as they were.
    fs::write(ws.path.join("new"), "new\n").unwrap();
    let committed = rt
        .commit(&ws.id, &CommitOptions::default())
        .unwrap()
        .snapshot;
    let e = entry(&env.store, &committed, "victim");
    assert_eq!(e.xattrs, crafted);
    assert_eq!(entry(&env.store, &committed, "dir").xattrs, opaque);
    // And a workspace of the commit reads the same.
    let again = create(&rt, &committed.to_hex());
    assert_eq!(
        fs::read_to_string(again.path.join("victim")).unwrap(),
        "my own bytes\n"
    );
}

/// Bytes of `path` in the page cache (util-linux `fincore`).
fn resident_bytes(path: &Path) -> u64 {
    let out = std::process::Command::new("fincore")
        .args(["--bytes", "--noheadings", "--output", "RES"])
        .arg(path)
        .output()
        .expect("fincore (util-linux)");
    assert!(out.status.success(), "fincore: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// Drops the clean pages of `path` from the page cache (`dd iflag=nocache count=0`:
/// `POSIX_FADV_DONTNEED` over the whole file).
fn evict_pages(path: &Path) {
    // Written pages stay until they are on disk.
    fs::File::open(path).unwrap().sync_all().unwrap();
    let st = std::process::Command::new("dd")
        .arg(format!("if={}", path.display()))
        .args(["iflag=nocache", "count=0", "status=none"])
        .status()
        .unwrap();
    assert!(st.success());
}

/// Bytes this process caused to be read from storage (`/proc/self/io`).
fn read_bytes() -> u64 {
    fs::read_to_string("/proc/self/io")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("read_bytes: "))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn reads_share_the_blob_page_cache_across_snapshots() {
    if !crate::common::can_run() {
        return;
    }
    let env = crate::common::Env::new("cowspace-native-pc-");
    let _cleanup = crate::common::Cleanup(env.store.root().to_path_buf());
    let big: Vec<u8> = (0..8u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 24) as u8)
        .collect();
    let s1 = env.dir("s1");
    fs::write(s1.join("big.bin"), &big).unwrap();
    fs::write(s1.join("only-in-s1"), "one\n").unwrap();
    let s2 = env.dir("s2");
    fs::create_dir_all(s2.join("elsewhere")).unwrap();
    fs::write(s2.join("elsewhere/same.bin"), &big).unwrap();
    let snap1 = env.import(&s1);
    let snap2 = env.import(&s2);
    assert_ne!(snap1, snap2);
    let rt = Runtime::open(env.store.root()).unwrap();
    let w1 = create(&rt, &snap1.to_hex());
    let w2 = create(&rt, &snap2.to_hex());
    let id = entry(&env.store, &snap1, "big.bin").content().unwrap();
    let blob = env.store.blob_cache().path(&id);
    assert!(
        blob.is_file(),
        "the blob {} is in the cache",
        blob.display()
    );

    // Reading through the first workspace fills the blob's own pages: the bytes are the
    // blob file's, not a copy in another inode.
    evict_pages(&blob);
    let len = big.len() as u64;
    let before = resident_bytes(&blob);
    assert!(
        before < len,
        "the blob's pages were dropped ({before} of {len} bytes resident)"
    );
    assert_eq!(fs::read(w1.path.join("big.bin")).unwrap(), big);
    assert_eq!(
        resident_bytes(&blob),
        len,
        "reading through the workspace filled the blob's own pages"
    );

    // The other snapshot's workspace has not read its file, yet every page of it is in
    // memory: its pages are the blob's (a view lower's file would have none yet).
    assert_eq!(
        resident_bytes(&w2.path.join("elsewhere/same.bin")),
        len,
        "the second snapshot's file shares the blob's pages"
    );
    // It reads the same content from those pages: no storage read at all.
    let io = read_bytes();
    assert_eq!(fs::read(w2.path.join("elsewhere/same.bin")).unwrap(), big);
    assert_eq!(
        read_bytes() - io,
        0,
        "the second snapshot's read went to storage"
    );
    // And both report the snapshot's metadata, not the blob's.
    let m = fs::metadata(w2.path.join("elsewhere/same.bin")).unwrap();
    assert_eq!(m.len(), big.len() as u64);
    assert_eq!(m.mode() & 0o7777, 0o644);
}

#[test]
fn files_of_every_size_around_the_inline_bound_read_back_exactly() {
    if !crate::common::can_run() {
        return;
    }
    let env = crate::common::Env::new("cowspace-native-sizes-");
    let _cleanup = crate::common::Cleanup(env.store.root().to_path_buf());
    let src = env.dir("src");
    let bound = cowspace::native::INLINE_MAX as usize;
    let mut sizes = vec![
        0, 1, 63, 64, 65, 511, 512, 513, 4095, 4096, 4097, 8192, 65537,
    ];
    sizes.extend([bound - 1, bound, bound + 1]);
    // Many small files in one directory: their inline bytes fill and cross image blocks.
    for (i, size) in sizes
        .iter()
        .chain(&[bound; 40])
        .chain(&[bound - 100; 40])
        .enumerate()
    {
        let bytes: Vec<u8> = (0..*size).map(|j| (j * 31 + i * 7) as u8).collect();
        fs::write(src.join(format!("f{i:03}-{size}")), bytes).unwrap();
    }
    // Files near the bound with xattrs, which share the inode's block with the bytes.
    for (i, (size, xattr)) in [
        (bound, 100),
        (bound - 100, 100),
        (bound - 400, 390),
        (512, 3000),
    ]
    .into_iter()
    .enumerate()
    {
        let p = src.join(format!("x{i}-{size}-{xattr}"));
        fs::write(&p, vec![b'x'; size]).unwrap();
        xattr::set(&p, "user.pad", &vec![b'v'; xattr]).unwrap();
    }
    let snap = env.import(&src);
    let rt = Runtime::open(env.store.root()).unwrap();
    let ws = create(&rt, &snap.to_hex());
    for e in fs::read_dir(&src).unwrap().flatten() {
        let name = e.file_name();
        assert_eq!(
            fs::read(ws.path.join(&name)).unwrap_or_else(|err| panic!("{name:?}: {err}")),
            fs::read(e.path()).unwrap(),
            "{name:?}"
        );
        assert_eq!(
            xattr::get(ws.path.join(&name), "user.pad").unwrap(),
            xattr::get(e.path(), "user.pad").unwrap(),
            "{name:?}"
        );
    }
}
