//! The thirteen-workload acceptance suite, on every materializer.
//!
//! Each workload is a function that changes a directory and a verifier that checks,
//! independently, what the result must hold (names, kinds, sizes, modes, contents, link
//! targets, hard-link groups). [`protocol::run`] takes every workload through the same
//! steps: on a plain directory first (the verifier must accept that result and reject the
//! untouched base, so it proves something), then in a workspace of every materializer
//! target ([`protocol::TARGETS`]: overlay over a checkout and over the view, copy, reflink
//! on xfs, btrfs), which must show exactly what the plain directory shows, whose diff and
//! commit are checked, and whose commit, opened in a fresh workspace, passes the verifier.
//! Last, every target must have committed the same tree and listed the same diff.

mod check;
mod protocol;

use std::fs;
use std::io::Write;
use std::os::unix::fs::{FileExt, PermissionsExt, symlink};
use std::path::Path;

use cowspace_tests::{Node, noise, scan_tree, write_file};

use self::check::Check;
use self::protocol::{Base, Workload, run};
use super::support::{require_root, sh, sh_quiet};

// ---------------------------------------------------------------------------------------
// 1. Many small files.

const MANY_DIRS: usize = 100;
const MANY_PER_DIR: usize = 100;

fn many_apply(d: &Path) {
    for i in 0..MANY_DIRS {
        let sub = d.join(format!("many/d{i:02}"));
        fs::create_dir_all(&sub).unwrap();
        for j in 0..MANY_PER_DIR {
            fs::write(sub.join(format!("f{j:03}")), format!("file {i}/{j}\n")).unwrap();
        }
    }
}

fn many_verify(d: &Path) -> Vec<String> {
    let mut c = Check::default();
    let mut count = 0;
    for i in 0..MANY_DIRS {
        let sub = format!("many/d{i:02}");
        match fs::read_dir(d.join(&sub)) {
            Ok(rd) => count += rd.count(),
            Err(e) => c.0.push(format!("{sub}: {e}")),
        }
        for j in 0..MANY_PER_DIR {
            c.text(d, &format!("{sub}/f{j:03}"), &format!("file {i}/{j}\n"));
        }
        if c.0.len() > 20 {
            break;
        }
    }
    if count != MANY_DIRS * MANY_PER_DIR && c.0.is_empty() {
        c.0.push(format!("{count} files under many/, expected 10000"));
    }
    c.done()
}

#[test]
fn workload_many_small_files() {
    require_root!();
    run(&Workload {
        name: "many-small-files",
        base: Base::Standard,
        apply: many_apply,
        verify: many_verify,
        unstable: &[],
    });
}

// ---------------------------------------------------------------------------------------
// 2. A 64 MiB file written, then edited in the middle; a base file edited in the middle.

const BIG: usize = 64 << 20;
const BIG_EDIT_AT: u64 = (32 << 20) - 12_345;

fn big_expected() -> Vec<u8> {
    let mut v = noise(64, BIG);
    let patch = noise(65, 1 << 20);
    v[BIG_EDIT_AT as usize..BIG_EDIT_AT as usize + patch.len()].copy_from_slice(&patch);
    v
}

fn large_base_expected() -> Vec<u8> {
    let mut v = noise(2, 1536 * 1024);
    v[700_000..700_005].copy_from_slice(b"EDIT!");
    v
}

fn big_apply(d: &Path) {
    write_file(&d.join("big/large.bin"), noise(64, BIG));
    let f = fs::OpenOptions::new()
        .write(true)
        .open(d.join("big/large.bin"))
        .unwrap();
    f.write_all_at(&noise(65, 1 << 20), BIG_EDIT_AT).unwrap();
    f.sync_all().unwrap();
    drop(f);
    // The base's multi-chunk file, edited in place with dd (copy-up, then pwrite).
    fs::write(d.join("patch.tmp"), b"EDIT!").unwrap();
    sh(
        d,
        "dd if=patch.tmp of=data/large.bin bs=1 seek=700000 conv=notrunc status=none && rm patch.tmp",
    );
}

