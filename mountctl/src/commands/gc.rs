//! `mountctl gc [--dry-run]`.

use std::process::ExitCode;

use cowspace_store::gc::GcOptions;
use serde_json::json;

use crate::cli::GcArgs;
use crate::output::{Ctx, bytes};

pub fn run(ctx: &Ctx, args: GcArgs) -> anyhow::Result<ExitCode> {
    let store = ctx.open()?;
    let report = store.gc(GcOptions {
        dry_run: args.dry_run,
        grace_secs: args.grace,
        wait: args.wait,
    })?;
    ctx.emit(json!(report), || {
        format!(
            "{}{} snapshots, {} objects ({}), {} packs removed; {} packs rewritten; {} orphan packs removed",
            if report.dry_run { "would remove: " } else { "" },
            report.snapshots_removed.len(),
            report.objects_removed,
            bytes(report.bytes_freed),
            report.packs_removed,
            report.packs_rewritten,
            report.orphan_packs_removed
        )
    });
    Ok(ExitCode::SUCCESS)
}
