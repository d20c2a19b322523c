//! Workspace commands: `create`, `list`, `status`, `diff WS`, `commit`, `remove`, `sweep`,
//! `recover`, `config`, `fork`. Thin: each is one call of the `cowspace` runtime API.

use std::process::ExitCode;

use cowspace::protocol::{ListArgs, Request, WorkspaceArg};
use cowspace::registry::Record;
use cowspace::runtime::{CommitOptions, CreateOptions};
use serde_json::json;

use crate::cli::CreateArgs;
use crate::output::{Ctx, bytes};

fn line(r: &Record) -> String {
    format!(
        "{}  {:<16} {:<8} {:<9} {}  {}",
        r.id,
        r.name.as_deref().unwrap_or("-"),
        r.materializer,
        r.status.as_str(),
        &r.snapshot[..12],
        r.path.display()
    )
}

/// A workspace's record for people (`status` without `--json`).
fn describe(r: &Record) -> String {
    let mut s = format!(
        "workspace    {}\nname         {}\nstatus       {}\npath         {}\n\
         materializer {} (lower: {}, {})\nsnapshot     {}\ncreated      {}, in {:.1} ms\n",
        r.id,
        r.name.as_deref().unwrap_or("-"),
        r.status.as_str(),
        r.path.display(),
        r.materializer,
        r.lower_kind,
        r.lower.display(),
        r.snapshot,
        crate::output::date_ago(r.created_at),
        r.create_ms,
    );
    if let Some(w) = &r.worker {
        s.push_str(&format!("worker       {w}\n"));
    }
    if let Some(p) = &r.parent {
        s.push_str(&format!("forked from  {p}\n"));
    }
    if let Some(d) = &r.disk {
        s.push_str(&format!(
            "disk         {} used of {} (quota)\n",
            bytes(d.used_bytes),
            bytes(d.limit_bytes)
        ));
    }
    if let Some(last) = r.commits.last() {
        s.push_str(&format!("commits      {} (last {last})\n", r.commits.len()));
    }
    if r.sandbox.is_some() {
        s.push_str("sandbox      running (mountctl sandbox status for more)\n");
    }
    for d in &r.diagnostics {
        s.push_str(&format!("diagnostic   {d}\n"));
    }
    s
}

/// Asks the root's daemon, when one answers from this mount namespace, so this process
/// opens no database: the answer is the one the runtime here would give.
fn through_daemon(ctx: &Ctx, req: &Request) -> anyhow::Result<Option<serde_json::Value>> {
    Ok(cowspace::daemon::ask(&ctx.root, req)?)
}

/// A create's options as the daemon and the runtime take them.
fn create_options(ctx: &Ctx, a: &CreateArgs) -> anyhow::Result<CreateOptions> {
    // The daemon's working directory is not this one.
    let path = match &a.path {
        Some(p) if p.is_relative() => Some(std::env::current_dir()?.join(p)),
        p => p.clone(),
    };
    Ok(CreateOptions {
        snapshot: a.snapshot.clone().unwrap_or_default(),
        name: a.name.clone(),
        materializer: Some(
            ctx.config
                .materializer(a.materializer.clone())
                .value
                .parse()?,
        ),
        lower: Some(ctx.config.lower(a.lower.clone()).value.parse()?),
        path,
        worker: a.worker.clone(),
        disk: ctx.config.disk(a.disk.clone()).map(|s| s.value),
        inodes: a.inodes,
    })
}

/// `create` through the root's daemon: `None` when no daemon answers (nothing was sent
/// then), or when the create is one made here.
pub fn create_through_daemon(ctx: &Ctx, a: &CreateArgs) -> anyhow::Result<Option<ExitCode>> {
    if a.from_git.is_some() {
        return Ok(None);
    }
    let opts = create_options(ctx, a)?;
    // (A path that is not UTF-8 cannot travel in JSON: such a create is made here.)
    if opts.path.as_ref().is_some_and(|p| p.to_str().is_none()) {
        return Ok(None);
    }
    let Some(v) = through_daemon(ctx, &Request::Create(opts))? else {
        return Ok(None);
    };
    let text = format!(
        "{} {}",
        v["id"].as_str().unwrap_or_default(),
        v["path"].as_str().unwrap_or_default()
    );
    ctx.emit(v, || text);
    Ok(Some(ExitCode::SUCCESS))
}

