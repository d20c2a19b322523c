//! One command per file.

mod diff;
mod export;
mod fsck;
mod gc;
mod import;
mod init;
mod refs;
mod show;
mod snapshots;
mod stats;

use std::process::ExitCode;

use crate::cli::Command;
use crate::output::Ctx;

/// Runs one command.
pub fn run(ctx: &Ctx, command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Init => init::run(ctx),
        Command::Import(args) => import::run(ctx, args),
        Command::Snapshots => snapshots::run(ctx),
        Command::Refs => refs::list(ctx),
        Command::Ref(c) => refs::run(ctx, c),
        Command::Show { snapshot, path } => show::run(ctx, &snapshot, path.as_deref()),
        Command::Export {
            snapshot,
            dest,
            tar,
        } => export::run(ctx, &snapshot, &dest, tar),
        Command::Diff { a, b, patch } => diff::run(ctx, &a, &b, patch),
        Command::Fsck => fsck::run(ctx),
        Command::Gc(args) => gc::run(ctx, args),
        Command::Stats => stats::run(ctx),
    }
}
