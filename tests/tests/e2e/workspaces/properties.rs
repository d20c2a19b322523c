//! What creating and removing a workspace costs: an unwritten workspace's private state is
//! a few directory entries on disk, whatever the snapshot's size; the create and remove
//! times are reported (printed, never asserted: the machine is shared and noisy).

use std::path::Path;

use super::base_tree;
use super::support::{WsRoot, require_root, sh};

/// KiB used under `dir` on its own filesystem (`du -sxk`: the mount inside is skipped).
fn du_kib(dir: &Path) -> u64 {
    let out = sh(dir, "du -sxk .");
    out.split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("du output {out:?}"))
}

#[test]
fn an_unwritten_workspace_costs_a_few_kib_and_reports_its_create_time() {
    require_root!();
    let r = WsRoot::new();
    let src = r.t.path("src");
    base_tree(&src);
    let base = r.import(&src, &[]);
    for lower in ["checkout", "view"] {
        // The first create of a snapshot may build its shared lower; measure the second.
        let first = r.create(&base, &["--lower", lower]);
        let ws = r.create(&base, &["--lower", lower]);
        let private = r.root().join("workspaces").join(&ws.id);
        assert!(private.is_dir(), "{}", private.display());
        let kib = du_kib(&private);
        eprintln!(
            "{lower}: create {:.1} ms (first of the snapshot {:.1} ms), private state {kib} KiB",
            ws.json["elapsed_ms"].as_f64().unwrap(),
            first.json["elapsed_ms"].as_f64().unwrap()
        );
        assert!(
            ws.json["elapsed_ms"].as_f64().is_some_and(|ms| ms >= 0.0),
            "{}",
            ws.json
        );
        assert!(kib <= 64, "an unwritten workspace uses {kib} KiB");
        // Writing is what costs: 1 MiB written is 1 MiB more in the private state.
        std::fs::write(ws.path.join("written.bin"), vec![7u8; 1 << 20]).unwrap();
        let after = du_kib(&private);
        assert!(after >= kib + 1000, "{after} KiB after writing 1 MiB");
        for w in [&first, &ws] {
            let v = r.discard(&w.id);
            eprintln!(
                "{lower}: remove {:.1} ms",
                v["elapsed_ms"].as_f64().unwrap_or(-1.0)
            );
            assert!(!r.root().join("workspaces").join(&w.id).exists());
        }
    }
    r.assert_clean();
}
