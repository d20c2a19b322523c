//! `sandbox-helper`: the privileged helper `mountctl run` calls. Thin: parses the command
//! line, calls the library, prints, and maps errors to exit codes.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use sandbox_helper::{Error, Net, Options, Spec, SpecInput, cgroup, probe};

#[derive(Parser)]
#[command(
    name = "sandbox-helper",
    version,
    about = "Run a command in a cowspace sandbox"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run CMD in a sandbox with WORKSPACE_DIR at /workspace; exits with CMD's status.
    Run(Box<RunArgs>),
    /// Show which controls this host can enforce, and why not.
    Probe {
        /// Print one JSON object on stdout.
        #[arg(long)]
        json: bool,
        /// Cgroup root (default /sys/fs/cgroup).
        #[arg(long, env = cgroup::ROOT_ENV, default_value = cgroup::DEFAULT_ROOT)]
        cgroup_root: PathBuf,
    },
}

#[derive(clap::Args)]
struct RunArgs {
    /// The workspace directory, seen read-write at /workspace.
    #[arg(long, value_name = "WORKSPACE_DIR")]
    dir: PathBuf,
    /// The sandbox's name (its hostname).
    #[arg(long)]
    name: String,
    /// Leases and per-run directories (default $COWSPACE_ROOT/run/sandbox).
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Cgroup root (default /sys/fs/cgroup).
    #[arg(long, env = cgroup::ROOT_ENV, default_value = cgroup::DEFAULT_ROOT)]
    cgroup_root: PathBuf,
    /// Network: none (default) or loopback (default when ports are published).
    #[arg(long, value_parser = ["none", "loopback"])]
    net: Option<String>,
    /// Memory limit in bytes (k, m, g suffixes accepted).
    #[arg(long, value_name = "BYTES")]
    memory: Option<String>,
    /// Most processes and threads at once.
    #[arg(long, value_name = "N")]
    pids: Option<u64>,
    /// CPU bandwidth in CPUs, e.g. 1.5.
    #[arg(long, value_name = "F")]
    cpus: Option<f64>,
    /// Publish the internal PORT on a unique 127.0.0.1 host port.
    #[arg(long, value_name = "PORT")]
    publish: Vec<u16>,
    /// Set KEY=VALUE in the command's environment.
    #[arg(long, value_name = "K=V")]
    env: Vec<String>,
    /// Bind host SRC read-only at DST inside.
    #[arg(long, value_name = "SRC:DST")]
    ro_bind: Vec<String>,
    /// Give the command the host file HOSTFILE as /run/secrets/NAME (read-only tmpfs).
    #[arg(long, value_name = "NAME=HOSTFILE")]
    secret: Vec<String>,
    /// Print the published ports as one JSON line on stdout before CMD runs; errors as JSON.
    #[arg(long)]
    json: bool,
    /// Unmount the host's overlay at --dir while the sandbox is set up (so its upper
    /// layer is under one live overlay during the run); the ready line says whether it
    /// was (`host_mount`: `suspended`, or `busy` when in use). Only for a workspace of
    /// the runtime root that owns --state-dir. The caller mounts it again afterwards.
    #[arg(long)]
    suspend_host_mount: bool,
    /// Keep CAP_NET_RAW (raw and packet sockets) for CMD; dropped by default (ping
    /// works without it, through ICMP datagram sockets).
    #[arg(long)]
    cap_net_raw: bool,
    /// Write the JSON ready line to this inherited file descriptor (a pipe) instead of
    /// stdout, so CMD's stdout stays the caller's alone.
    #[arg(long, value_name = "FD", value_parser = clap::value_parser!(i32).range(3..))]
    ready_fd: Option<i32>,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Probe { json, cgroup_root } => probe_cmd(json, &cgroup_root),
        Command::Run(args) => {
            let json = args.json;
            match run_cmd(*args) {
                Ok(code) => ExitCode::from(code),
                Err(e) => {
                    report_error(&e, json);
                    ExitCode::from(e.kind().exit_code())
                }
            }
        }
    }
}

fn probe_cmd(json: bool, cgroup_root: &std::path::Path) -> ExitCode {
    let checks = probe::probe(cgroup_root);
    if json {
        println!("{}", serde_json::json!({ "controls": checks }));
    } else {
        for c in &checks {
            let mark = if c.available { "yes" } else { "NO " };
            println!("{mark}  {:<58} {}", c.control, c.detail);
        }
    }
    ExitCode::SUCCESS
}

fn run_cmd(args: RunArgs) -> Result<u8, Error> {
    let opts = Options {
        state_dir: args
            .state_dir
            .unwrap_or_else(sandbox_helper::default_state_dir),
        cgroup_root: args.cgroup_root,
    };
    let input = SpecInput {
        name: args.name,
        dir: args.dir,
        net: args.net.as_deref().map(str::parse::<Net>).transpose()?,
        memory: args.memory,
        pids: args.pids,
        cpus: args.cpus,
        publish: args.publish,
        env: args.env,
        ro_bind: args.ro_bind,
        secret: args.secret,
        command: args.command,
        suspend_host_mount: args.suspend_host_mount,
        cap_net_raw: args.cap_net_raw,
    };
    // Opened through /proc (no unsafe here); the sandbox's init closes every inherited
    // descriptor from 3 up, so the pipe never reaches CMD.
    let mut ready_out = match args.ready_fd {
        Some(fd) => Some(
            std::fs::OpenOptions::new()
                .write(true)
                .open(format!("/proc/self/fd/{fd}"))
                .map_err(|e| Error::InvalidInput(format!("--ready-fd {fd}: {e}")))?,
        ),
        None => None,
    };
    let spec = Spec::validate(input, &opts.state_dir)?;
    let json = args.json;
    let outcome = sandbox_helper::run(&spec, &opts, |ready| {
        for p in &ready.published {
            eprintln!("published {} -> 127.0.0.1:{}", p.internal, p.host);
        }
        if json || ready_out.is_some() {
            let ports: serde_json::Map<String, serde_json::Value> = ready
                .published
                .iter()
                .map(|p| (p.internal.to_string(), p.host.into()))
                .collect();
            let line = serde_json::json!({
                "name": spec.name,
                "ports": ports,
                "host_uid_base": ready.host_uid_base,
                "init_pid": ready.init_pid,
                "host_mount": ready.host_mount.as_str(),
            });
            match ready_out.take() {
                Some(mut out) => {
                    use std::io::Write;
                    // The caller may have stopped listening; the run goes on.
                    let _ = writeln!(out, "{line}");
                }
                None => println!("{line}"),
            }
        }
    })?;
    if outcome.oom_kills > 0 {
        eprintln!(
            "sandbox-helper: {}: out of memory: the kernel OOM-killed {} process(es) at the memory limit of {} bytes; exit status {}",
            spec.name,
            outcome.oom_kills,
            spec.limits.memory_bytes.unwrap_or(0),
            outcome.code
        );
    }
    Ok(outcome.code)
}

fn report_error(e: &Error, json: bool) {
    if json {
        println!(
            "{}",
            serde_json::json!({ "error": { "kind": e.kind().as_str(), "message": e.to_string(), "hint": e.hint() } })
        );
    }
    eprintln!("sandbox-helper: {e}");
    if let Some(h) = e.hint() {
        eprintln!("hint: {h}");
    }
}
