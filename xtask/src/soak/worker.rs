//! A worker: one workspace with a long-lived sandbox, building and testing the project
//! over and over, serving its files on a published port, writing and reading files
//! through the files API, committing every few iterations; and carrying out the faults
//! that happen inside a sandbox (a full disk quota, a fork bomb, memory past the limit).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::env::{ADMIN_DEADLINE, PROJECT};
use super::proc;
use super::{Fault, Shared};

/// A commit every this many iterations.
const COMMIT_EVERY: u64 = 3;
/// The port each sandbox serves its workspace on (published to a host port).
const SERVED_PORT: u16 = 8000;
/// How long a sandbox's server gets to answer after it is started.
const SERVER_START: Duration = Duration::from_secs(60);
/// Deadline of one HTTP request to a published port.
const HTTP_DEADLINE: Duration = Duration::from_secs(60);

/// The build and test suite, run in the project's directory: the C extension compiled
/// from scratch, then all of the project's own tests against it.
pub fn build_script(dir: &str) -> String {
    format!(
        "cd {dir} && rm -rf build simplejson/_speedups*.so && \
         python3 setup.py -q build_ext -i >build.log 2>&1 && \
         ls simplejson/_speedups*.so >/dev/null && \
         python3 -m unittest -q simplejson.tests.all_tests_suite 2>test.log || \
         {{ tail -5 build.log test.log; exit 1; }}"
    )
}

/// One worker's state.
struct Worker<'a> {
    sh: &'a Shared<'a>,
    i: usize,
    ws: String,
    /// `sandbox start --json` of the running sandbox.
    info: Value,
    /// The content last written through the files API and read back (synced).
    synced: String,
    host_port: u16,
    iteration: u64,
}

/// Runs worker `i` until the soak stops; a failure is recorded and stops the soak.
pub fn run(sh: &Shared, i: usize) {
    let r = (|| -> Result<()> {
        let mut w = Worker::start(sh, i)?;
        while !sh.stopping() {
            if let Some(f) = sh.slots[i].mailbox.lock().unwrap().take() {
                let outcome = w.fault(f);
                sh.slots[i].report(outcome.map_err(|e| format!("{e:#}")));
            }
            w.iterate()?;
        }
        if sh.slots[i].pending.load(Ordering::SeqCst) {
            // A kill landed after the last iteration: check what it left all the same.
            w.recover()?;
        }
        Ok(())
    })();
    if let Err(e) = r {
        sh.fail(format!("worker {i}: {e:#}"));
    }
}

