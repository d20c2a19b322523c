//! POSIX conformance gate: pjdfstest (the `pjdfstest` crate, 0.2.2) against a workspace
//! of every materializer this host can run, beside reference filesystems, compared with
//! `tests/conformance-baseline.json`. See `docs/CONFORMANCE.md`.
//!
//! Targets: `reference-tmpdir` (a plain directory), `reference-overlay` (kernel overlayfs
//! over plain directories), `overlay-native`, `overlay-view` and `overlay-checkout` (cowspace overlay
//! workspaces), and on loop filesystems made and removed here: `reference-btrfs`,
//! `btrfs`, `reference-xfs`, `reflink`, `copy` (the last two on xfs with reflink=1).
//! All of them run by default (about a minute); `COWSPACE_CONFORMANCE_ONLY=a,b` narrows
//! a local run to some targets.
//!
//! The gate: a materializer target that passes fewer tests than its baseline is run once
//! more (the host is shared and noisy) and fails the test if it is still short. The
//! references are not gated: they tell a changed host from a cowspace regression.
//! `COWSPACE_CONFORMANCE_UPDATE=1` rewrites the baseline with what was measured.
//!
//! Needs root, the dummy users of `tests/pjdfstest.toml` and pjdfstest 0.2.2 (`PJDFSTEST`,
//! else `PATH`, else `$CARGO_HOME/bin`). Without them the test says why and passes,
//! except under `CI=true`, where it fails. Everything made is undone also when an
//! assertion fails: workspaces removed, daemons stopped, overlays and loop filesystems
//! unmounted, loop devices detached. pjdfstest's own output is kept in
//! `target/tmp/conformance/<target>.log`.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cowspace_tests::{
    LoopFs, LoopKind, Out, fsd_pids_of, mountctl_bin, mounts_under, run_checked, run_program,
    unmount,
};
use serde_json::{Value, json};

/// The pjdfstest release the baseline was recorded with.
const PJDFSTEST_VERSION: &str = "0.2.2";
/// Longest one pjdfstest run may take (a full run takes seconds).
const RUN_TIMEOUT: Duration = Duration::from_secs(600);

fn ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

fn manifest_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn baseline_path() -> PathBuf {
    manifest_dir().join("conformance-baseline.json")
}

/// Counts of one pjdfstest run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Counts {
    passed: u64,
    failed: u64,
    skipped: u64,
}

/// Failed tests, each with the first line pjdfstest printed about it.
type Failures = Vec<(String, String)>;

/// What one pjdfstest run gave: its counts and the failed tests with their first line of
/// explanation.
#[derive(Debug, Clone)]
struct Run {
    counts: Counts,
    failures: Failures,
    secs: f64,
}

/// What became of one target.
#[derive(Debug)]
enum Outcome {
    /// pjdfstest ran (more than once when the first run was short of the baseline).
    Ran(Vec<Run>),
    /// The host cannot run it (a skip, or a failure under `CI=true`).
    Unavailable(String),
    /// Setting it up or running pjdfstest failed: always a failure.
    Error(String),
}

impl Outcome {
    /// The best of the runs.
    fn best(&self) -> Option<&Run> {
        match self {
            Outcome::Ran(runs) => runs.iter().max_by_key(|r| r.counts.passed),
            _ => None,
        }
    }
}

/// The checked-in baseline: per target, the counts recorded on this kind of host.
#[derive(Debug)]
struct Baseline {
    version: String,
    total: u64,
    materializers: BTreeMap<String, Counts>,
    references: BTreeMap<String, Counts>,
}

fn counts_of(v: &Value) -> Counts {
    let n = |k: &str| {
        v[k].as_u64()
            .unwrap_or_else(|| panic!("baseline entry {v} lacks {k:?}"))
    };
    Counts {
        passed: n("passed"),
        failed: n("failed"),
        skipped: n("skipped"),
    }
}

fn counts_json(c: &Counts) -> Value {
    json!({ "passed": c.passed, "failed": c.failed, "skipped": c.skipped })
}

