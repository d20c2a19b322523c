//! One command per file.

mod daemon;
mod diff;
mod export;
mod fsck;
mod gc;
mod import;
mod init;
mod refs;
mod run;
mod show;
mod snapshots;
mod stats;
mod workspace;

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
        Command::Diff { a, b, patch } => match b {
            Some(b) => diff::run(ctx, &a, &b, patch),
            None => workspace::diff(ctx, &a, patch),
        },
        Command::Fsck => fsck::run(ctx),
        Command::Gc(args) => gc::run(ctx, args),
        Command::Stats => stats::run(ctx),
        Command::Create(args) => workspace::create(ctx, args),
        Command::List { all } => workspace::list(ctx, all),
        Command::Status { workspace } => workspace::status(ctx, &workspace),
        Command::Commit {
            workspace,
            ref_name,
            expect,
            message,
        } => workspace::commit(ctx, &workspace, ref_name, expect, message),
        Command::Remove { workspace, force } => workspace::remove(ctx, &workspace, force),
        Command::Sweep => workspace::sweep(ctx),
        Command::Recover { workspace } => workspace::recover(ctx, &workspace),
        Command::Doctor => workspace::doctor(ctx),
        Command::Daemon(c) => daemon::run(ctx, c),
        Command::Run(args) => run::run(ctx, args),
    }
}
