//! A real distribution root as a sandbox's root filesystem: Debian 13 made by
//! `mmdebstrap --variant=minbase` (with python3 and pip) in the set-up
//! (`scripts/setup.sh`, cached under `/var/cache/cowspace/test-images`), pushed with
//! `skopeo` to a `docker-registry` on 127.0.0.1, pulled, and run: the image's own
//! binaries and files, not the host's (the host is Debian 12), and under `--net egress`
//! the image's pip installs a package from an index the test serves on 127.0.0.1, through
//! the sandbox's proxy and an `--allow-host` rule.
//!
//! Without the cached image the test skips, and fails under `CI=true`: the set-up makes
//! it (the test itself never needs the network).

use std::path::{Path, PathBuf};

use cowspace_tests::write_file;

use crate::egress::Origin;
use crate::images::{Registry, have_tools};
use crate::sandbox::support as sbx;
use crate::workspaces::support::{WsRoot, require_root};

const IMAGES_ENV: &str = "COWSPACE_TEST_IMAGES";
const IMAGES_DEFAULT: &str = "/var/cache/cowspace/test-images";
const WHEELHOUSE_ENV: &str = "COWSPACE_TEST_WHEELS";
const WHEELHOUSE_DEFAULT: &str = "/var/cache/cowspace/test-wheels";

/// The cached minbase image's OCI layout and the wheels to serve, or `None` (a skip;
/// a failure under `CI=true`).
fn cached() -> Option<(PathBuf, PathBuf)> {
    let layout = PathBuf::from(std::env::var(IMAGES_ENV).unwrap_or(IMAGES_DEFAULT.into()))
        .join("debian-minbase");
    let wheels = PathBuf::from(std::env::var(WHEELHOUSE_ENV).unwrap_or(WHEELHOUSE_DEFAULT.into()));
    let have_wheel = std::fs::read_dir(&wheels)
        .map(|d| {
            d.flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with("six-"))
        })
        .unwrap_or(false);
    if layout.join("expect").is_file() && layout.join("index.json").is_file() && have_wheel {
        return Some((layout, wheels));
    }
    let why = format!(
        "the minbase image ({}) or the six wheel ({}) is missing: scripts/setup.sh makes them",
        layout.display(),
        wheels.display()
    );
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
    eprintln!("SKIPPED: {why}");
    None
}

/// `KEY=VALUE` of the set-up's `expect` file (what the image's own binaries reported
/// in a chroot of the tree when it was made).
fn expected(layout: &Path, key: &str) -> String {
    let text = std::fs::read_to_string(layout.join("expect")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key} in {}/expect: {text}", layout.display()))
        .to_string()
}

