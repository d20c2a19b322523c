//! Git import: a revision imports to exactly what `git archive` gives, and to the same
//! tree as a clean checkout imported as a directory.

use crate::common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use cowspace_store::{ErrorKind, ImportOptions, Source, Store, StoreConfig};

use common::listing;

/// Runs a shell command with a private git configuration (HOME = `home`).
fn sh(home: &Path, cmd: &str) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("umask 022; {cmd}"))
        .env("HOME", home)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@example.com")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@example.com")
        .env("GIT_AUTHOR_DATE", "2020-01-01T00:00:00Z")
        .env("GIT_COMMITTER_DATE", "2020-01-01T00:00:00Z")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{cmd}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn q(p: &Path) -> String {
    format!("'{}'", p.display())
}

/// A repository with nested dirs, an exec file, a symlink, a tracked `build/` file and
/// two commits; returns the commit ids.
fn make_repo(home: &Path, repo: &Path) -> (String, String) {
    fs::create_dir_all(repo.join("src/lib/deep")).unwrap();
    fs::create_dir_all(repo.join("build")).unwrap();
    fs::write(repo.join("README.md"), "# demo\n").unwrap();
    fs::write(repo.join("src/main.rs"), "fn main() {}\n").unwrap();
    fs::write(repo.join("src/lib/deep/x.rs"), "// x\n").unwrap();
    fs::write(repo.join("name with space.txt"), "spaced\n").unwrap();
    fs::write(repo.join("héllo.txt"), "unicode\n").unwrap();
    fs::write(repo.join("run.sh"), "#!/bin/sh\necho run\n").unwrap();
    fs::set_permissions(repo.join("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(repo.join("build/keep.sh"), "tracked under build\n").unwrap();
    let big: Vec<u8> = (0..1_200_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 11) as u8)
        .collect();
    fs::write(repo.join("big.bin"), &big).unwrap();
    std::os::unix::fs::symlink("src/main.rs", repo.join("link")).unwrap();
    sh(home, &format!("git init -q {}", q(repo)));
    sh(
        home,
        &format!("cd {} && git add -A && git commit -qm one", q(repo)),
    );
    let c1 = sh(home, &format!("git -C {} rev-parse HEAD", q(repo)));
    fs::write(repo.join("src/main.rs"), "fn main() { println!(\"2\"); }\n").unwrap();
    fs::remove_file(repo.join("README.md")).unwrap();
    fs::write(repo.join("src/lib/new.rs"), "// new\n").unwrap();
    fs::write(repo.join("src/lib/same.rs"), "// x\n").unwrap(); // same blob as x.rs
    std::os::unix::fs::symlink("../../../outside", repo.join("src/lib/up")).unwrap();
    sh(
        home,
        &format!("cd {} && git add -A && git commit -qm two", q(repo)),
    );
    let c2 = sh(home, &format!("git -C {} rev-parse HEAD", q(repo)));
    // An untracked build directory in the work tree: never part of a git import.
    fs::write(repo.join("build/untracked.o"), "junk").unwrap();
    (c1, c2)
}

#[test]
fn commits_import_as_git_archive_and_as_a_clean_checkout() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let repo = tmp.path().join("repo");
    let (c1, c2) = make_repo(home, &repo);
    let bare = tmp.path().join("bare.git");
    sh(
        home,
        &format!("git clone -q --bare {} {}", q(&repo), q(&bare)),
    );
    let store = Store::init(&tmp.path().join("root"), StoreConfig::default()).unwrap();

    for (i, commit) in [&c1, &c2].into_iter().enumerate() {
        let r = store
            .import_git(&repo, commit, &ImportOptions::new())
            .unwrap();
        assert!(r.warnings.is_empty(), "{:?}", r.warnings);
        let out = tmp.path().join(format!("out{i}"));
        store.export_dir(&r.snapshot, &out).unwrap();
        let ext = tmp.path().join(format!("archive{i}"));
        fs::create_dir(&ext).unwrap();
        sh(
            home,
            &format!(
                "git -C {} -c tar.umask=022 archive {commit} | tar -xpf - -C {}",
                q(&repo),
                q(&ext)
            ),
        );
        let got = listing(&out);
        assert_eq!(got, listing(&ext), "commit {commit}");
        assert!(
            got.iter().any(|l| l.starts_with("f build/keep.sh ")),
            "tracked build/ kept"
        );
        assert!(
            got.iter().any(|l| l.starts_with("f run.sh 755 ")),
            "{got:?}"
        );
        assert!(
            got.contains(&"l link -> src/main.rs".to_string()),
            "{got:?}"
        );
        assert!(!got.iter().any(|l| l.contains("untracked")), "{got:?}");

        match store.snapshot(&r.snapshot).unwrap().source {
            Source::Git {
                repo: rp,
                rev,
                commit: cm,
            } => {
                assert_eq!(&cm, commit);
                assert_eq!(&rev, commit);
                assert!(rp.ends_with("repo"));
            }
            s => panic!("source {s:?}"),
        }

        // A clean checkout of the commit, imported as a directory without `.git`.
        let co = tmp.path().join(format!("checkout{i}"));
        sh(
            home,
            &format!(
                "git clone -q {} {} && git -C {} checkout -q {commit}",
                q(&repo),
                q(&co),
                q(&co)
            ),
        );
        let mut opts = ImportOptions::new();
        opts.excludes = vec![".git".into()];
        let d = store.import_dir(&co, &opts).unwrap();
        assert_eq!(d.root, r.root, "checkout of {commit} as a directory");

        // A bare repository gives the same tree.
        let b = store
            .import_git(&bare, commit, &ImportOptions::new())
            .unwrap();
        assert_eq!(b.root, r.root);
    }

    // Revisions resolve through names; the ref and message are recorded.
    let mut opts = ImportOptions::new();
    opts.ref_name = Some("demo/main".into());
    opts.message = "import HEAD".into();
    let r = store.import_git(&repo, "HEAD~1", &opts).unwrap();
    let by_commit = store.import_git(&repo, &c1, &ImportOptions::new()).unwrap();
    assert_eq!(r.root, by_commit.root);
    assert_eq!(r.ref_name.as_deref(), Some("demo/main"));

    // User patterns still apply to a git import.
    let mut opts = ImportOptions::new();
    opts.excludes = vec!["*.rs".into()];
    let r = store.import_git(&repo, &c2, &opts).unwrap();
    assert_eq!(r.excluded, 4, "main.rs, x.rs, new.rs, same.rs");
}