fn big_verify(d: &Path) -> Vec<String> {
    let mut c = Check::default();
    c.file(d, "big/large.bin", &big_expected(), 0o644);
    c.file(d, "data/large.bin", &large_base_expected(), 0o644);
    c.absent(d, "patch.tmp");
    c.done()
}

#[test]
fn workload_large_file_edited_in_the_middle() {
    require_root!();
    run(&Workload {
        name: "large-file",
        base: Base::Standard,
        apply: big_apply,
        verify: big_verify,
        unstable: &[],
    });
}

// ---------------------------------------------------------------------------------------
// 3. Append.

fn append_apply(d: &Path) {
    for _ in 0..2 {
        let mut f = fs::OpenOptions::new()
            .append(true)
            .open(d.join("data/log.txt"))
            .unwrap();
        f.write_all(b"appended\n").unwrap();
    }
    let mut f = fs::OpenOptions::new()
        .append(true)
        .open(d.join("data/medium.bin"))
        .unwrap();
    f.write_all(&noise(9, 5000)).unwrap();
    drop(f);
    write_file(&d.join("new-log.txt"), "a\n");
    sh(d, "echo b >> new-log.txt && printf c >> new-log.txt");
}

fn append_verify(d: &Path) -> Vec<String> {
    let mut c = Check::default();
    c.text(d, "data/log.txt", "line 1\nline 2\nappended\nappended\n");
    let mut m = noise(1, 200 * 1024);
    m.extend_from_slice(&noise(9, 5000));
    c.file(d, "data/medium.bin", &m, 0o644);
    c.text(d, "new-log.txt", "a\nb\nc");
    c.done()
}

#[test]
fn workload_append() {
    require_root!();
    run(&Workload {
        name: "append",
        base: Base::Standard,
        apply: append_apply,
        verify: append_verify,
        unstable: &[],
    });
}

// ---------------------------------------------------------------------------------------
// 4. Truncate: shrink and grow, base and new files.

fn truncate_apply(d: &Path) {
    let set = |rel: &str, len: u64| {
        fs::OpenOptions::new()
            .write(true)
            .open(d.join(rel))
            .unwrap()
            .set_len(len)
            .unwrap()
    };
    set("data/shrink.txt", 15);
    set("data/grow.txt", 10_000);
    set("data/large.bin", 100_000);
    set("src/lib/deeper/c.txt", 0);
    write_file(&d.join("fresh.txt"), "0123456789");
    set("fresh.txt", 4);
    set("fresh.txt", 8);
    sh(d, "truncate -s 3000 README.md");
}

fn truncate_verify(d: &Path) -> Vec<String> {
    let mut c = Check::default();
    c.text(d, "data/shrink.txt", "012345678901234");
    let mut g = b"short\n".to_vec();
    g.resize(10_000, 0);
    c.file(d, "data/grow.txt", &g, 0o644);
    c.file(
        d,
        "data/large.bin",
        &noise(2, 1536 * 1024)[..100_000],
        0o644,
    );
    c.text(d, "src/lib/deeper/c.txt", "");
    c.file(d, "fresh.txt", b"0123\0\0\0\0", 0o644);
    let mut r = b"# base\n".to_vec();
    r.resize(3000, 0);
    c.file(d, "README.md", &r, 0o644);
    c.done()
}

#[test]
fn workload_truncate() {
    require_root!();
    run(&Workload {
        name: "truncate",
        base: Base::Standard,
        apply: truncate_apply,
        verify: truncate_verify,
        unstable: &[],
    });
}

// ---------------------------------------------------------------------------------------
// 5. Rename files and non-empty directories across directories (with `mv`).

fn rename_apply(d: &Path) {
    write_file(&d.join("newdir/made/a.txt"), "new a\n");
    write_file(&d.join("newdir/made/sub/b.txt"), "new b\n");
    write_file(&d.join("newfile.txt"), "new file\n");
    // Quietly: where a directory of the snapshot cannot be renamed in place (`EXDEV`),
    // `mv` copies it and must not warn about what it cannot keep.
    sh_quiet(
        d,
        "mv left/movable.txt right/moved.txt && \
         mv left/pkg right/pkg-moved && \
         mv newdir/made right/made-moved && \
         mv newfile.txt src/lib/renamed-new.txt && \
         mv src/gen/one.txt src/one-up.txt && \
         mv bin/readme-link right/readme-link",
    );
}

