//! Renaming a directory of the snapshot in a fuse workspace: `rename(2)` itself succeeds
//! (overlayfs without redirects says `EXDEV`, and `git mv` of a directory then fails).
//! The daemon copies the directory up with everything beneath it first, so the moved tree
//! shows what it showed before — changes, deletions and new names beneath it included —
//! keeps every inode number and the hard links inside it, and a commit records exactly the
//! moved tree. Held files (open descriptors, a running `git`) keep working after it. A
//! daemon killed in the middle of the copy loses nothing: after `recover` the directory
//! is whole at one of its two names.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use cowspace_tests::write_file;

use super::support::{Ws, WsRoot, require_root, sh};

/// Fixed identity and dates (as the acceptance suite's git workflow).
const GIT: &str = "GIT_AUTHOR_DATE='2024-01-02T03:04:05Z' \
     GIT_COMMITTER_DATE='2024-01-02T03:04:05Z' HOME=/nonexistent GIT_CONFIG_NOSYSTEM=1 \
     git -c user.name=cowspace -c user.email=tests@cowspace.invalid \
     -c init.defaultBranch=main -c gc.auto=0 -c core.fsync=none";

/// A repository with a nested package, a hard link and a symlink inside it.
fn base(src: &Path) {
    write_file(&src.join("README.md"), "# repo\n");
    write_file(&src.join("pkg/a.txt"), "a\n");
    write_file(&src.join("pkg/gone.txt"), "to be deleted\n");
    write_file(&src.join("pkg/sub/deeper/f.txt"), "deep\n");
    write_file(&src.join("pkg/sub/keep.txt"), "keep\n");
    fs::hard_link(src.join("pkg/a.txt"), src.join("pkg/sub/a-link.txt")).unwrap();
    std::os::unix::fs::symlink("../a.txt", src.join("pkg/sub/to-a")).unwrap();
    sh(
        src,
        &format!("{GIT} init -q && {GIT} add -A && {GIT} commit -q -m first"),
    );
}

/// A runtime root and a fuse workspace of [`base`].
fn fuse_workspace_of_base() -> (WsRoot, Ws) {
    let r = WsRoot::new();
    let src = r.t.path("src");
    base(&src);
    let snap = r.import(&src, &["--no-default-excludes"]);
    let ws = r.create(&snap, &["--materializer", "fuse"]);
    (r, ws)
}

/// Names beneath `dir` (not `.git`) with kind, content or target, and inode number.
fn tree(dir: &Path) -> Vec<(String, String, u64)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.file_name().is_some_and(|n| n == ".git") {
                continue;
            }
            let rel = p.strip_prefix(dir).unwrap().display().to_string();
            let m = fs::symlink_metadata(&p).unwrap();
            let what = if m.is_dir() {
                stack.push(p.clone());
                "dir".to_owned()
            } else if m.file_type().is_symlink() {
                format!("-> {}", fs::read_link(&p).unwrap().display())
            } else {
                fs::read_to_string(&p).unwrap()
            };
            out.push((rel, what, m.ino()));
        }
    }
    out.sort();
    out
}

