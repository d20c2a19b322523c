//! The files section's methods: writes into a workspace (files API, `cp -r`), copies of
//! a tree out of it (`mountctl cp`, `tar c | tar x`), and the watch's latency.

use std::cell::RefCell;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::rc::Rc;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use super::wire::{self, Conn};
use super::{BIG_DIR, Fixture, SMALL_FILE_BYTES, WATCH_DIR, info};
use crate::proc::{self, timed};
use crate::sections::{Ctx, Method, MethodInfo, Sample};
use crate::stats;

/// How long the watch may take to report one write before the run fails.
const WATCH_EVENT_TIMEOUT_MS: u64 = 5_000;

/// Checks a copy (untimed): every file there with every byte, then removes it.
fn check_and_remove(dir: &Path, files: u64, bytes: u64) -> Result<()> {
    let got = wire::count_tree(dir)?;
    ensure!(
        got == (files, bytes),
        "{} holds {} files of {} bytes, expected {files} of {bytes}",
        dir.display(),
        got.0,
        got.1
    );
    crate::cancel::remove_tree(dir)
}

/// 1,000 `files_write` requests (and one `files_mkdir`) on one control-socket connection.
pub(super) struct ApiWrite {
    pub(super) fx: Rc<Fixture>,
}

impl Method for ApiWrite {
    fn info(&self) -> MethodInfo {
        info(super::API_WRITE)
    }

    fn run_once(&mut self, ctx: &Ctx, round: usize) -> Result<Sample> {
        let dir = format!("w{round}");
        let n = self.fx.small.len();
        ctx.before_step()?;
        let ((), t) = timed(|| {
            let mut c = Conn::connect(&self.fx.socket)?;
            let mut buf = Vec::with_capacity(2 * SMALL_FILE_BYTES + 256);
            let mut data = String::with_capacity(2 * SMALL_FILE_BYTES);
            c.request(
                "files_mkdir",
                serde_json::json!({"workspace": self.fx.ws_id, "path": dir}),
                &mut buf,
            )?;
            for (name, bytes) in &self.fx.small {
                data.clear();
                wire::base64_into(bytes, &mut data);
                c.request(
                    "files_write",
                    serde_json::json!({
                        "workspace": self.fx.ws_id,
                        "path": format!("{dir}/{name}"),
                        "data": data,
                    }),
                    &mut buf,
                )?;
            }
            Ok(())
        })?;
        check_and_remove(
            &self.fx.ws_path.join(&dir),
            n as u64,
            (n * SMALL_FILE_BYTES) as u64,
        )?;
        Ok(vec![("write_s", t.wall_s())])
    }
}

/// `cp -r SRC WSPATH/cN` on the host.
pub(super) struct CpIn {
    pub(super) fx: Rc<Fixture>,
    pub(super) cp: PathBuf,
}

impl Method for CpIn {
    fn info(&self) -> MethodInfo {
        info(super::CP_IN)
    }

    fn run_once(&mut self, ctx: &Ctx, round: usize) -> Result<Sample> {
        let dest = self.fx.ws_path.join(format!("c{round}"));
        ctx.prepare_cache(&self.fx.small_src)?;
        ctx.before_step()?;
        let mut c = Command::new(&self.cp);
        c.arg("-r").arg(&self.fx.small_src).arg(&dest);
        let (_, t) = timed(|| proc::run(&mut c))?;
        let n = self.fx.small.len();
        check_and_remove(&dest, n as u64, (n * SMALL_FILE_BYTES) as u64)?;
        Ok(vec![("write_s", t.wall_s())])
    }
}

/// A copy of the 1 GiB tree out of the workspace: `mountctl cp` or `tar c | tar x`.
pub(super) struct CopyOut {
    pub(super) fx: Rc<Fixture>,
    /// `tar c | tar x` (else `mountctl cp`).
    pub(super) tar: bool,
}

impl Method for CopyOut {
    fn info(&self) -> MethodInfo {
        info(if self.tar {
            super::TAR_OUT
        } else {
            super::MOUNTCTL_CP_OUT
        })
    }

    fn slow(&self) -> bool {
        true
    }

