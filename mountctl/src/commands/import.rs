//! `mountctl import`: a directory, a tar archive or a git revision becomes a snapshot.

use std::process::ExitCode;
use std::sync::Arc;

use cowspace_store::{ImportOptions, ImportReport, Progress};

use crate::cli::ImportArgs;
use crate::output::{Ctx, bytes};

pub fn run(ctx: &Ctx, args: ImportArgs) -> anyhow::Result<ExitCode> {
    let mut config = cowspace_store::StoreConfig::default();
    if let Some(l) = args.zstd_level {
        config.zstd_level = l;
    }
    if let Some(t) = args.threads {
        config.workers = t;
    }
    let mut opts = ImportOptions::new();
    opts.ref_name = args.ref_name.clone();
    opts.message = args.message.clone();
    opts.default_excludes = !args.no_default_excludes;
    opts.excludes = args.exclude.clone();
    opts.allow_devices = args.allow_devices;
    opts.allow_external_symlinks = args.allow_external_symlinks;
    let bar = ctx.progress.then(|| {
        let bar = indicatif::ProgressBar::new(0);
        // A template that does not parse keeps the default style (it is a constant).
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{spinner} importing {pos}/{len} files, {msg} [{elapsed}]",
        ) {
            bar.set_style(style);
        }
        bar
    });
    if let Some(bar) = &bar {
        let bar = bar.clone();
        opts.progress = Some(Arc::new(move |p: Progress| {
            bar.set_length(p.files_total);
            bar.set_position(p.files_done);
            bar.set_message(bytes(p.bytes_done));
        }));
    }
    let interrupted = on_interrupt(ctx)?;
    let imported = cowspace::import::import(
        &ctx.root,
        cowspace::import::ImportRequest {
            source: &args.source,
            git_rev: args.git.as_deref(),
            options: opts,
            config,
            git_fsmonitor: !args.no_git_fsmonitor,
        },
    );
    interrupted.close();
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let imported = imported?;
    for n in &imported.notes {
        ctx.note(n);
    }
    let report: ImportReport = imported.report;
    let value = serde_json::to_value(&report)?;
    ctx.emit(value, || {
        let mut s = format!("{}\n", report.snapshot);
        if !ctx.quiet {
            eprintln!(
                "imported {} files, {} dirs, {} symlinks ({}); read {} files; stored {} new ({} raw) in {:.0} ms{}",
                report.files,
                report.dirs,
                report.symlinks,
                bytes(report.bytes),
                report.files_read,
                bytes(report.new_bytes_stored),
                bytes(report.new_bytes_raw),
                report.elapsed_ms,
                if report.excluded > 0 { format!("; {} paths excluded", report.excluded) } else { String::new() }
            );
            if !report.resumed.is_none() {
                eprintln!(
                    "took over {} chunks ({}) an interrupted import had stored",
                    report.resumed.chunks,
                    bytes(report.resumed.bytes)
                );
            }
            if let Some(r) = &report.ref_name {
                // The ref's old snapshot is the new one's parent: where it was.
                let was = match report.parents.first() {
                    Some(p) if *p == report.snapshot => " (unchanged)".to_string(),
                    Some(p) => format!(" (was {})", p.short()),
                    None => " (a new ref)".to_string(),
                };
                eprintln!("ref {r} -> {}{was}", report.snapshot.short());
            }
        }
        s.truncate(s.len() - 1);
        s
    });
    Ok(ExitCode::SUCCESS)
}

/// An import stopped by signal N exits with this plus N, as shells report it.
const SIGNALLED_EXIT_BASE: i32 = 128;

/// On SIGINT or SIGTERM: says what the import leaves (the packs it wrote so far, which
/// no snapshot names) and exits with 128 + the signal. The store stays as it was
/// before the import.
fn on_interrupt(ctx: &Ctx) -> anyhow::Result<signal_hook::iterator::Handle> {
    use anyhow::Context;
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])
        .context("install signal handlers")?;
    let handle = signals.handle();
    let (root, json) = (ctx.root.clone(), ctx.json);
    std::thread::spawn(move || {
        let Some(signal) = signals.forever().next() else {
            return;
        };
        let left = cowspace_store::Store::open(&root, Default::default())
            .and_then(|s| s.unrecorded_packs())
            .unwrap_or_default();
        let total: u64 = left.iter().map(|(_, n)| n).sum();
        eprintln!(
            "\nmountctl: import interrupted: no snapshot was made and no ref moved; {} pack \
             files ({}) hold what was stored so far, named by no snapshot: the next import \
             takes over their chunks instead of compressing them again, and `mountctl gc` \
             removes what no import took",
            left.len(),
            bytes(total)
        );
        if json {
            println!(
                "{}",
                serde_json::json!({
                    "error": {"kind": "interrupted", "message": "import interrupted"},
                    "unrecorded_packs": left.len(),
                    "unrecorded_bytes": total,
                })
            );
        }
        std::process::exit(SIGNALLED_EXIT_BASE + signal);
    });
    Ok(handle)
}