impl Baseline {
    fn load() -> Baseline {
        let path = baseline_path();
        let text = fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let v: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
        let map = |k: &str| -> BTreeMap<String, Counts> {
            v[k].as_object()
                .unwrap_or_else(|| panic!("{}: no {k:?} object", path.display()))
                .iter()
                .map(|(name, c)| (name.clone(), counts_of(c)))
                .collect()
        };
        Baseline {
            version: v["pjdfstest"].as_str().unwrap_or("").to_owned(),
            total: v["total"].as_u64().unwrap_or(0),
            materializers: map("materializers"),
            references: map("references"),
        }
    }
}

/// Reports that `what` cannot run here: a printed skip, or a panic under `CI=true`.
fn unavailable(what: &str, why: &str) {
    if ci() {
        panic!("conformance: {what} cannot run under CI=true: {why}");
    }
    eprintln!("SKIPPED: conformance: {what}: {why}");
}

fn euid_is_root() -> bool {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2))
        == Some("0")
}

/// The pjdfstest binary: `$PJDFSTEST`, else on `PATH`, else in `$CARGO_HOME/bin`.
fn find_pjdfstest() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PJDFSTEST").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    cowspace_tests::find_program("pjdfstest")
}

/// Whether `getent DB NAME` finds an entry.
fn getent(db: &str, name: &str) -> bool {
    Command::new("getent")
        .args([db, name])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The reasons this host cannot run pjdfstest at all.
fn prerequisites() -> Result<PathBuf, String> {
    if !euid_is_root() {
        return Err("not root: pjdfstest switches users and the workspaces are mounts".into());
    }
    let bin = find_pjdfstest().ok_or_else(|| {
        format!(
            "pjdfstest is not installed: cargo install pjdfstest --version \
             {PJDFSTEST_VERSION} --locked (or set PJDFSTEST)"
        )
    })?;
    let out = Command::new(&bin)
        .arg("--version")
        .output()
        .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
    let version = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if version != format!("pjdfstest {PJDFSTEST_VERSION}") {
        return Err(format!(
            "{} is {version:?}; the baseline was recorded with pjdfstest {PJDFSTEST_VERSION} \
             (cargo install pjdfstest --version {PJDFSTEST_VERSION} --locked)",
            bin.display()
        ));
    }
    for (db, name) in [
        ("passwd", "tests"),
        ("group", "tests"),
        ("passwd", "nobody"),
        ("group", "nogroup"),
    ] {
        if !getent(db, name) {
            return Err(format!(
                "no {db} entry {name:?}: pjdfstest switches to nobody:nogroup and \
                 tests:tests (scripts/setup.sh creates tests)"
            ));
        }
    }
    Ok(bin)
}

fn mkdir_755(p: &Path) {
    fs::create_dir_all(p).unwrap_or_else(|e| panic!("mkdir {}: {e}", p.display()));
    fs::set_permissions(p, fs::Permissions::from_mode(0o755))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", p.display()));
}

/// A mount made here (the reference overlay); unmounted on drop.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        unmount(&self.0);
    }
}

/// A cowspace runtime root driven through `mountctl`. Dropping it removes every
/// workspace it created, stops its daemon (killing it if it does not exit) and detaches
/// whatever is still mounted under it.
struct Root {
    root: PathBuf,
    home: PathBuf,
    created: Vec<String>,
}

impl Root {
    fn init(root: PathBuf, home: &Path) -> Result<Root, String> {
        let me = Root {
            root,
            home: home.to_path_buf(),
            created: Vec::new(),
        };
        me.ok(&["init"])?;
        Ok(me)
    }

    fn mountctl(&self, args: &[&str]) -> Out {
        let all = [OsStr::new("--root"), self.root.as_os_str()]
            .into_iter()
            .chain(args.iter().map(OsStr::new));
        run_program(&mountctl_bin(), all, &[("HOME", self.home.as_os_str())])
    }

    fn ok(&self, args: &[&str]) -> Result<Out, String> {
        let out = self.mountctl(args);
        if out.code != 0 {
            return Err(format!(
                "`{}` exited {}: {}",
                out.cmdline,
                out.code,
                out.stderr.trim()
            ));
        }
        Ok(out)
    }

