//! The images section's sandbox rows, on a real distribution root: the Debian minbase
//! image the set-up makes (`scripts/setup.sh`, an OCI layout under
//! `/var/cache/cowspace/test-images/debian-minbase`), imported into a runtime root of
//! its own (untimed). Methods:
//! - `start-image`: `mountctl sandbox start WS --image deb` to ready (stopped after,
//!   untimed), beside `start-host`: `sandbox start WS` on the host's directories (the
//!   `start_ratio` row pairs the two run by run);
//! - `run-image`: `mountctl run WS --image deb -- /bin/true`, beside `bwrap-rootfs`:
//!   `bwrap` over the same image unpacked with `umoci unpack` (`--ro-bind ROOTFS /`),
//!   `/bin/true` of the image;
//! - `idle-50`: 50 sandboxes started on the image, each with the image's `python3`
//!   sleeping in it: the host's memory they take (`MemAvailable` before and after), the
//!   memory cgroups' own charge (v1 `memory.stat` `total_rss` and `total_cache`), and
//!   the bytes of the image's files in the page cache (`fincore` over the blob cache,
//!   after `drop_caches`) with one sandbox running and with all 50: the same figure
//!   means one copy in memory for all;
//! - `skopeo-unpack`: `skopeo copy` of the pull rows' image and `umoci unpack` of it,
//!   the baseline a pull into a usable tree compares to (`pull_unpack_ratio`).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use anyhow::{Context, Result};

use super::{Ctx, Method, MethodInfo, Prepared, Sample};
use crate::mountctl::{Mountctl, StoreGuard};
use crate::proc::{self, timed};
use crate::results::Role;

/// The methods of this module.
pub const IDS: &[&str] = &[
    "start-image",
    "start-host",
    "run-image",
    "bwrap-rootfs",
    "idle-50",
    "skopeo-unpack",
];
/// The baselines among [`IDS`].
pub const BASELINES: &[&str] = &["start-host", "bwrap-rootfs", "skopeo-unpack"];
/// Sandboxes of the idle row.
const IDLE_SANDBOXES: usize = 50;
/// The idle sandboxes' memory limit (a limit gives each its memory cgroup to read).
const IDLE_MEMORY: &str = "256m";
const IMAGES_ENV: &str = "COWSPACE_TEST_IMAGES";
const IMAGES_DEFAULT: &str = "/var/cache/cowspace/test-images";

/// The runtime root holding the image and the workspaces, and the unpacked rootfs
/// (removed on drop).
pub struct Fixture {
    store: StoreGuard,
    /// The first start on the image (its native lower built), untimed.
    first_start_s: f64,
    rootfs: PathBuf,
    plain: PathBuf,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = crate::cancel::remove_tree(&self.rootfs);
    }
}

impl Fixture {
    /// The runtime root's blob cache: the image's file data (its native lower's
    /// data-only layer).
    fn blobs(&self) -> PathBuf {
        self.store.root.join("cache/blobs")
    }

    fn mc(&self) -> &Mountctl {
        &self.store.mountctl
    }

    fn args(&self, args: &[&str]) -> Vec<OsString> {
        let mut v: Vec<OsString> = vec![
            self.mc().path.clone().into(),
            "--root".into(),
            self.store.root.clone().into(),
            "-q".into(),
        ];
        v.extend(args.iter().map(Into::into));
        v
    }

    fn run(&self, args: &[&str]) -> Result<Vec<u8>> {
        let a = self.args(args);
        proc::run(Command::new(&a[0]).args(&a[1..]))
    }

    fn json(&self, args: &[&str]) -> Result<serde_json::Value> {
        let a: Vec<&std::ffi::OsStr> = args.iter().map(|s| s.as_ref()).collect();
        self.mc().json(&self.store.root, &a)
    }
}

