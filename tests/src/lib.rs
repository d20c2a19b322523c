//! Shared helpers for the end-to-end tests: locating the built binaries, temporary roots.
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::OsStr;
use std::fs;
use std::hash::{DefaultHasher, Hasher};
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use tempfile::TempDir;

pub mod mounts;
pub use mounts::{LoopFs, LoopKind, fsd_pids_of, mounts_under, run_checked, unmount};

/// A binary of the workspace (`mountctl`, `fsd`, ...), found in the target directory this
/// test executable was built into: `target/<profile>/deps/e2e-<hash>` →
/// `target/<profile>/<name>`.
///
/// Panics with what to do when it is missing: `cargo test` builds other packages'
/// binaries only as test harnesses, so `cargo xtask test` builds them first.
pub fn bin_path(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    let mut dir = exe.parent().expect("the test executable's directory");
    if dir.ends_with("deps") {
        dir = dir.parent().expect("target/<profile>");
    }
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} is missing: run `cargo build --workspace --bins` first (`cargo xtask test` \
         does both)",
        path.display()
    );
    path
}

/// The `mountctl` binary beside this test executable.
pub fn mountctl_bin() -> PathBuf {
    bin_path("mountctl")
}

/// What a finished command gave.
#[derive(Debug)]
pub struct Out {
    /// The exit code (-1 when killed by a signal).
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    /// The command line, for messages.
    pub cmdline: String,
}

impl Out {
    fn from_output(cmdline: String, out: Output) -> Out {
        Out {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            cmdline,
        }
    }

    /// Asserts the exit code, showing the whole output when it differs.
    #[track_caller]
    pub fn code(self, expected: i32) -> Out {
        assert_eq!(
            self.code, expected,
            "`{}` exited {} (expected {expected})\nstdout: {}\nstderr: {}",
            self.cmdline, self.code, self.stdout, self.stderr
        );
        self
    }

    /// Asserts exit 0.
    #[track_caller]
    pub fn ok(self) -> Out {
        self.code(0)
    }

    /// stdout parsed as the one JSON value `--json` promises.
    #[track_caller]
    pub fn json(&self) -> Value {
        serde_json::from_str(self.stdout.trim()).unwrap_or_else(|e| {
            panic!(
                "`{}`: stdout is not one JSON value ({e})\nstdout: {}\nstderr: {}",
                self.cmdline, self.stdout, self.stderr
            )
        })
    }

    /// Asserts a `--json` failure: the exit code, `error.kind`, and a message and hint
    /// that are strings. Gives the `error` object.
    #[track_caller]
    pub fn error(self, code: i32, kind: &str) -> Value {
        let out = self.code(code);
        let v = out.json();
        let err = v.get("error").unwrap_or_else(|| {
            panic!("`{}`: no \"error\" object in {v}", out.cmdline);
        });
        assert_eq!(err["kind"], kind, "`{}`: {v}", out.cmdline);
        assert!(err["message"].is_string(), "`{}`: {v}", out.cmdline);
        assert!(
            err["hint"].is_string() || err["hint"].is_null(),
            "`{}`: {v}",
            out.cmdline
        );
        err.clone()
    }
}

/// An empty configuration file: what the programs under test read instead of the
/// host's `/etc/cowspace/config.toml` and the user's (a test that wants one passes
/// `COWSPACE_CONFIG` itself).
pub fn empty_config() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("empty-config.toml")
}

/// Runs `program args` with a hermetic environment and gives its output.
pub fn run_program<I, S>(program: &Path, args: I, env: &[(&str, &OsStr)]) -> Out
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let args: Vec<_> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
    let cmdline = std::iter::once(program.as_os_str())
        .chain(args.iter().map(|a| a.as_os_str()))
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ");
    let out = program_command(program, &args, env)
        .output()
        .unwrap_or_else(|e| panic!("cannot start `{cmdline}`: {e}"));
    Out::from_output(cmdline, out)
}

