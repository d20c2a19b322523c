//! `mountctl gc [--dry-run]`: store garbage, unused checkouts, blob-cache bound.

use std::process::ExitCode;

use cowspace_store::gc::GcReport;

use crate::cli::GcArgs;
use crate::output::{Ctx, bytes};

pub fn run(ctx: &Ctx, args: GcArgs) -> anyhow::Result<ExitCode> {
    let rt = ctx.runtime()?;
    let answer = rt.gc(&cowspace::ops::GcRequest {
        dry_run: args.dry_run,
        grace_secs: args.grace,
        wait: args.wait,
        blob_cache_max: args.blob_cache_max,
    })?;
    let (report, evicted) = (&answer.report, &answer.blob_cache);
    let (checkouts, variants, subvolumes, native) = (
        answer.checkouts_removed,
        answer.blob_variants_removed,
        answer.subvolumes_removed,
        answer.native_lowers_removed,
    );
    let value = answer.to_json();
    ctx.emit(value, || {
        let mut text = if report.dry_run {
            listing(report)
        } else {
            String::new()
        };
        text.push_str(&format!(
            "{}{} snapshots, {} objects ({}), {} packs removed; {} packs rewritten; {} orphan packs removed",
            if report.dry_run { "would remove: " } else { "" },
            report.snapshots_removed.len(),
            report.objects_removed,
            bytes(report.bytes_freed),
            report.packs_removed,
            report.packs_rewritten,
            report.orphan_packs_removed,
        ));
        if !report.dry_run {
            text.push_str(&format!(
                "\n{checkouts} unused checkouts, {native} native lowers, {subvolumes} btrfs base subvolumes and {variants} blob variants removed; blob cache: {} evicted ({}), {} kept as in use, {} now",
                evicted.removed,
                bytes(evicted.bytes_freed),
                evicted.held_skipped,
                bytes(evicted.bytes_after)
            ));
        }
        text
    });
    Ok(ExitCode::SUCCESS)
}

/// One line per snapshot and pack a dry run would remove, with why.
fn listing(report: &GcReport) -> String {
    let mut out = String::new();
    for s in &report.snapshots {
        let message = match s.message.is_empty() {
            true => String::new(),
            false => format!(", {:?}", s.message),
        };
        out.push_str(&format!(
            "snapshot {} ({}{message}): {}\n",
            s.snapshot.short(),
            s.source,
            s.why
        ));
    }
    for p in &report.packs {
        out.push_str(&format!(
            "pack {} {} ({}): {}\n",
            p.pack,
            p.action.replace('_', " "),
            bytes(p.size),
            p.why
        ));
    }
    out
}