#[test]
fn unknown_revision_and_non_repository_are_invalid_input() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let repo = tmp.path().join("repo");
    make_repo(home, &repo);
    let store = Store::init(&tmp.path().join("root"), StoreConfig::default()).unwrap();
    let before = store.snapshot_ids().unwrap();

    let e = store
        .import_git(&repo, "no-such-branch", &ImportOptions::new())
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert!(e.to_string().contains("no-such-branch"), "{e}");

    let plain = tmp.path().join("plain");
    fs::create_dir(&plain).unwrap();
    let e = store
        .import_git(&plain, "HEAD", &ImportOptions::new())
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert!(e.to_string().contains("not a git repository"), "{e}");

    // A directory inside a work tree is not itself a repository.
    let e = store
        .import_git(&repo.join("src"), "HEAD", &ImportOptions::new())
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");

    let e = store
        .import_git(&repo, "--output=/tmp/x", &ImportOptions::new())
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");

    let e = store
        .import_git(&tmp.path().join("missing"), "HEAD", &ImportOptions::new())
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    assert_eq!(store.snapshot_ids().unwrap(), before);
}

#[test]
fn submodules_are_left_out_with_a_warning() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let repo = tmp.path().join("repo");
    fs::create_dir(&repo).unwrap();
    fs::write(repo.join("a.txt"), "a\n").unwrap();
    sh(home, &format!("git init -q {}", q(&repo)));
    sh(
        home,
        &format!(
            "cd {} && git add a.txt && git update-index --add --cacheinfo 160000,1234567890123456789012345678901234567890,vendor/sub && git commit -qm s",
            q(&repo)
        ),
    );
    let store = Store::init(&tmp.path().join("root"), StoreConfig::default()).unwrap();
    let r = store
        .import_git(&repo, "HEAD", &ImportOptions::new())
        .unwrap();
    assert_eq!(r.warnings.len(), 1, "{:?}", r.warnings);
    assert!(r.warnings[0].contains("vendor/sub"), "{:?}", r.warnings);
    assert_eq!(r.files, 1);
    let out = tmp.path().join("out");
    store.export_dir(&r.snapshot, &out).unwrap();
    assert_eq!(listing(&out).len(), 1, "{:?}", listing(&out));
}

