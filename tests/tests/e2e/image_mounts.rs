//! An image's metadata mount lives as long as the image (`cowspace/src/image/held.rs`):
//! mounted by the first sandbox on it, kept across stops and one-shot runs while a ref
//! names the image, gone with `image remove` of its last ref (once its last sandbox
//! stopped), with `sweep` after the last ref went by `ref delete`, and its lower with
//! `gc`. No mount of a removed image is left. A VM on an image is refused before
//! anything starts.

use std::fs;

use cowspace_tests::write_file;

use crate::image_sandbox::{build_image, have_umoci};
use crate::sandbox::support as sbx;
use crate::workspaces::support::{WsRoot, require_root};

/// Mount points of the host that are `target`.
fn mounts_at(target: &std::path::Path) -> usize {
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.split(' ').nth(4) == target.to_str())
        .count()
}

/// Mounts of the host whose line names `needle`.
fn mounts_naming(needle: &str) -> Vec<String> {
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.contains(needle))
        .map(str::to_string)
        .collect()
}

#[test]
fn image_mount_stays_while_a_ref_names_the_image_and_goes_with_its_last_ref() {
    require_root!();
    if !have_umoci() {
        return;
    }
    sbx::helper();
    let r = WsRoot::new();
    let layout = build_image(r.t.scratch());
    let import = |tag: &str, name: &str| -> String {
        let v =
            r.t.json([
                "image",
                "import",
                &format!("{}:{tag}", layout.display()),
                "--ref",
                name,
            ])
            .ok()
            .json();
        v["snapshot"].as_str().expect("snapshot").to_string()
    };
    let snap = import("img", "img/a");
    let meta = r.root().join(format!("cache/native/{snap}/meta"));
    let src = r.t.path("src");
    write_file(&src.join("a.txt"), "hello\n");
    let base = r.import(&src, &["--ref", "t/main"]);
    let a = r.create(&base, &[]);
    let b = r.create(&base, &[]);

    // The first start mounts the image; stops and runs leave that one mount.
    for _ in 0..2 {
        r.t.json(["sandbox", "start", &a.id, "--image", "img/a"])
            .ok();
        assert_eq!(mounts_at(&meta), 1);
        r.t.json(["sandbox", "stop", &a.id]).ok();
        assert_eq!(mounts_at(&meta), 1, "the image's mount went with a stop");
    }
    r.t.run(["run", &b.id, "--image", "img/a", "--", "/busybox", "true"])
        .ok();
    assert_eq!(mounts_at(&meta), 1, "a run added or removed a mount");
    assert!(mounts_naming("cowspace-image").is_empty());

    // A second ref names the image: removing the first keeps the mount.
    r.t.json(["ref", "set", "img/b", &snap]).ok();
    r.t.json(["image", "remove", "img/a"]).ok();
    assert_eq!(mounts_at(&meta), 1, "removed while another ref names it");

    // The last ref removed while a sandbox runs on the image: the mount stays for the
    // sandbox and goes with its stop.
    r.t.json(["sandbox", "start", &a.id, "--image", "img/b"])
        .ok();
    r.t.json(["image", "remove", "img/b"]).ok();
    assert_eq!(mounts_at(&meta), 1, "unmounted under a running sandbox");
    assert_eq!(
        r.t.run(["exec", &a.id, "--", "/busybox", "cat", "/etc/image-marker"])
            .ok()
            .stdout,
        "only in the image\n"
    );
    r.t.json(["sandbox", "stop", &a.id]).ok();
    assert_eq!(mounts_at(&meta), 0, "the mount outlived the image");
    // gc takes the lower of the image no ref names.
    r.t.json(["gc"]).ok();
    assert!(
        !meta.parent().unwrap().exists(),
        "gc left the image's lower"
    );

    // An image whose last ref goes by `ref delete`: `sweep` unmounts it.
    let other = import("img-user", "img/c");
    let other_meta = r.root().join(format!("cache/native/{other}/meta"));
    r.t.run(["run", &b.id, "--image", "img/c", "--", "/busybox", "true"])
        .ok();
    assert_eq!(mounts_at(&other_meta), 1);
    r.t.json(["ref", "delete", "img/c", "--expect", &other])
        .ok();
    assert_eq!(mounts_at(&other_meta), 1);
    let swept = r.t.json(["sweep"]).ok().json();
    assert_eq!(mounts_at(&other_meta), 0, "sweep left it: {swept}");
    assert!(swept.to_string().contains(&other), "{swept}");

    // Nothing of either image is mounted.
    let native = r.root().join("cache/native");
    assert!(
        mounts_naming(native.to_str().unwrap())
            .iter()
            .all(|l| !l.contains(&snap) && !l.contains(&other)),
        "{:?}",
        mounts_naming(native.to_str().unwrap())
    );
}

/// `--vm` with `--image` is refused before anything starts, naming why and both ways
/// out (no image mount, no VM process, no sandbox record).
#[test]
fn image_root_in_a_vm_is_refused_naming_the_cause_and_the_fix() {
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
        "img/a",
    ])
    .ok();
    let src = r.t.path("src");
    write_file(&src.join("a.txt"), "hello\n");
    let base = r.import(&src, &["--ref", "t/main"]);
    let a = r.create(&base, &[]);
    let before = mounts_naming(r.root().to_str().unwrap());
    for args in [
        vec!["sandbox", "start", &a.id, "--vm", "--accept-emulation"],
        vec!["run", &a.id, "--vm", "--accept-emulation"],
    ] {
        let mut args = args;
        args.extend(["--image", "img/a"]);
        if args[0] == "run" {
            args.extend(["--", "/busybox", "true"]);
        }
        let e = r.t.json(args.clone()).error(7, "unsupported");
        let text = e.to_string();
        for needle in ["initramfs", "Drop --vm", "drop --image"] {
            assert!(text.contains(needle), "{args:?}: {needle} not in {e}");
        }
    }
    assert_eq!(mounts_naming(r.root().to_str().unwrap()), before);
    r.t.run(["exec", &a.id, "--", "true"]).code(3);
}