fn rename_verify(d: &Path) -> Vec<String> {
    let mut c = Check::default();
    c.absent(d, "left/movable.txt");
    c.absent(d, "left/pkg");
    c.dir(d, "left", 0o755);
    c.text(d, "right/moved.txt", "I move\n");
    c.text(d, "right/pkg-moved/inner/one.txt", "pkg one\n");
    c.text(d, "right/pkg-moved/two.txt", "pkg two\n");
    c.absent(d, "newdir/made");
    c.dir(d, "newdir", 0o755);
    c.text(d, "right/made-moved/a.txt", "new a\n");
    c.text(d, "right/made-moved/sub/b.txt", "new b\n");
    c.absent(d, "newfile.txt");
    c.text(d, "src/lib/renamed-new.txt", "new file\n");
    c.absent(d, "src/gen/one.txt");
    c.text(d, "src/gen/two.txt", "generated two\n");
    c.text(d, "src/one-up.txt", "generated one\n");
    c.absent(d, "bin/readme-link");
    c.symlink(d, "right/readme-link", "../README.md");
    c.done()
}

#[test]
fn workload_rename_files_and_directories() {
    require_root!();
    run(&Workload {
        name: "rename",
        base: Base::Standard,
        apply: rename_apply,
        verify: rename_verify,
        unstable: &[],
    });
}

// ---------------------------------------------------------------------------------------
// 6. Delete files and a whole base subtree; empty a directory and refill it.

fn delete_apply(d: &Path) {
    write_file(&d.join("temp/scratch.txt"), "short-lived\n");
    sh(
        d,
        "rm -rf old && rm README.md data/medium.bin dangling-link linked/second && \
         rm -rf temp && rm -rf src/gen && mkdir src/gen && echo again > src/gen/three.txt",
    );
}

fn delete_verify(d: &Path) -> Vec<String> {
    let mut c = Check::default();
    for gone in [
        "old",
        "README.md",
        "data/medium.bin",
        "dangling-link",
        "linked/second",
        "temp",
        "src/gen/one.txt",
        "src/gen/two.txt",
    ] {
        c.absent(d, gone);
    }
    c.text(d, "linked/first", "hard linked in the base\n");
    c.text(d, "src/gen/three.txt", "again\n");
    c.text(d, "data/log.txt", "line 1\nline 2\n");
    c.done()
}

#[test]
fn workload_delete_files_and_subtree() {
    require_root!();
    run(&Workload {
        name: "delete",
        base: Base::Standard,
        apply: delete_apply,
        verify: delete_verify,
        unstable: &[],
    });
}

// ---------------------------------------------------------------------------------------
// 7. Replace a file by a directory and a directory by a file (and a symlink by a file).

fn replace_apply(d: &Path) {
    fs::remove_file(d.join("becomes-dir")).unwrap();
    write_file(&d.join("becomes-dir/now-inside.txt"), "inside\n");
    fs::remove_dir_all(d.join("becomes-file")).unwrap();
    fs::write(d.join("becomes-file"), "now a file\n").unwrap();
    fs::remove_file(d.join("abs-link")).unwrap();
    fs::write(d.join("abs-link"), "was a symlink\n").unwrap();
    fs::remove_file(d.join("src/lib/a.rs")).unwrap();
    symlink("b.rs", d.join("src/lib/a.rs")).unwrap();
}

fn replace_verify(d: &Path) -> Vec<String> {
    let mut c = Check::default();
    c.dir(d, "becomes-dir", 0o755);
    c.text(d, "becomes-dir/now-inside.txt", "inside\n");
    c.text(d, "becomes-file", "now a file\n");
    c.absent(d, "becomes-file/child.txt");
    c.text(d, "abs-link", "was a symlink\n");
    c.symlink(d, "src/lib/a.rs", "b.rs");
    c.done()
}

#[test]
fn workload_replace_file_by_dir_and_dir_by_file() {
    require_root!();
    run(&Workload {
        name: "replace",
        base: Base::Standard,
        apply: replace_apply,
        verify: replace_verify,
        unstable: &[],
    });
}

