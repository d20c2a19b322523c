//! Bad input to the workspace commands: each is refused with its exit code, kind and a
//! message naming the cause, and nothing is made — the registry (`list --all`), the
//! directories under `<root>/workspaces/` and the mount table are as before.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::base_tree;
use super::support::{KillOnDrop, WsRoot, require_root};

/// What "nothing was made" compares: the registry without `updated_at` (a refused
/// removal may touch it), the workspace directories and the mounts.
#[derive(Debug, PartialEq)]
struct State {
    records: Value,
    dirs: Vec<String>,
    mounts: Vec<PathBuf>,
}

fn state(r: &WsRoot) -> State {
    let mut records = r.list_all();
    if let Some(a) = records.as_array_mut() {
        for rec in a {
            if let Some(o) = rec.as_object_mut() {
                o.remove("updated_at");
            }
        }
    }
    State {
        records,
        dirs: r.ws_dirs(),
        mounts: r.mounts(),
    }
}

/// Runs `args` (with `--json`), asserts the refusal and that nothing changed; gives the
/// error object.
#[track_caller]
fn refused(r: &WsRoot, args: &[&str], code: i32, kind: &str) -> Value {
    let before = state(r);
    let err = r.t.json(args).error(code, kind);
    let after = state(r);
    assert_eq!(before, after, "`{}` changed something", args.join(" "));
    err
}

fn msg(err: &Value) -> String {
    format!(
        "{} {}",
        err["message"].as_str().unwrap_or(""),
        err["hint"].as_str().unwrap_or("")
    )
}

fn setup() -> (WsRoot, String) {
    let r = WsRoot::new();
    let src = r.t.path("src");
    base_tree(&src);
    let base = r.import(&src, &[]);
    (r, base)
}

#[test]
fn create_refuses_unknown_snapshots_taken_names_existing_paths_and_bad_materializers() {
    require_root!();
    let (r, base) = setup();
    let ws = r.create(&base, &["--name", "taken"]);

    let unknown = "ab".repeat(32);
    let e = refused(&r, &["create", &unknown], 3, "not_found");
    assert!(msg(&e).contains(&unknown[..12]), "{e}");
    let e = refused(&r, &["create", "no/such-ref"], 3, "not_found");
    assert!(msg(&e).contains("no/such-ref"), "{e}");

    let e = refused(&r, &["create", &base, "--name", "taken"], 4, "exists");
    assert!(msg(&e).contains("taken"), "{e}");
    // The same, through the view lower (the daemon's start must not leave anything).
    refused(
        &r,
        &["create", &base, "--name", "taken", "--lower", "view"],
        4,
        "exists",
    );

    let existing = r.t.path("already-here");
    std::fs::create_dir(&existing).unwrap();
    std::fs::write(existing.join("mine.txt"), "keep me\n").unwrap();
    let e = refused(
        &r,
        &["create", &base, "--path", existing.to_str().unwrap()],
        4,
        "exists",
    );
    assert!(msg(&e).contains("already-here"), "{e}");
    assert_eq!(
        std::fs::read_to_string(existing.join("mine.txt")).unwrap(),
        "keep me\n",
        "the user's directory is untouched"
    );
    let file = r.t.path("a-file");
    std::fs::write(&file, "x").unwrap();
    refused(
        &r,
        &["create", &base, "--path", file.to_str().unwrap()],
        4,
        "exists",
    );

    let e = refused(
        &r,
        &["create", &base, "--materializer", "bogus"],
        9,
        "invalid_input",
    );
    for choice in ["auto", "overlay", "fuse", "btrfs", "reflink", "copy", "nfs"] {
        assert!(msg(&e).contains(choice), "the choices are listed: {e}");
    }
    let e = refused(
        &r,
        &["create", &base, "--materializer", "btrfs"],
        7,
        "unsupported",
    );
    let m = msg(&e);
    assert!(m.contains("btrfs") && m.len() > 40, "says why: {e}");
    eprintln!("--materializer btrfs: {m}");

    // nfs: refused where the kernel has no NFS client (this kind of host), saying so;
    // doctor says the same; never replaced by another materializer.
    let has_client = std::fs::read_to_string("/proc/filesystems")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().last() == Some("nfs"))
        || std::path::Path::new("/lib/modules")
            .join(
                std::fs::read_to_string("/proc/sys/kernel/osrelease")
                    .unwrap_or_default()
                    .trim(),
            )
            .join("kernel/fs/nfs")
            .exists();
    if has_client {
        eprintln!("nfs refusal not checked: this host's kernel has an NFS client");
    } else {
        let e = refused(
            &r,
            &["create", &base, "--materializer", "nfs"],
            7,
            "unsupported",
        );
        let m = msg(&e);
        assert!(
            m.contains("no NFS client") && m.contains("--materializer fuse"),
            "{e}"
        );
        let doctor = r.t.json(["doctor"]).ok().json();
        let row = doctor["materializers"]
            .as_array()
            .and_then(|rows| rows.iter().find(|x| x["materializer"] == "nfs"))
            .unwrap_or_else(|| panic!("doctor has no nfs row: {doctor}"))
            .clone();
        assert_eq!(row["available"], false, "{row}");
        assert!(
            row["why"].as_str().unwrap_or("").contains("no NFS client"),
            "{row}"
        );
        assert_ne!(doctor["auto"], "nfs");
    }

    r.remove(&ws.id);
    r.assert_clean();
}

