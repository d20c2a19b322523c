//! `sandbox start --image` and `run --image`: an image's tree (imported with `mountctl
//! image import` from an OCI layout built with Debian's `umoci`) is the sandbox's root
//! filesystem: the image's own files and binaries, its `Env`, the workspace at
//! `/workspace`; writes outside the workspace go to a private layer that never reaches
//! the image nor another sandbox and is gone after the stop; one metadata mount per
//! image; a set-uid file stays inert; a non-image or unknown name is refused before
//! anything starts.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use cowspace_tests::{Out, write_file};

use crate::sandbox::support as sbx;
use crate::workspaces::support::{WsRoot, require_root};

/// Whether `umoci` is there; otherwise skips (or fails under `CI=true`).
pub(crate) fn have_umoci() -> bool {
    let found = Command::new("sh")
        .args(["-c", "command -v umoci"])
        .output()
        .is_ok_and(|o| o.status.success());
    if found && Path::new("/bin/busybox").is_file() {
        return true;
    }
    let why = "umoci or a static /bin/busybox missing (scripts/setup.sh installs them)";
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("image sandbox tests cannot run under CI=true: {why}");
    }
    eprintln!("SKIPPED: {why}");
    false
}

#[track_caller]
fn umoci(args: &[&str]) {
    let o = Command::new("umoci").args(args).output().unwrap();
    assert!(
        o.status.success(),
        "umoci {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// An OCI layout with image `img`: a static busybox at `/busybox` (and a set-uid root
/// copy at `/opt/suid/busybox`), `/etc/image-marker`, a script `/usr/local/bin/only-here`
/// no host has, Env `FOO=bar` and `PATH` naming that directory, WorkingDir `/srv`.
pub(crate) fn build_image(work: &Path) -> PathBuf {
    let layout = work.join("oci");
    let l = layout.to_str().unwrap();
    let image = format!("{l}:img");
    umoci(&["init", "--layout", l]);
    umoci(&["new", "--image", &image]);
    let bundle = work.join("bundle");
    umoci(&["unpack", "--image", &image, bundle.to_str().unwrap()]);
    let root = bundle.join("rootfs");
    fs::copy("/bin/busybox", root.join("busybox")).unwrap();
    write_file(&root.join("etc/image-marker"), "only in the image\n");
    write_file(
        &root.join("etc/passwd"),
        "root:x:0:0:root:/root:/busybox\napp:x:1000:1000::/home/app:/busybox\n",
    );
    write_file(
        &root.join("etc/group"),
        "root:x:0:\napp:x:1000:\nstaff:x:50:\n",
    );
    // Above the native lower's inline size: read through a blob-cache file.
    write_file(&root.join("opt/big"), cowspace_tests::noise(7, 256 * 1024));
    let script = root.join("usr/local/bin/only-here");
    write_file(&script, "#!/busybox sh\necho image-script-ran\n");
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    let suid = root.join("opt/suid/busybox");
    fs::create_dir_all(suid.parent().unwrap()).unwrap();
    fs::copy("/bin/busybox", &suid).unwrap();
    fs::set_permissions(&suid, fs::Permissions::from_mode(0o4755)).unwrap();
    copy_with_libraries(&root, Path::new("/usr/bin/setpriv"), "opt/setpriv");
    umoci(&["repack", "--image", &image, bundle.to_str().unwrap()]);
    umoci(&[
        "config",
        "--image",
        &image,
        "--config.env",
        "FOO=bar",
        "--config.env",
        "PATH=/usr/local/bin:/usr/bin:/bin",
        "--config.workingdir",
        "/srv",
    ]);
    // The same tree with a `User` the image names, and one it does not.
    for (tag, user) in [("img-user", "app:staff"), ("img-ghost", "ghost")] {
        umoci(&[
            "config",
            "--image",
            &image,
            "--tag",
            tag,
            "--config.user",
            user,
        ]);
    }
    layout
}

/// Copies the host's `program` to `root/at` with the shared libraries `ldd` names, at
/// their own paths under `root` (util-linux's `setpriv`, to run a file as another uid).
fn copy_with_libraries(root: &Path, program: &Path, at: &str) {
    let ldd = Command::new("ldd").arg(program).output().unwrap();
    assert!(ldd.status.success(), "ldd {}", program.display());
    for lib in String::from_utf8_lossy(&ldd.stdout)
        .split_whitespace()
        .filter(|w| w.starts_with('/'))
    {
        let to = root.join(lib.trim_start_matches('/'));
        fs::create_dir_all(to.parent().unwrap()).unwrap();
        fs::copy(lib, &to).unwrap();
    }
    fs::copy(program, root.join(at)).unwrap();
}

fn exec(r: &WsRoot, ws: &str, script: &str) -> Out {
    r.t.run(["exec", ws, "--", "/busybox", "sh", "-c", script])
}

#[track_caller]
fn exec_ok(r: &WsRoot, ws: &str, script: &str) -> String {
    exec(r, ws, script).ok().stdout
}

/// Mounts of the host whose source or target names `needle`.
fn host_mounts_with(needle: &str) -> Vec<String> {
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.contains(needle))
        .map(str::to_string)
        .collect()
}

/// Everything about a sandbox's image root in one long-lived pass, then the one-shot
/// run and the refusals.
#[test]
fn image_sandbox_runs_on_the_images_tree_with_a_private_layer() {
    require_root!();
    if !have_umoci() {
        return;
    }
    sbx::helper();
    let r = WsRoot::new();
    let layout = build_image(r.t.scratch());
    let img =
        r.t.json([
            "image",
            "import",
            &format!("{}:img", layout.display()),
            "--ref",
            "img/busy",
        ])
        .ok()
        .json();
    let image_snap = img["snapshot"].as_str().expect("snapshot").to_string();
    let src = r.t.path("src");
    write_file(&src.join("a.txt"), "hello\n");
    let snap = r.import(&src, &["--ref", "t/main"]);
    let a = r.create(&snap, &["--lower", "native"]);
    let b = r.create(&snap, &[]);

    // Refusals first: nothing starts, nothing is mounted.
    let before = host_mounts_with(r.root().to_str().unwrap());
    let e =
        r.t.json(["sandbox", "start", &a.id, "--image", "t/main"])
            .error(9, "invalid_input");
    assert!(e["message"].as_str().unwrap().contains(&snap), "{e}");
    assert!(
        e["hint"]
            .as_str()
            .unwrap_or_default()
            .contains("mountctl image list"),
        "{e}"
    );
    r.t.json(["sandbox", "start", &a.id, "--image", "no/such-image"])
        .error(3, "not_found");
    r.t.run(["run", &a.id, "--image", "t/main", "--", "/bin/true"])
        .code(9);
    assert_eq!(host_mounts_with(r.root().to_str().unwrap()), before);
    r.t.run(["exec", &a.id, "--", "true"]).code(3);

    // Two sandboxes on the image at once.
    let sa =
        r.t.json(["sandbox", "start", &a.id, "--image", "img/busy"])
            .ok()
            .json();
    assert_eq!(sa["state"], "running", "{sa}");
    assert_eq!(sa["image"]["snapshot"], image_snap.as_str(), "{sa}");
    let sb =
        r.t.json(["sandbox", "start", &b.id, "--image", &image_snap])
            .ok()
            .json();
    assert_eq!(sb["state"], "running", "{sb}");

    // The image's own files and binaries, its Env; the workspace as today.
    assert_eq!(
        exec_ok(&r, &a.id, "cat /etc/image-marker"),
        "only in the image\n"
    );
    assert_eq!(exec_ok(&r, &a.id, "only-here"), "image-script-ran\n");
    assert_eq!(exec_ok(&r, &a.id, "echo $FOO"), "bar\n");
    assert_eq!(exec_ok(&r, &a.id, "pwd"), "/workspace\n");
    assert!(exec(&r, &a.id, "test -e /usr/bin/python3").code == 1);
    assert_eq!(exec_ok(&r, &a.id, "cat /workspace/a.txt"), "hello\n");
    exec_ok(&r, &a.id, "echo from-sandbox > /workspace/new.txt");
    assert_eq!(
        fs::read_to_string(a.path.join("new.txt")).unwrap(),
        "from-sandbox\n"
    );
    // The sandbox's own /etc/hosts and resolv.conf.
    assert!(exec_ok(&r, &a.id, "cat /etc/hosts").contains("localhost"));

    // Writes outside the workspace: private to the sandbox, never in the image.
    exec_ok(
        &r,
        &a.id,
        "echo private > /etc/x && echo changed > /etc/image-marker",
    );
    assert_eq!(exec_ok(&r, &a.id, "cat /etc/x"), "private\n");
    assert_eq!(exec(&r, &b.id, "cat /etc/x").code, 1);
    assert_eq!(
        exec_ok(&r, &b.id, "cat /etc/image-marker"),
        "only in the image\n"
    );

    // One metadata mount of the image on the host, shared by both.
    let meta = format!("cache/native/{image_snap}/meta");
    assert_eq!(
        host_mounts_with(&meta).len(),
        1,
        "{:?}",
        host_mounts_with(&meta)
    );

    // The root is nosuid,nodev: a set-uid root file runs with the caller's ids, and no
    // device node can be made.
    let root_line = exec_ok(&r, &a.id, "grep ' / / ' /proc/self/mountinfo");
    for opt in ["nosuid", "nodev"] {
        assert!(root_line.contains(opt), "{root_line}");
    }
    // The image holds the file set-uid root (so the check below means something).
    assert_eq!(
        exec_ok(&r, &a.id, "/busybox stat -c %a:%u /opt/suid/busybox"),
        "4755:0\n"
    );
    let euid = exec_ok(
        &r,
        &a.id,
        "/opt/setpriv --reuid=1000 --regid=1000 --clear-groups /opt/suid/busybox id -u",
    );
    assert_eq!(euid, "1000\n", "a set-uid file raised the privilege");
    assert_ne!(
        exec(&r, &a.id, "/busybox mknod /dev-null-copy c 1 3").code,
        0
    );

    // gc with an empty blob-cache bound while sandboxes run on the image keeps its lower
    // and blobs: a file first read after it reads whole.
    r.t.json(["gc", "--blob-cache-max", "0"]).ok();
    let big = exec_ok(&r, &b.id, "/busybox wc -c < /opt/big");
    assert_eq!(big.trim(), (256 * 1024).to_string());
    let first = exec_ok(&r, &b.id, "/busybox md5sum /opt/big");
    let host = Command::new("md5sum")
        .arg(r.t.scratch().join("bundle/rootfs/opt/big"))
        .output()
        .unwrap();
    assert_eq!(
        first.split_whitespace().next(),
        String::from_utf8_lossy(&host.stdout)
            .split_whitespace()
            .next()
    );

    // Stop: nothing of the sandbox stays mounted, and its writes are gone.
    r.t.json(["sandbox", "stop", &a.id]).ok();
    assert_eq!(
        exec_ok(&r, &b.id, "cat /etc/image-marker"),
        "only in the image\n"
    );
    r.t.json(["sandbox", "stop", &b.id]).ok();
    let sandbox_state = r.root().join("run/sandbox/run");
    let leftover: Vec<_> = fs::read_dir(&sandbox_state)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(leftover.is_empty(), "left after stop: {leftover:?}");
    // The image's metadata mount stays while its ref names it (`image_mounts.rs`).
    assert_eq!(
        host_mounts_with(&meta).len(),
        1,
        "{:?}",
        host_mounts_with(&meta)
    );
    assert!(
        host_mounts_with("cowspace-image").is_empty(),
        "{:?}",
        host_mounts_with("cowspace-image")
    );
    let again =
        r.t.json(["sandbox", "start", &a.id, "--image", "img/busy"])
            .ok()
            .json();
    assert_eq!(again["state"], "running");
    assert_eq!(
        exec(&r, &a.id, "cat /etc/x").code,
        1,
        "writes outlived the stop"
    );
    r.t.json(["sandbox", "stop", &a.id]).ok();

    // The control socket's `sandbox_start` takes the same control (the daemon serves
    // the socket; the root's cleanup stops it).
    r.t.run(["daemon", "start"]).ok();
    let via_socket = r.socket(
        "sandbox_start",
        serde_json::json!({"workspace": b.id, "image": "img/busy"}),
    );
    assert_eq!(
        via_socket["image"]["snapshot"],
        image_snap.as_str(),
        "{via_socket}"
    );
    assert_eq!(
        exec_ok(&r, &b.id, "cat /etc/image-marker"),
        "only in the image\n"
    );
    r.t.json(["sandbox", "stop", &b.id]).ok();

    // A one-shot run on the image.
    let out =
        r.t.run([
            "run",
            &a.id,
            "--image",
            "img/busy",
            "--",
            "/busybox",
            "sh",
            "-c",
            "cat /etc/image-marker; echo $FOO",
        ])
        .ok();
    assert_eq!(out.stdout, "only in the image\nbar\n");

    // A plain-directory workspace (idmapped into the image root) under --net egress:
    // the sandbox's own resolver and proxy variables, as on the host root.
    let c = r.create(&snap, &["--materializer", "copy"]);
    let out =
        r.t.run([
            "run",
            &c.id,
            "--image",
            "img/busy",
            "--net",
            "egress",
            "--",
            "/busybox",
            "sh",
            "-c",
            "/busybox grep nameserver /etc/resolv.conf; echo $HTTPS_PROXY; cat /workspace/a.txt; \
             echo w > /workspace/from-image",
        ])
        .ok();
    assert_eq!(
        out.stdout, "nameserver 127.0.0.1\nhttp://127.0.0.1:3128\nhello\n",
        "{}",
        out.stderr
    );
    assert_eq!(
        fs::read_to_string(c.path.join("from-image")).unwrap(),
        "w\n"
    );

    // The image's User: names from its own /etc/passwd and /etc/group, for the first
    // command of a run and for every exec; one it does not define is refused (7).
    for tag in ["img-user", "img-ghost"] {
        r.t.json([
            "image",
            "import",
            &format!("{}:{tag}", layout.display()),
            "--ref",
            &format!("img/{tag}"),
        ])
        .ok();
    }
    let ids = "/busybox id -u; /busybox id -g";
    let out =
        r.t.run([
            "run",
            &a.id,
            "--image",
            "img/img-user",
            "--",
            "/busybox",
            "sh",
            "-c",
            ids,
        ])
        .ok();
    assert_eq!(out.stdout, "1000\n50\n");
    let s =
        r.t.json(["sandbox", "start", &a.id, "--image", "img/img-user"])
            .ok()
            .json();
    assert_eq!(s["image"]["user"], "1000:50", "{s}");
    assert_eq!(exec_ok(&r, &a.id, ids), "1000\n50\n");
    assert_eq!(exec_ok(&r, &a.id, "echo $HOME"), "/home/app\n");
    r.t.json(["sandbox", "stop", &a.id]).ok();
    let before = host_mounts_with(r.root().to_str().unwrap());
    let refused =
        r.t.json(["sandbox", "start", &a.id, "--image", "img/img-ghost"])
            .error(7, "unsupported");
    assert!(refused.to_string().contains("ghost"), "{refused}");
    assert_eq!(host_mounts_with(r.root().to_str().unwrap()), before);
    r.t.run(["exec", &a.id, "--", "true"]).code(3);
}
