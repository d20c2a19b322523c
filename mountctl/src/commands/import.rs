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
    let store = cowspace_store::Store::open(&ctx.root, config)?;
    let mut opts = ImportOptions::new();
    opts.ref_name = args.ref_name.clone();
    opts.message = args.message.clone();
    opts.default_excludes = !args.no_default_excludes;
    opts.excludes = args.exclude.clone();
    opts.allow_devices = args.allow_devices;
    opts.allow_external_symlinks = args.allow_external_symlinks;
    let bar = ctx.progress.then(|| {
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} importing {pos}/{len} files, {msg} [{elapsed}]",
            )
            .expect("valid template"),
        );
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
    // A git checkout's index is made to agree with what workspaces serve, so the first
    // `git status` in a new workspace reads no file.
    opts.served_identity = Some(cowspace_fsd::view::served_identity(&ctx.root)?);
    // And git asks the workspace what changed instead of looking at every file.
    if !args.no_git_fsmonitor {
        match cowspace_fsd::gitfsmonitor::git_reads_the_extension() {
            Ok(()) => {
                opts.git_fsmonitor = Some(cowspace_fsd::gitfsmonitor::hook_command());
                if cowspace_fsd::gitfsmonitor::hook_program().is_none() {
                    ctx.note(&format!(
                        "note: git's fsmonitor hook runs the `mountctl` on PATH (or ${}), and \
                         none is found here: until one is, git in workspaces looks at every \
                         file (docs/git.md)",
                        cowspace_fsd::gitfsmonitor::MOUNTCTL_ENV
                    ));
                }
            }
            Err(why) => ctx.note(&format!(
                "note: git in workspaces will look at every file ({why}; docs/git.md)"
            )),
        }
    }
    let interrupted = on_interrupt(ctx)?;
    let source = &args.source;
    let report = if let Some(rev) = &args.git {
        store.import_git(source, rev, &opts)
    } else if source.is_file() {
        store.import_tar(source, &opts)
    } else {
        store.import_dir(source, &opts)
    };
    interrupted.close();
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let report: ImportReport = report?;
    // Whether the snapshot has any xattr is recorded now, while its trees are fresh, so
    // its first workspace does not walk them to pick its view. A failure only leaves
    // that walk to the first workspace.
    let _ = cowspace_fsd::view::plain::has_xattrs(&store, &report.snapshot);
    for w in &report.warnings {
        ctx.note(&format!("warning: {w}"));
    }
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
                eprintln!("ref {r} -> {}", report.snapshot.short());
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
