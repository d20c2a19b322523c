//! Disk I/O limits of sandboxes end to end, as root: a sandbox started with `--io-max`
//! reads and writes a file of its workspace with direct I/O (no page cache in the way)
//! at about the limit, its status reports the throttle as the kernel has it, and what
//! this host cannot enforce (`--io-weight` without a proportional I/O scheduler) or
//! what is malformed is refused before anything runs.
//!
//! The rate is printed with its ratio to the limit; only an order-of-magnitude bound is
//! asserted (the machine is shared and noisy).

use std::path::Path;
use std::process::Command;

use cowspace_tests::{mountctl_bin, noise, write_file};
use serde_json::Value;

use crate::sandbox::support as sandbox_support;
use crate::workspaces::support::{WsRoot, require_root};

const MIB: u64 = 1 << 20;
/// The limit the sandbox gets, bytes per second.
const LIMIT_BPS: u64 = 8 * MIB;
/// The file read back (four seconds at the limit).
const READ_BYTES: u64 = 32 * MIB;
/// What is written (two seconds at the limit).
const WRITE_BYTES: u64 = 16 * MIB;
/// How far the measured rate may be from the limit, either way, before the test calls
/// the limit not applied (or applied to something else).
const MAX_RATIO: f64 = 10.0;

/// `mountctl --root ROOT ARGS...` with the helper this test run built.
fn mountctl(r: &WsRoot, args: &[&str]) -> std::process::Output {
    Command::new(mountctl_bin())
        .arg("--root")
        .arg(r.root())
        .args(args)
        .env("COWSPACE_SANDBOX_HELPER", sandbox_support::helper())
        .env_remove("COWSPACE_ROOT")
        .output()
        .expect("start mountctl")
}

/// Bytes per second from dd's last line (`N bytes (...) copied, S s, ...`).
fn dd_rate(stderr: &str) -> f64 {
    let line = stderr
        .lines()
        .rfind(|l| l.contains("copied"))
        .unwrap_or_else(|| panic!("no dd summary in {stderr:?}"));
    let bytes: f64 = line.split_whitespace().next().unwrap().parse().unwrap();
    let secs: f64 = line
        .split_once("copied, ")
        .and_then(|(_, rest)| rest.split_once(" s"))
        .unwrap_or_else(|| panic!("no seconds in {line:?}"))
        .0
        .parse()
        .unwrap();
    bytes / secs
}

/// Runs `dd ARGS` in the sandbox of `ws`: its rate, bytes per second.
fn dd_in(r: &WsRoot, ws: &str, args: &[&str]) -> f64 {
    let mut all = vec!["exec", ws, "--", "dd"];
    all.extend_from_slice(args);
    let out = mountctl(r, &all);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "dd {args:?}: {stderr}");
    dd_rate(&stderr)
}

fn weight_offered() -> bool {
    let v1 = Path::new("/sys/fs/cgroup/blkio");
    v1.join("blkio.weight").exists() || v1.join("blkio.bfq.weight").exists()
}

#[test]
fn io_max_holds_a_sandboxs_direct_reads_and_writes_near_the_limit() {
    require_root!();
    sandbox_support::helper();
    let r = WsRoot::new();
    check_io_max(&r);
    r.assert_clean();
}

/// On a root whose workspaces live in a loop-mounted image (`init --workspaces-fs`):
/// the image's pages in the host's cache must not let reads past the limit.
#[test]
fn io_max_holds_on_a_workspaces_filesystem_of_its_own() {
    require_root!();
    sandbox_support::helper();
    let q = crate::quota::QuotaRoot::new();
    check_io_max(&q.ws);
}

fn check_io_max(r: &WsRoot) {
    let src = r.t.path("src");
    write_file(&src.join("README"), "io\n");
    r.import(&src, &["--ref", "base"]);
    let w = r.create("base", &[]);
    write_file(&w.path.join("big.bin"), noise(7, READ_BYTES as usize));
    Command::new("sync").status().unwrap();

    // Refused before anything runs: a malformed limit, and a weight this host's
    // schedulers do not offer.
    let out = mountctl(
        r,
        &["--json", "run", &w.id, "--io-max", "rbps=0", "--", "true"],
    );
    assert_eq!(out.status.code(), Some(9), "{out:?}");
    if !weight_offered() {
        let out = mountctl(
            r,
            &["--json", "run", &w.id, "--io-weight", "100", "--", "true"],
        );
        assert_eq!(out.status.code(), Some(7), "{out:?}");
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains("weight") && msg.contains("scheduler"), "{v}");
    }

    let limit = LIMIT_BPS.to_string();
    let out = mountctl(
        r,
        &["--json", "sandbox", "start", &w.id, "--io-max", &limit],
    );
    assert!(out.status.success(), "{out:?}");
    let st: Value =
        serde_json::from_slice(&mountctl(r, &["--json", "sandbox", "status", &w.id]).stdout)
            .unwrap();
    let io = &st["limits"]["io_max"];
    assert_eq!(io["read_bps"], LIMIT_BPS, "{st}");
    assert_eq!(io["write_bps"], LIMIT_BPS, "{st}");
    assert!(
        io["devices"].as_array().is_some_and(|d| !d.is_empty()),
        "{st}"
    );

    let read = dd_in(
        r,
        &w.id,
        &[
            "if=/workspace/big.bin",
            "of=/dev/null",
            "bs=1M",
            "iflag=direct",
        ],
    );
    let count = (WRITE_BYTES / MIB).to_string();
    let write = dd_in(
        r,
        &w.id,
        &[
            "if=/dev/zero",
            "of=/workspace/out.bin",
            "bs=1M",
            &format!("count={count}"),
            "oflag=direct",
        ],
    );
    mountctl(r, &["sandbox", "stop", &w.id]);
    // The same reads without a limit, for the record.
    let free = {
        let out = mountctl(
            r,
            &[
                "run",
                &w.id,
                "--",
                "dd",
                "if=/workspace/big.bin",
                "of=/dev/null",
                "bs=1M",
                "iflag=direct",
            ],
        );
        dd_rate(&String::from_utf8_lossy(&out.stderr))
    };
    let (rr, wr) = (read / LIMIT_BPS as f64, write / LIMIT_BPS as f64);
    eprintln!(
        "io-max {:.1} MiB/s: direct read {:.2} MiB/s (ratio {rr:.2}), direct write {:.2} MiB/s \
         (ratio {wr:.2}); unlimited read {:.1} MiB/s",
        LIMIT_BPS as f64 / MIB as f64,
        read / MIB as f64,
        write / MIB as f64,
        free / MIB as f64
    );
    for (what, ratio) in [("read", rr), ("write", wr)] {
        assert!(
            ratio < MAX_RATIO && ratio > 1.0 / MAX_RATIO,
            "{what} at {ratio:.2} times the limit"
        );
    }
    r.discard(&w.id);
}