/// What the host itself reports for `script`.
fn host(script: &str) -> String {
    let o = std::process::Command::new("sh")
        .args(["-c", script])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

fn exec(r: &WsRoot, ws: &str, argv: &[&str]) -> cowspace_tests::Out {
    let mut args = vec!["exec", ws, "--"];
    args.extend_from_slice(argv);
    r.t.run(args)
}

#[test]
fn a_debian_minbase_image_pulled_from_a_registry_runs_its_own_binaries_and_installs_a_package() {
    require_root!();
    if !have_tools() {
        return;
    }
    let Some((layout, wheels)) = cached() else {
        return;
    };
    sbx::helper();
    let r = WsRoot::new();
    let reg = Registry::start(&r.t.path("registry"));
    reg.push(&layout, "trixie", "debian");
    let pulled =
        r.t.json([
            "image",
            "pull",
            &format!("{}/debian:trixie", reg.host()),
            "--ref",
            "img/debian",
        ])
        .ok()
        .json();
    assert!(pulled["snapshot"].is_string(), "{pulled}");

    let src = r.t.path("src");
    write_file(
        &src.join("hello.py"),
        "import sys\nprint(sys.version_info[:2])\n",
    );
    let snap = r.import(&src, &["--ref", "t/main"]);
    let a = r.create(&snap, &[]);

    // The image's own files and binaries, which differ from the host's.
    let s =
        r.t.json(["sandbox", "start", &a.id, "--image", "img/debian"])
            .ok()
            .json();
    assert_eq!(s["state"], "running", "{s}");
    let debian_version = expected(&layout, "debian_version");
    let python3 = expected(&layout, "python3");
    assert_ne!(debian_version, host("cat /etc/debian_version"));
    assert_ne!(python3, host("python3 --version"));
    let out = exec(&r, &a.id, &["cat", "/etc/debian_version"]).ok();
    assert_eq!(out.stdout.trim(), debian_version);
    let out = exec(&r, &a.id, &["python3", "--version"]).ok();
    assert_eq!(out.stdout.trim(), python3, "{}", out.stderr);
    // A file only the image has (trixie's os-release), and the workspace as today.
    let out = exec(&r, &a.id, &["grep", "-c", "trixie", "/etc/os-release"]).ok();
    assert_ne!(out.stdout.trim(), "0");
    assert!(!host("cat /etc/os-release").contains("trixie"));
    let out = exec(&r, &a.id, &["python3", "/workspace/hello.py"]).ok();
    assert_eq!(
        out.stdout.trim(),
        format!(
            "({}, {})",
            python3.split(['.', ' ']).nth(1).unwrap(),
            python3.split('.').nth(1).unwrap()
        )
    );
    // The image's dpkg knows its own packages (its /var/lib/dpkg, not the host's).
    let out = exec(
        &r,
        &a.id,
        &["dpkg-query", "-W", "-f", "${Version}", "base-files"],
    )
    .ok();
    assert!(out.stdout.starts_with("13"), "{}", out.stdout);
    r.t.json(["sandbox", "stop", &a.id]).ok();

    // Under --net egress the image's pip installs a package into the image's own
    // site-packages (the sandbox's private layer) from an index on the host's 127.0.0.1,
    // named inside by --add-host and let through by --allow-host.
    let index = r.t.path("index");
    let project = index.join("simple/six");
    std::fs::create_dir_all(&project).unwrap();
    for e in std::fs::read_dir(&wheels).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if name.starts_with("six-") && name.ends_with(".whl") {
            std::fs::copy(e.path(), project.join(&name)).unwrap();
        }
    }
    let origin = Origin::serve(&index);
    let index_url = format!("http://pypi.test:{}/simple/", origin.port);
    let pip = |r: &WsRoot| {
        exec(
            r,
            &a.id,
            &[
                "timeout",
                "120",
                "python3",
                "-m",
                "pip",
                "install",
                "--break-system-packages",
                "--no-cache-dir",
                "--disable-pip-version-check",
                "--retries",
                "0",
                "--timeout",
                "10",
                "--trusted-host",
                "pypi.test",
                "--index-url",
                &index_url,
                "six",
            ],
        )
    };
    let start = |r: &WsRoot, allow: &[&str]| {
        let mut args = vec![
            "sandbox",
            "start",
            a.id.as_str(),
            "--image",
            "img/debian",
            "--net",
            "egress",
            "--add-host",
            "pypi.test:127.0.0.1",
        ];
        args.extend_from_slice(allow);
        r.t.json(args).ok();
    };
    // Not allowed: pip finds nothing, nothing is installed.
    start(&r, &[]);
    let out = pip(&r);
    assert_ne!(out.code, 0, "{}", out.stdout);
    exec(&r, &a.id, &["python3", "-c", "import six"]).code(1);
    r.t.json(["sandbox", "stop", &a.id]).ok();
    // Allowed: installed, and importable by the image's python.
    start(&r, &["--allow-host", "pypi.test"]);
    let out = pip(&r);
    assert_eq!(out.code, 0, "pip install: {}\n{}", out.stdout, out.stderr);
    let out = exec(
        &r,
        &a.id,
        &[
            "python3",
            "-c",
            "import six, sys; print(six.__version__, sys.version_info[:2])",
        ],
    )
    .ok();
    assert!(out.stdout.starts_with("1.16.0 (3, "), "{}", out.stdout);
    let installed = exec(
        &r,
        &a.id,
        &["python3", "-c", "import six; print(six.__file__)"],
    )
    .ok()
    .stdout;
    assert!(
        installed.starts_with("/usr/local/lib/python3"),
        "{installed}"
    );
    r.t.json(["sandbox", "stop", &a.id]).ok();
    // The package was the sandbox's: the image never changed.
    start(&r, &[]);
    exec(&r, &a.id, &["python3", "-c", "import six"]).code(1);
    r.t.json(["sandbox", "stop", &a.id]).ok();
}
