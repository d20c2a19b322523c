//! The text people read (without `--json`): dates instead of Unix seconds, no JSON
//! fragments among columns, the effective default of an unset setting, what `doctor`
//! finds of the namespace sandbox, and where a ref was before an import moved it.

use super::base_tree;
use super::support::{WsRoot, require_root};

/// Today as `status`, `show` and `snapshots` print it (`2026-12-06`); the test runs in a
/// second, so a date read just before and just after brackets what was printed.
fn today() -> [String; 2] {
    let day = || {
        let out = std::process::Command::new("date")
            .args(["-u", "+%Y-%m-%d"])
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    [day(), day()]
}

fn has_date(text: &str, days: &[String; 2]) -> bool {
    days.iter().any(|d| text.contains(&format!("{d} "))) && text.contains(" UTC")
}

#[test]
fn text_output_is_for_people() {
    require_root!();
    let days = today();
    let r = WsRoot::new();
    let src = r.t.path("src");
    base_tree(&src);
    let snap = r.import(&src, &["--ref", "t/main"]);
    let created_at = r.t.json(["show", &snap]).ok().json()["meta"]["created_at"]
        .as_i64()
        .unwrap();

    // `show`, `snapshots`: a date, not the seconds; the source in words.
    let show = r.t.run(["show", &snap]).ok().stdout;
    assert!(has_date(&show, &days), "{show}");
    assert!(!show.contains(&created_at.to_string()), "{show}");
    assert!(show.contains("source   directory "), "{show}");
    let list = r.t.run(["snapshots"]).ok().stdout;
    assert!(has_date(&list, &days), "{list}");

    // An import over an existing ref says where the ref was; a new ref says so.
    std::fs::write(src.join("README.md"), "# changed\n").unwrap();
    let out =
        r.t.run(["import", src.to_str().unwrap(), "--ref", "t/main"])
            .ok();
    assert!(
        out.stderr.contains(&format!("(was {})", &snap[..12])),
        "{}",
        out.stderr
    );
    let out =
        r.t.run(["import", src.to_str().unwrap(), "--ref", "t/other"])
            .ok();
    assert!(out.stderr.contains("(a new ref)"), "{}", out.stderr);

    // `status`: the creation date.
    let ws = r.create(&snap, &["--name", "texts"]);
    let status = r.t.run(["status", "texts"]).ok().stdout;
    let line = status.lines().find(|l| l.starts_with("created")).unwrap();
    assert!(has_date(line, &days), "{status}");

    // `sandbox status`: words and numbers, no JSON object or quoted string.
    r.t.json([
        "sandbox", "start", "texts", "--memory", "64m", "--pids", "100",
    ])
    .ok();
    let text = r.t.run(["sandbox", "status", "texts"]).ok().stdout;
    assert!(!text.contains('{') && !text.contains('"'), "{text}");
    assert!(text.contains("memory 64.0 MiB, pids 100"), "{text}");
    assert!(has_date(&text, &days), "{text}");
    r.t.json(["sandbox", "stop", "texts"]).ok();

    // `config`: an unset setting shows what applies, not `-`.
    let config = r.t.run(["config"]).ok().stdout;
    let memory = config
        .lines()
        .find(|l| l.starts_with("sandbox.memory"))
        .unwrap();
    assert!(memory.contains("no limit"), "{config}");
    let v = r.t.json(["config"]).ok().json();
    let row = v["settings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["key"] == "sandbox.memory")
        .unwrap()
        .clone();
    assert!(
        row["value"].is_null() && row["default"] == "no limit",
        "{row}"
    );

    // `doctor`: the namespace sandbox's controls, as the helper's probe finds them.
    let v = r.t.json(["doctor"]).ok().json();
    let controls = v["sandbox"]["controls"].as_array().unwrap();
    assert!(
        controls
            .iter()
            .any(|c| c["control"].as_str().unwrap().contains("namespaces")),
        "{v}"
    );
    let text = r.t.run(["doctor"]).ok().stdout;
    assert!(text.contains("sandbox  namespaces"), "{text}");
    assert!(
        text.contains("memory limit (cgroup memory controller)"),
        "{text}"
    );

    r.remove(&ws.id);
}
