//! Running the runtime's binaries with a deadline, and reading processes from `/proc`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// How often a running child is polled for its exit.
const POLL_MS: u64 = 20;

/// What one command did.
#[derive(Debug, Clone)]
pub struct Out {
    /// Its exit code (`None`: killed by a signal, or by us at its deadline).
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// Wall time from spawn to exit.
    pub ms: f64,
}

impl Out {
    pub fn ok(&self) -> bool {
        self.code == Some(0)
    }

    /// The JSON value the command printed (with `--json`).
    pub fn json(&self) -> Result<serde_json::Value> {
        serde_json::from_str(self.stdout.trim())
            .with_context(|| format!("reading the JSON output {:?}", self.stdout))
    }

    /// One line naming the exit and the end of stderr, for failure messages.
    pub fn describe(&self) -> String {
        let err = self.stderr.trim();
        let tail: String = err
            .char_indices()
            .rev()
            .nth(600)
            .map_or(err, |(i, _)| &err[i..])
            .to_string();
        format!("exit {:?} after {:.0} ms: {tail}", self.code, self.ms)
    }
}

/// A child started and not yet waited for: its pid is known, so it can be killed.
pub struct Running {
    child: std::process::Child,
    started: Instant,
    out: thread::JoinHandle<String>,
    err: thread::JoinHandle<String>,
}

impl Running {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits until it exits or `deadline` passes (then kills it: `code` is `None`).
    pub fn wait(mut self, deadline: Duration) -> Result<Out> {
        let code = loop {
            if let Some(st) = self.child.try_wait()? {
                break st.code();
            }
            if self.started.elapsed() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break None;
            }
            thread::sleep(Duration::from_millis(POLL_MS));
        };
        let ms = self.started.elapsed().as_secs_f64() * 1e3;
        Ok(Out {
            code,
            stdout: self.out.join().unwrap_or_default(),
            stderr: self.err.join().unwrap_or_default(),
            ms,
        })
    }
}

/// Starts `cmd` with `input` on its stdin (none: `/dev/null`).
pub fn spawn(mut cmd: Command, input: Option<Vec<u8>>) -> Result<Running> {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.stdin(if input.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let started = Instant::now();
    let mut child = cmd.spawn().with_context(|| format!("starting {cmd:?}"))?;
    if let Some(bytes) = input {
        let mut stdin = child.stdin.take().context("stdin")?;
        thread::spawn(move || {
            let _ = stdin.write_all(&bytes);
        });
    }
    let mut so = child.stdout.take().context("stdout")?;
    let mut se = child.stderr.take().context("stderr")?;
    let out = thread::spawn(move || {
        let mut s = String::new();
        let _ = so.read_to_string(&mut s);
        s
    });
    let err = thread::spawn(move || {
        let mut s = String::new();
        let _ = se.read_to_string(&mut s);
        s
    });
    Ok(Running {
        child,
        started,
        out,
        err,
    })
}

/// Runs `mountctl` of one runtime root.
#[derive(Debug, Clone)]
pub struct Mountctl {
    pub bin: PathBuf,
    pub root: PathBuf,
}

impl Mountctl {
    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        c.arg("--root").arg(&self.root).args(args);
        for v in ["COWSPACE_ROOT", "COWSPACE_FSD", "COWSPACE_SANDBOX_HELPER"] {
            c.env_remove(v);
        }
        c
    }

    pub fn spawn(&self, args: &[&str], input: Option<Vec<u8>>) -> Result<Running> {
        spawn(self.command(args), input)
    }

    /// Runs it to the end (or `deadline`), whatever its exit.
    pub fn run(&self, args: &[&str], deadline: Duration) -> Result<Out> {
        self.spawn(args, None)?.wait(deadline)
    }

    /// Runs it with `input` on stdin.
    pub fn run_in(&self, args: &[&str], input: &[u8], deadline: Duration) -> Result<Out> {
        self.spawn(args, Some(input.to_vec()))?.wait(deadline)
    }

    /// Runs it and fails unless it exits 0.
    pub fn ok(&self, args: &[&str], deadline: Duration) -> Result<Out> {
        let out = self.run(args, deadline)?;
        if !out.ok() {
            bail!("`mountctl {}` failed: {}", args.join(" "), out.describe());
        }
        Ok(out)
    }

    /// Runs it with `--json` and returns the value it printed (fails unless it exits 0).
    pub fn json(&self, args: &[&str], deadline: Duration) -> Result<serde_json::Value> {
        let mut a = vec!["--json"];
        a.extend_from_slice(args);
        self.ok(&a, deadline)?.json()
    }
}

/// Runs a host command to its end; fails unless it exits 0.
pub fn host(cmd: &str, args: &[&str], dir: Option<&Path>, deadline: Duration) -> Result<Out> {
    let mut c = Command::new(cmd);
    c.args(args);
    if let Some(d) = dir {
        c.current_dir(d);
    }
    let out = spawn(c, None)?.wait(deadline)?;
    if !out.ok() {
        bail!("`{cmd} {}` failed: {}", args.join(" "), out.describe());
    }
    Ok(out)
}

/// The command line of `pid`, NUL separators as spaces (`None`: no such process).
pub fn cmdline(pid: u32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(String::from_utf8_lossy(&raw).replace('\0', " "))
}

/// Whether `pid` is alive and not a zombie.
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Every live process whose command line contains `needle`.
pub fn pids_matching(needle: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| alive(p) && cmdline(p).is_some_and(|c| c.contains(needle)))
        .collect()
}

/// Resident set size of `pid` in bytes.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Sends SIGKILL to `pid`.
pub fn kill9(pid: u32) -> Result<()> {
    let pid = i32::try_from(pid).context("pid out of range")?;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .with_context(|| format!("kill -9 {pid}"))
}

/// Body of `GET /path` from 127.0.0.1:`port` (HTTP/1.0, so the server closes).
/// Written with the standard library: one request to our own loopback server needs no
/// HTTP client crate in the contributors' tool.
pub fn http_get(port: u16, path: &str, deadline: Duration) -> Result<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))
        .with_context(|| format!("connecting to 127.0.0.1:{port}"))?;
    s.set_read_timeout(Some(deadline))?;
    s.set_write_timeout(Some(deadline))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut buf = String::new();
    s.read_to_string(&mut buf)
        .with_context(|| format!("reading the answer of 127.0.0.1:{port}{path}"))?;
    let status: u16 = buf
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("no HTTP status in {:?}", &buf[..buf.len().min(80)]))?;
    let body = buf
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    Ok((status, body))
}

/// The `q` quantile (0..=1) of `xs` (nearest rank); 0 when empty.
pub fn quantile(xs: &[f64], q: f64) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_rank() {
        let xs: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&xs, 0.5), 50.0);
        assert_eq!(quantile(&xs, 0.99), 99.0);
        assert_eq!(quantile(&xs, 1.0), 100.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }

    #[test]
    fn a_command_past_its_deadline_is_killed() {
        let mut c = Command::new("sleep");
        c.arg("30");
        let out = spawn(c, None)
            .unwrap()
            .wait(Duration::from_millis(200))
            .unwrap();
        assert_eq!(out.code, None);
    }

    #[test]
    fn stdin_reaches_the_command() {
        let out = spawn(Command::new("cat"), Some(b"abc".to_vec()))
            .unwrap()
            .wait(Duration::from_secs(30))
            .unwrap();
        assert_eq!((out.code, out.stdout.as_str()), (Some(0), "abc"));
    }
}
