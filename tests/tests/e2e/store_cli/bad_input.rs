//! Bad input: unsafe tar entries, bad patterns, missing sources, unknown and malformed
//! ids. Each is a clear error with the documented exit code, and nothing is stored.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use cowspace_tests::{TestRoot, run_program, write_file};
use serde_json::Value;

/// What must not change when an import is refused.
#[derive(Debug, PartialEq)]
struct StoreState {
    snapshots: BTreeSet<String>,
    refs: std::collections::BTreeMap<String, String>,
    objects: Vec<Value>,
    packs: BTreeSet<String>,
}

fn state(r: &TestRoot) -> StoreState {
    let s = r.stats();
    StoreState {
        snapshots: r.snapshot_ids(),
        refs: r.refs(),
        objects: [
            "chunks",
            "manifests",
            "trees",
            "snapshots",
            "packs",
            "stored_bytes",
        ]
        .iter()
        .map(|k| s[k].clone())
        .collect(),
        packs: r.pack_files(),
    }
}

/// A root that already holds one snapshot (so "unchanged" is not trivially empty).
fn root_with_a_snapshot() -> (TestRoot, String) {
    let r = TestRoot::new();
    let src = r.path("seed");
    write_file(&src.join("seed.txt"), "seed\n");
    let id = r.import(&src, &["--ref", "main"])["snapshot"]
        .as_str()
        .unwrap()
        .to_owned();
    (r, id)
}

/// Writes a tar with Python's `tarfile` (GNU tar refuses to make some of these): first a
/// large incompressible file and a small one, so a careless importer has stored data by
/// the time it meets `bad`: Python expressions building the last entries.
fn evil_tar(path: &Path, bad: &[&str]) {
    let last: String = bad
        .iter()
        .map(|b| format!("    t.addfile(*({b}))\n"))
        .collect();
    let script = format!(
        r#"
import io, os, sys, tarfile
def reg(name, data):
    i = tarfile.TarInfo(name); i.size = len(data); i.mode = 0o644; return i, io.BytesIO(data)
def special(name, kind, link=""):
    i = tarfile.TarInfo(name); i.type = kind; i.linkname = link; i.mode = 0o644
    i.devmajor, i.devminor = 1, 3
    return i, None
with tarfile.open(sys.argv[1], "w", format=tarfile.PAX_FORMAT) as t:
    t.addfile(*reg("first/big.bin", os.urandom(600 * 1024)))
    t.addfile(*reg("first/small.txt", b"small\n"))
{last}"#
    );
    run_program(
        Path::new("python3"),
        ["-c".as_ref(), script.as_str().as_ref(), path.as_os_str()],
        &[],
    )
    .ok();
}