pub fn create(ctx: &Ctx, a: CreateArgs) -> anyhow::Result<ExitCode> {
    if let Some(code) = create_through_daemon(ctx, &a)? {
        return Ok(code);
    }
    let opts = create_options(ctx, &a)?;
    let rt = ctx.runtime()?;
    let rec = match &a.from_git {
        Some(dir) => rt.create_from_git(dir, cowspace::fromgit::Dirty::parse(&a.dirty)?, &opts)?,
        None => rt.create(&opts)?,
    };
    ctx.emit(rec.created_json(), || {
        format!("{} {}", rec.id, rec.path.display())
    });
    Ok(ExitCode::SUCCESS)
}

fn print_list(ctx: &Ctx, recs: &[Record]) -> ExitCode {
    ctx.emit(json!(recs), || {
        recs.iter().map(|r| line(r) + "\n").collect()
    });
    ExitCode::SUCCESS
}

/// `list` through the root's daemon: `None` when no daemon answers.
pub fn list_through_daemon(ctx: &Ctx, all: bool) -> anyhow::Result<Option<ExitCode>> {
    let Some(v) = through_daemon(ctx, &Request::List(ListArgs { all }))? else {
        return Ok(None);
    };
    let recs: Vec<Record> = serde_json::from_value(v)?;
    Ok(Some(print_list(ctx, &recs)))
}

pub fn list(ctx: &Ctx, all: bool) -> anyhow::Result<ExitCode> {
    if let Some(code) = list_through_daemon(ctx, all)? {
        return Ok(code);
    }
    Ok(print_list(ctx, &ctx.runtime()?.list(all)?))
}

fn print_status(ctx: &Ctx, r: &Record) -> ExitCode {
    // `--json` is the record, the same as the socket's `status` (`diff WS SNAP` lists
    // the changes); people are told what changed since the last commit.
    ctx.emit(json!(r), || describe(r) + &changes_line(ctx, r));
    ExitCode::SUCCESS
}

/// What changed since the last commit (or the base), for `status` without `--json`:
/// read from the workspace's private state, so it costs what changed. A workspace that
/// cannot say (being made or removed, its state unreadable) gets no line, and why on
/// stderr.
fn changes_line(ctx: &Ctx, r: &Record) -> String {
    if !matches!(
        r.status,
        cowspace::registry::Status::Active | cowspace::registry::Status::Stopped
    ) {
        return String::new();
    }
    match ctx.runtime().and_then(|rt| Ok(rt.uncommitted(&r.id)?)) {
        Ok(u) => {
            let since = if u.committed {
                "its last commit"
            } else {
                "its base (never committed)"
            };
            format!(
                "changes      {} {} since {since} {} (`mountctl diff {} {}` lists them)\n",
                u.paths,
                if u.paths == 1 { "path" } else { "paths" },
                &u.since[..12],
                r.id,
                &u.since[..12],
            )
        }
        Err(e) => {
            if !ctx.quiet {
                eprintln!(
                    "mountctl: what changed in {} since its last commit: {e:#}",
                    r.id
                );
            }
            String::new()
        }
    }
}

/// `status` through the root's daemon: `None` when no daemon answers.
pub fn status_through_daemon(ctx: &Ctx, ws: &str) -> anyhow::Result<Option<ExitCode>> {
    let Some(v) = through_daemon(
        ctx,
        &Request::Status(WorkspaceArg {
            workspace: ws.to_string(),
        }),
    )?
    else {
        return Ok(None);
    };
    let r: Record = serde_json::from_value(v)?;
    Ok(Some(print_status(ctx, &r)))
}

pub fn status(ctx: &Ctx, ws: &str) -> anyhow::Result<ExitCode> {
    if let Some(code) = status_through_daemon(ctx, ws)? {
        return Ok(code);
    }
    Ok(print_status(ctx, &ctx.runtime()?.status(ws)?))
}