/// The program `name` on `PATH`, else in `$CARGO_HOME/bin` or `~/.cargo/bin` (where
/// `scripts/test.sh` installs the test servers and suites).
pub fn find_program(name: &str) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Some(h) = std::env::var_os("CARGO_HOME") {
        dirs.push(Path::new(&h).join("bin"));
    }
    if let Some(h) = std::env::var_os("HOME") {
        dirs.push(Path::new(&h).join(".cargo/bin"));
    }
    dirs.into_iter().map(|d| d.join(name)).find(|p| p.is_file())
}

/// `program args…` with the environment every test run gets (no cowspace variables of
/// the caller's, the empty config file, no system git config) plus `env`.
pub fn program_command<S: AsRef<OsStr>>(
    program: &Path,
    args: &[S],
    env: &[(&str, &OsStr)],
) -> Command {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_remove("COWSPACE_ROOT")
        .env_remove("COWSPACE_MATERIALIZER")
        .env_remove("COWSPACE_LOWER")
        .env("COWSPACE_CONFIG", empty_config())
        .env_remove("RUST_LOG")
        .env("GIT_CONFIG_NOSYSTEM", "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// A runtime root in its own temporary directory, with room beside it for sources and
/// exports. Everything goes when it is dropped, also when a test fails.
#[derive(Debug)]
pub struct TestRoot {
    tmp: TempDir,
    root: PathBuf,
}

impl TestRoot {
    /// A fresh temporary directory with a root path in it that is not initialised.
    pub fn uninitialised() -> TestRoot {
        TestRoot::uninitialised_in(&std::env::temp_dir())
    }

    /// Like [`TestRoot::uninitialised`], with the temporary directory under `parent`
    /// (a loop filesystem, say).
    pub fn uninitialised_in(parent: &Path) -> TestRoot {
        let tmp = tempfile::Builder::new()
            .prefix("cowspace-e2e-")
            .tempdir_in(parent)
            .unwrap_or_else(|e| panic!("a temporary directory in {}: {e}", parent.display()));
        let root = tmp.path().join("root");
        TestRoot { tmp, root }
    }

    /// A fresh, initialised runtime root.
    pub fn new() -> TestRoot {
        TestRoot::new_in(&std::env::temp_dir())
    }

    /// A fresh, initialised runtime root in a temporary directory under `parent`.
    pub fn new_in(parent: &Path) -> TestRoot {
        let r = TestRoot::uninitialised_in(parent);
        r.run(["init"]).ok();
        r
    }

    /// The runtime root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// A path beside the root for sources, archives and exports (not created).
    pub fn path(&self, name: &str) -> PathBuf {
        self.tmp.path().join(name)
    }

    /// The scratch directory (also `$HOME` of every command run).
    pub fn scratch(&self) -> &Path {
        self.tmp.path()
    }

    /// `--root ROOT args...`.
    fn with_root<I, S>(&self, args: I) -> Vec<std::ffi::OsString>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        [OsStr::new("--root"), self.root.as_os_str()]
            .into_iter()
            .map(|s| s.to_owned())
            .chain(args.into_iter().map(|a| a.as_ref().to_owned()))
            .collect()
    }

    /// `mountctl --root ROOT args...`.
    pub fn run<I, S>(&self, args: I) -> Out
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        run_program(
            &mountctl_bin(),
            self.with_root(args),
            &[("HOME", self.tmp.path().as_os_str())],
        )
    }

    /// `mountctl --root ROOT args...` as a command to start (in the background, say),
    /// with the environment [`TestRoot::run`] gives.
    pub fn command<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        program_command(
            &mountctl_bin(),
            &self.with_root(args),
            &[("HOME", self.tmp.path().as_os_str())],
        )
    }

    /// `mountctl --root ROOT args...` with these environment variables too.
    pub fn run_env<I, S>(&self, args: I, env: &[(&str, &OsStr)]) -> Out
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut e = vec![("HOME", self.tmp.path().as_os_str())];
        e.extend_from_slice(env);
        run_program(&mountctl_bin(), self.with_root(args), &e)
    }

    /// `mountctl --root ROOT --json args...`.
    pub fn json<I, S>(&self, args: I) -> Out
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let all = std::iter::once(OsStr::new("--json").to_owned())
            .chain(args.into_iter().map(|a| a.as_ref().to_owned()));
        self.run(all)
    }

    /// Imports `source` (with extra arguments) and gives the `--json` report.
    #[track_caller]
    pub fn import(&self, source: &Path, extra: &[&str]) -> Value {
        let mut args = vec![OsStr::new("import"), source.as_os_str()];
        args.extend(extra.iter().map(OsStr::new));
        let v = self.json(args).ok().json();
        assert_eq!(v["snapshot"].as_str().map(str::len), Some(64), "{v}");
        v
    }

    /// `snapshots --json`.
    #[track_caller]
    pub fn snapshots(&self) -> Vec<Value> {
        match self.json(["snapshots"]).ok().json() {
            Value::Array(a) => a,
            other => panic!("snapshots --json is not an array: {other}"),
        }
    }

    /// The snapshot ids of `snapshots --json`.
    #[track_caller]
    pub fn snapshot_ids(&self) -> BTreeSet<String> {
        self.snapshots()
            .iter()
            .map(|s| s["snapshot"].as_str().expect("snapshot id").to_owned())
            .collect()
    }

    /// `refs --json`: name → snapshot id.
    #[track_caller]
    pub fn refs(&self) -> BTreeMap<String, String> {
        let v = self.json(["refs"]).ok().json();
        v.as_object()
            .expect("refs --json is an object")
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().expect("snapshot id").to_owned()))
            .collect()
    }

    /// `stats --json`.
    #[track_caller]
    pub fn stats(&self) -> Value {
        self.json(["stats"]).ok().json()
    }

    /// The pack files under `<root>/store/packs`, by file name.
    pub fn pack_files(&self) -> BTreeSet<String> {
        let dir = self.root.join("store/packs");
        match fs::read_dir(&dir) {
            Ok(rd) => rd
                .map(|e| {
                    e.expect("read packs dir")
                        .file_name()
                        .to_string_lossy()
                        .into_owned()
                })
                .filter(|n| n.ends_with(".pack"))
                .collect(),
            Err(_) => BTreeSet::new(),
        }
    }

    /// Runs `git args...` in `repo` with a config-free environment (`$HOME` = scratch).
    #[track_caller]
    pub fn git<I, S>(&self, repo: &Path, args: I) -> Out
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let all = ["-C".as_ref(), repo.as_os_str()]
            .into_iter()
            .map(|s: &OsStr| s.to_owned())
            .chain(
                [
                    "-c",
                    "user.name=cowspace tests",
                    "-c",
                    "user.email=tests@cowspace.invalid",
                    "-c",
                    "init.defaultBranch=main",
                ]
                .iter()
                .map(|s| OsStr::new(s).to_owned()),
            )
            .chain(args.into_iter().map(|a| a.as_ref().to_owned()));
        run_program(
            Path::new("git"),
            all,
            &[("HOME", self.tmp.path().as_os_str())],
        )
        .ok()
    }
}

