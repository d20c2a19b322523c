//! A daemon that runs another build of `fsd` than the one `mountctl` would start (an
//! upgrade: an older build may refuse what a newer one stored) is replaced when it
//! serves no workspace, and left running, with a warning, while it serves one.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use cowspace_tests::{Out, bin_path, mountctl_bin, run_program, write_file};

use crate::workspaces::support::{WsRoot, require_root};

/// `mountctl --root ROOT ARGS... --json` with `fsd` taken from `fsd`.
fn with_fsd(r: &WsRoot, fsd: &Path, args: &[&str]) -> Out {
    let mut all = vec!["--root", r.root().to_str().expect("utf-8 root"), "--json"];
    all.extend_from_slice(args);
    run_program(&mountctl_bin(), all, &[("COWSPACE_FSD", fsd.as_os_str())])
}

/// The program the root's only daemon runs.
#[track_caller]
fn daemon_program(r: &WsRoot) -> (u32, PathBuf) {
    let pids = r.fsd_pids();
    assert_eq!(pids.len(), 1, "one daemon of the root: {pids:?}");
    let exe = std::fs::read_link(format!("/proc/{}/exe", pids[0])).expect("its program");
    (pids[0], exe)
}

#[test]
fn a_daemon_of_another_build_is_replaced_when_it_serves_nothing() {
    require_root!();
    let r = WsRoot::new();
    // Two builds: the same program in two files.
    let builds: Vec<PathBuf> = ["old", "new"]
        .iter()
        .map(|b| {
            let p = r.t.path(b).join("fsd");
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::copy(bin_path("fsd"), &p).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
            p
        })
        .collect();
    let (old, new) = (&builds[0], &builds[1]);
    let src = r.t.path("src");
    write_file(&src.join("a.txt"), "a\n");
    let snap = r.import(&src, &[]);

    with_fsd(&r, old, &["daemon", "start"]).ok();
    let (first, exe) = daemon_program(&r);
    assert_eq!(exe, *old);

    // Idle: replaced by the build this mountctl would start.
    with_fsd(&r, new, &["daemon", "start"]).ok();
    let (second, exe) = daemon_program(&r);
    assert_ne!(second, first, "the old daemon was replaced");
    assert_eq!(exe, *new);

    // Serving a workspace (its view lower): left running, with a warning.
    let out = with_fsd(&r, new, &["create", &snap, "--lower", "view"]).ok();
    let ws = out.json()["workspace"].as_str().expect("id").to_owned();
    r.track(&ws);
    let out = with_fsd(&r, old, &["daemon", "start"]).ok();
    assert!(
        out.stderr.contains("another build of fsd"),
        "no warning: {}",
        out.stderr
    );
    assert_eq!(daemon_program(&r), (second, new.clone()), "left running");
    r.remove(&ws);
    r.assert_clean();
}
