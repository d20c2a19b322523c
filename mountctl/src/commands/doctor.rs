//! `mountctl doctor`: what this host can do, and why not: each materializer, the
//! overlay's lower, git's fsmonitor hook, the namespace sandbox's controls (as
//! `sandbox-helper probe` finds them), the VM placement, the remotes.

use std::process::ExitCode;

use cowspace::materializer::{self, MaterializerKind};
use serde_json::json;

use crate::output::Ctx;

/// The `vm` row of `doctor` as text.
fn vm_line(vm: &serde_json::Value) -> String {
    let s = |v: &serde_json::Value| v.as_str().unwrap_or("-").to_string();
    let mut out = format!(
        "vm       accel {}, isolation {}: {}\n",
        s(&vm["accel"]),
        s(&vm["isolation"]),
        s(&vm["reason"])
    );
    out.push_str(&format!(
        "         qemu {} ({}); virtiofsd {} ({})\n",
        s(&vm["qemu"]["path"]),
        s(&vm["qemu"]["version"]),
        s(&vm["virtiofsd"]["path"]),
        s(&vm["virtiofsd"]["version"])
    ));
    out.push_str(&format!(
        "         guest kernel {} (blake3 {}); initramfs {} (blake3 {})\n",
        s(&vm["kernel"]["path"]),
        s(&vm["kernel"]["blake3"]),
        s(&vm["initramfs"]["path"]),
        s(&vm["initramfs"]["blake3"])
    ));
    for m in vm["missing"].as_array().into_iter().flatten() {
        out.push_str(&format!("         missing: {}\n", s(m)));
    }
    out
}

pub fn run(ctx: &Ctx) -> anyhow::Result<ExitCode> {
    let store = ctx.open()?;
    let mut rows = Vec::new();
    let materializers = materializer::Materializers::standard();
    for kind in MaterializerKind::ALL {
        let r = materializers.get(kind).check(&store);
        rows.push(json!({"materializer": kind.as_str(), "available": r.is_ok(), "why": r.err()}));
    }
    let auto = materializers.pick_auto(&store).map(|k| k.as_str()).ok();
    // Which lower an overlay workspace gets, and why not the native one.
    let native = cowspace::native::probe(&store);
    let (lower, lower_why) = cowspace::runtime::auto_lower(&store, MaterializerKind::Overlay);
    let lowers = json!({"auto": lower, "why": lower_why, "native": {"available": native.is_ok(), "why": native.err()}});
    // What imports of git checkouts will name as git's fsmonitor hook (docs/git.md).
    let hook = match cowspace::gitfsmonitor::git_reads_the_extension() {
        Ok(()) => match cowspace::gitfsmonitor::hook_program() {
            Some(p) => {
                json!({"available": true, "command": cowspace::gitfsmonitor::hook_command(), "runs": p})
            }
            None => {
                json!({"available": false, "command": cowspace::gitfsmonitor::hook_command(),
                "why": format!("no mountctl on PATH (nor ${}): git in workspaces looks at every file", cowspace::gitfsmonitor::MOUNTCTL_ENV)})
            }
        },
        Err(why) => json!({"available": false, "why": why}),
    };
    // What the host could change to make fuse workspaces answer faster.
    let hints: Vec<_> = materializer::fuse::host_hints()
        .into_iter()
        .map(|(cause, fix)| json!({"materializer": "fuse", "cause": cause, "fix": fix}))
        .collect();
    // What the namespace sandbox can enforce here (`sandbox start`, `run`).
    let sandbox = sandbox_probe();
    // What a `run --vm` would use here, and whether its hypervisor isolates.
    let vm = vm_probe(&store.layout().cache().join("vm"));
    // Whether `create --disk` can be enforced on this root's workspaces/.
    let quota = cowspace::quota::probe(&store.layout().workspaces());
    let quota_line = match &quota {
        Ok(_) => {
            "disk quotas (create --disk): available (btrfs qgroups on workspaces/)\n".to_string()
        }
        Err(why) => format!(
            "disk quotas (create --disk): unavailable: {why}; `mountctl init --workspaces-fs SIZE` on a new root gives one\n"
        ),
    };
    let quota = json!({"available": quota.is_ok(), "why": quota.err()});
    // Which remotes answer, and how fast.
    let remotes = cowspace::remote::doctor(&store);
    ctx.emit(
        json!({"materializers": rows, "auto": auto, "lower": lowers, "git_fsmonitor": hook, "hints": hints, "sandbox": sandbox, "vm": vm, "remotes": remotes, "disk_quota": quota}),
        || {
            let mut s = String::new();
            s.push_str(&sandbox_lines(&sandbox));
            s.push_str(&vm_line(&vm));
            for r in remotes.as_array().into_iter().flatten() {
                s.push_str(&format!(
                    "remote {} ({}): {}\n",
                    r["name"].as_str().unwrap_or(""),
                    r["url"].as_str().unwrap_or(""),
                    if r["answers"] == true {
                        format!("answers in {:.1} ms", r["ms"].as_f64().unwrap_or(0.0))
                    } else {
                        format!("does not answer: {}", r["why"].as_str().unwrap_or(""))
                    }
                ));
            }
            for r in &rows {
                s.push_str(&format!(
                    "{:<8} {}\n",
                    r["materializer"].as_str().unwrap_or(""),
                    if r["available"] == true {
                        "available".to_string()
                    } else {
                        format!("no: {}", r["why"].as_str().unwrap_or(""))
                    }
                ));
            }
            s.push_str(&format!(
                "auto picks: {}\n",
                auto.unwrap_or("nothing (see above)")
            ));
            s.push_str(&format!("overlay lower (auto): {lower}: {lower_why}\n"));
            s.push_str(&quota_line);
            s.push_str(&match hook["runs"].as_str() {
                Some(runs) => format!(
                    "git in workspaces of imported checkouts asks the workspace what changed \
                     (its hook runs {runs})"
                ),
                None => format!(
                    "git in workspaces looks at every file: {}",
                    hook["why"].as_str().unwrap_or("")
                ),
            });
            for h in &hints {
                s.push_str(&format!(
                    "\nhint ({}): {}\n  fix: {}",
                    h["materializer"].as_str().unwrap_or(""),
                    h["cause"].as_str().unwrap_or(""),
                    h["fix"].as_str().unwrap_or("")
                ));
            }
            s
        },
    );
    Ok(ExitCode::SUCCESS)
}