// ---------------------------------------------------------------------------------------
// 8. Symlinks (relative, absolute, dangling) and hard links.

fn links_apply(d: &Path) {
    write_file(&d.join("links/target.txt"), "the target\n");
    symlink("target.txt", d.join("links/rel")).unwrap();
    symlink("../src/lib/mod.rs", d.join("links/rel-up")).unwrap();
    symlink("/usr/bin/env", d.join("links/abs")).unwrap();
    symlink("missing/file", d.join("links/dangling")).unwrap();
    symlink("rel", d.join("links/chain")).unwrap();
    write_file(&d.join("links/h1"), "hard linked new\n");
    fs::hard_link(d.join("links/h1"), d.join("links/h2")).unwrap();
    fs::create_dir_all(d.join("elsewhere")).unwrap();
    fs::hard_link(d.join("links/h1"), d.join("elsewhere/h3")).unwrap();
    // Same bytes, separate file: must not join the group.
    write_file(&d.join("links/same-bytes"), "hard linked new\n");
}

fn links_verify(d: &Path) -> Vec<String> {
    let mut c = Check::default();
    c.text(d, "links/target.txt", "the target\n");
    c.symlink(d, "links/rel", "target.txt");
    c.symlink(d, "links/rel-up", "../src/lib/mod.rs");
    c.symlink(d, "links/abs", "/usr/bin/env");
    c.symlink(d, "links/dangling", "missing/file");
    c.symlink(d, "links/chain", "rel");
    if fs::read_to_string(d.join("links/chain")).ok().as_deref() != Some("the target\n") {
        c.0.push("links/chain does not resolve to the target".into());
    }
    for n in ["links/h1", "links/h2", "elsewhere/h3", "links/same-bytes"] {
        c.text(d, n, "hard linked new\n");
    }
    c.linked(d, &["links/h1", "links/h2", "elsewhere/h3"]);
    c.not_linked(d, "links/h1", "links/same-bytes");
    // The base's own pair stays one group; equal base contents stay separate files.
    c.linked(d, &["linked/first", "linked/second"]);
    c.not_linked(d, "src/lib/a.rs", "src/lib/b.rs");
    c.not_linked(d, "empty", "src/empty-too");
    c.done()
}

#[test]
fn workload_symlinks_and_hard_links() {
    require_root!();
    run(&Workload {
        name: "links",
        base: Base::Standard,
        apply: links_apply,
        verify: links_verify,
        unstable: &[],
    });
}

// ---------------------------------------------------------------------------------------
// 9. chmod and exec bits.

fn chmod_apply(d: &Path) {
    let set = |rel: &str, mode: u32| {
        fs::set_permissions(d.join(rel), fs::Permissions::from_mode(mode)).unwrap()
    };
    set("bin/tool.sh", 0o644);
    set("bin/plain.txt", 0o755);
    set("data/log.txt", 0o600);
    set("perm/dir", 0o700);
    write_file(&d.join("perm/new-exec"), "#!/bin/sh\necho new\n");
    set("perm/new-exec", 0o750);
    fs::create_dir_all(d.join("perm/sticky")).unwrap();
    set("perm/sticky", 0o1777);
    sh(d, "chmod g+s perm/new-exec && chmod +x src/lib/b.rs");
}

fn chmod_verify(d: &Path) -> Vec<String> {
    let mut c = Check::default();
    c.file(d, "bin/tool.sh", b"#!/bin/sh\necho tool\n", 0o644);
    c.file(d, "bin/plain.txt", b"not executable yet\n", 0o755);
    c.file(d, "data/log.txt", b"line 1\nline 2\n", 0o600);
    c.dir(d, "perm/dir", 0o700);
    c.file(d, "perm/dir/f", b"f\n", 0o644);
    c.file(d, "perm/new-exec", b"#!/bin/sh\necho new\n", 0o2750);
    c.dir(d, "perm/sticky", 0o1777);
    c.file(d, "src/lib/b.rs", b"pub fn a() {}\n", 0o755);
    c.file(d, "src/lib/a.rs", b"pub fn a() {}\n", 0o644);
    c.done()
}

