//! `mountctl show SNAP|REF [PATH]`: a snapshot's metadata, or what a path holds.

use std::process::ExitCode;

use crate::output::{Ctx, bytes};

pub fn run(ctx: &Ctx, spec: &str, path: Option<&str>) -> anyhow::Result<ExitCode> {
    let store = ctx.open()?;
    let value = cowspace::ops::show(&store, spec, path.unwrap_or(""))?;
    let id = store.resolve(spec)?;
    let snap = store.snapshot(&id)?;
    let entries = value["entries"].as_array().cloned();
    let entry = Some(value["entry"].clone()).filter(|e| !e.is_null());
    ctx.emit(value, || {
        let mut out = String::new();
        if path.is_none() {
            out.push_str(&format!(
                "snapshot {id}\nroot     {}\ncreated  {}\nparents  {}\nsource   {}\nfiles    {} ({}), {} dirs, {} symlinks, {} excluded\nmessage  {}\n\n",
                snap.root,
                crate::output::date_ago(snap.created_at),
                if snap.parents.is_empty() {
                    "-".to_string()
                } else {
                    snap.parents.iter().map(|p| p.short()).collect::<Vec<_>>().join(" ")
                },
                snap.source,
                snap.counts.files,
                bytes(snap.counts.bytes),
                snap.counts.dirs,
                snap.counts.symlinks,
                snap.counts.excluded,
                snap.message
            ));
        }
        let line = |e: &serde_json::Value| {
            let s = |k: &str| e[k].as_str().unwrap_or_default().to_string();
            let target = e["target"].as_str().map(|t| format!(" -> {t}")).unwrap_or_default();
            format!(
                "{} {:<12} {:>10}  {}{}\n",
                s("mode"),
                s("kind"),
                e["size"].as_u64().unwrap_or(0),
                s("name"),
                target
            )
        };
        match (&entries, &entry) {
            (Some(list), _) => list.iter().for_each(|e| out.push_str(&line(e))),
            (None, Some(e)) => out.push_str(&line(e)),
            _ => {}
        }
        out
    });
    Ok(ExitCode::SUCCESS)
}