#[test]
fn unsafe_tar_entries_are_refused_before_anything_is_stored() {
    let (r, _) = root_with_a_snapshot();
    let cases: &[(&str, &str, &str)] = &[
        ("dotdot", r#"reg("../evil", b"x")"#, "../evil"),
        (
            "nested-dotdot",
            r#"reg("a/../../evil", b"x")"#,
            "a/../../evil",
        ),
        ("absolute", r#"reg("/etc/evil", b"x")"#, "/etc/evil"),
        (
            "symlink-up",
            r#"special("up", tarfile.SYMTYPE, "../../outside")"#,
            "up",
        ),
        (
            "symlink-abs",
            r#"special("abs", tarfile.SYMTYPE, "/etc/passwd")"#,
            "abs",
        ),
        (
            "symlink-deep",
            r#"special("d/e/up", tarfile.SYMTYPE, "../../../x")"#,
            "d/e/up",
        ),
        (
            "hardlink-missing",
            r#"special("hl", tarfile.LNKTYPE, "missing")"#,
            "hl",
        ),
        (
            "hardlink-out",
            r#"special("hl2", tarfile.LNKTYPE, "../first/small.txt")"#,
            "hl2",
        ),
        ("chardev", r#"special("null", tarfile.CHRTYPE)"#, "null"),
        ("blockdev", r#"special("sda", tarfile.BLKTYPE)"#, "sda"),
    ];
    for (name, bad, entry) in cases {
        let tar = r.path(&format!("{name}.tar"));
        evil_tar(&tar, &[bad]);
        let before = state(&r);
        let err = r
            .json(["import", tar.to_str().unwrap(), "--ref", "main"])
            .error(9, "invalid_input");
        let msg = err["message"].as_str().unwrap();
        assert!(
            msg.contains(&format!("{entry:?}")) || msg.contains(entry),
            "{name}: {err}"
        );
        assert_eq!(state(&r), before, "{name}: something was stored");
        // Text mode: same code, the entry named on stderr.
        let out = r.run(["import", tar.to_str().unwrap()]).code(9);
        assert!(out.stderr.contains(entry), "{name}: {out:?}");
        assert_eq!(state(&r), before, "{name}: something was stored");
    }
    r.json(["fsck"]).ok();
}

#[test]
fn devices_and_outside_symlinks_import_only_when_allowed() {
    let r = TestRoot::new();
    let dev = r.path("dev.tar");
    evil_tar(&dev, &[r#"special("null", tarfile.CHRTYPE)"#]);
    r.json(["import", dev.to_str().unwrap()])
        .error(9, "invalid_input");
    let v = r.import(&dev, &["--allow-devices"]);
    let e = r
        .json(["show", v["snapshot"].as_str().unwrap(), "null"])
        .ok()
        .json();
    assert_eq!(e["entry"]["kind"], "char_device", "{e}");

    let sym = r.path("sym.tar");
    evil_tar(&sym, &[r#"special("abs", tarfile.SYMTYPE, "/etc/passwd")"#]);
    let v = r.import(&sym, &["--allow-external-symlinks"]);
    let e = r
        .json(["show", v["snapshot"].as_str().unwrap(), "abs"])
        .ok()
        .json();
    assert_eq!(e["entry"]["kind"], "symlink", "{e}");
    r.json(["fsck"]).ok();
}

#[test]
fn a_path_below_a_symlink_in_a_tar_is_refused() {
    // Even with outside symlinks allowed, an entry may not go through one.
    let r = TestRoot::new();
    let tar = r.path("through.tar");
    evil_tar(
        &tar,
        &[
            r#"special("esc", tarfile.SYMTYPE, "/tmp")"#,
            r#"reg("esc/pwned", b"x")"#,
        ],
    );
    let before = r.snapshot_ids();
    let out = r.json(["import", tar.to_str().unwrap(), "--allow-external-symlinks"]);
    let err = out.error(9, "invalid_input");
    assert!(err["message"].as_str().unwrap().contains("esc"), "{err}");
    assert_eq!(r.snapshot_ids(), before);
    assert!(
        r.pack_files().is_empty(),
        "packs written: {:?}",
        r.pack_files()
    );
}

#[test]
fn a_bad_exclude_pattern_is_invalid_input() {
    let (r, _) = root_with_a_snapshot();
    let src = r.path("src");
    write_file(&src.join("f"), "x");
    let before = state(&r);
    let err = r
        .json(["import", src.to_str().unwrap(), "--exclude", "a["])
        .error(9, "invalid_input");
    assert!(err["message"].as_str().unwrap().contains("a["), "{err}");
    assert_eq!(state(&r), before);
}

#[test]
fn a_missing_source_is_not_found() {
    let (r, _) = root_with_a_snapshot();
    let before = state(&r);
    for missing in [r.path("nope"), r.path("nope.tar"), r.path("nope.tar.gz")] {
        let err = r
            .json(["import", missing.to_str().unwrap()])
            .error(3, "not_found");
        assert!(err["message"].as_str().unwrap().contains("nope"), "{err}");
    }
    let err = r
        .json(["import", r.path("nope").to_str().unwrap(), "--git", "HEAD"])
        .error(3, "not_found");
    assert!(err["message"].as_str().unwrap().contains("nope"), "{err}");
    assert_eq!(state(&r), before);
}

#[test]
fn a_file_that_is_not_an_archive_or_is_truncated_is_refused() {
    let (r, _) = root_with_a_snapshot();
    let junk = r.path("junk.tar.gz");
    write_file(&junk, "this is not gzip data at all");
    let plain = r.path("notes.txt");
    write_file(&plain, "a plain file is taken for a tar, and is not one\n");
    // A real archive cut off in the middle of its large first entry.
    let whole = r.path("whole.tar");
    evil_tar(&whole, &[r#"reg("last.txt", b"last")"#]);
    let bytes = std::fs::read(&whole).unwrap();
    let cut = r.path("cut.tar");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();

    let before = state(&r);
    for bad in [&junk, &plain, &cut] {
        let err = r
            .json(["import", bad.to_str().unwrap()])
            .error(9, "invalid_input");
        let name = bad.file_name().unwrap().to_str().unwrap();
        assert!(err["message"].as_str().unwrap().contains(name), "{err}");
        assert_eq!(state(&r), before, "{name}: something was stored");
    }
    // The whole archive imports.
    let v = r.import(&whole, &[]);
    assert_eq!(v["files"], 3, "{v}");
}

#[test]
fn unknown_refs_and_snapshots_are_not_found() {
    let (r, id) = root_with_a_snapshot();
    let dest: PathBuf = r.path("dest");
    let d = dest.to_str().unwrap();
    let unknown_full = "0123456789abcdef".repeat(4);
    for spec in [
        "no-such-ref",
        "team/none",
        unknown_full.as_str(),
        "abcdef",
        "abc",
    ] {
        let err = r.json(["show", spec]).error(3, "not_found");
        assert!(err["message"].as_str().unwrap().contains(spec), "{err}");
        assert!(
            err["hint"]
                .as_str()
                .unwrap_or("")
                .contains("mountctl snapshots"),
            "{err}"
        );
        r.json(["export", spec, d]).error(3, "not_found");
        r.json(["export", spec, d, "--tar"]).error(3, "not_found");
        r.json(["diff", spec, "main"]).error(3, "not_found");
        r.json(["diff", "main", spec]).error(3, "not_found");
        r.json(["ref", "set", "x", spec]).error(3, "not_found");
    }
    assert!(!dest.exists());
    // A path that is not in the snapshot.
    r.json(["show", &id, "no/such/path"]).error(3, "not_found");
    r.json(["show", "main", "seed.txt/below-a-file"])
        .error(3, "not_found");
    // A full id, a prefix and the ref name all name the same snapshot.
    for spec in [id.as_str(), &id[..12], &id[..6], &id.to_uppercase(), "main"] {
        let v = r.json(["show", spec]).ok().json();
        assert_eq!(v["snapshot"], id.as_str(), "{spec}");
    }
    assert!(r.refs().len() == 1);
}

/// A prefix of a real snapshot shorter than 6 hex digits is not found, and the hint says
/// why (it used to read as a missing snapshot with no reason).
#[test]
fn a_prefix_too_short_says_how_long_one_must_be() {
    let (r, id) = root_with_a_snapshot();
    for n in [1, 4, 5] {
        let err = r.json(["show", &id[..n]]).error(3, "not_found");
        assert!(
            err["hint"]
                .as_str()
                .unwrap()
                .contains("at least 6 hex digits"),
            "{n} digits: {err}"
        );
    }
    // A name that is no hex prefix keeps the listing hint.
    let err = r.json(["show", "nosuchref"]).error(3, "not_found");
    assert!(
        !err["hint"].as_str().unwrap().contains("hex digits"),
        "{err}"
    );
}

/// `-q` keeps results (ids, paths) and silences confirmations ("exported …", "… -> …").
#[test]
fn quiet_silences_confirmations_not_results() {
    let (r, id) = root_with_a_snapshot();
    let dest = r.path("quiet-export");
    let out = r.run(["-q", "export", &id, dest.to_str().unwrap()]).ok();
    assert_eq!(
        (out.stdout.as_str(), out.stderr.as_str()),
        ("", ""),
        "-q export"
    );
    assert!(dest.is_dir());
    let out = r.run(["-q", "ref", "set", "quiet", &id]).ok();
    assert_eq!(out.stdout, "", "-q ref set");
    let out = r.run(["-q", "init"]).ok();
    assert_eq!(out.stdout, "", "-q init");
    // Results still print, and --json always does.
    assert!(r.run(["-q", "show", &id]).ok().stdout.contains(&id[..12]));
    let dest = r.path("quiet-json");
    let v = r
        .json(["-q", "export", &id, dest.to_str().unwrap()])
        .ok()
        .json();
    assert_eq!(v["snapshot"], id.as_str());
}

#[test]
fn malformed_ids_are_invalid_input() {
    let (r, _) = root_with_a_snapshot();
    // Neither a hex id nor a possible ref name.
    for spec in ["not a ref", "../main", "a//b", "snap!"] {
        let err = r.json(["show", spec]).error(9, "invalid_input");
        assert!(
            err["message"].as_str().unwrap().contains(spec),
            "{spec}: {err}"
        );
        r.json(["diff", spec, "main"]).error(9, "invalid_input");
    }
}

#[test]
fn usage_errors_exit_2_with_a_json_error() {
    let r = TestRoot::new();
    for args in [
        vec!["import"],
        vec!["snapshots", "--no-such-flag"],
        vec!["frobnicate"],
    ] {
        let err = r.json(&args).error(2, "usage");
        assert!(
            err["hint"].as_str().unwrap().contains("help"),
            "{args:?}: {err}"
        );
    }
    r.json(["gc", "--grace", "soon"]).error(2, "usage");
}

#[test]
fn error_texts_say_each_cause_once_in_words_a_terminal_shows() {
    // A --root that is a regular file: `init` says it is not a directory (as `list`
    // does), and no advice to `init`.
    let f = TestRoot::uninitialised();
    write_file(f.root(), "not a directory\n");
    let err = f.json(["init"]).error(9, "invalid_input");
    let m = err["message"].as_str().unwrap();
    assert!(
        m.contains("is not a directory") && !m.contains("os error"),
        "{err}"
    );
    let err = f.json(["snapshots"]).error(3, "not_found");
    let hint = err["hint"].as_str().unwrap_or("");
    assert!(
        hint.contains("not a directory") && !hint.contains("init"),
        "{err}"
    );

    let (r, id) = root_with_a_snapshot();
    // A "tar" of binary bytes: the reader's message quotes them, the terminal must not.
    let junk = r.path("binary.tar");
    let bytes: Vec<u8> = (0..2048u32).map(|i| (i * 37 % 256) as u8 | 0x80).collect();
    std::fs::write(&junk, &bytes).unwrap();
    let out = r.run(["import", junk.to_str().unwrap()]).code(9);
    assert!(
        !out.stderr
            .chars()
            .any(|c| (c.is_control() && c != '\n') || c == '\u{fffd}'),
        "raw bytes echoed: {:?}",
        out.stderr
    );
    assert!(out.stderr.contains("binary.tar"), "{out:?}");

    // --expect of a ref that does not exist: no advice to pass `--expect nothing`.
    let err = r
        .json(["ref", "set", "team/new", &id, "--expect", &id])
        .error(6, "conflict");
    let hint = err["hint"].as_str().unwrap_or("");
    assert!(!hint.contains("--expect nothing"), "{err}");
    assert!(hint.contains("leave out --expect"), "{err}");
    r.json(["ref", "set", "team/new", &id]).ok();

    // Port 0 and a port above 65535 are refused alike, with the range that is allowed.
    for port in ["0", "70000"] {
        let out = r
            .run(["run", "ws", "--publish", port, "--", "true"])
            .code(2);
        assert!(
            out.stderr.contains("1..=65535"),
            "--publish {port}: {out:?}"
        );
    }
}

#[test]
fn init_refuses_a_directory_holding_other_things_and_import_a_file_without_a_tar_name() {
    // A source checkout as --root: refused before anything is written there.
    let f = TestRoot::uninitialised();
    write_file(&f.root().join("Cargo.toml"), "[package]\n");
    write_file(&f.root().join("src/main.rs"), "fn main() {}\n");
    let err = f.json(["init"]).error(9, "invalid_input");
    let m = err["message"].as_str().unwrap();
    assert!(
        m.contains("not empty") && m.contains("Cargo.toml") && m.contains("new or empty"),
        "{err}"
    );
    let mut names = cowspace_tests::dir_entries(f.root());
    names.sort();
    assert_eq!(names, ["Cargo.toml", "src"], "nothing written");
    // An empty directory, and an initialised root again, are fine.
    let e = TestRoot::uninitialised();
    std::fs::create_dir(e.root()).unwrap();
    assert_eq!(e.json(["init"]).ok().json()["created"], true);
    assert_eq!(e.json(["init"]).ok().json()["created"], false);

    // A regular file without a tar name is not parsed as a tar.
    let (r, _) = root_with_a_snapshot();
    let readme = r.path("README.rst");
    std::fs::write(&readme, "Title\n=====\n\nSome text, not a tar archive.\n").unwrap();
    let err = r
        .json(["import", readme.to_str().unwrap()])
        .error(9, "invalid_input");
    let m = err["message"].as_str().unwrap();
    assert!(
        m.contains("README.rst")
            && m.contains("a tar archive needs a .tar, .tar.gz or .tar.zst name"),
        "{err}"
    );
}

/// An empty name is said to be empty, a very long one is cut in the message (with its
/// length), and `push` with no remote names the fix.
#[test]
fn names_in_messages_are_visible_and_bounded_and_push_without_a_remote_says_the_fix() {
    let (r, _) = root_with_a_snapshot();
    let err = r.json(["status", ""]).error(3, "not_found");
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("\"\" (an empty name)"),
        "{err}"
    );
    let err = r.json(["show", ""]).error(9, "invalid_input");
    assert!(
        err["message"].as_str().unwrap().contains("(an empty name)"),
        "{err}"
    );
    let long = "x".repeat(5000);
    for args in [
        vec!["show", long.as_str()],
        vec!["status", long.as_str()],
        vec!["ref", "set", long.as_str(), "main"],
        vec!["diff", long.as_str(), "main"],
    ] {
        let out = r.json(&args);
        let err = &out.json()["error"];
        let m = err["message"].as_str().unwrap();
        assert!(m.contains("(5000 characters)"), "{args:?}: {m}");
        assert!(m.len() < 400, "{:?}: {} bytes: {m}", &args[..1], m.len());
        assert!(out.stderr.len() < 800, "{:?}: {}", &args[..1], out.stderr);
    }
    let err = r.json(["push", "main"]).error(3, "not_found");
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("no remote is configured"),
        "{err}"
    );
    assert!(
        err["hint"]
            .as_str()
            .unwrap()
            .contains("mountctl remote add"),
        "{err}"
    );
}