    /// Imports `src` as the ref `base`.
    fn import(&self, src: &Path) -> Result<(), String> {
        let src = src.to_str().expect("a UTF-8 scratch path");
        self.ok(&["import", src, "--ref", "base"]).map(drop)
    }

    /// `create base ARGS --json`: the workspace's path.
    fn create(&mut self, args: &[&str]) -> Result<PathBuf, String> {
        let mut all = vec!["--json", "create", "base"];
        all.extend_from_slice(args);
        let out = self.ok(&all)?;
        let v: Value = serde_json::from_str(out.stdout.trim())
            .map_err(|e| format!("`{}`: not JSON ({e}): {}", out.cmdline, out.stdout))?;
        if let Some(id) = v["workspace"].as_str() {
            self.created.push(id.to_owned());
        }
        v["path"]
            .as_str()
            .map(PathBuf::from)
            .ok_or_else(|| format!("`{}`: no path in {v}", out.cmdline))
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        for id in self.created.iter().rev() {
            let out = self.mountctl(&["remove", id, "--force"]);
            if out.code != 0 {
                eprintln!(
                    "conformance cleanup: `{}`: {}",
                    out.cmdline,
                    out.stderr.trim()
                );
            }
        }
        let _ = self.mountctl(&["daemon", "stop", "--force"]);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !fsd_pids_of(&self.root).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        for pid in fsd_pids_of(&self.root) {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
        for m in mounts_under(&self.root) {
            unmount(&m);
        }
    }
}

/// Removes ANSI colour sequences (pjdfstest colours its output unless told not to).
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Parses pjdfstest's output: the summary line
/// (`Summary: F failed, S skipped, P passed, E expected failures, T total`) and each
/// `NAME ... FAILED` with the line after it.
fn parse_output(text: &str) -> Option<(Counts, u64, Failures)> {
    let text = strip_ansi(text);
    let lines: Vec<&str> = text.lines().collect();
    let summary = lines.iter().rev().find(|l| l.starts_with("Summary:"))?;
    let mut n: BTreeMap<String, u64> = BTreeMap::new();
    for part in summary.trim_start_matches("Summary:").split(',') {
        let mut w = part.split_whitespace();
        let (Some(num), Some(word)) = (w.next(), w.next()) else {
            continue;
        };
        n.insert(word.to_owned(), num.parse().ok()?);
    }
    let counts = Counts {
        passed: *n.get("passed")?,
        failed: *n.get("failed")?,
        skipped: *n.get("skipped")?,
    };
    let failures = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.trim_end().ends_with(" FAILED"))
        .map(|(i, l)| {
            let name = l.split_whitespace().next().unwrap_or("").to_owned();
            let why = lines.get(i + 1).map(|s| s.trim()).unwrap_or("").to_owned();
            (name, why)
        })
        .collect();
    Some((counts, *n.get("total")?, failures))
}

#[test]
fn parses_pjdfstest_output() {
    let out = "\u{1b}[34mchmod::a\u{1b}[0m    ok\nlink::b          \u{1b}[31mFAILED\u{1b}[0m\n\
               \tcalled `Result::unwrap()` on an `Err` value: EPERM\nBacktrace:\n\n\
               \u{1b}[1;31mSummary\u{1b}[0m: 1 \u{1b}[1;31mfailed\u{1b}[0m, 2 skipped, 3 passed, \
               0 expected failures, 6 total\n";
    let (c, total, f) = parse_output(out).expect("parsed");
    assert_eq!(
        c,
        Counts {
            passed: 3,
            failed: 1,
            skipped: 2
        }
    );
    assert_eq!(total, 6);
    assert_eq!(
        f,
        vec![(
            "link::b".to_owned(),
            "called `Result::unwrap()` on an `Err` value: EPERM".to_owned()
        )]
    );
    assert!(parse_output("no summary").is_none());
}

