//! git asks the workspace what changed (docs/git.md): an imported git checkout names
//! `mountctl git-fsmonitor` as its fsmonitor hook, so the first `git status` in a fresh
//! workspace looks at no file git last saw unchanged, and after any changes, on every
//! materializer, `git status` says exactly what it says when it looks at every file.
//! A capture's index, which may describe an older tree, is not trusted. btrfs, reflink
//! and copy workspaces, whose tree the hook would have to walk whole, go without it.

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

use cowspace_tests::{LoopFs, LoopKind, mountctl_bin};

use crate::workspaces::support::{WsRoot, require_root, sh};

/// `PATH` with the `mountctl` under test first: the hook runs the `mountctl` on `PATH`.
fn path_with_mountctl() -> std::ffi::OsString {
    let dir = mountctl_bin().parent().unwrap().to_path_buf();
    let rest = std::env::var_os("PATH").unwrap_or_default();
    std::env::join_paths(std::iter::once(dir).chain(std::env::split_paths(&rest))).unwrap()
}

/// Runs git in `dir` with no system or user configuration; with `trace`, git's trace2
/// events go to that file. Gives stdout; asserts success.
#[track_caller]
fn git(dir: &Path, args: &[&str], trace: Option<&Path>) -> String {
    let (out, _) = git_on_path(dir, args, &path_with_mountctl(), trace);
    out
}