/// The cached minbase layout, or why there is none.
fn minbase() -> std::result::Result<PathBuf, String> {
    let dir = PathBuf::from(std::env::var(IMAGES_ENV).unwrap_or(IMAGES_DEFAULT.into()))
        .join("debian-minbase");
    if dir.join("index.json").is_file() {
        Ok(dir)
    } else {
        Err(format!(
            "no minbase image at {} (scripts/setup.sh makes it with mmdebstrap)",
            dir.display()
        ))
    }
}

fn fixture(ctx: &Ctx, mc: &Mountctl) -> Result<Fixture> {
    let layout = minbase().map_err(anyhow::Error::msg)?;
    eprintln!("bench: images: importing the minbase image, {IDLE_SANDBOXES} workspaces (untimed)…");
    let tree = ctx.scratch_path("images-ws-tree");
    std::fs::create_dir_all(tree.join("src"))?;
    std::fs::write(tree.join("src/main.py"), b"print('hello')\n")?;
    let store = StoreGuard::import(mc, ctx.scratch_path("images-sbx"), &tree)?;
    let mut f = Fixture {
        store,
        first_start_s: 0.0,
        rootfs: ctx.scratch_path("images-rootfs"),
        plain: tree,
    };
    f.json(&[
        "image",
        "import",
        &format!("{}:trixie", layout.display()),
        "--ref",
        "deb",
    ])?;
    for name in
        std::iter::once("cycle".to_string()).chain((0..IDLE_SANDBOXES).map(|i| format!("idle{i}")))
    {
        f.json(&["create", "bench", "--name", &name])?;
    }
    proc::run(Command::new("umoci").args([
        "unpack",
        "--image",
        &format!("{}:trixie", layout.display()),
        f.rootfs.to_str().context("scratch path")?,
    ]))?;
    // bwrap binds the workspace there (the root is bound read-only).
    std::fs::create_dir_all(f.rootfs.join("rootfs/workspace"))?;
    // The first start on an image builds its native lower (once per image): untimed,
    // reported in the notes.
    let ((), first) = timed(|| {
        f.run(&["sandbox", "start", "cycle", "--image", "deb"])?;
        f.run(&["sandbox", "stop", "cycle"]).map(drop)
    })?;
    f.first_start_s = first.wall_s();
    Ok(f)
}

/// Median wall time of `reps` runs of `step`, each followed by `after` (untimed).
fn median_of(
    ctx: &Ctx,
    reps: usize,
    mut step: impl FnMut() -> Result<()>,
    mut after: impl FnMut() -> Result<()>,
) -> Result<f64> {
    let mut v = Vec::new();
    for _ in 0..reps.max(1) {
        ctx.before_step()?;
        let ((), t) = timed(&mut step)?;
        after()?;
        v.push(t.wall_s());
    }
    crate::stats::median(&v).context("no sample")
}

struct StartRow {
    id: &'static str,
    f: Arc<Fixture>,
}

impl Method for StartRow {
    fn info(&self) -> MethodInfo {
        let (label, role, command) = match self.id {
            "start-image" => (
                "mountctl sandbox start WS --image (to ready)",
                Role::Cowspace,
                "mountctl sandbox start WS --image deb (then `sandbox stop WS`, untimed)",
            ),
            "start-host" => (
                "mountctl sandbox start WS, host directories (to ready)",
                Role::Baseline,
                "mountctl sandbox start WS (then `sandbox stop WS`, untimed)",
            ),
            "run-image" => (
                "mountctl run WS --image -- /bin/true",
                Role::Cowspace,
                "mountctl run WS --image deb -- /bin/true",
            ),
            _ => (
                "bwrap over the unpacked image",
                Role::Baseline,
                "bwrap --unshare-all --unshare-user --die-with-parent --new-session --ro-bind \
                 ROOTFS / --proc /proc --dev /dev --tmpfs /tmp --bind WS /workspace /bin/true \
                 (ROOTFS: umoci unpack of the image)",
            ),
        };
        MethodInfo {
            id: self.id,
            label: label.into(),
            role,
            command: command.into(),
        }
    }

