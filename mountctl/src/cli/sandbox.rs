//! The grammar of sandboxes: `run`, `exec`, `sandbox ...` and the flags a sandbox is
//! started with.

use clap::{Args, Subcommand};

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The workspace (id or name); it must be active.
    pub workspace: String,
    #[command(flatten)]
    pub sandbox: SandboxFlags,
    /// Run CMD in a qemu micro-VM (the workspace shared at /workspace by virtio-fs)
    /// instead of the namespace sandbox; refused (exit 7) where qemu, virtiofsd or the
    /// guest kernel are missing (see `mountctl doctor`). --memory is guest RAM there.
    #[arg(long)]
    pub vm: bool,
    /// With --vm on a host without hardware KVM: run under qemu's software emulation,
    /// which is no isolation boundary (the run says isolation: needs_validation);
    /// refused without it. Also `[vm] accept_emulation = true` in the configuration.
    /// `--allow-unvalidated-isolation` is another name for it.
    #[arg(long, requires = "vm", visible_alias = "allow-unvalidated-isolation")]
    pub accept_emulation: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// What a sandbox is started with (`sandbox start` and `run`).
#[derive(Debug, Args)]
pub struct SandboxFlags {
    /// Network: none (default), loopback (default when ports are published), or egress
    /// (loopback, and a host-side proxy as the only way out: only the hosts
    /// --allow-host names, default deny).
    #[arg(long, value_parser = ["none", "loopback", "egress"])]
    pub net: Option<String>,
    /// Memory limit in bytes (k, m, g suffixes accepted; at least 4m).
    #[arg(long, value_name = "BYTES")]
    pub memory: Option<String>,
    /// Most processes and threads at once.
    #[arg(long, value_name = "N")]
    pub pids: Option<u64>,
    /// CPU bandwidth in CPUs, e.g. 1.5.
    #[arg(long, value_name = "F")]
    pub cpus: Option<f64>,
    /// The CPUs the sandbox's processes may run on, e.g. 0-1,3 (a cgroup cpuset: a
    /// process inside cannot widen it).
    #[arg(long, value_name = "LIST")]
    pub cpuset_cpus: Option<String>,
    /// Give the internal PORT a unique host port on 127.0.0.1 (repeatable; fixed for a
    /// long-lived sandbox's life).
    #[arg(long, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub publish: Vec<u16>,
    /// Set KEY=VALUE in every command's environment (repeatable; not secret).
    #[arg(long, value_name = "K=V")]
    pub env: Vec<String>,
    /// Bind host SRC read-only at DST inside (repeatable).
    #[arg(long, value_name = "SRC:DST")]
    pub ro_bind: Vec<String>,
    /// Give the commands the host file HOSTFILE as /run/secrets/NAME (repeatable).
    #[arg(long, value_name = "NAME=HOSTFILE")]
    pub secret: Vec<String>,
    /// With --net egress: let the sandbox reach hosts matching PATTERN (repeatable):
    /// `example.com`, `*.example.com` (subdomains, not the apex), an optional `:PORT`,
    /// or `*` for every public host.
    #[arg(long, value_name = "PATTERN")]
    pub allow_host: Vec<String>,
    /// With --net egress: never let it reach hosts matching PATTERN (repeatable; deny
    /// wins over allow).
    #[arg(long, value_name = "PATTERN")]
    pub deny_host: Vec<String>,
    /// With --net egress: NAME resolves to ADDR for this sandbox (repeatable); naming it
    /// is what allows a private ADDR for that name.
    #[arg(long, value_name = "NAME:ADDR")]
    pub add_host: Vec<String>,
    /// With --net egress: the proxy sets HEADER to the contents of the host file FILE on
    /// requests to HOST (repeatable; HOST must be allowed). HTTPS to HOST is decrypted by
    /// the proxy with a CA made for this sandbox and trusted inside; the value never
    /// enters the sandbox.
    #[arg(long, value_name = "HOST=HEADER:@FILE")]
    pub inject: Vec<String>,
    /// With --inject: the only methods the proxy sends to HOST (repeatable), e.g.
    /// `api.example.com=GET,HEAD`; others are refused with 403.
    #[arg(long, value_name = "HOST=METHOD,...")]
    pub inject_methods: Vec<String>,
    /// With --inject: a PEM file of more certificate authorities the proxy trusts for
    /// upstream hosts (internal hosts, tests), beside the host's own.
    #[arg(long, value_name = "FILE")]
    pub upstream_ca: Option<String>,
    /// With `sandbox start`: pause the sandbox after no exec ran and no traffic went
    /// through its published ports for DURATION (`30s`, `5m`, `1h`); the next exec or
    /// connection resumes it (namespace sandboxes).
    #[arg(long, value_name = "DURATION")]
    pub idle_timeout: Option<String>,
    /// The sandbox's root filesystem is the tree of image NAME (a ref or snapshot id
    /// from `mountctl image import` or `image pull`), with a private writable layer;
    /// the workspace at /workspace as always.
    #[arg(long, value_name = "NAME")]
    pub image: Option<String>,
    /// The most the sandbox reads and writes per second on the host's disks (where its
    /// workspace's layers are): SIZE for both directions (`20m`), or any of
    /// `rbps=SIZE,wbps=SIZE,riops=N,wiops=N` (cgroup blkio/io throttle). Refused (7)
    /// where it cannot be enforced.
    #[arg(long, value_name = "LIMITS")]
    pub io_max: Option<String>,
    /// The sandbox's share of disk time against others, 1 to 10000 (cgroup io.weight or
    /// blkio weight): refused (7) on a host whose disks have no proportional I/O
    /// scheduler (bfq).
    #[arg(long, value_name = "W")]
    pub io_weight: Option<u64>,
    /// The working directory of the sandbox's commands (the command of `run`, every
    /// `exec` without its own --workdir): absolute inside, or relative to /workspace
    /// (the default).
    #[arg(long, value_name = "DIR", conflicts_with = "image_workdir")]
    pub workdir: Option<String>,
    /// With --image (or the configuration's default image): commands start in the
    /// image config's WorkingDir instead of /workspace (made in the sandbox's private
    /// layer when the image lacks it).
    #[arg(long)]
    pub image_workdir: bool,
}

