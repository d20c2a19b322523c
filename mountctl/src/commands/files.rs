//! `mountctl fs ls|stat|cat|write|mkdir|rm|mv|ln WS:PATH` and `mountctl watch WS`: thin
//! calls of the runtime's files API (`cowspace::files`, `cowspace::watch`).

use std::io::{Read, Write};
use std::process::ExitCode;

use anyhow::Context;
use serde_json::json;

use crate::cli::FsCommand;
use crate::output::Ctx;

/// `WS:PATH` (or `WS` alone: its root) split in two.
pub fn split_target(t: &str) -> anyhow::Result<(&str, &str)> {
    match t.split_once(':') {
        Some((ws, p)) if !ws.is_empty() => Ok((ws, if p.is_empty() { "." } else { p })),
        _ if !t.is_empty() && !t.contains('/') => Ok((t, ".")),
        _ => Err(cowspace::error::Error::Invalid(format!(
            "{t:?}: expected WS:PATH (a workspace's id or name, a colon, a path inside it)"
        ))
        .into()),
    }
}

fn line(i: &cowspace::files::FileInfo) -> String {
    let target = i
        .target
        .as_deref()
        .map(|t| format!(" -> {t}"))
        .unwrap_or_default();
    format!(
        "{:<7} {:04o} {:>5}:{:<5} {:>12} {}{}\n",
        i.kind, i.mode, i.uid, i.gid, i.size, i.path, target
    )
}

pub fn run(ctx: &Ctx, c: FsCommand) -> anyhow::Result<ExitCode> {
    let rt = ctx.runtime()?;
    match c {
        FsCommand::Ls { target, recursive } => {
            let (ws, p) = split_target(&target)?;
            let entries = rt.files(ws)?.list(p, recursive)?;
            ctx.emit(json!({"entries": entries}), || {
                entries.iter().map(line).collect()
            });
        }
        FsCommand::Stat { target } => {
            let (ws, p) = split_target(&target)?;
            let i = rt.files(ws)?.stat(p)?;
            ctx.emit(json!(i), || line(&i));
        }
        FsCommand::Cat { target } => {
            let (ws, p) = split_target(&target)?;
            let files = rt.files(ws)?;
            let mut out = std::io::stdout().lock();
            let mut offset = 0u64;
            loop {
                let chunk = files.read(p, offset, Some(CHUNK_BYTES))?;
                if chunk.is_empty() {
                    break;
                }
                offset += chunk.len() as u64;
                if let Err(e) = out.write_all(&chunk) {
                    if e.kind() == std::io::ErrorKind::BrokenPipe {
                        return Ok(ExitCode::SUCCESS);
                    }
                    return Err(e).context("write to stdout");
                }
            }
            out.flush().ok();
        }
        FsCommand::Write {
            target,
            mode,
            append,
        } => {
            let (ws, p) = split_target(&target)?;
            let mut data = Vec::new();
            std::io::stdin()
                .take(cowspace::files::MAX_IO_BYTES + 1)
                .read_to_end(&mut data)
                .context("read stdin")?;
            let i = rt.files(ws)?.write(p, &data, mode, append)?;
            ctx.emit(json!(i), || line(&i));
        }
        FsCommand::Mkdir { target, parents } => {
            let (ws, p) = split_target(&target)?;
            let i = rt.files(ws)?.mkdir(p, parents, None)?;
            ctx.emit(json!(i), || line(&i));
        }
        FsCommand::Rm { target, recursive } => {
            let (ws, p) = split_target(&target)?;
            rt.files(ws)?.remove(p, recursive)?;
            ctx.confirm(json!({"removed": p, "workspace": ws}), || {
                format!("removed {target}")
            });
        }
        FsCommand::Mv { from, to } => {
            let (ws, p) = split_target(&from)?;
            let to = match to.split_once(':') {
                Some((w, t)) if w == ws => t.to_string(),
                Some((w, _)) => {
                    return Err(cowspace::error::Error::Invalid(format!(
                        "mv within one workspace only ({ws} to {w}): use `mountctl cp` between workspaces"
                    ))
                    .into());
                }
                None => to,
            };
            let i = rt.files(ws)?.rename(p, &to)?;
            ctx.emit(json!(i), || line(&i));
        }
        FsCommand::Ln {
            link_target,
            target,
        } => {
            let (ws, p) = split_target(&target)?;
            let i = rt.files(ws)?.symlink(p, &link_target)?;
            ctx.emit(json!(i), || line(&i));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// How much one read of `cat` and `cp` moves.
pub const CHUNK_BYTES: u64 = 8 << 20;

/// `mountctl watch WS [PATH]`: events until interrupted or the workspace goes.
pub fn watch(ctx: &Ctx, ws: &str, path: &str) -> anyhow::Result<ExitCode> {
    let rt = ctx.runtime()?;
    let files = rt.files(ws)?;
    let mut w = cowspace::watch::Watcher::new(files, path)?;
    ctx.note(&format!("watching {ws}:{path} (Ctrl-C ends)"));
    loop {
        match w.next(std::time::Duration::from_secs(1))? {
            cowspace::watch::Next::Ended => {
                ctx.note("the workspace is gone");
                return Ok(ExitCode::SUCCESS);
            }
            cowspace::watch::Next::Events(evs) => {
                let mut out = std::io::stdout().lock();
                for e in evs {
                    let r = if ctx.json {
                        writeln!(out, "{}", json!(e))
                    } else {
                        match &e.from {
                            Some(f) => writeln!(out, "{} {} <- {}", e.event, e.path, f),
                            None => writeln!(out, "{} {}", e.event, e.path),
                        }
                    };
                    if r.is_err() {
                        return Ok(ExitCode::SUCCESS);
                    }
                }
                let _ = out.flush();
            }
        }
    }
}
