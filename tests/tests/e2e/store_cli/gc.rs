//! `mountctl gc`: what refs and snapshot chains need survives, the rest goes after the
//! grace period; `--dry-run` removes nothing.

use std::path::PathBuf;

use cowspace_tests::{TestRoot, assert_same_tree, noise, run_program, write_file};
use serde_json::json;

/// A copy of `src` as it is now (`cp -a`), to compare exports against later.
fn keep_copy(r: &TestRoot, src: &std::path::Path, name: &str) -> PathBuf {
    let dst = r.path(name);
    run_program(
        std::path::Path::new("cp"),
        ["-a".as_ref(), src.as_os_str(), dst.as_os_str()],
        &[],
    )
    .ok();
    dst
}

#[test]
fn gc_keeps_refs_and_chains_and_removes_unreferenced_snapshots_after_grace() {
    let r = TestRoot::new();
    let src = r.path("src");

    // A: unreferenced, with content of its own.
    write_file(&src.join("shared.txt"), "shared by all\n");
    write_file(&src.join("only-a.bin"), noise(1, 300 * 1024));
    let a = r.import(&src, &[])["snapshot"].as_str().unwrap().to_owned();
    std::fs::remove_file(src.join("only-a.bin")).unwrap();

    // B then C on ref main: B is C's parent.
    write_file(&src.join("b.bin"), noise(2, 300 * 1024));
    let copy_b = keep_copy(&r, &src, "copy-b");
    let b = r.import(&src, &["--ref", "main"])["snapshot"]
        .as_str()
        .unwrap()
        .to_owned();
    std::fs::remove_file(src.join("b.bin")).unwrap();
    write_file(&src.join("c.txt"), "c\n");
    let copy_c = keep_copy(&r, &src, "copy-c");
    let c = r.import(&src, &["--ref", "main"]);
    assert_eq!(c["parents"], json!([b]));
    let c = c["snapshot"].as_str().unwrap().to_owned();

    // Default grace: A is young, nothing goes.
    let v = r.json(["gc"]).ok().json();
    assert_eq!(v["snapshots_removed"], json!([]), "{v}");
    assert_eq!(v["dry_run"], false);
    assert!(r.snapshot_ids().contains(&a));

    // --dry-run says what would go and removes nothing.
    let (snaps, stats, packs) = (r.snapshot_ids(), r.stats(), r.pack_files());
    let v = r.json(["gc", "--dry-run", "--grace", "0"]).ok().json();
    assert_eq!(v["dry_run"], true, "{v}");
    assert_eq!(v["snapshots_removed"], json!([a]), "{v}");
    assert!(v["objects_removed"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(r.snapshot_ids(), snaps);
    assert_eq!(r.stats(), stats);
    assert_eq!(r.pack_files(), packs);
    let out = r.run(["gc", "--dry-run", "--grace", "0"]).ok();
    assert!(out.stdout.contains("would remove"), "{out:?}");
    assert_eq!(r.snapshot_ids(), snaps);

    // --grace 0: A and what only A needed go; B (C's parent) and C stay.
    let v = r.json(["gc", "--grace", "0"]).ok().json();
    assert_eq!(v["snapshots_removed"], json!([a]), "{v}");
    assert!(v["objects_removed"].as_u64().unwrap() >= 1, "{v}");
    assert!(v["bytes_freed"].as_u64().unwrap() >= 300 * 1024 / 2, "{v}");
    let left = r.snapshot_ids();
    assert_eq!(left, [b.clone(), c.clone()].into_iter().collect());
    r.json(["show", &a]).error(3, "not_found");
    assert!(r.stats()["stored_bytes"].as_u64() < stats["stored_bytes"].as_u64());

    let v = r.json(["fsck"]).ok().json();
    assert_eq!(v["report"]["orphan_packs"], json!([]), "{v}");
    for (snap, copy) in [(&b, &copy_b), (&c, &copy_c)] {
        let out = r.path(&format!("out-{}", &snap[..8]));
        r.run(["export", snap, out.to_str().unwrap()]).ok();
        assert_same_tree(copy, &out);
    }

    // Once the ref is gone, the whole chain goes too.
    r.json(["ref", "delete", "main", "--expect", &c]).ok();
    let v = r.json(["gc", "--grace", "0"]).ok().json();
    let mut removed: Vec<String> = v["snapshots_removed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect();
    removed.sort();
    let mut expect = vec![b, c];
    expect.sort();
    assert_eq!(removed, expect, "{v}");
    assert!(r.snapshot_ids().is_empty());
    let s = r.stats();
    assert_eq!(s["chunks"], 0, "{s}");
    assert_eq!(s["trees"], 0, "{s}");
    r.json(["fsck"]).ok();
}

#[test]
fn gc_during_an_import_waits_or_is_busy_and_the_import_survives() {
    let r = TestRoot::new();
    let src = r.path("src");
    for i in 0..400 {
        write_file(
            &src.join(format!("d{}/f{i}", i % 8)),
            noise(i, 4096 + (i as usize * 97) % 8192),
        );
    }
    let copy = keep_copy(&r, &src, "copy");
    let import = std::process::Command::new(cowspace_tests::mountctl_bin())
        .arg("--root")
        .arg(r.root())
        .args(["--json", "import"])
        .arg(&src)
        .args(["--ref", "main"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Whether these overlap the import depends on timing; every outcome is checked.
    let busy = r.json(["gc", "--grace", "0"]);
    match busy.code {
        0 => {}
        5 => {
            busy.error(5, "busy");
        }
        _ => panic!("gc during an import: {busy:?}"),
    }
    r.json(["gc", "--grace", "0", "--wait"]).ok();
    let out = import.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let snap = v["snapshot"].as_str().unwrap();
    r.json(["gc", "--grace", "0"]).ok();
    assert_eq!(r.refs()["main"], snap);
    let v = r.json(["fsck"]).ok().json();
    assert_eq!(v["report"]["orphan_packs"], json!([]), "{v}");
    let exported = r.path("out");
    r.run(["export", "main", exported.to_str().unwrap()]).ok();
    assert_same_tree(&copy, &exported);
}
