//! A commit holds exactly what the workspace showed: hard links of the snapshot reached
//! through several names, directories holding one name of a link renamed, one name
//! renamed over another file, and the workspace root's own mode. Each case runs on a
//! plain directory (what POSIX gives) and in a workspace of each materializer this host
//! runs without loop filesystems (`fuse`, `copy`, `overlay` over both lowers); the
//! workspace must show the plain directory's tree (link groups included) except where
//! `docs/CONFORMANCE.md` lists a kernel limit, and the export of its commit must show
//! exactly what the workspace showed, always.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use cowspace_tests::{Node, assert_same_listing, scan_tree, write_file};

use super::support::{WsRoot, require_root};

/// The materializers checked, as `create` arguments, and whether the kernel keeps
/// snapshot hard links across a copy-up there (overlay with `index=off` does not).
const TARGETS: &[(&str, &[&str], bool)] = &[
    ("fuse", &["--materializer", "fuse"], true),
    ("copy", &["--materializer", "copy"], true),
    (
        "overlay-view",
        &["--materializer", "overlay", "--lower", "view"],
        false,
    ),
    (
        "overlay-checkout",
        &["--materializer", "overlay", "--lower", "checkout"],
        false,
    ),
];

/// A file with two names (`a`, `E/a2`), another file, a nested directory, another
/// directory.
fn base(src: &Path) {
    write_file(&src.join("a"), "one\n");
    fs::create_dir_all(src.join("E/sub")).unwrap();
    fs::hard_link(src.join("a"), src.join("E/a2")).unwrap();
    write_file(&src.join("c"), "other\n");
    write_file(&src.join("E/sub/f"), "f\n");
    fs::create_dir_all(src.join("G")).unwrap();
    write_file(&src.join("G/g"), "g\n");
}

/// Every path with kind, mode, content and hard-link group; the root (`""`) with its
/// mode.
fn listing(dir: &Path) -> BTreeMap<String, Node> {
    scan_tree(dir)
}

/// Runs `op` on a plain copy of [`base`] and in a workspace of every target; checks the
/// workspace against the plain directory (where `kept_by_kernel` says the materializer
/// can) and the commit's export against the workspace. `links` says whether the case
/// depends on hard links surviving a copy-up.
fn check(case: &str, links: bool, op: impl Fn(&Path)) {
    let r = WsRoot::new();
    let src = r.t.path("src");
    base(&src);
    let snap = r.import(&src, &["--no-default-excludes"]);
    let plain = r.t.path("plain");
    base(&plain);
    op(&plain);
    let want = listing(&plain);
    for (name, args, keeps_links) in TARGETS {
        let ws = r.create(&snap, args);
        op(&ws.path);
        let shown = listing(&ws.path);
        if *keeps_links || !links {
            assert_same_listing(&want, &shown, &format!("{case}: {name} workspace vs plain"));
        }
        let (snap2, _, _) = r.commit(&ws.id, &[]);
        let out = r.t.path(&format!("export-{case}-{name}"));
        r.t.run(["export", snap2.as_str(), out.to_str().unwrap()])
            .ok();
        assert_same_listing(
            &shown,
            &listing(&out),
            &format!("{case}: {name} export vs workspace"),
        );
        r.remove(&ws.id);
    }
}

fn append(p: &Path, s: &str) {
    use std::io::Write;
    fs::OpenOptions::new()
        .append(true)
        .open(p)
        .unwrap()
        .write_all(s.as_bytes())
        .unwrap();
}

#[test]
fn a_write_through_one_name_of_a_snapshot_hard_link_is_committed_under_all() {
    require_root!();
    check("append-link", true, |d| append(&d.join("E/a2"), "more\n"));
    check("append-primary", true, |d| append(&d.join("a"), "more\n"));
    check("chmod-primary", true, |d| {
        fs::set_permissions(d.join("a"), fs::Permissions::from_mode(0o600)).unwrap()
    });
}

