//! Workspaces from a developer's git checkout under each dirty-state policy. Root only.

use std::path::Path;
use std::process::Command;

use crate::common::{Cleanup, can_run};
use cowspace::error::ErrorKind;
use cowspace::fromgit::Dirty;
use cowspace::runtime::{CreateOptions, Runtime};
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

    // The unchanged files older than the index, so git trusts their entries there.
    for f in ["d/b.txt", ".gitignore"] {
        let t = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        let file = std::fs::File::options()
            .write(true)
            .open(repo.join(f))
            .unwrap();
        file.set_modified(t).unwrap();
    }
    git(&repo, &["status", "--porcelain"]);

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
    // A git work tree: the change is uncommitted there, as on the host.
    assert!(p.path.join(".git").is_dir());
    // The index agrees with what the workspace serves: git need not look at the files
    // the patch left alone (`diff-files` compares stat data only).
    assert_eq!(git_out(&p.path, &["diff-files", "--name-only"]), "a.txt\n");
    assert_eq!(
        git_out(&p.path, &["status", "--porcelain=v1"]),
        " M a.txt\n"
    );

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

fn git_out(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", dir)
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// What git says of a checkout: branch, HEAD, status, and the branches it knows.
fn git_state(dir: &Path) -> Vec<String> {
    [
        &["rev-parse", "--abbrev-ref", "HEAD"][..],
        &["rev-parse", "HEAD"],
        &["status", "--porcelain=v1"],
        &[
            "for-each-ref",
            "--format=%(refname) %(objectname)",
            "refs/heads",
        ],
        &["rev-parse", "--is-bare-repository"],
    ]
    .iter()
    .map(|a| git_out(dir, a))
    .collect()
}

#[test]
fn linked_worktrees_get_a_repository_of_their_own() {
    if !can_run() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    std::fs::write(repo.join("a.txt"), "one\n").unwrap();
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "init"]);
    // The main worktree is in the middle of something of its own.
    std::fs::write(repo.join("a.txt"), "main's change\n").unwrap();
    git(&repo, &["add", "a.txt"]);
    let wt = tmp.path().join("wt");
    git(
        &repo,
        &["worktree", "add", "-q", "-b", "topic", wt.to_str().unwrap()],
    );
    std::fs::write(wt.join("a.txt"), "one\ntopic\n").unwrap();
    std::fs::write(wt.join("b.txt"), "staged\n").unwrap();
    git(&wt, &["add", "b.txt"]);
    std::fs::write(wt.join("new.txt"), "untracked\n").unwrap();
    // A bare repository's worktree, and a checkout with a separate git dir.
    let bare = tmp.path().join("bare.git");
    git(
        tmp.path(),
        &[
            "clone",
            "-q",
            "--bare",
            repo.to_str().unwrap(),
            bare.to_str().unwrap(),
        ],
    );
    let bwt = tmp.path().join("bwt");
    git(
        &bare,
        &["worktree", "add", "-q", bwt.to_str().unwrap(), "main"],
    );
    let sep = tmp.path().join("sep");
    git(
        tmp.path(),
        &[
            "clone",
            "-q",
            "--separate-git-dir",
            tmp.path().join("sep.git").to_str().unwrap(),
            repo.to_str().unwrap(),
            sep.to_str().unwrap(),
        ],
    );

    // And a checkout whose `.git` is a symlink to its repository.
    let sym = tmp.path().join("sym");
    git(
        tmp.path(),
        &["clone", "-q", repo.to_str().unwrap(), sym.to_str().unwrap()],
    );
    std::fs::rename(sym.join(".git"), tmp.path().join("sym.git")).unwrap();
    std::os::unix::fs::symlink("../sym.git", sym.join(".git")).unwrap();

    let root = tmp.path().join("root");
    let _cleanup = Cleanup(root.clone());
    Store::init(&root, StoreConfig::default()).unwrap();
    let rt = Runtime::open(&root).unwrap();
    let opts = CreateOptions::default();

    let host = |d: &Path| (git_state(d), std::fs::read(d.join(".git")).ok());
    let (wt_before, repo_before) = (host(&wt), git_state(&repo));
    let ws = rt.create_from_git(&wt, Dirty::Snapshot, &opts).unwrap();
    assert!(ws.path.join(".git").is_dir(), "a repository, not a pointer");
    assert_eq!(git_state(&ws.path), wt_before.0, "the worktree's state");
    assert_eq!(
        git_out(&ws.path, &["worktree", "list", "--porcelain"])
            .lines()
            .filter(|l| l.starts_with("worktree "))
            .count(),
        1,
        "no other worktree is named"
    );
    assert!(!ws.path.join(".git/worktrees").exists());
    // What git does in the workspace stays there.
    git(&ws.path, &["add", "-A"]);
    git(&ws.path, &["commit", "-qm", "in the workspace"]);
    git(&ws.path, &["checkout", "-q", "-b", "another"]);
    assert_eq!(host(&wt), wt_before, "the host worktree is as it was");
    assert_eq!(git_state(&repo), repo_before, "and so is its repository");

    // The main worktree's workspace does not hold the linked worktrees' state either: a
    // branch checked out there can be checked out here.
    let main_ws = rt.create_from_git(&repo, Dirty::Snapshot, &opts).unwrap();
    assert!(!main_ws.path.join(".git/worktrees").exists());
    git(&main_ws.path, &["stash", "-q"]);
    git(&main_ws.path, &["checkout", "-q", "topic"]);
    assert_eq!(git_state(&repo), repo_before);

    // Under `patch`: HEAD, the diff applied, the worktree's index; untracked files left.
    let ws = rt.create_from_git(&wt, Dirty::Patch, &opts).unwrap();
    let mut want = wt_before.0.clone();
    want[2] = want[2]
        .lines()
        .filter(|l| !l.starts_with("??"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(git_state(&ws.path), want);
    git(&ws.path, &["commit", "-qam", "in the workspace"]);
    assert_eq!(host(&wt), wt_before);

    // Clean worktrees under `refuse`; the bare repository's worktree is not bare.
    for (dir, branch, dirty) in [
        (&bwt, "main", Dirty::Refuse),
        (&sep, "main", Dirty::Refuse),
        (&sym, "main", Dirty::Refuse),
        (&bwt, "main", Dirty::Patch),
    ] {
        let before = host(dir);
        let ws = rt.create_from_git(dir, dirty, &opts).unwrap();
        assert!(ws.path.join(".git").is_dir(), "{}", dir.display());
        let state = git_state(&ws.path);
        assert_eq!(state, before.0, "{}", dir.display());
        assert_eq!(state[0].trim(), branch);
        assert_eq!(state[4].trim(), "false");
        std::fs::write(ws.path.join("c.txt"), "c\n").unwrap();
        git(&ws.path, &["add", "c.txt"]);
        git(&ws.path, &["commit", "-qm", "c"]);
        assert_eq!(host(dir), before, "{}", dir.display());
    }
}

#[test]
fn a_linked_worktree_s_submodules_stay_in_the_workspace() {
    if !can_run() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let lib = tmp.path().join("lib");
    std::fs::create_dir_all(&lib).unwrap();
    git(&lib, &["init", "-q", "-b", "main"]);
    std::fs::write(lib.join("s.txt"), "lib\n").unwrap();
    git(&lib, &["add", "-A"]);
    git(&lib, &["commit", "-qm", "lib"]);
    let repo = tmp.path().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    let allow = ["-c", "protocol.file.allow=always"];
    git(
        &repo,
        &[&allow[..], &["submodule", "add", "-q", "../lib", "ext/lib"]].concat(),
    );
    git(&repo, &["commit", "-qm", "with lib"]);
    let wt = tmp.path().join("wt");
    git(&repo, &["worktree", "add", "-q", wt.to_str().unwrap()]);
    git(
        &wt,
        &[&allow[..], &["submodule", "update", "-q", "--init"]].concat(),
    );
    std::fs::write(wt.join("ext/lib/s.txt"), "lib\nchanged\n").unwrap();
    // Its `.git` file names the submodule's repository by a relative path, which from a
    // workspace beside the worktree would lead to the host's.
    let host_gitfile = std::fs::read_to_string(wt.join("ext/lib/.git")).unwrap();
    assert!(
        host_gitfile.contains("worktrees/wt/modules"),
        "{host_gitfile}"
    );

    let root = tmp.path().join("root");
    let _cleanup = Cleanup(root.clone());
    Store::init(&root, StoreConfig::default()).unwrap();
    let rt = Runtime::open(&root).unwrap();
    let opts = CreateOptions {
        path: Some(tmp.path().join("ws")),
        ..Default::default()
    };
    let before = git_state(&wt.join("ext/lib"));
    let ws = rt.create_from_git(&wt, Dirty::Snapshot, &opts).unwrap();
    let sub = ws.path.join("ext/lib");
    assert_eq!(
        std::fs::read_to_string(sub.join(".git")).unwrap(),
        "gitdir: ../../.git/modules/ext/lib\n"
    );
    let git_dir = git_out(&sub, &["rev-parse", "--absolute-git-dir"]);
    assert!(
        git_dir.starts_with(&*ws.path.to_string_lossy()),
        "{git_dir}"
    );
    assert_eq!(
        git_out(&sub, &["rev-parse", "--show-toplevel"]).trim(),
        sub.to_str().unwrap()
    );
    assert_eq!(git_state(&sub), before, "the submodule's state");
    let status = ["status", "--porcelain=v1"];
    assert_eq!(git_out(&ws.path, &status), git_out(&wt, &status));
    git(&sub, &["commit", "-qam", "in the workspace"]);
    assert_eq!(
        git_state(&wt.join("ext/lib")),
        before,
        "the host's is as it was"
    );
    assert_eq!(
        std::fs::read_to_string(wt.join("ext/lib/.git")).unwrap(),
        host_gitfile
    );
}

#[test]
fn a_nested_checkout_s_repository_outside_the_tree_comes_along() {
    if !can_run() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let outer = tmp.path().join("outer");
    std::fs::create_dir_all(outer.join("vendor")).unwrap();
    git(&outer, &["init", "-q", "-b", "main"]);
    std::fs::write(outer.join("a.txt"), "a\n").unwrap();
    std::fs::write(outer.join(".gitignore"), "vendor/\n").unwrap();
    git(&outer, &["add", "-A"]);
    git(&outer, &["commit", "-qm", "outer"]);
    // A checkout inside whose repository lives elsewhere.
    let lib = outer.join("vendor/lib");
    let elsewhere = tmp.path().join("elsewhere.git");
    git(
        &outer,
        &[
            "init",
            "-q",
            "-b",
            "main",
            "--separate-git-dir",
            elsewhere.to_str().unwrap(),
            lib.to_str().unwrap(),
        ],
    );
    std::fs::write(lib.join("l.txt"), "lib\n").unwrap();
    git(&lib, &["add", "-A"]);
    git(&lib, &["commit", "-qm", "lib"]);
    std::fs::write(lib.join("l.txt"), "lib\nchanged\n").unwrap();

    let root = tmp.path().join("root");
    let _cleanup = Cleanup(root.clone());
    Store::init(&root, StoreConfig::default()).unwrap();
    let rt = Runtime::open(&root).unwrap();
    let before = git_state(&lib);
    let ws = rt
        .create_from_git(&outer, Dirty::Refuse, &CreateOptions::default())
        .unwrap();
    let inner = ws.path.join("vendor/lib");
    assert!(inner.join(".git").is_dir(), "a repository, not a pointer");
    let git_dir = git_out(&inner, &["rev-parse", "--absolute-git-dir"]);
    assert!(
        git_dir.starts_with(&*ws.path.to_string_lossy()),
        "{git_dir}"
    );
    assert_eq!(git_state(&inner), before);
    git(&inner, &["commit", "-qam", "in the workspace"]);
    assert_eq!(git_state(&lib), before, "the host's is as it was");
}