impl Default for TestRoot {
    fn default() -> TestRoot {
        TestRoot::new()
    }
}

/// One node of a tree as the tests compare them: what an import must keep and an export
/// must reproduce. Ownership and timestamps are not kept by design.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    Dir {
        mode: u32,
    },
    File {
        mode: u32,
        size: u64,
        /// A 64-bit hash of the content (SipHash with fixed keys): equal trees, equal hashes.
        hash: u64,
        /// For a file with several names in the tree: the first of them in sorted order,
        /// and how many names it has.
        link: Option<(String, u64)>,
    },
    Symlink {
        target: PathBuf,
    },
    Other {
        kind: &'static str,
    },
}

/// Every path under `root` (relative, `/`-joined; the root itself is `""`) with what it
/// holds. Hard links are recognised by (dev, ino) within the tree (not by `nlink`).
pub fn scan_tree(root: &Path) -> BTreeMap<String, Node> {
    let mut out = BTreeMap::new();
    let mut inodes: HashMap<(u64, u64), Vec<String>> = HashMap::new();
    scan_into(root, root, &mut out, &mut inodes);
    for names in inodes.values_mut() {
        if names.len() < 2 {
            continue;
        }
        names.sort();
        let first = names[0].clone();
        let n = names.len() as u64;
        for name in names.iter() {
            if let Some(Node::File { link, .. }) = out.get_mut(name) {
                *link = Some((first.clone(), n));
            }
        }
    }
    out
}

