//! Remotes end to end against a real S3-compatible server on 127.0.0.1 (moto's server,
//! installed by `scripts/test.sh`): two runtime roots stand for two hosts. Host A imports
//! and pushes; host B, empty, makes a workspace of the remote snapshot at once, runs
//! `git status`, reads files and builds, fetching only what it reads, and its commit
//! pushed back is pulled by A intact. Faults go through [`Proxy`], a TCP relay in the test
//! that can stop answering, or cut the connection at the first request for a given key:
//! a push cut before its index leaves nothing a reader takes for a snapshot, a remote
//! that is down gives a clear error and reads work again once it is back, a damaged
//! remote object is `corrupt` and never served, and of two hosts moving one ref exactly
//! one wins.
//!
//! A second server, `s3s-fs` (installed by `scripts/test.sh`), checks SigV4 signatures
//! and keeps objects as files across restarts: there wrong keys are refused, and the
//! server is really killed (`kill -9`) while a push has its index request in flight,
//! then restarted from its files; a later push completes it without sending the packs
//! again, and the two-host round trip works on it.
//!
//! The servers and the relay are killed (by pid) when a test ends, also when it fails.
//! Skips with a reason when a server is missing or not root; fails under `CI=true`.
//!
//! Run: `cargo build --workspace --bins && CI=true cargo test -p cowspace-tests --test e2e remote::`.

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cowspace_tests::{Out, noise, scan_tree, write_file};
use serde_json::Value;

use crate::workspaces::support::{WsRoot, require_root};

const BUCKET: &str = "chunks";

/// Skips (or fails under CI) without a server to test against.
macro_rules! require_s3 {
    () => {{
        require_root!();
        match S3Server::start() {
            Ok(s) => s,
            Err(why) => {
                if std::env::var("CI").as_deref() == Ok("true") {
                    panic!("remote e2e test cannot run under CI=true: {why}");
                }
                eprintln!("SKIPPED: {why}");
                return;
            }
        }
    }};
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// One HTTP/1.1 request with `Connection: close`: (status, body).
fn http(port: u16, method: &str, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect to the server");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    s.write_all(body).unwrap();
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).unwrap();
    let head_end = resp
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an HTTP response");
    let head = String::from_utf8_lossy(&resp[..head_end]).to_string();
    let status: u16 = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let mut body = resp[head_end + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = unchunk(&body);
    }
    (status, body)
}

fn unchunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = b.windows(2).position(|w| w == b"\r\n") {
        let n = usize::from_str_radix(String::from_utf8_lossy(&b[..eol]).trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + n]);
        b = &b[eol + 2 + n + 2..];
    }
    out
}

/// `moto_server` on a free port of 127.0.0.1, with the bucket made; killed on drop.
struct S3Server {
    child: Child,
    port: u16,
    _log: tempfile::NamedTempFile,
}

