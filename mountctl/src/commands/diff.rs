//! `mountctl diff A B [--patch]`: changed paths between two snapshots or refs.

use std::process::ExitCode;

use serde_json::json;

use crate::output::Ctx;

pub fn run(ctx: &Ctx, a: &str, b: &str, patch: bool) -> anyhow::Result<ExitCode> {
    let store = ctx.open()?;
    let (ia, ib) = (store.resolve(a)?, store.resolve(b)?);
    let changes = store.diff_snapshots(&ia, &ib)?;
    let text = if patch {
        Some(store.patch(&changes)?)
    } else {
        None
    };
    let value = json!({"from": ia, "to": ib, "changes": changes, "patch": text});
    ctx.emit(value, || match &text {
        Some(p) => p.clone(),
        None => changes
            .iter()
            .map(|c| format!("{} {}\n", c.change.letter(), c.path))
            .collect(),
    });
    Ok(ExitCode::SUCCESS)
}
