//! A runtime's view of cowspace, end to end, through the Rust API:
//! import a directory, create a workspace, write in it, diff, commit, remove.
//!
//! ```sh
//! cargo build -p cowspace-fsd -p cowspace --bins --examples   # the daemon, fsd, lands beside it
//! sudo target/debug/examples/workspace /tmp/cowspace-root ./some/dir
//! ```
//! Needs root (the workspace is an overlay mount). Removes the workspace at the end; the
//! runtime root and its snapshots stay.

use std::path::PathBuf;

use cowspace::runtime::{CommitOptions, CreateOptions, Runtime};
use cowspace_store::{ImportOptions, Store, StoreConfig};

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("workspace: {e}");
            if let Some(hint) = e
                .downcast_ref::<cowspace::error::Error>()
                .and_then(|e| e.hint())
            {
                eprintln!("hint: {hint}");
            }
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(root), Some(source)) = (args.next(), args.next()) else {
        eprintln!("usage: workspace ROOT SOURCE_DIR");
        std::process::exit(2);
    };
    let (root, source) = (PathBuf::from(root), PathBuf::from(source));

    // The store: created once per host, then shared by every workspace.
    let store = match Store::open(&root, StoreConfig::default()) {
        Ok(s) => s,
        Err(e) if e.kind() == cowspace_store::ErrorKind::NotFound => {
            Store::init(&root, StoreConfig::default())?
        }
        Err(e) => return Err(e.into()),
    };
    drop(store);
    // Imported as `mountctl import` does it (a git checkout's index agrees with what
    // workspaces serve, and git asks the workspace what changed).
    let imported = cowspace::import::import(
        &root,
        cowspace::import::ImportRequest {
            source: &source,
            git_rev: None,
            options: ImportOptions::new(),
            config: StoreConfig::default(),
            git_fsmonitor: true,
        },
    )?;
    for note in &imported.notes {
        eprintln!("{note}");
    }
    let imported = imported.report;
    println!(
        "imported {} files as {}",
        imported.files,
        imported.snapshot.short()
    );

    // A workspace of it: ready in milliseconds, whatever the size of the tree.
    let rt = Runtime::open(&root)?;
    let ws = rt.create(&CreateOptions {
        snapshot: imported.snapshot.to_hex(),
        worker: Some("example-worker".into()),
        ..Default::default()
    })?;
    println!(
        "workspace {} at {} ({:.1} ms)",
        ws.id,
        ws.path.display(),
        ws.create_ms
    );

    std::fs::write(ws.path.join("NOTES.txt"), "written by the example\n")?;
    for (change, _) in rt.diff(&ws.id)? {
        println!("{} {}", change.change.letter(), change.path);
    }
    let captured = rt.commit(
        &ws.id,
        &CommitOptions {
            message: "example".into(),
            ..Default::default()
        },
    )?;
    println!(
        "captured {} (parent {})",
        captured.snapshot.short(),
        imported.snapshot.short()
    );
    rt.remove(&ws.id, false)?;
    let _ = cowspace::daemon::stop(&root, false);
    println!("removed {}", ws.id);
    Ok(())
}
