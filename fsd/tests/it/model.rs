//! Model-based test of workspaces: random sequences of file operations applied to a
//! workspace and to a plain directory (the model) give the same results (the same errno
//! for every operation) and the same tree; the workspace's commit then exports to exactly
//! the model's tree; every materializer commits the same tree. Root only (mounts).
//!
//! Names are bytes, some not UTF-8, compared byte for byte in listings and exports.
//! `copy_file_range` runs between files of one workspace; where overlay over the view
//! refuses it with `EXDEV` (docs/CONFORMANCE.md), the target must be unchanged and the
//! read/write fallback user space takes must then give the model's bytes.
//!
//! Seeded: `COWSPACE_MODEL_SEED` (default fixed, so CI is reproducible) and
//! `COWSPACE_MODEL_CASES` (default 24) and `COWSPACE_MODEL_OPS` (the longest sequence,
//! default 40) for longer runs on demand; `COWSPACE_MODEL_KINDS` (comma-separated
//! `materializer/lower`, default all five) to run some materializers.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use crate::common::{Cleanup, can_run};
use cowspace::runtime::{CommitOptions, CreateOptions, Runtime};
use cowspace_store::{ImportOptions, Store, StoreConfig};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestRunner};

/// Paths the operations pick from: few, so operations collide often. Names are bytes:
/// some are not UTF-8 (`raw\xff` made in the workspace, `bd/\xfeb` from the snapshot),
/// and listings and exports compare them byte for byte.
const NAMES: &[&[u8]] = &[
    b"a",
    b"b",
    b"d1",
    b"d1/a",
    b"d1/b",
    b"d1/d3",
    b"d1/d3/e",
    b"d2",
    b"d2/c",
    b"base.txt",
    b"bd/f",
    b"bd/g",
    b"bd",
    b"raw\xff",
    b"d2/r\xe9",
    b"bd/\xfeb",
];

/// `NAMES[i]` as a path.
fn name(i: usize) -> &'static Path {
    Path::new(OsStr::from_bytes(NAMES[i]))
}

/// A path's bytes, escaped where they are not printable ASCII: exact, and printable.
fn exact(p: &Path) -> String {
    p.as_os_str().as_bytes().escape_ascii().to_string()
}