impl S3Server {
    fn start() -> Result<S3Server, String> {
        let port = free_port();
        let log = tempfile::NamedTempFile::new().map_err(|e| e.to_string())?;
        let child = Command::new("python3")
            .args([
                "-m",
                "moto.server",
                "-H",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(log.reopen().map_err(|e| e.to_string())?)
            .stderr(log.reopen().map_err(|e| e.to_string())?)
            .spawn()
            .map_err(|e| {
                format!("cannot start python3 -m moto.server ({e}): `pip install 'moto[server]'`")
            })?;
        let mut s = S3Server {
            child,
            port,
            _log: log,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline || s.child.try_wait().ok().flatten().is_some() {
                return Err(
                    "moto's server did not listen within 60 s (is moto[server] installed?)".into(),
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let (status, body) = http(port, "PUT", &format!("/{BUCKET}"), b"");
        assert!(
            status < 300,
            "create bucket: {status} {}",
            String::from_utf8_lossy(&body)
        );
        s.port = port;
        Ok(s)
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Keys below `prefix` (a ListObjectsV2 page is enough for these tests).
    fn keys(&self, prefix: &str) -> Vec<String> {
        let (status, body) = http(
            self.port,
            "GET",
            &format!("/{BUCKET}?list-type=2&max-keys=1000&prefix={prefix}"),
            b"",
        );
        assert_eq!(status, 200);
        let text = String::from_utf8_lossy(&body).to_string();
        text.split("<Key>")
            .skip(1)
            .filter_map(|s| s.split("</Key>").next())
            .map(str::to_string)
            .collect()
    }
}

impl S3Server {
    /// Flips bytes all through every object below `prefix` (with boto3, a signed client:
    /// moto refuses unsigned object reads).
    fn damage_objects(&self, prefix: &str) {
        let script = format!(
            "import boto3\n\
             s3 = boto3.client('s3', endpoint_url='{}', aws_access_key_id='test',\n\
                 aws_secret_access_key='test', region_name='us-east-1')\n\
             n = 0\n\
             for o in s3.list_objects_v2(Bucket='{BUCKET}', Prefix='{prefix}').get('Contents', []):\n\
             \x20   b = bytearray(s3.get_object(Bucket='{BUCKET}', Key=o['Key'])['Body'].read())\n\
             \x20   for i in range(100, len(b), 997):\n\
             \x20       b[i] ^= 0x55\n\
             \x20   s3.put_object(Bucket='{BUCKET}', Key=o['Key'], Body=bytes(b))\n\
             \x20   n += 1\n\
             assert n > 0, 'nothing to damage'\n",
            self.endpoint()
        );
        let out = Command::new("python3")
            .args(["-c", &script])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "damage objects: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `s3s-fs` (the s3s project's file-system server, installed by `scripts/test.sh`): a
/// second S3 implementation that checks SigV4 signatures and keeps objects as files in
/// `dir/BUCKET/` across restarts. Killed (by pid) on drop; `kill` and `restart` for the
/// fault tests. Its conditional create is not atomic (check, then rename), so no race
/// test runs on it.
struct S3sFs {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    log: tempfile::NamedTempFile,
}

const S3S_KEY: &str = "cowspace-test-key";
const S3S_SECRET: &str = "cowspace-test-secret";

impl S3sFs {
    fn start() -> Result<S3sFs, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        std::fs::create_dir(dir.path().join(BUCKET)).map_err(|e| e.to_string())?;
        let mut s = S3sFs {
            child: None,
            port: free_port(),
            dir,
            log: tempfile::NamedTempFile::new().map_err(|e| e.to_string())?,
        };
        s.spawn()?;
        Ok(s)
    }

    fn spawn(&mut self) -> Result<(), String> {
        let bin = cowspace_tests::find_program("s3s-fs").ok_or(
            "s3s-fs not found on PATH or in ~/.cargo/bin: cargo install s3s-fs --version 0.14.1 \
             --features binary --locked",
        )?;
        let child = Command::new(bin)
            .args(["--host", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--access-key", S3S_KEY, "--secret-key", S3S_SECRET])
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .stdout(self.log.reopen().map_err(|e| e.to_string())?)
            .stderr(self.log.reopen().map_err(|e| e.to_string())?)
            .spawn()
            .map_err(|e| format!("cannot start s3s-fs: {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
                .is_some();
            if Instant::now() > deadline || exited {
                return Err(format!(
                    "s3s-fs did not listen on 127.0.0.1:{} within 30 s: {}",
                    self.port,
                    std::fs::read_to_string(self.log.path()).unwrap_or_default()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// `kill -9` of the server, waited for.
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The server again, on the same port and directory.
    fn restart(&mut self) {
        self.kill();
        self.spawn().expect("s3s-fs restarts");
    }

    /// The object keys below `prefix`, from the server's directory (files, not the
    /// server's own temporary or metadata files).
    fn keys(&self, prefix: &str) -> Vec<String> {
        let base = self.dir.path().join(BUCKET);
        if !base.join(prefix).exists() {
            return Vec::new();
        }
        scan_tree(&base.join(prefix))
            .keys()
            .filter(|p| base.join(prefix).join(p).is_file())
            .map(|p| format!("{prefix}/{}", p))
            .collect()
    }
}

impl Drop for S3sFs {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A process this test started, killed (by pid) and reaped if the test ends first.
struct KillOnDrop(Option<Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Skips (or fails under CI) without s3s-fs.
macro_rules! require_s3s {
    () => {{
        require_root!();
        match S3sFs::start() {
            Ok(s) => s,
            Err(why) => {
                if std::env::var("CI").as_deref() == Ok("true") {
                    panic!("remote e2e test cannot run under CI=true: {why}");
                }
                eprintln!("SKIPPED: {why}");
                return;
            }
        }
    }};
}

/// A TCP relay to the server that can stop answering (`down`) or cut everything at the
/// first request whose bytes hold a pattern (`cut_at`).
struct Proxy {
    port: u16,
    up: Arc<AtomicBool>,
    cut: Arc<Mutex<Option<Vec<u8>>>>,
    /// Set when the cut pattern was seen in `hold` mode: that request goes no further,
    /// its connection stays open (the server still has it in flight).
    hold: Arc<AtomicBool>,
    held: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    fn new(backend: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let up = Arc::new(AtomicBool::new(true));
        let cut: Arc<Mutex<Option<Vec<u8>>>> = Arc::new(Mutex::new(None));
        let stop = Arc::new(AtomicBool::new(false));
        let hold = Arc::new(AtomicBool::new(false));
        let held = Arc::new(AtomicBool::new(false));
        let (u, c, s) = (up.clone(), cut.clone(), stop.clone());
        let (h, hd) = (hold.clone(), held.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((client, _)) => {
                        if !u.load(Ordering::SeqCst) {
                            drop(client);
                            continue;
                        }
                        client.set_nonblocking(false).unwrap();
                        let Ok(server) = TcpStream::connect(("127.0.0.1", backend)) else {
                            continue;
                        };
                        relay(client, server, u.clone(), c.clone(), h.clone(), hd.clone());
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Proxy {
            port,
            up,
            cut,
            hold,
            held,
            stop,
            thread: Some(thread),
        }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::SeqCst);
    }

    fn cut_at(&self, pattern: &str) {
        *self.cut.lock().unwrap() = Some(pattern.as_bytes().to_vec());
    }

    /// Like `cut_at`, but the request is held (neither forwarded further nor closed)
    /// while the server keeps its connection; `held()` says when that happened.
    fn hold_at(&self, pattern: &str) {
        self.hold.store(true, Ordering::SeqCst);
        self.cut_at(pattern);
    }

    fn held(&self) -> bool {
        self.held.load(Ordering::SeqCst)
    }

    /// Back to relaying everything.
    fn release(&self) {
        self.hold.store(false, Ordering::SeqCst);
        self.held.store(false, Ordering::SeqCst);
        *self.cut.lock().unwrap() = None;
        self.set_up(true);
    }
}

fn relay(
    client: TcpStream,
    server: TcpStream,
    up: Arc<AtomicBool>,
    cut: Arc<Mutex<Option<Vec<u8>>>>,
    hold: Arc<AtomicBool>,
    held: Arc<AtomicBool>,
) {
    let pipe = |mut from: TcpStream, mut to: TcpStream, scan: bool| {
        let up = up.clone();
        let cut = cut.clone();
        let (hold, held) = (hold.clone(), held.clone());
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            let mut tail: Vec<u8> = Vec::new();
            loop {
                let n = match from.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                let pattern = if scan {
                    cut.lock().unwrap().clone()
                } else {
                    None
                };
                if let Some(p) = pattern {
                    tail.extend_from_slice(&buf[..n]);
                    if tail.windows(p.len()).any(|w| w == p.as_slice()) {
                        *cut.lock().unwrap() = None;
                        if hold.load(Ordering::SeqCst) {
                            // Nothing more of this request goes on. This thread's copies
                            // of the two sockets close, the other direction's keep the
                            // connection open until the server ends it.
                            held.store(true, Ordering::SeqCst);
                            return;
                        }
                        up.store(false, Ordering::SeqCst);
                    }
                    let keep = tail.len().saturating_sub(p.len());
                    tail.drain(..keep);
                }
                if !up.load(Ordering::SeqCst) || to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            let _ = from.shutdown(Shutdown::Both);
            let _ = to.shutdown(Shutdown::Both);
        });
    };
    let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
    pipe(client, server, true);
    pipe(s2, c2, false);
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.up.store(false, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A host: a runtime root with AWS credentials in its `$HOME` and remote `origin`.
fn host(endpoint: &str, prefix: &str) -> WsRoot {
    host_with_keys(endpoint, prefix, "test", "test")
}

fn host_with_keys(endpoint: &str, prefix: &str, key: &str, secret: &str) -> WsRoot {
    let r = WsRoot::new();
    write_file(
        &r.t.scratch().join(".aws/credentials"),
        format!("[default]\naws_access_key_id = {key}\naws_secret_access_key = {secret}\n"),
    );
    let url = format!("s3://{BUCKET}/{prefix}");
    r.t.run(["remote", "add", "origin", &url, "--endpoint", endpoint])
        .ok();
    r
}

fn fetched(r: &WsRoot) -> Value {
    let v = r.t.json(["remote", "list"]).ok().json();
    v[0]["fetched"].clone()
}

fn unique_prefix(what: &str) -> String {
    format!("{what}-{}-{}", std::process::id(), free_port())
}

/// A small project: 30 text files, a 2 MB binary no test reads, a build script, and a
/// git repository of it all.
fn project(r: &WsRoot) -> PathBuf {
    let src = r.t.path("src");
    for i in 0..30u64 {
        let text: String = noise(i, 6000 + i as usize * 100)
            .iter()
            .map(|b| char::from(b'a' + b % 26))
            .collect();
        write_file(&src.join(format!("src/f{i:02}.txt")), format!("{text}\n"));
    }
    write_file(&src.join("big.bin"), noise(99, 2 * 1024 * 1024));
    write_file(&src.join("large.bin"), noise(98, 6 * 1024 * 1024));
    write_file(
        &src.join("build.sh"),
        "mkdir -p out && cat src/f0*.txt > out/all.txt && wc -c < out/all.txt > out/size\n",
    );
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .args([
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@e",
                "-c",
                "init.defaultBranch=main",
            ])
            .args(args)
            .current_dir(&src)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("HOME", r.t.scratch())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    git(&["init", "-q"]);
    git(&["add", "-A"]);
    git(&["commit", "-qm", "first"]);
    src
}

fn sh(dir: &Path, script: &str) -> std::process::Output {
    Command::new("sh")
        .args(["-c", script])
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .unwrap()
}

/// B's change to `rel` in workspace `ws`, committed as `proj/main` and pushed; A pulls
/// it and exports it: the export, after checking that the pull got B's snapshot and the
/// file its new text.
fn commit_back(a: &WsRoot, b: &WsRoot, ws: &Path, ws_id: &str, rel: &str) -> PathBuf {
    write_file(&ws.join(rel), "changed on host B\n");
    b.commit(ws_id, &["--ref", "proj/main"]);
    let back = b.t.json(["push", "proj/main"]).ok().json();
    assert_eq!(back["ref_moved"], true, "{back}");
    assert!(back["chunks_reused"].as_u64().unwrap() > 0, "{back}");
    let pulled = a.t.json(["pull", "proj/main"]).ok().json();
    assert_eq!(pulled["snapshot"], back["snapshot"], "{pulled}");
    let export = a.t.path("export");
    a.t.run([
        OsStr::new("export"),
        OsStr::new("proj/main"),
        export.as_os_str(),
    ])
    .ok();
    assert_eq!(
        std::fs::read_to_string(export.join(rel)).unwrap(),
        "changed on host B\n"
    );
    export
}

#[test]
fn remote_two_hosts_lazy_workspace_reads_only_what_it_uses_and_commits_back() {
    let s3 = require_s3!();
    let prefix = unique_prefix("fleet");
    let a = host(&s3.endpoint(), &prefix);
    let src = project(&a);
    a.import(&src, &["--ref", "proj/main"]);
    let pushed = a.t.json(["push", "proj/main"]).ok().json();
    assert!(pushed["chunks_uploaded"].as_u64().unwrap() > 30, "{pushed}");
    assert_eq!(pushed["ref_moved"], true);
    // The same push again uploads nothing.
    let again = a.t.json(["push", "proj/main"]).ok().json();
    assert_eq!(again["chunks_uploaded"], 0, "{again}");

    // Host B never saw the snapshot.
    let b = host(&s3.endpoint(), &prefix);
    let ws = b.create("proj/main", &[]);
    assert_eq!(ws.json["lower_kind"], "view", "{}", ws.json);
    assert_eq!(
        b.t.refs().get("origin/proj/main").map(String::as_str),
        pushed["snapshot"].as_str()
    );
    let status = sh(&ws.path, "git status --porcelain");
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&status.stdout),
        "",
        "a fresh workspace is clean"
    );
    let mut read_bytes = 0u64;
    for i in 0..20 {
        let rel = format!("src/f{i:02}.txt");
        let got = std::fs::read(ws.path.join(&rel)).unwrap();
        assert_eq!(got, std::fs::read(src.join(&rel)).unwrap(), "{rel}");
        read_bytes += got.len() as u64;
    }
    let git_bytes: u64 = scan_tree(&src.join(".git"))
        .keys()
        .filter_map(|p| std::fs::metadata(src.join(".git").join(p)).ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum();
    let f = fetched(&b);
    let bytes = f["bytes"].as_u64().unwrap();
    assert!(bytes > 0, "{f}");
    assert!(
        bytes <= 2 * (read_bytes + git_bytes),
        "fetched {bytes} bytes for {read_bytes} bytes of files and {git_bytes} of .git: {f}"
    );
    assert!(
        bytes < 2 * 1024 * 1024,
        "the unread big.bin was fetched: {f}"
    );

    // A large file read in the middle: only the chunks the range covers come over.
    let before = fetched(&b)["bytes"].as_u64().unwrap();
    let part = sh(
        &ws.path,
        "dd if=large.bin bs=65536 skip=48 count=2 status=none | od -An -tx1 | head -c 200",
    );
    let want = &noise(98, 6 * 1024 * 1024)[48 * 65536..50 * 65536];
    let got = {
        use std::io::{Seek, SeekFrom};
        let mut f = std::fs::File::open(ws.path.join("large.bin")).unwrap();
        f.seek(SeekFrom::Start(48 * 65536)).unwrap();
        let mut buf = vec![0u8; 2 * 65536];
        f.read_exact(&mut buf).unwrap();
        buf
    };
    assert!(part.status.success());
    assert_eq!(got, want, "a range of large.bin");
    let grew = fetched(&b)["bytes"].as_u64().unwrap() - before;
    assert!(
        grew > 0 && grew < 1024 * 1024,
        "reading 128 KiB of a 6 MiB file fetched {grew} bytes"
    );

    // A second workspace reads the same files without fetching them again.
    let f = fetched(&b);
    let ws2 = b.create("proj/main", &[]);
    for i in 0..20 {
        std::fs::read(ws2.path.join(format!("src/f{i:02}.txt"))).unwrap();
    }
    assert_eq!(fetched(&b)["objects"], f["objects"], "fetched twice");

    // Build, commit and push back; A pulls it intact.
    let built = sh(&ws.path, "sh build.sh");
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let export = commit_back(&a, &b, &ws.path, &ws.id, "src/f03.txt");
    let expected = std::fs::read_to_string(ws.path.join("out/size")).unwrap();
    assert_eq!(
        std::fs::read_to_string(export.join("out/size")).unwrap(),
        expected
    );
    assert_eq!(
        std::fs::read(export.join("big.bin")).unwrap(),
        std::fs::read(src.join("big.bin")).unwrap()
    );
    a.t.run(["fsck"]).ok();
    b.t.run(["fsck"]).ok();
}

#[test]
fn remote_faults_never_give_half_a_snapshot_or_wrong_bytes() {
    let s3 = require_s3!();
    let proxy = Proxy::new(s3.port);
    let prefix = unique_prefix("faults");
    let a = host(&proxy.endpoint(), &prefix);
    let src = project(&a);
    let snap = a.import(&src, &["--ref", "proj/main"]);

    // A push cut when it writes the index: no reader takes anything for a snapshot.
    proxy.cut_at("/snapshots/");
    let err = a.t.json(["push", "proj/main"]).error(1, "io");
    assert!(err["message"].as_str().unwrap().contains("origin"), "{err}");
    proxy.set_up(true);
    assert!(s3.keys(&format!("{prefix}/snapshots/")).is_empty());
    assert!(
        !s3.keys(&format!("{prefix}/packs/")).is_empty(),
        "the packs went first"
    );
    let b = host(&proxy.endpoint(), &prefix);
    b.create_out("proj/main", &[]).error(3, "not_found");
    b.create_out(&snap, &[]).error(3, "not_found");
    // A later push completes it, uploading only what did not arrive.
    let done = a.t.json(["push", "proj/main"]).ok().json();
    assert_eq!(done["chunks_uploaded"], 0, "{done}");
    let ws = b.create("proj/main", &[]);
    assert_eq!(
        std::fs::read(ws.path.join("src/f00.txt")).unwrap(),
        std::fs::read(src.join("src/f00.txt")).unwrap()
    );

    // The remote down during a lazy read: an error, and the same read works once it is back.
    proxy.set_up(false);
    let failed = sh(&ws.path, "cat src/f01.txt > /dev/null");
    assert!(
        !failed.status.success(),
        "a read with the remote down succeeded"
    );
    proxy.set_up(true);
    assert_eq!(
        std::fs::read(ws.path.join("src/f01.txt")).unwrap(),
        std::fs::read(src.join("src/f01.txt")).unwrap()
    );

    // A damaged pack on the server: its chunks are corrupt, never served.
    s3.damage_objects(&format!("{prefix}/packs/"));
    let bad = sh(&ws.path, "cat src/f25.txt");
    assert!(!bad.status.success(), "damaged bytes were served");
    // Whatever came out before the error is the file's own bytes, never damaged ones.
    let truth = std::fs::read(src.join("src/f25.txt")).unwrap();
    assert!(truth.starts_with(&bad.stdout), "damaged bytes came through");
    let e = b.t.json(["pull", "proj/main"]).error(8, "corrupt");
    assert!(
        e["message"].as_str().unwrap().contains("remote origin"),
        "{e}"
    );
    b.t.run(["fsck"]).ok();

    // Two hosts moving one ref at once: exactly one wins, the other is a conflict.
    let c = host(&proxy.endpoint(), &prefix);
    let other = c.t.path("other");
    write_file(&other.join("x"), "another tree\n");
    c.import(&other, &["--ref", "race"]);
    a.t.run(["ref", "set", "race", &snap]).ok();
    let (ra, rc) = std::thread::scope(|s| {
        let ha = s.spawn(|| a.t.run(["push", "race"]));
        let hc = s.spawn(|| c.t.run(["push", "race"]));
        (ha.join().unwrap(), hc.join().unwrap())
    });
    let codes = [ra.code, rc.code];
    assert!(
        codes.contains(&0) && codes.contains(&6),
        "codes {codes:?}: {ra:?} {rc:?}"
    );
    let loser: &Out = if ra.code == 6 { &ra } else { &rc };
    assert!(
        loser.stderr.contains("conflict") || loser.stderr.contains("moved"),
        "{}",
        loser.stderr
    );
}

#[test]
fn remote_gc_removes_only_what_no_ref_or_pin_needs_a_grace_after_marking_it() {
    let s3 = require_s3!();
    let prefix = unique_prefix("gc");
    let a = host(&s3.endpoint(), &prefix);
    let src = a.t.path("src");
    write_file(&src.join("common.txt"), noise(1, 40_000));
    write_file(&src.join("v.txt"), "one\n");
    let v1 = a.import(&src, &["--ref", "proj/main"]);
    a.t.run(["push", "proj/main"]).ok();
    write_file(&src.join("v.txt"), "two\n");
    let v2 = a.import(&src, &[]);
    a.t.run(["ref", "set", "proj/main", &v2, "--force"]).ok();
    a.t.run(["push", "proj/main", "--force"]).ok();
    // Pushed by id only: nothing names it.
    write_file(&src.join("only-v3.txt"), noise(3, 50_000));
    let v3 = a.import(&src, &[]);
    a.t.run(["push", &v3]).ok();

    // Host B reads v1 lazily: its workspace pins v1 on the remote.
    let b = host(&s3.endpoint(), &prefix);
    let ws = b.create(&v1, &[]);
    assert_eq!(
        std::fs::read_to_string(ws.path.join("v.txt")).unwrap(),
        "one\n"
    );
    let doctor = b.t.json(["doctor"]).ok().json();
    assert_eq!(
        doctor["remotes"][0]["answers"], true,
        "{}",
        doctor["remotes"]
    );
    let listed = b.socket("remotes", serde_json::json!({}));
    assert_eq!(listed[0]["name"], "origin", "{listed}");
    assert!(
        listed[0]["fetched"]["objects"].as_u64().unwrap() > 0,
        "{listed}"
    );

    let index = |s: &str| format!("snapshots/{s}.index");
    let gc = |who: &WsRoot| who.t.json(["remote", "gc", "--grace", "0"]).ok().json();
    let first = gc(&a);
    assert!(first["deleted"].as_array().unwrap().is_empty(), "{first}");
    let unreachable: Vec<String> = serde_json::from_value(first["unreachable"].clone()).unwrap();
    assert!(unreachable.contains(&index(&v3)), "{first}");
    assert!(
        !unreachable.contains(&index(&v1)) && !unreachable.contains(&index(&v2)),
        "{first}"
    );
    assert!(
        first["marked"].as_u64().unwrap() >= 2,
        "v3's index and its pack: {first}"
    );
    // A dry run deletes nothing; the next run deletes what its mark named.
    let dry =
        a.t.json(["remote", "gc", "--grace", "0", "--dry-run"])
            .ok()
            .json();
    assert!(!dry["deleted"].as_array().unwrap().is_empty(), "{dry}");
    assert!(s3.keys(&format!("{prefix}/{}", index(&v3))).len() == 1);
    let second = gc(&a);
    let deleted: Vec<String> = serde_json::from_value(second["deleted"].clone()).unwrap();
    assert!(deleted.contains(&index(&v3)), "{second}");
    assert!(s3.keys(&format!("{prefix}/{}", index(&v3))).is_empty());
    assert_eq!(
        s3.keys(&format!("{prefix}/{}", index(&v1))).len(),
        1,
        "the pin keeps v1"
    );

    // The workspace goes, and its pin with it: v1 goes a mark later.
    b.discard(&ws.id);
    gc(&a);
    let last = gc(&a);
    let deleted: Vec<String> = serde_json::from_value(last["deleted"].clone()).unwrap();
    assert!(deleted.contains(&index(&v1)), "{last}");
    // What the ref needs is whole: a fresh host pulls it.
    let c = host(&s3.endpoint(), &prefix);
    let pulled = c.t.json(["pull", "proj/main"]).ok().json();
    assert_eq!(pulled["snapshot"], v2.as_str());
    let export = c.t.path("export");
    c.t.run([
        OsStr::new("export"),
        OsStr::new("proj/main"),
        export.as_os_str(),
    ])
    .ok();
    assert_eq!(
        std::fs::read(export.join("common.txt")).unwrap(),
        noise(1, 40_000)
    );
    c.t.run(["fsck"]).ok();
}

#[test]
fn remote_on_a_signing_persistent_server_wrong_keys_refused_and_a_kill_mid_push_completed_later() {
    let mut s3 = require_s3s!();
    let proxy = Proxy::new(s3.port);
    let prefix = unique_prefix("s3s");

    // SigV4 is checked: with the wrong secret, `remote add` is refused, naming the
    // remote and the credentials, and records nothing; nothing lands on the server.
    let w = WsRoot::new();
    write_file(
        &w.t.scratch().join(".aws/credentials"),
        format!("[default]\naws_access_key_id = {S3S_KEY}\naws_secret_access_key = wrong\n"),
    );
    let url = format!("s3://{BUCKET}/{prefix}");
    let e =
        w.t.json([
            "remote",
            "add",
            "origin",
            &url,
            "--endpoint",
            &proxy.endpoint(),
        ])
        .error(1, "io");
    let msg = e["message"].as_str().unwrap();
    assert!(
        msg.contains("remote origin") && msg.contains("SignatureDoesNotMatch"),
        "{e}"
    );
    assert!(
        e["hint"].as_str().unwrap_or("").contains("credentials"),
        "{e}"
    );
    assert_eq!(
        w.t.json(["remote", "list"]).ok().json(),
        serde_json::json!([])
    );
    assert!(s3.keys(&prefix).is_empty(), "{:?}", s3.keys(&prefix));

    // The server killed (kill -9) while a push has its index request in flight.
    let a = host_with_keys(&proxy.endpoint(), &prefix, S3S_KEY, S3S_SECRET);
    let src = project(&a);
    a.import(&src, &["--ref", "proj/main"]);
    proxy.hold_at("/snapshots/");
    let mut push = KillOnDrop(Some(
        a.t.command(["--json", "push", "proj/main"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    ));
    let deadline = Instant::now() + Duration::from_secs(60);
    while !proxy.held() {
        assert!(
            Instant::now() < deadline,
            "the push never reached its index"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    s3.kill();
    let out = push.0.take().unwrap().wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Back, from its files: the packs are there, no index and no ref, so a reader sees
    // no snapshot.
    s3.restart();
    proxy.release();
    assert!(
        !s3.keys(&format!("{prefix}/packs")).is_empty(),
        "the packs went first"
    );
    assert!(s3.keys(&format!("{prefix}/snapshots")).is_empty());
    assert!(s3.keys(&format!("{prefix}/refs")).is_empty());
    let b = host_with_keys(&proxy.endpoint(), &prefix, S3S_KEY, S3S_SECRET);
    b.create_out("proj/main", &[]).error(3, "not_found");
    // A later push completes it; the packs kept across the restart are not sent again.
    let done = a.t.json(["push", "proj/main"]).ok().json();
    assert_eq!(done["chunks_uploaded"], 0, "{done}");
    assert_eq!(done["ref_moved"], true, "{done}");

    // Host B: a lazy workspace, git status, reads; its commit back on A, intact.
    let ws = b.create("proj/main", &[]);
    let status = sh(&ws.path, "git status --porcelain");
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&status.stdout), "");
    for i in 0..5 {
        let rel = format!("src/f{i:02}.txt");
        assert_eq!(
            std::fs::read(ws.path.join(&rel)).unwrap(),
            std::fs::read(src.join(&rel)).unwrap(),
            "{rel}"
        );
    }
    let export = commit_back(&a, &b, &ws.path, &ws.id, "src/f04.txt");
    assert_eq!(
        std::fs::read(export.join("large.bin")).unwrap(),
        std::fs::read(src.join("large.bin")).unwrap()
    );
    a.t.run(["fsck"]).ok();
    b.t.run(["fsck"]).ok();
}

#[test]
fn remote_pull_of_many_batches_brings_every_chunk_verified_or_fails_whole() {
    let s3 = require_s3!();
    let prefix = unique_prefix("many");
    let a = host(&s3.endpoint(), &prefix);
    // More chunks than three fetch batches (4096 ids each), so a pull runs batches at
    // once on several threads.
    let src = a.t.path("many");
    for i in 0..13_000u64 {
        write_file(
            &src.join(format!("d{:02}/f{i:05}.txt", i % 50)),
            format!("file {i} {}\n", i * 7919),
        );
    }
    a.import(&src, &["--ref", "many"]);
    a.t.run(["push", "many"]).ok();

    let c = host(&s3.endpoint(), &prefix);
    let pulled = c.t.json(["pull", "many"]).ok().json();
    assert!(
        pulled["fetched"]["objects"].as_u64().unwrap() >= 13_000,
        "{pulled}"
    );
    let out = c.t.path("out");
    c.t.run([OsStr::new("export"), OsStr::new("many"), out.as_os_str()])
        .ok();
    assert_eq!(scan_tree(&out), scan_tree(&src), "the pulled tree differs");
    c.t.run(["fsck"]).ok();

    // Damaged packs: the pull fails as corrupt and leaves a store fsck finds clean, with
    // the snapshot still partial (its next pull after a repair would complete it).
    s3.damage_objects(&format!("{prefix}/packs/"));
    let d = host(&s3.endpoint(), &prefix);
    d.t.json(["pull", "many"]).error(8, "corrupt");
    d.t.run(["fsck"]).ok();
    let one = src.join("d00/f00000.txt");
    let ws = d.create("many", &[]);
    assert!(
        std::fs::read(ws.path.join("d00/f00000.txt")).is_err()
            || std::fs::read(ws.path.join("d00/f00000.txt")).unwrap()
                == std::fs::read(one).unwrap(),
        "damaged bytes were served"
    );
}

/// An image's ref travels like any ref: pushed from one host, pulled on an empty one,
/// it is still an image there (digest, layers, config), with the same tree.
#[test]
fn remote_push_and_pull_of_an_image_keep_it_an_image() {
    if !crate::images::have_tools() {
        return;
    }
    let server = match S3Server::start() {
        Ok(s) => s,
        Err(why) => panic!("the S3 server is needed: {why}"),
    };
    let prefix = unique_prefix("image");
    let a = host(&server.endpoint(), &prefix);
    let layout = crate::images::build_images(a.t.scratch());
    let imported =
        a.t.json([
            "image",
            "import",
            &format!("{}:v2", layout.display()),
            "--ref",
            "img/v2",
        ])
        .ok()
        .json();
    a.t.json(["push", "img/v2"]).ok();
    let b = host(&server.endpoint(), &prefix);
    b.t.json(["pull", "img/v2"]).ok();
    let shown = b.t.json(["image", "show", "img/v2"]).ok().json();
    assert_eq!(shown["digest"], imported["digest"], "{shown}");
    assert_eq!(shown["snapshot"], imported["snapshot"], "{shown}");
    assert_eq!(shown["layers"].as_array().map(Vec::len), Some(2), "{shown}");
    assert!(
        shown["env"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e == "FOO=bar"),
        "{shown}"
    );
    let listed = b.t.json(["image", "list"]).ok().json();
    assert_eq!(listed[0]["name"], "img/v2", "{listed}");
    let out = b.t.path("export");
    b.t.run(["export", "img/v2", out.to_str().unwrap()]).ok();
    assert_eq!(
        std::fs::read_to_string(out.join("etc/image-marker")).unwrap(),
        "only in the image\n"
    );
    b.t.run(["fsck"]).ok();
}
