//! The store commands of `mountctl`, through the real binary: each test asserts the exit
//! code, the `--json` (or text) output, and the state the command leaves behind.

mod bad_input;
mod corruption;
mod diff;
mod export;
mod gc;
mod import;
mod refs;
mod stdout;

use std::os::unix::fs::symlink;
use std::path::Path;

use cowspace_tests::{chmod, noise, write_file};

/// A tree with everything an import must keep: names with spaces and unicode, empty
/// files, empty directories, executable bits and other modes, symlinks (relative,
/// absolute, dangling), hard links, a multi-chunk file, deep nesting.
pub(crate) fn rich_tree(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    write_file(&dir.join("README.md"), "# rich tree\n");
    write_file(
        &dir.join("dir with space/ünïcødé/f ile.txt"),
        "spaces and unicode\n",
    );
    write_file(&dir.join("empty-file"), "");
    std::fs::create_dir_all(dir.join("empty-dir")).unwrap();
    std::fs::create_dir_all(dir.join("deep/a/b/c/d/e/f/g/h")).unwrap();
    write_file(&dir.join("deep/a/b/c/d/e/f/g/h/leaf"), "deep\n");
    write_file(&dir.join("bin/run.sh"), "#!/bin/sh\necho hi\n");
    chmod(&dir.join("bin/run.sh"), 0o755);
    write_file(&dir.join("private"), "secret\n");
    chmod(&dir.join("private"), 0o600);
    std::fs::create_dir_all(dir.join("locked")).unwrap();
    write_file(&dir.join("locked/inside"), "x");
    chmod(&dir.join("locked"), 0o750);
    write_file(&dir.join("big.bin"), noise(7, 700 * 1024));
    symlink("bin/run.sh", dir.join("rel-link")).unwrap();
    symlink("/etc/hostname", dir.join("abs-link")).unwrap();
    symlink("does/not/exist", dir.join("dangling-link")).unwrap();
    symlink("../README.md", dir.join("bin/up-link")).unwrap();
    write_file(&dir.join("linked/one"), "hard linked\n");
    std::fs::hard_link(dir.join("linked/one"), dir.join("linked/two")).unwrap();
    std::fs::hard_link(dir.join("linked/one"), dir.join("other-name")).unwrap();
}
