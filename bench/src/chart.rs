//! `bench chart`: materialize time against tree size, from runs on corpora of
//! different sizes — a hand-rolled SVG, log scale on both axes, one line per method
//! (cowspace methods solid, baselines dashed), the median of each run.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::results::{Role, RunResult, SCHEMA};

const W: f64 = 860.0;
const H: f64 = 500.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 300.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;
const COLORS: &[&str] = &[
    "#d62728", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#1f77b4", "#2ca02c", "#17becf",
    "#bcbd22", "#7f7f7f", "#393b79", "#637939", "#843c39",
];

/// One method's line: (files in the tree, median materialize seconds), by size.
struct Line {
    label: String,
    role: Role,
    points: BTreeMap<u64, f64>,
}

fn load(paths: &[PathBuf]) -> Result<Vec<RunResult>> {
    let mut files = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut v: Vec<PathBuf> = std::fs::read_dir(p)
                .with_context(|| format!("reading {}", p.display()))?
                .flatten()
                .map(|e| e.path())
                .filter(|x| x.extension().is_some_and(|e| e == "json"))
                .collect();
            v.sort();
            files.extend(v);
        } else {
            files.push(p.clone());
        }
    }
    let mut runs = Vec::new();
    for f in files {
        let bytes = std::fs::read(&f).with_context(|| format!("reading {}", f.display()))?;
        let r: RunResult = serde_json::from_slice(&bytes)
            .with_context(|| format!("{} is not a bench run", f.display()))?;
        if r.schema != SCHEMA {
            bail!(
                "{} has schema {}, this bench reads {SCHEMA}",
                f.display(),
                r.schema
            );
        }
        runs.push(r);
    }
    Ok(runs)
}

/// Writes the chart of the materialize sections of `paths` to `out`.
pub fn write(out: &Path, paths: &[PathBuf]) -> Result<()> {
    let runs = load(paths)?;
    let svg = render(&runs)?;
    std::fs::write(out, svg).with_context(|| format!("writing {}", out.display()))?;
    eprintln!("bench: wrote {}", out.display());
    Ok(())
}

fn render(runs: &[RunResult]) -> Result<String> {
    let mut lines: BTreeMap<String, Line> = BTreeMap::new();
    for r in runs {
        let Some(c) = &r.corpus else { continue };
        let size = c.stats.files + c.stats.symlinks;
        for sec in r.sections.iter().filter(|s| s.id == "materialize") {
            for m in &sec.methods {
                if let Some(s) = m.summary.get("materialize_s") {
                    lines
                        .entry(m.id.clone())
                        .or_insert_with(|| Line {
                            label: m.label.clone(),
                            role: m.role,
                            points: BTreeMap::new(),
                        })
                        .points
                        .insert(size, s.median);
                }
            }
        }
    }
    if lines.is_empty() {
        bail!("no materialize measurements in the given runs");
    }
    let xs: Vec<f64> = lines
        .values()
        .flat_map(|l| l.points.keys().map(|x| *x as f64))
        .collect();
    let ys: Vec<f64> = lines
        .values()
        .flat_map(|l| l.points.values().copied())
        .filter(|y| *y > 0.0)
        .collect();
    let decade = |v: f64, up: bool| {
        let l = v.log10();
        if up { l.ceil() } else { l.floor() }
    };
    let (x0, x1) = (
        decade(xs.iter().copied().fold(f64::MAX, f64::min), false),
        decade(xs.iter().copied().fold(0.0, f64::max), true)
            .max(decade(xs.iter().copied().fold(f64::MAX, f64::min), false) + 1.0),
    );
    let (y0, y1) = (
        decade(ys.iter().copied().fold(f64::MAX, f64::min), false),
        decade(ys.iter().copied().fold(0.0, f64::max), true),
    );
    let y1 = y1.max(y0 + 1.0);
    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let px = |x: f64| LEFT + (x.log10() - x0) / (x1 - x0) * pw;
    let py = |y: f64| TOP + ph - (y.max(1e-9).log10() - y0) / (y1 - y0) * ph;

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" font-size="15" text-anchor="middle">Materialize time vs tree size (median; log–log)</text>"#,
        LEFT + pw / 2.0
    );
    // Grid and tick labels: decades on both axes.
    let mut d = y0;
    while d <= y1 + 1e-9 {
        let y = py(10f64.powf(d));
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + pw,
            LEFT - 6.0,
            y + 4.0,
            seconds(10f64.powf(d))
        );
        d += 1.0;
    }
    let mut d = x0;
    while d <= x1 + 1e-9 {
        let x = px(10f64.powf(d));
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{:.1}" stroke="#ddd"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            TOP + ph,
            TOP + ph + 18.0,
            files(10f64.powf(d))
        );
        d += 1.0;
    }
    let _ = writeln!(
        s,
        r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>"##
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">files in the tree (regular files + symlinks)</text>"#,
        LEFT + pw / 2.0,
        H - 18.0
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(16 {:.1}) rotate(-90)" text-anchor="middle">time to a usable workspace</text>"#,
        TOP + ph / 2.0
    );
    // Cowspace methods first in the legend.
    let mut ordered: Vec<&Line> = lines.values().collect();
    ordered.sort_by_key(|l| (l.role != Role::Cowspace, l.label.clone()));
    for (i, l) in ordered.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let dash = if l.role == Role::Cowspace {
            ""
        } else {
            r#" stroke-dasharray="6 4""#
        };
        let width = if l.role == Role::Cowspace { 2.5 } else { 1.5 };
        let pts: Vec<String> = l
            .points
            .iter()
            .map(|(x, y)| format!("{:.1},{:.1}", px(*x as f64), py(*y)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="{width}"{dash} points="{}"/>"#,
            pts.join(" ")
        );
        for (x, y) in &l.points {
            let _ = writeln!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{color}"><title>{}: {} files, {}</title></circle>"#,
                px(*x as f64),
                py(*y),
                esc(&l.label),
                x,
                seconds(*y)
            );
        }
        let ly = TOP + 10.0 + i as f64 * 20.0;
        let lx = LEFT + pw + 16.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="{width}"{dash}/><text x="{}" y="{}">{}</text>"#,
            lx + 28.0,
            lx + 34.0,
            ly + 4.0,
            esc(&l.label)
        );
    }
    s.push_str("</svg>\n");
    Ok(s)
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn seconds(v: f64) -> String {
    if v >= 1.0 {
        format!("{v:.0} s")
    } else if v >= 1e-3 {
        format!("{:.0} ms", v * 1e3)
    } else {
        format!("{:.0} µs", v * 1e6)
    }
}

fn files(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.0}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.0}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}
