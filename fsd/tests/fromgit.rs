//! Workspaces from a developer's git checkout under each dirty-state policy. Root only.

mod common;

use std::path::Path;
use std::process::Command;

use common::{Cleanup, can_run};
use cowspace_fsd::error::ErrorKind;
use cowspace_fsd::fromgit::Dirty;
use cowspace_fsd::runtime::{CreateOptions, Runtime};
use cowspace_store::{Store, StoreConfig};

fn git(dir: &Path, args: &[&str]) {
    let ok = Command::new("git")
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
        .args(args)
        .status()
        .unwrap()
        .success();
    assert!(ok, "git {args:?}");
}

#[test]
fn dirty_checkouts_are_refused_patched_or_snapshotted() {
    if !can_run() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    std::fs::create_dir_all(repo.join("d")).unwrap();
    git(&repo, &["init", "-q"]);
    std::fs::write(repo.join("a.txt"), "one\n").unwrap();
    std::fs::write(repo.join("d/b.txt"), "two\n").unwrap();
    std::fs::write(repo.join(".gitignore"), "*.log\n").unwrap();
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "init"]);
    let root = tmp.path().join("root");
    let _cleanup = Cleanup(root.clone());
    Store::init(&root, StoreConfig::default()).unwrap();
    let rt = Runtime::open(&root).unwrap();
    let opts = CreateOptions::default();

    // Clean: every policy works; refuse makes a workspace of the checkout.
    let clean = rt.create_from_git(&repo, Dirty::Refuse, &opts).unwrap();
    assert_eq!(
        std::fs::read_to_string(clean.path.join("a.txt")).unwrap(),
        "one\n"
    );
    assert!(clean.path.join(".git").is_dir());
    assert_eq!(clean.policies["checkout"]["dirty"], "refuse");

    std::fs::write(repo.join("a.txt"), "one\nchanged\n").unwrap();
    std::fs::write(repo.join("new.txt"), "untracked\n").unwrap();
    std::fs::write(repo.join("x.log"), "ignored\n").unwrap();
    let before = rt.list(true).unwrap().len();
    let err = rt.create_from_git(&repo, Dirty::Refuse, &opts).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    let msg = err.to_string();
    assert!(
        msg.contains("a.txt") && msg.contains("new.txt") && !msg.contains("x.log"),
        "{msg}"
    );
    assert_eq!(rt.list(true).unwrap().len(), before, "nothing was made");

    // Patch: HEAD's tree plus the tracked diff; the untracked file is not in a patch.
    let p = rt.create_from_git(&repo, Dirty::Patch, &opts).unwrap();
    assert_eq!(
        std::fs::read_to_string(p.path.join("a.txt")).unwrap(),
        "one\nchanged\n"
    );
    assert!(!p.path.join("new.txt").exists());
    let ev = &p.policies["checkout"];
    assert_eq!(ev["dirty"], "patch");
    assert_eq!(ev["untracked_not_in_patch"], 1);
    let artifact = std::fs::read(ev["patch_artifact"].as_str().unwrap()).unwrap();
    assert_eq!(
        ev["patch_blake3"],
        blake3::hash(&artifact).to_hex().to_string()
    );
    let changes: Vec<String> = rt
        .diff(&p.id)
        .unwrap()
        .into_iter()
        .map(|(c, _)| c.path)
        .collect();
    assert_eq!(changes, vec!["a.txt".to_string()]);

    // Snapshot: the working tree as it is, .git included.
    let s = rt.create_from_git(&repo, Dirty::Snapshot, &opts).unwrap();
    assert_eq!(
        std::fs::read_to_string(s.path.join("new.txt")).unwrap(),
        "untracked\n"
    );
    assert!(s.path.join(".git").is_dir());
    assert!(s.policies["checkout"]["snapshot_of_working_tree"].is_string());
    assert_eq!(
        s.policies["checkout"]["commit"],
        clean.policies["checkout"]["commit"]
    );
}