#[test]
fn directory_import_spares_what_nested_repositories_track() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let top = tmp.path().join("top");
    let inner = top.join("vendor/lib");
    fs::create_dir_all(inner.join("build")).unwrap();
    fs::create_dir_all(top.join("build")).unwrap();
    fs::create_dir_all(top.join("sub/build")).unwrap();
    fs::write(inner.join("build/tracked.txt"), "inner tracked\n").unwrap();
    fs::write(top.join("build/untracked.o"), "junk\n").unwrap();
    fs::write(top.join("sub/build/tracked.txt"), "outer tracked\n").unwrap();
    sh(home, &format!("git init -q {}", q(&inner)));
    sh(
        home,
        &format!("cd {} && git add -A && git commit -qm i", q(&inner)),
    );
    sh(home, &format!("git init -q {}", q(&top)));
    sh(
        home,
        &format!("cd {} && git add sub && git commit -qm o", q(&top)),
    );

    let store = Store::init(&tmp.path().join("root"), StoreConfig::default()).unwrap();
    let r = store.import_dir(&top, &ImportOptions::new()).unwrap();
    let out = tmp.path().join("out");
    store.export_dir(&r.snapshot, &out).unwrap();
    assert!(
        out.join("vendor/lib/build/tracked.txt").exists(),
        "nested repo's tracked build/"
    );
    assert!(out.join("sub/build/tracked.txt").exists());
    assert!(!out.join("build").exists(), "untracked build/ is left out");

    // A subdirectory of a work tree: what the enclosing repository tracks is spared.
    let r = store
        .import_dir(&top.join("sub"), &ImportOptions::new())
        .unwrap();
    let out = tmp.path().join("out-sub");
    store.export_dir(&r.snapshot, &out).unwrap();
    assert!(out.join("build/tracked.txt").exists());
}

/// A commit's snapshot given the checkout's repository as `.git` (`create --from-git
/// --dirty patch`): `.git` as the checkout has it, and a second time no file of it is
/// read again (the checkout's stat cache, shared with a directory import of it).
#[test]
fn a_commit_with_its_repository_reads_an_unchanged_git_dir_once() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let repo = tmp.path().join("repo");
    let (_, c2) = make_repo(home, &repo);
    // Out of the stat cache's racy margin: files changed within it are read every time.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let store = Store::init(&tmp.path().join("root"), StoreConfig::default()).unwrap();
    let head = store
        .import_git(&repo, &c2, &ImportOptions::new())
        .unwrap()
        .snapshot;
    let git = cowspace_store::import::gitdir::repository_of(&repo)
        .unwrap()
        .unwrap();
    let mut opts = ImportOptions::new();
    opts.message = "with its repository".into();
    let first = store.with_repository(&head, &repo, &git, &opts).unwrap();
    assert!(first.files_read > 0, "{first:?}");
    assert_eq!(first.parents, vec![head]);
    let out = tmp.path().join("out");
    store.export_dir(&first.snapshot, &out).unwrap();
    for f in ["HEAD", "config", "index"] {
        assert_eq!(
            fs::read(out.join(".git").join(f)).unwrap(),
            fs::read(repo.join(".git").join(f)).unwrap(),
            "{f}"
        );
    }
    assert_eq!(
        sh(home, &format!("git -C {} rev-parse HEAD", q(&out))),
        c2,
        "a repository of its own"
    );
    let second = store.with_repository(&head, &repo, &git, &opts).unwrap();
    assert_eq!(second.files_read, 0, "{second:?}");
    assert_eq!(second.root, first.root, "the same tree");
}

