//! `mountctl refs`, `ref set` (compare-and-swap) and `ref delete`.

use cowspace_tests::{TestRoot, write_file};

/// Two snapshots of small trees.
fn two_snapshots(r: &TestRoot) -> (String, String) {
    let src = r.path("src");
    write_file(&src.join("f"), "one");
    let a = r.import(&src, &[])["snapshot"].as_str().unwrap().to_owned();
    write_file(&src.join("f"), "two");
    let b = r.import(&src, &[])["snapshot"].as_str().unwrap().to_owned();
    (a, b)
}

#[test]
fn ref_set_is_compare_and_swap() {
    let r = TestRoot::new();
    let (a, b) = two_snapshots(&r);
    assert!(r.refs().is_empty());

    // Creating: no --expect needed.
    let v = r.json(["ref", "set", "main", &a]).ok().json();
    assert_eq!(v["ref"], "main");
    assert_eq!(v["snapshot"], a.as_str());
    assert_eq!(r.refs()["main"], a);

    // Moving an existing ref without --expect: conflict, unchanged.
    let err = r.json(["ref", "set", "main", &b]).error(6, "conflict");
    assert!(err["message"].as_str().unwrap().contains(&a), "{err}");
    assert!(err["hint"].as_str().unwrap().contains("--expect"), "{err}");
    assert_eq!(r.refs()["main"], a);

    // A stale --expect: conflict, unchanged.
    r.json(["ref", "set", "main", &b, "--expect", &b])
        .error(6, "conflict");
    assert_eq!(r.refs()["main"], a);

    // The right --expect moves it (a prefix of the id is enough to name it).
    let v = r
        .json(["ref", "set", "main", &b, "--expect", &a[..12]])
        .ok()
        .json();
    assert_eq!(v["snapshot"], b.as_str());
    assert_eq!(r.refs()["main"], b);

    // --force moves it whatever it holds; a ref name also resolves as SNAP.
    r.json(["ref", "set", "other", "main"]).ok();
    assert_eq!(r.refs()["other"], b);
    r.json(["ref", "set", "main", &a, "--force"]).ok();
    assert_eq!(r.refs()["main"], a);
    let out = r.run(["refs"]).ok();
    assert!(
        out.stdout
            .lines()
            .any(|l| l.ends_with("  main") && l.starts_with(&a[..12])),
        "{out:?}"
    );

    // --force and --expect together is a usage error.
    r.json(["ref", "set", "main", &b, "--force", "--expect", &a])
        .error(2, "usage");
    assert_eq!(r.refs()["main"], a);
}

#[test]
fn ref_set_to_an_unknown_snapshot_is_not_found() {
    let r = TestRoot::new();
    let (a, _) = two_snapshots(&r);
    r.json(["ref", "set", "main", &a]).ok();
    let missing = "f".repeat(64);
    r.json(["ref", "set", "x", &missing]).error(3, "not_found");
    r.json(["ref", "set", "main", &a, "--expect", "no-such-ref"])
        .error(3, "not_found");
    r.json(["ref", "set", "x", "no-such-ref"])
        .error(3, "not_found");
    assert_eq!(r.refs().len(), 1);
}

#[test]
fn bad_ref_names_are_invalid_input() {
    let r = TestRoot::new();
    let (a, _) = two_snapshots(&r);
    let src = r.path("src");
    for bad in [
        "a//b",
        "../x",
        "a b",
        "/abs",
        "trail/",
        "a/../b",
        "",
        "tab\tname",
    ] {
        let err = r.json(["ref", "set", bad, &a]).error(9, "invalid_input");
        assert!(
            err["message"].as_str().unwrap().contains("ref name"),
            "{bad:?}: {err}"
        );
        let err = r
            .json(["import", src.to_str().unwrap(), "--ref", bad])
            .error(9, "invalid_input");
        assert!(
            err["message"].as_str().unwrap().contains("ref name"),
            "{bad:?}: {err}"
        );
    }
    assert!(r.refs().is_empty());
    assert_eq!(
        r.snapshot_ids().len(),
        2,
        "an import with a bad ref name stored a snapshot"
    );
}

#[test]
fn ref_delete_needs_the_current_snapshot() {
    let r = TestRoot::new();
    let (a, b) = two_snapshots(&r);
    r.json(["ref", "set", "main", &a]).ok();
    r.json(["ref", "delete", "main", "--expect", &b])
        .error(6, "conflict");
    assert_eq!(r.refs()["main"], a);
    r.json(["ref", "delete", "nope", "--expect", &a]).code(3);
    let v = r
        .json(["ref", "delete", "main", "--expect", &a])
        .ok()
        .json();
    assert_eq!(v["deleted"], true, "{v}");
    assert!(r.refs().is_empty());
    // Deleting the ref keeps the snapshot.
    assert!(r.snapshot_ids().contains(&a));
}
