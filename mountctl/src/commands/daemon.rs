//! `mountctl daemon start|stop|status`.

use std::process::ExitCode;

use cowspace::daemon;
use serde_json::json;

use crate::cli::DaemonCommand;
use crate::output::Ctx;

pub fn run(ctx: &Ctx, c: DaemonCommand) -> anyhow::Result<ExitCode> {
    ctx.open()?;
    match c {
        DaemonCommand::Start => {
            daemon::ensure_running(&ctx.root)?;
            ctx.confirm(json!({"running": true}), || "the daemon is running".into());
        }
        DaemonCommand::Stop { force } => {
            let stopped = daemon::stop(&ctx.root, force)?;
            // A daemon killed earlier left its views mounted (dead): no one else will.
            let detached = daemon::detach_dead_views(&ctx.root);
            ctx.confirm(
                json!({"stopped": stopped, "views_detached": detached}),
                || {
                    if stopped {
                        "the daemon stopped".into()
                    } else {
                        "the daemon was not running".into()
                    }
                },
            );
        }
        DaemonCommand::Status => {
            let up = daemon::ping(&ctx.root);
            ctx.emit(
                json!({"running": up, "socket": daemon::socket_path(&ctx.root)}),
                || {
                    if up {
                        "running".into()
                    } else {
                        "not running".into()
                    }
                },
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
