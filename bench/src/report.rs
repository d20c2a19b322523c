//! Markdown rendering of a run: one table per section, methods as columns, the
//! median with its spread, and for each cowspace method its ratio to the best
//! baseline on that metric.

use std::fmt::Write;

use crate::results::{Better, MethodResult, MetricDef, Role, RunResult, SectionResult, Status};

pub fn markdown(r: &RunResult) -> String {
    let mut s = String::new();
    let corpus = r
        .corpus
        .as_ref()
        .map_or("(unavailable)", |c| c.key.as_str());
    let _ = writeln!(s, "# cowspace bench: {corpus}\n");
    let _ = writeln!(s, "- Command: `{}`", r.reproduce);
    let _ = writeln!(
        s,
        "- Run: {} to {} ({:.0} s), bench {}, schema {}",
        r.started_at, r.finished_at, r.duration_s, r.bench_version, r.schema
    );
    let m = &r.machine;
    let _ = writeln!(
        s,
        "- Machine: Linux {} ({}), {} × {}, {:.1} GiB RAM, work dir {} on {}",
        m.kernel,
        m.os,
        m.cores,
        m.cpu_model,
        m.memory_bytes as f64 / (1u64 << 30) as f64,
        m.work_dir,
        m.work_fs
    );
    if !m.cpuidle.is_empty() {
        let _ = writeln!(s, "- CPU idle: {}", m.cpuidle);
    }
    let _ = writeln!(
        s,
        "- Page cache: {}",
        if r.settings.page_cache == "cold" {
            "cold (sync and drop_caches before every timed step)"
        } else {
            "warm (the tree is read right before each method's run)"
        }
    );
    if let Some(c) = &r.settings.worker_cpus {
        let _ = writeln!(
            s,
            "- Workload steps confined to CPUs {c} (`--worker-cpus`; creates, commits, removes and the daemon not)"
        );
    }
    let _ = writeln!(
        s,
        "- Runs: {} per method, methods alternating run by run (round r starts with method r mod n)",
        r.settings.runs
    );
    if let Some(c) = &r.corpus {
        let st = &c.stats;
        let _ = writeln!(
            s,
            "- Corpus: {} regular files, {} directories, {} symlinks, {} executables, {} logical ({} bytes), max depth {}; {}; tree hash {}",
            st.files,
            st.dirs,
            st.symlinks,
            st.executables,
            human_bytes(st.bytes as f64),
            st.bytes,
            st.max_depth,
            c.source,
            &st.tree_hash[..16.min(st.tree_hash.len())]
        );
    }
    if let Some(why) = &r.corpus_skipped {
        let _ = writeln!(s, "- Corpus skipped: {why}");
    }
    if let Some(mc) = &r.mountctl {
        let _ = writeln!(
            s,
            "- mountctl: {}{}",
            mc.path,
            mc.version
                .as_ref()
                .map(|v| format!(" ({v})"))
                .unwrap_or_default()
        );
    }
    for sec in &r.sections {
        s.push('\n');
        section(&mut s, sec, r.settings.changed_files);
    }
    s
}

