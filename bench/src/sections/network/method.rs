//! One method of the network section: the clients run on one side (inside the sandbox
//! through its proxy, or on the host straight to the origin), one run doing every
//! measurement in turn.

use std::cell::RefCell;
use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::rc::Rc;

use anyhow::{Context, Result, ensure};

use super::clients::{self, HOLD_CONNECTIONS, HOLD_S, REQUESTS, WARMUP_REQUESTS};
use super::origin::SMALL_BODY;
use super::{
    CLIENT_TIMEOUT_S, DIRECT_ENV, HOLD_SCRIPT, LATENCY_SCRIPT, ORIGIN_NAME, PIP_PACKAGES, PROXY_ID,
    PYTHON, SANDBOX_NAME,
};
use crate::mountctl::{Mountctl, proc_status_bytes};
use crate::proc;
use crate::results::Role;
use crate::sections::{Ctx, Method, MethodInfo, Sample};
use crate::stats;

/// Where a client runs.
pub(super) enum Side {
    /// Inside the sandbox (`mountctl exec`), through the proxy.
    Proxy {
        mountctl: Mountctl,
        root: PathBuf,
        proxy_pid: u32,
    },
    /// On the host, straight to 127.0.0.1.
    Direct { scripts: PathBuf, pip_dir: PathBuf },
}

pub(super) struct Client {
    pub(super) id: &'static str,
    pub(super) side: Side,
    pub(super) port: u16,
    pub(super) curl: PathBuf,
    /// Length of `/bulk`.
    pub(super) bulk_bytes: u64,
    /// The package index has wheels (else no pip figures).
    pub(super) pip: bool,
    pub(super) notes: Rc<RefCell<Vec<String>>>,
}

