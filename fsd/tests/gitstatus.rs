//! The first `git status` in a brand-new workspace of a git checkout reads no file: the
//! imported `.git/index` agrees with what the snapshot view serves. Root only (mounts).

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use common::{Cleanup, can_run};
use cowspace_fsd::runtime::{CreateOptions, Runtime};
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
fn first_git_status_in_a_view_workspace_rewrites_no_index() {
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
    let mut upper_has_index = vec![];
    for lower in ["view", "checkout"] {
        let ws = rt
            .create(&CreateOptions {
                snapshot: "repo".into(),
                lower: Some(lower.into()),
                ..Default::default()
            })
            .unwrap();
        let out = git(&ws.path, &["status", "--porcelain"]);
        assert!(
            out.stdout.is_empty(),
            "{lower}: a fresh workspace is clean: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        // git writes the index back only when it had to refresh (re-read) entries.
        upper_has_index.push(ws.private_dir.join("upper/.git/index").exists());
        rt.remove(&ws.id, false).unwrap();
    }
    assert!(
        !upper_has_index[0],
        "view: git re-read files and rewrote its index"
    );
    // The checkout serves other inode numbers: git re-reads there (this shows the check
    // above can fail).
    assert!(
        upper_has_index[1],
        "checkout: expected git to refresh its index"
    );
}
