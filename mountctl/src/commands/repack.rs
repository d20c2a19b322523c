//! `mountctl repack [--dry-run]`: small and mostly-dead packs rewritten into few.

use std::process::ExitCode;

use cowspace_store::repack::RepackOptions;
use serde_json::json;

use crate::cli::RepackArgs;
use crate::output::{Ctx, bytes};

pub fn run(ctx: &Ctx, args: RepackArgs) -> anyhow::Result<ExitCode> {
    let store = ctx.open()?;
    let r = store.repack(RepackOptions {
        dry_run: args.dry_run,
        wait: args.wait,
    })?;
    for p in &r.kept_damaged {
        ctx.note(&format!(
            "note: pack {p} kept: an object in it does not verify (`mountctl fsck` names it)"
        ));
    }
    ctx.emit(json!(r), || {
        let mut text = String::new();
        if r.dry_run {
            for p in &r.packs {
                text.push_str(&format!(
                    "pack {} would be rewritten ({}): {}\n",
                    p.pack,
                    bytes(p.size),
                    p.why
                ));
            }
            text.push_str(&format!(
                "would rewrite {} of {} packs ({})",
                r.packs.len(),
                r.packs_before,
                bytes(r.bytes_before)
            ));
        } else {
            text.push_str(&format!(
                "{} packs ({}) before, {} ({}) after; {} objects moved",
                r.packs_before,
                bytes(r.bytes_before),
                r.packs_after,
                bytes(r.bytes_after),
                r.objects_moved
            ));
        }
        text
    });
    Ok(ExitCode::SUCCESS)
}
