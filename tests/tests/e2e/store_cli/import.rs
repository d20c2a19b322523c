//! `mountctl init` and `mountctl import` of directories and git revisions: the report,
//! refs and parents, the exclusion policy, the stat cache.

use std::time::Duration;

use cowspace_tests::{TestRoot, assert_same_tree, run_program, write_file};
use serde_json::{Value, json};

fn show(r: &TestRoot, spec: &str) -> Value {
    r.json(["show", spec]).ok().json()
}

/// The names at the top of a snapshot (`show --json` entries).
fn top_names(r: &TestRoot, spec: &str, path: &str) -> Vec<String> {
    let v = r.json(["show", spec, path]).ok().json();
    v["entries"]
        .as_array()
        .unwrap_or_else(|| panic!("no entries in {v}"))
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn init_twice_is_a_no_op_that_says_so_and_keeps_the_root() {
    let r = TestRoot::new();
    let src = r.path("src");
    write_file(&src.join("f"), "content\n");
    let snap = r.import(&src, &["--ref", "main"])["snapshot"].clone();

    let v = r.json(["init"]).ok().json();
    assert_eq!(v["created"], false, "{v}");
    assert_eq!(v["root"], r.root().display().to_string(), "{v}");
    // Text mode: exit 0 and says there was nothing to do.
    let out = r.run(["init"]).ok();
    assert!(out.stdout.contains("already"), "{out:?}");
    // What was stored is still there.
    assert_eq!(r.refs()["main"], snap.as_str().unwrap());
    r.json(["fsck"]).ok();
}

#[test]
fn commands_on_a_missing_root_say_to_run_init() {
    let r = TestRoot::uninitialised();
    let src = r.path("src");
    write_file(&src.join("f"), "x");
    let src = src.to_str().unwrap();
    let zeros = "0".repeat(64);
    let dest = r.path("dest");
    let dest = dest.to_str().unwrap();
    let commands: Vec<Vec<&str>> = vec![
        vec!["snapshots"],
        vec!["refs"],
        vec!["import", src],
        vec!["show", "main"],
        vec!["export", "main", dest],
        vec!["diff", "main", "main"],
        vec!["ref", "set", "main", &zeros],
        vec!["fsck"],
        vec!["gc"],
        vec!["stats"],
    ];
    for args in commands {
        let err = r.json(&args).error(3, "not_found");
        let hint = err["hint"]
            .as_str()
            .unwrap_or_else(|| panic!("{args:?}: no hint: {err}"));
        assert!(
            hint.contains("mountctl") && hint.contains("init"),
            "{args:?}: {err}"
        );
        let out = r.run(&args).code(3);
        assert!(out.stderr.contains("init"), "{args:?}: {out:?}");
    }
    assert!(!r.root().exists(), "a command created the root");
    assert!(!r.path("dest").exists());
}

#[test]
fn import_of_a_directory_reports_and_stores_it() {
    let r = TestRoot::new();
    let src = r.path("src");
    write_file(&src.join("a.txt"), "hello\n"); // 6 bytes
    write_file(&src.join("sub/b.txt"), "world!!\n"); // 8 bytes
    write_file(&src.join("sub/deeper/c.bin"), vec![0u8; 1000]);
    std::os::unix::fs::symlink("a.txt", src.join("link")).unwrap();

    let v = r.import(&src, &["--message", "first import"]);
    let snap = v["snapshot"].as_str().unwrap().to_owned();
    assert!(
        snap.bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    );
    assert_eq!(v["files"], 3, "{v}");
    assert_eq!(v["bytes"], 6 + 8 + 1000, "{v}");
    assert_eq!(v["symlinks"], 1, "{v}");
    assert_eq!(v["dirs"], 2, "{v}");
    assert_eq!(v["files_read"], 3, "{v}");
    assert!(v["new_bytes_stored"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(v["parents"], json!([]), "{v}");
    assert_eq!(v["root"].as_str().map(str::len), Some(64), "{v}");

    // The text form prints the id alone on stdout.
    let out = r.run(["import", src.to_str().unwrap()]).ok();
    assert_eq!(out.stdout.trim().len(), 64, "{out:?}");

    let list = r.snapshots();
    let entry = list
        .iter()
        .find(|s| s["snapshot"] == snap.as_str())
        .expect("listed");
    assert_eq!(entry["files"], 3);
    assert_eq!(entry["message"], "first import");
    assert_eq!(entry["source"]["kind"], "dir");
    let meta = &show(&r, &snap)["meta"];
    assert_eq!(meta["root"], v["root"]);
    assert_eq!(meta["counts"]["files"], 3);
    assert_eq!(meta["message"], "first import");

    let leaf = r.json(["show", &snap, "sub/b.txt"]).ok().json();
    assert_eq!(leaf["entry"]["kind"], "file", "{leaf}");
    assert_eq!(leaf["entry"]["size"], 8, "{leaf}");

    let out = r.path("out");
    r.run(["export", &snap, out.to_str().unwrap()]).ok();
    assert_same_tree(&src, &out);
}

#[test]
fn import_with_ref_moves_it_and_records_the_parent() {
    let r = TestRoot::new();
    let src = r.path("src");
    write_file(&src.join("f"), "one\n");
    let first = r.import(&src, &["--ref", "team/main"]);
    assert_eq!(first["ref"], "team/main", "{first}");
    assert_eq!(first["parents"], json!([]));
    let first = first["snapshot"].as_str().unwrap().to_owned();
    assert_eq!(r.refs()["team/main"], first);

    write_file(&src.join("f"), "two\n");
    let second = r.import(&src, &["--ref", "team/main"]);
    let second_id = second["snapshot"].as_str().unwrap().to_owned();
    assert_ne!(second_id, first);
    assert_eq!(second["parents"], json!([first]), "{second}");
    assert_eq!(r.refs()["team/main"], second_id);
    assert_eq!(show(&r, "team/main")["meta"]["parents"], json!([first]));
    assert_eq!(show(&r, "team/main")["snapshot"], second_id.as_str());
    let listed = r.snapshots();
    let s = listed
        .iter()
        .find(|s| s["snapshot"] == second_id.as_str())
        .unwrap();
    assert_eq!(s["refs"], json!(["team/main"]));

    // An import without --ref touches no ref.
    write_file(&src.join("f"), "three\n");
    let third = r.import(&src, &[]);
    assert_eq!(third["parents"], json!([]), "{third}");
    assert_eq!(r.refs()["team/main"], second_id);
}

/// A git work tree with a tracked `build/` and untracked `node_modules/`, `target/`.
fn git_work_tree(r: &TestRoot) -> std::path::PathBuf {
    let repo = r.path("repo");
    write_file(&repo.join("src/main.rs"), "fn main() {}\n");
    write_file(&repo.join("Cargo.toml"), "[package]\nname = \"x\"\n");
    write_file(&repo.join("Cargo.lock"), "# lock\n");
    write_file(&repo.join("build/generated.rs"), "// tracked\n");
    write_file(
        &repo.join("node_modules/dep/index.js"),
        "module.exports = 1;\n",
    );
    write_file(&repo.join("target/debug/app"), "binary");
    write_file(&repo.join("pkg/dist/bundle.js"), "bundle");
    r.git(&repo, ["init", "-q"]);
    r.git(
        &repo,
        ["add", "-f", "src", "Cargo.toml", "Cargo.lock", "build"],
    );
    r.git(&repo, ["commit", "-q", "-m", "init"]);
    repo
}

#[test]
fn default_excludes_drop_artifacts_unless_git_tracks_them() {
    let r = TestRoot::new();
    let repo = git_work_tree(&r);

    let v = r.import(&repo, &[]);
    let snap = v["snapshot"].as_str().unwrap();
    assert!(v["excluded"].as_u64().unwrap() >= 3, "{v}");
    let names = top_names(&r, snap, "");
    for kept in ["src", "Cargo.toml", "Cargo.lock", "build"] {
        assert!(
            names.contains(&kept.to_owned()),
            "{kept} missing: {names:?}"
        );
    }
    for gone in ["node_modules", "target"] {
        assert!(!names.contains(&gone.to_owned()), "{gone} kept: {names:?}");
    }
    assert_eq!(
        top_names(&r, snap, "pkg"),
        Vec::<String>::new(),
        "pkg/dist kept"
    );
    assert_eq!(top_names(&r, snap, "build"), vec!["generated.rs"]);
    let policy = &show(&r, snap)["meta"]["policy"];
    assert_eq!(policy["default_excludes"], true, "{policy}");
    assert_eq!(policy["excludes"], json!([]), "{policy}");

    // --no-default-excludes keeps everything, and says so in the snapshot.
    let v = r.import(&repo, &["--no-default-excludes"]);
    let snap = v["snapshot"].as_str().unwrap();
    assert_eq!(v["excluded"], 0, "{v}");
    let names = top_names(&r, snap, "");
    for kept in ["node_modules", "target", "build", "src"] {
        assert!(
            names.contains(&kept.to_owned()),
            "{kept} missing: {names:?}"
        );
    }
    assert_eq!(top_names(&r, snap, "pkg/dist"), vec!["bundle.js"]);
    assert_eq!(show(&r, snap)["meta"]["policy"]["default_excludes"], false);
}

#[test]
fn import_of_a_git_revision_takes_the_committed_tree() {
    let r = TestRoot::new();
    let repo = git_work_tree(&r);
    let head = r.git(&repo, ["rev-parse", "HEAD"]).stdout.trim().to_owned();
    // Uncommitted changes are not part of the revision.
    write_file(&repo.join("src/main.rs"), "fn main() { changed() }\n");
    write_file(&repo.join("untracked.txt"), "not committed\n");

    let v = r.import(&repo, &["--git", "HEAD", "--ref", "git/main"]);
    let snap = v["snapshot"].as_str().unwrap();
    assert_eq!(v["files"], 4, "{v}");
    let meta = &show(&r, snap)["meta"];
    assert_eq!(meta["source"]["kind"], "git", "{meta}");
    assert_eq!(meta["source"]["commit"], head.as_str(), "{meta}");
    let mut names = top_names(&r, snap, "");
    names.sort();
    assert_eq!(names, ["Cargo.lock", "Cargo.toml", "build", "src"]);
    let out = r.path("out");
    r.run(["export", snap, out.to_str().unwrap()]).ok();
    assert_eq!(
        std::fs::read_to_string(out.join("src/main.rs")).unwrap(),
        "fn main() {}\n"
    );
    // The work tree was not touched.
    assert_eq!(
        std::fs::read_to_string(repo.join("src/main.rs")).unwrap(),
        "fn main() { changed() }\n"
    );
    // An unknown revision is invalid input, nothing stored.
    let before = r.snapshot_ids();
    let out = r.json(["import", repo.to_str().unwrap(), "--git", "no-such-branch"]);
    assert!(matches!(out.code, 3 | 9), "{out:?}");
    assert!(
        out.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no-such-branch")
    );
    assert_eq!(r.snapshot_ids(), before);
}

#[test]
fn user_excludes_drop_matches_but_lockfiles_and_manifests_stay() {
    let r = TestRoot::new();
    let src = r.path("src");
    for f in [
        "Cargo.lock",
        "Cargo.toml",
        "package-lock.json",
        "package.json",
        "data.json",
        "other.lock",
        "app.log",
        "logs/deep.log",
        "keep.txt",
    ] {
        write_file(&src.join(f), f);
    }
    let v = r.import(
        &src,
        &[
            "--exclude",
            "*.log",
            "--exclude",
            "*.lock",
            "--exclude",
            "*.json",
        ],
    );
    let snap = v["snapshot"].as_str().unwrap();
    let mut names = top_names(&r, snap, "");
    names.sort();
    assert_eq!(
        names,
        [
            "Cargo.lock",
            "Cargo.toml",
            "keep.txt",
            "logs",
            "package-lock.json",
            "package.json"
        ]
    );
    assert_eq!(top_names(&r, snap, "logs"), Vec::<String>::new());
    let policy = &show(&r, snap)["meta"]["policy"];
    assert_eq!(
        policy["excludes"],
        json!(["*.log", "*.lock", "*.json"]),
        "{policy}"
    );
    assert_eq!(policy["default_excludes"], true, "{policy}");
}

#[test]
fn reimport_of_an_unchanged_tree_reads_no_file() {
    let r = TestRoot::new();
    let src = r.path("src");
    for i in 0..40 {
        write_file(
            &src.join(format!("d{}/f{i}.txt", i % 4)),
            format!("file {i}\n"),
        );
    }
    // The stat cache trusts only files whose mtime and ctime are over a second older than
    // the import (ctime cannot be set back), so let the tree age.
    std::thread::sleep(Duration::from_millis(1200));

    let first = r.import(&src, &[]);
    assert_eq!(first["files_read"], 40, "{first}");
    let again = r.import(&src, &[]);
    assert_eq!(again["files_read"], 0, "{again}");
    // Nothing new but, when the clock passed a second, the snapshot object itself.
    assert!(again["objects_written"].as_u64().unwrap() <= 1, "{again}");
    assert_eq!(again["root"], first["root"], "{again}");
    assert_eq!(again["files"], 40);

    for i in [3, 17, 38] {
        write_file(
            &src.join(format!("d{}/f{i}.txt", i % 4)),
            format!("changed {i}\n"),
        );
    }
    let changed = r.import(&src, &[]);
    assert_eq!(changed["files_read"], 3, "{changed}");
    assert_ne!(changed["root"], first["root"]);
    let out = r.path("out");
    r.run([
        "export",
        changed["snapshot"].as_str().unwrap(),
        out.to_str().unwrap(),
    ])
    .ok();
    assert_same_tree(&src, &out);
}

#[test]
fn quiet_and_verbose_keep_stdout_for_the_result() {
    let r = TestRoot::new();
    let src = r.path("src");
    write_file(&src.join("f"), "x\n");
    let src = src.to_str().unwrap();

    let loud = r.run(["import", src]).ok();
    assert_eq!(loud.stdout.trim().len(), 64, "{loud:?}");
    assert!(loud.stderr.contains("imported 1 files"), "{loud:?}");
    let quiet = r.run(["-q", "import", src]).ok();
    assert_eq!(quiet.stdout.trim().len(), 64, "{quiet:?}");
    assert!(quiet.stderr.is_empty(), "{quiet:?}");
    // However chatty, --json keeps stdout to the one object.
    let v = r.run(["-vv", "--json", "import", src]).ok().json();
    assert_eq!(v["files"], 1, "{v}");
    let id = v["snapshot"].clone();
    // (Identical imports within one second are one snapshot: the count varies.)
    let list = r.run(["-v", "--json", "snapshots"]).ok().json();
    assert!(
        list.as_array().unwrap().iter().any(|s| s["snapshot"] == id),
        "{list}"
    );
}

#[test]
fn a_root_inside_the_source_is_refused() {
    let r = TestRoot::new();
    // The scratch directory holds the root itself.
    write_file(&r.path("f"), "x");
    let err = r
        .json(["import", r.scratch().to_str().unwrap()])
        .error(9, "invalid_input");
    assert!(err["message"].as_str().unwrap().contains("inside"), "{err}");
    assert!(r.snapshot_ids().is_empty());
    assert!(r.pack_files().is_empty());
}

#[test]
fn fifos_are_kept_and_sockets_left_out_with_a_warning() {
    let r = TestRoot::new();
    let src = r.path("src");
    write_file(&src.join("a"), "a\n");
    run_program(std::path::Path::new("mkfifo"), [src.join("fifo")], &[]).ok();
    let _sock = std::os::unix::net::UnixListener::bind(src.join("sock")).unwrap();
    let v = r.import(&src, &[]);
    let warnings = v["warnings"].as_array().unwrap();
    assert!(
        warnings
            .iter()
            .any(|w| w.as_str().unwrap().contains("sock")),
        "{v}"
    );
    let snap = v["snapshot"].as_str().unwrap();
    let mut names = top_names(&r, snap, "");
    names.sort();
    assert_eq!(names, ["a", "fifo"]);
    let out = r.path("out");
    r.run(["export", snap, out.to_str().unwrap()]).ok();
    use std::os::unix::fs::FileTypeExt;
    assert!(
        std::fs::symlink_metadata(out.join("fifo"))
            .unwrap()
            .file_type()
            .is_fifo()
    );
    assert!(!out.join("sock").exists());
}

/// A `.git` file naming a git directory that is gone (a worktree moved or pruned) is
/// refused with the fixes, and nothing is stored; left out, the tree imports.
#[test]
fn a_git_file_naming_a_missing_repository_is_refused_with_the_fix() {
    let r = TestRoot::new();
    let src = r.path("wt");
    write_file(&src.join("a.txt"), "a\n");
    write_file(
        &src.join(".git"),
        "gitdir: /nonexistent/repo/.git/worktrees/wt\n",
    );
    let before = r.snapshots().len();
    let err = r
        .json(["import", src.to_str().unwrap()])
        .error(9, "invalid_input");
    let msg = err["message"].as_str().unwrap();
    assert!(
        msg.contains("/nonexistent/repo/.git/worktrees/wt")
            && msg.contains("git worktree repair")
            && msg.contains("--exclude .git"),
        "{err}"
    );
    assert_eq!(r.snapshots().len(), before, "nothing was stored");
    let v = r.import(&src, &["--exclude", ".git"]);
    let names = top_names(&r, v["snapshot"].as_str().unwrap(), "");
    assert_eq!(names, vec!["a.txt".to_string()]);
}

/// The note that git's fsmonitor hook has no `mountctl` to run is about workspaces of a
/// checkout: said for a directory holding `.git`, not for a plain directory nor a git
/// revision (whose snapshot has no `.git`).
#[test]
fn the_hook_note_is_said_only_for_a_checkout() {
    let r = TestRoot::new();
    let repo = r.path("repo");
    write_file(&repo.join("a.txt"), "a\n");
    r.git(&repo, ["init", "-q"]).ok();
    r.git(&repo, ["add", "."]).ok();
    r.git(&repo, ["commit", "-qm", "one"]).ok();
    let plain = r.path("plain");
    write_file(&plain.join("a.txt"), "a\n");
    // No mountctl on this PATH, and none named.
    let env = [
        ("PATH", std::ffi::OsStr::new("/usr/bin:/bin")),
        ("COWSPACE_MOUNTCTL", std::ffi::OsStr::new("")),
    ];
    let note = "git's fsmonitor hook runs the `mountctl` on PATH";
    let repo_s = repo.to_str().unwrap();
    let out = r.run_env(["import", repo_s], &env).ok();
    assert_eq!(out.stderr.matches(note).count(), 1, "{}", out.stderr);
    let out = r.run_env(["import", repo_s, "--git", "HEAD"], &env).ok();
    assert!(!out.stderr.contains(note), "{}", out.stderr);
    let out = r.run_env(["import", plain.to_str().unwrap()], &env).ok();
    assert!(!out.stderr.contains(note), "{}", out.stderr);
}