    fn run_once(&mut self, ctx: &Ctx, round: usize) -> Result<Sample> {
        let fx = &self.fx;
        let dest = fx
            .out
            .join(format!("{}{round}", if self.tar { "t" } else { "m" }));
        ctx.prepare_cache(&fx.ws_path.join(BIG_DIR))?;
        let copied = if self.tar {
            std::fs::create_dir(&dest)?;
            let mut a = Command::new("tar");
            a.arg("c").arg("-C").arg(&fx.ws_path).arg(BIG_DIR);
            let mut b = Command::new("tar");
            b.arg("x").arg("-C").arg(&dest);
            let log = fx.out.join("tar-x.out");
            ctx.before_step()?;
            let (_, t) = timed(|| proc::pipe_to_file(&mut a, &mut b, &log))?;
            std::fs::remove_file(&log)?;
            (dest.join(BIG_DIR), t)
        } else {
            let mut c = Command::new(&fx.mountctl.path);
            c.arg("--root")
                .arg(&fx.root)
                .arg("cp")
                .arg(format!("{}:{BIG_DIR}", fx.ws_id))
                .arg(&dest);
            ctx.before_step()?;
            let (_, t) = timed(|| proc::run(&mut c))?;
            (dest.clone(), t)
        };
        let (path, t) = copied;
        check_and_remove(&path, fx.big_files, fx.big_bytes)?;
        if self.tar {
            crate::cancel::remove_tree(&dest)?;
        }
        let s = t.wall_s();
        Ok(vec![
            ("copy_s", s),
            ("copy_mbps", fx.big_bytes as f64 / 1e6 / s),
        ])
    }
}

/// `mountctl --json watch WS`, started for each run and stopped after it (so it costs
/// the other methods nothing).
pub(super) struct Watch {
    pub(super) fx: Rc<Fixture>,
    /// Every latency of the section (seconds), for the notes.
    pub(super) all: Rc<RefCell<Vec<f64>>>,
}

/// A running `mountctl --json watch WS`; the event lines with when they were read.
pub(super) struct Running {
    fx: Rc<Fixture>,
    child: Child,
    lines: Receiver<(Instant, String)>,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Running {
    /// Starts the watch; ready once a probe write was reported.
    pub(super) fn start(fx: Rc<Fixture>) -> Result<Self> {
        let mut child = Command::new(&fx.mountctl.path)
            .arg("--root")
            .arg(&fx.root)
            .args(["--json", "watch"])
            .arg(&fx.ws_id)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting mountctl watch")?;
        let out = child.stdout.take().context("no stdout pipe")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send((Instant::now(), line)).is_err() {
                    break;
                }
            }
        });
        let mut w = Self {
            fx,
            child,
            lines: rx,
        };
        // The watch is placed some time after the process starts: write probes until
        // one is reported.
        let deadline = Instant::now() + Duration::from_secs(30);
        for i in 0.. {
            ensure!(
                Instant::now() < deadline,
                "mountctl watch reported no probe write within 30 s"
            );
            if let Some(ex) = w.child.try_wait()? {
                bail!("mountctl watch exited ({ex}) before reporting anything");
            }
            if w.write_and_wait(&format!("probe-{i}"), 500).is_ok() {
                break;
            }
        }
        Ok(w)
    }

    /// Writes `WATCH_DIR/name` through the host path; the time until its event line.
    fn write_and_wait(&mut self, name: &str, timeout_ms: u64) -> Result<f64> {
        while self.lines.try_recv().is_ok() {}
        let rel = format!("{WATCH_DIR}/{name}");
        let path = self.fx.ws_path.join(&rel);
        let t0 = Instant::now();
        std::fs::write(&path, name.as_bytes())?;
        let deadline = t0 + Duration::from_millis(timeout_ms);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((at, line)) => {
                    if wire::event_path(&line).as_deref() == Some(rel.as_str()) {
                        return Ok(at.duration_since(t0).as_secs_f64());
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    bail!("no event for {rel} within {timeout_ms} ms")
                }
                Err(RecvTimeoutError::Disconnected) => bail!("mountctl watch ended"),
            }
        }
    }
}

impl Method for Watch {
    fn info(&self) -> MethodInfo {
        info(super::WATCH)
    }

    fn run_once(&mut self, ctx: &Ctx, round: usize) -> Result<Sample> {
        let mut w = Running::start(self.fx.clone())?;
        let mut got = Vec::new();
        for i in 0..ctx.fast_per_round() {
            ctx.before_step()?;
            got.push(w.write_and_wait(&format!("r{round}-{i}"), WATCH_EVENT_TIMEOUT_MS)?);
        }
        drop(w);
        self.all.borrow_mut().extend(&got);
        let median = stats::median(&got).context("no writes")?;
        let max = got.iter().copied().fold(0.0, f64::max);
        Ok(vec![
            ("watch_latency_s", median),
            ("watch_latency_max_s", max),
        ])
    }
}
