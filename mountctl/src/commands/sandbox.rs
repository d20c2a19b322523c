//! `mountctl sandbox start|stop|status|list`: long-lived sandboxes. Thin: each is one call
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
            ctx.confirm(v.clone(), || {
                format!(
                    "stopped the sandbox of {}",
                    v["workspace"].as_str().unwrap_or("")
                )
            });
            Ok(ExitCode::SUCCESS)
        }
        SandboxCommand::Status { workspace } => {
            let v = rt.sandbox_status(&workspace)?;
            ctx.emit(v.clone(), || describe(&v));
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
    let mut out = String::new();
    for key in [
        "workspace",
        "name",
        "state",
        "provider",
        "isolation",
        "reason",
        "accel",
        "init_pid",
        "host_uid_base",
        "net",
        "limits",
        "uptime_s",
        "processes",
        "memory_bytes",
        "oom_kills",
        "execs_running",
        "host_mount",
    ] {
        if !v[key].is_null() {
            out.push_str(&format!("{key}: {}\n", v[key]));
        }
    }
    out.push_str(&format!("ports: {}\n", ports(&v["ports"])));
    out
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
