//! `mountctl fsck`: exit 8 with a list when anything is corrupt or missing.

use std::process::ExitCode;

use cowspace_store::ErrorKind;
use serde_json::json;

use crate::output::{Ctx, bytes, report_error_with};

pub fn run(ctx: &Ctx) -> anyhow::Result<ExitCode> {
    let store = ctx.open()?;
    let report = store.fsck()?;
    for p in &report.orphan_packs {
        ctx.note(&format!(
            "note: orphan pack {p} (left by an interrupted write; gc removes it)"
        ));
    }
    if report.is_clean() {
        ctx.emit(json!({"ok": true, "report": report}), || {
            format!(
                "ok: {} objects ({}) in {} packs verified",
                report.objects_checked,
                bytes(report.bytes_checked),
                report.packs_checked
            )
        });
        return Ok(ExitCode::SUCCESS);
    }
    if !ctx.json {
        for p in report.corrupt.iter() {
            println!("corrupt {} {}: {}", p.what, p.id, p.why);
        }
        for p in report.missing.iter() {
            println!("missing {} {}: {}", p.what, p.id, p.why);
        }
    }
    let n = report.corrupt.len() + report.missing.len();
    let message = format!(
        "{} corrupt and {} missing objects",
        report.corrupt.len(),
        report.missing.len()
    );
    let _ = n;
    Ok(report_error_with(
        ctx,
        ErrorKind::Corrupt,
        &message,
        Some(
            "re-import the affected sources; snapshots whose objects are damaged cannot be exported",
        ),
        json!({"ok": false, "report": report}),
    ))
}
