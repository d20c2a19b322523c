//! `mountctl diff A [B] [--patch]`: changed paths between two snapshots or refs, or of a
//! workspace against its base (A alone) or against any snapshot (`diff WS SNAP`).

use std::process::ExitCode;

use serde_json::json;

use crate::output::Ctx;

pub fn run(
    ctx: &Ctx,
    a: &str,
    b: &str,
    patch: bool,
    include_excluded: bool,
) -> anyhow::Result<ExitCode> {
    let rt = ctx.runtime()?;
    // A workspace first: names never look like refs (no '/') and ids start with `ws-`.
    match rt.get(a) {
        Ok(_) => return super::workspace::diff(ctx, a, Some(b), patch, include_excluded),
        Err(cowspace::error::Error::NoWorkspace(_)) => {}
        Err(e) => return Err(e.into()),
    }
    if include_excluded {
        return Ok(crate::output::usage_error(
            "error: --include-excluded is for the diff of a workspace (A is no workspace)\n",
            ctx.json,
        ));
    }
    let store = rt.store();
    let ia = store.resolve(a).map_err(|e| {
        anyhow::Error::new(e).context(format!(
            "diff A B: A ({}) is neither a workspace nor a snapshot or ref",
            cowspace_store::error::shown(a)
        ))
    })?;
    let ib = store.resolve(b)?;
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
            .map(|c| format!("{} {}\n", c.change.letter(), c.display_path()))
            .collect(),
    });
    Ok(ExitCode::SUCCESS)
}
