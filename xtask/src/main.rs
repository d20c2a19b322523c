//! `cargo xtask <task>`: the one entry point for contributors' checks; CI runs `check`.
//!
//! - `fmt`    — `cargo fmt --all --check`
//! - `clippy` — `cargo clippy --workspace --all-targets -- -D warnings`
//! - `test`   — `cargo build --workspace --bins`, then `cargo test --workspace` (the
//!   end-to-end tests run the built `mountctl`, `fsd` and `sandbox-helper`, which
//!   `cargo test` alone builds only as test harnesses; root-only tests run when root;
//!   with CI=true they never skip)
//! - `check`  — all three, in that order
#![forbid(unsafe_code)]

use std::process::{Command, ExitCode};

fn cargo(args: &[&str]) -> bool {
    eprintln!("+ cargo {}", args.join(" "));
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(args)
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn main() -> ExitCode {
    let task = std::env::args().nth(1).unwrap_or_else(|| "check".into());
    let steps: Vec<&[&str]> = match task.as_str() {
        "fmt" => vec![&["fmt", "--all", "--check"]],
        "clippy" => vec![&[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]],
        "test" => vec![
            &["build", "--workspace", "--bins"],
            &["test", "--workspace", "--no-fail-fast"],
        ],
        "check" => vec![
            &["fmt", "--all", "--check"],
            &[
                "clippy",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ],
            &["build", "--workspace", "--bins"],
            &["test", "--workspace", "--no-fail-fast"],
        ],
        other => {
            eprintln!("xtask: unknown task {other:?}; tasks: fmt, clippy, test, check");
            return ExitCode::from(2);
        }
    };
    for step in steps {
        if !cargo(step) {
            eprintln!("xtask: `cargo {}` failed", step.join(" "));
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
