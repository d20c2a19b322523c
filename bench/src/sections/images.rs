//! Images: what pulling an OCI image into the store costs, against `skopeo copy` of the
//! same image to an OCI layout directory, from a real distribution registry
//! (`docker-registry`, started by the section on 127.0.0.1 with its storage in the
//! scratch directory, killed at its end). The image is built once (untimed) with
//! `umoci`: one layer holding the corpus tree under `/srv/corpus`, pushed with `skopeo`.
//! Methods:
//! - `pull`: `mountctl image pull` into a fresh runtime root each run (nothing of the
//!   image stored before), with the bytes it stored;
//! - `skopeo-copy`: `skopeo copy docker://… oci:DIR:t` into a fresh directory (the
//!   blobs as the registry serves them, nothing unpacked);
//! - a second image sharing the first's layer plus one small layer, pulled into the
//!   root that holds the first (`pull-related`): what it stores beside its own
//!   compressed layer sizes.

use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::{Ctx, Method, MethodInfo, Prepared, Sample, Section, metric};
use crate::mountctl::{Mountctl, StoreGuard, field_u64};
use crate::proc::{self, timed};
use crate::results::{Better, MethodResult, MetricDef, Role};

const IDS: &[&str] = &[
    "pull",
    "skopeo-copy",
    "pull-related",
    "start-image",
    "start-host",
    "run-image",
    "bwrap-rootfs",
    "idle-50",
    "skopeo-unpack",
];
/// How long the registry may take to listen.
const REGISTRY_START: Duration = Duration::from_secs(60);

/// The distribution registry on a free port of 127.0.0.1; killed (by pid) on drop.
struct Registry {
    child: Child,
    port: u16,
}