    fn run_once(&mut self, ctx: &Ctx, _round: usize) -> Result<Sample> {
        let f = &self.f;
        let reps = ctx.fast_per_round();
        let s = match self.id {
            "start-image" => median_of(
                ctx,
                reps,
                || {
                    f.run(&["sandbox", "start", "cycle", "--image", "deb"])
                        .map(drop)
                },
                || f.run(&["sandbox", "stop", "cycle"]).map(drop),
            )?,
            "start-host" => median_of(
                ctx,
                reps,
                || f.run(&["sandbox", "start", "cycle"]).map(drop),
                || f.run(&["sandbox", "stop", "cycle"]).map(drop),
            )?,
            "run-image" => median_of(
                ctx,
                reps,
                || {
                    f.run(&["run", "cycle", "--image", "deb", "--", "/bin/true"])
                        .map(drop)
                },
                || Ok(()),
            )?,
            _ => {
                let rootfs = f.rootfs.join("rootfs");
                median_of(
                    ctx,
                    reps,
                    || {
                        proc::run(
                            Command::new("bwrap")
                                .args([
                                    "--unshare-all",
                                    "--unshare-user",
                                    "--die-with-parent",
                                    "--new-session",
                                    "--ro-bind",
                                ])
                                .arg(&rootfs)
                                .args(["/", "--proc", "/proc", "--dev", "/dev"])
                                .args(["--tmpfs", "/tmp", "--bind"])
                                .arg(&f.plain)
                                .args(["/workspace", "/bin/true"]),
                        )
                        .map(drop)
                    },
                    || Ok(()),
                )?
            }
        };
        Ok(vec![("start_s", s)])
    }
}

/// How long the sleepers get to finish their imports before a reading.
const SETTLE: std::time::Duration = std::time::Duration::from_secs(2);

/// Bytes of the image's blob-cache files (the data its sandboxes read) in the host's
/// page cache: util-linux `fincore` over every file (no `mincore(2)` here: this crate
/// has no unsafe code).
fn image_cache_bytes(blobs: &Path) -> Result<u64> {
    let out = proc::run(Command::new("sh").arg("-c").arg(
        "find \"$1\" -type f -print0 | xargs -0 -r fincore --bytes --noheadings --output RES",
    ).arg("sh").arg(blobs))?;
    String::from_utf8_lossy(&out)
        .split_whitespace()
        .map(|w| w.parse::<u64>().context("fincore's output"))
        .sum()
}

/// A `/proc/meminfo` value in bytes.
fn meminfo(key: &str) -> Result<u64> {
    let text = std::fs::read_to_string("/proc/meminfo")?;
    text.lines()
        .find_map(|l| {
            let rest = l.strip_prefix(key)?.strip_prefix(':')?;
            rest.split_whitespace().next()?.parse::<u64>().ok()
        })
        .map(|kib| kib << 10)
        .with_context(|| format!("no {key} in /proc/meminfo"))
}

/// `total_rss` and `total_cache` of the memory cgroup a sandbox's status names.
fn cgroup_charge(status: &serde_json::Value) -> Result<(u64, u64)> {
    let dirs: Vec<&str> = status["cgroups"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c.as_str())
        .collect();
    let mem = dirs
        .iter()
        .map(Path::new)
        .find(|d| d.join("memory.stat").is_file())
        .with_context(|| format!("no memory cgroup among {dirs:?}"))?;
    let text = std::fs::read_to_string(mem.join("memory.stat"))?;
    let get = |k: &str| {
        text.lines().find_map(|l| {
            l.strip_prefix(k)?
                .strip_prefix(' ')?
                .trim()
                .parse::<u64>()
                .ok()
        })
    };
    // cgroup v1 names them total_*; v2's memory.stat has anon and file.
    let rss = get("total_rss").or_else(|| get("anon")).unwrap_or(0);
    let cache = get("total_cache").or_else(|| get("file")).unwrap_or(0);
    Ok((rss, cache))
}

struct Idle {
    f: Arc<Fixture>,
}

