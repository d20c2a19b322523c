//! The command-line grammar.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

mod sandbox;

pub use sandbox::{ExecArgs, RunArgs, SandboxCommand, StartArgs};

#[derive(Debug, Parser)]
#[command(
    name = "mountctl",
    version,
    about = "Copy-on-write workspaces of repository snapshots"
)]
pub struct Cli {
    /// The runtime root (default: $COWSPACE_ROOT, else the configuration's `root`, else
    /// /var/lib/cowspace for root, else $XDG_DATA_HOME/cowspace).
    #[arg(long, global = true, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// Print exactly one JSON value on stdout (an object; an array for `list`,
    /// `snapshots`); messages go to stderr. `run`, `exec`: only a refusal is JSON;
    /// `completions`, `man-pages`: refused.
    #[arg(long, global = true)]
    pub json: bool,
    /// More logging (repeat for more).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Less output: no progress, notes or confirmations ("removed …", "exported …");
    /// results (ids, paths, listings) and errors still print.
    #[arg(short, long, global = true)]
    pub quiet: bool,
    #[command(subcommand)]
    pub command: Command,
}

// Parsed once per process: the sandbox flags make `run` the largest variant.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create the runtime root (a new or empty directory; of a root that exists, a
    /// no-op).
    Init {
        /// Give the root's workspaces a filesystem of their own with quotas (a sparse
        /// btrfs image of SIZE, `workspaces.btrfs`, loop-mounted at workspaces/ and
        /// mounted again by any command after a reboot), so `create --disk` can be
        /// enforced. On a root that holds workspaces: refused.
        #[arg(long, value_name = "SIZE")]
        workspaces_fs: Option<String>,
    },
    /// Import a directory, a tar archive or a git revision as a snapshot.
    Import(ImportArgs),
    /// OCI images: import from a layout directory or archive, pull from a registry, list,
    /// show, remove (an image is a snapshot a ref names; `sandbox start --image` runs on it).
    #[command(subcommand)]
    Image(ImageCommand),
    /// List snapshots, newest first.
    Snapshots,
    /// List refs.
    Refs,
    /// Move or delete refs.
    #[command(subcommand)]
    Ref(RefCommand),
    /// Show a snapshot, or a path in it.
    Show {
        /// A snapshot id (or a unique prefix of at least 6 hex digits) or ref.
        snapshot: String,
        /// A path in the snapshot (`/`-separated, from its root): a directory's entries,
        /// a file's kind, mode, size and content id, a symlink's target.
        path: Option<String>,
    },
    /// Write a snapshot to a new directory (or a tar archive with --tar), as it was
    /// imported (docs/git.md: what an import of a git checkout added is taken out).
    Export {
        /// A snapshot id (or a unique prefix of at least 6 hex digits) or ref.
        snapshot: String,
        /// The new directory (or archive file); it must not exist. With --tar, `-` writes
        /// the archive on stdout.
        dest: PathBuf,
        /// Write a tar archive (pax, with xattrs) instead of a directory.
        #[arg(long)]
        tar: bool,
    },
    /// Changed paths of a workspace against its base or any snapshot, or between two
    /// snapshots or refs. A directory import of a git checkout holds its `.git`, a `--git`
    /// import does not: compare two of a kind (or import the directory with
    /// `--exclude .git`), else all of `.git` shows as added or deleted.
    Diff {
        /// A workspace (id or name): alone, its changes against its base; with B, the
        /// changes from snapshot B to what the workspace shows (B its last commit, say).
        /// Else a snapshot (id, unique prefix of at least 6 hex digits, or ref).
        a: String,
        /// The snapshot (id, prefix or ref) to compare A with: the changes from A to B
        /// (from B to the workspace when A is one).
        b: Option<String>,
        /// Print a unified patch of text files.
        #[arg(long)]
        patch: bool,
        /// Of a workspace: list also the new paths the base's exclusion policy leaves out
        /// (`.venv`, `node_modules`, `--exclude` patterns of the import), which `commit`
        /// leaves out too.
        #[arg(long)]
        include_excluded: bool,
    },
    /// Verify every object and reference; say which snapshots, refs and paths need what
    /// is damaged.
    Fsck(FsckArgs),
    /// Remove what no ref, snapshot chain or pin needs.
    Gc(GcArgs),
    /// Rewrite small and mostly-dead packs into a few full ones (gc does this too).
    Repack(RepackArgs),
    /// Logical and stored bytes, dedup and compression ratios.
    Stats,
    /// Remotes: S3-compatible object stores that hosts share snapshots through.
    #[command(subcommand)]
    Remote(RemoteCommand),
    /// Upload a snapshot (or a ref and its snapshot) to a remote.
    Push {
        /// A ref (moved on the remote by compare-and-swap) or a snapshot id.
        snapshot: String,
        /// The remote (default: the first one added).
        #[arg(long, value_name = "NAME")]
        remote: Option<String>,
        /// Move the remote ref even when it is at a snapshot this one does not descend from.
        #[arg(long)]
        force: bool,
    },
    /// Bring a snapshot (or a remote ref) and all its file contents here.
    Pull {
        /// A remote ref (`REF`, or `REMOTE/REF`) or a full snapshot id.
        snapshot: String,
        /// The remote (default: the first one added).
        #[arg(long, value_name = "NAME")]
        remote: Option<String>,
    },
    /// Bring every ref of a remote here as REMOTE/REF, with its snapshot's metadata only.
    Fetch {
        /// The remote (default: the first one added).
        #[arg(long, value_name = "NAME")]
        remote: Option<String>,
    },
    /// Create a workspace: a writable copy-on-write view of a snapshot.
    Create(CreateArgs),
    /// List workspaces.
    List {
        /// Include removed and failed workspaces.
        #[arg(long)]
        all: bool,
    },
    /// Show one workspace's record, and how many paths changed since its last commit.
    Status {
        /// The workspace (id or name).
        workspace: String,
    },
    /// Capture a workspace's changes as a new snapshot.
    Commit {
        /// The workspace (id or name).
        workspace: String,
        /// Move this ref to the new snapshot (compare-and-swap).
        #[arg(long = "ref", value_name = "NAME")]
        ref_name: Option<String>,
        /// The snapshot the ref must hold (default: the workspace's previous capture or
        /// base when the ref exists).
        #[arg(long, value_name = "SNAP", requires = "ref_name")]
        expect: Option<String>,
        /// The new snapshot's message (recorded; shown by `snapshots` and `show`).
        #[arg(long, short, default_value = "")]
        message: String,
        /// Make a snapshot even when nothing changed since the workspace's previous
        /// capture (or its base); without it such a commit prints "nothing to commit"
        /// and gives that snapshot.
        #[arg(long)]
        allow_empty: bool,
        /// Capture also the new paths the base's recorded exclusion policy leaves out
        /// (by default a `.venv` or `node_modules` made in the workspace is left out, as
        /// its import would; `diff` lists what a commit captures).
        #[arg(long)]
        include_excluded: bool,
    },
    /// Unmount a workspace and delete its private state. Refused (busy) while processes
    /// use it, while its sandbox runs, or while it has changes since its last commit (or
    /// its base): `--force` overrides each.
    Remove {
        /// The workspace (id or name).
        workspace: String,
        /// End the processes still using it, stop its sandbox, throw away its uncommitted
        /// changes.
        #[arg(long)]
        force: bool,
    },
    /// New workspaces holding exactly what WS shows now (its base and its private
    /// changes), in time proportional to its changes; a running sandbox of WS is frozen
    /// for the copy and thawed after. Prints the new workspaces (`--json`: `forks`, each
    /// record with `parent`; `frozen_ms`).
    Fork {
        /// The workspace (id or name).
        workspace: String,
        /// The fork's name (with --count: NAME-1 ... NAME-N).
        #[arg(long)]
        name: Option<String>,
        /// How many forks (1 to 64).
        #[arg(long, value_name = "N")]
        count: Option<usize>,
        /// Start a sandbox in each fork with the controls WS's was started with.
        #[arg(long)]
        sandbox: bool,
    },
    /// Reconcile the registry with the mount table; remove leftovers.
    Sweep,
    /// Remount a stopped workspace with its written data (of an active, mounted one:
    /// nothing to do, says so).
    Recover {
        /// The workspace (id or name).
        workspace: String,
    },
    /// What each materializer would do on this host, and why.
    Doctor,
    /// Show the effective configuration: each setting's value and where it came from
    /// (a flag, the environment, a configuration file, or the default), and the
    /// configuration files looked for.
    Config,
    /// The daemon.
    #[command(subcommand)]
    Daemon(DaemonCommand),
    /// Run a command in the workspace's sandbox (the workspace at /workspace); exits with
    /// its status (127: no such command). With --json, a refusal is a JSON error on
    /// stdout; the command's own output is passed through unchanged.
    Run(Box<RunArgs>),
    /// Long-lived sandboxes: start one for a workspace, stop it, show them.
    #[command(subcommand)]
    Sandbox(SandboxCommand),
    /// Run a command in the workspace's running sandbox (the workspace at /workspace, the
    /// default working directory); exits with its status (127: no such command). With
    /// --json, a refusal is a JSON error on stdout; the command's own output is passed
    /// through unchanged.
    Exec(ExecArgs),
    /// Copy files between the host and a workspace (one side `WS:PATH`, the other a host
    /// path or `-`, a tar stream on stdin or stdout): directories recursively, modes and
    /// symlinks kept (hard links become separate files). Paths inside the workspace never
    /// resolve outside it; while its sandbox runs, what is created belongs to its root.
    Cp(CpArgs),
    /// Files of a workspace, safely (never through a worker's symlink out of it; as the
    /// sandbox's root while it runs): ls, stat, cat, write, mkdir, rm, mv, ln.
    #[command(subcommand)]
    Fs(FsCommand),
    /// Print a workspace's changes as they happen (the sandbox's and the host's), one
    /// line each (`--json`: one object per line: event, path, from), until interrupted or
    /// the workspace goes.
    Watch {
        /// The workspace (id or name).
        workspace: String,
        /// A directory inside it (default: all of it).
        #[arg(default_value = ".")]
        path: String,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish or powershell).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Write the man pages (mountctl.1, mountctl-SUBCOMMAND.1, ...) into DIR.
    #[command(name = "man-pages")]
    ManPages {
        /// Where to write them (e.g. /usr/local/share/man/man1).
        dir: PathBuf,
    },
    /// git's fsmonitor hook (run by git in a workspace, not by hand): prints the paths
    /// changed since TOKEN (docs/git.md).
    #[command(name = "git-fsmonitor")]
    GitFsmonitor {
        /// The hook protocol version git speaks (only 2 is answered).
        version: u32,
        /// The token git kept from the last answer.
        #[arg(default_value = "")]
        token: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum DaemonCommand {
    /// Start the daemon if it is not running.
    Start,
    /// Stop the daemon cleanly.
    Stop {
        /// Stop even while workspaces use its snapshot view.
        #[arg(long)]
        force: bool,
    },
    /// Whether the daemon answers.
    Status,
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// A snapshot id (or a unique prefix of at least 6 hex digits) or ref.
    #[arg(required_unless_present = "from_git", conflicts_with = "from_git")]
    pub snapshot: Option<String>,
    /// Make the workspace from this git checkout (see --dirty).
    #[arg(long, value_name = "DIR")]
    pub from_git: Option<PathBuf>,
    /// With --from-git: refuse a checkout with uncommitted changes (default), apply them
    /// as a patch on HEAD, or snapshot the working tree as it is.
    #[arg(
        long,
        value_name = "refuse|patch|snapshot",
        default_value = "refuse",
        requires = "from_git"
    )]
    pub dirty: String,
    /// A name for the workspace, usable wherever its id is: 1 to 63 letters, digits,
    /// `.`, `_` or `-`, starting with a letter or digit and not with `ws-`.
    #[arg(long)]
    pub name: Option<String>,
    /// How the workspace is made: auto (the best this host supports, as `doctor`
    /// shows), overlay (kernel overlayfs), fuse (the daemon's own copy-on-write view),
    /// btrfs (a subvolume snapshot), reflink (cloned files), copy (a full copy, only
    /// by name), nfs (the fuse workspace served over NFS on 127.0.0.1 and mounted by
    /// the kernel's NFS client; only by name). One that cannot work here is refused,
    /// never replaced. Default:
    /// $COWSPACE_MATERIALIZER, else the configuration's `create.materializer`, else auto.
    #[arg(long, value_name = "auto|overlay|fuse|btrfs|reflink|copy|nfs")]
    pub materializer: Option<String>,
    /// The overlay's lower layer: native (a metadata image over the blob cache: file
    /// bytes read by the kernel from the blobs, no daemon), the daemon's snapshot view
    /// (lazy reads), a shared checkout, or auto (native where the host mounts it, else
    /// the view where FUSE is usable, else the checkout; `mountctl doctor` says which).
    /// Default: $COWSPACE_LOWER, else the configuration's `create.lower`, else auto.
    #[arg(long, value_name = "auto|native|view|checkout")]
    pub lower: Option<String>,
    /// Where the workspace appears (must not exist).
    #[arg(long, value_name = "DIR")]
    pub path: Option<PathBuf>,
    /// The worker this workspace is for (recorded).
    #[arg(long, value_name = "ID")]
    pub worker: Option<String>,
    /// A quota on the bytes the workspace's private state may hold (`20g`, `512m`, or
    /// bytes): its writes past it fail with EDQUOT ("Disk quota exceeded"). Needs a
    /// runtime root whose workspaces/ is btrfs with quotas (`init --workspaces-fs`);
    /// refused (7) elsewhere, before anything is made.
    #[arg(long, value_name = "SIZE")]
    pub disk: Option<String>,
    /// A quota on inodes: refused (7), no filesystem quota this kernel has counts
    /// inodes (btrfs qgroups limit bytes).
    #[arg(long, value_name = "N")]
    pub inodes: Option<u64>,
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// A directory, a .tar/.tar.gz/.tar.zst file, or (with --git) a git repository.
    pub source: PathBuf,
    /// Move this ref to the new snapshot (its old snapshot becomes the parent).
    #[arg(long = "ref", value_name = "NAME")]
    pub ref_name: Option<String>,
    /// The snapshot's message (recorded; shown by `snapshots` and `show`).
    #[arg(long, short, default_value = "")]
    pub message: String,
    /// Leave out paths matching GLOB (repeatable).
    #[arg(long, value_name = "GLOB")]
    pub exclude: Vec<String>,
    /// Do not leave out heavy regenerable artifacts (node_modules, target, ...).
    #[arg(long)]
    pub no_default_excludes: bool,
    /// Import this git revision of the repository SOURCE (no working tree is touched).
    #[arg(long, value_name = "REV")]
    pub git: Option<String>,
    /// Accept character and block device nodes.
    #[arg(long)]
    pub allow_devices: bool,
    /// Accept symlinks in archives that point outside the tree.
    #[arg(long)]
    pub allow_external_symlinks: bool,
    /// zstd level for new chunks (1-19; 3 by default).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(i32).range(1..=19))]
    pub zstd_level: Option<i32>,
    /// Hashing and compression threads (default: one per core).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Do not make git in workspaces ask cowspace what changed (a git checkout's
    /// `.git/config` and `.git/index` then keep only the stat refresh; docs/git.md).
    #[arg(long)]
    pub no_git_fsmonitor: bool,
}