#[derive(Debug, Clone)]
enum Op {
    Write {
        path: usize,
        offset: u16,
        len: u16,
        byte: u8,
    },
    Truncate {
        path: usize,
        len: u16,
    },
    Rename {
        from: usize,
        to: usize,
    },
    /// `renameat2(RENAME_EXCHANGE)`: the two names swap.
    Exchange {
        from: usize,
        to: usize,
    },
    Link {
        from: usize,
        to: usize,
    },
    Unlink {
        path: usize,
    },
    Mkdir {
        path: usize,
    },
    Rmdir {
        path: usize,
    },
    Symlink {
        target: usize,
        path: usize,
    },
    Chmod {
        path: usize,
        mode: u16,
    },
    /// Lists a directory (the names are compared too): listings the kernel keeps must
    /// follow every change made before.
    List {
        path: usize,
    },
    /// The workspace root's own mode (the snapshot's `root_mode`).
    ChmodRoot {
        mode: u16,
    },
    /// `ftruncate` one byte longer, then that byte written through a shared mapping.
    GrowMmap {
        path: usize,
        byte: u8,
    },
    /// Reads a file whole (the bytes are compared too): what the kernel cached must
    /// follow every change made before, through any name.
    Read {
        path: usize,
    },
    /// `copy_file_range` from one file of the workspace to another (or the same one),
    /// looped until `len` bytes are copied or the source ends.
    CopyRange {
        from: usize,
        to: usize,
        off_in: u16,
        off_out: u16,
        len: u16,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let p = 0..NAMES.len();
    prop_oneof![
        4 => (p.clone(), any::<u16>(), 0..3000u16, any::<u8>()).prop_map(|(path, offset, len, byte)| Op::Write { path, offset: offset % 5000, len, byte }),
        1 => (p.clone(), 0..6000u16).prop_map(|(path, len)| Op::Truncate { path, len }),
        2 => (p.clone(), p.clone()).prop_map(|(from, to)| Op::Rename { from, to }),
        1 => (p.clone(), p.clone()).prop_map(|(from, to)| Op::Exchange { from, to }),
        1 => (p.clone(), p.clone()).prop_map(|(from, to)| Op::Link { from, to }),
        2 => p.clone().prop_map(|path| Op::Unlink { path }),
        2 => p.clone().prop_map(|path| Op::Mkdir { path }),
        1 => p.clone().prop_map(|path| Op::Rmdir { path }),
        1 => (p.clone(), p.clone()).prop_map(|(target, path)| Op::Symlink { target, path }),
        1 => (p.clone(), prop::sample::select(vec![0o644u16, 0o755, 0o600, 0o700, 0o444])).prop_map(|(path, mode)| Op::Chmod { path, mode }),
        2 => prop::sample::select(vec![None, Some(2usize), Some(5), Some(7), Some(12)]).prop_map(|d| Op::List { path: d.unwrap_or(usize::MAX) }),
        1 => prop::sample::select(vec![0o755u16, 0o700, 0o750]).prop_map(|mode| Op::ChmodRoot { mode }),
        1 => (p.clone(), any::<u8>()).prop_map(|(path, byte)| Op::GrowMmap { path, byte }),
        2 => p.clone().prop_map(|path| Op::Read { path }),
        2 => (p.clone(), p.clone(), any::<u16>(), any::<u16>(), 0..6000u16).prop_map(|(from, to, off_in, off_out, len)| Op::CopyRange { from, to, off_in: off_in % 5000, off_out: off_out % 5000, len }),
    ]
}

/// [`Op::GrowMmap`] (python3's `mmap`: no `unsafe` here); the errno it failed with.
fn grow_mmap(path: &Path, byte: u8) -> Option<i32> {
    let script = format!(
        "import mmap,os,sys\n\
         try:\n fd=os.open(sys.argv[1],os.O_RDWR)\n\
         except OSError as e:\n print(e.errno); sys.exit(0)\n\
         n=os.fstat(fd).st_size\nos.ftruncate(fd,n+1)\n\
         m=mmap.mmap(fd,n+1)\nm[n]={byte}\nm.flush()\nm.close()\nos.close(fd)\n"
    );
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(path)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

/// Whether `op` names a snapshot hard link (`d1/a`, `bd/g`) or a directory holding one.
fn touches_base_link(op: &Op) -> bool {
    let linked = |i: usize| matches!(NAMES.get(i), Some(&(b"d1/a" | b"bd/g" | b"d1" | b"bd")));
    match *op {
        Op::Write { path, .. }
        | Op::Truncate { path, .. }
        | Op::GrowMmap { path, .. }
        | Op::Unlink { path }
        | Op::Rmdir { path }
        | Op::Chmod { path, .. } => linked(path),
        Op::Rename { from, to }
        | Op::Exchange { from, to }
        | Op::Link { from, to }
        | Op::CopyRange { from, to, .. } => linked(from) || linked(to),
        Op::Mkdir { .. }
        | Op::Symlink { .. }
        | Op::List { .. }
        | Op::ChmodRoot { .. }
        | Op::Read { .. } => false,
    }
}

/// [`Op::CopyRange`]: `copy_file_range` looped until `len` bytes or the source's end.
fn copy_range(from: &Path, to: &Path, off_in: u16, off_out: u16, len: u16) -> std::io::Result<()> {
    let src = fs::File::open(from)?;
    let dst = fs::OpenOptions::new().write(true).open(to)?;
    let (mut i, mut o) = (i64::from(off_in), i64::from(off_out));
    let mut left = usize::from(len);
    while left > 0 {
        let n = nix::fcntl::copy_file_range(&src, Some(&mut i), &dst, Some(&mut o), left)?;
        if n == 0 {
            break;
        }
        left -= n;
    }
    Ok(())
}

/// What user space does where `copy_file_range` says `EXDEV` (coreutils `cp`): the same
/// range copied with `pread` and `pwrite`.
fn copy_range_by_read(
    from: &Path,
    to: &Path,
    off_in: u16,
    off_out: u16,
    len: u16,
) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let src = fs::File::open(from)?;
    let dst = fs::OpenOptions::new().write(true).open(to)?;
    let mut buf = vec![0u8; usize::from(len)];
    let mut got = 0;
    while got < buf.len() {
        let n = src.read_at(&mut buf[got..], u64::from(off_in) + got as u64)?;
        if n == 0 {
            break;
        }
        got += n;
    }
    dst.write_all_at(&buf[..got], u64::from(off_out))
}

fn errno<T>(r: std::io::Result<T>) -> Option<i32> {
    r.err().map(|e| e.raw_os_error().unwrap_or(-1))
}

/// Copies a directory tree (what `mv` does when rename says EXDEV): names that are one
/// file in the tree (one inode) stay one file in the copy, as GNU `mv` keeps them.
fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    fn copy(
        from: &Path,
        to: &Path,
        seen: &mut std::collections::HashMap<(u64, u64), std::path::PathBuf>,
    ) -> std::io::Result<()> {
        let m = fs::symlink_metadata(from)?;
        if m.is_dir() {
            fs::create_dir(to)?;
            for e in fs::read_dir(from)? {
                let e = e?;
                copy(&e.path(), &to.join(e.file_name()), seen)?;
            }
            fs::set_permissions(to, m.permissions())
        } else if m.file_type().is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(from)?, to)
        } else if let Some(first) = seen.get(&(m.dev(), m.ino())) {
            fs::hard_link(first, to)
        } else {
            if m.nlink() > 1 {
                seen.insert((m.dev(), m.ino()), to.to_path_buf());
            }
            fs::copy(from, to).map(|_| ())
        }
    }
    copy(from, to, &mut std::collections::HashMap::new())
}

