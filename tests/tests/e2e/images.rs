//! `mountctl image`: images built with Debian's `umoci`, imported from their OCI layout,
//! pushed with `skopeo` to a real distribution registry (`docker-registry`) on
//! 127.0.0.1 and pulled from it; listed, shown, removed.
//!
//! The tools are installed by `scripts/setup.sh`; without them the test skips with a
//! reason, and fails instead under `CI=true`. The registry is the test's own process on
//! a port of 127.0.0.1, killed by pid when the test ends.

use std::fs;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cowspace_tests::{TestRoot, write_file};
use serde_json::Value;

/// A bound against hangs, never a performance threshold.
const WAIT: Duration = Duration::from_secs(60);
const TOOLS: [&str; 3] = ["umoci", "skopeo", "docker-registry"];

/// Whether every tool is there; otherwise skips (or fails under `CI=true`).
pub(crate) fn have_tools() -> bool {
    let missing: Vec<&str> = TOOLS
        .iter()
        .copied()
        .filter(|t| {
            Command::new("sh")
                .args(["-c", &format!("command -v {t}")])
                .stdout(Stdio::null())
                .status()
                .map(|s| !s.success())
                .unwrap_or(true)
        })
        .collect();
    if missing.is_empty() {
        return true;
    }
    let why = format!(
        "{} not installed (scripts/setup.sh installs them)",
        missing.join(", ")
    );
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("image tests cannot run under CI=true: {why}");
    }
    eprintln!("skipping: {why}");
    false
}

