//! Workspaces end to end, as root with real mounts: the twelve-workload acceptance suite
//! (each workload on a plain directory, then in a workspace of every materializer —
//! overlay over both lowers, copy, reflink on an xfs loop filesystem, btrfs on a btrfs
//! one — committed and checked in a fresh workspace of the new snapshot, every
//! materializer committing the same tree and listing the same diff), a daemon killed
//! during writes, 32 concurrent workspaces, bad input, the cost of a new workspace, and
//! the Python client of the control socket (`docs/examples/cowspace_client.py`).
//!
//! Skips with a reason when not root; fails under `CI=true`. Every test uses its own
//! runtime root whose guard ([`support::WsRoot`]) leaves no mount, daemon or directory
//! behind even when an assertion fails.
//!
//! Needs on the host: `git`, `gcc`, `make`, `python3`, coreutils, `/dev/fuse`, loop
//! devices (`losetup`), `mkfs.btrfs` and `mkfs.xfs`.
//!
//! Run: `cargo build --workspace && cargo test -p cowspace-tests --test e2e workspaces`.

mod acceptance;
mod bad_input;
mod clients;
mod commit;
mod concurrency;
mod config;
mod copyup;
mod crash;
mod diff_names;
mod dirrename;
mod faithful;
mod gitfsmonitor;
mod host_processes;
mod listings;
mod native;
mod properties;
mod python_client;
mod races;
mod retention;
mod schema;
mod subvols;
pub(crate) mod support;
mod symlink_links;
mod teardown;
mod text;
mod through_daemon;
mod uncommitted;
mod upgrade;
mod xattrs;

use std::collections::BTreeMap;
use std::os::unix::fs::symlink;
use std::path::Path;

use cowspace_tests::{Node, chmod, noise, scan_tree, write_file};

/// The C project of the build workload (part of the base tree, under `cproj/`).
pub(crate) fn c_project(dir: &Path) {
    write_file(
        &dir.join("main.c"),
        "#include <stdio.h>\n#include \"util.h\"\n\
         int main(void) { printf(\"hello from cowspace %d\\n\", answer()); return 0; }\n",
    );
    write_file(&dir.join("util.h"), "int answer(void);\n");
    write_file(
        &dir.join("util.c"),
        "#include \"util.h\"\nint answer(void) { return 42; }\n",
    );
    write_file(
        &dir.join("Makefile"),
        "CFLAGS ?= -O2 -Wall\n\
         hello: main.o util.o\n\t$(CC) $(CFLAGS) -o $@ main.o util.o\n\
         %.o: %.c util.h\n\t$(CC) $(CFLAGS) -c -o $@ $<\n\
         clean:\n\trm -f hello *.o\n",
    );
}

/// The base tree every standard workload starts from: nested directories, files of
/// several sizes (empty, tiny, 4 KiB, 200 KiB, a multi-chunk 1.5 MiB file), duplicate
/// contents at different paths, an executable, symlinks (relative, absolute, dangling), a
/// hard-link pair, and the subtrees the workloads delete, rename and replace.
pub(crate) fn base_tree(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    write_file(&dir.join("README.md"), "# base\n");
    write_file(&dir.join("empty"), "");
    write_file(&dir.join("src/empty-too"), "");
    write_file(&dir.join("src/lib/mod.rs"), "pub mod a;\npub mod b;\n");
    write_file(&dir.join("src/lib/a.rs"), "pub fn a() {}\n");
    write_file(&dir.join("src/lib/b.rs"), "pub fn a() {}\n"); // same content as a.rs
    write_file(&dir.join("src/lib/deeper/c.txt"), "x".repeat(4096));
    write_file(&dir.join("src/gen/one.txt"), "generated one\n");
    write_file(&dir.join("src/gen/two.txt"), "generated two\n");
    write_file(&dir.join("data/medium.bin"), noise(1, 200 * 1024));
    write_file(&dir.join("data/large.bin"), noise(2, 1536 * 1024));
    write_file(&dir.join("data/log.txt"), "line 1\nline 2\n");
    write_file(&dir.join("data/shrink.txt"), "0123456789".repeat(100));
    write_file(&dir.join("data/grow.txt"), "short\n");
    write_file(&dir.join("bin/tool.sh"), "#!/bin/sh\necho tool\n");
    chmod(&dir.join("bin/tool.sh"), 0o755);
    write_file(&dir.join("bin/plain.txt"), "not executable yet\n");
    symlink("../README.md", dir.join("bin/readme-link")).unwrap();
    symlink("/etc/hostname", dir.join("abs-link")).unwrap();
    symlink("nowhere/at/all", dir.join("dangling-link")).unwrap();
    write_file(&dir.join("linked/first"), "hard linked in the base\n");
    std::fs::hard_link(dir.join("linked/first"), dir.join("linked/second")).unwrap();
    // Deleted by the delete workload.
    write_file(&dir.join("old/keep-not.txt"), "bye\n");
    write_file(&dir.join("old/sub/a/b/deep.txt"), "bye deep\n");
    write_file(&dir.join("old/sub/x.bin"), noise(3, 10_000));
    symlink("../keep-not.txt", dir.join("old/sub/link")).unwrap();
    // Renamed by the rename workload.
    write_file(&dir.join("left/movable.txt"), "I move\n");
    write_file(&dir.join("left/pkg/inner/one.txt"), "pkg one\n");
    write_file(&dir.join("left/pkg/two.txt"), "pkg two\n");
    std::fs::create_dir_all(dir.join("right")).unwrap();
    // Replaced by the replace workload.
    write_file(&dir.join("becomes-dir"), "I am a file\n");
    write_file(&dir.join("becomes-file/child.txt"), "I am in a directory\n");
    write_file(&dir.join("becomes-file/sub/grandchild.txt"), "deeper\n");
    // Chmod targets.
    std::fs::create_dir_all(dir.join("perm/dir")).unwrap();
    write_file(&dir.join("perm/dir/f"), "f\n");
    chmod(&dir.join("perm/dir"), 0o755);
    c_project(&dir.join("cproj"));
}

/// A listing of `dir` where the contents (size and hash) of the `unstable` paths are
/// blanked: files whose bytes legitimately differ between two runs of the same workload
/// (git's index holds inode numbers and times). Their presence, kind and mode still count.
pub(crate) fn listing(dir: &Path, unstable: &[&str]) -> BTreeMap<String, Node> {
    let mut l = scan_tree(dir);
    for p in unstable {
        if let Some(Node::File { size, hash, .. }) = l.get_mut(*p) {
            *size = 0;
            *hash = 0;
        }
    }
    l
}