impl Registry {
    fn start(dir: &Path) -> Result<Registry> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let storage = dir.join("storage");
        std::fs::create_dir_all(&storage)?;
        let config = dir.join("registry.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: \
                 127.0.0.1:{port}\nlog:\n  level: error\n",
                storage.display()
            ),
        )?;
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("registry.log"))?)
            .spawn()
            .context("start docker-registry")?;
        let r = Registry { child, port };
        let deadline = Instant::now() + REGISTRY_START;
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                bail!("docker-registry did not listen within {REGISTRY_START:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(r)
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Shared {
    mountctl: Mountctl,
    /// `127.0.0.1:PORT/bench/img`.
    repo: String,
    /// The first image's compressed layer bytes; the related image's own.
    layer_bytes: u64,
    related_layer_bytes: u64,
}

pub struct ImagesSection {
    shared: Option<Arc<Shared>>,
    /// The sandbox rows' runtime root ([`super::images_start`]).
    sandboxes: Option<Arc<super::images_start::Fixture>>,
    registry: Option<Registry>,
    notes: Vec<String>,
}

impl ImagesSection {
    pub fn new() -> Self {
        Self {
            shared: None,
            sandboxes: None,
            registry: None,
            notes: Vec::new(),
        }
    }
}

fn fresh_root(sh: &Shared, ctx: &Ctx, name: &str) -> Result<StoreGuard> {
    let root = ctx.scratch_path(name);
    crate::cancel::remove_tree(&root)?;
    let g = StoreGuard {
        mountctl: sh.mountctl.clone(),
        root,
        remove_root: true,
    };
    g.mountctl.json(&g.root, &["init".as_ref()])?;
    Ok(g)
}

fn pull(g: &StoreGuard, reference: &str) -> Result<serde_json::Value> {
    g.mountctl.json(
        &g.root,
        &[
            "image".as_ref(),
            "pull".as_ref(),
            reference.as_ref(),
            "--ref".as_ref(),
            "img".as_ref(),
        ],
    )
}

struct Pull {
    sh: Arc<Shared>,
}

impl Method for Pull {
    fn info(&self) -> MethodInfo {
        MethodInfo {
            id: "pull",
            label: "mountctl image pull".into(),
            role: Role::Cowspace,
            command: "mountctl image pull 127.0.0.1:PORT/bench/img:t (a fresh root each run)"
                .into(),
        }
    }

    fn run_once(&mut self, ctx: &Ctx, round: usize) -> Result<Sample> {
        let g = fresh_root(&self.sh, ctx, &format!("pull-{round}"))?;
        ctx.before_step()?;
        let (v, t) = timed(|| pull(&g, &format!("{}:t", self.sh.repo)))?;
        let stored = field_u64(&v, "new_bytes_stored").context("pull: no new_bytes_stored")?;
        Ok(vec![
            ("pull_s", t.wall_s()),
            ("stored_bytes", stored as f64),
            ("layer_bytes", self.sh.layer_bytes as f64),
        ])
    }
}

struct SkopeoCopy {
    sh: Arc<Shared>,
}

impl Method for SkopeoCopy {
    fn info(&self) -> MethodInfo {
        MethodInfo {
            id: "skopeo-copy",
            label: "skopeo copy to an OCI directory".into(),
            role: Role::Baseline,
            command: "skopeo copy --src-tls-verify=false docker://127.0.0.1:PORT/bench/img:t \
                      oci:DIR:t"
                .into(),
        }
    }

    fn run_once(&mut self, ctx: &Ctx, round: usize) -> Result<Sample> {
        let dir = ctx.scratch_path(&format!("skopeo-{round}"));
        crate::cancel::remove_tree(&dir)?;
        let src = format!("docker://{}:t", self.sh.repo);
        let dst = format!("oci:{}:t", dir.display());
        ctx.before_step()?;
        let ((), t) = timed(|| {
            proc::run(Command::new("skopeo").args([
                "copy",
                "--quiet",
                "--insecure-policy",
                "--src-tls-verify=false",
                &src,
                &dst,
            ]))
            .map(drop)
        })?;
        crate::cancel::remove_tree(&dir)?;
        Ok(vec![("pull_s", t.wall_s())])
    }
}

struct PullRelated {
    sh: Arc<Shared>,
}

impl Method for PullRelated {
    fn info(&self) -> MethodInfo {
        MethodInfo {
            id: "pull-related",
            label: "mountctl image pull of a related image".into(),
            role: Role::Cowspace,
            command: "mountctl image pull …/bench/img:t2 into a root holding …:t".into(),
        }
    }

    fn run_once(&mut self, ctx: &Ctx, round: usize) -> Result<Sample> {
        let g = fresh_root(&self.sh, ctx, &format!("related-{round}"))?;
        pull(&g, &format!("{}:t", self.sh.repo))?;
        ctx.before_step()?;
        let (v, t) = timed(|| {
            g.mountctl.json(
                &g.root,
                &[
                    "image".as_ref(),
                    "pull".as_ref(),
                    format!("{}:t2", self.sh.repo).as_ref(),
                    "--ref".as_ref(),
                    "img2".as_ref(),
                ],
            )
        })?;
        let stored = field_u64(&v, "new_bytes_stored").context("pull: no new_bytes_stored")?;
        Ok(vec![
            ("pull_s", t.wall_s()),
            ("stored_bytes", stored as f64),
            ("layer_bytes", self.sh.related_layer_bytes as f64),
        ])
    }
}

/// Adds `metric` to `ours`: its `of` samples over `base`'s, paired by run.
fn ratio(methods: &mut [MethodResult], ours: &str, base: &str, of: &str, metric: &str) {
    let Some(b) = methods
        .iter()
        .find(|m| m.id == base)
        .and_then(|m| m.samples.get(of).cloned())
    else {
        return;
    };
    let Some(m) = methods.iter_mut().find(|m| m.id == ours) else {
        return;
    };
    let Some(a) = m.samples.get(of) else {
        return;
    };
    let v = super::network::clients::paired(a, &b, |a, b| a / b);
    if !v.is_empty() {
        m.samples.insert(metric.into(), v);
    }
}

/// `umoci` with `args`, failing with its output.
fn umoci(args: &[&str]) -> Result<()> {
    proc::run(Command::new("umoci").args(args)).map(drop)
}

/// Sum of the compressed layer sizes of `layout:tag` that are not in `minus`.
fn layer_sizes(layout: &Path, tag: &str, minus: &[(String, u64)]) -> Result<Vec<(String, u64)>> {
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json"))?)?;
    let desc = index["manifests"]
        .as_array()
        .and_then(|m| {
            m.iter().find(|d| {
                d["annotations"]["org.opencontainers.image.ref.name"].as_str() == Some(tag)
            })
        })
        .context("tag not in index.json")?;
    let blob = |d: &str| layout.join("blobs/sha256").join(&d["sha256:".len()..]);
    let manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(blob(
        desc["digest"].as_str().context("digest")?,
    ))?)?;
    Ok(manifest["layers"]
        .as_array()
        .context("layers")?
        .iter()
        .filter_map(|l| Some((l["digest"].as_str()?.to_string(), l["size"].as_u64()?)))
        .filter(|l| !minus.contains(l))
        .collect())
}