impl<'a> Worker<'a> {
    fn start(sh: &'a Shared<'a>, i: usize) -> Result<Worker<'a>> {
        let ws = format!("{}-w{i}", sh.env.tag);
        sh.create_workspace(&ws)?;
        let mut w = Worker {
            sh,
            i,
            ws,
            info: Value::Null,
            synced: String::new(),
            host_port: 0,
            iteration: 0,
        };
        w.start_sandbox()?;
        Ok(w)
    }

    fn mc(&self) -> &proc::Mountctl {
        &self.sh.env.mc
    }

    fn start_sandbox(&mut self) -> Result<()> {
        let mem = self.sh.opts.memory.clone();
        let pids = self.sh.opts.pids.to_string();
        let port = SERVED_PORT.to_string();
        let info = self.mc().json(
            &[
                "sandbox",
                "start",
                &self.ws,
                "--publish",
                &port,
                "--memory",
                &mem,
                "--pids",
                &pids,
            ],
            ADMIN_DEADLINE,
        )?;
        self.host_port = info["ports"][&port]
            .as_u64()
            .context("sandbox start: no published port")? as u16;
        *self.sh.slots[self.i].info.lock().unwrap() = Some(info.clone());
        self.info = info;
        let serve = format!("nohup python3 -m http.server {SERVED_PORT} >/dev/null 2>&1 &");
        self.exec(&["sh", "-c", &serve])?;
        let t = Instant::now();
        loop {
            if matches!(
                proc::http_get(self.host_port, "/", HTTP_DEADLINE),
                Ok((200, _))
            ) {
                return Ok(());
            }
            if t.elapsed() > SERVER_START {
                bail!(
                    "{}: its server did not answer on port {} within {SERVER_START:?}",
                    self.ws,
                    self.host_port
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `exec` in the sandbox; fails unless the command exits 0. Returns its output.
    fn exec(&self, cmd: &[&str]) -> Result<proc::Out> {
        let mut args = vec!["exec", self.ws.as_str(), "--"];
        args.extend_from_slice(cmd);
        let out = self.mc().run(&args, self.sh.bound)?;
        if !out.ok() {
            let shown: String = cmd.join(" ").chars().take(80).collect();
            bail!(
                "{}: `{shown}` failed: {}{}",
                self.ws,
                out.stdout,
                out.describe()
            );
        }
        Ok(out)
    }

    /// One iteration; a failure while a kill of this worker's sandbox is pending starts
    /// the recovery instead.
    fn iterate(&mut self) -> Result<()> {
        let started = Instant::now();
        match self.iteration_steps() {
            Ok(exec_ms) => {
                let ms = started.elapsed().as_secs_f64() * 1e3;
                self.sh.record_iteration(ms, exec_ms);
                self.iteration += 1;
                Ok(())
            }
            Err(e) if self.sh.slots[self.i].pending.load(Ordering::SeqCst) => {
                self.sh.count_interrupted();
                let _ = e;
                self.recover()
            }
            Err(e) => Err(e.context(format!(
                "iteration {} (no fault aimed at it)",
                self.iteration
            ))),
        }
    }

    /// Files API write and read-back, an `exec` timed alone, the build and tests, the
    /// file served back on the published port, a commit every few iterations.
    fn iteration_steps(&mut self) -> Result<f64> {
        let k = self.iteration;
        let content = format!("{} iteration {k}\n", self.ws);
        let target = format!("{}:soak/iter.txt", self.ws);
        let w = self.mc().run_in(
            &["fs", "write", &target],
            content.as_bytes(),
            ADMIN_DEADLINE,
        )?;
        if !w.ok() {
            bail!("fs write {target}: {}", w.describe());
        }
        let copy = self
            .sh
            .env
            .base
            .join("host")
            .join(format!("w{}.txt", self.i));
        let copy_s = copy.to_string_lossy().to_string();
        let _ = std::fs::remove_file(&copy);
        self.mc().ok(&["cp", &target, &copy_s], ADMIN_DEADLINE)?;
        let back = std::fs::read_to_string(&copy)?;
        if back != content {
            bail!("cp {target}: read back {back:?}, wrote {content:?}");
        }
        self.synced = content.clone();
        let t = Instant::now();
        self.exec(&["true"])?;
        let exec_ms = t.elapsed().as_secs_f64() * 1e3;
        self.exec(&["sh", "-c", &build_script(&format!("/workspace/{PROJECT}"))])?;
        let (status, body) = proc::http_get(self.host_port, "/soak/iter.txt", HTTP_DEADLINE)?;
        if status != 200 || body != content {
            bail!(
                "GET :{}/soak/iter.txt answered {status} {body:?}, expected {content:?}",
                self.host_port
            );
        }
        if k % COMMIT_EVERY == COMMIT_EVERY - 1 {
            let msg = format!("soak {} iteration {k}", self.ws);
            let c = self
                .mc()
                .json(&["commit", &self.ws, "-m", &msg], ADMIN_DEADLINE)?;
            let snap = c["snapshot"].as_str().context("commit: no snapshot")?;
            self.sh.commits.lock().unwrap().push(snap.to_string());
        }
        Ok(exec_ms)
    }

    /// After its keeper or init was killed: the sandbox ends, `sweep` leaves nothing of
    /// it, the synced file is intact; then a new sandbox and server.
    fn recover(&mut self) -> Result<()> {
        let t = Instant::now();
        let old = self.info.clone();
        loop {
            let st = self
                .mc()
                .run(&["--json", "sandbox", "status", &self.ws], ADMIN_DEADLINE)?;
            if st.code == Some(3) {
                break;
            }
            if t.elapsed() > Duration::from_secs(60) {
                bail!(
                    "{}: its sandbox still runs 60 s after its process was killed: {}",
                    self.ws,
                    st.stdout
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        self.mc().ok(&["-q", "sweep"], ADMIN_DEADLINE)?;
        let left = self.sh.env.dead_sandbox_leftovers(&old);
        if !left.is_empty() {
            bail!("after sweep, the killed sandbox left: {}", left.join("; "));
        }
        let got = self.mc().ok(
            &["fs", "cat", &format!("{}:soak/iter.txt", self.ws)],
            ADMIN_DEADLINE,
        )?;
        if !self.synced.is_empty() && got.stdout != self.synced {
            bail!(
                "{}: synced data lost: soak/iter.txt holds {:?}, {:?} was written and read back",
                self.ws,
                got.stdout,
                self.synced
            );
        }
        self.start_sandbox()?;
        self.sh.slots[self.i].pending.store(false, Ordering::SeqCst);
        self.sh.slots[self.i].report(Ok(format!(
            "sandbox gone, sweep left nothing, synced file intact, running again in {:.1} s",
            t.elapsed().as_secs_f64()
        )));
        Ok(())
    }

    /// Carries out a fault inside its own sandbox and checks how it ended.
    fn fault(&mut self, f: Fault) -> Result<String> {
        match f {
            Fault::DiskFull => self.fill_disk(),
            Fault::ForkBomb => self.fork_bomb(),
            Fault::MemoryHog => self.memory_hog(),
            other => bail!("{other:?} is not a worker's fault"),
        }
    }

    fn disk(&self) -> Result<(u64, u64)> {
        let st = self.mc().json(&["status", &self.ws], ADMIN_DEADLINE)?;
        let used = st["disk"]["used_bytes"]
            .as_u64()
            .context("status: no disk.used_bytes")?;
        let limit = st["disk"]["limit_bytes"]
            .as_u64()
            .context("status: no disk.limit_bytes")?;
        Ok((used, limit))
    }

    fn fill_disk(&mut self) -> Result<String> {
        let (_, limit) = self.disk()?;
        let mib = limit / (1 << 20) + 64;
        let dd = format!("dd if=/dev/zero of=soak/fill bs=1M count={mib} 2>&1; sync");
        let out = self
            .mc()
            .run(&["exec", &self.ws, "--", "sh", "-c", &dd], self.sh.bound)?;
        if !out.stdout.contains("Disk quota exceeded") {
            bail!(
                "{}: writing {mib} MiB past a {limit}-byte quota did not fail with EDQUOT: {}",
                self.ws,
                out.stdout
            );
        }
        let (used, _) = self.disk()?;
        if used < limit / 10 * 9 {
            bail!(
                "{}: at its quota, status shows {used} of {limit} bytes used",
                self.ws
            );
        }
        self.exec(&["sh", "-c", "rm -f soak/fill && sync"])?;
        let t = Instant::now();
        let freed = loop {
            let (u, _) = self.disk()?;
            if u < limit / 2 {
                break u;
            }
            if t.elapsed() > Duration::from_secs(60) {
                bail!(
                    "{}: removing the file did not free its quota: {u} of {limit} bytes used after 60 s",
                    self.ws
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        };
        Ok(format!(
            "EDQUOT seen by the worker, status {used}/{limit} bytes at the limit, {freed} after removing the file"
        ))
    }

    fn fork_bomb(&mut self) -> Result<String> {
        let script = r"import os, signal, sys, time
kids = []
err = None
while len(kids) < 100000:
    try:
        pid = os.fork()
    except OSError as e:
        err = e
        break
    if pid == 0:
        time.sleep(120)
        os._exit(0)
    kids.append(pid)
for k in kids:
    os.kill(k, signal.SIGKILL)
for k in kids:
    os.waitpid(k, 0)
print('fork refused after', len(kids), 'children:', err)
sys.exit(0 if err else 1)
";
        let out = self.exec(&["python3", "-c", script])?;
        let n: u64 = out
            .stdout
            .split_whitespace()
            .nth(3)
            .and_then(|n| n.parse().ok())
            .context("fork bomb: no count printed")?;
        if n >= self.sh.opts.pids {
            bail!(
                "{}: {n} processes forked under a limit of {}",
                self.ws,
                self.sh.opts.pids
            );
        }
        self.exec(&["true"])?;
        Ok(format!(
            "{} (limit {}); the sandbox runs commands after",
            out.stdout.trim(),
            self.sh.opts.pids
        ))
    }

    fn memory_hog(&mut self) -> Result<String> {
        let before = self.oom_kills()?;
        let hog = "b = []\nwhile True:\n    b.append(b'x' * (16 << 20))\n";
        let out = self.mc().run(
            &["exec", &self.ws, "--", "python3", "-c", hog],
            self.sh.bound,
        )?;
        if out.code != Some(137) {
            bail!(
                "{}: allocating past {} ended with {}, not a kill (137)",
                self.ws,
                self.sh.opts.memory,
                out.describe()
            );
        }
        let after = self.oom_kills()?;
        if after <= before {
            bail!(
                "{}: killed, but its status counts {after} OOM kills (before: {before})",
                self.ws
            );
        }
        self.exec(&["true"])?;
        let served = matches!(
            proc::http_get(self.host_port, "/", HTTP_DEADLINE),
            Ok((200, _))
        );
        if !served {
            // The kernel's OOM killer may pick the server rather than the hog.
            let serve = format!("nohup python3 -m http.server {SERVED_PORT} >/dev/null 2>&1 &");
            self.exec(&["sh", "-c", &serve])?;
            let t = Instant::now();
            while !matches!(
                proc::http_get(self.host_port, "/", HTTP_DEADLINE),
                Ok((200, _))
            ) {
                if t.elapsed() > SERVER_START {
                    bail!(
                        "{}: its server did not answer again after the OOM kill",
                        self.ws
                    );
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        Ok(format!(
            "killed with 137, oom_kills {before} -> {after}; the sandbox runs commands after; {}",
            if served {
                "its server still answered"
            } else {
                "its server was killed too and was started again"
            }
        ))
    }

    fn oom_kills(&self) -> Result<u64> {
        let st = self
            .mc()
            .json(&["sandbox", "status", &self.ws], ADMIN_DEADLINE)?;
        st["oom_kills"]
            .as_u64()
            .with_context(|| format!("sandbox status: no oom_kills in {st}"))
    }
}