/// What every target shares: the binary, configuration, scratch space and results.
struct Ctx {
    bin: PathBuf,
    config: PathBuf,
    scratch: PathBuf,
    logs: PathBuf,
    baseline: Baseline,
    only: Option<Vec<String>>,
    results: Vec<(String, Outcome)>,
}

impl Ctx {
    fn wanted(&self, name: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|o| o.iter().any(|n| n == name))
    }

    fn wanted_any(&self, names: &[&str]) -> bool {
        names.iter().any(|n| self.wanted(n))
    }

    /// Runs pjdfstest once in `dir`, through a short symlink: pjdfstest binds UNIX sockets
    /// at `<dir>/.tmpXXXXXX/.tmpXXXXXX/<32 chars>/<32 chars>`, and `sun_path` holds 107
    /// bytes, so `dir` must be short (a workspace path is not).
    fn pjdfstest_once(&self, name: &str, dir: &Path) -> Result<Run, String> {
        let link_dir = tempfile::Builder::new()
            .prefix("cspjd")
            .tempdir_in("/tmp")
            .map_err(|e| format!("a temporary directory in /tmp: {e}"))?;
        fs::set_permissions(link_dir.path(), fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("chmod: {e}"))?;
        let link = link_dir.path().join("w");
        symlink(dir, &link).map_err(|e| format!("symlink {}: {e}", link.display()))?;
        let log_path = self.logs.join(format!("{name}.log"));
        let log = fs::File::create(&log_path)
            .map_err(|e| format!("create {}: {e}", log_path.display()))?;
        let log2 = log.try_clone().map_err(|e| format!("dup: {e}"))?;
        let start = Instant::now();
        let mut child = Command::new(&self.bin)
            .arg("-c")
            .arg(&self.config)
            .arg("-p")
            .arg(&link)
            .env("NO_COLOR", "1")
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", self.bin.display()))?;
        loop {
            match child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if start.elapsed() > RUN_TIMEOUT => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!(
                        "pjdfstest did not finish within {RUN_TIMEOUT:?} (log: {})",
                        log_path.display()
                    ));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(100)),
                Err(e) => return Err(format!("wait for pjdfstest: {e}")),
            }
        }
        let secs = start.elapsed().as_secs_f64();
        let text = fs::read_to_string(&log_path).unwrap_or_default();
        let (counts, total, failures) = parse_output(&text).ok_or_else(|| {
            let tail: Vec<&str> = text.lines().rev().take(20).collect();
            format!(
                "pjdfstest printed no summary (log: {}); its last lines:\n{}",
                log_path.display(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            )
        })?;
        if self.baseline.total != 0 && total != self.baseline.total {
            return Err(format!(
                "pjdfstest ran {total} tests; the baseline has {}: a different pjdfstest \
                 or configuration (log: {})",
                self.baseline.total,
                log_path.display()
            ));
        }
        Ok(Run {
            counts,
            failures,
            secs,
        })
    }

    /// Runs pjdfstest in `dir` for the target `name` and records the outcome; a gated
    /// target short of its baseline is run once more.
    fn measure(&mut self, name: &str, dir: &Path) {
        if !self.wanted(name) {
            return;
        }
        eprintln!("conformance: pjdfstest on {name} ({})", dir.display());
        let mut runs = Vec::new();
        match self.pjdfstest_once(name, dir) {
            Ok(r) => runs.push(r),
            Err(e) => return self.record(name, Outcome::Error(e)),
        }
        if let Some(base) = self.baseline.materializers.get(name)
            && runs[0].counts.passed < base.passed
            && std::env::var_os("COWSPACE_CONFORMANCE_UPDATE").is_none()
        {
            eprintln!(
                "conformance: {name} passed {} < baseline {}; running it once more",
                runs[0].counts.passed, base.passed
            );
            match self.pjdfstest_once(&format!("{name}.rerun"), dir) {
                Ok(r) => runs.push(r),
                Err(e) => return self.record(name, Outcome::Error(e)),
            }
        }
        self.record(name, Outcome::Ran(runs));
    }

    fn record(&mut self, name: &str, outcome: Outcome) {
        self.results.push((name.to_owned(), outcome));
    }

    /// Records `names` (those wanted) as unavailable for `why`.
    fn unavailable(&mut self, names: &[&str], why: &str) {
        for n in names {
            if self.wanted(n) {
                self.record(n, Outcome::Unavailable(why.to_owned()));
            }
        }
    }

    /// Records `names` (those wanted, not measured yet) as failed to set up.
    fn setup_failed(&mut self, names: &[&str], why: &str) {
        for n in names {
            if self.wanted(n) && !self.results.iter().any(|(r, _)| r == n) {
                self.record(n, Outcome::Error(why.to_owned()));
            }
        }
    }
}