/// The program each idle sandbox runs: the image's python3, asleep.
const SLEEPER: &str = "python3 -c 'import time; time.sleep(86400)' >/dev/null 2>&1 </dev/null &";

impl Idle {
    fn start(&self, i: usize) -> Result<serde_json::Value> {
        let name = format!("idle{i}");
        let s = self.f.json(&[
            "sandbox",
            "start",
            &name,
            "--image",
            "deb",
            "--memory",
            IDLE_MEMORY,
        ])?;
        self.f.run(&["exec", &name, "--", "sh", "-c", SLEEPER])?;
        Ok(s)
    }

    fn stop_all(&self) {
        for i in 0..IDLE_SANDBOXES {
            let _ = self.f.run(&["sandbox", "stop", &format!("idle{i}")]);
        }
    }
}

impl Method for Idle {
    fn info(&self) -> MethodInfo {
        MethodInfo {
            id: "idle-50",
            label: format!("{IDLE_SANDBOXES} sandboxes idle on one image"),
            role: Role::Cowspace,
            command: format!(
                "mountctl sandbox start idleN --image deb --memory {IDLE_MEMORY}; mountctl \
                 exec idleN -- sh -c \"{SLEEPER}\" (N = 0..{IDLE_SANDBOXES}; then all stopped)"
            ),
        }
    }

    fn slow(&self) -> bool {
        true
    }

    fn run_once(&mut self, _ctx: &Ctx, _round: usize) -> Result<Sample> {
        cancel_safe(
            || {
                super::drop_caches()?;
                let avail0 = meminfo("MemAvailable")?;
                let first = self.start(0)?;
                std::thread::sleep(SETTLE);
                let image1 = image_cache_bytes(&self.f.blobs())?;
                let mut statuses = vec![first];
                for i in 1..IDLE_SANDBOXES {
                    crate::cancel::check()?;
                    statuses.push(self.start(i)?);
                }
                std::thread::sleep(SETTLE);
                let image_n = image_cache_bytes(&self.f.blobs())?;
                let avail_n = meminfo("MemAvailable")?;
                let mut rss = 0u64;
                let mut cache_first = 0u64;
                let mut cache_rest = 0u64;
                for (i, s) in statuses.iter().enumerate() {
                    let (r, c) = cgroup_charge(s)?;
                    rss += r;
                    if i == 0 {
                        cache_first = c;
                    } else {
                        cache_rest += c;
                    }
                }
                let n = IDLE_SANDBOXES as f64;
                let rest = (IDLE_SANDBOXES - 1) as f64;
                Ok(vec![
                    (
                        "idle_host_bytes_per_sandbox",
                        avail0.saturating_sub(avail_n) as f64 / n,
                    ),
                    ("idle_rss_bytes_per_sandbox", rss as f64 / n),
                    ("image_cache_first_bytes", image1 as f64),
                    ("image_cache_all_bytes", image_n as f64),
                    ("cgroup_cache_first_bytes", cache_first as f64),
                    ("cgroup_cache_later_bytes", cache_rest as f64 / rest),
                ])
            },
            || self.stop_all(),
        )
    }
}

/// Runs `f`, then `cleanup` whatever happened.
fn cancel_safe<T>(f: impl FnOnce() -> Result<T>, cleanup: impl FnOnce()) -> Result<T> {
    let out = f();
    cleanup();
    out
}

struct SkopeoUnpack {
    /// `127.0.0.1:PORT/bench/img`.
    repo: String,
}

impl Method for SkopeoUnpack {
    fn info(&self) -> MethodInfo {
        MethodInfo {
            id: "skopeo-unpack",
            label: "skopeo copy + umoci unpack".into(),
            role: Role::Baseline,
            command: "skopeo copy --src-tls-verify=false docker://127.0.0.1:PORT/bench/img:t \
                      oci:DIR:t && umoci unpack --image DIR:t BUNDLE"
                .into(),
        }
    }