fn scan_into(
    root: &Path,
    path: &Path,
    out: &mut BTreeMap<String, Node>,
    inodes: &mut HashMap<(u64, u64), Vec<String>>,
) {
    let rel = path
        .strip_prefix(root)
        .expect("under the root")
        .to_str()
        .expect("test trees have UTF-8 names")
        .to_owned();
    let md = fs::symlink_metadata(path).unwrap_or_else(|e| panic!("lstat {path:?}: {e}"));
    let ft = md.file_type();
    let mode = md.permissions().mode() & 0o7777;
    if ft.is_dir() {
        out.insert(rel, Node::Dir { mode });
        for e in fs::read_dir(path).unwrap_or_else(|e| panic!("read_dir {path:?}: {e}")) {
            scan_into(root, &e.expect("dir entry").path(), out, inodes);
        }
    } else if ft.is_symlink() {
        let target = fs::read_link(path).expect("readlink");
        out.insert(rel, Node::Symlink { target });
    } else if ft.is_file() {
        let mut f = fs::File::open(path).unwrap_or_else(|e| panic!("open {path:?}: {e}"));
        let mut h = DefaultHasher::new();
        let mut buf = vec![0u8; 1 << 16];
        let mut size = 0u64;
        loop {
            let n = f.read(&mut buf).expect("read");
            if n == 0 {
                break;
            }
            size += n as u64;
            h.write(&buf[..n]);
        }
        // Every file, whatever its link count: the snapshot view reports `nlink` 1 for
        // each name of a hard-link group (by design), and a checkout lower counts the
        // blob cache's own link, so (dev, ino) alone is what tells the groups.
        inodes
            .entry((md.dev(), md.ino()))
            .or_default()
            .push(rel.clone());
        let node = Node::File {
            mode,
            size,
            hash: h.finish(),
            link: None,
        };
        out.insert(rel, node);
    } else {
        out.insert(rel, Node::Other { kind: "special" });
    }
}

/// Asserts that two trees hold the same paths, kinds, modes, contents, symlink targets and
/// hard-link groups, listing the differences.
#[track_caller]
pub fn assert_same_tree(expected: &Path, actual: &Path) {
    let a = scan_tree(expected);
    let b = scan_tree(actual);
    assert_same_listing(
        &a,
        &b,
        &format!("{} vs {}", expected.display(), actual.display()),
    );
}

/// Asserts that two listings of [`scan_tree`] are equal, listing the differences.
#[track_caller]
pub fn assert_same_listing(a: &BTreeMap<String, Node>, b: &BTreeMap<String, Node>, what: &str) {
    if a == b {
        return;
    }
    let mut diffs = Vec::new();
    for (k, v) in a {
        match b.get(k) {
            None => diffs.push(format!("only in expected: {k:?} {v:?}")),
            Some(w) if w != v => diffs.push(format!("differs: {k:?}: {v:?} != {w:?}")),
            _ => {}
        }
    }
    for (k, v) in b {
        if !a.contains_key(k) {
            diffs.push(format!("only in actual: {k:?} {v:?}"));
        }
    }
    let shown = diffs.len().min(30);
    panic!(
        "trees differ ({what}), {} differences:\n{}",
        diffs.len(),
        diffs[..shown].join("\n")
    );
}

/// Writes `content` to `path`, creating parent directories.
pub fn write_file(path: &Path, content: impl AsRef<[u8]>) {
    if let Some(p) = path.parent() {
        fs::create_dir_all(p).unwrap_or_else(|e| panic!("mkdir -p {p:?}: {e}"));
    }
    fs::write(path, content).unwrap_or_else(|e| panic!("write {path:?}: {e}"));
}

/// Sets a path's permission bits.
pub fn chmod(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {path:?}: {e}"));
}

/// Deterministic pseudo-random bytes (xorshift), for contents that compress badly.
pub fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// The entries of a directory, sorted, for "nothing was left behind" checks.
pub fn dir_entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read_dir {dir:?}: {e}"))
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    v.sort();
    v
}