/// Git blobs stored once are not read again: a second import of the commit, or of
/// another commit sharing them, reads only what is new. gc forgets the ids of content it
/// deletes, so an import after it reads them again.
#[test]
fn git_blobs_stored_once_are_not_read_again() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let repo = tmp.path().join("repo");
    let (c1, c2) = make_repo(home, &repo);
    let store = Store::init(&tmp.path().join("root"), StoreConfig::default()).unwrap();
    let opts = ImportOptions::new();
    let first = store.import_git(&repo, &c2, &opts).unwrap();
    assert!(first.files_read > 0);
    let again = store.import_git(&repo, &c2, &opts).unwrap();
    assert_eq!(again.files_read, 0, "{again:?}");
    assert_eq!(again.root, first.root);
    // The first commit: only the blobs the second one changed are read.
    let older = store.import_git(&repo, &c1, &opts).unwrap();
    assert!(older.files_read < first.files_read, "{older:?}");
    // A new commit: only its changed blob is read.
    fs::write(repo.join("src/main.rs"), "fn main() { changed(); }\n").unwrap();
    sh(home, &format!("git -C {} commit -qam three", q(&repo)));
    let c3 = sh(home, &format!("git -C {} rev-parse HEAD", q(&repo)));
    let third = store.import_git(&repo, &c3, &opts).unwrap();
    assert_eq!(third.files_read, 1, "{third:?}");

    // Nothing refers to any of them: gc deletes the content, and with it the ids.
    let gc = cowspace_store::gc::GcOptions {
        grace_secs: 0,
        ..Default::default()
    };
    store.gc(gc).unwrap();
    let after = store.import_git(&repo, &c2, &opts).unwrap();
    // (Symlink targets live in trees, not as content: gc keeps them known.)
    assert_eq!(
        after.files_read,
        first.files_read - after.symlinks,
        "{after:?}"
    );
    assert_eq!(after.root, first.root);
    let out = tmp.path().join("out");
    store.export_dir(&after.snapshot, &out).unwrap();
    assert_eq!(
        fs::read(out.join("big.bin")).unwrap(),
        fs::read(repo.join("big.bin")).unwrap()
    );
}

/// A store made before the table of git blob ids gets it when opened.
#[test]
fn a_store_without_git_blob_ids_gets_the_table_when_opened() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let repo = tmp.path().join("repo");
    let (_, c2) = make_repo(home, &repo);
    let root = tmp.path().join("root");
    let index = {
        let store = Store::init(&root, StoreConfig::default()).unwrap();
        store.layout().index()
    };
    let conn = rusqlite::Connection::open(&index).unwrap();
    conn.execute_batch("DROP TABLE gitblobs; DROP TABLE gitlinks")
        .unwrap();
    drop(conn);
    let store = Store::open(&root, StoreConfig::default()).unwrap();
    let first = store.import_git(&repo, &c2, &ImportOptions::new()).unwrap();
    let again = store.import_git(&repo, &c2, &ImportOptions::new()).unwrap();
    assert_eq!(again.files_read, 0, "{again:?}");
    assert_eq!(again.root, first.root);
}

/// The fresh store, import and file listing of `commit` of `repo`.
fn imported(dir: &Path, repo: &Path, commit: &str) -> (cowspace_store::ImportReport, Vec<String>) {
    let store = Store::init(&dir.join("root"), StoreConfig::default()).unwrap();
    let r = store
        .import_git(repo, commit, &ImportOptions::new())
        .unwrap();
    let out = dir.join("out");
    store.export_dir(&r.snapshot, &out).unwrap();
    (r, listing(&out))
}

