//! One command per file.

mod cp;
mod daemon;
mod diff;
mod doctor;
mod exec;
mod export;
mod files;
mod fsck;
mod gc;
mod image;
mod import;
mod init;
mod refs;
mod remote;
mod repack;
mod run;
mod sandbox;
mod show;
mod snapshots;
mod stats;
pub(crate) mod workspace;

use std::process::ExitCode;

use crate::cli::Command;
use crate::output::Ctx;

/// Runs one command.
pub fn run(ctx: &Ctx, command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Init { workspaces_fs } => init::run(ctx, workspaces_fs.as_deref()),
        Command::Import(args) => import::run(ctx, args),
        Command::Image(c) => image::run(ctx, c),
        Command::Cp(args) => cp::run(ctx, args),
        Command::Fork {
            workspace,
            name,
            count,
            sandbox,
        } => workspace::fork(
            ctx,
            &workspace,
            &cowspace::runtime::ForkOptions {
                name,
                count,
                sandbox,
            },
        ),
        Command::Fs(c) => files::run(ctx, c),
        Command::Watch { workspace, path } => files::watch(ctx, &workspace, &path),
        Command::Snapshots => snapshots::run(ctx),
        Command::Refs => refs::list(ctx),
        Command::Ref(c) => refs::run(ctx, c),
        Command::Show { snapshot, path } => show::run(ctx, &snapshot, path.as_deref()),
        Command::Export {
            snapshot,
            dest,
            tar,
        } => export::run(ctx, &snapshot, &dest, tar),
        Command::Diff {
            a,
            b,
            patch,
            include_excluded,
        } => match b {
            Some(b) => diff::run(ctx, &a, &b, patch, include_excluded),
            None => workspace::diff(ctx, &a, None, patch, include_excluded),
        },
        Command::Fsck(args) => fsck::run(ctx, args),
        Command::Gc(args) => gc::run(ctx, args),
        Command::Repack(args) => repack::run(ctx, args),
        Command::Stats => stats::run(ctx),
        Command::Remote(c) => remote::run(ctx, c),
        Command::Push {
            snapshot,
            remote,
            force,
        } => remote::push(ctx, &snapshot, remote.as_deref(), force),
        Command::Pull { snapshot, remote } => remote::pull(ctx, &snapshot, remote.as_deref()),
        Command::Fetch { remote } => remote::fetch(ctx, remote.as_deref()),
        Command::Create(args) => workspace::create(ctx, args),
        Command::List { all } => workspace::list(ctx, all),
        Command::Status { workspace } => workspace::status(ctx, &workspace),
        Command::Commit {
            workspace,
            ref_name,
            expect,
            message,
            allow_empty,
            include_excluded,
        } => workspace::commit(
            ctx,
            &workspace,
            &cowspace::runtime::CommitOptions {
                ref_name,
                expect,
                message,
                allow_empty,
                include_excluded,
            },
        ),
        Command::Remove { workspace, force } => workspace::remove(ctx, &workspace, force),
        Command::Sweep => workspace::sweep(ctx),
        Command::Recover { workspace } => workspace::recover(ctx, &workspace),
        Command::Doctor => doctor::run(ctx),
        Command::Config => workspace::config(ctx),
        Command::Daemon(c) => daemon::run(ctx, c),
        Command::Run(args) => run::run(ctx, *args),
        Command::Sandbox(c) => sandbox::run(ctx, c),
        Command::Exec(args) => exec::run(ctx, args),
        Command::GitFsmonitor { version, token } => git_fsmonitor(ctx, version, &token),
        Command::Completions { .. } | Command::ManPages { .. } if ctx.json => {
            Ok(crate::output::usage_error(
                "error: --json does not apply to `completions` and `man-pages` (they write a \
                 script and files): leave it out\n",
                true,
            ))
        }
        Command::Completions { shell } => {
            // Made in memory first: `clap_complete` panics on a failed write, and a
            // reader that stops early (`| head`) is no failure.
            let mut cmd = <crate::cli::Cli as clap::CommandFactory>::command();
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut cmd, "mountctl", &mut script);
            crate::output::write_stdout(&script)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::ManPages { dir } => crate::docs::write_man_pages(&dir).map(|n| {
            ctx.note(&format!("wrote {n} man pages to {}", dir.display()));
            ExitCode::SUCCESS
        }),
    }
}

/// git's fsmonitor hook: the answer goes to stdout as git reads it; a protocol version
/// other than 2 fails, and git then looks at every file.
fn git_fsmonitor(ctx: &Ctx, version: u32, token: &str) -> anyhow::Result<ExitCode> {
    use std::io::Write;
    if version != 2 {
        return Ok(ExitCode::FAILURE);
    }
    let cwd = std::env::current_dir()?;
    let answer = match cowspace::gitfsmonitor::answer_in_sandbox(&cwd, token) {
        Some(a) => a,
        None => cowspace::gitfsmonitor::answer(&cwd, token, std::slice::from_ref(&ctx.root)),
    };
    let mut out = std::io::stdout().lock();
    out.write_all(&answer.encode())?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}