/// `diff WS [SNAP]`: the changes of workspace `ws` against its base, or from `against`
/// (a snapshot or ref) to what it shows.
pub fn diff(
    ctx: &Ctx,
    ws: &str,
    against: Option<&str>,
    patch: bool,
    include_excluded: bool,
) -> anyhow::Result<ExitCode> {
    let rt = ctx.runtime()?;
    let found = match against {
        Some(snap) => rt.diff_against(ws, snap, include_excluded),
        None => rt.diff_with(ws, include_excluded),
    };
    // A ref or snapshot alone is not a workspace: say how to compare snapshots.
    let changes = match found {
        Ok(c) => c,
        Err(e @ cowspace::error::Error::NoWorkspace(_)) => {
            return Err(anyhow::Error::new(e).context("diff with one argument compares a workspace with its base; give two snapshots or refs to compare them"));
        }
        Err(e) => return Err(e.into()),
    };
    let text = if patch {
        Some(cowspace::upper::patch(rt.store(), &changes)?)
    } else {
        None
    };
    let list: Vec<_> = changes.iter().map(|(c, _)| c).collect();
    // The workspace by its id, whatever name it was given by.
    let id = rt.status(ws)?.id;
    let mut value = json!({"workspace": id, "changes": list, "patch": text});
    if let Some(snap) = against {
        value["from"] = json!(rt.store().resolve(snap)?);
    }
    ctx.emit(value, || match &text {
        Some(p) => p.clone(),
        None => list
            .iter()
            .map(|c| format!("{} {}\n", c.change.letter(), c.display_path()))
            .collect(),
    });
    Ok(ExitCode::SUCCESS)
}

pub fn commit(ctx: &Ctx, ws: &str, o: &CommitOptions) -> anyhow::Result<ExitCode> {
    let rt = ctx.runtime()?;
    let r = rt.commit(ws, o)?;
    if r.unchanged {
        if !ctx.quiet && !ctx.json {
            eprintln!(
                "nothing to commit: {ws} is as {} left it (--allow-empty makes a snapshot anyway)",
                r.snapshot.short()
            );
        }
    } else if !ctx.quiet && !ctx.json {
        eprintln!(
            "captured {} files ({}) read, {} new stored, in {:.1} ms",
            r.files_read,
            bytes(r.new_bytes_raw),
            bytes(r.new_bytes_stored),
            r.elapsed_ms
        );
    }
    let grace = cowspace_store::gc::DEFAULT_GC_GRACE_SECS;
    let referenced = r.ref_name.is_some();
    if !referenced && !ctx.quiet && !ctx.json {
        eprintln!("{}", unreferenced_note(&r, grace));
    }
    if r.excluded > 0 && !ctx.quiet && !ctx.json {
        eprintln!(
            "note: {} new paths the base's exclusion policy leaves out were not captured \
             (--include-excluded captures them)",
            r.excluded
        );
    }
    ctx.emit(cowspace::runtime::commit_json(&r), || r.snapshot.to_hex());
    Ok(ExitCode::SUCCESS)
}

/// How long a commit without a ref lives.
fn unreferenced_note(r: &cowspace_store::ImportReport, grace: i64) -> String {
    let id = r.snapshot.short();
    let kept = match &r.pinned_by {
        Some(ws) => format!("kept while workspace {ws} exists, then "),
        None => String::new(),
    };
    format!(
        "snapshot {id} has no ref: {kept}removed by the first gc once it is older than {} \
         (gc's default grace); `mountctl ref set NAME {id}` keeps it",
        cowspace_store::gc::age(grace)
    )
}

fn print_removed(ctx: &Ctx, r: &Record, t: std::time::Instant) -> ExitCode {
    let ms = t.elapsed().as_secs_f64() * 1e3;
    ctx.confirm(r.removed_json(ms), || {
        format!("removed {} in {ms:.1} ms", r.id)
    });
    ExitCode::SUCCESS
}

