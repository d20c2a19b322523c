//! `mountctl run WS [sandbox flags] -- CMD`: runs CMD in a one-shot sandbox of the
//! workspace (start, the command, stop) and exits with its status. Thin: one call of
//! `Runtime::sandbox_run` (`cowspace::sandbox`), which passes the helper's
//! refusals (7 unsupported, 9 invalid, 5 busy or no free uid range or port) and its
//! messages through unchanged.

use std::process::ExitCode;

use cowspace::sandbox::SandboxOptions;

use crate::cli::RunArgs;
use crate::output::Ctx;

pub fn run(ctx: &Ctx, a: RunArgs) -> anyhow::Result<ExitCode> {
    let rt = ctx.runtime()?;
    let opts =
        cowspace::sandbox::with_defaults(SandboxOptions::from(a.sandbox), &ctx.config.sandbox());
    let code = rt.sandbox_run(&a.workspace, &opts, &a.command, ctx.json)?;
    Ok(ExitCode::from(code))
}