/// Loose blobs are read without git (`gitloose`), packed ones through `git cat-file`:
/// a repository with every object loose, one with every object packed and one with
/// some of each give the same tree, read the same number of blobs, and a second import
/// reads none.
#[test]
fn loose_packed_and_mixed_repositories_import_to_the_same_tree() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let repo = tmp.path().join("repo");
    let (_, c2) = make_repo(home, &repo);
    let loose_dir = repo.join(".git/objects");
    let packed = tmp.path().join("packed.git");
    sh(
        home,
        &format!("git clone -q --bare --no-local {} {}", q(&repo), q(&packed)),
    );
    sh(home, &format!("git -C {} repack -q -a -d", q(&packed)));
    let loose_in = |objects: &Path| -> Vec<std::path::PathBuf> {
        let mut v: Vec<_> = fs::read_dir(objects)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.file_name().unwrap().len() == 2)
            .flat_map(|d| fs::read_dir(d).unwrap().map(|e| e.unwrap().path()))
            .collect();
        v.sort();
        v
    };
    assert!(!loose_in(&loose_dir).is_empty());
    assert!(loose_in(&packed.join("objects")).is_empty(), "all packed");
    // Mixed: the loose repository with its pack added and every other loose object gone.
    let mixed = tmp.path().join("mixed");
    sh(home, &format!("cp -a {} {}", q(&repo), q(&mixed)));
    sh(
        home,
        &format!(
            "cp {}/objects/pack/* {}/.git/objects/pack/",
            q(&packed),
            q(&mixed)
        ),
    );
    for p in loose_in(&mixed.join(".git/objects")).iter().step_by(2) {
        fs::remove_file(p).unwrap();
    }

    let (want, want_files) = imported(&tmp.path().join("a"), &repo, &c2);
    for (name, r) in [("packed", &packed), ("mixed", &mixed)] {
        let (got, files) = imported(&tmp.path().join(name), r, &c2);
        assert_eq!(got.root, want.root, "{name}");
        assert_eq!(files, want_files, "{name}");
        assert_eq!(got.files_read, want.files_read, "{name}");
        assert_eq!(got.objects_written, want.objects_written, "{name}");
    }
    let store = Store::open(&tmp.path().join("mixed/root"), StoreConfig::default()).unwrap();
    let again = store
        .import_git(&mixed, &c2, &ImportOptions::new())
        .unwrap();
    assert_eq!((again.files_read, again.root), (0, want.root));
}

/// A damaged loose object fails the import as git would (invalid input naming the
/// object), and nothing of the import is left in the store.
#[test]
fn a_corrupt_loose_object_fails_the_import_and_stores_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let repo = tmp.path().join("repo");
    let (_, c2) = make_repo(home, &repo);
    let root = tmp.path().join("root");
    let store = Store::init(&root, StoreConfig::default()).unwrap();
    // One good import first, so the store is not trivially empty.
    let other = tmp.path().join("other");
    fs::create_dir(&other).unwrap();
    fs::write(other.join("f"), "other\n").unwrap();
    store.import_dir(&other, &ImportOptions::new()).unwrap();
    let before_ids = store.snapshot_ids().unwrap();
    let before_packs = common::pack_files(&root).len();

    // The blob only the second commit has, and the large one (chunked as it is read).
    for blob in ["src/lib/new.rs", "big.bin"] {
        let oid = sh(home, &format!("git -C {} rev-parse {c2}:{blob}", q(&repo)));
        let obj = repo.join(".git/objects").join(&oid[..2]).join(&oid[2..]);
        let good = fs::read(&obj).unwrap();
        let mut bad = good.clone();
        let at = bad.len() - 8;
        bad[at] ^= 0x55;
        fs::set_permissions(&obj, fs::Permissions::from_mode(0o644)).unwrap();
        fs::write(&obj, &bad).unwrap();
        let e = store
            .import_git(&repo, &c2, &ImportOptions::new())
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{blob}: {e}");
        assert!(e.to_string().contains(&oid[2..]), "{blob}: {e}");
        assert_eq!(store.snapshot_ids().unwrap(), before_ids, "{blob}");
        assert_eq!(common::pack_files(&root).len(), before_packs, "{blob}");
        fs::write(&obj, &good).unwrap();
    }
    store.import_git(&repo, &c2, &ImportOptions::new()).unwrap();
}