#[test]
fn create_refuses_a_path_inside_another_workspace_or_inside_the_runtime_root() {
    require_root!();
    let (r, base) = setup();
    let outer_at = r.t.path("outer");
    let outer = r.create(
        &base,
        &["--name", "outer", "--path", outer_at.to_str().unwrap()],
    );
    let default_ws = r.create(&base, &[]);
    let inside_outer = outer.path.join("src/inner");
    let inside_default = default_ws.path.join("inner");
    for (at, names) in [
        (&inside_outer, vec![outer.id.as_str(), "outer"]),
        (&inside_default, vec![]),
    ] {
        let e = refused(
            &r,
            &["create", &base, "--path", at.to_str().unwrap()],
            9,
            "invalid_input",
        );
        for n in names {
            assert!(msg(&e).contains(n), "names the workspace: {e}");
        }
        assert!(!at.exists(), "nothing made at {}", at.display());
    }
    let in_root = r.root().join("mine");
    let e = refused(
        &r,
        &["create", &base, "--path", in_root.to_str().unwrap()],
        9,
        "invalid_input",
    );
    assert!(
        msg(&e).contains("runtime root") && msg(&e).contains(&r.root().display().to_string()),
        "names the root: {e}"
    );
    assert!(!in_root.exists());
    r.remove(&outer.id);
    r.remove(&default_ws.id);
    r.assert_clean();
}

#[test]
fn remove_twice_and_ids_from_another_root_are_not_found() {
    require_root!();
    let (r, base) = setup();
    let other = WsRoot::new();
    let ws = r.create(&base, &[]);
    let gone = r.create(&base, &["--name", "short-lived"]);
    r.remove(&gone.id);

    let e = refused(&r, &["remove", &gone.id], 3, "not_found");
    assert!(msg(&e).contains(&gone.id), "{e}");
    refused(&r, &["remove", "short-lived"], 3, "not_found");

    // The live workspace of `r`, named in another root.
    for args in [
        vec!["status", ws.id.as_str()],
        vec!["remove", ws.id.as_str()],
        vec!["remove", "--force", ws.id.as_str()],
        vec!["diff", ws.id.as_str()],
        vec!["commit", ws.id.as_str()],
        vec!["recover", ws.id.as_str()],
    ] {
        let e = refused(&other, &args, 3, "not_found");
        assert!(msg(&e).contains(&ws.id), "{e}");
    }
    assert!(ws.path.is_dir(), "still there");
    assert_eq!(r.status(&ws.id)["status"], "active");

    r.remove(&ws.id);
    r.assert_clean();
    other.assert_clean();
}

#[test]
fn remove_of_a_busy_workspace_is_refused_and_force_ends_the_user() {
    require_root!();
    let (r, base) = setup();
    let ws = r.create(&base, &[]);
    let mut sleeper = KillOnDrop(
        Command::new("sleep")
            .arg("1000")
            .current_dir(&ws.path)
            .stdin(Stdio::null())
            .spawn()
            .expect("start sleep"),
    );
    let pid = sleeper.0.id();
    let e = refused(&r, &["remove", &ws.id], 5, "busy");
    assert!(msg(&e).contains(&pid.to_string()), "names the process: {e}");
    assert!(
        sleeper.0.try_wait().unwrap().is_none(),
        "the user still runs"
    );
    assert_eq!(r.status(&ws.id)["status"], "active");

    r.t.json(["remove", "--force", &ws.id]).ok();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = sleeper.0.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let status = status.expect("remove --force ended the process using the workspace");
    assert!(!status.success(), "killed, not finished: {status}");
    assert!(!ws.path.exists());
    r.assert_clean();
}

