//! Remotes: what moving a tree through an S3-compatible object store costs, against a
//! real server on 127.0.0.1 (moto's, `python3 -m moto.server`, started by the section
//! and killed at its end). Fresh runtime roots stand for fresh hosts. Methods:
//! - `push`: `mountctl push` of the corpus' git checkout (imported once, untimed) to a
//!   new prefix each round; beside `tar | zstd -T0 -3` piped into one multipart upload
//!   to the same server (`tar-zstd-put`), through the same S3 client library
//!   (`object_store`) the product uses.
//! - `lazy`: an empty host makes a workspace of the pushed ref in one step (`create`),
//!   runs the first `git status` and reads N files; the bytes fetched for each, beside
//!   the `zstd -3` size of the files read.
//! - `fetch-create`: the same in two steps: `fetch` (the metadata alone), then two
//!   `create`s (the first starts the daemon).
//! - `pull`: an empty host pulls the whole snapshot; beside one GET of the tar.zst
//!   object (`get-one-object`).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as Key;
use object_store::{ObjectStore, ObjectStoreExt, WriteMultipart};
use serde_json::Value;

use super::{Ctx, Method, MethodInfo, Prepared, Sample, Section, metric};
use crate::corpus::git;
use crate::mountctl::{Mountctl, StoreGuard, field_u64};
use crate::proc::{self, timed};
use crate::results::{Better, MetricDef, Role};

const IDS: &[&str] = &[
    "push",
    "tar-zstd-put",
    "lazy",
    "fetch-create",
    "pull",
    "get-one-object",
];
const BUCKET: &str = "bench";
/// The prefix the lazy and pull methods read from (pushed once, untimed).
const PREFIX: &str = "fleet";
/// Files read in the lazy workspace (the "reads 20 files").
const FILES_READ: usize = 20;
/// The keys the server is started with (moto takes any).
const KEY_ID: &str = "bench";
const SECRET: &str = "bench-secret";
/// Part size of the baseline's multipart upload.
const PART_BYTES: usize = 16 << 20;
/// How long one request of the baseline may take.
const REQUEST_SECS: u64 = 600;
/// How long the server may take to listen.
const SERVER_START_SECS: u64 = 60;

