//! `mountctl export` to a directory and to a tar, and import of archives.

use std::fs;

use cowspace_tests::{TestRoot, assert_same_tree, dir_entries, run_program, scan_tree};

use super::rich_tree;

fn tar_extract(archive: &std::path::Path, into: &std::path::Path) {
    fs::create_dir(into).unwrap();
    // -p: keep the archived modes also when not root (no umask).
    run_program(
        std::path::Path::new("tar"),
        [
            "-xpf".as_ref(),
            archive.as_os_str(),
            "-C".as_ref(),
            into.as_os_str(),
        ],
        &[],
    )
    .ok();
}

#[test]
fn export_to_a_directory_and_a_tar_reproduces_the_tree() {
    let r = TestRoot::new();
    let src = r.path("src");
    rich_tree(&src);
    let listing = scan_tree(&src);
    // The fixture really has what the test claims to cover.
    let Some(cowspace_tests::Node::File {
        link: Some((_, 3)), ..
    }) = listing.get("linked/one")
    else {
        panic!("fixture: linked/one is not a 3-name hard link: {listing:?}");
    };

    let v = r.import(&src, &["--ref", "rich"]);
    assert_eq!(v["symlinks"], 4, "{v}");
    let snap = v["snapshot"].as_str().unwrap();

    let dir = r.path("export-dir");
    let out = r
        .json(["export", "rich", dir.to_str().unwrap()])
        .ok()
        .json();
    assert_eq!(out["snapshot"], snap, "{out}");
    assert_eq!(out["tar"], false, "{out}");
    assert_same_tree(&src, &dir);

    let tar = r.path("export.tar");
    let out = r
        .json(["export", snap, tar.to_str().unwrap(), "--tar"])
        .ok()
        .json();
    assert_eq!(out["tar"], true, "{out}");
    assert!(tar.is_file());
    let extracted = r.path("extracted");
    tar_extract(&tar, &extracted);
    assert_same_tree(&dir, &extracted);

    // Nothing but the two results appeared beside them (no temporary names left).
    assert_eq!(
        dir_entries(r.scratch()),
        ["export-dir", "export.tar", "extracted", "root", "src"]
    );
}

#[test]
fn archives_import_to_the_same_tree_as_the_directory() {
    let r = TestRoot::new();
    let src = r.path("src");
    rich_tree(&src);
    let from_dir = r.import(&src, &[]);
    let snap = from_dir["snapshot"].as_str().unwrap();
    let tar = r.path("t.tar");
    r.run(["export", snap, tar.to_str().unwrap(), "--tar"]).ok();

    let gz = r.path("t.tar.gz");
    let zst = r.path("t.tar.zst");
    let sh = |cmd: String| {
        run_program(std::path::Path::new("sh"), ["-c", cmd.as_str()], &[]).ok();
    };
    sh(format!("gzip -c '{}' > '{}'", tar.display(), gz.display()));
    sh(format!(
        "zstd -q -c '{}' > '{}'",
        tar.display(),
        zst.display()
    ));

    // The fixture's absolute symlink points outside the archive: refused by default.
    let before = r.snapshot_ids();
    let err = r
        .json(["import", tar.to_str().unwrap()])
        .error(9, "invalid_input");
    assert!(
        err["message"].as_str().unwrap().contains("abs-link"),
        "{err}"
    );
    assert_eq!(r.snapshot_ids(), before);

    for archive in [&tar, &gz, &zst] {
        let v = r.import(archive, &["--allow-external-symlinks"]);
        assert_eq!(v["root"], from_dir["root"], "{}: {v}", archive.display());
        assert_eq!(v["files"], from_dir["files"], "{}: {v}", archive.display());
        let out = r.path(&format!(
            "out-{}",
            archive.file_name().unwrap().to_str().unwrap()
        ));
        r.run([
            "export",
            v["snapshot"].as_str().unwrap(),
            out.to_str().unwrap(),
        ])
        .ok();
        assert_same_tree(&src, &out);
        let source = &r
            .json(["show", v["snapshot"].as_str().unwrap()])
            .ok()
            .json()["meta"]["source"];
        assert_eq!(source["kind"], "tar", "{source}");
    }
}

#[test]
fn export_to_an_existing_destination_is_refused_and_leaves_it_alone() {
    let r = TestRoot::new();
    let src = r.path("src");
    rich_tree(&src);
    let snap = r.import(&src, &[])["snapshot"].as_str().unwrap().to_owned();

    let dest = r.path("dest");
    fs::create_dir(&dest).unwrap();
    fs::write(dest.join("mine"), "keep me").unwrap();
    let before = scan_tree(&dest);
    let err = r
        .json(["export", &snap, dest.to_str().unwrap()])
        .error(4, "exists");
    assert!(err["message"].as_str().unwrap().contains("dest"), "{err}");
    assert_eq!(scan_tree(&dest), before);
    r.json(["export", &snap, dest.to_str().unwrap(), "--tar"])
        .error(4, "exists");
    assert_eq!(scan_tree(&dest), before);

    let file = r.path("file.tar");
    fs::write(&file, "not a tar").unwrap();
    r.json(["export", &snap, file.to_str().unwrap(), "--tar"])
        .error(4, "exists");
    r.json(["export", &snap, file.to_str().unwrap()])
        .error(4, "exists");
    assert_eq!(fs::read(&file).unwrap(), b"not a tar");
    assert_eq!(
        dir_entries(r.scratch()),
        ["dest", "file.tar", "root", "src"]
    );

    // A dangling symlink is an existing destination: not followed, not replaced.
    let link = r.path("link");
    std::os::unix::fs::symlink(r.path("nowhere"), &link).unwrap();
    for tar in [false, true] {
        let mut args = vec!["export", &snap, link.to_str().unwrap()];
        if tar {
            args.push("--tar");
        }
        r.json(&args).error(4, "exists");
        assert_eq!(fs::read_link(&link).unwrap(), r.path("nowhere"));
        assert!(!r.path("nowhere").exists());
    }
    fs::remove_file(&link).unwrap();

    // A destination whose parent does not exist fails without creating anything.
    let deep = r.path("no/such/parent/out");
    let out = r.json(["export", &snap, deep.to_str().unwrap()]);
    assert_ne!(out.code, 0, "{out:?}");
    assert!(out.json()["error"]["kind"].is_string(), "{out:?}");
    assert!(!r.path("no").exists());
}