#[test]
fn fuse_renames_a_snapshot_directory_in_place_keeping_identity_and_changes() {
    require_root!();
    let (r, ws) = fuse_workspace_of_base();
    let d = &ws.path;

    // Changes beneath the directory before it moves: one file changed, one deleted, a new
    // directory with a file; and a descriptor held on an unchanged file.
    fs::write(d.join("pkg/sub/keep.txt"), "kept and changed\n").unwrap();
    fs::remove_file(d.join("pkg/gone.txt")).unwrap();
    write_file(&d.join("pkg/new/n.txt"), "new\n");
    let held = fs::File::open(d.join("pkg/sub/deeper/f.txt")).unwrap();
    let dir_ino = fs::metadata(d.join("pkg")).unwrap().ino();
    let before = tree(&d.join("pkg"));
    assert!(before.iter().all(|(n, _, _)| n != "gone.txt"));

    // A rename bound to fail (onto a directory that is not empty) copies nothing first.
    write_file(&d.join("full/x"), "x\n");
    let err = fs::rename(d.join("pkg"), d.join("full")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOTEMPTY), "{err}");
    let upper = r.root().join("workspaces").join(&ws.id).join("upper");
    assert!(
        upper.join("pkg/sub").is_dir(),
        "copied up for the changed file"
    );
    assert!(
        !upper.join("pkg/sub/deeper").exists(),
        "copied for a failed rename"
    );

    fs::rename(d.join("pkg"), d.join("moved")).expect("rename of a snapshot directory");
    assert!(!d.join("pkg").exists(), "the old name is gone");
    assert_eq!(fs::metadata(d.join("moved")).unwrap().ino(), dir_ino);
    assert_eq!(
        tree(&d.join("moved")),
        before,
        "the moved tree, numbers included"
    );
    let a = fs::metadata(d.join("moved/a.txt")).unwrap();
    let link = fs::metadata(d.join("moved/sub/a-link.txt")).unwrap();
    assert_eq!(
        a.ino(),
        link.ino(),
        "the hard link inside the tree stays one file"
    );
    assert_eq!(a.nlink(), 2);

    // The held file reads on, and writes through either name reach one file.
    let mut s = String::new();
    std::io::Read::read_to_string(&mut &held, &mut s).unwrap();
    assert_eq!(s, "deep\n");
    fs::write(d.join("moved/sub/a-link.txt"), "written through the link\n").unwrap();
    assert_eq!(
        fs::read_to_string(d.join("moved/a.txt")).unwrap(),
        "written through the link\n"
    );
    // Beneath the moved directory, names come and go as anywhere.
    fs::remove_file(d.join("moved/sub/deeper/f.txt")).unwrap();
    fs::rename(d.join("moved/sub"), d.join("sub-out")).unwrap();
    fs::create_dir(d.join("pkg")).unwrap();
    write_file(&d.join("pkg/again.txt"), "a new pkg\n");

    // A commit records exactly this tree, and a fresh workspace of it shows it.
    let (snap2, _, _) = r.commit(&ws.id, &[]);
    let ws2 = r.create(&snap2, &["--materializer", "fuse"]);
    let shown = |root: &Path| -> Vec<(String, String)> {
        tree(root).into_iter().map(|(n, w, _)| (n, w)).collect()
    };
    assert_eq!(shown(&ws2.path), shown(d));
    let a2 = fs::metadata(ws2.path.join("moved/a.txt")).unwrap();
    let link2 = fs::metadata(ws2.path.join("sub-out/a-link.txt")).unwrap();
    assert_eq!(a2.ino(), link2.ino(), "the commit keeps the hard link");
    drop(held);
}

#[test]
fn git_mv_of_a_directory_works_in_a_fuse_workspace() {
    require_root!();
    let (_root, ws) = fuse_workspace_of_base();
    sh(
        &ws.path,
        &format!("{GIT} mv pkg lib && {GIT} commit -q -m 'move pkg to lib'"),
    );
    let status = sh(&ws.path, &format!("{GIT} status --porcelain"));
    assert_eq!(status, "", "clean after the commit");
    let files = sh(&ws.path, &format!("{GIT} ls-files"));
    assert_eq!(
        files.lines().collect::<Vec<_>>(),
        [
            "README.md",
            "lib/a.txt",
            "lib/gone.txt",
            "lib/sub/a-link.txt",
            "lib/sub/deeper/f.txt",
            "lib/sub/keep.txt",
            "lib/sub/to-a",
        ]
    );
    assert_eq!(
        fs::read_to_string(ws.path.join("lib/sub/deeper/f.txt")).unwrap(),
        "deep\n"
    );
}

/// The content of file `i` of the large directory.
fn big_content(i: usize) -> String {
    format!("file {i}\n").repeat(40)
}

const BIG_FILES: usize = 4000;

/// Where file `i` of the large directory is, beneath it (40 subdirectories).
fn big_rel(i: usize) -> String {
    format!("d{}/f{i}.txt", i % 40)
}

/// The large directory, `big/` in `src`.
fn write_big(src: &Path) {
    for i in 0..BIG_FILES {
        write_file(&src.join("big").join(big_rel(i)), big_content(i));
    }
}

