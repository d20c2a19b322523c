//! `mountctl export SNAP|REF DEST [--tar]`.

use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use serde_json::json;

use crate::output::Ctx;

pub fn run(ctx: &Ctx, spec: &str, dest: &Path, tar: bool) -> anyhow::Result<ExitCode> {
    let store = ctx.open()?;
    let id = store.resolve(spec)?;
    let t = Instant::now();
    let bar = ctx.progress.then(|| {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_message(format!("exporting {} to {}", id.short(), dest.display()));
        bar.enable_steady_tick(std::time::Duration::from_millis(120));
        bar
    });
    let done = if tar {
        store.export_tar(&id, dest)
    } else {
        store.export_dir(&id, dest)
    };
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    done?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let d = dest.display().to_string();
    ctx.confirm(
        // `ms`: the old name of `elapsed_ms`, until the release after next.
        json!({"snapshot": id, "dest": d, "tar": tar, "elapsed_ms": ms, "ms": ms}),
        || format!("exported {} to {d} in {ms:.0} ms", id.short()),
    );
    Ok(ExitCode::SUCCESS)
}
