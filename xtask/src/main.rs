//! `cargo xtask <task> [--tier TIER]`: the one entry point for contributors' checks; CI
//! runs `check`.
//!
//! - `fmt`    — `cargo fmt --all --check`
//! - `clippy` — `cargo clippy --workspace --all-targets -- -D warnings`
//! - `test`   — `cargo build --workspace --bins`, then `cargo test --workspace` (the
//!   end-to-end tests run the built `mountctl`, `fsd` and `sandbox-helper`, which
//!   `cargo test` alone builds only as test harnesses; root-only tests run when root;
//!   with CI=true they never skip)
//! - `check`  — all three, in that order
//!
//! `--tier` runs part of the tests (with `test` or `check`):
//! - `unit` — every crate's unit tests (`--lib --bins`): no root, no mounts, a minute;
//! - `root` — every crate's own integration tests (the store's, the daemon's mounts, the
//!   runtime's, the helper's): root for the mounting ones;
//! - `e2e`  — the end-to-end tests of the built binaries (`cowspace-tests`: the CLI, the
//!   socket, sandboxes, VMs, the conformance gate).
//!
//! - `soak`   — hundreds of workspaces and dozens of sandboxes building a real project
//!   under injected faults, checked after each (`soak.rs`; `cargo xtask soak --help`)
//!
//! Each step's wall time is printed when it ends, and the total at the end.
#![forbid(unsafe_code)]

use std::process::{Command, ExitCode};
use std::time::Instant;

mod soak;

fn cargo(args: &[&str]) -> bool {
    eprintln!("+ cargo {}", args.join(" "));
    let started = Instant::now();
    let ok = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(args)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    eprintln!(
        "xtask: `cargo {}` {} in {:.1} s",
        args.join(" "),
        if ok { "passed" } else { "failed" },
        started.elapsed().as_secs_f64()
    );
    ok
}

const FMT: &[&str] = &["fmt", "--all", "--check"];
const CLIPPY: &[&str] = &[
    "clippy",
    "--workspace",
    "--all-targets",
    "--",
    "-D",
    "warnings",
];
const BUILD_BINS: &[&str] = &["build", "--workspace", "--bins"];

/// The test steps of `tier` (`None`: every test).
fn test_steps(tier: Option<&str>) -> Result<Vec<&'static [&'static str]>, String> {
    Ok(match tier {
        None => vec![BUILD_BINS, &["test", "--workspace", "--no-fail-fast"]],
        Some("unit") => vec![&["test", "--workspace", "--no-fail-fast", "--lib", "--bins"]],
        Some("root") => vec![
            BUILD_BINS,
            &[
                "test",
                "--workspace",
                "--no-fail-fast",
                "--exclude",
                "cowspace-tests",
                "--tests",
            ],
        ],
        Some("e2e") => vec![
            BUILD_BINS,
            &["test", "-p", "cowspace-tests", "--no-fail-fast"],
        ],
        Some(other) => return Err(format!("unknown tier {other:?}; tiers: unit, root, e2e")),
    })
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("soak") {
        return soak::main(&args[1..]);
    }
    let mut task = None;
    let mut tier = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--tier" => match it.next() {
                Some(t) => tier = Some(t.clone()),
                None => {
                    eprintln!("xtask: --tier needs a value: unit, root or e2e");
                    return ExitCode::from(2);
                }
            },
            t if task.is_none() && !t.starts_with('-') => task = Some(t.to_string()),
            other => {
                eprintln!("xtask: unexpected argument {other:?}");
                return ExitCode::from(2);
            }
        }
    }
    let task = task.unwrap_or_else(|| "check".into());
    let tests = match test_steps(tier.as_deref()) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("xtask: {e}");
            return ExitCode::from(2);
        }
    };
    let steps: Vec<&[&str]> = match task.as_str() {
        "fmt" | "clippy" if tier.is_some() => {
            eprintln!("xtask: --tier goes with `test` or `check`");
            return ExitCode::from(2);
        }
        "fmt" => vec![FMT],
        "clippy" => vec![CLIPPY],
        "test" => tests,
        "check" => [FMT, CLIPPY].into_iter().chain(tests).collect(),
        other => {
            eprintln!("xtask: unknown task {other:?}; tasks: fmt, clippy, test, check");
            return ExitCode::from(2);
        }
    };
    let started = Instant::now();
    for step in steps {
        if !cargo(step) {
            eprintln!("xtask: `cargo {}` failed", step.join(" "));
            return ExitCode::FAILURE;
        }
    }
    eprintln!(
        "xtask: {task} passed in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    ExitCode::SUCCESS
}