#[test]
fn a_daemon_killed_during_a_directory_rename_loses_nothing() {
    require_root!();
    let r = WsRoot::new();
    let src = r.t.path("src");
    write_big(&src);
    write_file(&src.join("README.md"), "# big\n");
    let snap = r.import(&src, &[]);
    let ws = r.create(&snap, &["--materializer", "fuse"]);
    let d = ws.path.clone();
    write_file(&d.join("big/d0/changed.txt"), "written before the rename\n");
    let fsd = r.fsd_pids();
    assert_eq!(fsd.len(), 1, "{fsd:?}");

    // The rename copies thousands of files first; the daemon dies during it.
    let (from, to) = (d.join("big"), d.join("moved"));
    let renamer = std::thread::spawn(move || fs::rename(from, to));
    std::thread::sleep(std::time::Duration::from_millis(150));
    super::support::kill9(fsd[0]);
    let renamed = renamer.join().unwrap();
    eprintln!("the rename when the daemon died: {renamed:?}");
    r.t.json(["sweep"]).ok();
    let rec = r.t.json(["recover", &ws.id]).ok().json();
    assert_eq!(rec["status"], "active", "{rec}");

    // One of the two names, whole: the rename happened or it did not.
    let (old, new) = (d.join("big").exists(), d.join("moved").exists());
    assert!(old != new, "big exists: {old}, moved exists: {new}");
    if old {
        fs::rename(d.join("big"), d.join("moved")).expect("the rename, again");
    }
    for i in 0..BIG_FILES {
        let p = d.join("moved").join(big_rel(i));
        assert_eq!(
            fs::read_to_string(&p).unwrap(),
            big_content(i),
            "{}",
            p.display()
        );
    }
    assert_eq!(
        fs::read_to_string(d.join("moved/d0/changed.txt")).unwrap(),
        "written before the rename\n"
    );
    let names: usize = (0..40)
        .map(|k| fs::read_dir(d.join(format!("moved/d{k}"))).unwrap().count())
        .sum();
    assert_eq!(names, BIG_FILES + 1, "no name twice, none lost");
    let (snap2, _, _) = r.commit(&ws.id, &[]);
    let shown = r.t.json(["show", &snap2, "moved/d7/f7.txt"]).ok().json();
    assert_eq!(
        shown["entry"]["size"],
        big_content(7).len() as u64,
        "{shown}"
    );
    let gone = r.t.json(["show", &snap2, "big"]);
    assert_ne!(gone.code, 0, "the old name is not in the commit");
}

#[test]
fn a_large_directory_copied_for_a_rename_lets_lookups_and_writes_go_on() {
    require_root!();
    let r = WsRoot::new();
    let src = r.t.path("src");
    write_big(&src);
    for i in 0..BIG_FILES {
        write_file(&src.join(format!("other/f{i}.txt")), "other\n");
    }
    let snap = r.import(&src, &[]);
    let ws = r.create(&snap, &["--materializer", "fuse"]);
    let d = ws.path.clone();

    // A reader looking up names the kernel has not seen (each one a request to the daemon)
    // and noting when each answer came.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (d, stop) = (d.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut done = Vec::new();
            for i in 0..BIG_FILES {
                if stop.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                assert_eq!(
                    fs::read_to_string(d.join(format!("other/f{i}.txt"))).unwrap(),
                    "other\n"
                );
                done.push(std::time::Instant::now());
            }
            done
        })
    };
    // A writer appending to files of the directory being moved (each first write a
    // copy-up racing the rename's), until their old names are gone.
    let writer = {
        let d = d.clone();
        std::thread::spawn(move || {
            let mut written = Vec::new();
            for i in (0..BIG_FILES).rev() {
                let p = d.join("big").join(big_rel(i));
                match fs::OpenOptions::new().append(true).open(&p) {
                    Ok(mut f) => {
                        std::io::Write::write_all(&mut f, b"appended\n")
                            .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
                        written.push(i);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    Err(e) => panic!("{}: {e}", p.display()),
                }
            }
            written
        })
    };
    while fs::read_dir(d.join("other")).is_err() {}
    std::thread::sleep(std::time::Duration::from_millis(20));
    let start = std::time::Instant::now();
    fs::rename(d.join("big"), d.join("moved")).unwrap();
    let end = std::time::Instant::now();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let done = reader.join().unwrap();
    let written = writer.join().unwrap();
    eprintln!(
        "{} files appended to before the rename took their names",
        written.len()
    );
    for i in 0..BIG_FILES {
        let mut want = big_content(i);
        if written.contains(&i) {
            want.push_str("appended\n");
        }
        let p = d.join("moved").join(big_rel(i));
        assert_eq!(fs::read_to_string(&p).unwrap(), want, "{}", p.display());
    }
    // Answers came all along: no wait between two of them (the second during the rename)
    // as long as half the rename. Before, the rename held every lookup of the workspace
    // until it ended.
    let longest = done
        .windows(2)
        .filter(|w| w[1] > start)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default();
    eprintln!(
        "longest wait between two lookups {longest:?}, the rename {:?} ({} lookups)",
        end - start,
        done.len()
    );
    assert!(
        longest < (end - start) / 2,
        "lookups waited {longest:?} during a {:?} rename",
        end - start
    );
    assert_eq!(
        fs::read_to_string(d.join("moved/d3/f3.txt")).unwrap(),
        big_content(3)
    );
}