/// What `sandbox-helper vm-probe` says a VM placement would use here (the helper is the
/// program that would place it; this process does not link it).
/// What `sandbox-helper probe` finds: `{"available", "controls": [{"control",
/// "available", "detail"}]}`; `available` false with `why` when the helper cannot say.
fn sandbox_probe() -> serde_json::Value {
    let helper = match cowspace::sandbox::helper_path() {
        Ok(h) => h,
        Err(e) => return json!({"available": false, "why": e.to_string(), "controls": []}),
    };
    let out = std::process::Command::new(&helper)
        .args(["probe", "--json"])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .output();
    let why = |w: String| json!({"available": false, "why": w, "controls": []});
    match out {
        Ok(o) => match serde_json::from_slice::<serde_json::Value>(&o.stdout) {
            Ok(mut v) if v["controls"].is_array() => {
                let all = v["controls"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .all(|c| c["available"] == true);
                v["available"] = json!(all);
                v
            }
            _ => why(format!(
                "{} probe answered no report ({})",
                helper.display(),
                o.status
            )),
        },
        Err(e) => why(format!("running {} probe: {e}", helper.display())),
    }
}

/// The namespace sandbox's rows of `doctor` as text: one line per control.
fn sandbox_lines(v: &serde_json::Value) -> String {
    let s = |v: &serde_json::Value| v.as_str().unwrap_or("-").to_string();
    let mut out = match v["why"].as_str() {
        Some(why) => format!("sandbox  unknown: {why}\n"),
        None if v["available"] == true => {
            "sandbox  namespaces: every control can be enforced\n".to_string()
        }
        None => "sandbox  namespaces: some controls cannot be enforced (refused when asked \
                 for)\n"
            .to_string(),
    };
    for c in v["controls"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "         {} {}: {}\n",
            if c["available"] == true { "yes" } else { "no " },
            s(&c["control"]),
            s(&c["detail"])
        ));
    }
    out
}

fn vm_probe(cache: &std::path::Path) -> serde_json::Value {
    let helper = match cowspace::sandbox::helper_path() {
        Ok(h) => h,
        Err(e) => return json!({"available": false, "why": e.to_string()}),
    };
    let out = std::process::Command::new(&helper)
        .arg("vm-probe")
        .arg("--cache-dir")
        .arg(cache)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .output();
    match out {
        Ok(o) if o.status.success() => serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
            json!({"available": false, "why": format!("{} vm-probe answered no JSON: {e}", helper.display())})
        }),
        Ok(o) => json!({"available": false, "why": format!("{} vm-probe failed ({})", helper.display(), o.status)}),
        Err(e) => json!({"available": false, "why": format!("running {} vm-probe: {e}", helper.display())}),
    }
}