impl Client {
    fn host(&self) -> &'static str {
        match self.side {
            Side::Proxy { .. } => ORIGIN_NAME,
            Side::Direct { .. } => "127.0.0.1",
        }
    }

    fn mode(&self) -> &'static str {
        match self.side {
            Side::Proxy { .. } => "proxy",
            Side::Direct { .. } => "direct",
        }
    }

    fn script(&self, name: &str) -> OsString {
        match &self.side {
            Side::Proxy { .. } => format!("/workspace/{name}").into(),
            Side::Direct { scripts, .. } => scripts.join(name).into(),
        }
    }

    /// `ARGS…` under `timeout`, inside the sandbox or on the host.
    fn command(&self, args: &[OsString]) -> Command {
        let mut c = match &self.side {
            Side::Proxy { mountctl, root, .. } => {
                let mut c = Command::new(&mountctl.path);
                c.arg("--root")
                    .arg(root)
                    .args(["exec", SANDBOX_NAME, "--", "timeout"]);
                c
            }
            Side::Direct { .. } => {
                let mut c = Command::new("timeout");
                c.env_clear().envs(DIRECT_ENV.iter().copied());
                c
            }
        };
        c.arg(CLIENT_TIMEOUT_S).args(args).stdin(Stdio::null());
        c
    }

    pub(super) fn run(&self, args: &[OsString]) -> Result<String> {
        let out = proc::run(&mut self.command(args))?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}:{}{path}", self.host(), self.port)
    }

    pub(super) fn curl(&self, tunnel: bool, path: &str) -> Vec<OsString> {
        let mut a: Vec<OsString> = vec![
            self.curl.clone().into(),
            "-sS".into(),
            "-o".into(),
            "/dev/null".into(),
            "-w".into(),
            clients::CURL_WRITE_OUT.into(),
        ];
        if tunnel {
            a.push("-p".into());
        }
        a.push(self.url(path).into());
        a
    }

    /// One bulk download, and the proxy's CPU seconds per GiB it relayed.
    fn download(&self, tunnel: bool) -> Result<(clients::Download, Option<f64>)> {
        let cpu0 = self.proxy_cpu_s();
        let out = self.run(&self.curl(tunnel && self.is_proxy(), "/bulk"))?;
        let cpu1 = self.proxy_cpu_s();
        let d = clients::parse_curl(&out, self.bulk_bytes)?;
        let per_gib = match (cpu0, cpu1) {
            (Some(a), Some(b)) => Some((b - a) / (d.bytes as f64 / (1u64 << 30) as f64)),
            _ => None,
        };
        Ok((d, per_gib))
    }

    /// User + system time of the proxy process (all its threads) so far.
    fn proxy_cpu_s(&self) -> Option<f64> {
        match self.side {
            Side::Proxy { proxy_pid, .. } => {
                let stat = std::fs::read_to_string(format!("/proc/{proxy_pid}/stat")).ok()?;
                clients::stat_cpu_s(&stat)
            }
            Side::Direct { .. } => None,
        }
    }

    fn is_proxy(&self) -> bool {
        matches!(self.side, Side::Proxy { .. })
    }

    fn latencies(&self) -> Result<clients::Latencies> {
        let args: Vec<OsString> = vec![
            PYTHON.into(),
            self.script(LATENCY_SCRIPT),
            self.mode().into(),
            self.host().into(),
            self.port.to_string().into(),
            REQUESTS.to_string().into(),
            WARMUP_REQUESTS.to_string().into(),
            SMALL_BODY.len().to_string().into(),
        ];
        clients::parse_latencies(&self.run(&args)?, REQUESTS)
    }

    fn pip_target(&self, round: usize) -> PathBuf {
        match &self.side {
            Side::Proxy { .. } => PathBuf::from(format!("/tmp/bench-pip-{round}")),
            Side::Direct { pip_dir, .. } => pip_dir.join(format!("r{round}")),
        }
    }

    /// One timed `pip install` into a fresh target, which is removed after (untimed).
    fn pip_install(&self, round: usize) -> Result<f64> {
        let target = self.pip_target(round);
        let index = format!("{}/simple/", self.url(""));
        let mut args: Vec<OsString> = vec![
            "sh".into(),
            "-c".into(),
            clients::TIMED_SH.into(),
            "sh".into(),
            PYTHON.into(),
            "-m".into(),
            "pip".into(),
            "install".into(),
            "--no-cache-dir".into(),
            "--disable-pip-version-check".into(),
            "--target".into(),
            target.clone().into(),
            "--trusted-host".into(),
            self.host().into(),
            "--index-url".into(),
            index.into(),
        ];
        args.extend(PIP_PACKAGES.iter().map(Into::into));
        let took = clients::parse_timed(&self.run(&args)?);
        match &self.side {
            Side::Proxy { .. } => {
                self.run(&["rm".into(), "-rf".into(), target.into()])?;
            }
            Side::Direct { .. } => crate::cancel::remove_tree(&target)?,
        }
        took
    }

    fn proxy_rss(&self) -> Option<u64> {
        match self.side {
            Side::Proxy { proxy_pid, .. } => proc_status_bytes(proxy_pid, "VmRSS"),
            Side::Direct { .. } => None,
        }
    }

    /// Holds [`HOLD_CONNECTIONS`] at once: (connections that worked when opened and
    /// again after the hold, the proxy's `VmRSS` while they were held).
    fn hold(&self) -> Result<(u64, Option<u64>)> {
        let args: Vec<OsString> = vec![
            PYTHON.into(),
            self.script(HOLD_SCRIPT),
            self.mode().into(),
            self.host().into(),
            self.port.to_string().into(),
            HOLD_CONNECTIONS.to_string().into(),
            HOLD_S.to_string().into(),
        ];
        let mut cmd = self.command(&args);
        let shown = proc::display(&cmd);
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting `{shown}`"))?;
        let stdout = child.stdout.take().context("no stdout pipe")?;
        let mut lines = BufReader::new(stdout).lines();
        let mut next = || -> Option<clients::HoldLine> {
            let l = lines.next()?.ok()?;
            clients::parse_hold_line(&l).ok()
        };
        let opened = next();
        let rss = self.proxy_rss();
        let after = next();
        drop(lines);
        let out = child.wait_with_output()?;
        ensure!(
            out.status.success(),
            "`{shown}` failed ({}): {}",
            out.status,
            proc::tail(&out.stderr, &[])
        );
        let (Some(opened), Some(after)) = (opened, after) else {
            anyhow::bail!(
                "`{shown}` did not print its two lines: {}",
                proc::tail(&out.stderr, &[])
            );
        };
        let held = opened.held.context("the hold client's first line")?;
        let alive = after.alive.context("the hold client's second line")?;
        if !after.errors.is_empty() {
            let n = format!(
                "{}: of {HOLD_CONNECTIONS} connections, {held} opened and {alive} worked after the hold; errors: {:?}",
                self.id, after.errors
            );
            eprintln!("bench: network: {n}");
            self.notes.borrow_mut().push(n);
        }
        Ok((held.min(alive), rss))
    }
}

