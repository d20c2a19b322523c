//! `mountctl run WS [sandbox flags] [--vm [--accept-emulation]] -- CMD`: runs CMD in a
//! one-shot sandbox (or, with `--vm`, a micro-VM) of the workspace (start, the command,
//! stop) and exits with its status. Thin: one call of
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
    let code = if a.vm {
        let accept =
            a.accept_emulation || ctx.config.vm_accept_emulation().is_some_and(|s| s.value);
        let v = cowspace::vm::VmRun {
            accept_emulation: accept,
        };
        rt.vm_run(&a.workspace, &opts, &v, &a.command, ctx.json)?
    } else {
        rt.sandbox_run(&a.workspace, &opts, &a.command, ctx.json)?
    };
    Ok(ExitCode::from(code))
}
