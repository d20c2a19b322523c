//! `mountctl fsck [--repair]`: exit 8 with a list when anything is corrupt or missing,
//! each damaged object with the snapshots, refs and paths that need it; `--repair`
//! quarantines corrupt objects so a re-import rewrites them.

use std::process::ExitCode;

use cowspace_store::ErrorKind;
use cowspace_store::repair::{Damage, RepairReport};
use serde_json::json;

use crate::cli::FsckArgs;
use crate::output::{Ctx, bytes, report_error_with};

pub fn run(ctx: &Ctx, args: FsckArgs) -> anyhow::Result<ExitCode> {
    let store = ctx.open()?;
    let mut report = store.fsck()?;
    let repair = match args.repair {
        true => {
            let r = store.repair(&report, args.wait)?;
            report.suspects = r.suspects.clone();
            Some(r)
        }
        false => None,
    };
    // The native lowers' blobs (a cache, but one a workspace cannot read without).
    let mut native = cowspace::native::missing_blobs(&store)?;
    if args.repair && !native.is_empty() {
        cowspace::native::restore_blobs(&store, &native)?;
        ctx.note(&format!(
            "repair: {} blobs of native lowers written again from the store",
            native.len()
        ));
        native = cowspace::native::missing_blobs(&store)?;
    }
    for m in &native {
        ctx.note(&format!(
            "missing blob {} ({} bytes) of the native lower of snapshot {}: {} is gone;              reads of the files with these bytes fail in its workspaces (`mountctl fsck              --repair` writes it again)",
            m.content,
            m.size,
            &m.snapshot[..12],
            m.blob.display()
        ));
    }
    for p in &report.orphan_packs {
        ctx.note(&format!(
            "note: orphan pack {p} (left by an interrupted write; gc removes it)"
        ));
    }
    if let Some(r) = &repair {
        ctx.note(&repair_note(r));
    }
    if report.is_clean() && native.is_empty() {
        ctx.emit(
            json!({"ok": true, "report": report, "repair": repair, "native_missing": native}),
            || {
                format!(
                    "ok: {} objects ({}) in {} packs verified",
                    report.objects_checked,
                    bytes(report.bytes_checked),
                    report.packs_checked
                )
            },
        );
        return Ok(ExitCode::SUCCESS);
    }
    if !ctx.json {
        let mut text = String::new();
        for p in report.corrupt.iter() {
            text.push_str(&format!("corrupt {} {}: {}\n", p.what, p.id, p.why));
        }
        for p in report.missing.iter() {
            text.push_str(&format!("missing {} {}: {}\n", p.what, p.id, p.why));
        }
        for d in &report.damage {
            text.push_str(&damage_text(d));
        }
        crate::output::write_stdout(text.as_bytes())?;
    }
    let message = format!(
        "{} corrupt and {} missing objects, {} missing blobs of native lowers",
        report.corrupt.len(),
        report.missing.len(),
        native.len()
    );
    let hint = match &repair {
        _ if report.is_clean() => {
            "`mountctl fsck --repair` writes the missing blobs again from the store (which \
             is intact)"
        }
        Some(_) => {
            "import the sources of the paths listed again (the same directory, git revision or \
             tar): each import rewrites the quarantined objects it has the bytes of; then run \
             fsck again"
        }
        None => {
            "`mountctl fsck --repair` quarantines the corrupt objects, so that an import of a \
             source that still has the paths listed rewrites them; snapshots whose objects are \
             damaged cannot be exported until then"
        }
    };
    Ok(report_error_with(
        ctx,
        ErrorKind::Corrupt,
        &message,
        Some(hint),
        json!({"ok": false, "report": report, "repair": repair, "native_missing": native}),
    ))
}

/// What a repair did, in one line.
fn repair_note(r: &RepairReport) -> String {
    format!(
        "repair: {} objects quarantined, {} cleared (sound again), {} suspect; {} stat-cache \
         and {} git-blob rows dropped so the next import reads those files again",
        r.quarantined.len(),
        r.cleared.len(),
        r.suspects.len(),
        r.stat_cache_rows_dropped,
        r.git_blob_rows_dropped
    )
}

/// A damaged object and what needs it, indented under its `corrupt` / `missing` line.
fn damage_text(d: &Damage) -> String {
    let mut out = format!("{} {}:\n", d.what, d.id);
    if d.needed_by.is_empty() {
        out.push_str("  needed by no snapshot\n");
    }
    for n in &d.needed_by {
        let mut by = Vec::new();
        if !n.refs.is_empty() {
            by.push(format!("ref {}", n.refs.join(", ")));
        }
        if !n.pinned_by.is_empty() {
            by.push(format!("pinned by {}", n.pinned_by.join(", ")));
        }
        let by = match by.is_empty() {
            true => String::new(),
            false => format!(" ({})", by.join("; ")),
        };
        let paths = match n.paths.is_empty() {
            true => "the snapshot itself".to_string(),
            false => format!(
                "{}{}",
                n.paths.join(", "),
                if n.more_paths { ", ..." } else { "" }
            ),
        };
        out.push_str(&format!(
            "  needed by snapshot {}{by}: {paths}\n",
            n.snapshot.short()
        ));
    }
    out.push_str(&format!("  repair: {}\n", d.repair));
    out
}
