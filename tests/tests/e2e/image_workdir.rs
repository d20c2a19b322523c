//! The working directory of a sandbox's commands: `/workspace` unless asked
//! (`--image-workdir` for the image config's `WorkingDir`, `--workdir DIR` for any
//! other), on `sandbox start` and `run`; `exec --workdir` still wins for one command.

use cowspace_tests::write_file;

use crate::image_sandbox::{build_image, have_umoci};
use crate::sandbox::support as sbx;
use crate::workspaces::support::{WsRoot, require_root};

fn pwd(r: &WsRoot, ws: &str, extra: &[&str]) -> String {
    let mut args = vec!["exec", ws];
    args.extend_from_slice(extra);
    args.extend(["--", "/busybox", "pwd"]);
    r.t.run(args).ok().stdout
}

#[test]
fn image_workdir_applies_only_when_asked() {
    require_root!();
    if !have_umoci() {
        return;
    }
    sbx::helper();
    let r = WsRoot::new();
    let layout = build_image(r.t.scratch());
    r.t.json([
        "image",
        "import",
        &format!("{}:img", layout.display()),
        "--ref",
        "img/busy",
    ])
    .ok();
    let src = r.t.path("src");
    write_file(&src.join("sub/a.txt"), "hello\n");
    let snap = r.import(&src, &["--ref", "t/main"]);
    let a = r.create(&snap, &[]);

    // Refusals before anything starts: a workdir that climbs, both ways at once, and
    // the image's WorkingDir without an image.
    for (flags, code) in [
        (vec!["--image", "img/busy", "--workdir", "../etc"], 9),
        (
            vec!["--image", "img/busy", "--workdir", "/x", "--image-workdir"],
            2,
        ),
        (vec!["--image-workdir"], 9),
    ] {
        let mut args = vec!["sandbox", "start", a.id.as_str()];
        args.extend(flags.iter().copied());
        r.t.run(args).code(code);
        r.t.run(["exec", &a.id, "--", "true"]).code(3);
    }

    // Without asking: the workspace, although the image names /srv.
    let s =
        r.t.json(["sandbox", "start", &a.id, "--image", "img/busy"])
            .ok()
            .json();
    assert_eq!(s["image"]["working_dir"], "/srv", "{s}");
    assert_eq!(pwd(&r, &a.id, &[]), "/workspace\n");
    r.t.json(["sandbox", "stop", &a.id]).ok();

    // Asked: the image's WorkingDir (which the image lacks: made in the private
    // layer), for every exec; `exec --workdir` still names another for one command.
    let s =
        r.t.json([
            "sandbox",
            "start",
            &a.id,
            "--image",
            "img/busy",
            "--image-workdir",
        ])
        .ok()
        .json();
    assert_eq!(s["workdir"], "/srv", "{s}");
    assert_eq!(pwd(&r, &a.id, &[]), "/srv\n");
    assert_eq!(pwd(&r, &a.id, &["--workdir", "sub"]), "/workspace/sub\n");
    assert_eq!(
        r.t.run(["exec", &a.id, "--", "/busybox", "ls", "-d", "/srv"])
            .ok()
            .stdout,
        "/srv\n"
    );
    r.t.json(["sandbox", "stop", &a.id]).ok();

    // A one-shot run, and --workdir DIR relative to the workspace.
    let out =
        r.t.run([
            "run",
            &a.id,
            "--image",
            "img/busy",
            "--image-workdir",
            "--",
            "/busybox",
            "pwd",
        ])
        .ok();
    assert_eq!(out.stdout, "/srv\n");
    let out =
        r.t.run([
            "run",
            &a.id,
            "--image",
            "img/busy",
            "--workdir",
            "sub",
            "--",
            "/busybox",
            "cat",
            "a.txt",
        ])
        .ok();
    assert_eq!(out.stdout, "hello\n");

    // On the host directories too: --workdir for every exec of a long-lived sandbox.
    r.t.json(["sandbox", "start", &a.id, "--workdir", "/workspace/sub"])
        .ok();
    let out = r.t.run(["exec", &a.id, "--", "pwd"]).ok();
    assert_eq!(out.stdout, "/workspace/sub\n");
    r.t.json(["sandbox", "stop", &a.id]).ok();
}