    fn run_once(&mut self, ctx: &Ctx, round: usize) -> Result<Sample> {
        let dir = ctx.scratch_path(&format!("skopeo-unpack-{round}"));
        let bundle = ctx.scratch_path(&format!("skopeo-bundle-{round}"));
        crate::cancel::remove_tree(&dir)?;
        crate::cancel::remove_tree(&bundle)?;
        let src = format!("docker://{}:t", self.repo);
        let dst = format!("oci:{}:t", dir.display());
        let image = format!("{}:t", dir.display());
        ctx.before_step()?;
        let ((), t) = timed(|| {
            proc::run(Command::new("skopeo").args([
                "copy",
                "--quiet",
                "--insecure-policy",
                "--src-tls-verify=false",
                &src,
                &dst,
            ]))?;
            proc::run(
                Command::new("umoci")
                    .args(["unpack", "--image", &image])
                    .arg(&bundle),
            )
            .map(drop)
        })?;
        crate::cancel::remove_tree(&dir)?;
        crate::cancel::remove_tree(&bundle)?;
        Ok(vec![("pull_s", t.wall_s())])
    }
}

/// The selected methods of [`IDS`]: ready, or skipped with why. `repo` is the pull
/// rows' image in the section's registry.
pub fn prepare(
    ctx: &Ctx,
    mc: &Mountctl,
    repo: &str,
    selected: &dyn Fn(&str) -> bool,
    notes: &mut Vec<String>,
) -> Result<(Vec<Prepared>, Option<Arc<Fixture>>)> {
    let mut out: Vec<Prepared> = Vec::new();
    if selected("skopeo-unpack") {
        out.push(Prepared::Ready(Box::new(SkopeoUnpack {
            repo: repo.to_string(),
        })));
    }
    let sandbox_ids: Vec<&'static str> = IDS
        .iter()
        .copied()
        .filter(|id| *id != "skopeo-unpack" && selected(id))
        .collect();
    if sandbox_ids.is_empty() {
        return Ok((out, None));
    }
    let skip = |why: String, out: &mut Vec<Prepared>| {
        out.extend(super::skip_all(
            IDS,
            BASELINES,
            &|id| sandbox_ids.contains(&id),
            &why,
        ));
    };
    if !ctx.is_root {
        skip("sandboxes on images need root".into(), &mut out);
        return Ok((out, None));
    }
    if let Err(why) = minbase() {
        skip(why, &mut out);
        return Ok((out, None));
    }
    let f = match fixture(ctx, mc) {
        Ok(f) => Arc::new(f),
        // A step the signal cut short is no reason to skip: the run ends, cleaned up.
        Err(e) if crate::cancel::interrupted() => return Err(e),
        Err(e) => {
            skip(format!("making the fixture failed: {e:#}"), &mut out);
            return Ok((out, None));
        }
    };
    notes.push(format!(
        "Sandbox rows: the Debian 13 minbase image of scripts/setup.sh (mmdebstrap \
         --variant=minbase with python3 and pip), imported as `deb` into {} ; workspaces of \
         a two-file tree (default materializer). bwrap-rootfs runs the image's own /bin/true \
         from its umoci-unpacked tree. idle-50 (after drop_caches): image_cache_* are the \
         bytes of the image's blob-cache files in the host's page cache (util-linux \
         fincore) once the first sandbox's python3 runs and once all 50 do: equal figures \
         mean one copy of the image's files in memory for all 50; cgroup_cache_* come from \
         each sandbox's memory cgroup `total_cache` (a page is charged to the first cgroup \
         that read it). The first start on the freshly \
         imported image (its native lower built, once per image; untimed) took {:.2} s.",
        f.store.root.display(),
        f.first_start_s
    ));
    for id in sandbox_ids {
        let m: Box<dyn Method> = if id == "idle-50" {
            Box::new(Idle { f: f.clone() })
        } else {
            Box::new(StartRow { id, f: f.clone() })
        };
        out.push(Prepared::Ready(m));
    }
    Ok((out, Some(f)))
}
