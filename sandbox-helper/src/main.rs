//! `sandbox-helper`: the privileged helper `mountctl run` calls. Thin: parses the command
//! line, calls the library, prints, and maps errors to exit codes.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod vm_cmd;
use sandbox_helper::{Error, Net, Options, Spec, SpecInput, cgroup, probe};
use vm_cmd::{VmRunArgs, cache_dir_or_default, vm_run_cmd, vm_start_cmd};

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
    /// Run CMD in a qemu micro-VM with WORKSPACE_DIR shared at /workspace (virtio-fs);
    /// exits with CMD's status.
    VmRun(Box<VmRunArgs>),
    /// Start a long-lived sandbox in a qemu micro-VM with WORKSPACE_DIR shared at
    /// /workspace (this process stays as its keeper, detached from the caller once the
    /// guest is up); `exec`, `status` and `stop` work as for `start`.
    VmStart(Box<VmRunArgs>),
    /// Print what a VM placement would use on this host as one JSON object.
    VmProbe {
        /// Where initramfs images are cached (default $COWSPACE_ROOT/cache/vm).
        #[arg(long)]
        cache_dir: Option<PathBuf>,
    },
    /// Start a long-lived sandbox with WORKSPACE_DIR at /workspace and keep it (this
    /// process stays as its keeper, detached from the caller once it is ready).
    Start(Box<RunArgs>),
    /// Run CMD in the running sandbox NAME; exits with CMD's status.
    Exec {
        /// The sandbox's name.
        #[arg(long)]
        name: String,
        /// Leases and per-run directories (default $COWSPACE_ROOT/run/sandbox).
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// Working directory inside (default /workspace).
        #[arg(long)]
        workdir: Option<String>,
        /// Set KEY=VALUE in the command's environment.
        #[arg(long, value_name = "K=V")]
        env: Vec<String>,
        /// The command and its arguments.
        #[arg(last = true, required = true, value_name = "CMD")]
        command: Vec<String>,
    },
    /// Stop the running sandbox NAME (every process killed, its resources freed).
    Stop {
        /// The sandbox's name.
        #[arg(long)]
        name: String,
        /// Leases and per-run directories (default $COWSPACE_ROOT/run/sandbox).
        #[arg(long)]
        state_dir: Option<PathBuf>,
    },
    /// Free what sandboxes whose helper was killed left behind (cgroups, per-run
    /// directories, and with --dir the workspace's overlay work directories).
    Reap {
        /// Leases and per-run directories (default $COWSPACE_ROOT/run/sandbox).
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// Cgroup root (default /sys/fs/cgroup).
        #[arg(long, default_value = "/sys/fs/cgroup")]
        cgroup_root: PathBuf,
        /// A workspace directory whose stale overlay work directories to remove.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Print the status of the running sandbox NAME as one JSON object.
    Status {
        /// The sandbox's name.
        #[arg(long)]
        name: String,
        /// Leases and per-run directories (default $COWSPACE_ROOT/run/sandbox).
        #[arg(long)]
        state_dir: Option<PathBuf>,
    },
    /// The egress proxy of a `--net egress` sandbox (started by its keeper, never by
    /// hand: it is given sockets made inside the sandbox's network namespace).
    #[command(hide = true)]
    EgressProxy {
        /// The sandbox's name (for the process list).
        #[arg(long)]
        name: String,
        #[arg(long)]
        http_fd: i32,
        #[arg(long)]
        socks_fd: i32,
        #[arg(long)]
        dns_fd: i32,
        #[arg(long)]
        control_fd: i32,
        #[arg(long)]
        log_fd: i32,
    },
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
    /// Network: none (default), loopback (default when ports are published), or egress
    /// (loopback, and a host-side proxy as the only way out, by --allow-host).
    #[arg(long, value_parser = ["none", "loopback", "egress"])]
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
    /// The CPUs the sandbox's processes may run on, e.g. 0-1,3 (cgroup cpuset).
    #[arg(long, value_name = "LIST")]
    cpuset_cpus: Option<String>,
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
    /// With --net egress: let the sandbox reach hosts matching PATTERN (`example.com`,
    /// `*.example.com`, optional `:PORT`, `*` for every public host).
    #[arg(long, value_name = "PATTERN")]
    allow_host: Vec<String>,
    /// With --net egress: never let it reach hosts matching PATTERN (deny wins).
    #[arg(long, value_name = "PATTERN")]
    deny_host: Vec<String>,
    /// With --net egress: NAME resolves to ADDR for this sandbox (which allows a
    /// private ADDR for that name).
    #[arg(long, value_name = "NAME:ADDR")]
    add_host: Vec<String>,
    /// With --net egress: the proxy sets HEADER to the contents of the host file FILE on
    /// requests to HOST (TLS terminated for HOST only); the value never enters the sandbox.
    #[arg(long, value_name = "HOST=HEADER:@FILE")]
    inject: Vec<String>,
    /// With --inject: the only methods sent to HOST (e.g. HOST=GET,HEAD).
    #[arg(long, value_name = "HOST=METHOD,...")]
    inject_methods: Vec<String>,
    /// With --inject: more roots (PEM) the proxy verifies upstream hosts with.
    #[arg(long, value_name = "FILE")]
    upstream_ca: Option<String>,
    /// Print the published ports as one JSON line on stdout before CMD runs; errors as JSON.
    #[arg(long)]
    json: bool,
    /// Unmount the host's overlay at --dir while the sandbox is set up (so its upper
    /// layer is under one live overlay during the run); the ready line says whether it
    /// was (`host_mount`: `suspended`, or `busy` when in use). Only for a workspace of
    /// the runtime root that owns --state-dir. The caller mounts it again afterwards.
    #[arg(long)]
    suspend_host_mount: bool,
    /// --dir is the host's overlay of a cowspace workspace: replace it, for the run, by
    /// one overlay of its layers idmapped to the sandbox, which the host and the sandbox
    /// share (the host path shows the same files during the run; its owners are shifted
    /// by the sandbox's uid base meanwhile). Unmounted when the run ends; the caller
    /// mounts the host's own again. Only for a workspace of the runtime root that owns
    /// --state-dir.
    #[arg(long)]
    share_host_mount: bool,
    /// With `start`: pause the sandbox after no exec ran and no traffic went through its
    /// published ports for DURATION (`30s`, `5m`); the next exec or connection resumes
    /// it.
    #[arg(long, value_name = "DURATION")]
    idle_timeout: Option<String>,
    /// The most bytes (or I/Os) per second the sandbox reads and writes on the host's
    /// disks: SIZE, or rbps=SIZE,wbps=SIZE,riops=N,wiops=N (cgroup blkio throttle).
    #[arg(long, value_name = "LIMITS")]
    io_max: Option<String>,
    /// The sandbox's share of disk time (1 to 10000), where the host has a proportional
    /// I/O scheduler.
    #[arg(long, value_name = "W")]
    io_weight: Option<u64>,
    /// Keep CAP_NET_RAW (raw and packet sockets) for CMD; dropped by default (ping
    /// works without it, through ICMP datagram sockets).
    #[arg(long)]
    cap_net_raw: bool,
    /// Write the JSON ready line to this inherited file descriptor (a pipe) instead of
    /// stdout, so CMD's stdout stays the caller's alone.
    #[arg(long, value_name = "FD", value_parser = clap::value_parser!(i32).range(3..))]
    ready_fd: Option<i32>,
    /// Read the controls (--net, --memory, ..., as one JSON object: the runtime's
    /// `Controls`, unknown keys refused) from this inherited descriptor (a pipe) instead
    /// of their flags, which must then be absent.
    #[arg(long, value_name = "FD", value_parser = clap::value_parser!(i32).range(3..))]
    controls_fd: Option<i32>,
    /// The sandbox's root is an overlay of this image's metadata mount (an EROFS mount
    /// of the runtime's native lower) over --image-data, with a private writable layer.
    #[arg(long, value_name = "DIR", requires = "image_data")]
    image_meta: Option<PathBuf>,
    /// The blob cache the --image-meta files redirect into (a data-only layer).
    #[arg(long, value_name = "DIR", requires = "image_meta")]
    image_data: Option<PathBuf>,
    /// With --image-meta: commands run as UID:GID of the sandbox's user namespace (the
    /// image config's `User`, resolved by the runtime).
    #[arg(long, value_name = "UID:GID", requires = "image_meta")]
    image_user: Option<String>,
    /// The working directory of CMD and of every exec without its own (absolute inside,
    /// or relative to /workspace; default /workspace).
    #[arg(long, value_name = "DIR")]
    workdir: Option<String>,
    /// The command and its arguments (none for `start`).
    #[arg(last = true, value_name = "CMD")]
    command: Vec<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::VmProbe { cache_dir } => {
            println!(
                "{}",
                sandbox_helper::vm::report(&cache_dir_or_default(cache_dir))
            );
            ExitCode::SUCCESS
        }
        Command::VmRun(args) => {
            let json = args.run.json;
            finish(vm_run_cmd(*args), json)
        }
        Command::VmStart(args) => {
            let json = args.run.json;
            let fd = args.run.ready_fd;
            finish(with_ready_fd(fd, |out| vm_start_cmd(*args, out)), json)
        }
        Command::Probe { json, cgroup_root } => probe_cmd(json, &cgroup_root),
        Command::EgressProxy {
            name: _,
            http_fd,
            socks_fd,
            dns_fd,
            control_fd,
            log_fd,
        } => finish(
            sandbox_helper::egress::serve_process(sandbox_helper::egress::ProxyFds {
                http: http_fd,
                socks: socks_fd,
                dns: dns_fd,
                control: control_fd,
                log: log_fd,
            })
            .map(|()| 0),
            false,
        ),
        Command::Exec {
            name,
            state_dir,
            workdir,
            env,
            command,
        } => finish(
            exec_cmd(
                &state_dir_or_default(state_dir),
                &name,
                workdir,
                env,
                command,
            ),
            false,
        ),
        Command::Stop { name, state_dir } => {
            finish(keeper_call(state_dir, &name, |c| Ok(c.stop()?)), false)
        }
        Command::Reap {
            state_dir,
            cgroup_root,
            dir,
        } => finish(
            sandbox_helper::run::reap_stale(
                &state_dir_or_default(state_dir),
                &cgroup_root,
                dir.as_deref(),
            )
            .map(|()| 0),
            false,
        ),
        Command::Status { name, state_dir } => {
            finish(keeper_call(state_dir, &name, |c| Ok(c.status()?)), false)
        }
        Command::Start(args) => {
            let json = args.json;
            let fd = args.ready_fd;
            finish(with_ready_fd(fd, |out| start_cmd(*args, out)), json)
        }
        Command::Run(args) => {
            let json = args.json;
            match run_cmd(*args) {
                Ok(code) => ExitCode::from(code),
                Err(e) => {
                    report_error(&e, json);
                    // As a shell and `exec` say it: 127 no such command, 126 not runnable.
                    match &e {
                        Error::Exec { source, .. }
                            if source.kind() == std::io::ErrorKind::NotFound =>
                        {
                            ExitCode::from(127)
                        }
                        Error::Exec { source, .. }
                            if source.kind() == std::io::ErrorKind::PermissionDenied =>
                        {
                            ExitCode::from(126)
                        }
                        _ => ExitCode::from(e.kind().exit_code()),
                    }
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

fn finish(r: Result<u8, Error>, json: bool) -> ExitCode {
    match r {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            report_error(&e, json);
            ExitCode::from(e.kind().exit_code())
        }
    }
}

/// Asks the keeper of sandbox `name` one thing and prints its JSON answer.
fn keeper_call(
    state_dir: Option<PathBuf>,
    name: &str,
    ask: impl FnOnce(sandbox_helper::keeper::Client) -> Result<serde_json::Value, Error>,
) -> Result<u8, Error> {
    let client = sandbox_helper::keeper::Client::connect(&state_dir_or_default(state_dir), name)?;
    println!("{}", ask(client)?);
    Ok(0)
}

fn state_dir_or_default(d: Option<PathBuf>) -> PathBuf {
    d.unwrap_or_else(sandbox_helper::default_state_dir)
}

/// Runs CMD in a running sandbox with this process's stdin, stdout and stderr.
fn exec_cmd(
    state: &std::path::Path,
    name: &str,
    workdir: Option<String>,
    env: Vec<String>,
    command: Vec<String>,
) -> Result<u8, Error> {
    use std::os::fd::AsFd;
    let mut pairs = Vec::new();
    for e in env {
        let (k, v) = e
            .split_once('=')
            .ok_or_else(|| Error::InvalidInput(format!("--env {e:?}: expected KEY=VALUE")))?;
        pairs.push((k.to_string(), v.to_string()));
    }
    let client = sandbox_helper::keeper::Client::connect(state, name)?;
    let req = sandbox_helper::serve::ExecRequest {
        argv: command,
        env: pairs,
        workdir,
        tty: None,
    };
    let (i, o, e) = (std::io::stdin(), std::io::stdout(), std::io::stderr());
    match client.exec(&req, Some([i.as_fd(), o.as_fd(), e.as_fd()]))? {
        sandbox_helper::keeper::Started::Running { .. } => Ok(client.wait()?),
        sandbox_helper::keeper::Started::Refused { message, exit, .. } => {
            eprintln!("sandbox-helper: {message}");
            Ok(exit)
        }
    }
}

/// Starts a long-lived sandbox; prints (or writes to --ready-fd) its status once ready,
/// then detaches from the caller's stdio and keeps it until it stops.
fn start_cmd(args: RunArgs, ready_out: &mut Option<std::fs::File>) -> Result<u8, Error> {
    let state_dir = args
        .state_dir
        .clone()
        .unwrap_or_else(sandbox_helper::default_state_dir);
    let opts = Options {
        state_dir: state_dir.clone(),
        cgroup_root: args.cgroup_root.clone(),
    };
    let name = args.name.clone();
    let input = spec_input(args, true)?;
    let spec = Spec::validate(input, &opts.state_dir)?;
    let log = sandbox_helper::keeper::paths(&state_dir, &name)
        .1
        .with_extension("log");
    let outcome = sandbox_helper::start(&spec, &opts, |ready, status| {
        for p in &ready.published {
            eprintln!("published {} -> 127.0.0.1:{}", p.internal, p.host);
        }
        announce(ready_out, &status);
        // From here on the keeper talks to nobody on the caller's stdio: a caller that
        // reads our output to its end must not wait for the sandbox to stop.
        detach_stdio(&log);
    })?;
    if outcome.oom_kills > 0 {
        eprintln!(
            "sandbox-helper: {}: the kernel OOM-killed {} process(es) at the memory limit",
            spec.name, outcome.oom_kills
        );
    }
    if outcome.refused_forks > 0 {
        eprintln!(
            "sandbox-helper: {}: process limit reached: the kernel refused {} fork(s) at the \
             limit of {} processes and threads",
            spec.name,
            outcome.refused_forks,
            spec.limits.pids.unwrap_or(0)
        );
    }
    Ok(0)
}

/// Points stdin at /dev/null and stdout and stderr at the keeper's log file.
fn detach_stdio(log: &std::path::Path) {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    if let Ok(null) = std::fs::File::open("/dev/null") {
        let _ = nix::unistd::dup2_stdin(&null);
    }
    if let Ok(f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
    {
        let _ = nix::unistd::dup2_stdout(&f);
        let _ = nix::unistd::dup2_stderr(&f);
    }
}

/// The helper's input from `run`'s or `start`'s flags (`keep`: a long-lived sandbox).
fn spec_input(mut args: RunArgs, keep: bool) -> Result<SpecInput, Error> {
    let controls = controls_of(&mut args)?;
    Ok(SpecInput {
        name: args.name,
        dir: args.dir,
        controls,
        command: args.command,
        suspend_host_mount: args.suspend_host_mount,
        keep,
        share_host_mount: args.share_host_mount && !keep,
        cap_net_raw: args.cap_net_raw,
        image: args.image_meta.zip(args.image_data),
        image_user: args.image_user,
    })
}

/// Largest controls message read from `--controls-fd`.
const MAX_CONTROLS_BYTES: u64 = 4 << 20;

/// The controls: from `--controls-fd` (a JSON `Controls`, as the runtime sends them),
/// else from their flags. Both at once is refused.
fn controls_of(args: &mut RunArgs) -> Result<sandbox_helper::spec::Controls, Error> {
    let from_flags = sandbox_helper::spec::Controls {
        net: args.net.as_deref().map(str::parse::<Net>).transpose()?,
        memory: args.memory.take(),
        pids: args.pids,
        cpus: args.cpus,
        cpuset_cpus: args.cpuset_cpus.take(),
        publish: std::mem::take(&mut args.publish),
        env: std::mem::take(&mut args.env),
        ro_bind: std::mem::take(&mut args.ro_bind),
        secret: std::mem::take(&mut args.secret),
        allow_host: std::mem::take(&mut args.allow_host),
        deny_host: std::mem::take(&mut args.deny_host),
        add_host: std::mem::take(&mut args.add_host),
        inject: std::mem::take(&mut args.inject),
        inject_methods: std::mem::take(&mut args.inject_methods),
        upstream_ca: args.upstream_ca.take(),
        idle_timeout: args.idle_timeout.take(),
        image: None,
        io_max: args.io_max.take(),
        io_weight: args.io_weight,
        workdir: args.workdir.take(),
        image_workdir: false,
    };
    let Some(fd) = args.controls_fd else {
        return Ok(from_flags);
    };
    if from_flags != sandbox_helper::spec::Controls::default() {
        return Err(Error::InvalidInput(
            "--controls-fd and control flags (--net, --memory, ...) exclude each other: give \
             the controls one way"
                .into(),
        ));
    }
    use std::io::Read;
    let mut text = Vec::new();
    std::fs::File::open(format!("/proc/self/fd/{fd}"))
        .and_then(|f| f.take(MAX_CONTROLS_BYTES + 1).read_to_end(&mut text))
        .map_err(|e| Error::InvalidInput(format!("--controls-fd {fd}: {e}")))?;
    if text.len() as u64 > MAX_CONTROLS_BYTES {
        return Err(Error::InvalidInput(format!(
            "--controls-fd {fd}: more than {MAX_CONTROLS_BYTES} bytes"
        )));
    }
    serde_json::from_slice(&text)
        .map_err(|e| Error::InvalidInput(format!("--controls-fd {fd}: {e}")))
}

/// Runs a `start` with its `--ready-fd` open: a refusal before the ready line goes there
/// too, as `{"error": {"kind", "message", "hint"}, "exit": N}` (the runtime reads it
/// typed; stderr keeps the human message).
fn with_ready_fd(
    fd: Option<i32>,
    f: impl FnOnce(&mut Option<std::fs::File>) -> Result<u8, Error>,
) -> Result<u8, Error> {
    let mut out = open_ready_fd(fd)?;
    let r = f(&mut out);
    if let (Err(e), Some(_)) = (&r, &out) {
        let k = e.kind();
        announce(
            &mut out,
            &serde_json::json!({"error": {"kind": k.as_str(), "message": e.to_string(), "hint": e.hint()}, "exit": k.exit_code()}),
        );
    }
    r
}

/// The `--ready-fd` descriptor, opened for writing through /proc (no unsafe here).
/// Writes the ready line once: to the `--ready-fd` descriptor (which then closes), else
/// to stdout. A caller that stopped listening does not stop the sandbox.
fn announce(ready_out: &mut Option<std::fs::File>, line: &dyn std::fmt::Display) {
    match ready_out.take() {
        Some(mut out) => {
            use std::io::Write;
            let _ = writeln!(out, "{line}");
        }
        None => println!("{line}"),
    }
}

fn open_ready_fd(fd: Option<i32>) -> Result<Option<std::fs::File>, Error> {
    fd.map(|fd| {
        std::fs::OpenOptions::new()
            .write(true)
            .open(format!("/proc/self/fd/{fd}"))
            .map_err(|e| Error::InvalidInput(format!("--ready-fd {fd}: {e}")))
    })
    .transpose()
}

fn run_cmd(args: RunArgs) -> Result<u8, Error> {
    let opts = Options {
        state_dir: args
            .state_dir
            .clone()
            .unwrap_or_else(sandbox_helper::default_state_dir),
        cgroup_root: args.cgroup_root.clone(),
    };
    let ready_fd = args.ready_fd;
    let json = args.json;
    let input = spec_input(args, false)?;
    // Opened through /proc (no unsafe here); the sandbox's init closes every inherited
    // descriptor from 3 up, so the pipe never reaches CMD.
    let mut ready_out = open_ready_fd(ready_fd)?;
    let spec = Spec::validate(input, &opts.state_dir)?;
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
            announce(&mut ready_out, &line);
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
    if outcome.refused_forks > 0 {
        eprintln!(
            "sandbox-helper: {}: process limit reached: the kernel refused {} fork(s) at the \
             limit of {} processes and threads (--pids; `sh: Cannot fork` and EAGAIN come from \
             it); exit status {}",
            spec.name,
            outcome.refused_forks,
            spec.limits.pids.unwrap_or(0),
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