#[derive(Debug, Subcommand)]
pub enum RefCommand {
    /// Point NAME at SNAP, if NAME is at --expect (or absent when --expect is not given).
    Set {
        /// The ref, e.g. myrepo/main.
        name: String,
        /// A snapshot id (or a unique prefix of at least 6 hex digits) or ref.
        snapshot: String,
        /// The snapshot NAME must hold now.
        #[arg(long, value_name = "SNAP")]
        expect: Option<String>,
        /// Move NAME whatever it holds.
        #[arg(long, conflicts_with = "expect")]
        force: bool,
    },
    /// Delete NAME if it is at --expect.
    Delete {
        /// The ref.
        name: String,
        /// The snapshot NAME must hold now (so a ref moved meanwhile is not deleted).
        #[arg(long, value_name = "SNAP")]
        expect: String,
    },
}

#[derive(Debug, Args)]
pub struct FsckArgs {
    /// Quarantine corrupt objects so that the next import of a source that still has
    /// their bytes rewrites them (their stat-cache rows are dropped, so the files are
    /// read again). Rewrites and deletes no object.
    #[arg(long)]
    pub repair: bool,
    /// With --repair: wait for running imports instead of failing as busy.
    #[arg(long, requires = "repair")]
    pub wait: bool,
}

#[derive(Debug, Subcommand)]
pub enum RemoteCommand {
    /// Add a remote (credentials: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or ~/.aws/credentials).
    Add {
        /// Its name here.
        name: String,
        /// s3://BUCKET/PREFIX
        url: String,
        /// The S3 endpoint, e.g. http://127.0.0.1:9000 (default: AWS).
        #[arg(long, value_name = "URL")]
        endpoint: Option<String>,
        /// The region (default: us-east-1).
        #[arg(long, value_name = "REGION")]
        region: Option<String>,
    },
    /// List the remotes, with what was fetched from each.
    List,
    /// Forget a remote (refused while a snapshot here still reads contents from it).
    Remove {
        /// The remote.
        name: String,
    },
    /// Remove from a remote what no remote ref or pin needs (mark, then sweep a grace later).
    Gc {
        /// The remote (default: the first one added).
        name: Option<String>,
        /// Say what would be removed, remove nothing.
        #[arg(long)]
        dry_run: bool,
        /// Seconds between the mark of an unreachable object and its removal.
        #[arg(long, value_name = "SECONDS", default_value_t = cowspace::remote::GC_GRACE_SECS)]
        grace: i64,
    },
}

