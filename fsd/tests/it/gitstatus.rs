//! The first `git status` in a brand-new workspace of a git checkout reads no file: the
//! imported `.git/index` agrees with what the snapshot view (and so the overlay and fuse
//! workspaces) serves, and a whole-tree workspace's index is rewritten with its own files'
//! stat data when the tree is made. Root only (mounts).

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use crate::common::{Cleanup, can_run};
use cowspace::runtime::{CreateOptions, Runtime};
use cowspace_store::{ImportOptions, Store, StoreConfig};

fn git(dir: &Path, args: &[&str]) -> std::process::Output {
    let out = Command::new("git")
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
        .args(args)
        .output()
        .expect("git runs");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn first_git_status_in_a_fresh_workspace_reads_no_file() {
    if !can_run() {
        return;
    }
    // The daemon is started on demand from `fsd` next to this test binary (target/<profile>).
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "-q"]);
    for i in 0..200 {
        let d = repo.join(format!("d{}", i % 7));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(format!("f{i}.txt")), format!("file {i}\n")).unwrap();
    }
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "init"]);
    // Files must be older than the index (git's racy-clean rule) and the stat cache margin.
    std::thread::sleep(std::time::Duration::from_millis(1200));
    git(&repo, &["status", "--porcelain"]);

    let root = tmp.path().join("root");
    let _cleanup = Cleanup(root.clone());
    let store = Store::init(&root, StoreConfig::default()).unwrap();
    let mut opts = ImportOptions::new();
    opts.ref_name = Some("repo".into());
    opts.served_identity = Some(Arc::new(|p: &[u8], e: &cowspace_store::Entry| {
        cowspace_fsd::view::served_file_stat(p, e, 0, 0)
    }));
    store.import_dir(&repo, &opts).unwrap();
    drop(store);

    let rt = Runtime::open(&root).unwrap();
    // (materializer, lower, whether git trusts every entry of the fresh workspace)
    let cases = [
        ("overlay", Some("view"), true),
        ("fuse", None, true),
        // A whole tree of its own files: its index is rewritten when the tree is made.
        ("copy", None, true),
        // The checkout's files are hard links whose inode numbers are the blob cache's:
        // git re-reads there (this shows the check can fail).
        ("overlay", Some("checkout"), false),
    ];
    for (materializer, lower, clean) in cases {
        let ws = rt
            .create(&CreateOptions {
                snapshot: "repo".into(),
                materializer: Some(materializer.parse().unwrap()),
                lower: lower.map(|l| l.parse().unwrap()),
                ..Default::default()
            })
            .unwrap();
        // The rewritten index is the workspace's own business: nothing shows as changed.
        let changed = rt.diff(&ws.id).unwrap();
        assert!(
            changed.is_empty(),
            "{materializer} {lower:?}: an untouched workspace diffs empty: {changed:?}"
        );
        // Entries whose stat data disagrees with the index, without refreshing it: each
        // one is a file the first `git status` would read.
        let stale = git(&ws.path, &["diff-files", "--name-only"]).stdout;
        let stale = String::from_utf8_lossy(&stale).lines().count();
        if clean {
            assert_eq!(
                stale, 0,
                "{materializer} {lower:?}: git must trust every entry of a fresh workspace"
            );
        } else {
            assert!(
                stale > 0,
                "{materializer} {lower:?}: expected entries git does not trust"
            );
        }
        let out = git(&ws.path, &["status", "--porcelain"]);
        assert!(
            out.stdout.is_empty(),
            "{materializer} {lower:?}: a fresh workspace is clean: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        rt.remove(&ws.id, true).unwrap(); // git status may refresh the index: a change
    }
}
