//! `mountctl gc [--dry-run]`: store garbage, unused checkouts, blob-cache bound.

use std::process::ExitCode;

use cowspace_store::gc::{GcOptions, GcReport};
use serde_json::json;

use crate::cli::GcArgs;
use crate::output::{Ctx, bytes};

pub fn run(ctx: &Ctx, args: GcArgs) -> anyhow::Result<ExitCode> {
    let store = ctx.open()?;
    let rt = ctx.runtime()?;
    // Checkouts nobody uses go first, so eviction sees their blobs as unlinked.
    let (checkouts, variants, subvolumes, native, released) = if args.dry_run {
        (0, 0, 0, 0, 0)
    } else {
        let (checkouts, variants) = rt.prune_checkouts()?;
        (
            checkouts,
            variants,
            rt.prune_subvolumes()?,
            rt.prune_native()?,
            rt.release_ended_pins()?,
        )
    };
    // What live workspaces were made from or committed stays, pinned or not.
    let held = rt.held_snapshots()?;
    let report = store.gc_holding(
        GcOptions {
            dry_run: args.dry_run,
            grace_secs: args.grace,
            wait: args.wait,
        },
        &held,
    )?;
    let evicted = if args.dry_run {
        Default::default()
    } else {
        rt.evict_blobs(args.blob_cache_max)?
    };
    let mut value = json!(report);
    value["checkouts_removed"] = json!(checkouts);
    value["blob_variants_removed"] = json!(variants);
    value["subvolumes_removed"] = json!(subvolumes);
    value["native_lowers_removed"] = json!(native);
    value["ended_workspace_pins_released"] = json!(released);
    value["blob_cache"] = json!(evicted);
    ctx.emit(value, || {
        let mut text = if report.dry_run {
            listing(&report)
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
