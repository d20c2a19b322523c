//! The store knows nothing of FUSE, mounts or privileges: it is a library of files and
//! SQLite, usable by any process on any filesystem. Checked on what it depends on and on
//! what its code calls.

use std::path::Path;

/// Names whose presence in the store's code means it mounts, serves FUSE or changes
/// privileges.
const FORBIDDEN_CALLS: &[&str] = &[
    "nix::mount",
    "libc::mount",
    "libc::umount",
    "fuser",
    "setuid",
    "setresuid",
    "capset",
    "unshare",
    "pivot_root",
    "sandbox_helper",
    "cowspace::",
];

/// Crates the store must not depend on.
const FORBIDDEN_DEPS: &[&str] = &[
    "fuser",
    "sandbox-helper",
    "cowspace",
    "cowspace-fsd",
    "caps",
];

fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn the_store_neither_mounts_nor_serves_fuse_nor_changes_privileges() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(crate_dir.join("Cargo.toml")).unwrap();
    let deps: Vec<&str> = manifest
        .lines()
        .skip_while(|l| l.trim() != "[dependencies]")
        .skip(1)
        .take_while(|l| !l.starts_with('['))
        .filter_map(|l| l.split(['=', '.']).next().map(str::trim))
        .filter(|n| !n.is_empty())
        .collect();
    assert!(
        deps.contains(&"rusqlite"),
        "the [dependencies] table was not read: {deps:?}"
    );
    for bad in FORBIDDEN_DEPS {
        assert!(!deps.contains(bad), "the store depends on {bad}");
    }
    let mut files = Vec::new();
    sources(&crate_dir.join("src"), &mut files);
    assert!(files.len() > 20, "{files:?}");
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for bad in FORBIDDEN_CALLS {
                assert!(
                    !code.contains(bad),
                    "{}:{}: the store calls {bad}: {line}",
                    f.display(),
                    n + 1
                );
            }
        }
    }
}