/// The sorted names in a directory (`path` an index into `NAMES`, `usize::MAX` the
/// root), or the errno listing it failed with.
fn names(root: &Path, path: usize) -> Result<Vec<Vec<u8>>, i32> {
    let dir = if path == usize::MAX {
        root.to_path_buf()
    } else {
        root.join(name(path))
    };
    let mut v = fs::read_dir(dir)
        .and_then(|d| {
            d.map(|e| e.map(|e| e.file_name().into_vec()))
                .collect::<std::io::Result<Vec<_>>>()
        })
        .map_err(|e| e.raw_os_error().unwrap_or(-1))?;
    v.sort();
    Ok(v)
}

/// Applies one operation under `root`; returns the errno it failed with, if any.
fn apply(root: &Path, op: &Op) -> Option<i32> {
    let at = |i: usize| root.join(name(i));
    match op {
        Op::List { path } => names(root, *path).err(),
        Op::Read { path } => errno(fs::read(at(*path))),
        Op::CopyRange {
            from,
            to,
            off_in,
            off_out,
            len,
        } => errno(copy_range(&at(*from), &at(*to), *off_in, *off_out, *len)),
        Op::GrowMmap { path, byte } => grow_mmap(&at(*path), *byte),
        Op::ChmodRoot { mode } => errno(fs::set_permissions(
            root,
            fs::Permissions::from_mode(u32::from(*mode)),
        )),
        Op::Write {
            path,
            offset,
            len,
            byte,
        } => {
            use std::os::unix::fs::FileExt;
            errno(
                fs::OpenOptions::new()
                    .create(true)
                    .write(true)
                    .truncate(false)
                    .open(at(*path))
                    .and_then(|f| f.write_all_at(&vec![*byte; *len as usize], u64::from(*offset))),
            )
        }
        Op::Truncate { path, len } => errno(
            fs::OpenOptions::new()
                .write(true)
                .open(at(*path))
                .and_then(|f| f.set_len(u64::from(*len))),
        ),
        Op::Rename { from, to } => match fs::rename(at(*from), at(*to)) {
            // overlayfs (redirect_dir=off) refuses to rename a directory of the base:
            // do what `mv` does, which is also what a plain directory ends up with.
            Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
                let (f, t) = (at(*from), at(*to));
                if let Ok(tm) = fs::symlink_metadata(&t) {
                    if !tm.is_dir() {
                        return Some(libc::ENOTDIR);
                    }
                    if fs::read_dir(&t)
                        .map(|mut d| d.next().is_some())
                        .unwrap_or(false)
                    {
                        return Some(libc::ENOTEMPTY);
                    }
                    if fs::remove_dir(&t).is_err() {
                        return Some(libc::EIO);
                    }
                }
                errno(copy_tree(&f, &t).and_then(|_| fs::remove_dir_all(&f)))
            }
            r => errno(r),
        },
        Op::Exchange { from, to } => {
            use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};
            renameat2(
                AT_FDCWD,
                &at(*from),
                AT_FDCWD,
                &at(*to),
                RenameFlags::RENAME_EXCHANGE,
            )
            .err()
            .map(|e| e as i32)
        }
        Op::Link { from, to } => errno(fs::hard_link(at(*from), at(*to))),
        Op::Unlink { path } => errno(fs::remove_file(at(*path))),
        Op::Mkdir { path } => errno(fs::create_dir(at(*path))),
        Op::Rmdir { path } => errno(fs::remove_dir(at(*path))),
        Op::Symlink { target, path } => errno(std::os::unix::fs::symlink(name(*target), at(*path))),
        Op::Chmod { path, mode } => {
            // chmod follows symlinks; only real files and directories are chmod'ed here.
            match fs::symlink_metadata(at(*path)) {
                Ok(m) if !m.file_type().is_symlink() => errno(fs::set_permissions(
                    at(*path),
                    fs::Permissions::from_mode(u32::from(*mode)),
                )),
                Ok(_) => None,
                Err(e) => e.raw_os_error(),
            }
        }
    }
}

