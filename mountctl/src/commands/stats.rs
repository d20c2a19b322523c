//! `mountctl stats`: what is stored and how well it deduplicates and compresses.

use std::process::ExitCode;

use crate::output::{Ctx, bytes};

pub fn run(ctx: &Ctx) -> anyhow::Result<ExitCode> {
    let s = cowspace::ops::stats(&ctx.open()?)?;
    let n = |k: &str| s[k].as_u64().unwrap_or(0);
    let r = |k: &str| s[k].as_f64().unwrap_or(0.0);
    let text = format!(
        "snapshots {}  refs {}  packs {}\nchunks {}  manifests {}  trees {}\nlogical {}  unique {}  stored {}\ndedup {:.2}x  compression {:.2}x  overall {:.2}x",
        n("snapshots"),
        n("refs"),
        n("packs"),
        n("chunks"),
        n("manifests"),
        n("trees"),
        bytes(n("logical_bytes")),
        bytes(n("unique_bytes")),
        bytes(n("stored_bytes")),
        r("dedup_ratio"),
        r("compression_ratio"),
        r("overall_ratio")
    );
    ctx.emit(s, || text);
    Ok(ExitCode::SUCCESS)
}
