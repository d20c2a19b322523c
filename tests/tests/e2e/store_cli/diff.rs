//! `mountctl diff A B [--patch]`.

use std::collections::BTreeMap;
use std::fs;

use cowspace_tests::{TestRoot, write_file};
use serde_json::Value;

/// path → change kind of `diff --json`.
fn changes(v: &Value) -> BTreeMap<String, String> {
    v["changes"]
        .as_array()
        .unwrap_or_else(|| panic!("no changes in {v}"))
        .iter()
        .map(|c| {
            (
                c["path"].as_str().unwrap().to_owned(),
                c["change"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn diff_lists_added_modified_deleted_and_type_changed_paths() {
    let r = TestRoot::new();
    let src = r.path("src");
    write_file(&src.join("text.txt"), "line one\nline two\nline three\n");
    write_file(
        &src.join("data.bin"),
        b"\x00\x01\x02binary\x00\xff".repeat(10),
    );
    write_file(&src.join("gone.txt"), "deleted later\n");
    write_file(&src.join("same/untouched.txt"), "same\n");
    write_file(&src.join("becomes-dir"), "a file first\n");
    std::os::unix::fs::symlink("text.txt", src.join("link")).unwrap();
    let a = r.import(&src, &["--ref", "a"])["snapshot"]
        .as_str()
        .unwrap()
        .to_owned();

    write_file(&src.join("text.txt"), "line one\nline 2\nline three\n");
    write_file(
        &src.join("data.bin"),
        b"\x00\x01\x02BINARY\x00\xfe".repeat(10),
    );
    fs::remove_file(src.join("gone.txt")).unwrap();
    fs::remove_file(src.join("becomes-dir")).unwrap();
    write_file(&src.join("becomes-dir/inner.txt"), "now a dir\n");
    write_file(&src.join("new/added.txt"), "brand new\n");
    fs::remove_file(src.join("link")).unwrap();
    std::os::unix::fs::symlink("data.bin", src.join("link")).unwrap();
    let b = r.import(&src, &["--ref", "b"])["snapshot"]
        .as_str()
        .unwrap()
        .to_owned();

    let v = r.json(["diff", "a", "b"]).ok().json();
    assert_eq!(v["from"], a.as_str());
    assert_eq!(v["to"], b.as_str());
    assert!(v["patch"].is_null(), "{v}");
    let c = changes(&v);
    let expect = |p: &str, k: &str| {
        assert_eq!(c.get(p).map(String::as_str), Some(k), "{p}: {v}");
    };
    expect("text.txt", "modified");
    expect("data.bin", "modified");
    expect("gone.txt", "deleted");
    expect("becomes-dir", "type_changed");
    expect("new", "added");
    expect("new/added.txt", "added");
    expect("link", "modified");
    assert!(
        !c.keys().any(|p| p.starts_with("same")),
        "unchanged subtree listed: {v}"
    );

    // Text form: one letter and the path a line.
    let out = r.run(["diff", &a, &b]).ok();
    assert!(
        out.stdout.lines().any(|l| l == "D gone.txt"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.lines().any(|l| l == "A new/added.txt"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.lines().any(|l| l == "T becomes-dir"),
        "{}",
        out.stdout
    );

    // --patch: a unified diff of the text change, "Binary files" for the binary one.
    let out = r.run(["diff", "a", "b", "--patch"]).ok();
    let p = &out.stdout;
    assert!(p.contains("--- a/text.txt\n+++ b/text.txt\n"), "{p}");
    assert!(p.contains("@@"), "{p}");
    assert!(
        p.contains("\n-line two\n") && p.contains("\n+line 2\n"),
        "{p}"
    );
    assert!(p.contains(" line one\n"), "context line missing: {p}");
    assert!(
        p.contains("Binary files a/data.bin and b/data.bin differ"),
        "{p}"
    );
    assert!(p.contains("+brand new\n"), "{p}");
    assert!(p.contains("-deleted later\n"), "{p}");
    let v = r.json(["diff", "a", "b", "--patch"]).ok().json();
    assert_eq!(v["patch"].as_str().unwrap().trim_end(), p.trim_end(), "{v}");

    // A snapshot against itself: nothing.
    let v = r.json(["diff", &a, "a"]).ok().json();
    assert_eq!(v["changes"], serde_json::json!([]), "{v}");
    let out = r.run(["diff", "b", "b", "--patch"]).ok();
    assert!(out.stdout.trim().is_empty(), "{out:?}");
}

#[test]
fn diff_json_names_a_non_utf8_path_by_its_bytes() {
    use std::os::unix::ffi::OsStrExt;
    let r = TestRoot::new();
    let src = r.path("src");
    write_file(&src.join("plain"), "x\n");
    r.import(&src, &["--ref", "a"]);
    let raw = src.join(std::ffi::OsStr::from_bytes(b"raw\xff"));
    write_file(&raw, "new\n");
    fs::set_permissions(&src, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    r.import(&src, &["--ref", "b"]);
    let v = r.json(["diff", "a", "b"]).ok().json();
    let all = v["changes"].as_array().unwrap();
    let c = all
        .iter()
        .find(|c| c["path"] == "raw\u{fffd}")
        .unwrap_or_else(|| panic!("{v}"));
    assert_eq!(c["path_hex"], "726177ff", "{v}");
    assert!(
        all.iter()
            .filter(|c| c["path"] != "raw\u{fffd}")
            .all(|c| c.get("path_hex").is_none()),
        "path_hex only for names that are not UTF-8: {v}"
    );
    // The root's own mode, as `.`.
    let root = all
        .iter()
        .find(|c| c["path"] == ".")
        .unwrap_or_else(|| panic!("{v}"));
    assert_eq!(root["change"], "modified", "{v}");
}

/// Names that need quoting (not UTF-8, non-ASCII, a tab, a quote, a newline) are listed
/// and put in a patch as git quotes them, and git applies the patch to the same result.
#[test]
fn diff_quotes_names_as_git_does_and_git_applies_the_patch() {
    use std::os::unix::ffi::OsStrExt;
    let r = TestRoot::new();
    let src = r.path("src");
    write_file(&src.join("plain"), "x\n");
    r.import(&src, &["--ref", "a"]);
    let names: [(&[u8], &str); 5] = [
        (b"caf\xc3\xa9", r#""caf\303\251""#),
        (b"tab\there", r#""tab\there""#),
        (b"quo\"te", r#""quo\"te""#),
        (b"raw\xff", r#""raw\377""#),
        (b"new\nline", r#""new\nline""#),
    ];
    for (i, (n, _)) in names.iter().enumerate() {
        write_file(&src.join(std::ffi::OsStr::from_bytes(n)), format!("{i}\n"));
    }
    r.import(&src, &["--ref", "b"]);
    let listing = r.run(["diff", "a", "b"]).ok().stdout;
    for (_, quoted) in &names {
        assert!(
            listing.lines().any(|l| l == format!("A {quoted}")),
            "{quoted} not listed: {listing}"
        );
    }
    let patch = r.run(["diff", "a", "b", "--patch"]).ok().stdout;
    assert!(
        patch.contains(r#"diff --git "a/raw\377" "b/raw\377""#),
        "{patch}"
    );
    // git reads the patch back: applied to a's tree, it gives b's.
    let work = r.path("work");
    write_file(&work.join("plain"), "x\n");
    let git = |args: &[&str], input: Option<&str>| {
        let mut c = std::process::Command::new("git");
        c.current_dir(&work)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = c.spawn().expect("git");
        if let Some(s) = input {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
        }
        drop(child.stdin.take());
        let o = child.wait_with_output().unwrap();
        assert!(
            o.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    git(&["init", "-q"], None);
    git(&["apply", "-"], Some(&patch));
    for (i, (n, _)) in names.iter().enumerate() {
        let p = work.join(std::ffi::OsStr::from_bytes(n));
        assert_eq!(fs::read_to_string(&p).unwrap(), format!("{i}\n"), "{p:?}");
    }
}
