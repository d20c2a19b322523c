//! The clients the network section runs, the same program on both sides (inside the
//! sandbox through the proxy, and on the host straight to the origin), and the reading of
//! what they print.
//!
//! - Bulk: `curl -o /dev/null`, the host's `/usr/bin/curl`, which the sandbox sees too
//!   (its root binds the host's `/usr`). curl is a C client that reads into a buffer and
//!   drops it, so it is cheap next to what it measures, identical on both sides, and it
//!   reports its own transfer time (`%{time_total}`), which leaves out its process start
//!   and `mountctl exec`'s. Python reading 1 GiB would measure the interpreter's copies;
//!   a Rust client of our own would have to be bound in and is what no user runs.
//! - Requests: one Python process ([`LATENCY_PY`]) doing the requests in a loop, timing
//!   each, so process start is outside every figure: urllib (a new connection per
//!   request, `Connection: close`, proxies from the environment, as tools do) and then
//!   `http.client` on one kept-alive connection.
//! - Held connections: one Python process ([`HOLD_PY`]) opening N connections, each
//!   `CONNECT` through the proxy (or straight to the origin) then one request, holding
//!   them all, printing a line while they are held (when bench reads the proxy's
//!   memory), and after a pause using each once more: a connection counts when it worked
//!   both times.
//! - pip: `/usr/bin/python3 -m pip install …`, timed by `sh` around it ([`TIMED_SH`]),
//!   the same wrapper on both sides.

use anyhow::{Context, Result, bail, ensure};
use serde::Deserialize;

/// Requests timed per run by [`LATENCY_PY`], each way.
pub const REQUESTS: usize = 1_000;
/// Untimed requests before them (imports, first connections, the proxy's first lookup).
pub const WARMUP_REQUESTS: usize = 20;
/// Connections [`HOLD_PY`] opens and holds.
pub const HOLD_CONNECTIONS: usize = 1_000;
/// How long they stay held after the count is printed.
pub const HOLD_S: u64 = 3;

/// `python3 latency.py MODE HOST PORT N WARMUP BODY_BYTES` → one JSON line
/// `{"new": [s…], "keepalive": [s…]}`. MODE `proxy` takes the proxy from the environment
/// (`HTTP_PROXY`, as urllib's tools do); `direct` uses none.
pub const LATENCY_PY: &str = r#"
import http.client, json, sys, time, urllib.parse, urllib.request
mode, host, port, n, warm, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
url = "http://%s:%d/small" % (host, port)
if mode == "proxy":
    proxy = urllib.request.getproxies().get("http")
    if not proxy:
        sys.exit("no http proxy in the environment")
    opener = urllib.request.build_opener()
else:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
def check(status, body):
    if status != 200 or len(body) != size:
        sys.exit("unexpected answer: %s, %d bytes" % (status, len(body)))
def fresh():
    with opener.open(url, timeout=10) as r:
        check(r.status, r.read())
for _ in range(warm):
    fresh()
new = []
for _ in range(n):
    t0 = time.perf_counter()
    fresh()
    new.append(time.perf_counter() - t0)
if mode == "proxy":
    p = urllib.parse.urlsplit(proxy)
    c = http.client.HTTPConnection(p.hostname, p.port or 80, timeout=10)
    target = url
else:
    c = http.client.HTTPConnection(host, port, timeout=10)
    target = "/small"
ka = []
for i in range(warm + n):
    t0 = time.perf_counter()
    c.request("GET", target)
    r = c.getresponse()
    check(r.status, r.read())
    if i >= warm:
        ka.append(time.perf_counter() - t0)
c.close()
print(json.dumps({"new": new, "keepalive": ka}))
"#;

/// `python3 hold.py MODE HOST PORT N HOLD_S` → `{"held": N, "open_s": s, "errors": {…}}`
/// once all are open, then `{"alive": N, "errors": {…}}` after the hold.
pub const HOLD_PY: &str = r#"
import json, resource, socket, sys, time, urllib.parse, urllib.request
mode, host, port, n, hold = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
want = n + 64
if hard != resource.RLIM_INFINITY:
    want = min(want, hard)
if soft != resource.RLIM_INFINITY and soft < want:
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
if mode == "proxy":
    p = urllib.parse.urlsplit(urllib.request.getproxies()["http"])
    via = (p.hostname, p.port or 80)
else:
    via = (host, port)
get = ("GET /small HTTP/1.1\r\nHost: %s:%d\r\n\r\n" % (host, port)).encode()
def head(s):
    data = b""
    while b"\r\n\r\n" not in data:
        b = s.recv(4096)
        if not b:
            raise ConnectionError("closed before the head")
        data += b
        if len(data) > 65536:
            raise ValueError("head too long")
    h, rest = data.split(b"\r\n\r\n", 1)
    if not (h.startswith(b"HTTP/1.1 200") or h.startswith(b"HTTP/1.0 200")):
        raise ValueError(h.split(b"\r\n")[0].decode(errors="replace"))
    return h, rest
