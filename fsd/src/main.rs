//! `fsd`: the cowspace daemon of one runtime root. Serves the read-only snapshot view at
//! `<root>/run/view` (with xattrs) and `<root>/run/view-plain` (snapshots without any
//! xattrs, on a connection that never asks the daemon for them) and the control socket
//! at `<root>/run/fsd.sock` until told to stop (`mountctl daemon stop`, a `shutdown`
//! request, SIGTERM or SIGINT).
#![forbid(unsafe_code)]

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};
use clap::Parser;
use cowspace::daemon::socket_path;
use cowspace::materializer::Materializers;
use cowspace::runtime::Runtime;
use cowspace::{mounts, registry::Status};
use cowspace_fsd::control::{Server, root_owner};
use cowspace_fsd::cow::OpenMode;
use cowspace_fsd::view::{ReadMode, ViewMount, ViewOptions};
use cowspace_store::{Store, StoreConfig};

#[derive(Debug, Parser)]
#[command(
    name = "fsd",
    version,
    about = "The cowspace daemon: snapshot view and control socket"
)]
struct Args {
    /// The runtime root (default: $COWSPACE_ROOT, else the configuration's `root`, else
    /// /var/lib/cowspace for root, else $XDG_DATA_HOME/cowspace).
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,
    /// How the view answers opens and reads: `cached` (no open requests; the kernel
    /// keeps every file's pages, shared by all workspaces), `passthrough` (each open
    /// answered with the blob-cache file; reads never reach the daemon) or `served`.
    #[arg(long, default_value = "cached", value_parser = parse_read_mode)]
    read_mode: ReadMode,
    /// Never use FUSE passthrough (`--read-mode passthrough` then serves reads itself).
    #[arg(long)]
    no_passthrough: bool,
    /// How fuse workspaces answer opens: `cached` (no open requests; the kernel keeps
    /// each file's pages, reads and writes reach the daemon by inode) or `passthrough`
    /// (each open a request, answered with a passthrough backing file).
    #[arg(long, env = "COWSPACE_FUSE_OPEN_MODE", default_value = "cached", value_parser = parse_open_mode)]
    fuse_open_mode: OpenMode,
    /// Where fuse workspaces' request threads run: `follow` (on the CPUs of the
    /// processes that use the workspace, when those are confined to fewer CPUs than the
    /// daemon may use) or `any` (wherever the scheduler puts them).
    #[arg(long, env = "COWSPACE_FUSE_CPUS", default_value = "follow", value_parser = parse_fuse_cpus)]
    fuse_cpus: bool,
    /// FUSE request threads (0 = one per core).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Finish the copy-ups in progress recorded in a fuse workspace's upper directory
    /// (what diff and commit need when no daemon serves the workspace), then exit.
    FinishCopies {
        /// The workspace's upper directory (`<root>/workspaces/<id>/upper`).
        upper: PathBuf,
    },
}

/// Allocations from this size up get their own mapping (see `cowspace::fix_mmap_threshold`).
const MMAP_THRESHOLD_BYTES: usize = 1 << 20;

fn main() -> ExitCode {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
    if let Err(e) = cowspace::fix_mmap_threshold(MMAP_THRESHOLD_BYTES) {
        tracing::warn!("{e}: FUSE request buffers may stay resident");
    }
    let result = match args.command {
        Some(Command::FinishCopies { ref upper }) => finish_copies(&args, upper),
        None => run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("fsd: {e:#}");
            if e.downcast_ref::<AnotherDaemon>().is_some() {
                ExitCode::from(cowspace::daemon::EXIT_ANOTHER_DAEMON)
            } else {
                ExitCode::from(1)
            }
        }
    }
}

fn parse_fuse_cpus(s: &str) -> std::result::Result<bool, String> {
    match s {
        "follow" => Ok(true),
        "any" => Ok(false),
        _ => Err(format!("{s:?}: choose follow or any")),
    }
}

fn parse_open_mode(s: &str) -> std::result::Result<OpenMode, String> {
    OpenMode::parse(s).ok_or_else(|| format!("{s:?}: choose cached or passthrough"))
}

fn parse_read_mode(s: &str) -> std::result::Result<ReadMode, String> {
    ReadMode::parse(s).ok_or_else(|| format!("{s:?}: choose cached, passthrough or served"))
}

/// Another daemon holds the root's lock (it may still be starting).
#[derive(Debug, thiserror::Error)]
#[error("another fsd serves {} already", .0.display())]
struct AnotherDaemon(PathBuf);

fn finish_copies(args: &Args, upper: &std::path::Path) -> Result<()> {
    let root = args
        .root
        .clone()
        .unwrap_or_else(cowspace_store::layout::default_root);
    let store = Store::open(&root, StoreConfig::default())?;
    cowspace::remote::attach(&store);
    let n = cowspace_fsd::cow::lazy::finish_records(upper, &store)
        .with_context(|| format!("finish copy-ups in {}", upper.display()))?;
    tracing::debug!(files = n, upper = %upper.display(), "copy-ups finished");
    Ok(())
}