#[test]
fn renaming_a_directory_holding_a_link_name_keeps_the_link() {
    require_root!();
    // On overlay `rename(2)` of a snapshot directory is EXDEV: the `mv` fallback copies,
    // which splits the link in the workspace itself (CONFORMANCE.md).
    check("mv-dir", true, |d| {
        let st = std::process::Command::new("mv")
            .arg(d.join("E"))
            .arg(d.join("F"))
            .status()
            .unwrap();
        assert!(st.success());
    });
    check("mv-dir-then-write", true, |d| {
        let st = std::process::Command::new("mv")
            .arg(d.join("E"))
            .arg(d.join("F"))
            .status()
            .unwrap();
        assert!(st.success());
        append(&d.join("a"), "after\n");
    });
}

#[test]
fn renaming_a_link_name_over_another_file_keeps_the_link() {
    require_root!();
    check("mv-over", true, |d| {
        fs::rename(d.join("E/a2"), d.join("c")).unwrap()
    });
    check("mv-over-then-write", true, |d| {
        fs::rename(d.join("E/a2"), d.join("c")).unwrap();
        append(&d.join("c"), "x\n");
    });
    check("mv-onto-link-then-write", true, |d| {
        fs::rename(d.join("c"), d.join("E/a2")).unwrap();
        append(&d.join("a"), "x\n");
    });
    check("unlink-one-then-write", true, |d| {
        fs::remove_file(d.join("a")).unwrap();
        append(&d.join("E/a2"), "x\n");
    });
    check("rename-two-names", true, |d| {
        // POSIX: two names of one file, nothing happens. (Overlay: CONFORMANCE.md.)
        let _ = fs::rename(d.join("a"), d.join("E/a2"));
    });
}

#[test]
fn the_workspace_roots_mode_is_committed() {
    require_root!();
    check("chmod-root", false, |d| {
        fs::set_permissions(d, fs::Permissions::from_mode(0o700)).unwrap()
    });
}

#[test]
fn link_counts_are_those_of_the_snapshot() {
    require_root!();
    let r = WsRoot::new();
    let src = r.t.path("src");
    base(&src);
    let snap = r.import(&src, &["--no-default-excludes"]);
    for (name, args, _) in TARGETS {
        let ws = r.create(&snap, args);
        let d = &ws.path;
        let a = fs::symlink_metadata(d.join("a")).unwrap();
        let a2 = fs::symlink_metadata(d.join("E/a2")).unwrap();
        if !name.ends_with("checkout") {
            // A checkout's files also count their blob-cache link (CONFORMANCE.md).
            assert_eq!((a.nlink(), a2.nlink()), (2, 2), "{name}: a, E/a2");
            assert_eq!(
                fs::symlink_metadata(d.join("c")).unwrap().nlink(),
                1,
                "{name}: c"
            );
        }
        assert_eq!(a.ino(), a2.ino(), "{name}: one file");
        // E has one subdirectory; E/sub none (the root merges the upper layer on overlay
        // and fuse, which report 1, "not counted", as overlayfs does).
        assert_eq!(
            fs::symlink_metadata(d.join("E")).unwrap().nlink(),
            3,
            "{name}: E"
        );
        assert_eq!(
            fs::symlink_metadata(d.join("E/sub")).unwrap().nlink(),
            2,
            "{name}: E/sub"
        );
        r.remove(&ws.id);
    }
}

#[test]
fn workspace_diff_json_names_non_utf8_paths_and_the_root() {
    use std::os::unix::ffi::OsStrExt;
    require_root!();
    let r = WsRoot::new();
    let src = r.t.path("src");
    base(&src);
    let snap = r.import(&src, &["--no-default-excludes"]);
    for (name, args, _) in TARGETS {
        let ws = r.create(&snap, args);
        write_file(
            &ws.path.join(std::ffi::OsStr::from_bytes(b"raw\xff")),
            "x\n",
        );
        fs::set_permissions(&ws.path, fs::Permissions::from_mode(0o700)).unwrap();
        let v = r.t.json(["diff", ws.id.as_str()]).ok().json();
        let all = v["changes"].as_array().unwrap();
        let c = all
            .iter()
            .find(|c| c["path"] == "raw\u{fffd}")
            .unwrap_or_else(|| panic!("{name}: {v}"));
        assert_eq!(c["path_hex"], "726177ff", "{name}: {v}");
        assert!(
            all.iter()
                .any(|c| c["path"] == "." && c["change"] == "modified"),
            "{name}: the root's mode: {v}"
        );
        r.discard(&ws.id);
    }
}

