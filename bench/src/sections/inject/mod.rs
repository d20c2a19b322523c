//! Credentials at the proxy: what `--inject` costs a sandbox's HTTPS requests, against a
//! `CONNECT` tunnel the proxy passes through untouched and against the host's client
//! going straight to the origin, in one run.
//!
//! The origin (`server.py`: Python's threaded HTTP/1.1 server over TLS, on the host's
//! 127.0.0.1, a certificate of a CA made for the run with `openssl`) answers every GET
//! with `auth` or `none` (whether the request carried an `Authorization` header). One
//! sandbox (`--net egress`) names it twice: `api.test`, with `--inject
//! api.test=Authorization:@FILE` (the proxy terminates TLS with the sandbox's CA and
//! re-encrypts, verifying the origin with `--upstream-ca`), and `plain.test` (passed
//! through). The client (`client.py`, the same on both sides) does N requests on one
//! kept-alive connection, then N/5 each on a new connection, and checks every answer (an
//! injected request must arrive with the header, the others without).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::{Ctx, Method, MethodInfo, Prepared, Sample, Section, metric};
use crate::mountctl::{Mountctl, StoreGuard};
use crate::proc;
use crate::results::{Better, MethodResult, MetricDef, Role};

const INJECTED: &str = "inject-https";
const PASSTHROUGH: &str = "connect-passthrough";
const DIRECT: &str = "direct-https";
const IDS: &[&str] = &[INJECTED, PASSTHROUGH, DIRECT];
const SANDBOX: &str = "inj";
const REQUESTS: usize = 500;
const QUICK_REQUESTS: usize = 50;
const SERVER_PY: &str = include_str!("server.py");
const CLIENT_PY: &str = include_str!("client.py");

/// The origin process; killed (by pid) on drop.
struct Origin(Child);

impl Drop for Origin {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Stops the sandbox on drop (before its store goes).
struct SandboxGuard {
    mountctl: Mountctl,
    root: PathBuf,
}

impl Drop for SandboxGuard {
    fn drop(&mut self) {
        let _ = self.mountctl.json(
            &self.root,
            &["sandbox".as_ref(), "stop".as_ref(), SANDBOX.as_ref()],
        );
    }
}

pub struct InjectSection {
    // Dropped in this order: the sandbox, its store, the origin.
    sandbox: Option<SandboxGuard>,
    store: Option<StoreGuard>,
    origin: Option<Origin>,
    notes: Vec<String>,
}

impl InjectSection {
    pub fn new() -> Self {
        Self {
            sandbox: None,
            store: None,
            origin: None,
            notes: Vec::new(),
        }
    }
}

/// One side's client: inside the sandbox through the proxy, or on the host.
struct Client {
    id: &'static str,
    /// `mountctl --root ROOT exec inj --` for the sandbox's side.
    exec: Option<(Mountctl, PathBuf)>,
    host: &'static str,
    cafile: String,
    script: String,
    port: u16,
    want: &'static str,
    requests: usize,
}

impl Method for Client {
    fn info(&self) -> MethodInfo {
        let (label, role) = match self.id {
            INJECTED => (
                "injected HTTPS (TLS terminated, header added)",
                Role::Cowspace,
            ),
            PASSTHROUGH => ("CONNECT passthrough through the proxy", Role::Baseline),
            _ => ("the host's client, straight to the origin", Role::Baseline),
        };
        MethodInfo {
            id: self.id,
            label: label.into(),
            role,
            command: format!(
                "python3 client.py {} {} PORT {} {}",
                if self.exec.is_some() {
                    "proxy"
                } else {
                    "direct"
                },
                self.host,
                self.cafile,
                self.requests
            ),
        }
    }