#[test]
fn daemon_stop_is_refused_while_it_serves_a_workspace_and_names_it() {
    require_root!();
    let (r, base) = setup();
    let ws = r.create(&base, &["--materializer", "overlay", "--lower", "view"]);
    let e = refused(&r, &["daemon", "stop"], 5, "busy");
    assert!(
        e["message"].as_str().unwrap_or("").contains(&ws.id),
        "names the workspace: {e}"
    );
    assert!(msg(&e).contains("mountctl remove"), "says what to do: {e}");
    assert_eq!(r.status(&ws.id)["status"], "active");
    assert!(
        std::fs::read_dir(&ws.path).unwrap().count() > 0,
        "its lower is still served"
    );
    r.remove(&ws.id);
    r.t.json(["daemon", "stop"]).ok();
    r.assert_clean();
}

#[test]
fn commit_with_a_wrong_expect_is_a_conflict_and_leaves_the_ref() {
    require_root!();
    let (r, base) = setup();
    let ws = r.create(&base, &[]);
    std::fs::write(ws.path.join("one.txt"), "1\n").unwrap();
    let (first, _, _) = r.commit(&ws.id, &["--ref", "team/main"]);
    assert_eq!(r.t.refs()["team/main"], first);
    std::fs::write(ws.path.join("two.txt"), "2\n").unwrap();

    let e = refused(
        &r,
        &["commit", &ws.id, "--ref", "team/main", "--expect", &base],
        6,
        "conflict",
    );
    assert!(msg(&e).contains(&first), "names where the ref is: {e}");
    assert_eq!(r.t.refs()["team/main"], first, "the ref did not move");
    assert_eq!(r.status(&ws.id)["commits"], serde_json::json!([first]));

    // With the right expectation it moves.
    let (second, _, _) = r.commit(&ws.id, &["--ref", "team/main", "--expect", &first]);
    assert_eq!(r.t.refs()["team/main"], second);
    r.remove(&ws.id);
    r.assert_clean();
}

/// One rule for names: a name `create` accepts is one a sandbox can use, by name; a
/// name that could read as an option, or too long for a hostname, is refused before
/// anything is made.
#[test]
fn names_create_accepts_are_names_a_sandbox_takes() {
    require_root!();
    let (r, base) = setup();
    let long = "n".repeat(64);
    for bad in [
        "-y",
        "--json",
        "_x",
        ".hidden",
        "ws-1234",
        long.as_str(),
        "a b",
        "é",
    ] {
        let e = refused(
            &r,
            &["create", &base, &format!("--name={bad}")],
            9,
            "invalid_input",
        );
        assert!(msg(&e).contains("letters, digits"), "{bad}: {e}");
    }
    let ok = "a".repeat(63);
    r.create(&base, &["--name", &ok]);
    let out = r.t.run(["run", &ok, "--", "hostname"]).ok();
    assert_eq!(out.stdout.trim(), ok, "the sandbox runs by that name");
}

/// `-q remove` prints nothing ("removed …" is a confirmation, not a result).
#[test]
fn quiet_remove_prints_nothing() {
    require_root!();
    let r = WsRoot::new();
    let src = r.t.path("src");
    base_tree(&src);
    let snap = r.import(&src, &[]);
    let ws = r.create(&snap, &[]);
    let out = r.t.run(["-q", "remove", ws.id.as_str()]).ok();
    assert_eq!(
        (out.stdout.as_str(), out.stderr.as_str()),
        ("", ""),
        "-q remove"
    );
    r.assert_clean();
}

#[test]
fn stopping_no_sandbox_and_recovering_a_mounted_workspace_say_there_was_nothing_to_do() {
    require_root!();
    let r = WsRoot::new();
    let src = r.t.path("src");
    base_tree(&src);
    let base = r.import(&src, &[]);
    let ws = r.create(&base, &[]);
    let v = r.t.json(["sandbox", "stop", &ws.id]).ok().json();
    assert_eq!(
        (&v["stopped"], &v["was_running"], &v["workspace"]),
        (
            &Value::Bool(false),
            &Value::Bool(false),
            &Value::from(ws.id.as_str())
        ),
        "{v}"
    );
    let out = r.t.run(["sandbox", "stop", &ws.id]).ok();
    assert!(out.stdout.contains("no sandbox was running"), "{out:?}");
    let v = r.t.json(["recover", &ws.id]).ok().json();
    assert_eq!(v["recovered"], false, "{v}");
    let out = r.t.run(["recover", &ws.id]).ok();
    assert!(out.stdout.contains("nothing to recover"), "{out:?}");
    assert!(
        !r.status(&ws.id)["diagnostics"]
            .to_string()
            .contains("recovered"),
        "nothing recorded"
    );
    r.remove(&ws.id);
}
