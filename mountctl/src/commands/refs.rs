//! `mountctl refs` and `mountctl ref set|delete`: names moved by compare-and-swap.

use std::process::ExitCode;

use crate::cli::RefCommand;
use crate::output::{Ctx, short};

pub fn list(ctx: &Ctx) -> anyhow::Result<ExitCode> {
    let map = cowspace::ops::refs(&ctx.open()?)?;
    let text: String = map
        .as_object()
        .into_iter()
        .flatten()
        .map(|(n, s)| format!("{}  {n}\n", short(s)))
        .collect();
    ctx.emit(map, || text);
    Ok(ExitCode::SUCCESS)
}

pub fn run(ctx: &Ctx, cmd: RefCommand) -> anyhow::Result<ExitCode> {
    let store = ctx.open()?;
    match cmd {
        RefCommand::Set {
            name,
            snapshot,
            expect,
            force,
        } => {
            let v = cowspace::ops::ref_set(&store, &name, &snapshot, expect.as_deref(), force)?;
            let text = format!("{name} -> {}", v["snapshot"].as_str().unwrap_or_default());
            ctx.confirm(v, || text);
        }
        RefCommand::Delete { name, expect } => {
            let v = cowspace::ops::ref_delete(&store, &name, &expect)?;
            ctx.confirm(v, || format!("deleted {name}"));
        }
    }
    Ok(ExitCode::SUCCESS)
}