/// The snapshot every workspace shows: a file and a directory (mode 0755, so the dummy
/// users reach the workspace root).
fn make_source(dir: &Path) {
    mkdir_755(&dir.join("sub"));
    fs::write(dir.join("README"), "pjdfstest runs in here\n").expect("write README");
    fs::write(dir.join("sub/file"), "x\n").expect("write sub/file");
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755)).expect("chmod source");
}

fn plain_targets(ctx: &mut Ctx) {
    let plain = ctx.scratch.join("plain");
    mkdir_755(&plain);
    ctx.measure("reference-tmpdir", &plain);

    if !ctx.wanted("reference-overlay") {
        return;
    }
    let base = ctx.scratch.join("kernel-overlay");
    for d in ["lower", "upper", "work", "mnt"] {
        mkdir_755(&base.join(d));
    }
    let opts = format!(
        "lowerdir={},upperdir={},workdir={}",
        base.join("lower").display(),
        base.join("upper").display(),
        base.join("work").display()
    );
    let mnt = base.join("mnt");
    match run_checked(
        "mount",
        &[
            OsStr::new("-t"),
            OsStr::new("overlay"),
            OsStr::new("overlay"),
            OsStr::new("-o"),
            OsStr::new(&opts),
            mnt.as_os_str(),
        ],
    ) {
        Ok(_) => {
            let _m = Mounted(mnt.clone());
            ctx.measure("reference-overlay", &mnt);
        }
        Err(e) => ctx.unavailable(&["reference-overlay"], &e),
    }
}

fn overlay_targets(ctx: &mut Ctx, src: &Path) {
    let names = ["overlay-native", "overlay-view", "overlay-checkout"];
    if !ctx.wanted_any(&names) {
        return;
    }
    if !Path::new("/dev/fuse").exists() {
        return ctx.unavailable(&names, "no /dev/fuse (the snapshot view needs FUSE)");
    }
    let fs_list = fs::read_to_string("/proc/filesystems").unwrap_or_default();
    if !fs_list.lines().any(|l| l.trim_end().ends_with("overlay")) {
        return ctx.unavailable(&names, "the kernel has no overlay filesystem");
    }
    let result = (|| -> Result<(), String> {
        let mut root = Root::init(ctx.scratch.join("root"), &ctx.scratch)?;
        root.import(src)?;
        for (name, lower) in [
            ("overlay-native", "native"),
            ("overlay-view", "view"),
            ("overlay-checkout", "checkout"),
        ] {
            if ctx.wanted(name) {
                let ws = root.create(&[
                    "--materializer",
                    "overlay",
                    "--lower",
                    lower,
                    "--name",
                    name,
                ])?;
                ctx.measure(name, &ws);
            }
        }
        Ok(())
    })();
    if let Err(e) = result {
        ctx.setup_failed(&names, &e);
    }
}

/// `fuse`: a workspace the daemon serves itself, in a root on the scratch directory.
fn fuse_target(ctx: &mut Ctx, src: &Path) {
    if !ctx.wanted("fuse") {
        return;
    }
    if !Path::new("/dev/fuse").exists() {
        return ctx.unavailable(&["fuse"], "no /dev/fuse");
    }
    let result = (|| -> Result<(), String> {
        let mut root = Root::init(ctx.scratch.join("root-fuse"), &ctx.scratch)?;
        root.import(src)?;
        let ws = root.create(&["--materializer", "fuse", "--name", "fuse"])?;
        ctx.measure("fuse", &ws);
        Ok(())
    })();
    if let Err(e) = result {
        ctx.setup_failed(&["fuse"], &e);
    }
}