    fn run_once(&mut self, ctx: &Ctx, _round: usize) -> Result<Sample> {
        let mode = if self.exec.is_some() {
            "proxy"
        } else {
            "direct"
        };
        let args = [
            "python3".to_string(),
            self.script.clone(),
            mode.into(),
            self.host.into(),
            self.port.to_string(),
            self.cafile.clone(),
            self.requests.to_string(),
            self.want.into(),
        ];
        let mut cmd = match &self.exec {
            Some((mc, root)) => {
                let mut c = Command::new(&mc.path);
                c.arg("--root").arg(root).args(["exec", SANDBOX, "--"]);
                c
            }
            None => Command::new("timeout"),
        };
        if self.exec.is_none() {
            cmd.arg("600");
        }
        cmd.args(&args);
        ctx.before_step()?;
        let out = proc::run(&mut cmd)?;
        let v: serde_json::Value =
            serde_json::from_slice(&out).context("the client printed no JSON")?;
        let f = |k: &str| v[k].as_f64().with_context(|| format!("no {k} in {v}"));
        Ok(vec![
            ("rps", f("rps")?),
            ("new_ms", f("new_ms")?),
            ("new_p99_ms", f("new_p99_ms")?),
        ])
    }
}

/// `openssl ARGS`, in `dir`.
fn openssl(dir: &Path, args: &[&str]) -> Result<()> {
    proc::run(Command::new("openssl").current_dir(dir).args(args)).map(drop)
}

/// A CA and a certificate for both names and 127.0.0.1, in `dir`.
fn certificates(dir: &Path) -> Result<()> {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-subj",
            "/CN=bench inject CA",
            "-days",
            "2",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign",
        ],
    )?;
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "srv.key",
            "-out",
            "srv.csr",
            "-subj",
            "/CN=api.test",
        ],
    )?;
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=DNS:api.test,DNS:plain.test,IP:127.0.0.1\n",
    )?;
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "srv.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "srv.pem",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        ],
    )
}