#[test]
fn a_directorys_set_mtime_survives_a_copy_up_beneath_it() {
    require_root!();
    let r = WsRoot::new();
    let src = r.t.path("src");
    base(&src);
    let snap = r.import(&src, &["--no-default-excludes"]);
    let set = |p: &Path, secs: i64| {
        let st = std::process::Command::new("touch")
            .arg("-d")
            .arg(format!("@{secs}"))
            .arg(p)
            .status()
            .unwrap();
        assert!(st.success(), "touch {p:?}");
    };
    for (name, args, _) in TARGETS {
        let ws = r.create(&snap, args);
        let d = &ws.path;
        set(&d.join("E"), 1_000_000_000);
        // Copies E/sub up (into E) on the overlay materializers; E's names do not change.
        fs::create_dir(d.join("E/sub/new")).unwrap();
        write_file(&d.join("E/sub/f"), "changed\n");
        assert_eq!(
            fs::metadata(d.join("E")).unwrap().mtime(),
            1_000_000_000,
            "{name}: E's mtime"
        );
        // What the workspace shows once the kernel asks again (after a restart, or once
        // it forgot the inode): the private upper layer's (overlay and fuse).
        let upper = r.root().join("workspaces").join(&ws.id).join("upper/E");
        if upper.exists() {
            assert_eq!(
                fs::metadata(&upper).unwrap().mtime(),
                1_000_000_000,
                "{name}: E's mtime in the upper layer"
            );
        }
        r.discard(&ws.id);
    }
}

#[test]
fn the_roots_xattrs_are_shown_and_committed() {
    require_root!();
    let r = WsRoot::new();
    let src = r.t.path("src");
    base(&src);
    xattr::set(&src, "user.base", b"1").unwrap();
    let snap = r.import(&src, &["--no-default-excludes"]);
    for (name, args, _) in TARGETS {
        let ws = r.create(&snap, args);
        let d = &ws.path;
        assert_eq!(
            xattr::get(d, "user.base").unwrap().as_deref(),
            Some(&b"1"[..]),
            "{name}: the snapshot root's xattr in the workspace"
        );
        xattr::set(d, "user.new", b"2").unwrap();
        let (snap2, _, _) = r.commit(&ws.id, &[]);
        let out = r.t.path(&format!("export-xattr-{name}"));
        r.t.run(["export", snap2.as_str(), out.to_str().unwrap()])
            .ok();
        for (k, v) in [("user.base", &b"1"[..]), ("user.new", &b"2"[..])] {
            assert_eq!(
                xattr::get(&out, k).unwrap().as_deref(),
                Some(v),
                "{name}: {k} of the committed root"
            );
        }
        r.remove(&ws.id);
    }
}

/// `renameat2(from, to, flags)`; the errno it failed with.
fn rename2(from: &Path, to: &Path, flags: libc::c_uint) -> Option<i32> {
    use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};
    renameat2(
        AT_FDCWD,
        from,
        AT_FDCWD,
        to,
        RenameFlags::from_bits_retain(flags),
    )
    .err()
    .map(|e| e as i32)
}

fn exchange(d: &Path, a: &str, b: &str) {
    assert_eq!(
        rename2(&d.join(a), &d.join(b), libc::RENAME_EXCHANGE),
        None,
        "exchange {a} {b} in {d:?}"
    );
}