/// The root's mode, names, kinds, modes, contents, targets, and which names share an
/// inode; with `nlink`, each file's link count too.
fn listing(root: &Path, nlink: bool) -> Vec<String> {
    fn walk(
        root: &Path,
        dir: &Path,
        nlink: bool,
        out: &mut Vec<String>,
        inos: &mut Vec<(u64, String)>,
    ) {
        let mut names: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        for n in names {
            let p = dir.join(&n);
            let rel = exact(p.strip_prefix(root).unwrap());
            let m = fs::symlink_metadata(&p).unwrap();
            let links = |m: &fs::Metadata| {
                if nlink {
                    format!(" n{}", m.nlink())
                } else {
                    String::new()
                }
            };
            if m.is_dir() {
                out.push(format!("d {rel} {:o}{}", m.mode() & 0o7777, links(&m)));
                walk(root, &p, nlink, out, inos);
            } else if m.file_type().is_symlink() {
                out.push(format!(
                    "l {rel} -> {}{}",
                    exact(&fs::read_link(&p).unwrap()),
                    links(&m)
                ));
                // A symlink may have several names too (link(2) of the symlink itself).
                inos.push((m.ino(), rel));
            } else {
                let data = fs::read(&p).unwrap();
                out.push(format!(
                    "f {rel} {:o} {} {}{}",
                    m.mode() & 0o7777,
                    data.len(),
                    blake3::hash(&data).to_hex(),
                    links(&m)
                ));
                inos.push((m.ino(), rel));
            }
        }
    }
    let rm = fs::symlink_metadata(root).unwrap();
    let mut out = vec![format!(
        "root {:o}{}",
        rm.mode() & 0o7777,
        if nlink {
            format!(" n{}", rm.nlink())
        } else {
            String::new()
        }
    )];
    let mut inos = vec![];
    walk(root, root, nlink, &mut out, &mut inos);
    // Hard-link groups, by the names in them.
    inos.sort();
    let mut groups: Vec<Vec<String>> = vec![];
    for w in inos.chunk_by(|a, b| a.0 == b.0) {
        if w.len() > 1 {
            groups.push(w.iter().map(|(_, n)| n.clone()).collect());
        }
    }
    groups.sort();
    out.extend(groups.into_iter().map(|g| format!("links {}", g.join(" "))));
    out
}

