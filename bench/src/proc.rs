//! Running external programs: timed, with their CPU time, and with errors that
//! quote the command and the tail of its stderr.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// How long and how much CPU (user + system, of all children) one step took.
#[derive(Debug, Clone, Copy, Default)]
pub struct Timing {
    pub wall: Duration,
    pub cpu: Duration,
}

impl Timing {
    pub fn wall_s(&self) -> f64 {
        self.wall.as_secs_f64()
    }
    pub fn cpu_s(&self) -> f64 {
        self.cpu.as_secs_f64()
    }
}

impl std::ops::Add for Timing {
    type Output = Timing;
    fn add(self, o: Timing) -> Timing {
        Timing {
            wall: self.wall + o.wall,
            cpu: self.cpu + o.cpu,
        }
    }
}

/// CPU time consumed so far by waited-for children of this process.
fn children_cpu() -> Duration {
    use nix::sys::resource::{UsageWho, getrusage};
    match getrusage(UsageWho::RUSAGE_CHILDREN) {
        Ok(u) => {
            let tv = |t: nix::sys::time::TimeVal| {
                Duration::new(t.tv_sec().max(0) as u64, (t.tv_usec().max(0) as u32) * 1000)
            };
            tv(u.user_time()) + tv(u.system_time())
        }
        Err(_) => Duration::ZERO,
    }
}

/// Measures `f`, which must wait for every child it starts.
pub fn timed<T>(f: impl FnOnce() -> Result<T>) -> Result<(T, Timing)> {
    let cpu0 = children_cpu();
    let t0 = Instant::now();
    let out = f()?;
    let wall = t0.elapsed();
    let cpu = children_cpu().saturating_sub(cpu0);
    Ok((out, Timing { wall, cpu }))
}

/// A CPU list as `taskset -c` takes it (`0`, `0-3,6`): CPUs this process may use.
pub fn parse_cpu_list(s: &str) -> Result<nix::sched::CpuSet> {
    use nix::sched::{CpuSet, sched_getaffinity};
    let own = sched_getaffinity(nix::unistd::Pid::from_raw(0))?;
    let mut set = CpuSet::new();
    for part in s.split(',') {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let parse = |x: &str| {
            x.trim()
                .parse::<usize>()
                .with_context(|| format!("{part:?} is not a CPU number or range (like 0-3)"))
        };
        let (a, b) = (parse(a)?, parse(b)?);
        if a > b {
            bail!("{part:?}: a range goes from low to high");
        }
        for cpu in a..=b {
            if !own.is_set(cpu).unwrap_or(false) {
                bail!("CPU {cpu} is not one this process may use (see `taskset -p $$`)");
            }
            set.set(cpu)?;
        }
    }
    Ok(set)
}

/// Renders a command for messages and the report.
pub fn display(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        let a = a.to_string_lossy();
        if a.is_empty() || a.contains([' ', '|', '"', '\'', '$', '*']) {
            s.push_str(&format!(" '{}'", a.replace('\'', "'\\''")));
        } else {
            s.push(' ');
            s.push_str(&a);
        }
    }
    s
}

/// Runs to completion; fails on a non-zero exit with the stderr tail. Returns stdout.
pub fn run(cmd: &mut Command) -> Result<Vec<u8>> {
    let shown = display(cmd);
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("starting `{shown}`"))?;
    if !out.status.success() {
        bail!(
            "`{shown}` failed ({}): {}",
            out.status,
            tail(&out.stderr, &out.stdout)
        );
    }
    Ok(out.stdout)
}

/// Like [`run`] but hands back the exit code and output even on failure.
pub fn run_status(cmd: &mut Command) -> Result<(Option<i32>, Vec<u8>, Vec<u8>)> {
    let shown = display(cmd);
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("starting `{shown}`"))?;
    Ok((out.status.code(), out.stdout, out.stderr))
}

/// `a | b > out`, failing if either side fails (what `set -o pipefail` would do).
pub fn pipe_to_file(a: &mut Command, b: &mut Command, out: &Path) -> Result<()> {
    let shown = format!("{} | {} > {}", display(a), display(b), out.display());
    let file = std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
    // stderr goes to files, not pipes: a chatty writer must never block on a pipe
    // nobody reads while we wait for the other side.
    let err_path = |side: &str| {
        let mut p = out.as_os_str().to_owned();
        p.push(format!(".{side}.stderr"));
        std::path::PathBuf::from(p)
    };
    let (ea, eb) = (err_path("a"), err_path("b"));
    let result = (|| {
        let mut ca = a
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&ea)?)
            .spawn()
            .with_context(|| format!("starting `{shown}`"))?;
        let a_out = ca.stdout.take().context("no stdout pipe")?;
        let cb = b
            .stdin(a_out)
            .stdout(file)
            .stderr(std::fs::File::create(&eb)?)
            .spawn();
        let mut cb = match cb {
            Ok(c) => c,
            Err(e) => {
                let _ = ca.kill();
                let _ = ca.wait();
                return Err(e).with_context(|| format!("starting `{shown}`"));
            }
        };
        let sb = cb.wait().context("waiting for the pipe's reader")?;
        let sa = ca.wait().context("waiting for the pipe's writer")?;
        if !sa.success() || !sb.success() {
            let read = |p: &Path| std::fs::read(p).unwrap_or_default();
            bail!(
                "`{shown}` failed ({sa} / {sb}): {} {}",
                tail(&read(&ea), &[]),
                tail(&read(&eb), &[])
            );
        }
        Ok(())
    })();
    let _ = std::fs::remove_file(&ea);
    let _ = std::fs::remove_file(&eb);
    result
}

/// The last few lines of a failed command's output, for error messages.
pub fn tail(stderr: &[u8], stdout: &[u8]) -> String {
    const MAX_TAIL_BYTES: usize = 600;
    let src = if stderr.iter().any(|b| !b.is_ascii_whitespace()) {
        stderr
    } else {
        stdout
    };
    let s = String::from_utf8_lossy(src);
    let s = s.trim();
    if s.len() > MAX_TAIL_BYTES {
        let mut start = s.len() - MAX_TAIL_BYTES;
        while !s.is_char_boundary(start) {
            start += 1;
        }
        format!("…{}", &s[start..])
    } else {
        s.to_string()
    }
}

/// Finds a program on PATH.
pub fn which(prog: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(prog))
        .find(|p| p.is_file() && is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_as_taskset_takes_them() {
        let own = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).unwrap();
        let first = (0..nix::sched::CpuSet::count())
            .find(|&c| own.is_set(c).unwrap())
            .unwrap();
        let set = parse_cpu_list(&first.to_string()).unwrap();
        assert!(set.is_set(first).unwrap());
        assert_eq!(
            (0..nix::sched::CpuSet::count())
                .filter(|&c| set.is_set(c).unwrap())
                .count(),
            1
        );
        let range = parse_cpu_list(&format!("{first}-{first}")).unwrap();
        assert_eq!(range, set);
        for bad in ["", "x", "3-1", "0-", "100000"] {
            assert!(parse_cpu_list(bad).is_err(), "{bad:?}");
        }
        let err = parse_cpu_list("1023").unwrap_err().to_string();
        assert!(
            err.contains("not one this process may use") || own.is_set(1023).unwrap(),
            "{err}"
        );
    }
}