/// moto's S3 server on a free port of 127.0.0.1; killed (by pid) on drop.
struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn start() -> std::result::Result<Server, String> {
        let probe = Command::new("python3")
            .args(["-c", "import moto.server"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if !probe.is_ok_and(|s| s.success()) {
            return Err(
                "moto's S3 server is not installed (pip install 'moto[server]'; \
                 scripts/test.sh installs it)"
                    .into(),
            );
        }
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free port on 127.0.0.1: {e}"))?
            .port();
        let child = Command::new("python3")
            .args(["-m", "moto.server", "-H", "127.0.0.1", "-p"])
            .arg(port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting python3 -m moto.server: {e}"))?;
        let mut s = Server { child, port };
        let deadline = Instant::now() + Duration::from_secs(SERVER_START_SECS);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline || s.child.try_wait().ok().flatten().is_some() {
                return Err(format!(
                    "moto's server did not listen on 127.0.0.1:{port} within {SERVER_START_SECS} s"
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        s.make_bucket().map_err(|e| format!("{e:#}"))?;
        Ok(s)
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// `PUT /BUCKET` (moto makes buckets unsigned; `object_store` cannot make them).
    fn make_bucket(&mut self) -> Result<()> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port))?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        write!(
            s,
            "PUT /{BUCKET} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        )?;
        let mut resp = String::new();
        s.read_to_string(&mut resp)?;
        let status = resp.split_whitespace().nth(1).unwrap_or("");
        anyhow::ensure!(
            status.starts_with('2'),
            "making bucket {BUCKET} on moto: {}",
            resp.lines().next().unwrap_or("")
        );
        Ok(())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The baseline's S3 client: `object_store`, as the product's, on its own runtime.
struct Client {
    rt: tokio::runtime::Runtime,
    s3: AmazonS3,
}

impl Client {
    fn new(endpoint: &str) -> Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let s3 = AmazonS3Builder::new()
            .with_endpoint(endpoint)
            .with_bucket_name(BUCKET)
            .with_region("us-east-1")
            .with_access_key_id(KEY_ID)
            .with_secret_access_key(SECRET)
            .with_virtual_hosted_style_request(false)
            // A part of a large upload to a busy test server may take a while.
            .with_client_options(
                object_store::ClientOptions::new()
                    .with_allow_http(true)
                    .with_timeout(Duration::from_secs(REQUEST_SECS)),
            )
            .build()?;
        Ok(Self { rt, s3 })
    }

    /// Uploads what `reader` gives as one object (multipart, `PART_BYTES` parts);
    /// returns the bytes sent.
    fn upload(&self, key: &str, mut reader: impl Read) -> Result<u64> {
        self.rt.block_on(async {
            let up = self.s3.put_multipart(&Key::from(key)).await?;
            let mut w = WriteMultipart::new_with_chunk_size(up, PART_BYTES);
            let mut buf = vec![0u8; 1 << 20];
            let mut total = 0u64;
            loop {
                let n = reader.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                w.wait_for_capacity(4).await?;
                w.write(&buf[..n]);
                total += n as u64;
            }
            w.finish().await?;
            Ok(total)
        })
    }

    /// Downloads one object into `to`; returns its size.
    fn download(&self, key: &str, to: &Path) -> Result<u64> {
        use futures::StreamExt;
        self.rt.block_on(async {
            let mut stream = self.s3.get(&Key::from(key)).await?.into_stream();
            let mut f = std::fs::File::create(to)?;
            let mut total = 0u64;
            while let Some(b) = stream.next().await {
                let b = b?;
                f.write_all(&b)?;
                total += b.len() as u64;
            }
            f.sync_all()?;
            Ok(total)
        })
    }

    /// Deletes every object below `prefix` (untimed, between rounds).
    fn delete_prefix(&self, prefix: &str) -> Result<()> {
        use futures::TryStreamExt;
        self.rt.block_on(async {
            let p = Key::from(prefix);
            let metas: Vec<_> = self.s3.list(Some(&p)).try_collect().await?;
            for m in metas {
                self.s3.delete(&m.location).await?;
            }
            Ok(())
        })
    }
}

/// What the section shares with its methods.
struct Shared {
    mountctl: Mountctl,
    endpoint: String,
    client: Client,
    tree: PathBuf,
    /// Host A: the checkout imported as ref `bench` and pushed to `PREFIX`.
    host_a: StoreGuard,
    index_bytes: u64,
    /// The files the lazy workspace reads (relative), and their `zstd -3` size.
    files: Vec<PathBuf>,
    files_zstd_bytes: u64,
    /// The tar.zst the GET baseline downloads.
    tar_key: String,
}

/// A fresh runtime root with remote `origin` on `prefix`: an empty host.
fn fresh_host(sh: &Shared, ctx: &Ctx, name: &str, prefix: &str) -> Result<StoreGuard> {
    let root = ctx.scratch_path(name);
    crate::cancel::remove_tree(&root)?;
    let g = StoreGuard {
        mountctl: sh.mountctl.clone(),
        root,
        remove_root: true,
    };
    g.mountctl.json(&g.root, &["init".as_ref()])?;
    add_remote(&g, "origin", prefix, &sh.endpoint)?;
    Ok(g)
}

fn add_remote(g: &StoreGuard, name: &str, prefix: &str, endpoint: &str) -> Result<()> {
    let url = format!("s3://{BUCKET}/{prefix}");
    g.mountctl.json(
        &g.root,
        &[
            "remote".as_ref(),
            "add".as_ref(),
            name.as_ref(),
            url.as_ref(),
            "--endpoint".as_ref(),
            endpoint.as_ref(),
        ],
    )?;
    Ok(())
}

/// The bytes the root's only remote has fetched so far (`remote list`).
fn fetched_bytes(g: &StoreGuard) -> Result<u64> {
    let v = g
        .mountctl
        .json(&g.root, &["remote".as_ref(), "list".as_ref()])?;
    v.get(0)
        .and_then(|r| r.get("fetched"))
        .and_then(|f| field_u64(f, "bytes"))
        .context("`remote list` printed no fetched bytes")
}

/// `N` regular, non-empty files of `tree` outside `.git`, spread evenly over a sorted walk.
fn pick_files(tree: &Path, n: usize) -> Result<Vec<PathBuf>> {
    let mut all = Vec::new();
    let mut stack = vec![tree.to_path_buf()];
    while let Some(d) = stack.pop() {
        let mut entries: Vec<_> = std::fs::read_dir(&d)?.flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let ft = e.file_type()?;
            if ft.is_dir() && e.file_name() != ".git" {
                stack.push(e.path());
            } else if ft.is_file() && e.metadata()?.len() > 0 {
                all.push(e.path().strip_prefix(tree)?.to_path_buf());
            }
        }
    }
    all.sort();
    anyhow::ensure!(!all.is_empty(), "no regular files in {}", tree.display());
    let step = (all.len() / n).max(1);
    Ok(all.into_iter().step_by(step).take(n).collect())
}

/// The `zstd -3` size of `files` of `tree` concatenated.
fn zstd_size(tree: &Path, files: &[PathBuf]) -> Result<u64> {
    let mut c = Command::new("sh");
    c.args(["-c", "cat \"$@\" | zstd -q -3 -c | wc -c", "sh"])
        .args(files.iter().map(|f| tree.join(f)));
    let out = proc::run(&mut c)?;
    Ok(String::from_utf8_lossy(&out).trim().parse()?)
}

/// `tar -C TREE -cf - . | zstd -T0 -3 -q -c`, its stdout to read.
fn tar_zstd(tree: &Path) -> Result<Child> {
    Command::new("sh")
        .arg("-c")
        .arg("tar -C \"$1\" -cf - . | zstd -q -T0 -3 -c")
        .arg("sh")
        .arg(tree)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting tar | zstd")
}

fn wait_ok(mut child: Child, what: &str) -> Result<()> {
    let mut err = Vec::new();
    if let Some(mut e) = child.stderr.take() {
        e.read_to_end(&mut err)?;
    }
    let st = child.wait()?;
    if !st.success() {
        bail!("{what} failed ({st}): {}", proc::tail(&err, &[]));
    }
    Ok(())
}

pub struct RemoteSection {
    /// The hosts; dropped before `server` (fields drop in order), so their daemons stop
    /// while the server still answers.
    shared: Option<Arc<Shared>>,
    server: Option<Server>,
    notes: Vec<String>,
}

impl RemoteSection {
    pub fn new() -> Self {
        Self {
            shared: None,
            server: None,
            notes: Vec::new(),
        }
    }
}

struct Push {
    sh: Arc<Shared>,
}

impl Method for Push {
    fn info(&self) -> MethodInfo {
        MethodInfo {
            id: "push",
            label: "mountctl push".into(),
            role: Role::Cowspace,
            command: "mountctl push bench --remote rN (a new prefix each run)".into(),
        }
    }

    fn slow(&self) -> bool {
        true
    }

    fn run_once(&mut self, ctx: &Ctx, round: usize) -> Result<Sample> {
        let name = format!("push{round}");
        let prefix = format!("push-{round}");
        add_remote(&self.sh.host_a, &name, &prefix, &self.sh.endpoint)?;
        ctx.before_step()?;
        let (v, t) = timed(|| {
            self.sh.host_a.mountctl.json(
                &self.sh.host_a.root,
                &[
                    "push".as_ref(),
                    "bench".as_ref(),
                    "--remote".as_ref(),
                    name.as_ref(),
                ],
            )
        })?;
        let bytes = field_u64(&v, "bytes_uploaded").context("push printed no bytes_uploaded")?;
        self.sh.host_a.mountctl.json(
            &self.sh.host_a.root,
            &["remote".as_ref(), "remove".as_ref(), name.as_ref()],
        )?;
        self.sh.client.delete_prefix(&prefix)?;
        Ok(vec![
            ("upload_s", t.wall_s()),
            ("upload_bytes", bytes as f64),
        ])
    }
}

struct TarPut {
    sh: Arc<Shared>,
}

impl Method for TarPut {
    fn info(&self) -> MethodInfo {
        MethodInfo {
            id: "tar-zstd-put",
            label: "tar | zstd -T0 -3 | one upload".into(),
            role: Role::Baseline,
            command: "tar -C TREE -cf - . | zstd -T0 -3 | (multipart upload of one object)".into(),
        }
    }

    fn slow(&self) -> bool {
        true
    }

    fn run_once(&mut self, ctx: &Ctx, round: usize) -> Result<Sample> {
        let key = format!("baseline-{round}/tree.tar.zst");
        ctx.before_step()?;
        let (bytes, t) = timed(|| {
            let mut child = tar_zstd(&self.sh.tree)?;
            let out = child.stdout.take().context("tar | zstd stdout")?;
            let bytes = self.sh.client.upload(&key, out)?;
            wait_ok(child, "tar | zstd")?;
            Ok(bytes)
        })?;
        self.sh.client.delete_prefix(&format!("baseline-{round}"))?;
        Ok(vec![
            ("upload_s", t.wall_s()),
            ("upload_bytes", bytes as f64),
        ])
    }
}

struct Lazy {
    sh: Arc<Shared>,
}

impl Method for Lazy {
    fn info(&self) -> MethodInfo {
        MethodInfo {
            id: "lazy",
            label: "fresh host: create, git status, reads".into(),
            role: Role::Cowspace,
            command: format!(
                "mountctl create bench (empty root, remote origin); git status; read {FILES_READ} files"
            ),
        }
    }

    fn run_once(&mut self, ctx: &Ctx, round: usize) -> Result<Sample> {
        let b = fresh_host(&self.sh, ctx, &format!("host-b-{round}"), PREFIX)?;
        ctx.before_step()?;
        let (ws, t) = timed(|| {
            b.mountctl
                .json(&b.root, &["create".as_ref(), "bench".as_ref()])
        })?;
        let path = PathBuf::from(
            ws.get("path")
                .and_then(Value::as_str)
                .context("create printed no path")?,
        );
        let mut sample = vec![
            ("usable_s", t.wall_s()),
            ("metadata_bytes", self.sh.index_bytes as f64),
        ];
        let before = fetched_bytes(&b)?;
        if path.join(".git").exists() {
            ctx.before_step()?;
            let (_, g) = timed(|| {
                let out = proc::run(git().arg("-C").arg(&path).args(["status", "--porcelain"]))?;
                anyhow::ensure!(
                    out.is_empty(),
                    "git status in a fresh workspace is not clean: {}",
                    String::from_utf8_lossy(&out)
                );
                Ok(())
            })?;
            sample.push(("git_status_s", g.wall_s()));
        }
        let after_git = fetched_bytes(&b)?;
        sample.push(("git_status_fetched_bytes", (after_git - before) as f64));
        for f in &self.sh.files {
            let got = std::fs::read(path.join(f))?;
            let want = std::fs::read(self.sh.tree.join(f))?;
            anyhow::ensure!(got == want, "{} reads other bytes", f.display());
        }
        let reads = fetched_bytes(&b)? - after_git;
        sample.push(("reads_fetched_bytes", reads as f64));
        sample.push(("reads_zstd_bytes", self.sh.files_zstd_bytes as f64));
        sample.push((
            "reads_fetched_ratio",
            reads as f64 / self.sh.files_zstd_bytes.max(1) as f64,
        ));
        Ok(sample)
    }
}

struct FetchCreate {
    sh: Arc<Shared>,
}

impl Method for FetchCreate {
    fn info(&self) -> MethodInfo {
        MethodInfo {
            id: "fetch-create",
            label: "fresh host, two steps: fetch, create".into(),
            role: Role::Cowspace,
            command: "mountctl fetch; mountctl create origin/bench (twice)".into(),
        }
    }

    fn run_once(&mut self, ctx: &Ctx, round: usize) -> Result<Sample> {
        let d = fresh_host(&self.sh, ctx, &format!("host-d-{round}"), PREFIX)?;
        ctx.before_step()?;
        let (_, f) = timed(|| d.mountctl.json(&d.root, &["fetch".as_ref()]))?;
        let create = || {
            timed(|| {
                d.mountctl
                    .json(&d.root, &["create".as_ref(), "origin/bench".as_ref()])
            })
        };
        let (_, c1) = create()?;
        let (_, c2) = create()?;
        Ok(vec![
            ("fetch_s", f.wall_s()),
            ("usable_s", f.wall_s() + c1.wall_s()),
            ("later_create_s", c2.wall_s()),
        ])
    }
}

struct Pull {
    sh: Arc<Shared>,
}

impl Method for Pull {
    fn info(&self) -> MethodInfo {
        MethodInfo {
            id: "pull",
            label: "mountctl pull".into(),
            role: Role::Cowspace,
            command: "mountctl pull bench (empty root, remote origin)".into(),
        }
    }

    fn slow(&self) -> bool {
        true
    }

    fn run_once(&mut self, ctx: &Ctx, round: usize) -> Result<Sample> {
        let c = fresh_host(&self.sh, ctx, &format!("host-c-{round}"), PREFIX)?;
        ctx.before_step()?;
        let (v, t) = timed(|| {
            c.mountctl
                .json(&c.root, &["pull".as_ref(), "bench".as_ref()])
        })?;
        let bytes = v
            .get("fetched")
            .and_then(|f| field_u64(f, "bytes"))
            .context("pull printed no fetched bytes")?;
        Ok(vec![
            ("download_s", t.wall_s()),
            ("download_bytes", bytes as f64),
        ])
    }
}

struct GetOne {
    sh: Arc<Shared>,
}

impl Method for GetOne {
    fn info(&self) -> MethodInfo {
        MethodInfo {
            id: "get-one-object",
            label: "one GET of the tar.zst".into(),
            role: Role::Baseline,
            command: "(GET of one object: the tree's tar | zstd -T0 -3, to a file)".into(),
        }
    }

    fn slow(&self) -> bool {
        true
    }

    fn run_once(&mut self, ctx: &Ctx, round: usize) -> Result<Sample> {
        let to = ctx.scratch_path(&format!("got-{round}.tar.zst"));
        ctx.before_step()?;
        let (bytes, t) = timed(|| self.sh.client.download(&self.sh.tar_key, &to))?;
        std::fs::remove_file(&to)?;
        Ok(vec![
            ("download_s", t.wall_s()),
            ("download_bytes", bytes as f64),
        ])
    }
}

impl Section for RemoteSection {
    fn id(&self) -> &'static str {
        "remote"
    }

    fn title(&self) -> String {
        "Remotes: push, a lazy workspace on a fresh host, pull".into()
    }

    fn description(&self) -> String {
        format!(
            "The corpus' git checkout, imported on host A (untimed), pushed to moto's S3 \
             server on 127.0.0.1. push: to a new prefix each run, beside tar | zstd -T0 -3 \
             piped into one multipart upload (the same client library). lazy: an empty \
             root makes a workspace of the pushed ref in one step, then the first git \
             status and {FILES_READ} file reads (each checked against the tree), with the \
             bytes fetched for each beside the zstd -3 size of the files read. \
             fetch-create: the same host state in two steps (fetch, then two creates). \
             pull: an empty root pulls the whole snapshot, beside one GET of the tar.zst. \
             Times are wall-clock of the whole command, process start included."
        )
    }

    fn metrics(&self) -> Vec<MetricDef> {
        use Better::Lower;
        vec![
            metric("upload_s", "upload", "s", Lower),
            metric("upload_bytes", "uploaded", "bytes", Lower),
            metric("usable_s", "fresh host: usable workspace", "s", Lower),
            metric(
                "metadata_bytes",
                "metadata fetched (the snapshot's index, one GET)",
                "bytes",
                Lower,
            ),
            metric("fetch_s", "fetch, metadata only", "s", Lower),
            metric("later_create_s", "a later create", "s", Lower),
            metric("git_status_s", "first git status", "s", Lower),
            metric(
                "git_status_fetched_bytes",
                "fetched for git status",
                "bytes",
                Lower,
            ),
            metric(
                "reads_fetched_bytes",
                "fetched for the file reads",
                "bytes",
                Lower,
            ),
            metric(
                "reads_zstd_bytes",
                "zstd -3 of the files read",
                "bytes",
                Lower,
            ),
            metric(
                "reads_fetched_ratio",
                "fetched ÷ zstd -3 of the files read",
                "ratio",
                Lower,
            ),
            metric("download_s", "download", "s", Lower),
            metric("download_bytes", "downloaded", "bytes", Lower),
        ]
    }

    fn method_ids(&self) -> Vec<&'static str> {
        IDS.to_vec()
    }

    fn notes(&self) -> Vec<String> {
        self.notes.clone()
    }

    fn prepare(&mut self, ctx: &Ctx, selected: &dyn Fn(&str) -> bool) -> Result<Vec<Prepared>> {
        let skip_all =
            |why: String| super::skip_all(IDS, &["tar-zstd-put", "get-one-object"], selected, &why);
        if !IDS.iter().any(|id| selected(id)) {
            return Ok(Vec::new());
        }
        let mountctl = match &ctx.mountctl {
            Ok(m) => m.clone(),
            Err(why) => return Ok(skip_all(why.clone())),
        };
        if !ctx.is_root {
            return Ok(skip_all(
                "workspaces mount: needs root (run bench as root)".into(),
            ));
        }
        let server = match Server::start() {
            Ok(s) => s,
            Err(why) => return Ok(skip_all(why)),
        };
        let endpoint = server.endpoint();
        self.server = Some(server);
        let mountctl = mountctl
            .with_env("AWS_ACCESS_KEY_ID", KEY_ID)
            .with_env("AWS_SECRET_ACCESS_KEY", SECRET);
        let tree = ctx.corpus.git_checkout(ctx.scratch)?;
        eprintln!("bench: remote: importing and pushing the checkout (untimed)…");
        let host_a = StoreGuard::import(&mountctl, ctx.scratch_path("host-a"), &tree)?;
        add_remote(&host_a, "origin", PREFIX, &endpoint)?;
        let pushed = host_a
            .mountctl
            .json(&host_a.root, &["push".as_ref(), "bench".as_ref()])?;
        let index_bytes = field_u64(&pushed, "index_bytes").context("push: no index_bytes")?;
        let files = pick_files(&tree, FILES_READ)?;
        let files_zstd_bytes = zstd_size(&tree, &files)?;
        let client = Client::new(&endpoint)?;
        let tar_key = "baseline/tree.tar.zst".to_string();
        let mut child = tar_zstd(&tree)?;
        let out = child.stdout.take().context("tar | zstd stdout")?;
        client.upload(&tar_key, out)?;
        wait_ok(child, "tar | zstd")?;
        self.notes.push(format!(
            "Server: moto's S3 server (`python3 -m moto.server`, in memory) on {endpoint}. \
             Tree: {} (the corpus' git checkout, `.git` included). Files read: {} regular \
             files spread evenly over the sorted walk outside `.git` ({} bytes; zstd -3: \
             {files_zstd_bytes} bytes), the first {}.",
            tree.display(),
            files.len(),
            files
                .iter()
                .map(|f| std::fs::metadata(tree.join(f)).map_or(0, |m| m.len()))
                .sum::<u64>(),
            files
                .first()
                .map_or(String::new(), |f| f.display().to_string()),
        ));
        let sh = Arc::new(Shared {
            mountctl,
            endpoint,
            client,
            tree,
            host_a,
            index_bytes,
            files,
            files_zstd_bytes,
            tar_key,
        });
        self.shared = Some(sh.clone());
        let mut out: Vec<Prepared> = Vec::new();
        let all: Vec<Box<dyn Method>> = vec![
            Box::new(Push { sh: sh.clone() }),
            Box::new(TarPut { sh: sh.clone() }),
            Box::new(Lazy { sh: sh.clone() }),
            Box::new(FetchCreate { sh: sh.clone() }),
            Box::new(Pull { sh: sh.clone() }),
            Box::new(GetOne { sh }),
        ];
        for m in all {
            if selected(m.info().id) {
                out.push(Prepared::Ready(m));
            }
        }
        Ok(out)
    }
}