/// [`git`] with `PATH` set to `path`; gives stdout and stderr.
#[track_caller]
fn git_on_path(
    dir: &Path,
    args: &[&str],
    path: &std::ffi::OsStr,
    trace: Option<&Path>,
) -> (String, String) {
    let mut cmd = Command::new("git");
    cmd.current_dir(dir)
        .env("PATH", path)
        .env_remove("COWSPACE_MOUNTCTL")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", "/nonexistent")
        // Preload the index with threads even for a small index, so git counts the
        // files it looks at (`preload/sum_lstat`).
        .env("GIT_TEST_PRELOAD_INDEX", "1")
        .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
        .args(args);
    if let Some(t) = trace {
        let _ = std::fs::remove_file(t);
        cmd.env("GIT_TRACE2_EVENT", t);
    }
    let out = cmd.output().expect("git runs");
    assert!(
        out.status.success(),
        "git {args:?} in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// How many files git looked at (`lstat`) before it refreshed the index.
fn files_looked_at(trace: &Path) -> u64 {
    let text = std::fs::read_to_string(trace).expect("trace2 events");
    let key = "\"key\":\"preload/sum_lstat\",\"value\":\"";
    let at = text
        .find(key)
        .unwrap_or_else(|| panic!("no preload/sum_lstat in {text}"));
    let rest = &text[at + key.len()..];
    rest[..rest.find('"').expect("closing quote")]
        .parse()
        .expect("a count")
}

/// A git checkout whose index git trusts for every file but `d0/late.txt`, changed after
/// the index was last written (so the import keeps that entry for git to check).
fn checkout(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    for i in 0..120 {
        let d = dir
            .join(format!("d{}", i % 6))
            .join(format!("sub{}", i % 3));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(format!("f{i}.txt")), format!("file {i}\n")).unwrap();
    }
    std::fs::write(dir.join("d0/late.txt"), "before\n").unwrap();
    std::fs::write(
        dir.join("replaced"),
        "a file the workload makes a directory\n",
    )
    .unwrap();
    std::fs::write(dir.join("tool.sh"), "#!/bin/sh\n").unwrap();
    std::fs::write(dir.join(".gitignore"), "*.o\n").unwrap();
    std::os::unix::fs::symlink("d1/sub1/f1.txt", dir.join("link")).unwrap();
    git(dir, &["init", "-q"], None);
    // The end-of-entries extension hashes the extension headers: the import must write
    // it again after adding its own.
    git(
        dir,
        &["config", "index.recordEndOfIndexEntries", "true"],
        None,
    );
    git(dir, &["add", "-A"], None);
    git(dir, &["commit", "-qm", "base"], None);
    // Files older than the index (git's racy-clean rule) and the stat cache margin.
    std::thread::sleep(std::time::Duration::from_millis(1200));
    git(dir, &["status", "--porcelain"], None);
    std::fs::write(dir.join("d0/late.txt"), "after!\n").unwrap();
}

/// Changes of every kind git cares about, made in a workspace.
fn change(ws: &Path) {
    sh(
        ws,
        "echo edited >> d1/sub1/f1.txt && rm d2/sub2/f2.txt && rm -r d3 && \
         rm replaced && mkdir replaced && echo inside > replaced/file && \
         rm -r d4/sub1 && echo now-a-file > d4/sub1 && chmod +x tool.sh && \
         ln -sfn d5/sub2/f5.txt link && echo new > d5/new.txt && echo obj > d5/x.o && \
         mv d5/sub2 d5/moved && echo touched > d0/sub0/f0.txt && \
         printf 'file 6\\n' > d0/sub0/f6.txt.tmp && mv d0/sub0/f6.txt.tmp d0/sub0/f6.txt",
    );
}

const ALL: &[&str] = &[
    "status",
    "--porcelain",
    "--untracked-files=all",
    "--ignored",
];

/// `git status` through the hook and with the hook off agree, and show `want` lines.
#[track_caller]
fn assert_status_agrees(ws: &Path, what: &str, want: &[&str]) {
    let with = git(ws, ALL, None);
    let mut off = vec!["-c", "core.fsmonitor=false"];
    off.extend_from_slice(ALL);
    let without = git(ws, &off, None);
    assert_eq!(
        with, without,
        "{what}: git status through the hook differs from looking at every file"
    );
    for w in want {
        assert!(
            with.lines().any(|l| l == *w),
            "{what}: git status lacks {w:?}:\n{with}"
        );
    }
}

/// Every change [`change`] makes, as `git status --porcelain` shows it.
const CHANGED: &[&str] = &[
    " M d0/late.txt",
    " M d1/sub1/f1.txt",
    " D d2/sub2/f2.txt",
    " D d3/sub0/f3.txt",
    " D replaced",
    "?? replaced/file",
    " D d4/sub1/f10.txt",
    "?? d4/sub1",
    " M tool.sh",
    " M link",
    "?? d5/new.txt",
    "!! d5/x.o",
    " D d5/sub2/f5.txt",
    "?? d5/moved/f5.txt",
    " M d0/sub0/f0.txt",
];

fn check_materializer(r: &WsRoot, base: &str, what: &str, flags: &[&str]) {
    let ws = r.create(base, flags);
    // btrfs, reflink and copy workspaces make their own tree, and the hook would walk
    // all of it: the tree's config and index come without it.
    let full_tree = ["btrfs", "reflink", "copy"]
        .iter()
        .any(|m| flags.contains(m));
    let config = std::fs::read_to_string(ws.path.join(".git/config")).unwrap();
    assert_eq!(
        config.contains("git-fsmonitor"),
        !full_tree,
        "{what}: the hook in .git/config:\n{config}"
    );
    let diff = r.t.json(["diff", ws.id.as_str()]).ok().json();
    assert_eq!(
        diff["changes"],
        serde_json::json!([]),
        "{what}: an untouched workspace diffs empty"
    );
    let trace = r.t.path(&format!("trace-{}", ws.id));
    let first = git(&ws.path, &["status", "--porcelain"], Some(&trace));
    assert_eq!(
        first, " M d0/late.txt\n",
        "{what}: the first git status in a fresh workspace"
    );
    if !full_tree {
        assert_eq!(
            files_looked_at(&trace),
            1,
            "{what}: the first git status should look only at the file git did not trust"
        );
    }
    // The file git did not trust is not "racily clean" either: git has no reason to
    // write the index again. (A full tree's files can share the index's time, which git
    // takes as racy.)
    if !full_tree {
        let diff = r.t.json(["diff", ws.id.as_str()]).ok().json();
        assert_eq!(
            diff["changes"],
            serde_json::json!([]),
            "{what}: the first git status wrote something"
        );
    }
    change(&ws.path);
    assert_status_agrees(&ws.path, what, CHANGED);
    // git keeps the hook's token when it writes the index; later queries still agree.
    git(&ws.path, &["add", "-A"], None);
    assert_status_agrees(&ws.path, &format!("{what}, after git add"), &[]);
    sh(&ws.path, "echo again >> d1/sub1/f1.txt");
    assert_status_agrees(
        &ws.path,
        &format!("{what}, after git add"),
        &["MM d1/sub1/f1.txt"],
    );
    r.discard(&ws.id);
}

#[test]
fn git_status_through_the_hook_agrees_with_looking_at_every_file() {
    require_root!();
    let r = WsRoot::new();
    let src = r.t.path("src");
    checkout(&src);
    let base = r.import(&src, &["--no-default-excludes"]);
    let config = std::fs::read_to_string(src.join(".git/config")).unwrap();
    assert!(
        !config.contains("fsmonitor"),
        "the source is left as it was"
    );
    let at = |name: &str| r.t.path(name).to_string_lossy().into_owned();
    let (overlay_at, fuse_at) = (at("elsewhere-overlay"), at("elsewhere-fuse"));
    for (what, flags) in [
        (
            "overlay/view",
            &["--materializer", "overlay", "--lower", "view"][..],
        ),
        (
            "overlay/checkout",
            &["--materializer", "overlay", "--lower", "checkout"],
        ),
        ("fuse", &["--materializer", "fuse"]),
        ("copy", &["--materializer", "copy"]),
        // At a path of the caller's: found through the mount table.
        (
            "overlay at --path",
            &["--materializer", "overlay", "--path", &overlay_at],
        ),
        (
            "fuse at --path",
            &["--materializer", "fuse", "--path", &fuse_at],
        ),
    ] {
        check_materializer(&r, &base, what, flags);
    }
    r.assert_clean();
}

#[test]
fn git_status_through_the_hook_agrees_on_btrfs_and_reflink() {
    require_root!();
    let src_dir = tempfile::tempdir().unwrap();
    let src = src_dir.path().join("src");
    checkout(&src);
    for (kind, materializer) in [(LoopKind::Btrfs, "btrfs"), (LoopKind::Xfs, "reflink")] {
        let fs = match LoopFs::new(kind) {
            Ok(fs) => fs,
            Err(why) => {
                if std::env::var("CI").as_deref() == Ok("true") {
                    panic!("{materializer} cannot run under CI=true: {why}");
                }
                eprintln!("SKIPPED: {materializer}: {why}");
                continue;
            }
        };
        let r = WsRoot::new_in(fs.mnt());
        let base = r.import(&src, &["--no-default-excludes"]);
        check_materializer(&r, &base, materializer, &["--materializer", materializer]);
        // At a path of the caller's (on another filesystem): found through the mount
        // table too.
        let elsewhere = src_dir.path().join(format!("elsewhere-{materializer}"));
        check_materializer(
            &r,
            &base,
            &format!("{materializer} at --path"),
            &[
                "--materializer",
                materializer,
                "--path",
                &elsewhere.to_string_lossy(),
            ],
        );
        r.assert_clean();
        drop(r);
        drop(fs);
    }
}

/// A capture of a workspace of `base` made by `flags`, after `git_add` (a path staged with
/// `git add`, so git writes the index in the workspace; `None`: no git command) and then
/// changes made without git. In a fresh workspace of the capture, `git status` says
/// `want` and (when `looked_at` is given) looks at that many files; after one more change
/// it still agrees with looking at every file.
fn check_capture(
    r: &WsRoot,
    base: &str,
    flags: &[&str],
    git_add: Option<&str>,
    want: &str,
    looked_at: Option<u64>,
) {
    let what = format!("{flags:?}, git add {git_add:?}: a workspace of the capture");
    let ws = r.create(base, flags);
    if let Some(path) = git_add {
        sh(&ws.path, &format!("echo staged >> {path}"));
        git(&ws.path, &["add", path], None);
    }
    sh(
        &ws.path,
        "echo later >> d2/sub2/f2.txt && rm d3/sub0/f3.txt",
    );
    let (capture, _, _) = r.commit(&ws.id, &[]);
    let next = r.create(&capture, flags);
    let trace = r.t.path(&format!("trace-{}", next.id));
    assert_eq!(
        git(&next.path, &["status", "--porcelain"], Some(&trace)),
        want,
        "{what}"
    );
    if let Some(n) = looked_at {
        assert_eq!(files_looked_at(&trace), n, "{what}: files git looked at");
    }
    // And git keeps the token this workspace's hook gives it: still right afterwards.
    sh(&next.path, "echo more >> d4/sub1/f4.txt");
    assert_status_agrees(&next.path, &what, &[" M d4/sub1/f4.txt"]);
    r.discard(&next.id);
    r.remove(&ws.id);
}

/// A capture of a workspace where git never wrote the index holds the base's index,
/// made for the base: in a workspace of the capture, git must still see the files
/// changed after that index was written. An index git wrote in the workspace is carried
/// into the capture with a token of the capture's: git there looks only at what that
/// index had not verified and what changed since (4 files), and still sees every change.
#[test]
fn a_captures_index_is_trusted_only_when_carried_on() {
    require_root!();
    let r = WsRoot::new();
    let src = r.t.path("src");
    checkout(&src);
    let base = r.import(&src, &["--no-default-excludes"]);
    for flags in [
        &["--materializer", "overlay"][..],
        &["--materializer", "fuse"],
    ] {
        check_capture(
            &r,
            &base,
            flags,
            None,
            " M d0/late.txt\n M d2/sub2/f2.txt\n D d3/sub0/f3.txt\n",
            None,
        );
        check_capture(
            &r,
            &base,
            flags,
            Some("d1/sub1/f1.txt"),
            " M d0/late.txt\nM  d1/sub1/f1.txt\n M d2/sub2/f2.txt\n D d3/sub0/f3.txt\n",
            Some(4),
        );
    }
    r.assert_clean();
}

#[test]
fn import_without_the_hook_leaves_git_config_alone() {
    require_root!();
    let r = WsRoot::new();
    let src = r.t.path("src");
    checkout(&src);
    let base = r.import(&src, &["--no-default-excludes", "--no-git-fsmonitor"]);
    let ws = r.create(&base, &[]);
    assert_eq!(
        std::fs::read(ws.path.join(".git/config")).unwrap(),
        std::fs::read(src.join(".git/config")).unwrap()
    );
    let trace = r.t.path("trace");
    assert_eq!(
        git(&ws.path, &["status", "--porcelain"], Some(&trace)),
        " M d0/late.txt\n"
    );
    r.discard(&ws.id);
    r.assert_clean();
}

/// The hook run by hand outside a workspace, and with another version of the protocol.
#[test]
fn the_hook_outside_a_workspace_says_everything_may_have_changed() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(mountctl_bin())
        .args(["--root", &dir.path().join("root").to_string_lossy()])
        .args(["git-fsmonitor", "2", "cowspace:1:import:x"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("cowspace:1:") && text.ends_with("\0/\0"),
        "{text:?}"
    );
    let v1 = Command::new(mountctl_bin())
        .args(["git-fsmonitor", "1", "0"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!v1.status.success(), "version 1 is not answered");
}

/// Nothing in a snapshot names this host's `mountctl`: the hook runs the one on `PATH`,
/// wherever it was moved; with none, git says nothing and looks at every file. An export
/// (directory or tar) gives back the checkout's own `.git/config` and an index without
/// the fsmonitor extension (docs/git.md).
#[test]
fn the_hook_names_no_path_and_an_export_gives_back_the_checkout() {
    require_root!();
    let r = WsRoot::new();
    let src = r.t.path("src");
    checkout(&src);
    let base = r.import(&src, &["--no-default-excludes"]);
    let ws = r.create(&base, &["--materializer", "overlay"]);
    let config = std::fs::read_to_string(ws.path.join(".git/config")).unwrap();
    let built = mountctl_bin()
        .parent()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert!(config.contains("git-fsmonitor"), "{config}");
    assert!(
        !config.contains(&built),
        "the snapshot names {built}:\n{config}"
    );
    // mountctl moved elsewhere (another PATH entry): the hook still answers.
    let moved = r.t.path("moved-bin");
    std::fs::create_dir_all(&moved).unwrap();
    std::fs::copy(mountctl_bin(), moved.join("mountctl")).unwrap();
    let system = "/usr/local/bin:/usr/bin:/bin";
    assert!(
        !system
            .split(':')
            .any(|d| Path::new(d).join("mountctl").exists()),
        "a mountctl installed in {system} would hide what this test checks"
    );
    let path = format!("{}:{system}", moved.display());
    let trace = r.t.path("trace-moved");
    let (out, err) = git_on_path(
        &ws.path,
        &["status", "--porcelain"],
        path.as_ref(),
        Some(&trace),
    );
    assert_eq!(
        (out.as_str(), err.as_str()),
        (" M d0/late.txt\n", ""),
        "moved"
    );
    assert_eq!(files_looked_at(&trace), 1, "the moved mountctl answered");
    // No mountctl at all: not a word, and git looks at every file.
    let trace = r.t.path("trace-none");
    let (out, err) = git_on_path(
        &ws.path,
        &["status", "--porcelain"],
        system.as_ref(),
        Some(&trace),
    );
    assert_eq!(
        (out.as_str(), err.as_str()),
        (" M d0/late.txt\n", ""),
        "no mountctl"
    );
    assert!(
        files_looked_at(&trace) > 1,
        "without the hook git looks at every file"
    );
    r.discard(&ws.id);
    // The export gives back what was imported.
    let out = r.t.path("export");
    r.t.run(["export", base.as_str(), out.to_str().unwrap()])
        .ok();
    assert_eq!(
        std::fs::read(out.join(".git/config")).unwrap(),
        std::fs::read(src.join(".git/config")).unwrap(),
        "the export's .git/config"
    );
    let index = std::fs::read(out.join(".git/index")).unwrap();
    assert!(
        !index.windows(4).any(|w| w == b"FSMN"),
        "the export's index keeps the fsmonitor extension"
    );
    let (status, err) = git_on_path(&out, &["status", "--porcelain"], system.as_ref(), None);
    assert_eq!(
        (status.as_str(), err.as_str()),
        (" M d0/late.txt\n", ""),
        "git in the export"
    );
    let tar = r.t.path("export.tar");
    r.t.run(["export", "--tar", base.as_str(), tar.to_str().unwrap()])
        .ok();
    let untarred = r.t.path("untarred");
    std::fs::create_dir_all(&untarred).unwrap();
    sh(&untarred, &format!("tar -xf {}", tar.display()));
    assert_eq!(
        std::fs::read(untarred.join(".git/config")).unwrap(),
        std::fs::read(src.join(".git/config")).unwrap(),
        "the tar export's .git/config"
    );
    assert_eq!(
        std::fs::read(untarred.join(".git/index")).unwrap(),
        index,
        "the tar export's index"
    );
    r.assert_clean();
}

/// `doctor` says what imports of git checkouts will name as the hook.
#[test]
fn doctor_names_the_hook() {
    require_root!();
    let r = WsRoot::new();
    let bin = mountctl_bin();
    let v = cowspace_tests::run_program(
        &bin,
        [
            OsStr::new("--root"),
            r.t.root().as_os_str(),
            OsStr::new("--json"),
            OsStr::new("doctor"),
        ],
        &[("COWSPACE_MOUNTCTL", bin.as_os_str())],
    )
    .ok()
    .json();
    let hook = &v["git_fsmonitor"];
    assert_eq!(hook["available"], true, "{v}");
    let cmd = hook["command"].as_str().expect("a command");
    assert!(
        cmd.ends_with(" git-fsmonitor") && !cmd.contains(&*bin.parent().unwrap().to_string_lossy()),
        "the hook names no path: {cmd}"
    );
    assert_eq!(
        hook["runs"].as_str(),
        Some(&*mountctl_bin().to_string_lossy()),
        "the mountctl the hook runs here (COWSPACE_MOUNTCTL)"
    );
    let text = cowspace_tests::run_program(
        &bin,
        [
            OsStr::new("--root"),
            r.t.root().as_os_str(),
            OsStr::new("doctor"),
        ],
        &[("COWSPACE_MOUNTCTL", bin.as_os_str())],
    )
    .ok()
    .stdout;
    assert!(text.contains("asks the workspace what changed"), "{text}");
    // Without a mountctl the hook can find, doctor says git looks at every file.
    let none = cowspace_tests::run_program(
        &bin,
        [
            OsStr::new("--root"),
            r.t.root().as_os_str(),
            OsStr::new("doctor"),
        ],
        &[
            ("PATH", OsStr::new("/usr/bin:/bin")),
            ("COWSPACE_MOUNTCTL", OsStr::new("")),
        ],
    )
    .ok()
    .stdout;
    assert!(none.contains("looks at every file"), "{none}");
    // Host hints: each with its cause and fix, in the JSON and the text alike.
    let hints = v["hints"].as_array().expect("a list of hints");
    for h in hints {
        let (cause, fix) = (h["cause"].as_str().unwrap(), h["fix"].as_str().unwrap());
        assert!(text.contains(cause) && text.contains(fix), "{text}");
    }
    assert_eq!(text.matches("\nhint (").count(), hints.len(), "{text}");
}