#[derive(Debug, Args)]
pub struct RepackArgs {
    /// Say which packs would be rewritten, rewrite nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Wait for running imports instead of failing as busy.
    #[arg(long)]
    pub wait: bool,
}

#[derive(Debug, Args)]
pub struct GcArgs {
    /// Say what would be removed, remove nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Keep unreferenced snapshots younger than this many seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = cowspace_store::gc::DEFAULT_GC_GRACE_SECS)]
    pub grace: i64,
    /// Wait for running imports instead of failing as busy.
    #[arg(long)]
    pub wait: bool,
    /// Bound of the blob cache in bytes; least recently used blobs beyond it are evicted.
    #[arg(long, value_name = "BYTES", default_value_t = cowspace_store::blobcache::DEFAULT_BLOB_CACHE_MAX_BYTES)]
    pub blob_cache_max: u64,
}

#[derive(Debug, Args)]
pub struct CpArgs {
    /// `WS:PATH`, a host path, or `-` (a tar stream on stdin).
    pub src: String,
    /// `WS:PATH`, a host path, or `-` (a tar stream on stdout).
    pub dest: String,
    /// Follow symlinks on the host side (never inside a workspace).
    #[arg(short = 'L', long)]
    pub follow_links: bool,
}

#[derive(Debug, Subcommand)]
pub enum FsCommand {
    /// List a directory (`WS:PATH`, default the root).
    Ls {
        /// `WS` or `WS:PATH`.
        target: String,
        /// Every entry below, not one level.
        #[arg(short = 'R', long)]
        recursive: bool,
    },
    /// What is at `WS:PATH` (a symlink itself).
    Stat {
        /// `WS:PATH`.
        target: String,
    },
    /// Print a file of a workspace.
    Cat {
        /// `WS:PATH`.
        target: String,
    },
    /// Write stdin to a file of a workspace (atomically replacing it).
    Write {
        /// `WS:PATH`.
        target: String,
        /// Permission bits, octal (default: the replaced file's, else 644).
        #[arg(long, value_parser = parse_octal)]
        mode: Option<u32>,
        /// Append instead of replacing.
        #[arg(long)]
        append: bool,
    },
    /// Make a directory.
    Mkdir {
        /// `WS:PATH`.
        target: String,
        /// Make missing parents; no error if it exists.
        #[arg(short, long)]
        parents: bool,
    },
    /// Remove a file, a symlink or an empty directory.
    Rm {
        /// `WS:PATH`.
        target: String,
        /// Directories and what they hold.
        #[arg(short, long)]
        recursive: bool,
    },
    /// Rename within a workspace.
    Mv {
        /// `WS:PATH`.
        from: String,
        /// `PATH` in the same workspace (or `WS:PATH` naming it).
        to: String,
    },
    /// Make a symlink at `WS:PATH` pointing to TARGET.
    Ln {
        /// The link's target (kept as given).
        link_target: String,
        /// `WS:PATH` of the link.
        target: String,
    },
}

