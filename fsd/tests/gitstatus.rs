//! The first `git status` in a brand-new workspace of a git checkout reads no file: the
//! imported `.git/index` agrees with what the snapshot view serves. Root only (mounts).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use cowspace_fsd::runtime::{CreateOptions, Runtime};
use cowspace_store::{ImportOptions, Store, StoreConfig};

fn can_run() -> bool {
    if nix::unistd::geteuid().is_root() && Path::new("/dev/fuse").exists() {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI=true: this test must run (root, /dev/fuse)"
    );
    eprintln!("skipped: needs root and /dev/fuse");
    false
}

/// Removes every workspace, stops the daemon and detaches leftovers, even on panic.
struct Cleanup {
    root: PathBuf,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Ok(rt) = Runtime::open(&self.root) {
            for r in rt.list(false).unwrap_or_default() {
                let _ = rt.remove(&r.id, true);
            }
        }
        let _ = cowspace_fsd::daemon::stop(&self.root, true);
        let mut mounted: Vec<PathBuf> = cowspace_fsd::mounts::mounts()
            .unwrap_or_default()
            .into_iter()
            .map(|m| m.target)
            .filter(|t| t.starts_with(&self.root))
            .collect();
        mounted.sort();
        for m in mounted.iter().rev() {
            let _ = cowspace_fsd::mounts::unmount_lazy(m);
        }
    }
}

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
    let _cleanup = Cleanup { root: root.clone() };
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
