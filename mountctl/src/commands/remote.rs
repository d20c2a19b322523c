//! `mountctl remote add|list|remove|gc`, `push`, `pull`, `fetch`.

use std::process::ExitCode;

use cowspace::remote;

use crate::cli::RemoteCommand;
use crate::output::{Ctx, bytes};

pub fn run(ctx: &Ctx, c: RemoteCommand) -> anyhow::Result<ExitCode> {
    let store = ctx.open()?;
    match c {
        RemoteCommand::Add {
            name,
            url,
            endpoint,
            region,
        } => {
            let r = remote::add(&store, &name, &url, endpoint.as_deref(), region.as_deref())?;
            let v = serde_json::to_value(&r)?;
            ctx.emit(v, || {
                format!(
                    "added remote {} ({}{}){}",
                    r.name,
                    r.url,
                    r.endpoint
                        .as_deref()
                        .map(|e| format!(" at {e}"))
                        .unwrap_or_default(),
                    if r.default { ", the default" } else { "" }
                )
            });
        }
        RemoteCommand::List => {
            let v = remote::list_json(&store)?;
            let text: String = v
                .as_array()
                .into_iter()
                .flatten()
                .map(|r| {
                    format!(
                        "{}{}\t{}\t{}\tfetched {} objects ({}) in {} requests\n",
                        r["name"].as_str().unwrap_or_default(),
                        if r["default"] == true {
                            " (default)"
                        } else {
                            ""
                        },
                        r["url"].as_str().unwrap_or_default(),
                        r["endpoint"].as_str().unwrap_or("-"),
                        r["fetched"]["objects"],
                        bytes(r["fetched"]["bytes"].as_u64().unwrap_or(0)),
                        r["fetched"]["requests"]
                    )
                })
                .collect();
            ctx.emit(v, || text);
        }
        RemoteCommand::Remove { name } => {
            store.remove_remote(&name)?;
            ctx.emit(serde_json::json!({"removed": name}), || {
                format!("removed remote {name}")
            });
        }
        RemoteCommand::Gc {
            name,
            dry_run,
            grace,
        } => {
            let r = remote::gc::gc(&store, name.as_deref(), dry_run, Some(grace))?;
            let v = serde_json::to_value(&r)?;
            ctx.emit(v, || {
                format!(
                    "remote {}: {} refs, {} pins keep {} snapshots; {} of {} packs and indexes unreachable; {}{} objects ({}) deleted; {} newly marked (deleted by a gc {} s or more from now if still unreachable)",
                    r.remote,
                    r.refs,
                    r.pins,
                    r.roots.len(),
                    r.unreachable.len(),
                    r.packs + r.indexes,
                    if r.dry_run { "would have " } else { "" },
                    r.deleted.len(),
                    bytes(r.bytes_deleted),
                    r.marked,
                    r.grace_secs
                )
            });
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn push(
    ctx: &Ctx,
    spec: &str,
    remote_name: Option<&str>,
    force: bool,
) -> anyhow::Result<ExitCode> {
    let store = ctx.open()?;
    let r = remote::push(&store, remote_name, spec, force)?;
    let v = serde_json::to_value(&r)?;
    ctx.emit(v, || {
        format!(
            "pushed {} to {}{}: {} chunks in {} packs ({}) uploaded, {} already there; index {} ({:.0} ms)",
            &r.snapshot[..12],
            r.remote,
            match (&r.ref_name, r.ref_moved) {
                (Some(n), true) => format!(", ref {n} moved"),
                (Some(n), false) => format!(", ref {n} already there"),
                (None, _) => String::new(),
            },
            r.chunks_uploaded,
            r.packs_uploaded,
            bytes(r.bytes_uploaded),
            r.chunks_reused,
            bytes(r.index_bytes),
            r.ms
        )
    });
    Ok(ExitCode::SUCCESS)
}

pub fn pull(ctx: &Ctx, spec: &str, remote_name: Option<&str>) -> anyhow::Result<ExitCode> {
    let store = ctx.open()?;
    let r = remote::pull(&store, remote_name, spec)?;
    let v = serde_json::to_value(&r)?;
    ctx.emit(v, || {
        format!(
            "pulled {} from {}{}: {} objects ({}) fetched in {} requests ({:.0} ms)",
            &r.snapshot[..12],
            r.remote,
            r.ref_name
                .as_deref()
                .map(|n| format!(", ref {n}"))
                .unwrap_or_default(),
            r.fetched.objects,
            bytes(r.fetched.bytes),
            r.fetched.requests,
            r.ms
        )
    });
    Ok(ExitCode::SUCCESS)
}

pub fn fetch(ctx: &Ctx, remote_name: Option<&str>) -> anyhow::Result<ExitCode> {
    let store = ctx.open()?;
    let refs = remote::fetch(&store, remote_name)?;
    let v = serde_json::to_value(&refs)?;
    ctx.emit(v, || {
        refs.iter()
            .map(|r| {
                format!(
                    "{}\t{}{}\n",
                    r.local,
                    &r.snapshot[..12],
                    if r.partial {
                        "\t(file contents on the remote)"
                    } else {
                        ""
                    }
                )
            })
            .collect()
    });
    Ok(ExitCode::SUCCESS)
}
