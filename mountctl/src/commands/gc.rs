//! `mountctl gc [--dry-run]`: store garbage, unused checkouts, blob-cache bound.

use std::process::ExitCode;

use cowspace_store::gc::GcOptions;
use serde_json::json;

use crate::cli::GcArgs;
use crate::output::{Ctx, bytes};

pub fn run(ctx: &Ctx, args: GcArgs) -> anyhow::Result<ExitCode> {
    let store = ctx.open()?;
    let rt = ctx.runtime()?;
    // Checkouts nobody uses go first, so eviction sees their blobs as unlinked.
    let (checkouts, variants, subvolumes, native) = if args.dry_run {
        (0, 0, 0, 0)
    } else {
        let (checkouts, variants) = rt.prune_checkouts()?;
        (
            checkouts,
            variants,
            rt.prune_subvolumes()?,
            rt.prune_native()?,
        )
    };
    let report = store.gc(GcOptions {
        dry_run: args.dry_run,
        grace_secs: args.grace,
        wait: args.wait,
    })?;
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
    value["blob_cache"] = json!(evicted);
    ctx.emit(value, || {
        format!(
            "{}{} snapshots, {} objects ({}), {} packs removed; {} packs rewritten; {} orphan packs removed\n\
             {checkouts} unused checkouts, {native} native lowers, {subvolumes} btrfs base subvolumes and {variants} blob variants removed; blob cache: {} evicted ({}), {} kept as in use, {} now",
            if report.dry_run { "would remove: " } else { "" },
            report.snapshots_removed.len(),
            report.objects_removed,
            bytes(report.bytes_freed),
            report.packs_removed,
            report.packs_rewritten,
            report.orphan_packs_removed,
            evicted.removed,
            bytes(evicted.bytes_freed),
            evicted.held_skipped,
            bytes(evicted.bytes_after)
        )
    });
    Ok(ExitCode::SUCCESS)
}