#[test]
fn rename_exchange_swaps_two_names_and_is_committed_so() {
    require_root!();
    check("xchg-files", false, |d| exchange(d, "c", "E/sub/f"));
    check("xchg-link-name", true, |d| exchange(d, "a", "c"));
    check("xchg-link-name-then-write", true, |d| {
        exchange(d, "c", "E/a2");
        append(&d.join("a"), "x\n");
        append(&d.join("E/a2"), "y\n");
    });
    check("xchg-file-dir", false, |d| exchange(d, "c", "E/sub"));
    check("xchg-file-dir-then-write", false, |d| {
        exchange(d, "E/sub", "c");
        write_file(&d.join("c/new"), "new\n");
        append(&d.join("c/f"), "more\n");
    });
    check("xchg-snapshot-dirs", true, |d| exchange(d, "E", "G"));
    check("xchg-snapshot-dirs-then-write", true, |d| {
        exchange(d, "G", "E");
        append(&d.join("G/a2"), "x\n");
        fs::remove_file(d.join("E/g")).unwrap();
        write_file(&d.join("G/sub/f"), "changed\n");
    });
    check("xchg-new-dir", false, |d| {
        fs::create_dir(d.join("N")).unwrap();
        write_file(&d.join("N/x"), "x\n");
        exchange(d, "N", "G");
    });
    check("xchg-twice", false, |d| {
        exchange(d, "E/sub", "G");
        exchange(d, "G", "E/sub");
        exchange(d, "G/g", "E/sub/f");
    });
    check("xchg-two-names-of-one-file", true, |d| {
        exchange(d, "a", "E/a2")
    });
}

#[test]
fn rename_noreplace_refuses_an_existing_name_only() {
    require_root!();
    check("noreplace", false, |d| {
        let nr = libc::RENAME_NOREPLACE;
        assert_eq!(
            rename2(&d.join("c"), &d.join("E/sub/f"), nr),
            Some(libc::EEXIST)
        );
        assert_eq!(
            rename2(&d.join("G"), &d.join("E/sub"), nr),
            Some(libc::EEXIST)
        );
        assert_eq!(rename2(&d.join("c"), &d.join("E/sub/c"), nr), None);
        assert_eq!(rename2(&d.join("G"), &d.join("H"), nr), None);
        assert_eq!(
            rename2(&d.join("a"), &d.join("b"), nr | libc::RENAME_EXCHANGE),
            Some(libc::EINVAL)
        );
        assert_eq!(
            rename2(&d.join("a"), &d.join("nothere"), libc::RENAME_EXCHANGE),
            Some(libc::ENOENT)
        );
    });
}

