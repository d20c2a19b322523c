//! The installable clients (`clients/python`, `clients/typescript`) against a real
//! daemon: each package's own test suite runs with a fresh runtime root whose daemon
//! runs, and covers the seed-000 chain end to end in its language (import with
//! progress, create, a sandbox with a published port and a read-only dependency cache,
//! exec of an install and of tests, a background server reached through its published
//! port, a port published later, commit, remove), the features of exec (streams,
//! callbacks, iterators, stdin, signals, a timeout, a pseudo-terminal), the files
//! operations while a sandbox runs (written by the client and read from inside, owned
//! by root there; listings; a `..` path refused; rename, symlink, remove; ranges and
//! appends), a watch seeing a file made inside and one the client wrote, a fork showing
//! its parent's change, a pause refusing exec as busy then a resume, and the error
//! paths (a missing workspace, an exec with no sandbox, an unknown argument key,
//! another protocol version). Afterwards nothing of the root may be left: no mount, no
//! workspace directory, no daemon.
//!
//! The suites get the root as `COWSPACE_TEST_ROOT`, a scratch directory as
//! `COWSPACE_TEST_TMP` and the `mountctl` binary as `COWSPACE_MOUNTCTL` (the Node client
//! runs `mountctl exec`). Needs `python3`, and `node` (>= 20) for the Node client
//! (`scripts/setup.sh` installs Debian's `nodejs`); the declarations are typechecked
//! with `tsc` when `npm install` was run in `clients/typescript`.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use cowspace_tests::{Out, find_program, mountctl_bin, program_command};

use super::support::{WsRoot, require_root};

fn clients_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../clients")
}

/// Runs a client's test suite against the daemon of `r` (in `dir`, with `env` too),
/// tracking every workspace id it prints so that the root's guard removes what a
/// failing suite left.
fn run_suite(r: &WsRoot, program: &Path, args: &[&str], dir: &Path, env: &[(&str, &OsStr)]) -> Out {
    let tmp = r.t.path("client-tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let mountctl = mountctl_bin();
    let mut all: Vec<(&str, &OsStr)> = vec![
        ("COWSPACE_TEST_ROOT", r.root().as_os_str()),
        ("COWSPACE_TEST_TMP", tmp.as_os_str()),
        ("COWSPACE_MOUNTCTL", mountctl.as_os_str()),
        ("HOME", r.t.scratch().as_os_str()),
    ];
    all.extend_from_slice(env);
    let cmdline = format!("{} {}", program.display(), args.join(" "));
    let out = program_command(program, args, &all)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot start `{cmdline}`: {e}"));
    let out = Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        cmdline,
    };
    for id in workspace_ids(&format!("{}\n{}", out.stdout, out.stderr)) {
        r.track(&id);
    }
    out
}

/// The workspace ids (`ws-` and 16 hex digits) in a suite's output.
fn workspace_ids(text: &str) -> Vec<String> {
    let mut ids = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("ws-") {
        let cand = &rest[i..];
        let hex = cand[3..]
            .chars()
            .take_while(char::is_ascii_hexdigit)
            .count();
        if hex == 16 && !ids.iter().any(|x: &String| x == &cand[..19]) {
            ids.push(cand[..19].to_string());
        }
        rest = &rest[i + 3..];
    }
    ids
}

/// `node` on `PATH`, if it is Node 20 or later.
fn node_20() -> Result<PathBuf, String> {
    let node = find_program("node")
        .ok_or("no `node` on PATH: the Node client needs Node >= 20 (scripts/setup.sh)")?;
    let out = std::process::Command::new(&node)
        .args(["-p", "process.versions.node"])
        .output()
        .map_err(|e| format!("{}: {e}", node.display()))?;
    let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let major: u32 = version
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    if major < 20 {
        return Err(format!(
            "node {version} is older than 20, which the Node client needs (scripts/setup.sh)"
        ));
    }
    Ok(node)
}

/// A root with its daemon running.
fn root_with_daemon() -> WsRoot {
    let r = WsRoot::new();
    r.t.json(["daemon", "start"]).ok();
    r
}

#[test]
fn python_client_runs_the_seed_chain_and_the_error_paths() {
    require_root!();
    let python = find_program("python3").expect("python3 on PATH");
    let pkg = clients_dir().join("python");
    let r = root_with_daemon();
    let src = pkg.join("src");
    let out = run_suite(
        &r,
        &python,
        &["-m", "unittest", "-v"],
        &pkg.join("tests"),
        &[
            ("PYTHONPATH", src.as_os_str()),
            ("PYTHONDONTWRITEBYTECODE", OsStr::new("1")),
        ],
    );
    let report = format!("stdout: {}\nstderr: {}", out.stdout, out.stderr);
    assert_eq!(out.code, 0, "the Python suite failed\n{report}");
    assert!(out.stderr.contains("\nOK"), "{report}");
    assert!(
        !out.stderr.contains("skipped"),
        "a test of the suite was skipped\n{report}"
    );
    for name in [
        "test_seed_chain_sync",
        "test_seed_chain_async",
        "test_exec_without_sandbox_and_bad_arguments",
        "test_files_watch_fork_pause_sync",
        "test_files_watch_fork_pause_async",
        "test_other_protocol_is_refused_naming_both",
    ] {
        assert!(out.stderr.contains(name), "{name} did not run\n{report}");
    }
    assert_eq!(r.t.json(["list"]).ok().json(), serde_json::json!([]));
    r.assert_clean();
}

#[test]
fn typescript_client_runs_the_seed_chain_and_the_error_paths() {
    require_root!();
    let node = match node_20() {
        Ok(node) => node,
        Err(why) => {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("{why}");
            }
            eprintln!("SKIPPED: {why}");
            return;
        }
    };
    let pkg = clients_dir().join("typescript");
    // The hand-written declarations against a use of the API, when tsc is installed.
    let tsc = pkg.join("node_modules/.bin/tsc");
    if tsc.is_file() {
        let out = program_command(&tsc, &["-p", "tsconfig.json"], &[])
            .current_dir(&pkg)
            .output()
            .expect("run tsc");
        assert!(
            out.status.success(),
            "tsc: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    } else {
        eprintln!(
            "typecheck skipped: no {} (run `npm install` in clients/typescript)",
            tsc.display()
        );
    }
    let r = root_with_daemon();
    let out = run_suite(&r, &node, &["--test", "test/"], &pkg, &[]);
    let report = format!("stdout: {}\nstderr: {}", out.stdout, out.stderr);
    assert_eq!(out.code, 0, "the Node suite failed\n{report}");
    assert!(out.stdout.contains("# fail 0"), "{report}");
    assert!(out.stdout.contains("# skipped 0"), "{report}");
    assert!(out.stdout.contains("# pass 4"), "{report}");
    assert_eq!(r.t.json(["list"]).ok().json(), serde_json::json!([]));
    r.assert_clean();
}

#[test]
fn workspace_ids_are_found_once_each() {
    let text =
        "# {\"workspace\":\"ws-0123456789abcdef\"}\nws-0123456789abcdef ws-12 ws-fedcba9876543210x";
    assert_eq!(
        workspace_ids(text),
        vec!["ws-0123456789abcdef", "ws-fedcba9876543210"]
    );
}
