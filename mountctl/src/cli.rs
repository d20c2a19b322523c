//! The command-line grammar.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "mountctl",
    version,
    about = "Copy-on-write workspaces of repository snapshots"
)]
pub struct Cli {
    /// The runtime root (default: $COWSPACE_ROOT, else /var/lib/cowspace for root, else
    /// $XDG_DATA_HOME/cowspace).
    #[arg(long, global = true, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// Print exactly one JSON object on stdout; messages go to stderr.
    #[arg(long, global = true)]
    pub json: bool,
    /// More logging (repeat for more).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Less output: errors only.
    #[arg(short, long, global = true)]
    pub quiet: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create the runtime root.
    Init,
    /// Import a directory, a tar archive or a git revision as a snapshot.
    Import(ImportArgs),
    /// List snapshots, newest first.
    Snapshots,
    /// List refs.
    Refs,
    /// Move or delete refs.
    #[command(subcommand)]
    Ref(RefCommand),
    /// Show a snapshot, or a path in it.
    Show {
        snapshot: String,
        path: Option<String>,
    },
    /// Write a snapshot to a new directory (or a tar archive with --tar).
    Export {
        snapshot: String,
        dest: PathBuf,
        #[arg(long)]
        tar: bool,
    },
    /// Changed paths between two snapshots or refs.
    Diff {
        a: String,
        b: String,
        /// Print a unified patch of text files.
        #[arg(long)]
        patch: bool,
    },
    /// Verify every object and reference.
    Fsck,
    /// Remove what no ref, snapshot chain or pin needs.
    Gc(GcArgs),
    /// Logical and stored bytes, dedup and compression ratios.
    Stats,
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// A directory, a .tar/.tar.gz/.tar.zst file, or (with --git) a git repository.
    pub source: PathBuf,
    /// Move this ref to the new snapshot (its old snapshot becomes the parent).
    #[arg(long = "ref", value_name = "NAME")]
    pub ref_name: Option<String>,
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
}

#[derive(Debug, Subcommand)]
pub enum RefCommand {
    /// Point NAME at SNAP, if NAME is at --expect (or absent when --expect is not given).
    Set {
        name: String,
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
        name: String,
        #[arg(long, value_name = "SNAP")]
        expect: String,
    },
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
}
