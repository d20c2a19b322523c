//! `mountctl stats`: what is stored and how well it deduplicates and compresses.

use std::process::ExitCode;

use serde_json::json;

use crate::output::{Ctx, bytes};

pub fn run(ctx: &Ctx) -> anyhow::Result<ExitCode> {
    let store = ctx.open()?;
    let s = store.stats()?;
    ctx.emit(json!(s), || {
        format!(
            "snapshots {}  refs {}  packs {}\nchunks {}  manifests {}  trees {}\nlogical {}  unique {}  stored {}\ndedup {:.2}x  compression {:.2}x  overall {:.2}x",
            s.snapshots,
            s.refs,
            s.packs,
            s.chunks,
            s.manifests,
            s.trees,
            bytes(s.logical_bytes),
            bytes(s.unique_bytes),
            bytes(s.stored_bytes),
            s.dedup_ratio,
            s.compression_ratio,
            s.overall_ratio
        )
    });
    Ok(ExitCode::SUCCESS)
}