/// The regular files anywhere under `dir` (what a copy would have put in an upper layer).
fn regular_files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                stack.push(p);
            } else if m.is_file() {
                out.push(p.strip_prefix(dir).unwrap().display().to_string());
            }
        }
    }
    out.sort();
    out
}

#[test]
fn overlay_renames_a_snapshot_directory_with_one_redirect_and_commits_the_moved_tree() {
    require_root!();
    for lower in ["view", "checkout"] {
        let r = WsRoot::new();
        let src = r.t.path("src");
        base(&src);
        let snap = r.import(&src, &["--no-default-excludes"]);
        let ws = r.create(&snap, &["--lower", lower]);
        let upper = r.root().join("workspaces").join(&ws.id).join("upper");
        // The same operations on a plain export of the snapshot: what the commit must
        // hold.
        let plain = r.t.path("plain");
        r.t.run(["export", &snap, plain.to_str().unwrap()]).ok();
        // An export gives back the checkout as imported, without the fsmonitor hook the
        // import added for workspaces (docs/git.md); the workspace shows the hook.
        for f in [".git/config", ".git/index"] {
            std::fs::copy(ws.path.join(f), plain.join(f)).unwrap();
        }
        let ops = "mv pkg/sub moved && mkdir -p far/away && mv pkg far/away/pkg2 \
                   && echo changed >> moved/keep.txt && rm far/away/pkg2/gone.txt \
                   && echo new > moved/deeper/new.txt && mv moved/deeper deeper-top";
        sh(&ws.path, ops);
        sh(&plain, ops);
        // One rename each: no file of the snapshot was copied into the upper layer
        // but the one modified and the one made.
        assert_eq!(
            regular_files(&upper),
            vec![
                "deeper-top/new.txt".to_string(),
                "moved/keep.txt".to_string()
            ],
            "{lower}: the renames copied files"
        );
        cowspace_tests::assert_same_tree(&plain, &ws.path);
        // diff names every path the moves made or removed.
        let diff = r.t.run(["diff", &ws.id]).ok().stdout;
        for line in [
            "A moved/a-link.txt",
            "A moved/to-a",
            "A far/away/pkg2/a.txt",
            "A deeper-top/f.txt",
            "A deeper-top/new.txt",
            "D pkg/sub/deeper/f.txt",
            "D pkg/gone.txt",
        ] {
            assert!(
                diff.lines().any(|l| l == line),
                "{lower}: diff lacks {line:?}:\n{diff}"
            );
        }
        assert!(
            !diff.lines().any(|l| l.contains("far/away/pkg2/gone.txt")),
            "{lower}: {diff}"
        );
        let (new_snap, _, _) = r.commit(&ws.id, &[]);
        let out = r.t.path("export");
        r.t.run(["export", &new_snap, out.to_str().unwrap()]).ok();
        // (Its .git/config and .git/index as imported, as above.)
        for f in [".git/config", ".git/index"] {
            std::fs::copy(ws.path.join(f), out.join(f)).unwrap();
        }
        cowspace_tests::assert_same_tree(&plain, &out);
        // git sees the moves (its fsmonitor hook names the renamed directories).
        let status = sh(&ws.path, &format!("{GIT} status --porcelain"));
        assert!(status.contains("moved/"), "{lower}: {status}");
        assert!(status.contains("deeper-top/"), "{lower}: {status}");
        r.discard(&ws.id);
        r.assert_clean();
    }
}