impl Section for ImagesSection {
    fn id(&self) -> &'static str {
        "images"
    }

    fn title(&self) -> String {
        "Images: pull from a registry on 127.0.0.1".into()
    }

    fn description(&self) -> String {
        "An OCI image of one layer holding the corpus tree (built with umoci, untimed), \
         pushed with skopeo to docker-registry on 127.0.0.1. pull: mountctl image pull into \
         a fresh root each run, beside skopeo copy of the same image to an OCI directory \
         (the pull_ratio row pairs the two run by run). pull-related: a second image (the \
         first's layer and one small layer of its own) pulled into a root holding the \
         first: stored bytes beside its own layer's compressed size. Times are wall-clock \
         of the whole command, process start included."
            .into()
    }

    fn metrics(&self) -> Vec<MetricDef> {
        use Better::Lower;
        vec![
            metric("pull_s", "pull", "s", Lower),
            metric(
                "pull_ratio",
                "pull ÷ skopeo copy, paired by run",
                "ratio",
                Lower,
            ),
            metric("stored_bytes", "bytes stored", "bytes", Lower),
            metric(
                "layer_bytes",
                "compressed layers new to the root",
                "bytes",
                Lower,
            ),
            metric(
                "pull_unpack_ratio",
                "pull ÷ (skopeo copy + umoci unpack), paired by run",
                "ratio",
                Lower,
            ),
            metric(
                "start_s",
                "sandbox start to ready (run: to /bin/true's exit), median of the round",
                "s",
                Lower,
            ),
            metric(
                "start_ratio",
                "start --image ÷ start on the host directories, paired by run",
                "ratio",
                Lower,
            ),
            metric(
                "idle_host_bytes_per_sandbox",
                "host memory per idle sandbox (MemAvailable drop ÷ 50)",
                "bytes",
                Lower,
            ),
            metric(
                "idle_rss_bytes_per_sandbox",
                "anonymous memory per idle sandbox (its memory cgroup)",
                "bytes",
                Lower,
            ),
            metric(
                "image_cache_first_bytes",
                "the image's files in the page cache, one sandbox running",
                "bytes",
                Lower,
            ),
            metric(
                "image_cache_all_bytes",
                "the image's files in the page cache, all 50 running",
                "bytes",
                Lower,
            ),
            metric(
                "cgroup_cache_first_bytes",
                "page cache charged to the first sandbox's cgroup",
                "bytes",
                Lower,
            ),
            metric(
                "cgroup_cache_later_bytes",
                "page cache charged to each later sandbox's cgroup (mean)",
                "bytes",
                Lower,
            ),
        ]
    }

    fn method_ids(&self) -> Vec<&'static str> {
        IDS.to_vec()
    }

    fn notes(&self) -> Vec<String> {
        self.notes.clone()
    }

    fn derive(&self, methods: &mut [MethodResult]) {
        ratio(
            methods,
            "start-image",
            "start-host",
            "start_s",
            "start_ratio",
        );
        ratio(
            methods,
            "pull",
            "skopeo-unpack",
            "pull_s",
            "pull_unpack_ratio",
        );
        let Some(base) = methods.iter().find(|m| m.id == "skopeo-copy") else {
            return;
        };
        let Some(b) = base.samples.get("pull_s").cloned() else {
            return;
        };
        let Some(ours) = methods.iter_mut().find(|m| m.id == "pull") else {
            return;
        };
        let Some(a) = ours.samples.get("pull_s") else {
            return;
        };
        let v = super::network::clients::paired(a, &b, |a, b| a / b);
        if !v.is_empty() {
            ours.samples.insert("pull_ratio".into(), v);
        }
    }

    fn prepare(&mut self, ctx: &Ctx, selected: &dyn Fn(&str) -> bool) -> Result<Vec<Prepared>> {
        let baselines = [&["skopeo-copy"], super::images_start::BASELINES].concat();
        let skip_all = |why: String| super::skip_all(IDS, &baselines, selected, &why);
        if !IDS.iter().any(|id| selected(id)) {
            return Ok(Vec::new());
        }
        let mountctl = match &ctx.mountctl {
            Ok(m) => m.clone(),
            Err(why) => return Ok(skip_all(why.clone())),
        };
        for tool in ["umoci", "skopeo", "docker-registry"] {
            if proc::which(tool).is_none() {
                return Ok(skip_all(format!(
                    "{tool} not found on PATH (scripts/setup.sh installs it)"
                )));
            }
        }
        eprintln!("bench: images: building the images and pushing them (untimed)…");
        let work = ctx.scratch_path("images");
        std::fs::create_dir_all(&work)?;
        let layout = work.join("oci");
        let l = layout.to_str().context("scratch path")?.to_string();
        umoci(&["init", "--layout", &l])?;
        umoci(&["new", "--image", &format!("{l}:t")])?;
        let bundle = work.join("bundle");
        let b = bundle.to_str().context("scratch path")?.to_string();
        umoci(&["unpack", "--rootless", "--image", &format!("{l}:t"), &b])?;
        let srv = bundle.join("rootfs/srv");
        std::fs::create_dir_all(&srv)?;
        proc::run(
            Command::new("cp")
                .arg("-a")
                .arg(&ctx.corpus.tree)
                .arg(srv.join("corpus")),
        )?;
        umoci(&["repack", "--image", &format!("{l}:t"), &b])?;
        // t2 on top of t: t's layer, and a layer of its own.
        let bundle2 = work.join("bundle2");
        let b2 = bundle2.to_str().context("scratch path")?.to_string();
        umoci(&["unpack", "--rootless", "--image", &format!("{l}:t"), &b2])?;
        std::fs::write(
            bundle2.join("rootfs/srv/extra"),
            b"a file of the second image\n",
        )?;
        umoci(&["repack", "--image", &format!("{l}:t2"), &b2])?;
        crate::cancel::remove_tree(&bundle2)?;
        let registry = Registry::start(&work)?;
        let repo = format!("127.0.0.1:{}/bench/img", registry.port);
        self.registry = Some(registry);
        for tag in ["t", "t2"] {
            proc::run(Command::new("skopeo").args([
                "copy",
                "--quiet",
                "--insecure-policy",
                "--dest-tls-verify=false",
                &format!("oci:{l}:{tag}"),
                &format!("docker://{repo}:{tag}"),
            ]))?;
        }
        let first = layer_sizes(&layout, "t", &[])?;
        let own = layer_sizes(&layout, "t2", &first)?;
        let layer_bytes = first.iter().map(|l| l.1).sum();
        let related_layer_bytes = own.iter().map(|l| l.1).sum();
        crate::cancel::remove_tree(&bundle)?;
        self.notes.push(format!(
            "Registry: docker-registry on 127.0.0.1 (filesystem storage in the scratch \
             directory). Image t: one gzip layer of {layer_bytes} bytes (the corpus tree \
             {} under /srv/corpus); image t2: t's layer and {} of its own ({related_layer_bytes} \
             bytes).",
            ctx.corpus.tree.display(),
            own.len()
        ));
        let (more, fixture) =
            super::images_start::prepare(ctx, &mountctl, &repo, selected, &mut self.notes)?;
        self.sandboxes = fixture;
        let sh = Arc::new(Shared {
            mountctl,
            repo,
            layer_bytes,
            related_layer_bytes,
        });
        self.shared = Some(sh.clone());
        let all: Vec<Box<dyn Method>> = vec![
            Box::new(Pull { sh: sh.clone() }),
            Box::new(SkopeoCopy { sh: sh.clone() }),
            Box::new(PullRelated { sh }),
        ];
        Ok(all
            .into_iter()
            .filter(|m| selected(m.info().id))
            .map(Prepared::Ready)
            .chain(more)
            .collect())
    }
}