impl Section for InjectSection {
    fn id(&self) -> &'static str {
        "inject"
    }

    fn title(&self) -> String {
        "Credentials at the proxy: injected HTTPS against passthrough and direct".into()
    }

    fn description(&self) -> String {
        "One sandbox with --net egress names a TLS origin on the host's 127.0.0.1 twice: \
         api.test with --inject (the proxy terminates TLS with the sandbox's CA, adds \
         Authorization, re-encrypts verifying the origin) and plain.test (a CONNECT passed \
         through). The same Python client inside (through the proxy) and on the host \
         (straight to the origin): N requests on one kept-alive connection, then N/5 each \
         on a new connection; every answer checked (the header arrives for api.test only). \
         Paired rows: each method's figure against direct-https in the same round."
            .into()
    }

    fn metrics(&self) -> Vec<MetricDef> {
        use Better::{Higher, Lower};
        vec![
            metric(
                "rps",
                "requests/s, one kept-alive connection",
                "req/s",
                Higher,
            ),
            metric("rps_ratio", "requests/s ÷ direct, paired", "ratio", Higher),
            metric("new_ms", "request on a new connection, median", "ms", Lower),
            metric(
                "new_p99_ms",
                "request on a new connection, p99",
                "ms",
                Lower,
            ),
            metric(
                "new_added_ms",
                "added to a new-connection request, paired",
                "ms",
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
        let Some(base) = methods
            .iter()
            .find(|m| m.id == DIRECT)
            .map(|m| m.samples.clone())
        else {
            return;
        };
        for m in methods.iter_mut().filter(|m| m.id != DIRECT) {
            let pairs = [
                ("rps_ratio", "rps", true),
                ("new_added_ms", "new_ms", false),
            ];
            for (out, k, ratio) in pairs {
                let (Some(a), Some(b)) = (m.samples.get(k), base.get(k)) else {
                    continue;
                };
                let v =
                    super::network::clients::paired(a, b, |a, b| if ratio { a / b } else { a - b });
                if !v.is_empty() {
                    m.samples.insert(out.into(), v);
                }
            }
        }
    }

    fn prepare(&mut self, ctx: &Ctx, selected: &dyn Fn(&str) -> bool) -> Result<Vec<Prepared>> {
        let skip = |why: String| super::skip_all(IDS, &[PASSTHROUGH, DIRECT], selected, &why);
        if !IDS.iter().any(|id| selected(id)) {
            return Ok(Vec::new());
        }
        let mc = match &ctx.mountctl {
            Ok(m) => m.clone(),
            Err(why) => return Ok(skip(why.clone())),
        };
        if !ctx.is_root {
            return Ok(skip("sandboxes need root here (run bench as root)".into()));
        }
        for tool in ["openssl", "python3"] {
            if proc::which(tool).is_none() {
                return Ok(skip(format!("{tool} not found on PATH")));
            }
        }
        eprintln!("bench: inject: a CA, the origin, a sandbox (untimed)…");
        let dir = ctx.scratch_path("inject");
        let fixtures = dir.join("fixtures");
        std::fs::create_dir_all(&fixtures)?;
        certificates(&dir)?;
        std::fs::write(dir.join("server.py"), SERVER_PY)?;
        std::fs::write(fixtures.join("client.py"), CLIENT_PY)?;
        std::fs::copy(dir.join("ca.pem"), fixtures.join("ca.pem"))?;
        std::fs::write(dir.join("token"), "Bearer bench-token\n")?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = Command::new("python3")
            .arg(dir.join("server.py"))
            .arg(dir.join("srv.pem"))
            .arg(dir.join("srv.key"))
            .arg(port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("server.log"))?)
            .spawn()
            .context("start the origin")?;
        self.origin = Some(Origin(child));
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                bail!("the origin did not listen within 30 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let store = StoreGuard::import(&mc, dir.join("root"), &fixtures)?;
        let root = store.root.clone();
        self.store = Some(store);
        mc.json(
            &root,
            &[
                "create".as_ref(),
                "bench".as_ref(),
                "--name".as_ref(),
                SANDBOX.as_ref(),
            ],
        )?;
        let inject = format!("api.test=Authorization:@{}", dir.join("token").display());
        let upstream = dir.join("ca.pem");
        let start: Vec<&std::ffi::OsStr> = vec![
            "sandbox".as_ref(),
            "start".as_ref(),
            SANDBOX.as_ref(),
            "--net".as_ref(),
            "egress".as_ref(),
            "--add-host".as_ref(),
            "api.test:127.0.0.1".as_ref(),
            "--add-host".as_ref(),
            "plain.test:127.0.0.1".as_ref(),
            "--allow-host".as_ref(),
            "api.test".as_ref(),
            "--allow-host".as_ref(),
            "plain.test".as_ref(),
            "--inject".as_ref(),
            inject.as_ref(),
            "--upstream-ca".as_ref(),
            upstream.as_os_str(),
        ];
        mc.json(&root, &start)?;
        self.sandbox = Some(SandboxGuard {
            mountctl: mc.clone(),
            root: root.clone(),
        });
        let requests = if ctx.quick { QUICK_REQUESTS } else { REQUESTS };
        self.notes.push(format!(
            "Origin: Python's ThreadingHTTPServer over TLS (RSA 2048) on 127.0.0.1:{port}; \
             {requests} kept-alive requests and {} new connections per run and method; the \
             Python client and server bound all three methods alike.",
            (requests / 5).max(1)
        ));
        let inside = |id, host, cafile: &str, want| Client {
            id,
            exec: Some((mc.clone(), root.clone())),
            host,
            cafile: cafile.into(),
            script: "/workspace/client.py".into(),
            port,
            want,
            requests,
        };
        let all: Vec<Box<dyn Method>> = vec![
            Box::new(inside(
                INJECTED,
                "api.test",
                "/run/cowspace/ca-bundle.pem",
                "auth",
            )),
            Box::new(inside(
                PASSTHROUGH,
                "plain.test",
                "/workspace/ca.pem",
                "none",
            )),
            Box::new(Client {
                id: DIRECT,
                exec: None,
                host: "127.0.0.1",
                cafile: dir.join("ca.pem").display().to_string(),
                script: fixtures.join("client.py").display().to_string(),
                port,
                want: "none",
                requests,
            }),
        ];
        Ok(all
            .into_iter()
            .filter(|m| selected(m.info().id))
            .map(Prepared::Ready)
            .collect())
    }
}