/// `ftruncate(path, size + 1)`, then `bytes` written at the end through a shared mapping
/// and `msync` (python3's `mmap`: no `unsafe` here).
fn grow_and_mmap_write(path: &Path, bytes: &[u8]) {
    let script = "import mmap,os,sys\n\
         fd=os.open(sys.argv[1],os.O_RDWR)\n\
         n=os.fstat(fd).st_size\nb=bytes.fromhex(sys.argv[2])\n\
         os.ftruncate(fd,n+1)\n\
         m=mmap.mmap(fd,n+1)\nm[n+1-len(b):n+1]=b\nm.flush()\nm.close()\nos.close(fd)\n";
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(path)
        .arg(hex)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_mmap_write_through_one_link_name_is_read_through_the_renamed_other() {
    require_root!();
    let r = WsRoot::new();
    let src = r.t.path("src");
    base(&src);
    let snap = r.import(&src, &["--no-default-excludes"]);
    // "one\n" grown by a byte, its last two bytes written through the mapping.
    let want = b"one!?".to_vec();
    // The renamed name lands over another file or on a new name; it is read again
    // after the rename or not.
    for (to, reread) in [("c", false), ("c", true), ("x", false), ("x", true)] {
        for (name, args, keeps_links) in TARGETS {
            let case = format!("{name} mv a {to} (read again: {reread})");
            let ws = r.create(&snap, args);
            let d = &ws.path;
            // Both names read first: the kernel caches their pages and sizes.
            assert_eq!(fs::read(d.join("a")).unwrap(), b"one\n", "{case}");
            assert_eq!(fs::read(d.join("E/a2")).unwrap(), b"one\n", "{case}");
            fs::rename(d.join("a"), d.join(to)).unwrap();
            if reread {
                assert_eq!(fs::read(d.join(to)).unwrap(), b"one\n", "{case}");
            }
            grow_and_mmap_write(&d.join("E/a2"), b"!?");
            assert_eq!(fs::read(d.join("E/a2")).unwrap(), want, "{case}: E/a2");
            if *keeps_links {
                let m = fs::symlink_metadata(d.join(to)).unwrap();
                assert_eq!(m.len(), want.len() as u64, "{case}: {to}'s size");
                assert_eq!(fs::read(d.join(to)).unwrap(), want, "{case}: {to}");
            }
            let shown = listing(d);
            let (snap2, _, _) = r.commit(&ws.id, &[]);
            let out = r.t.path(&format!("export-mmap-{name}-{to}-{reread}"));
            r.t.run(["export", snap2.as_str(), out.to_str().unwrap()])
                .ok();
            assert_same_listing(&shown, &listing(&out), &format!("{case}: export"));
            if *keeps_links {
                assert_eq!(fs::read(out.join(to)).unwrap(), want, "{case}: exported");
                assert_eq!(
                    fs::read(out.join("E/a2")).unwrap(),
                    want,
                    "{case}: exported E/a2"
                );
            }
            r.remove(&ws.id);
        }
    }
}

/// Runs a python3 `script` with `args`; what it printed (trimmed).
fn python(script: &str, args: &[&Path]) -> String {
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn kernel_limits_are_refused_and_what_was_done_is_committed() {
    require_root!();
    let r = WsRoot::new();
    let src = r.t.path("src");
    base(&src);
    let snap = r.import(&src, &["--no-default-excludes"]);
    // An unnamed file made with O_TMPFILE, written, then given a name (linkat through
    // /proc). The errno where it is refused.
    let tmpfile = "import os,sys\n\
        try:\n fd=os.open(sys.argv[1],os.O_TMPFILE|os.O_WRONLY,0o600)\n\
        except OSError as e:\n print(e.errno); sys.exit(0)\n\
        os.write(fd,b'tmp\\n')\n\
        import ctypes\nl=ctypes.CDLL(None,use_errno=True)\n\
        p=('/proc/self/fd/%d'%fd).encode()\nt=os.path.join(sys.argv[1],'t').encode()\n\
        assert l.linkat(-100,p,-100,t,0x400)==0, ctypes.get_errno()\n\
        os.close(fd)\nprint('ok')\n";
    // copy_file_range from the snapshot file `c` and from a file made in the workspace
    // (`n`) into new files; the errno it failed with, each, and then what `cp` does on
    // failure (read and write).
    let cfr = "import os,sys\n\
        d=sys.argv[1]\nopen(os.path.join(d,'n'),'w').write('new\\n')\nres=[]\n\
        for s,t in (('c','c2'),('n','n2')):\n\
        \x20a=os.open(os.path.join(d,s),os.O_RDONLY)\n\
        \x20b=os.open(os.path.join(d,t),os.O_WRONLY|os.O_CREAT,0o644)\n\
        \x20try:\n  os.copy_file_range(a,b,100); res.append('ok')\n\
        \x20except OSError as e:\n  res.append(str(e.errno)); os.write(b,os.read(a,100))\n\
        \x20os.close(a); os.close(b)\n\
        print(' '.join(res))\n";
    for (name, args, _) in TARGETS {
        let ws = r.create(&snap, args);
        let d = &ws.path;
        let got = python(tmpfile, &[d]);
        let want = if *name == "fuse" {
            libc::EOPNOTSUPP.to_string()
        } else {
            "ok".to_string()
        };
        assert_eq!(got, want, "{name}: O_TMPFILE");
        if got == "ok" {
            assert_eq!(fs::read(d.join("t")).unwrap(), b"tmp\n", "{name}: t");
        }
        let got = python(cfr, &[d]);
        // overlayfs hands copy_file_range to the real files: from a snapshot file not
        // copied up (a file of the FUSE view) into the upper layer (ext4) that is two
        // filesystems, and the kernel says EXDEV; between two upper files it copies.
        let want = if *name == "overlay-view" {
            format!("{} ok", libc::EXDEV)
        } else {
            "ok ok".to_string()
        };
        assert_eq!(got, want, "{name}: copy_file_range from c, from n");
        assert_eq!(fs::read(d.join("c2")).unwrap(), b"other\n", "{name}: c2");
        assert_eq!(fs::read(d.join("n2")).unwrap(), b"new\n", "{name}: n2");
        let shown = listing(d);
        let (snap2, _, _) = r.commit(&ws.id, &[]);
        let out = r.t.path(&format!("export-limits-{name}"));
        r.t.run(["export", snap2.as_str(), out.to_str().unwrap()])
            .ok();
        assert_same_listing(&shown, &listing(&out), &format!("{name}: export"));
        r.remove(&ws.id);
    }
}

/// The checkout lower shows the snapshot's xattrs (docs/CONFORMANCE.md): a file that
/// carries xattrs gets a copy of its own in the checkout, so they never land on the blob
/// that other files and snapshots with the same bytes share. Unmodified and copied up,
/// the workspace shows them and the commit keeps them.
#[test]
fn a_checkout_lower_shows_and_commits_snapshot_xattrs() {
    require_root!();
    let r = WsRoot::new();
    let src = r.t.path("src");
    base(&src);
    xattr::set(src.join("c"), "user.k", b"1").unwrap();
    xattr::set(src.join("G/g"), "user.k", b"2").unwrap();
    // Both names of the link `a`, `E/a2`.
    xattr::set(src.join("a"), "user.k", b"3").unwrap();
    // The same bytes as `G/g`, without xattrs.
    write_file(&src.join("G/h"), "g\n");
    let snap = r.import(&src, &["--no-default-excludes"]);
    let ws = r.create(&snap, &["--materializer", "overlay", "--lower", "checkout"]);
    let d = &ws.path;
    let shown = |p: &Path| xattr::get(p, "user.k").unwrap();
    assert_eq!(shown(&d.join("c")), Some(b"1".to_vec()), "c unmodified");
    assert_eq!(shown(&d.join("G/g")), Some(b"2".to_vec()), "G/g unmodified");
    assert_eq!(shown(&d.join("a")), Some(b"3".to_vec()), "a");
    assert_eq!(shown(&d.join("E/a2")), Some(b"3".to_vec()), "E/a2");
    assert_eq!(
        shown(&d.join("G/h")),
        None,
        "G/h has the bytes of G/g, not its xattrs"
    );
    let ino = |p: &Path| fs::metadata(p).unwrap().ino();
    assert_eq!(
        ino(&d.join("a")),
        ino(&d.join("E/a2")),
        "a and E/a2 are one file"
    );
    append(&d.join("c"), "more\n");
    assert_eq!(shown(&d.join("c")), Some(b"1".to_vec()), "c copied up");
    // Another snapshot with the same bytes and no xattrs shows none.
    let plain = r.t.path("plain");
    write_file(&plain.join("g"), "g\n");
    write_file(&plain.join("c"), "other\n");
    let snap_plain = r.import(&plain, &["--no-default-excludes"]);
    let ws_plain = r.create(
        &snap_plain,
        &["--materializer", "overlay", "--lower", "checkout"],
    );
    assert_eq!(
        shown(&ws_plain.path.join("g")),
        None,
        "a shared blob carries no xattrs"
    );
    assert_eq!(
        shown(&ws_plain.path.join("c")),
        None,
        "a shared blob carries no xattrs"
    );
    // The documented link counts: a file linked to its blob counts the blob cache's name
    // and every checkout's name of it (`G/h` of the first snapshot, `g` here); one with a
    // copy of its own (xattrs) reports the snapshot's.
    let nlink = |p: &Path| fs::symlink_metadata(p).unwrap().nlink();
    assert_eq!(nlink(&ws_plain.path.join("g")), 3, "g: the blob, G/h, g");
    assert_eq!(nlink(&d.join("G/h")), 3, "G/h: the blob, G/h, g");
    assert_eq!(nlink(&d.join("G/g")), 1, "G/g: its own copy");
    assert_eq!(nlink(&d.join("E/a2")), 2, "E/a2: its own copy, two names");
    r.remove(&ws_plain.id);
    let (snap2, _, _) = r.commit(&ws.id, &[]);
    let out = r.t.path("export-checkout-xattrs");
    r.t.run(["export", snap2.as_str(), out.to_str().unwrap()])
        .ok();
    assert_eq!(
        shown(&out.join("c")),
        Some(b"1".to_vec()),
        "copied up: kept"
    );
    assert_eq!(
        shown(&out.join("G/g")),
        Some(b"2".to_vec()),
        "unmodified: kept"
    );
    assert_eq!(
        shown(&out.join("E/a2")),
        Some(b"3".to_vec()),
        "the link: kept"
    );
    assert_eq!(shown(&out.join("G/h")), None, "G/h");
    r.remove(&ws.id);
}