#[test]
fn workload_chmod_and_exec_bits() {
    require_root!();
    run(&Workload {
        name: "chmod",
        base: Base::Standard,
        apply: chmod_apply,
        verify: chmod_verify,
        unstable: &[],
    });
}

// ---------------------------------------------------------------------------------------
// 10. Deep nesting (100 levels).

fn deep_rel(levels: usize) -> String {
    (0..levels)
        .map(|i| format!("l{i}"))
        .collect::<Vec<_>>()
        .join("/")
}

fn deep_apply(d: &Path) {
    let bottom = d.join("deep").join(deep_rel(100));
    write_file(&bottom.join("leaf.txt"), "at the bottom\n");
    symlink("../leaf.txt", bottom.join("up-link")).unwrap();
    write_file(
        &d.join("deep").join(deep_rel(50)).join("middle.txt"),
        "middle\n",
    );
    // And deep under a base directory.
    write_file(
        &d.join("src/lib/deeper").join(deep_rel(30)).join("x"),
        "x\n",
    );
}

fn deep_verify(d: &Path) -> Vec<String> {
    let mut c = Check::default();
    let bottom = format!("deep/{}", deep_rel(100));
    c.text(d, &format!("{bottom}/leaf.txt"), "at the bottom\n");
    c.symlink(d, &format!("{bottom}/up-link"), "../leaf.txt");
    c.text(d, &format!("deep/{}/middle.txt", deep_rel(50)), "middle\n");
    c.text(d, &format!("src/lib/deeper/{}/x", deep_rel(30)), "x\n");
    let levels = if d.join("deep").is_dir() {
        scan_tree(&d.join("deep"))
            .keys()
            .map(|k| k.split('/').count())
            .max()
            .unwrap_or(0)
    } else {
        0
    };
    if levels != 101 {
        c.0.push(format!("deepest path under deep/ has {levels} components"));
    }
    c.done()
}

#[test]
fn workload_deep_nesting() {
    require_root!();
    run(&Workload {
        name: "deep",
        base: Base::Standard,
        apply: deep_apply,
        verify: deep_verify,
        unstable: &[],
    });
}

// ---------------------------------------------------------------------------------------
// 11. A git workflow in a workspace of a git repository.

/// Fixed identity and dates, so the same commit made in two directories has one id.
const GIT_ENV: &str = "GIT_AUTHOR_DATE='2024-01-02T03:04:05Z' \
     GIT_COMMITTER_DATE='2024-01-02T03:04:05Z' HOME=/nonexistent GIT_CONFIG_NOSYSTEM=1 \
     git -c user.name=cowspace -c user.email=tests@cowspace.invalid \
     -c init.defaultBranch=main -c gc.auto=0 -c core.fsync=none";

fn git_repo(src: &Path) {
    fs::create_dir_all(src).unwrap();
    write_file(&src.join("README.md"), "# repo\n");
    write_file(&src.join("src/main.rs"), "fn main() {}\n");
    write_file(&src.join("src/util.rs"), "pub fn util() {}\n");
    write_file(&src.join("docs/guide.md"), "guide\n");
    sh(
        src,
        &format!(
            "{GIT_ENV} init -q && {GIT_ENV} add -A && {GIT_ENV} commit -q -m 'first' && \
             echo more >> docs/guide.md && {GIT_ENV} commit -q -am 'second'"
        ),
    );
}

fn git_apply(d: &Path) {
    let status = sh(d, &format!("{GIT_ENV} status --porcelain"));
    assert_eq!(status, "", "a fresh copy of the repository is clean");
    sh(
        d,
        &format!(
            "echo 'fn main() {{ println!(\"hi\"); }}' > src/main.rs && \
             echo new > src/new.rs && {GIT_ENV} rm -q src/util.rs && \
             {GIT_ENV} add -A && {GIT_ENV} commit -q -m 'edit in workspace'"
        ),
    );
}