#[track_caller]
fn sh(cmd: &mut Command) -> String {
    let o = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        o.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn umoci(args: &[&str]) -> String {
    sh(Command::new("umoci").args(args))
}

/// Builds, in the OCI layout `layout`, `base` (busybox, a marker, `opt/old/a`, `gone`,
/// Env FOO=bar, WorkingDir /srv) and `v2` (base plus a layer deleting `gone` and
/// `opt/old/a` and adding `opt/old/c`).
pub(crate) fn build_images(work: &Path) -> PathBuf {
    let layout = work.join("oci");
    let l = layout.to_str().unwrap();
    umoci(&["init", "--layout", l]);
    umoci(&["new", "--image", &format!("{l}:base")]);
    let b1 = work.join("b1");
    umoci(&[
        "unpack",
        "--rootless",
        "--image",
        &format!("{l}:base"),
        b1.to_str().unwrap(),
    ]);
    let r1 = b1.join("rootfs");
    fs::copy("/bin/busybox", r1.join("busybox")).expect("busybox (busybox-static)");
    write_file(&r1.join("etc/image-marker"), "only in the image\n");
    write_file(&r1.join("opt/old/a"), "a\n");
    write_file(&r1.join("gone"), "gone\n");
    umoci(&[
        "repack",
        "--image",
        &format!("{l}:base"),
        b1.to_str().unwrap(),
    ]);
    umoci(&[
        "config",
        "--image",
        &format!("{l}:base"),
        "--config.env",
        "FOO=bar",
        "--config.workingdir",
        "/srv",
    ]);
    let b2 = work.join("b2");
    umoci(&[
        "unpack",
        "--rootless",
        "--image",
        &format!("{l}:base"),
        b2.to_str().unwrap(),
    ]);
    let r2 = b2.join("rootfs");
    fs::remove_file(r2.join("gone")).unwrap();
    fs::remove_file(r2.join("opt/old/a")).unwrap();
    write_file(&r2.join("opt/old/c"), "c\n");
    umoci(&[
        "repack",
        "--image",
        &format!("{l}:v2"),
        b2.to_str().unwrap(),
    ]);
    layout
}

/// A distribution registry on 127.0.0.1 with a throwaway storage directory; killed when
/// dropped.
pub(crate) struct Registry {
    child: Child,
    pub(crate) port: u16,
}

impl Registry {
    pub(crate) fn start(dir: &Path) -> Registry {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let storage = dir.join("storage");
        fs::create_dir_all(&storage).unwrap();
        let config = dir.join("registry.yml");
        fs::write(
            &config,
            format!(
                "version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\nlog:\n  level: error\n",
                storage.display()
            ),
        )
        .unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(dir.join("registry.log")).unwrap())
            .spawn()
            .expect("docker-registry");
        let r = Registry { child, port };
        let deadline = Instant::now() + WAIT;
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "the registry did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        r
    }

    pub(crate) fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `skopeo copy` of `layout:tag` to `REPO:tag` here.
    pub(crate) fn push(&self, layout: &Path, tag: &str, repo: &str) {
        sh(Command::new("skopeo").args([
            "copy",
            "--insecure-policy",
            "--dest-tls-verify=false",
            &format!("oci:{}:{tag}", layout.display()),
            &format!("docker://{}/{repo}:{tag}", self.host()),
        ]));
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn images_import_from_a_layout_and_pull_from_a_registry_with_whiteouts_and_dedup() {
    if !have_tools() {
        return;
    }
    let r = TestRoot::new();
    let layout = build_images(r.scratch());

    // Import from the layout: the layers applied, the deletions of the second honoured.
    let base = r
        .json([
            "image",
            "import",
            &format!("{}:base", layout.display()),
            "--ref",
            "img/base",
        ])
        .ok()
        .json();
    assert_eq!(base["layers"].as_array().unwrap().len(), 1, "{base}");
    let v2 = r
        .json([
            "image",
            "import",
            &format!("{}:v2", layout.display()),
            "--ref",
            "img/v2",
        ])
        .ok()
        .json();
    assert_eq!(v2["layers"].as_array().unwrap().len(), 2, "{v2}");
    assert_eq!(v2["platform"], "linux/amd64", "{v2}");
    // The shared layer's bytes are stored once.
    assert!(
        v2["new_bytes_stored"].as_u64().unwrap() < 64 * 1024,
        "the shared layer was stored again: {v2}"
    );
    let out = r.path("export-v2");
    r.run(["export", "img/v2", out.to_str().unwrap()]).ok();
    assert_eq!(
        fs::read_to_string(out.join("etc/image-marker")).unwrap(),
        "only in the image\n"
    );
    assert_eq!(fs::read_to_string(out.join("opt/old/c")).unwrap(), "c\n");
    assert!(
        !out.join("opt/old/a").exists(),
        "a whiteout was not applied"
    );
    assert!(!out.join("gone").exists(), "a whiteout was not applied");
    assert!(!out.join("opt/old/.wh.a").exists() && !out.join(".wh.gone").exists());
    assert_eq!(
        fs::read(out.join("busybox")).unwrap(),
        fs::read("/bin/busybox").unwrap()
    );

    // show: the config's parts a sandbox uses.
    let s = r.json(["image", "show", "img/v2"]).ok().json();
    assert_eq!(s["snapshot"], v2["snapshot"], "{s}");
    assert!(
        s["env"].as_array().unwrap().iter().any(|e| e == "FOO=bar"),
        "{s}"
    );
    assert_eq!(s["working_dir"], "/srv", "{s}");
    assert_eq!(s["digest"], v2["digest"], "{s}");
    let text = r.run(["image", "show", "img/v2"]).ok().stdout;
    assert!(
        text.contains("working dir  /srv") && text.contains("env          FOO=bar"),
        "{text}"
    );

    // A real registry: pushed with skopeo, pulled by tag (HTTP: it is on the loopback).
    let reg = Registry::start(&r.path("registry"));
    reg.push(&layout, "v2", "test/img");
    let pulled = r
        .json(["image", "pull", &format!("{}/test/img:v2", reg.host())])
        .ok()
        .json();
    let default_ref = format!("images/127.0.0.1-{}/test/img/v2", reg.port);
    assert_eq!(pulled["ref"], default_ref.as_str(), "{pulled}");
    assert_eq!(
        pulled["root"], v2["root"],
        "the pulled tree differs from the imported one: {pulled}"
    );
    assert_eq!(pulled["digest"], v2["digest"], "{pulled}");
    assert!(
        pulled["new_bytes_stored"].as_u64().unwrap() < 64 * 1024,
        "layers stored again: {pulled}"
    );
    // By digest, to a ref of our choosing.
    let by_digest = format!("{}/test/img@{}", reg.host(), v2["digest"].as_str().unwrap());
    let d = r
        .json(["image", "pull", &by_digest, "--ref", "img/pinned"])
        .ok()
        .json();
    assert_eq!(d["root"], v2["root"], "{d}");
    // What is not there: not_found (3), naming it; nothing made.
    let e = r
        .run(["image", "pull", &format!("{}/test/img:nope", reg.host())])
        .code(3);
    assert!(e.stderr.contains("test/img:nope"), "{}", e.stderr);
    let e = r
        .run(["image", "pull", &format!("{}/test/other:v2", reg.host())])
        .code(3);
    assert!(e.stderr.contains("404"), "{}", e.stderr);
    // Bad references are refused before any request (9).
    for bad in [
        "http://127.0.0.1:1/x:y",
        "127.0.0.1:1/UPPER:y",
        "127.0.0.1:1/x@sha256:zz",
    ] {
        let e = r.run(["image", "pull", bad]).code(9);
        assert!(
            e.stderr.contains("image reference") || e.stderr.contains("digest"),
            "{bad}: {}",
            e.stderr
        );
    }
    // A registry that is not there: an I/O error naming it, not a hang.
    drop(reg);
    let e = r.run([
        "image",
        "pull",
        &format!("127.0.0.1:{}/test/img:v2", free_port()),
    ]);
    assert_ne!(e.code, 0);
    assert!(e.stderr.contains("127.0.0.1"), "{}", e.stderr);

    // list, remove.
    let names = |r: &TestRoot| -> Vec<String> {
        r.json(["image", "list"])
            .ok()
            .json()
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["name"].as_str().unwrap().to_string())
            .collect()
    };
    let mut want = vec![
        "img/base".to_string(),
        "img/pinned".into(),
        "img/v2".into(),
        default_ref.clone(),
    ];
    want.sort();
    assert_eq!(names(&r), want);
    let src = r.path("plain");
    write_file(&src.join("f"), "f\n");
    r.import(&src, &["--ref", "plain/main"]);
    assert!(!names(&r).contains(&"plain/main".to_string()));
    let e = r.run(["image", "remove", "plain/main"]).code(9);
    assert!(e.stderr.contains("not an image"), "{}", e.stderr);
    let e = r.run(["image", "show", "plain/main"]).code(9);
    assert!(e.stderr.contains("image list"), "{}", e.stderr);
    r.run(["image", "show", "img/nothing"]).code(3);
    r.json(["image", "remove", "img/pinned"]).ok();
    assert!(!names(&r).contains(&"img/pinned".to_string()));
    r.run(["image", "remove", "img/pinned"]).code(3);
    // Removed refs leave snapshots to gc; the store stays consistent.
    r.run(["gc"]).ok();
    r.run(["fsck"]).ok();
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn image_import_refuses_what_is_not_an_image_and_leaves_nothing() {
    let r = TestRoot::new();
    let dir = r.path("notimage");
    write_file(&dir.join("f"), "x\n");
    let e = r
        .run(["image", "import", dir.to_str().unwrap(), "--ref", "x"])
        .code(9);
    assert!(e.stderr.contains("not an OCI image layout"), "{}", e.stderr);
    let e = r.run([
        "image",
        "import",
        r.path("missing").to_str().unwrap(),
        "--ref",
        "x",
    ]);
    assert_eq!(e.code, 3, "{}", e.stderr);
    let e = r
        .run([
            "image",
            "import",
            dir.to_str().unwrap(),
            "--ref",
            "bad name",
        ])
        .code(9);
    assert!(e.stderr.contains("ref name"), "{}", e.stderr);
    assert_eq!(r.json(["snapshots"]).ok().json(), serde_json::json!([]));
    let v: Value = r.json(["image", "list"]).ok().json();
    assert_eq!(v, serde_json::json!([]));
}