/// `reference-<fs>` and the given materializers on a loop filesystem of `kind`.
fn loop_targets(ctx: &mut Ctx, src: &Path, kind: LoopKind, materializers: &[&str]) {
    let kind_name = kind.name();
    let reference = format!("reference-{kind_name}");
    let mut names = vec![reference.as_str()];
    names.extend_from_slice(materializers);
    if !ctx.wanted_any(&names) {
        return;
    }
    let lfs = match LoopFs::new_in(&ctx.scratch, kind) {
        Ok(f) => f,
        Err(e) => {
            return ctx.unavailable(&names, &format!("a {kind_name} loop filesystem: {e}"));
        }
    };
    let plain = lfs.mnt().join("plain");
    mkdir_755(&plain);
    ctx.measure(&reference, &plain);
    let result = (|| -> Result<(), String> {
        // Dropped (workspaces removed, daemon stopped) before `lfs` is unmounted.
        let mut root = Root::init(lfs.mnt().join("root"), &ctx.scratch)?;
        root.import(src)?;
        for m in materializers {
            if ctx.wanted(m) {
                let ws = root.create(&["--materializer", m, "--name", m])?;
                ctx.measure(m, &ws);
            }
        }
        Ok(())
    })();
    if let Err(e) = result {
        ctx.setup_failed(materializers, &e);
    }
    drop(lfs);
}

/// Writes the measured counts as the new baseline.
fn write_baseline(ctx: &Ctx) {
    let old: Value = fs::read_to_string(baseline_path())
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_else(|| json!({}));
    let mut v = old.clone();
    v["pjdfstest"] = json!(PJDFSTEST_VERSION);
    for (name, outcome) in &ctx.results {
        let Some(run) = outcome.best() else { continue };
        let section = if name.starts_with("reference-") {
            "references"
        } else {
            "materializers"
        };
        v[section][name] = counts_json(&run.counts);
        v["total"] = json!(run.counts.passed + run.counts.failed + run.counts.skipped);
    }
    let text = serde_json::to_string_pretty(&v).expect("JSON") + "\n";
    fs::write(baseline_path(), text).expect("write the baseline");
    eprintln!("conformance: wrote {}", baseline_path().display());
}

