//! `mountctl show SNAP|REF [PATH]`: a snapshot's metadata, or what a path holds.

use std::process::ExitCode;

use cowspace_store::browse::{EntryView, Found};
use serde_json::json;

use crate::output::{Ctx, bytes};

pub fn run(ctx: &Ctx, spec: &str, path: Option<&str>) -> anyhow::Result<ExitCode> {
    let store = ctx.open()?;
    let id = store.resolve(spec)?;
    let snap = store.snapshot(&id)?;
    let found = store.lookup(&id, path.unwrap_or(""))?;
    let (entry, entries): (Option<EntryView>, Option<Vec<EntryView>>) = match &found {
        Found::Dir { entry, tree } => (
            entry.as_ref().map(EntryView::from),
            Some(tree.entries.iter().map(EntryView::from).collect()),
        ),
        Found::Leaf(e) => (Some(EntryView::from(e)), None),
    };
    let value = json!({
        "snapshot": id, "meta": snap, "path": path.unwrap_or(""),
        "entry": entry, "entries": entries,
    });
    ctx.emit(value, || {
        let mut out = String::new();
        if path.is_none() {
            out.push_str(&format!(
                "snapshot {id}\nroot     {}\ncreated  {}\nparents  {}\nsource   {}\nfiles    {} ({}), {} dirs, {} symlinks, {} excluded\nmessage  {}\n\n",
                snap.root,
                snap.created_at,
                snap.parents.iter().map(|p| p.short()).collect::<Vec<_>>().join(" "),
                serde_json::to_string(&snap.source).unwrap_or_default(),
                snap.counts.files,
                bytes(snap.counts.bytes),
                snap.counts.dirs,
                snap.counts.symlinks,
                snap.counts.excluded,
                snap.message
            ));
        }
        let line = |e: &EntryView| {
            let target = e.target.as_ref().map(|t| format!(" -> {t}")).unwrap_or_default();
            format!("{} {:<12} {:>10}  {}{}\n", e.mode, e.kind_str(), e.size, e.name, target)
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

trait KindStr {
    fn kind_str(&self) -> &'static str;
}

impl KindStr for EntryView {
    fn kind_str(&self) -> &'static str {
        self.kind.as_str()
    }
}