fn run(args: Args) -> Result<()> {
    // What socket requests leave out comes from the configuration, read once, first.
    let config = cowspace::config::Config::load()?;
    let root = config.root(args.root.clone()).value;
    let store = Arc::new(Store::open(&root, StoreConfig::default())?);
    // File contents of snapshots read from a remote are fetched at their first read.
    cowspace::remote::attach(&store);
    // The server of fuse workspaces, registered with the runtime: its materializer then
    // serves them here instead of asking a daemon.
    let host = cowspace_fsd::cow::new_host(
        Arc::clone(&store),
        cowspace_fsd::cow::Serving {
            mode: args.fuse_open_mode,
            passthrough: !args.no_passthrough,
            follow_cpus: args.fuse_cpus,
        },
    );
    let runtime = Arc::new(Runtime::open_with(
        &root,
        Materializers::standard().with_fuse_host(Arc::clone(&host) as _),
    )?);
    let run_dir = cowspace_store::layout::Layout::new(&root).run();
    std::fs::create_dir_all(&run_dir).with_context(|| format!("create {}", run_dir.display()))?;

    // One daemon per root: an exclusive lock held for the daemon's life.
    let lock_path = cowspace_store::layout::Layout::new(&root).daemon_lock();
    let Some(_lock) = cowspace::lockfile::try_lock(&lock_path, true)? else {
        return Err(AnotherDaemon(root).into());
    };

    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop)).context("install signal handler")?;
    }

    // The views. A stale mount (an earlier daemon that died) is detached first.
    let layout = cowspace_store::layout::Layout::new(&root);
    let (view_dir, plain_dir) = (layout.view(), layout.plain_view());
    for dir in [&view_dir, &plain_dir] {
        if mounts::is_mounted(dir)? {
            tracing::warn!(path = %dir.display(), "detaching a stale snapshot view");
            mounts::unmount_lazy(dir)?;
        }
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    // Workspaces that lost their lower when an earlier daemon died are marked `stopped`
    // (recoverable). Before the new view exists: a create arriving meanwhile cannot mount
    // on it yet, so it is not mistaken for one of the earlier daemon's.
    match runtime.daemon_started() {
        Ok(ids) if !ids.is_empty() => {
            tracing::warn!(?ids, "workspaces of an earlier daemon stopped")
        }
        Ok(_) => {}
        Err(e) => tracing::warn!("stopping workspaces of an earlier daemon failed: {e}"),
    }
    let opts = ViewOptions {
        threads: args.threads,
        read_mode: match args.read_mode {
            ReadMode::Passthrough if args.no_passthrough => ReadMode::Served,
            m => m,
        },
        ..Default::default()
    };
    // Removals answer once the workspace has left its path; the teardown of its mount
    // follows on a thread (drained before this process exits).
    cowspace::mounts::start_deferred_teardowns();
    // Each served workspace keeps a descriptor per modified inode the kernel holds.
    if let Ok((_, hard)) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
    {
        let _ =
            nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard, hard);
    }
    let plain_opts = ViewOptions {
        xattrs: false,
        ..opts.clone()
    };
    let view = ViewMount::mount(Arc::clone(&store), &view_dir, opts)?;
    let plain = ViewMount::mount(store, &plain_dir, plain_opts)?;

    // Reconcile the registry with the mount table: leftovers removed, and workspaces
    // still `creating` left to the processes creating them (they may have started this
    // daemon).
    match runtime.sweep() {
        Ok(r) => tracing::info!(
            stopped = r.stopped.len(),
            finished = r.finished.len(),
            creating = r.creating.len(),
            leftovers = r.leftovers_removed.len(),
            "registry reconciled"
        ),
        Err(e) => tracing::warn!("reconciling the registry failed: {e}"),
    }

    // The control socket, private to the owner of the root.
    let sock = socket_path(&root);
    let _ = std::fs::remove_file(&sock);
    let listener = UnixListener::bind(&sock).with_context(|| format!("bind {}", sock.display()))?;
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o600))?;
    listener.set_nonblocking(true)?;
    let owner = root_owner(&root)?;
    let rt = Arc::clone(&runtime);
    let server = Arc::new(Server {
        runtime: Arc::clone(&runtime),
        stop: Arc::clone(&stop),
        busy: Box::new(move || {
            rt.list(false)
                .unwrap_or_default()
                .into_iter()
                .filter(|r| rt.daemon_serves(r) && r.status == Status::Active)
                .map(|r| r.id)
                .collect()
        }),
        host: Arc::clone(&host),
        config,
    });
    tracing::info!(
        root = %root.display(),
        read_mode = args.read_mode.as_str(),
        passthrough = view.passthrough(),
        "fsd serving"
    );
    let served = Arc::clone(&server).serve(listener, owner);
    stop.store(true, Ordering::SeqCst);
    let _ = std::fs::remove_file(&sock);
    // Workspaces still on a view (a forced stop): end the FUSE connections so their
    // lower layer fails cleanly (they become `stopped`; `recover` brings them back)
    // instead of keeping this process alive behind a detached mount.
    if !(server.busy)().is_empty() {
        for dir in [&view_dir, &plain_dir] {
            if let Ok(meta) = std::fs::metadata(dir) {
                use std::os::unix::fs::MetadataExt;
                if cowspace::mounts::abort_fuse_connection(meta.dev(), true) {
                    tracing::warn!(view = %dir.display(), "aborted the view's FUSE connection");
                } else {
                    tracing::error!(view = %dir.display(), "cannot abort the view's connection");
                }
            }
        }
    }
    // Overlays torn down later still hold their lower layer, the view.
    cowspace::mounts::drain_deferred();
    host.unmount_all();
    for v in [view, plain] {
        if let Err(e) = v.unmount() {
            tracing::warn!("{e}");
        }
    }
    tracing::info!("fsd stopped");
    served?;
    Ok(())
}
