//! `mountctl snapshots`: every snapshot, newest first.

use std::process::ExitCode;

use serde_json::json;

use crate::output::{Ctx, bytes};

pub fn run(ctx: &Ctx) -> anyhow::Result<ExitCode> {
    let store = ctx.open()?;
    let refs = store.refs()?;
    let snaps = store.snapshots()?;
    let list: Vec<_> = snaps
        .iter()
        .map(|(id, s)| {
            let names: Vec<&str> = refs
                .iter()
                .filter(|(_, r)| r == id)
                .map(|(n, _)| n.as_str())
                .collect();
            json!({
                "snapshot": id, "created_at": s.created_at, "message": s.message,
                "parents": s.parents, "source": s.source, "files": s.counts.files,
                "bytes": s.counts.bytes, "refs": names,
            })
        })
        .collect();
    ctx.emit(json!(list), || {
        let mut out = String::new();
        for (id, s) in &snaps {
            let names: Vec<&str> = refs
                .iter()
                .filter(|(_, r)| r == id)
                .map(|(n, _)| n.as_str())
                .collect();
            out.push_str(&format!(
                "{}  {:>8} files {:>10}  {}{}\n",
                id.short(),
                s.counts.files,
                bytes(s.counts.bytes),
                if names.is_empty() {
                    String::new()
                } else {
                    format!("({}) ", names.join(", "))
                },
                s.message
            ));
        }
        out
    });
    Ok(ExitCode::SUCCESS)
}