#[test]
fn pjdfstest_per_materializer() {
    let bin = match prerequisites() {
        Ok(b) => b,
        Err(why) => return unavailable("pjdfstest", &why),
    };
    let scratch = tempfile::Builder::new()
        .prefix("cowspace-conformance-")
        .tempdir()
        .expect("a temporary directory");
    // The dummy users must reach every directory the targets live in.
    fs::set_permissions(scratch.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
    let logs = Path::new(env!("CARGO_TARGET_TMPDIR")).join("conformance");
    let _ = fs::remove_dir_all(&logs);
    mkdir_755(&logs);
    let only = std::env::var("COWSPACE_CONFORMANCE_ONLY")
        .ok()
        .filter(|s| !s.is_empty())
        .map(|s| s.split(',').map(|n| n.trim().to_owned()).collect());
    let mut ctx = Ctx {
        bin,
        config: manifest_dir().join("pjdfstest.toml"),
        scratch: scratch.path().to_path_buf(),
        logs,
        baseline: Baseline::load(),
        only,
        results: Vec::new(),
    };
    assert_eq!(
        ctx.baseline.version, PJDFSTEST_VERSION,
        "the baseline names another pjdfstest release"
    );
    let src = ctx.scratch.join("src");
    make_source(&src);

    let start = Instant::now();
    plain_targets(&mut ctx);
    overlay_targets(&mut ctx, &src);
    fuse_target(&mut ctx, &src);
    loop_targets(&mut ctx, &src, LoopKind::Btrfs, &["btrfs"]);
    loop_targets(&mut ctx, &src, LoopKind::Xfs, &["reflink", "copy"]);
    let elapsed = start.elapsed().as_secs_f64();

    // The table, then the verdict.
    let mut problems = Vec::new();
    let mut improved = Vec::new();
    eprintln!(
        "\nconformance: pjdfstest {PJDFSTEST_VERSION}, {:.0} s (logs in {})",
        elapsed,
        ctx.logs.display()
    );
    eprintln!(
        "{:<20} {:>6} {:>6} {:>7}   {:>8}  note",
        "target", "passed", "failed", "skipped", "baseline"
    );
    for (name, outcome) in &ctx.results {
        let gated = ctx.baseline.materializers.get(name);
        let base = gated.or_else(|| ctx.baseline.references.get(name));
        let base_s = base.map_or("-".to_owned(), |b| b.passed.to_string());
        match outcome {
            Outcome::Ran(runs) => {
                let best = outcome.best().expect("a run");
                let c = best.counts;
                let mut note = format!("{:.1} s", runs.iter().map(|r| r.secs).sum::<f64>());
                if runs.len() > 1 {
                    note += &format!(
                        ", run twice (passed {})",
                        runs.iter()
                            .map(|r| r.counts.passed.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                }
                eprintln!(
                    "{name:<20} {:>6} {:>6} {:>7}   {base_s:>8}  {note}",
                    c.passed, c.failed, c.skipped
                );
                match (gated, name.starts_with("reference-")) {
                    (Some(b), _) if c.passed < b.passed => {
                        let list = best
                            .failures
                            .iter()
                            .map(|(t, why)| format!("    {t}: {why}"))
                            .collect::<Vec<_>>()
                            .join("\n");
                        problems.push(format!(
                            "{name} passed {} tests, fewer than its baseline {} \
                             (log: {}); its failures:\n{list}",
                            c.passed,
                            b.passed,
                            ctx.logs.join(format!("{name}.log")).display()
                        ));
                    }
                    (Some(b), _) if c.passed > b.passed => improved.push(name.clone()),
                    (None, false) => problems.push(format!(
                        "{name} has no baseline in {}",
                        baseline_path().display()
                    )),
                    _ => {}
                }
            }
            Outcome::Unavailable(why) => {
                eprintln!(
                    "{name:<20} {:>6} {:>6} {:>7}   {base_s:>8}  skipped: {why}",
                    "-", "-", "-"
                );
                if ci() {
                    problems.push(format!("{name} cannot run under CI=true: {why}"));
                }
            }
            Outcome::Error(why) => {
                eprintln!(
                    "{name:<20} {:>6} {:>6} {:>7}   {base_s:>8}  ERROR",
                    "-", "-", "-"
                );
                problems.push(format!("{name}: {why}"));
            }
        }
    }
    // References that fell too: the host changed, not (only) cowspace.
    for (name, outcome) in &ctx.results {
        if let (Some(run), Some(b)) = (outcome.best(), ctx.baseline.references.get(name))
            && run.counts.passed < b.passed
        {
            eprintln!(
                "note: the reference {name} passed {} < {}: the host or pjdfstest changed",
                run.counts.passed, b.passed
            );
        }
    }
    let _ = fs::write(
        ctx.logs.join("results.json"),
        serde_json::to_string_pretty(&Value::Object(
            ctx.results
                .iter()
                .filter_map(|(n, o)| o.best().map(|r| (n.clone(), counts_json(&r.counts))))
                .collect(),
        ))
        .expect("JSON"),
    );
    if std::env::var_os("COWSPACE_CONFORMANCE_UPDATE").is_some() {
        write_baseline(&ctx);
        return;
    }
    if !improved.is_empty() {
        eprintln!(
            "note: {} passed more than the baseline: raise it \
             (COWSPACE_CONFORMANCE_UPDATE=1) so the gain is kept",
            improved.join(", ")
        );
    }
    drop(scratch);
    assert!(
        problems.is_empty(),
        "POSIX conformance fell (docs/CONFORMANCE.md):\n{}",
        problems.join("\n")
    );
}