def exchange(s):
    s.sendall(get)
    h, rest = head(s)
    length = 0
    for line in h.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v)
    while len(rest) < length:
        b = s.recv(65536)
        if not b:
            raise ConnectionError("closed in the body")
        rest += b
errors = {}
def err(e):
    k = "%s: %s" % (type(e).__name__, str(e)[:80])
    errors[k] = errors.get(k, 0) + 1
socks = []
t0 = time.perf_counter()
for i in range(n):
    s = None
    try:
        s = socket.create_connection(via, timeout=10)
        if mode == "proxy":
            s.sendall(("CONNECT %s:%d HTTP/1.1\r\nHost: %s:%d\r\n\r\n" % (host, port, host, port)).encode())
            head(s)
        exchange(s)
        socks.append(s)
    except Exception as e:
        err(e)
        if s is not None:
            s.close()
print(json.dumps({"held": len(socks), "open_s": time.perf_counter() - t0, "errors": errors}), flush=True)
time.sleep(hold)
alive = 0
for s in socks:
    try:
        exchange(s)
        alive += 1
    except Exception as e:
        err(e)
for s in socks:
    s.close()
print(json.dumps({"alive": alive, "errors": errors}), flush=True)
"#;

/// `sh -c TIMED_SH sh PROGRAM ARGS…`: runs the program with its stdout discarded and
/// prints its wall time in nanoseconds (`date +%s%N` before and after), or fails with its
/// exit code.
pub const TIMED_SH: &str =
    r#"t0=$(date +%s%N); "$@" >/dev/null || exit $?; t1=$(date +%s%N); echo $((t1 - t0))"#;

/// curl's `-w` format for a bulk download.
pub const CURL_WRITE_OUT: &str = "%{http_code} %{size_download} %{time_total}\n";

/// One bulk download as curl reports it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Download {
    pub bytes: u64,
    pub seconds: f64,
}

impl Download {
    /// Throughput in MB/s (10^6 bytes per second).
    pub fn mbps(&self) -> f64 {
        self.bytes as f64 / self.seconds / 1e6
    }
}

/// Reads curl's [`CURL_WRITE_OUT`] line; the download must be a 200 of `want` bytes.
pub fn parse_curl(out: &str, want: u64) -> Result<Download> {
    let f: Vec<&str> = out.split_whitespace().collect();
    ensure!(f.len() == 3, "curl printed {out:?}, not `code size time`");
    ensure!(f[0] == "200", "curl got HTTP {} (output {out:?})", f[0]);
    let bytes: u64 = f[1].parse().context("curl's size_download")?;
    let seconds: f64 = f[2].parse().context("curl's time_total")?;
    ensure!(bytes == want, "curl read {bytes} bytes, not {want}");
    ensure!(
        seconds > 0.0 && seconds.is_finite(),
        "curl's time_total {seconds}"
    );
    Ok(Download { bytes, seconds })
}

/// What [`LATENCY_PY`] prints: each request's time, in seconds.
#[derive(Debug, Deserialize)]
pub struct Latencies {
    pub new: Vec<f64>,
    pub keepalive: Vec<f64>,
}

pub fn parse_latencies(out: &str, n: usize) -> Result<Latencies> {
    let line = out
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .with_context(|| format!("the latency client printed no JSON: {out:?}"))?;
    let l: Latencies = serde_json::from_str(line).context("the latency client's JSON")?;
    ensure!(
        l.new.len() == n && l.keepalive.len() == n,
        "the latency client timed {} and {} requests, not {n}",
        l.new.len(),
        l.keepalive.len()
    );
    ensure!(
        l.new
            .iter()
            .chain(&l.keepalive)
            .all(|v| v.is_finite() && *v >= 0.0),
        "a negative or non-finite request time"
    );
    Ok(l)
}

/// [`HOLD_PY`]'s first line (all opened) or second (after the hold).
#[derive(Debug, Deserialize, PartialEq)]
pub struct HoldLine {
    #[serde(default)]
    pub held: Option<u64>,
    #[serde(default)]
    pub open_s: Option<f64>,
    #[serde(default)]
    pub alive: Option<u64>,
    #[serde(default)]
    pub errors: std::collections::BTreeMap<String, u64>,
}

pub fn parse_hold_line(line: &str) -> Result<HoldLine> {
    serde_json::from_str(line.trim())
        .with_context(|| format!("the hold client printed {line:?}, not its JSON line"))
}

