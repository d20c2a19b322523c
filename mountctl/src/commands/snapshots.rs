//! `mountctl snapshots`: every snapshot, newest first.

use std::process::ExitCode;

use crate::output::{Ctx, bytes, short, strs};

pub fn run(ctx: &Ctx) -> anyhow::Result<ExitCode> {
    let list = cowspace::ops::snapshots(&ctx.open()?)?;
    let mut text = String::new();
    for s in list.as_array().into_iter().flatten() {
        let names = strs(&s["refs"]);
        // The minute is enough in a list (`show` gives the second).
        let mut when = crate::output::date(s["created_at"].as_i64().unwrap_or(0));
        when.replace_range(16..19, "");
        text.push_str(&format!(
            "{}  {when}  {:>8} files {:>10}  {}{}\n",
            short(&s["snapshot"]),
            s["files"].as_u64().unwrap_or(0),
            bytes(s["bytes"].as_u64().unwrap_or(0)),
            if names.is_empty() {
                String::new()
            } else {
                format!("({}) ", names.join(", "))
            },
            s["message"].as_str().unwrap_or_default()
        ));
    }
    ctx.emit(list, || text);
    Ok(ExitCode::SUCCESS)
}