fn parse_octal(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .ok()
        .filter(|m| *m <= 0o7777)
        .ok_or_else(|| format!("{s:?}: expected octal permission bits, e.g. 644"))
}

#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// Import an image from an OCI image layout directory, an OCI archive or a `docker
    /// save` archive (`PATH`, or `PATH:TAG` for one of several images in it).
    Import {
        /// `PATH` or `PATH:TAG`.
        source: String,
        /// The ref to point at the image's snapshot, e.g. images/python/3.12.
        #[arg(long = "ref", value_name = "NAME")]
        ref_name: String,
        #[command(flatten)]
        opts: ImageFlags,
    },
    /// Pull an image from an OCI distribution registry: HOST[:PORT]/REPO[:TAG][@DIGEST]
    /// (plain HTTP for a loopback registry, HTTPS otherwise; credentials from
    /// COWSPACE_REGISTRY_AUTH=USER:PASSWORD or the docker configuration, never arguments).
    Pull {
        /// The image reference, e.g. 127.0.0.1:5000/tools/busybox:1.36.
        reference: String,
        /// The ref to point at the image's snapshot (default images/HOST/REPO/TAG).
        #[arg(long = "ref", value_name = "NAME")]
        ref_name: Option<String>,
        #[command(flatten)]
        opts: ImageFlags,
    },
    /// List the refs that name images.
    List,
    /// Show an image: digest, platform, layers and its config's Env, WorkingDir, User,
    /// Entrypoint, Cmd and ExposedPorts.
    Show {
        /// A ref or snapshot id.
        name: String,
    },
    /// Remove an image's ref (its snapshot goes with `gc` once nothing holds it).
    Remove {
        /// The image's ref.
        name: String,
    },
}

/// What an image import or pull takes beside its source.
#[derive(Debug, Args)]
pub struct ImageFlags {
    /// The platform to pick from a multi-platform image: OS/ARCH[/VARIANT] (default the
    /// host's, e.g. linux/amd64).
    #[arg(long, value_name = "OS/ARCH")]
    pub platform: Option<String>,
    /// The snapshot's message.
    #[arg(short, long, default_value = "")]
    pub message: String,
}
