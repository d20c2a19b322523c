//! `mountctl sandbox start|stop|status|list|pause|resume|suspend`: long-lived sandboxes. Thin: each is one call
//! of the runtime API (`cowspace::sandbox`).

use std::process::ExitCode;

use cowspace::sandbox::SandboxOptions;
use serde_json::{Value, json};

use crate::cli::{SandboxCommand, StartArgs};
use crate::output::Ctx;

pub fn run(ctx: &Ctx, c: SandboxCommand) -> anyhow::Result<ExitCode> {
    let rt = ctx.runtime()?;
    match c {
        SandboxCommand::Start(a) => start(ctx, &rt, *a),
        SandboxCommand::Stop { workspace } => {
            let v = rt.sandbox_stop(&workspace)?;
            let ws = v["workspace"].as_str().unwrap_or("").to_string();
            stale_host_processes(ctx, &ws, &v["host_processes"]);
            ctx.confirm(v.clone(), || {
                if v["was_running"] == false {
                    format!("no sandbox was running for {ws}: nothing to stop")
                } else {
                    format!("stopped the sandbox of {ws}")
                }
            });
            Ok(ExitCode::SUCCESS)
        }
        SandboxCommand::Status { workspace } => {
            let v = rt.sandbox_status(&workspace)?;
            ctx.emit(v.clone(), || describe(&v));
            Ok(ExitCode::SUCCESS)
        }
        SandboxCommand::Policy(a) => {
            let update = cowspace::sandbox::PolicyUpdate {
                allow_host: a.allow_host,
                deny_host: a.deny_host,
                remove_host: a.remove_host,
                reset: a.reset,
                inject: a.inject,
                remove_inject: a.remove_inject,
            };
            let v = rt.sandbox_policy(&a.workspace, &update)?;
            ctx.emit(v.clone(), || policy_text(&v["policy"]));
            Ok(ExitCode::SUCCESS)
        }
        SandboxCommand::Log {
            workspace,
            follow,
            tail,
        } => log(ctx, &rt, &workspace, follow, tail),
        SandboxCommand::Publish { workspace, port } => {
            let v = rt.sandbox_publish(&workspace, port)?;
            ctx.emit(v.clone(), || {
                format!("published {port} -> 127.0.0.1:{}\n", v["host_port"])
            });
            Ok(ExitCode::SUCCESS)
        }
        SandboxCommand::Pause { workspace } => {
            let v = rt.sandbox_pause(&workspace)?;
            ctx.confirm(v.clone(), || {
                format!(
                    "paused the sandbox of {} (in {:.1} ms)",
                    v["workspace"].as_str().unwrap_or(""),
                    v["elapsed_ms"].as_f64().unwrap_or(0.0)
                )
            });
            Ok(ExitCode::SUCCESS)
        }
        SandboxCommand::Resume { workspace } => {
            let v = rt.sandbox_resume(&workspace)?;
            ctx.confirm(v.clone(), || {
                format!(
                    "resumed the sandbox of {} after {:.1} s paused (in {:.1} ms)",
                    v["workspace"].as_str().unwrap_or(""),
                    v["paused_ms"].as_f64().unwrap_or(0.0) / 1e3,
                    v["elapsed_ms"].as_f64().unwrap_or(0.0)
                )
            });
            Ok(ExitCode::SUCCESS)
        }
        SandboxCommand::Suspend { workspace } => {
            let v = rt.sandbox_suspend(&workspace)?;
            ctx.confirm(v.clone(), || "suspended".to_string());
            Ok(ExitCode::SUCCESS)
        }
        SandboxCommand::Unpublish { workspace, port } => {
            let v = rt.sandbox_unpublish(&workspace, port)?;
            ctx.confirm(v.clone(), || {
                format!("unpublished {port} (was 127.0.0.1:{})", v["host_port"])
            });
            Ok(ExitCode::SUCCESS)
        }
        SandboxCommand::List => {
            let all = rt.sandbox_list()?;
            ctx.emit(json!({ "sandboxes": all }), || {
                all.iter()
                    .map(|v| {
                        format!(
                            "{}  {:<16} {:<10} init {:<8} {} process(es)  ports {}\n",
                            v["workspace"].as_str().unwrap_or("-"),
                            v["name"].as_str().unwrap_or("-"),
                            v["state"].as_str().unwrap_or("-"),
                            v["init_pid"],
                            // A VM's processes are the guest's: the host does not count them.
                            v["processes"]
                                .as_u64()
                                .map_or_else(|| "-".to_string(), |n| n.to_string()),
                            ports(&v["ports"]),
                        )
                    })
                    .collect()
            });
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Says which host processes still hold the stopped sandbox's mount of the workspace
/// (they entered it while the sandbox ran) and what to do about them.
fn stale_host_processes(ctx: &Ctx, ws: &str, list: &Value) {
    let Some(list) = list.as_array().filter(|l| !l.is_empty()) else {
        return;
    };
    let named: Vec<String> = list
        .iter()
        .map(|p| match p["command"].as_str() {
            Some(c) => format!("{} ({c})", p["pid"]),
            None => p["pid"].to_string(),
        })
        .collect();
    ctx.note(&format!(
        "mountctl: host processes that entered {ws} while its sandbox ran still use the \
         sandbox's mount, which the stop detached: {}. They do not see files written from \
         now on, and their new files fail (EOVERFLOW): `cd` out and back in (a shell), or \
         restart them (an editor, a file watcher)",
        named.join(", ")
    ));
}

fn ports(p: &Value) -> String {
    let Some(m) = p.as_object().filter(|m| !m.is_empty()) else {
        return "-".into();
    };
    m.iter()
        .map(|(k, v)| format!("{k}->127.0.0.1:{v}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn describe(v: &Value) -> String {
    // Text, never a JSON fragment: a string as it is, a count as a number, a missing
    // value as `-`; `--json` has every field as the keeper gave it.
    let text = |k: &str| match &v[k] {
        Value::Null => "-".to_string(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let mut out = String::new();
    let mut line = |label: &str, value: String| {
        out.push_str(&format!("{label:<13}{value}\n"));
    };
    line("workspace", text("workspace"));
    line("name", text("name"));
    let mut state = text("state");
    if let Some(at) = v["paused_at"].as_i64() {
        state.push_str(&format!(" since {}", crate::output::date(at)));
        if let Some(by) = v["paused_by"].as_str() {
            state.push_str(&format!(" (by {by})"));
        }
    }
    line("state", state);
    if let Some(ms) = v["idle_timeout_ms"].as_u64() {
        line("idle timeout", format!("{:.0} s", ms as f64 / 1e3));
    }
    let mut provider = text("provider");
    if let Some(a) = v["accel"].as_str() {
        provider.push_str(&format!(" ({a})"));
    }
    line("provider", provider);
    let mut isolation = text("isolation");
    if let Some(r) = v["reason"].as_str() {
        isolation.push_str(&format!(": {r}"));
    }
    line("isolation", isolation);
    if let Some(at) = v["started_at"].as_i64() {
        line("started", crate::output::date_ago(at));
    } else if let Some(s) = v["uptime_s"].as_u64() {
        line("uptime", format!("{s} s"));
    }
    line("init pid", text("init_pid"));
    if !v["host_uid_base"].is_null() {
        line("host uids", format!("from {}", text("host_uid_base")));
    }
    line("net", text("net"));
    line("limits", limits_text(&v["limits"]));
    line("processes", text("processes"));
    line(
        "memory used",
        v["memory_bytes"]
            .as_u64()
            .map_or_else(|| "-".to_string(), crate::output::bytes),
    );
    line("oom kills", text("oom_kills"));
    line("execs", format!("{} running", text("execs_running")));
    if !v["host_mount"].is_null() {
        line("host mount", text("host_mount"));
    }
    line("ports", ports(&v["ports"]));
    let e = &v["egress"];
    if !e.is_null() {
        out.push_str(&format!(
            "{:<13}{}",
            "egress",
            e["state"].as_str().unwrap_or("-")
        ));
        if let Some(r) = e["reason"].as_str() {
            out.push_str(&format!(" ({r})"));
        }
        out.push('\n');
        out.push_str(&policy_text(&e["policy"]));
        if let Some(hosts) = e["stats"]["hosts"].as_object() {
            for (host, c) in hosts {
                out.push_str(&format!(
                    "  {host}: {} allowed, {} denied, {} bytes up, {} bytes down\n",
                    c["allowed"], c["denied"], c["bytes_up"], c["bytes_down"]
                ));
            }
        }
    }
    out
}

/// A sandbox's limits in words: `memory 1.0 GiB, pids 1024, cpus 1.5, cpuset 0-1`.
fn limits_text(l: &Value) -> String {
    let mut parts = Vec::new();
    if let Some(m) = l["memory_bytes"].as_u64() {
        parts.push(format!("memory {}", crate::output::bytes(m)));
    }
    if let Some(p) = l["pids"].as_u64() {
        parts.push(format!("pids {p}"));
    }
    if let (Some(q), Some(p)) = (l["cpu_quota_us"].as_f64(), l["cpu_period_us"].as_f64())
        && p > 0.0
    {
        parts.push(format!("cpus {}", q / p));
    }
    if let Some(c) = l["cpuset_cpus"].as_str() {
        parts.push(format!("cpuset {c}"));
    }
    for (key, what) in [("read_bps", "read"), ("write_bps", "write")] {
        if let Some(n) = l["io_max"][key].as_u64() {
            parts.push(format!("{what} {}/s", crate::output::bytes(n)));
        }
    }
    for (key, what) in [("read_iops", "read"), ("write_iops", "write")] {
        if let Some(n) = l["io_max"][key].as_u64() {
            parts.push(format!("{what} {n} IO/s"));
        }
    }
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(", ")
    }
}

/// An egress policy as lines; says so when it allows nothing.
fn policy_text(p: &Value) -> String {
    let list = |k: &str| -> Vec<String> {
        p[k].as_array()
            .map(|a| {
                a.iter()
                    .map(|x| x.as_str().map_or_else(|| x.to_string(), str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let (allow, deny) = (list("allow"), list("deny"));
    let mut out = String::new();
    if allow.is_empty() {
        out.push_str(
            "  allow: nothing (default deny; `mountctl sandbox policy WS --allow-host PATTERN`)\n",
        );
    } else {
        out.push_str(&format!("  allow: {}\n", allow.join(" ")));
    }
    if !deny.is_empty() {
        out.push_str(&format!("  deny: {}\n", deny.join(" ")));
    }
    if let Some(a) = p["add_hosts"].as_array().filter(|a| !a.is_empty()) {
        let names: Vec<String> = a
            .iter()
            .map(|h| h.as_str().map_or_else(|| h.to_string(), str::to_string))
            .collect();
        out.push_str(&format!("  add-host: {}\n", names.join(" ")));
    }
    out
}

/// One decision as a line of text.
fn decision_text(d: &Value) -> String {
    format!(
        "{} {:<7} {}:{} via {} ({})\n",
        d["time"].as_str().unwrap_or("-"),
        d["verdict"].as_str().unwrap_or("-"),
        d["host"].as_str().unwrap_or("-"),
        d["port"],
        d["via"].as_str().unwrap_or("-"),
        d["rule"].as_str().unwrap_or("-"),
    )
}

/// How often `sandbox log --follow` looks for new decisions.
const FOLLOW_POLL_MS: u64 = 200;

/// `sandbox log`: the decisions so far; with `follow`, then each new one as it is made,
/// until the sandbox stops. `--json`: one object per line.
fn log(
    ctx: &Ctx,
    rt: &cowspace::runtime::Runtime,
    ws: &str,
    follow: bool,
    tail: Option<usize>,
) -> anyhow::Result<ExitCode> {
    use std::io::Write;
    let print = |d: &Value| {
        let mut out = std::io::stdout().lock();
        let _ = if ctx.json {
            writeln!(out, "{d}")
        } else {
            write!(out, "{}", decision_text(d))
        };
        let _ = out.flush();
    };
    let first = rt.sandbox_log(ws, tail)?;
    for d in &first {
        print(d);
    }
    if !follow {
        return Ok(ExitCode::SUCCESS);
    }
    let path = rt.sandbox_log_path(ws)?;
    let mut seen = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    let mut partial = String::new();
    loop {
        std::thread::sleep(std::time::Duration::from_millis(FOLLOW_POLL_MS));
        let Ok(mut f) = std::fs::File::open(&path) else {
            break; // the sandbox stopped: its log went with it
        };
        use std::io::{Read, Seek};
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        if len < seen {
            seen = 0; // a new sandbox of the same name
        }
        if len == seen {
            if rt.sandbox_log_path(ws).is_err() {
                break;
            }
            continue;
        }
        f.seek(std::io::SeekFrom::Start(seen))?;
        let mut chunk = String::new();
        f.take(len - seen).read_to_string(&mut chunk)?;
        seen = len;
        partial.push_str(&chunk);
        while let Some(i) = partial.find('\n') {
            let line: String = partial.drain(..=i).collect();
            if let Ok(d) = serde_json::from_str::<Value>(line.trim_end()) {
                print(&d);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn start(ctx: &Ctx, rt: &cowspace::runtime::Runtime, a: StartArgs) -> anyhow::Result<ExitCode> {
    let opts =
        cowspace::sandbox::with_defaults(SandboxOptions::from(a.sandbox), &ctx.config.sandbox());
    let v = if a.vm {
        let accept =
            a.accept_emulation || ctx.config.vm_accept_emulation().is_some_and(|s| s.value);
        let vm = cowspace::vm::VmRun {
            accept_emulation: accept,
        };
        rt.vm_start(&a.workspace, &opts, &vm)?
    } else {
        rt.sandbox_start(&a.workspace, &opts)?
    };
    // The helper's notes (published ports) go to stderr, as `run` prints them.
    if let Some(m) = v["messages"].as_array() {
        for line in m.iter().filter_map(Value::as_str) {
            ctx.note(line);
        }
    }
    let mut out = v.clone();
    if let Some(o) = out.as_object_mut() {
        o.remove("messages");
        o.insert("state".into(), json!("running"));
    }
    ctx.emit(out, || {
        if ctx.quiet {
            return String::new();
        }
        format!(
            "sandbox {} of {} is running (init pid {}); `mountctl exec {} -- CMD` runs commands in it",
            v["name"].as_str().unwrap_or(""),
            v["workspace"].as_str().unwrap_or(""),
            v["init_pid"],
            v["name"].as_str().unwrap_or(""),
        )
    });
    Ok(ExitCode::SUCCESS)
}
