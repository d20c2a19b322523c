//! `mountctl refs` and `mountctl ref set|delete`: names moved by compare-and-swap.

use std::process::ExitCode;

use cowspace_store::Expect;
use serde_json::json;

use crate::cli::RefCommand;
use crate::output::Ctx;

pub fn list(ctx: &Ctx) -> anyhow::Result<ExitCode> {
    let store = ctx.open()?;
    let refs = store.refs()?;
    let map: serde_json::Map<String, serde_json::Value> =
        refs.iter().map(|(n, s)| (n.clone(), json!(s))).collect();
    ctx.emit(json!(map), || {
        refs.iter()
            .map(|(n, s)| format!("{}  {n}\n", s.short()))
            .collect()
    });
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
            let new = store.resolve(&snapshot)?;
            let expect = match (expect, force) {
                (_, true) => Expect::Any,
                (Some(e), false) => Expect::At(store.resolve(&e)?),
                (None, false) => Expect::Absent,
            };
            store.set_ref(&name, &new, expect)?;
            ctx.confirm(json!({"ref": name, "snapshot": new}), || {
                format!("{name} -> {new}")
            });
        }
        RefCommand::Delete { name, expect } => {
            let expect = store.resolve(&expect)?;
            store.delete_ref(&name, expect)?;
            ctx.confirm(json!({"ref": name, "deleted": true}), || {
                format!("deleted {name}")
            });
        }
    }
    Ok(ExitCode::SUCCESS)
}
