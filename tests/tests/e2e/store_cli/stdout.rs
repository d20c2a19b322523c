//! What goes to stdout: a reader that stops early (`| head`) ends a command quietly,
//! `export --tar -` is the archive itself, and `--json` is answered or refused, never
//! silently ignored.

use std::io::Read;
use std::process::Stdio;

use cowspace_tests::{TestRoot, assert_same_tree};

use super::rich_tree;

/// Runs `mountctl args` with a stdout whose reader is gone before the first write (what
/// `| head` leaves once head has its lines): gives the exit code and stderr.
fn into_a_closed_pipe(r: &TestRoot, args: &[&str]) -> (i32, String) {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = r
        .command(args)
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_reader_gone_early_ends_a_command_quietly() {
    let r = TestRoot::new();
    let src = r.path("src");
    rich_tree(&src);
    r.import(&src, &["--ref", "rich"]);
    for args in [
        &["completions", "bash"][..],
        &["export", "rich", "--tar", "-"],
        &["snapshots"],
        &["--json", "show", "rich"],
    ] {
        let (code, stderr) = into_a_closed_pipe(&r, args);
        assert_eq!(code, 0, "{args:?}: {stderr}");
        assert!(
            !stderr.contains("panicked") && !stderr.contains("Broken pipe"),
            "{args:?}: {stderr}"
        );
    }
}

#[test]
fn export_tar_to_dash_writes_the_archive_on_stdout() {
    let r = TestRoot::new();
    let src = r.path("src");
    rich_tree(&src);
    let snap = r.import(&src, &["--ref", "rich"])["snapshot"]
        .as_str()
        .unwrap()
        .to_string();
    let dest = r.path("out");
    std::fs::create_dir(&dest).unwrap();
    // `tar -x` reads the archive from mountctl's stdout.
    let mut export = r
        .command(["export", "rich", "--tar", "-"])
        .current_dir(&dest)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let archive = export.stdout.take().unwrap();
    let tar = std::process::Command::new("tar")
        .args(["-xpf", "-", "-C"])
        .arg(&dest)
        .stdin(archive)
        .status()
        .unwrap();
    let mut stderr = String::new();
    export
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(export.wait().unwrap().success(), "{stderr}");
    assert!(tar.success());
    assert_same_tree(&src, &dest);
    // Said on stderr; no file named `-` beside it.
    assert!(
        stderr.contains(&format!("exported {} to stdout", &snap[..12])),
        "{stderr}"
    );
    assert!(!dest.join("-").exists());

    // A directory cannot be stdout, and a JSON object cannot share it with the archive.
    let err = r.json(["export", "rich", "-"]).error(9, "invalid_input");
    assert!(err["message"].as_str().unwrap().contains("--tar"), "{err}");
    let err = r
        .json(["export", "rich", "--tar", "-"])
        .error(9, "invalid_input");
    assert!(err["message"].as_str().unwrap().contains("--json"), "{err}");
    assert!(!r.scratch().join("-").exists());
}

#[test]
fn json_is_answered_or_refused_never_ignored() {
    let r = TestRoot::new();
    let v = r.json(["--version"]).ok().json();
    let text = r.run(["--version"]).ok().stdout;
    assert_eq!(
        text.trim(),
        format!("mountctl {}", v["version"].as_str().unwrap()),
        "{v}"
    );
    for args in [&["completions", "bash"][..], &["man-pages", "/nonexistent"]] {
        let err = r.json(args).error(2, "usage");
        assert!(
            err["message"]
                .as_str()
                .unwrap()
                .contains("--json does not apply"),
            "{args:?}: {err}"
        );
    }
    // Without --json, the script as before.
    let out = r.run(["completions", "bash"]).ok();
    assert!(out.stdout.starts_with("_mountctl()"), "{}", out.stdout);
    // `run` and `exec` say in their help what --json does there.
    for cmd in ["run", "exec"] {
        let out = r.run([cmd, "--help"]).ok();
        assert!(
            out.stdout
                .contains("With --json, a refusal is a JSON error"),
            "{cmd}: {}",
            out.stdout
        );
    }
}