/// [`TIMED_SH`]'s output: the nanoseconds, as seconds.
pub fn parse_timed(out: &str) -> Result<f64> {
    let Some(last) = out.lines().rev().find(|l| !l.trim().is_empty()) else {
        bail!("the timing wrapper printed nothing");
    };
    let ns: u64 = last
        .trim()
        .parse()
        .with_context(|| format!("the timing wrapper printed {last:?}"))?;
    Ok(ns as f64 / 1e9)
}

/// Ticks of `/proc/PID/stat`'s times: `USER_HZ`, which the kernel fixes at 100 for
/// user space on every architecture bench runs on.
const USER_HZ: f64 = 100.0;

/// A process's user + system time, in seconds, from its `/proc/PID/stat` line (fields 14
/// and 15, counted after the command name, which may hold spaces and parentheses).
pub fn stat_cpu_s(stat: &str) -> Option<f64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): utime is field 14, stime 15.
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / USER_HZ)
}

/// Paired by run: `f(ours[i], base[i])` for the runs both completed (a failed method stops,
/// so the first `min` runs of each are the same rounds).
pub fn paired(ours: &[f64], base: &[f64], f: impl Fn(f64, f64) -> f64) -> Vec<f64> {
    ours.iter().zip(base).map(|(a, b)| f(*a, *b)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn curl_lines_parse_and_wrong_downloads_fail() {
        let d = parse_curl("200 1073741824 0.5\n", 1 << 30).unwrap();
        assert_eq!(d.bytes, 1 << 30);
        assert!((d.mbps() - 2147.483648).abs() < 1e-6);
        assert!(parse_curl("403 20 0.001", 1 << 30).is_err());
        assert!(parse_curl("200 5 0.5", 1 << 30).is_err());
        assert!(parse_curl("200 5 0", 5).is_err());
        assert!(parse_curl("", 5).is_err());
    }

    #[test]
    fn latency_output_parses_and_must_have_every_request() {
        let out =
            "warning: something\n{\"new\": [0.001, 0.002], \"keepalive\": [0.0005, 0.0004]}\n";
        let l = parse_latencies(out, 2).unwrap();
        assert_eq!(l.new, vec![0.001, 0.002]);
        assert!(parse_latencies(out, 3).is_err());
        assert!(parse_latencies("Traceback…", 2).is_err());
    }

    #[test]
    fn hold_lines_parse() {
        let l = parse_hold_line("{\"held\": 1000, \"open_s\": 1.5, \"errors\": {}}").unwrap();
        assert_eq!(l.held, Some(1000));
        assert_eq!(l.alive, None);
        let l =
            parse_hold_line("{\"alive\": 998, \"errors\": {\"ConnectionError: x\": 2}}\n").unwrap();
        assert_eq!(l.alive, Some(998));
        assert_eq!(l.errors.values().sum::<u64>(), 2);
        assert!(parse_hold_line("held 3").is_err());
    }

    #[test]
    fn timed_wrapper_output_parses() {
        assert_eq!(parse_timed("1500000000\n").unwrap(), 1.5);
        assert!(parse_timed("").is_err());
        assert!(parse_timed("1.5s").is_err());
    }

    #[test]
    fn proc_stat_times_are_read_after_the_command_name() {
        let line = "4242 (sandbox (x) y) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 75 0 0 20 0 6 0 1234 0 0";
        assert_eq!(stat_cpu_s(line), Some(3.25));
        let own = std::fs::read_to_string("/proc/self/stat").unwrap();
        assert!(stat_cpu_s(&own).is_some_and(|s| s >= 0.0));
        assert_eq!(stat_cpu_s("garbage"), None);
    }

    #[test]
    fn pairs_are_taken_run_by_run() {
        assert_eq!(
            paired(&[3.0, 5.0, 7.0], &[1.0, 2.0], |a, b| a - b),
            vec![2.0, 3.0]
        );
        assert_eq!(paired(&[4.0], &[2.0], |a, b| a / b), vec![2.0]);
        assert!(paired(&[], &[1.0], |a, b| a - b).is_empty());
    }

    #[test]
    fn the_timing_wrapper_times_a_program_and_passes_its_failure_on() {
        let run = |prog: &str| {
            std::process::Command::new("sh")
                .args(["-c", TIMED_SH, "sh", prog])
                .output()
                .unwrap()
        };
        let ok = run("true");
        assert!(ok.status.success());
        let s = parse_timed(&String::from_utf8_lossy(&ok.stdout)).unwrap();
        assert!(s >= 0.0);
        let bad = run("false");
        assert_eq!(bad.status.code(), Some(1));
        assert!(bad.stdout.is_empty());
    }
}