impl From<SandboxFlags> for cowspace::sandbox::SandboxOptions {
    fn from(f: SandboxFlags) -> Self {
        Self {
            net: f.net.as_deref().map(|n| match n {
                "loopback" => sandbox_api::spec::Net::Loopback,
                "egress" => sandbox_api::spec::Net::Egress,
                _ => sandbox_api::spec::Net::None,
            }),
            memory: f.memory,
            pids: f.pids,
            cpus: f.cpus,
            cpuset_cpus: f.cpuset_cpus,
            publish: f.publish,
            env: f.env,
            ro_bind: f.ro_bind,
            secret: f.secret,
            allow_host: f.allow_host,
            deny_host: f.deny_host,
            add_host: f.add_host,
            inject: f.inject,
            inject_methods: f.inject_methods,
            upstream_ca: f.upstream_ca,
            idle_timeout: f.idle_timeout,
            image: f.image,
            io_max: f.io_max,
            io_weight: f.io_weight,
            workdir: f.workdir,
            image_workdir: f.image_workdir,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum SandboxCommand {
    /// Start a sandbox for the workspace; returns once it is ready. It runs until
    /// `sandbox stop` (or `remove`); its processes outlive the commands that start them.
    Start(Box<StartArgs>),
    /// Stop the workspace's sandbox: every process in it is killed, its cgroups, ports
    /// and uid range are freed. With none running: nothing to do, exit 0. Host processes
    /// that entered the workspace while it ran are named: they keep the sandbox's mount
    /// (no later change seen there) until they leave the path and come back.
    Stop {
        /// The workspace (id or name).
        workspace: String,
    },
    /// The workspace's sandbox: state, provider, isolation, limits, ports, processes,
    /// memory used, OOM kills.
    Status {
        /// The workspace (id or name).
        workspace: String,
    },
    /// Every running sandbox.
    List,
    /// Change a running sandbox's egress policy (--net egress): new connections follow
    /// it at once; established ones are not cut.
    Policy(PolicyArgs),
    /// The egress decisions of a running sandbox: time, host, port, verdict and the
    /// rule that decided.
    Log {
        /// The workspace (id or name).
        workspace: String,
        /// Keep printing decisions as they are made, until the sandbox stops.
        #[arg(long)]
        follow: bool,
        /// Only the last N decisions.
        #[arg(long, value_name = "N")]
        tail: Option<usize>,
    },
    /// Publish the internal PORT of a running sandbox on a unique 127.0.0.1 host port.
    Publish {
        /// The workspace (id or name).
        workspace: String,
        /// The port inside.
        #[arg(value_parser = clap::value_parser!(u16).range(1..))]
        port: u16,
    },
    /// Stop publishing the internal PORT of a running sandbox.
    Unpublish {
        /// The workspace (id or name).
        workspace: String,
        /// The port inside.
        #[arg(value_parser = clap::value_parser!(u16).range(1..))]
        port: u16,
    },
    /// Pause the workspace's sandbox: every process stopped where it is, its memory
    /// kept (cgroup freezer; a VM's qemu `stop`). `exec` is refused (exit 5) until
    /// `sandbox resume`; published ports keep their connections and answer after it.
    /// Paused already: exit 9.
    Pause {
        /// The workspace (id or name).
        workspace: String,
    },
    /// Resume the workspace's paused sandbox. Not paused: exit 9.
    Resume {
        /// The workspace (id or name).
        workspace: String,
    },
    /// Suspend the workspace's sandbox to disk with its processes: refused on this host
    /// (exit 7) with the reason (CRIU for namespace sandboxes; qemu's virtio-fs
    /// migration for VMs).
    Suspend {
        /// The workspace (id or name).
        workspace: String,
    },
}

#[derive(Debug, Args)]
pub struct PolicyArgs {
    /// The workspace (id or name) whose sandbox runs with --net egress.
    pub workspace: String,
    /// Allow hosts matching PATTERN (repeatable).
    #[arg(long, value_name = "PATTERN")]
    pub allow_host: Vec<String>,
    /// Deny hosts matching PATTERN (repeatable; deny wins).
    #[arg(long, value_name = "PATTERN")]
    pub deny_host: Vec<String>,
    /// Take PATTERN out of both lists (repeatable).
    #[arg(long, value_name = "PATTERN")]
    pub remove_host: Vec<String>,
    /// Empty both lists first (the --add-host names stay): nothing is allowed until
    /// --allow-host says so.
    #[arg(long)]
    pub reset: bool,
    /// Add a credential rule: the proxy sets HEADER to FILE's contents on requests to
    /// HOST (repeatable; the sandbox must have been started with an --inject).
    #[arg(long, value_name = "HOST=HEADER:@FILE")]
    pub inject: Vec<String>,
    /// Take out the credential rules of HOST (all, or the one for HEADER).
    #[arg(long, value_name = "HOST[=HEADER]")]
    pub remove_inject: Vec<String>,
}

#[derive(Debug, Args)]
pub struct StartArgs {
    /// The workspace (id or name); it must be active.
    pub workspace: String,
    #[command(flatten)]
    pub sandbox: SandboxFlags,
    /// Start the sandbox in a qemu micro-VM (the workspace shared at /workspace by
    /// virtio-fs; `exec`, `status` and `stop` work the same); refused (exit 7) where
    /// qemu, virtiofsd or the guest kernel are missing (see `mountctl doctor`). --memory
    /// is guest RAM there.
    #[arg(long)]
    pub vm: bool,
    /// With --vm on a host without hardware KVM: run under qemu's software emulation,
    /// which is no isolation boundary (the status says isolation: needs_validation);
    /// refused without it. Also `[vm] accept_emulation = true` in the configuration.
    /// `--allow-unvalidated-isolation` is another name for it.
    #[arg(long, requires = "vm", visible_alias = "allow-unvalidated-isolation")]
    pub accept_emulation: bool,
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// The workspace (id or name) whose sandbox runs the command.
    pub workspace: String,
    /// Pass this process's stdin to the command (without it, the command reads
    /// /dev/null).
    #[arg(short, long)]
    pub interactive: bool,
    /// Give the command a pseudo-terminal (window size and Ctrl-C reach it).
    #[arg(short, long)]
    pub tty: bool,
    /// Set KEY=VALUE in the command's environment (repeatable).
    #[arg(long, value_name = "K=V")]
    pub env: Vec<String>,
    /// The working directory inside (default /workspace; relative to it when relative).
    #[arg(long, value_name = "DIR")]
    pub workdir: Option<String>,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}
