//! `mountctl export SNAP|REF DEST [--tar]`; `--tar -` writes the archive on stdout.

use std::path::Path;
use std::process::ExitCode;

use crate::output::Ctx;

pub fn run(ctx: &Ctx, spec: &str, dest: &Path, tar: bool) -> anyhow::Result<ExitCode> {
    if dest == Path::new("-") {
        return to_stdout(ctx, spec, tar);
    }
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

/// `export SNAP --tar -`: the archive is stdout, so nothing else goes there (no JSON
/// object: `--json` is refused); a reader that stops early (`| head`) ends it quietly.
fn to_stdout(ctx: &Ctx, spec: &str, tar: bool) -> anyhow::Result<ExitCode> {
    use cowspace::error::Error;
    if !tar {
        anyhow::bail!(Error::Invalid(
            "export to `-` writes a tar archive on stdout: add --tar (a directory export \
             needs a path)"
                .into()
        ));
    }
    if ctx.json {
        anyhow::bail!(Error::Invalid(
            "export --tar - writes the archive on stdout, where --json would print its \
             object: leave out --json, or give a file name"
                .into()
        ));
    }
    let store = ctx.open()?;
    let id = store.resolve(spec)?;
    if let Err(e) = store.export_tar_to(&id, std::io::stdout().lock(), Path::new("stdout")) {
        let e = anyhow::Error::from(e);
        if crate::output::is_broken_pipe(&e) {
            return Ok(ExitCode::SUCCESS);
        }
        return Err(e);
    }
    ctx.note(&format!("exported {} to stdout", id.short()));
    Ok(ExitCode::SUCCESS)
}