impl Method for Client {
    fn info(&self) -> MethodInfo {
        info(self.id)
    }

    fn run_once(&mut self, ctx: &Ctx, round: usize) -> Result<Sample> {
        ctx.before_step()?;
        let (plain, plain_cpu) = self.download(false)?;
        ctx.before_step()?;
        let (tunnel, tunnel_cpu) = self.download(true)?;
        ctx.before_step()?;
        let lat = self.latencies()?;
        let median = |v: &[f64]| stats::median(v).context("no request timed");
        let mut s: Sample = vec![
            ("download_mbps", plain.mbps()),
            ("download_connect_mbps", tunnel.mbps()),
            ("request_s", median(&lat.new)?),
            (
                "request_p99_s",
                stats::percentile(&lat.new, 99.0).context("no request timed")?,
            ),
            ("request_keepalive_s", median(&lat.keepalive)?),
        ];
        if let (Some(p), Some(t)) = (plain_cpu, tunnel_cpu) {
            s.push(("proxy_cpu_per_gib_s", p));
            s.push(("proxy_cpu_connect_per_gib_s", t));
        }
        if self.pip {
            ctx.before_step()?;
            s.push(("pip_install_s", self.pip_install(round)?));
        }
        ctx.before_step()?;
        let idle = self.proxy_rss();
        let (held, rss) = self.hold()?;
        s.push(("held_connections", held as f64));
        if let (Some(idle), Some(rss)) = (idle, rss) {
            s.push(("proxy_rss_idle_bytes", idle as f64));
            s.push(("proxy_rss_held_bytes", rss as f64));
        }
        Ok(s)
    }
}

pub(super) fn info(id: &'static str) -> MethodInfo {
    if id == PROXY_ID {
        MethodInfo {
            id,
            label: "inside a sandbox, through the egress proxy".into(),
            role: Role::Cowspace,
            command: format!(
                "mountctl sandbox start net --net egress --add-host {ORIGIN_NAME}:127.0.0.1 --allow-host {ORIGIN_NAME}:PORT; then `mountctl exec net -- timeout 600 CLIENT` for each: \
                 curl -sS -o /dev/null -w '…' http://{ORIGIN_NAME}:PORT/bulk (proxy from http_proxy); the same with -p (CONNECT); \
                 python3 /workspace/latency.py proxy {ORIGIN_NAME} PORT 1000 20 64; \
                 sh -c TIMED python3 -m pip install --no-cache-dir --disable-pip-version-check --target /tmp/bench-pip-R --trusted-host {ORIGIN_NAME} --index-url http://{ORIGIN_NAME}:PORT/simple/ six idna; \
                 python3 /workspace/hold.py proxy {ORIGIN_NAME} PORT 1000 {HOLD_S}"
            ),
        }
    } else {
        MethodInfo {
            id,
            label: "on the host, direct".into(),
            role: Role::Baseline,
            command: format!(
                "env -i PATH=… HOME=/root LANG=C.UTF-8 timeout 600 CLIENT: curl -sS -o /dev/null -w '…' http://127.0.0.1:PORT/bulk (twice); \
                 python3 latency.py direct 127.0.0.1 PORT 1000 20 64; \
                 sh -c TIMED python3 -m pip install --no-cache-dir --disable-pip-version-check --target /dev/shm/…/rR --trusted-host 127.0.0.1 --index-url http://127.0.0.1:PORT/simple/ six idna; \
                 python3 hold.py direct 127.0.0.1 PORT 1000 {HOLD_S}"
            ),
        }
    }
}
