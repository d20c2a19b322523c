//! Sweep and removals: a removal under way is its remover's while that process lives,
//! and is finished by sweep once it is gone. No mounts: the records are made directly.

use std::fs;
use std::path::Path;

use cowspace::registry::{Creator, Record, Registry, Status};
use cowspace::runtime::Runtime;
use cowspace_store::{Store, StoreConfig};

fn record(root: &Path, id: &str, creator: Option<Creator>) -> Record {
    let private_dir = root.join("workspaces").join(id);
    fs::create_dir_all(private_dir.join("upper")).unwrap();
    fs::write(private_dir.join("upper/written"), "kept until removed\n").unwrap();
    Record {
        id: id.into(),
        name: None,
        worker: None,
        snapshot: "00".repeat(32),
        materializer: cowspace::materializer::MaterializerKind::Overlay,
        lower_kind: cowspace::materializer::LowerKind::Checkout,
        lower: root.join("no-lower"),
        path: private_dir.join("mnt"),
        private_dir,
        status: Status::CleanupPending,
        created_at: 1,
        updated_at: 1,
        stopped_at: None,
        policies: serde_json::json!({}),
        diagnostics: vec![],
        ports: serde_json::json!({}),
        commits: vec![],
        create_ms: 0.0,
        sandbox_pid: None,
        sandbox: None,
        overlay_redirects: false,
        committed_fingerprint: None,
        parent: None,
        disk: None,
        creator,
    }
}

#[test]
fn a_removal_is_left_to_its_live_remover_and_finished_once_it_is_gone() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    Store::init(&root, StoreConfig::default()).unwrap();
    let rt = Runtime::open(&root).unwrap();
    let reg = Registry::open(&root).unwrap();

    // This test process stands for a `remove` still under way.
    let live = record(&root, "ws-live", Creator::current());
    reg.insert(&live).unwrap();
    let report = rt.sweep().unwrap();
    assert_eq!(report.removing, vec!["ws-live".to_string()], "{report:?}");
    assert!(report.finished.is_empty(), "{report:?}");
    assert!(live.private_dir.join("upper/written").exists());
    assert_eq!(rt.status("ws-live").unwrap().status, Status::CleanupPending);
    // A second remove meanwhile is refused, naming the remover.
    let e = rt.remove("ws-live", false).unwrap_err().to_string();
    assert!(e.contains("being removed by pid"), "{e}");

    // A remover that is gone (a process that ended): the next sweep finishes it.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let gone = Creator {
        pid: child.id() as i32,
        ..Creator::current().unwrap()
    };
    child.wait().unwrap();
    let dead = record(&root, "ws-dead", Some(gone));
    reg.insert(&dead).unwrap();
    let report = rt.sweep().unwrap();
    assert_eq!(report.finished, vec!["ws-dead".to_string()], "{report:?}");
    assert_eq!(report.removing, vec!["ws-live".to_string()], "{report:?}");
    assert!(!dead.private_dir.exists());
    assert_eq!(rt.status("ws-dead").unwrap().status, Status::Removed);
}
