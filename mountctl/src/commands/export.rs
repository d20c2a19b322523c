//! `mountctl export SNAP|REF DEST [--tar]`.

use std::path::Path;
use std::process::ExitCode;

use crate::output::Ctx;

pub fn run(ctx: &Ctx, spec: &str, dest: &Path, tar: bool) -> anyhow::Result<ExitCode> {
    let store = ctx.open()?;
    let bar = ctx.progress.then(|| {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_message(format!("exporting {spec} to {}", dest.display()));
        bar.enable_steady_tick(std::time::Duration::from_millis(120));
        bar
    });
    let done = cowspace::ops::export(&store, spec, dest, tar);
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let v = done?;
    let text = format!(
        "exported {} to {} in {:.0} ms",
        crate::output::short(&v["snapshot"]),
        dest.display(),
        v["elapsed_ms"].as_f64().unwrap_or(0.0)
    );
    ctx.confirm(v, || text);
    Ok(ExitCode::SUCCESS)
}
