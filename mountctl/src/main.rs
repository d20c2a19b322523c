//! `mountctl`: the cowspace command line. A thin client of the `cowspace-store` library;
//! the contract (commands, flags, JSON, exit codes) is in CLI.md and docs/cli.md.
#![forbid(unsafe_code)]

mod cli;
mod commands;
mod docs;
mod fast;
mod output;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

use crate::cli::Cli;
use crate::output::{Ctx, report_error, usage_error};

fn main() -> ExitCode {
    // `create`, `remove`, `list`, `status` while the daemon runs: no clap, no logging.
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if let Some(code) = fast::run(&args) {
        return code;
    }
    let json_requested = std::env::args().any(|a| a == "--json");
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind as K;
            if e.kind() == K::DisplayVersion && json_requested {
                let v = serde_json::json!({"version": env!("CARGO_PKG_VERSION")});
                let _ = output::write_stdout(format!("{v}\n").as_bytes());
                return ExitCode::SUCCESS;
            }
            if matches!(e.kind(), K::DisplayHelp | K::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            return usage_error(&e.to_string(), json_requested);
        }
    };
    // git's fsmonitor hook runs at every git command in a workspace, and git shows its
    // stderr: errors only (a hook that cannot answer says "everything" instead).
    let hook = matches!(cli.command, cli::Command::GitFsmonitor { .. });
    // `exec` logs nothing of its own (the command's output is what counts), and its
    // start is on every agent's command path: no log filter to build unless asked for.
    let exec = matches!(cli.command, cli::Command::Exec(_));
    if !exec || cli.verbose > 0 || std::env::var_os("RUST_LOG").is_some() {
        init_logging(cli.verbose, cli.quiet || hook);
    }
    let config = match cowspace::config::Config::load() {
        Ok(c) => c,
        Err(e) => {
            let ctx = Ctx {
                root: PathBuf::new(),
                json: cli.json,
                quiet: cli.quiet,
                progress: false,
                config: Default::default(),
                root_flag: None,
            };
            return report_error(&ctx, &anyhow::Error::from(e));
        }
    };
    let ctx = Ctx {
        root: config.root(cli.root.clone()).value,
        config,
        root_flag: cli.root.clone(),
        json: cli.json,
        quiet: cli.quiet,
        progress: std::io::stderr().is_terminal() && !cli.quiet,
    };
    match commands::run(&ctx, cli.command) {
        Ok(code) => code,
        Err(e) => report_error(&ctx, &e),
    }
}

fn init_logging(verbose: u8, quiet: bool) {
    let default = match (quiet, verbose) {
        (true, _) => "error",
        (false, 0) => "warn",
        (false, 1) => "info",
        (false, 2) => "debug",
        _ => "trace",
    };
    // An `EnvFilter` costs most of a millisecond to build: only when `RUST_LOG` asks
    // for per-target filtering; a plain level otherwise.
    if std::env::var_os("RUST_LOG").is_some() {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .try_init();
    } else {
        let level: tracing_subscriber::filter::LevelFilter = default
            .parse()
            .unwrap_or(tracing_subscriber::filter::LevelFilter::WARN);
        let _ = tracing_subscriber::fmt()
            .with_max_level(level)
            .with_writer(std::io::stderr)
            .try_init();
    }
}
