//! 32 workspaces of one snapshot, created from 8 threads at once (each running
//! `mountctl`), written in parallel: each sees only its own changes, and their commits
//! are 32 distinct snapshots holding exactly those changes.

use std::collections::BTreeSet;

use serde_json::Value;

use super::base_tree;
use super::support::{Ws, WsRoot, require_root};

const THREADS: usize = 8;
const PER_THREAD: usize = 4;
const N: usize = THREADS * PER_THREAD;

/// The changes of workspace `i`: a marker file, an edit of a base file every workspace
/// edits, and a deleted base file.
fn write_own(ws: &Ws, i: usize) {
    std::fs::write(
        ws.path.join(format!("marker-{i}.txt")),
        format!("marker {i}\n"),
    )
    .unwrap();
    std::fs::write(ws.path.join("data/log.txt"), format!("edited by {i}\n")).unwrap();
    std::fs::remove_file(ws.path.join("src/gen/one.txt")).unwrap();
}

/// `(path, change)` pairs of a diff's JSON, sorted.
fn changes(v: &Value) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = v["changes"]
        .as_array()
        .unwrap_or_else(|| panic!("no changes array in {v}"))
        .iter()
        .map(|c| {
            (
                c["path"].as_str().unwrap_or("").to_owned(),
                c["change"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    out.sort();
    out
}

fn expected_changes(i: usize) -> Vec<(String, String)> {
    let mut v = vec![
        ("data/log.txt".to_owned(), "modified".to_owned()),
        (format!("marker-{i}.txt"), "added".to_owned()),
        ("src/gen/one.txt".to_owned(), "deleted".to_owned()),
    ];
    v.sort();
    v
}

#[test]
fn thirty_two_workspaces_written_in_parallel_see_only_their_own_changes() {
    require_root!();
    let r = WsRoot::new();
    let src = r.t.path("src");
    base_tree(&src);
    let base = r.import(&src, &[]);

    // Created from 8 threads at once; every fourth on the daemon's view.
    let mut wss: Vec<(usize, Ws)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (r, base) = (&r, &base);
                s.spawn(move || {
                    (0..PER_THREAD)
                        .map(|k| {
                            let i = t * PER_THREAD + k;
                            let lower = if i.is_multiple_of(4) {
                                "view"
                            } else {
                                "checkout"
                            };
                            let name = format!("worker-{i}");
                            let ws = r.create(
                                base,
                                &["--lower", lower, "--name", &name, "--worker", &name],
                            );
                            (i, ws)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a creating thread panicked"))
            .collect()
    });
    wss.sort_by_key(|(i, _)| *i);
    let ms: Vec<f64> = wss
        .iter()
        .map(|(_, w)| w.json["elapsed_ms"].as_f64().unwrap_or(-1.0))
        .collect();
    eprintln!("32 parallel creates, ms each: {ms:.1?}");
    let live = r.t.json(["list"]).ok().json();
    assert_eq!(live.as_array().map(Vec::len), Some(N), "{live}");
    let paths: BTreeSet<_> = wss.iter().map(|(_, w)| w.path.clone()).collect();
    assert_eq!(paths.len(), N, "32 distinct paths");
    assert_eq!(
        r.fsd_pids().len(),
        1,
        "one daemon for the 8 view workspaces"
    );

    // Written in parallel.
    std::thread::scope(|s| {
        for chunk in wss.chunks(PER_THREAD) {
            s.spawn(move || {
                for (i, ws) in chunk {
                    write_own(ws, *i);
                }
            });
        }
    });

    // Each sees only its own changes.
    for (i, ws) in &wss {
        let markers: Vec<String> = cowspace_tests::dir_entries(&ws.path)
            .into_iter()
            .filter(|n| n.starts_with("marker-"))
            .collect();
        assert_eq!(markers, vec![format!("marker-{i}.txt")], "workspace {i}");
        assert_eq!(
            std::fs::read_to_string(ws.path.join("data/log.txt")).unwrap(),
            format!("edited by {i}\n"),
            "workspace {i}"
        );
        assert!(!ws.path.join("src/gen/one.txt").exists(), "workspace {i}");
        assert_eq!(
            std::fs::read_to_string(ws.path.join("src/gen/two.txt")).unwrap(),
            "generated two\n"
        );
        let d = r.t.json(["diff", &ws.id]).ok().json();
        assert_eq!(
            changes(&d),
            expected_changes(*i),
            "diff of workspace {i}: {d}"
        );
    }

    // Committed in parallel: 32 distinct snapshots.
    let snaps: Vec<(usize, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = wss
            .chunks(PER_THREAD)
            .map(|chunk| {
                let r = &r;
                s.spawn(move || {
                    chunk
                        .iter()
                        .map(|(i, ws)| (*i, r.commit(&ws.id, &["--message", &format!("w{i}")]).0))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a committing thread panicked"))
            .collect()
    });
    let distinct: BTreeSet<&String> = snaps.iter().map(|(_, s)| s).collect();
    assert_eq!(distinct.len(), N, "32 distinct snapshots: {snaps:?}");
    for (i, snap) in &snaps {
        let d = r.t.json(["diff", &base, snap, "--patch"]).ok().json();
        assert_eq!(
            changes(&d),
            expected_changes(*i),
            "snapshot of workspace {i}: {d}"
        );
        let patch = d["patch"].as_str().unwrap_or_default();
        assert!(
            patch.contains(&format!("+marker {i}\n"))
                && patch.contains(&format!("+edited by {i}\n")),
            "snapshot of workspace {i}: patch {patch}"
        );
        let show = r.t.json(["show", snap, "data/log.txt"]).ok().json();
        assert_eq!(
            show["entry"]["size"],
            format!("edited by {i}\n").len() as u64,
            "{show}"
        );
    }

    // All removed, in parallel, with nothing left.
    std::thread::scope(|s| {
        for chunk in wss.chunks(PER_THREAD) {
            let r = &r;
            s.spawn(move || {
                for (_, ws) in chunk {
                    r.remove(&ws.id);
                }
            });
        }
    });
    assert_eq!(r.t.json(["list"]).ok().json(), serde_json::json!([]));
    r.assert_clean();
}