fn git_verify(d: &Path) -> Vec<String> {
    let mut c = Check::default();
    let git = |args: &str| -> Result<String, String> {
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("{GIT_ENV} {args}"))
            .current_dir(d)
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    };
    match git("log --format=%s") {
        Ok(log) if log == "edit in workspace\nsecond\nfirst\n" => {}
        other => c.0.push(format!("git log: {other:?}")),
    }
    match git("status --porcelain") {
        Ok(s) if s.is_empty() => {}
        other => c.0.push(format!("git status --porcelain: {other:?}")),
    }
    match git("ls-files") {
        Ok(s) if s == "README.md\ndocs/guide.md\nsrc/main.rs\nsrc/new.rs\n" => {}
        other => c.0.push(format!("git ls-files: {other:?}")),
    }
    if let Err(e) = git("fsck --no-progress --strict") {
        c.0.push(format!("git fsck: {e}"));
    }
    c.text(d, "src/main.rs", "fn main() { println!(\"hi\"); }\n");
    c.absent(d, "src/util.rs");
    c.done()
}

#[test]
fn workload_git_workflow() {
    require_root!();
    run(&Workload {
        name: "git",
        base: Base::Git,
        apply: git_apply,
        verify: git_verify,
        // The index holds inode numbers and times of the directory it was made in. A
        // full tree's config goes without the fsmonitor hook the import added, which
        // the others keep (docs/git.md).
        unstable: &[".git/index", ".git/config"],
    });
}

// ---------------------------------------------------------------------------------------
// 12. A build: compile a small C project with make and gcc.

fn build_apply(d: &Path) {
    sh(&d.join("cproj"), "make -s");
}

fn build_verify(d: &Path) -> Vec<String> {
    let mut c = Check::default();
    let exe = d.join("cproj/hello");
    match std::process::Command::new(&exe).output() {
        Ok(o) if o.status.success() && o.stdout == b"hello from cowspace 42\n" => {}
        other => c.0.push(format!("running cproj/hello: {other:?}")),
    }
    match fs::metadata(&exe) {
        Ok(m) if m.permissions().mode() & 0o111 == 0o111 => {}
        other => {
            c.0.push(format!("cproj/hello is not executable: {other:?}"))
        }
    }
    for o in ["cproj/main.o", "cproj/util.o"] {
        if !d.join(o).is_file() {
            c.0.push(format!("{o} is missing"));
        }
    }
    c.done()
}

#[test]
fn workload_build_c_project() {
    require_root!();
    run(&Workload {
        name: "build",
        base: Base::Standard,
        apply: build_apply,
        verify: build_verify,
        unstable: &[],
    });
}

#[test]
fn verifier_helpers_see_hard_links_and_modes() {
    // The listing itself (no root needed): a hard-link group and a mode are what it says.
    let t = tempfile::tempdir().unwrap();
    write_file(&t.path().join("a"), "x");
    fs::hard_link(t.path().join("a"), t.path().join("b")).unwrap();
    write_file(&t.path().join("c"), "x");
    let l = scan_tree(t.path());
    assert!(matches!(&l["b"], Node::File { link: Some((first, 2)), .. } if first == "a"));
    assert!(matches!(
        &l["c"],
        Node::File {
            link: None,
            mode: 0o644,
            ..
        }
    ));
}

// ---------------------------------------------------------------------------------------
// 13. A hard link of the base reached through several names: a write through one name,
// a new name in another directory, the directory holding the base names renamed.

fn base_links_apply(d: &Path) {
    fs::OpenOptions::new()
        .append(true)
        .open(d.join("linked/second"))
        .unwrap()
        .write_all(b"more\n")
        .unwrap();
    fs::create_dir_all(d.join("outside")).unwrap();
    fs::hard_link(d.join("linked/first"), d.join("outside/third")).unwrap();
    sh(d, "mv linked moved");
}

fn base_links_verify(d: &Path) -> Vec<String> {
    let mut c = Check::default();
    for n in ["moved/first", "moved/second", "outside/third"] {
        c.text(d, n, "hard linked in the base\nmore\n");
    }
    c.absent(d, "linked");
    c.linked(d, &["moved/first", "moved/second", "outside/third"]);
    c.done()
}

#[test]
fn workload_base_hard_links_through_several_names() {
    require_root!();
    run(&Workload {
        name: "base-links",
        base: Base::Standard,
        apply: base_links_apply,
        verify: base_links_verify,
        unstable: &[],
    });
}