/// Packed blobs are read on the ingest workers (`gitpack`): blobs stored as deltas of
/// each other, in a large file and in small ones, import as `git archive` gives them.
#[test]
fn packed_blobs_stored_as_deltas_import_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let repo = tmp.path().join("repo");
    fs::create_dir_all(repo.join("d")).unwrap();
    let text = |v: u32| -> String {
        (0..40_000u32)
            .map(|i| format!("line {i} of version {}\n", if i % 997 == 0 { v } else { 0 }))
            .collect()
    };
    sh(home, &format!("git init -q {}", q(&repo)));
    let mut commits = Vec::new();
    for v in 0..3 {
        fs::write(repo.join("large.txt"), text(v)).unwrap();
        for i in 0..20 {
            fs::write(
                repo.join(format!("d/small{i}.txt")),
                format!("small {i} {}\n", "ab".repeat(200 + v as usize)),
            )
            .unwrap();
        }
        sh(
            home,
            &format!("cd {} && git add -A && git commit -qm v{v}", q(&repo)),
        );
        commits.push(sh(home, &format!("git -C {} rev-parse HEAD", q(&repo))));
    }
    // Everything in one pack, with deltas (`-f` computes them afresh).
    sh(home, &format!("git -C {} repack -q -a -d -f", q(&repo)));
    sh(home, &format!("git -C {} prune-packed", q(&repo)));
    let verify = sh(
        home,
        &format!(
            "cd {} && git verify-pack -v .git/objects/pack/*.idx | awk '$2 == \"blob\" && NF == 7' | wc -l",
            q(&repo)
        ),
    );
    assert_ne!(verify, "0", "some blobs are deltas");

    let store = Store::init(&tmp.path().join("root"), StoreConfig::default()).unwrap();
    for c in &commits {
        let r = store.import_git(&repo, c, &ImportOptions::new()).unwrap();
        let out = tmp.path().join(format!("out-{c}"));
        store.export_dir(&r.snapshot, &out).unwrap();
        let want = tmp.path().join(format!("want-{c}"));
        fs::create_dir(&want).unwrap();
        sh(
            home,
            &format!("git -C {} archive {c} | tar -x -C {}", q(&repo), q(&want)),
        );
        // (Modes aside: `git archive` applies its own umask, tested above.)
        let names = |d: &Path| -> Vec<String> {
            listing(d)
                .iter()
                .map(|l| l.split(' ').nth(1).unwrap().to_string())
                .collect()
        };
        assert_eq!(names(&out), names(&want), "{c}");
        for name in names(&want) {
            if want.join(&name).is_file() {
                assert_eq!(
                    fs::read(out.join(&name)).unwrap(),
                    fs::read(want.join(&name)).unwrap(),
                    "{c}: {name}"
                );
            }
        }
    }
    assert!(store.fsck().unwrap().is_clean());
}

/// A blob replaced with `git replace` imports as git reads it (the replacement), whether
/// the objects are loose or packed.
#[test]
fn replaced_blobs_import_as_git_reads_them() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let repo = tmp.path().join("repo");
    fs::create_dir_all(&repo).unwrap();
    fs::write(repo.join("a.txt"), "original\n").unwrap();
    sh(home, &format!("git init -q {}", q(&repo)));
    sh(
        home,
        &format!("cd {} && git add -A && git commit -qm one", q(&repo)),
    );
    let old = sh(home, &format!("git -C {} rev-parse HEAD:a.txt", q(&repo)));
    let new = sh(
        home,
        &format!(
            "cd {} && printf 'replacement\\n' | git hash-object -w --stdin",
            q(&repo)
        ),
    );
    sh(home, &format!("git -C {} replace {old} {new}", q(&repo)));
    for packed in [false, true] {
        if packed {
            sh(home, &format!("git -C {} repack -q -a -d", q(&repo)));
        }
        let dir = tmp.path().join(format!("p{packed}"));
        let store = Store::init(&dir.join("root"), StoreConfig::default()).unwrap();
        let r = store
            .import_git(&repo, "HEAD", &ImportOptions::new())
            .unwrap();
        store.export_dir(&r.snapshot, &dir.join("out")).unwrap();
        assert_eq!(
            fs::read_to_string(dir.join("out/a.txt")).unwrap(),
            "replacement\n",
            "packed: {packed}"
        );
    }
}