fn section(s: &mut String, sec: &SectionResult, changed: usize) {
    let _ = writeln!(s, "## {}\n", sec.title);
    let _ = writeln!(
        s,
        "{}\n",
        sec.description.replace("{N}", &changed.to_string())
    );
    let shown: Vec<&MethodResult> = sec
        .methods
        .iter()
        .filter(|m| m.runs_completed > 0)
        .collect();
    let ours: Vec<&MethodResult> = shown
        .iter()
        .copied()
        .filter(|m| m.role == Role::Cowspace)
        .collect();
    if shown.is_empty() {
        let _ = writeln!(s, "No method produced a measurement.\n");
    } else {
        let _ = write!(s, "| metric |");
        for m in &shown {
            let _ = write!(s, " {} |", m.label.replace('|', "\\|"));
        }
        let _ = write!(s, " best baseline |");
        for m in &ours {
            let _ = write!(s, " {} ÷ best |", m.id);
        }
        s.push('\n');
        let _ = writeln!(s, "|---|{}", "---|".repeat(shown.len() + 1 + ours.len()));
        for metric in &sec.metrics {
            if !shown.iter().any(|m| m.summary.contains_key(&metric.id)) {
                continue;
            }
            row(s, sec, metric, &shown, &ours, changed, Stat::Median);
            if metric.show_p99 {
                row(s, sec, metric, &shown, &ours, changed, Stat::P99);
            }
        }
        let _ = writeln!(
            s,
            "\nCells: median (min–max) over the completed runs. ↓ lower is better, ↑ higher is better. \
             Ratios: the cowspace method's median ÷ the best baseline's median (p99 rows: \
             nearest-rank 99th percentile, which is the maximum with fewer than 100 runs)."
        );
    }
    let not_ok: Vec<&MethodResult> = sec
        .methods
        .iter()
        .filter(|m| m.status != Status::Ok)
        .collect();
    if !not_ok.is_empty() {
        s.push('\n');
        for m in not_ok {
            let what = if m.status == Status::Skipped {
                "skipped"
            } else {
                "failed"
            };
            let _ = writeln!(
                s,
                "- **{}** ({}): {what}{} — {}",
                m.label,
                m.id,
                if m.runs_completed > 0 {
                    format!(" after {} run(s)", m.runs_completed)
                } else {
                    String::new()
                },
                m.reason.as_deref().unwrap_or("no reason recorded")
            );
        }
    }
    s.push('\n');
    for m in sec.methods.iter().filter(|m| m.runs_completed > 0) {
        let _ = writeln!(s, "- {}: `{}`", m.label, m.command);
    }
    for n in &sec.notes {
        let _ = writeln!(s, "- {n}");
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Stat {
    Median,
    P99,
}

fn pick(s: &crate::stats::Summary, stat: Stat) -> f64 {
    match stat {
        Stat::Median => s.median,
        Stat::P99 => s.p99,
    }
}

fn row(
    s: &mut String,
    sec: &SectionResult,
    metric: &MetricDef,
    shown: &[&MethodResult],
    ours: &[&MethodResult],
    changed: usize,
    stat: Stat,
) {
    let arrow = if metric.better == Better::Lower {
        "↓"
    } else {
        "↑"
    };
    let label = metric.label.replace("{N}", &changed.to_string());
    let label = if stat == Stat::P99 {
        format!("{label}, p99")
    } else {
        label
    };
    let unit = if metric.unit == "s" {
        "time"
    } else {
        metric.unit.as_str()
    };
    let _ = write!(s, "| {label} ({unit}) {arrow} |");
    for m in shown {
        let c = if stat == Stat::P99 {
            m.summary
                .get(&metric.id)
                .map_or("–".into(), |x| value(x.p99, &metric.unit))
        } else {
            cell(m, metric)
        };
        let _ = write!(s, " {c} |");
    }
    let best = best_baseline(sec, metric, stat);
    match best {
        Some((name, _)) => {
            let _ = write!(s, " {} |", name.replace('|', "\\|"));
        }
        None => s.push_str(" – |"),
    }
    for m in ours {
        let ratio = match (best, m.summary.get(&metric.id)) {
            (Some((_, b)), Some(v)) if b != 0.0 => format!("{:.2}×", pick(v, stat) / b),
            _ => "–".into(),
        };
        let _ = write!(s, " {ratio} |");
    }
    s.push('\n');
}

fn best_baseline<'a>(
    sec: &'a SectionResult,
    metric: &MetricDef,
    stat: Stat,
) -> Option<(&'a str, f64)> {
    let vals = sec
        .methods
        .iter()
        .filter(|m| m.role == Role::Baseline)
        .filter_map(|m| {
            m.summary
                .get(&metric.id)
                .map(|s| (m.label.as_str(), pick(s, stat)))
        });
    match metric.better {
        Better::Lower => vals.min_by(|a, b| a.1.total_cmp(&b.1)),
        Better::Higher => vals.max_by(|a, b| a.1.total_cmp(&b.1)),
    }
}

fn cell(m: &MethodResult, metric: &MetricDef) -> String {
    let Some(sum) = m.summary.get(&metric.id) else {
        return "–".into();
    };
    let f = |v: f64| value(v, &metric.unit);
    if sum.n > 1 {
        format!("{} ({}–{})", f(sum.median), f(sum.min), f(sum.max))
    } else {
        f(sum.median)
    }
}

pub fn value(v: f64, unit: &str) -> String {
    match unit {
        "bytes" => human_bytes(v),
        "ratio" => format!("{v:.3}"),
        "s" => {
            if v < 0.001 {
                format!("{:.1} µs", v * 1e6)
            } else if v < 1.0 {
                format!("{:.1} ms", v * 1e3)
            } else {
                format!("{v:.2} s")
            }
        }
        "MB/s" => format!("{v:.1}"),
        "files" | "count" => format!("{v:.0}"),
        _ => format!("{v:.3}"),
    }
}

pub fn human_bytes(v: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = v;
    let mut i = 0;
    while v.abs() >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{v:.0} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(human_bytes(512.0), "512 B");
        assert_eq!(human_bytes(1536.0), "1.5 KiB");
        assert_eq!(value(0.0123, "s"), "12.3 ms");
        assert_eq!(value(2.5, "s"), "2.50 s");
        assert_eq!(value(1000.0, "count"), "1000");
    }
}