/// `remove` through the root's daemon: `None` when no daemon answers (or none that can).
/// The teardown of a used mount then does not hold up this command.
pub fn remove_through_daemon(ctx: &Ctx, ws: &str, force: bool) -> anyhow::Result<Option<ExitCode>> {
    let t = std::time::Instant::now();
    let Some(r) = cowspace::daemon::remove(&ctx.root, ws, force)? else {
        return Ok(None);
    };
    Ok(Some(print_removed(ctx, &r, t)))
}

pub fn remove(ctx: &Ctx, ws: &str, force: bool) -> anyhow::Result<ExitCode> {
    let t = std::time::Instant::now();
    if let Some(code) = remove_through_daemon(ctx, ws, force)? {
        return Ok(code);
    }
    let r = ctx.runtime()?.remove(ws, force)?;
    Ok(print_removed(ctx, &r, t))
}

pub fn sweep(ctx: &Ctx) -> anyhow::Result<ExitCode> {
    let rt = ctx.runtime()?;
    let r = rt.sweep()?;
    ctx.emit(json!(r), || {
        format!(
            "{} stopped, {} interrupted operations finished, {} still being created, {} still being removed, {} leftovers removed, {} dead sandboxes cleared",
            r.stopped.len(),
            r.finished.len(),
            r.creating.len(),
            r.removing.len(),
            r.leftovers_removed.len(),
            r.sandboxes_cleared.len()
        )
    });
    Ok(ExitCode::SUCCESS)
}

pub fn recover(ctx: &Ctx, ws: &str) -> anyhow::Result<ExitCode> {
    let rt = ctx.runtime()?;
    let (r, recovered) = rt.recover_report(ws)?;
    let mut v = json!(r);
    v["recovered"] = json!(recovered);
    ctx.emit(v, || {
        if recovered {
            format!("recovered {} at {}", r.id, r.path.display())
        } else {
            format!(
                "nothing to recover: {} is active and mounted at {}",
                r.id,
                r.path.display()
            )
        }
    });
    Ok(ExitCode::SUCCESS)
}

pub fn config(ctx: &Ctx) -> anyhow::Result<ExitCode> {
    let v = ctx.config.effective(ctx.root_flag.clone());
    let mut text = String::new();
    for s in v["settings"].as_array().into_iter().flatten() {
        let value = match &s["value"] {
            serde_json::Value::Null => s["default"].as_str().unwrap_or("-").to_string(),
            serde_json::Value::String(t) => t.clone(),
            other => other.to_string(),
        };
        text.push_str(&format!(
            "{:<20} {:<40} {}\n",
            s["key"].as_str().unwrap_or_default(),
            value,
            s["from"].as_str().unwrap_or_default()
        ));
    }
    let searched = crate::output::strs(&v["files_searched"]).join(", ");
    let read = crate::output::strs(&v["files_read"]);
    text.push_str(&format!(
        "files: {} (looked for: {searched})",
        if read.is_empty() {
            "none".to_string()
        } else {
            read.join(", ")
        }
    ));
    ctx.emit(v, || text);
    Ok(ExitCode::SUCCESS)
}

/// `mountctl fork WS`: the new workspaces, one line each.
pub fn fork(ctx: &Ctx, ws: &str, o: &cowspace::runtime::ForkOptions) -> anyhow::Result<ExitCode> {
    let v = ctx.runtime()?.fork(ws, o)?;
    ctx.emit(v.clone(), || {
        let mut s = String::new();
        for f in v["forks"].as_array().into_iter().flatten() {
            s.push_str(&format!(
                "{} {}\n",
                f["id"].as_str().unwrap_or(""),
                f["path"].as_str().unwrap_or("")
            ));
        }
        if v["frozen_ms"].as_f64().is_some_and(|ms| ms > 0.0) {
            s.push_str(&format!(
                "(the sandbox of {ws} was frozen {:.1} ms)\n",
                v["frozen_ms"].as_f64().unwrap_or(0.0)
            ));
        }
        s
    });
    Ok(ExitCode::SUCCESS)
}