#[test]
fn random_operations_match_a_plain_directory() {
    if !can_run() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    for d in ["d1", "bd"] {
        fs::create_dir_all(base.join(d)).unwrap();
    }
    fs::write(base.join("base.txt"), "the base\n").unwrap();
    fs::write(base.join("bd/f"), vec![7u8; 4000]).unwrap();
    fs::write(base.join("d1/a"), "a in d1\n").unwrap();
    // A name that is not UTF-8, from the snapshot.
    fs::write(base.join(name(15)), "not utf-8\n").unwrap();
    // A file with two names in the snapshot, in two directories.
    fs::hard_link(base.join("d1/a"), base.join("bd/g")).unwrap();
    let root = tmp.path().join("root");
    let _cleanup = Cleanup(root.clone());
    let store = Store::init(&root, StoreConfig::default()).unwrap();
    let mut opts = ImportOptions::new();
    opts.ref_name = Some("base".into());
    opts.default_excludes = false;
    store.import_dir(&base, &opts).unwrap();
    let rt = Runtime::open(&root).unwrap();

    let seed: u64 = std::env::var("COWSPACE_MODEL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20261129);
    let cases: u32 = std::env::var("COWSPACE_MODEL_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(24);
    // `COWSPACE_MODEL_KINDS` (e.g. `fuse/auto,copy/auto`) picks some of them, for long
    // runs past a known gap of one (docs/CONFORMANCE.md).
    let all = [
        ("overlay", "view"),
        ("overlay", "checkout"),
        ("overlay", "native"),
        ("copy", "auto"),
        ("fuse", "auto"),
    ];
    let kinds: Vec<(&str, &str)> = match std::env::var("COWSPACE_MODEL_KINDS") {
        Ok(list) => {
            let picked: Vec<_> = all
                .iter()
                .copied()
                .filter(|(m, l)| list.split(',').any(|k| k.trim() == format!("{m}/{l}")))
                .collect();
            assert!(
                !picked.is_empty(),
                "COWSPACE_MODEL_KINDS={list:?} names none of {all:?} (as mat/lower)"
            );
            picked
        }
        Err(_) => all.to_vec(),
    };
    let config = Config {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let counter = std::sync::atomic::AtomicU32::new(0);
    let op_count = std::sync::atomic::AtomicU64::new(0);
    let exdev = std::sync::atomic::AtomicU64::new(0);
    // `COWSPACE_MODEL_OPS`: the most operations in one sequence (default 40).
    let max_ops: usize = std::env::var("COWSPACE_MODEL_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    let result = runner.run(&proptest::collection::vec(op(), 1..max_ops), |ops| {
        let n = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        op_count.fetch_add(ops.len() as u64, std::sync::atomic::Ordering::SeqCst);
        let model = tmp.path().join(format!("model-{n}"));
        copy_tree(&base, &model).unwrap();
        // The same operations in a workspace of every materializer that works on a plain
        // local filesystem: overlay on the view, overlay on a checkout, copy, and fuse.
        let mut workspaces = Vec::new();
        for &(mat, lower) in &kinds {
            let ws = rt
                .create(&CreateOptions {
                    snapshot: "base".into(),
                    materializer: Some(mat.parse().unwrap()),
                    lower: Some(lower.parse().unwrap()),
                    ..Default::default()
                })
                .unwrap();
            workspaces.push((format!("{mat}/{lower}"), ws));
        }
        let outcome = (|| -> Result<(), TestCaseError> {
            // Overlay workspaces that reached a snapshot hard link by name (or a
            // directory holding one): from there on they may rightly differ from the
            // model (a copy-up splits the link; CONFORMANCE.md), and only their commit
            // is checked against what they show.
            let mut diverged = vec![false; workspaces.len()];
            for (i, op) in ops.iter().enumerate() {
                let want = apply(&model, op);
                for (w, (kind, ws)) in workspaces.iter().enumerate() {
                    let before = match op {
                        Op::CopyRange { to, .. } => fs::read(ws.path.join(name(*to))).ok(),
                        _ => None,
                    };
                    let mut got = apply(&ws.path, op);
                    // overlay over the view: `copy_file_range` from an unmodified snapshot
                    // file is refused with EXDEV (docs/CONFORMANCE.md). Then nothing may
                    // have changed, and the fallback user space takes (read and write)
                    // must give what the model has.
                    if let (
                        Op::CopyRange {
                            from,
                            to,
                            off_in,
                            off_out,
                            len,
                        },
                        Some(libc::EXDEV),
                    ) = (op, got)
                    {
                        prop_assert_eq!(
                            kind.as_str(),
                            "overlay/view",
                            "op {} {:?}: EXDEV where only overlay over the view may say it",
                            i,
                            op
                        );
                        prop_assert_eq!(
                            fs::read(ws.path.join(name(*to))).ok(),
                            before,
                            "{} op {} {:?}: refused with EXDEV, yet the target changed",
                            kind,
                            i,
                            op
                        );
                        got = errno(copy_range_by_read(
                            &ws.path.join(name(*from)),
                            &ws.path.join(name(*to)),
                            *off_in,
                            *off_out,
                            *len,
                        ));
                        exdev.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    if kind.starts_with("overlay") && touches_base_link(op) {
                        diverged[w] = true;
                    }
                    if diverged[w] {
                        continue;
                    }
                    prop_assert_eq!(got, want, "{} op {} {:?}", kind, i, op);
                    if let Op::List { path } = op {
                        prop_assert_eq!(
                            names(&ws.path, *path),
                            names(&model, *path),
                            "{} op {} {:?}",
                            kind,
                            i,
                            op
                        );
                    }
                    if let Op::Read { path } = op {
                        prop_assert_eq!(
                            fs::read(ws.path.join(name(*path))).ok(),
                            fs::read(model.join(name(*path))).ok(),
                            "{} op {} {:?}",
                            kind,
                            i,
                            op
                        );
                    }
                }
            }
            // Overlayfs (index=off) does not keep hard links across a copy-up, nor give
            // the names of a file linked after its copy-up one inode number; a checkout
            // lower's files also count their blob-cache link (docs/CONFORMANCE.md). Its
            // workspaces are compared without link groups and counts; fuse and copy with.
            let keeps = |kind: &str| !kind.starts_with("overlay");
            let live = |p: &Path, kind: &str| -> Vec<String> {
                listing(p, keeps(kind))
                    .into_iter()
                    .filter(|l| keeps(kind) || !l.starts_with("links "))
                    .collect()
            };
            let mut roots = Vec::new();
            for (w, (kind, ws)) in workspaces.iter().enumerate() {
                if !diverged[w] {
                    prop_assert_eq!(
                        live(&ws.path, kind),
                        live(&model, kind),
                        "{} tree after the operations",
                        kind
                    );
                }
                // (overlayfs gives a file linked after its copy-up two inode numbers,
                // though it is one file: link groups are compared for fuse and copy.)
                let shown = live(&ws.path, kind);
                let snap = rt
                    .commit(&ws.id, &CommitOptions::default())
                    .map_err(|e| TestCaseError::fail(format!("{kind}: {e}")))?;
                // The commit holds exactly what the workspace showed, links included.
                let out = tmp
                    .path()
                    .join(format!("export-{n}-{}", kind.replace('/', "-")));
                store
                    .export_dir(&snap.snapshot, &out)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let exported = live(&out, kind);
                let _ = fs::remove_dir_all(&out);
                prop_assert_eq!(exported, shown, "{}: the commit vs the workspace", kind);
                roots.push((kind.clone(), snap.root, snap.snapshot));
            }
            let linked: Vec<_> = roots
                .iter()
                .enumerate()
                .filter(|(w, (k, _, _))| keeps(k) || !diverged[*w])
                .map(|(_, r)| r)
                .collect();
            for (kind, root, _) in &linked {
                prop_assert_eq!(
                    *root,
                    linked[0].1,
                    "{} and {} commit different trees",
                    kind,
                    linked[0].0
                );
            }
            let out = tmp.path().join(format!("export-{n}"));
            let first = linked.first().copied().unwrap_or(&roots[0]);
            store
                .export_dir(&first.2, &out)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            if keeps(&first.0) {
                prop_assert_eq!(
                    listing(&out, true),
                    listing(&model, true),
                    "the committed snapshot"
                );
            }
            Ok(())
        })();
        for (_, ws) in &workspaces {
            rt.remove(&ws.id, true).unwrap();
        }
        let _ = fs::remove_dir_all(&model);
        let _ = fs::remove_dir_all(tmp.path().join(format!("export-{n}")));
        outcome
    });
    if let Err(e) = result {
        panic!("seed {seed}: {e}");
    }
    let ran = counter.load(std::sync::atomic::Ordering::SeqCst);
    let ops = op_count.load(std::sync::atomic::Ordering::SeqCst);
    let exdev = exdev.load(std::sync::atomic::Ordering::SeqCst);
    eprintln!(
        "{ran} operation sequences, {ops} operations (seed {seed}) matched the model on \
         {kinds:?} ({exdev} copy_file_range refused with EXDEV, target unchanged, copied by \
         read and write)"
    );
    assert!(ran >= cases, "only {ran} of {cases} cases ran");
}
