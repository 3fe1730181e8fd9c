//! The summary table and the HTML timeline of a run.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::history::{Op, Phase};
use crate::run::Report;

/// Counts worth a line each.
pub fn summary(report: &Report) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for e in &report.events {
        let (Some(op), Some(phase)) = (e.op, e.phase) else {
            continue;
        };
        if op == Op::Fault || op == Op::Inspect {
            continue;
        }
        *m.entry(format!("{op:?} {phase:?}").to_lowercase())
            .or_default() += 1;
    }
    let rejected = report
        .events
        .iter()
        .filter(|e| {
            e.op == Some(Op::Write)
                && e.phase == Some(Phase::Fail)
                && e.detail.starts_with("rejected")
        })
        .count() as u64;
    m.insert("writes rejected by the guard".into(), rejected);
    m.insert(
        "writes accepted (audit rows)".into(),
        report.state.audit.len() as u64,
    );
    m
}

/// The human table.
pub fn table(report: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{:<40} {:>8}", "operations", "count");
    for (k, v) in summary(report) {
        let _ = writeln!(s, "  {k:<38} {v:>8}");
    }
    let _ = writeln!(s, "{:<40} {:>8}", "faults", "count");
    for (k, v) in &report.faults {
        let _ = writeln!(s, "  {k:<38} {v:>8}");
    }
    let mut by_inv: BTreeMap<&str, u64> = BTreeMap::new();
    for v in &report.violations {
        *by_inv.entry(v.invariant).or_default() += 1;
    }
    let _ = writeln!(s, "{:<40} {:>8}", "violations", report.violations.len());
    for (k, v) in by_inv {
        let _ = writeln!(s, "  {k:<38} {v:>8}");
    }
    for v in report.violations.iter().take(10) {
        let _ = writeln!(s, "  - {v}");
    }
    s
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// An HTML page with one lane per worker: held windows (bars), accepted (green) and
/// rejected (red) writes, lost signals (orange) and faults (grey ticks).
pub fn html(report: &Report, title: &str) -> String {
    let t0 = report.events.first().map_or(0, |e| e.t);
    let t1 = report.events.last().map_or(1, |e| e.t).max(t0 + 1);
    let mut workers: Vec<&str> = report
        .events
        .iter()
        .filter(|e| e.worker.starts_with('w'))
        .map(|e| e.worker.as_str())
        .collect();
    workers.sort_unstable();
    workers.dedup();
    let (left, width, lane_h) = (60.0, 1100.0, 40.0);
    let x = |t: u64| left + (t - t0) as f64 / (t1 - t0) as f64 * width;
    let y = |w: &str| 40.0 + lane_h * workers.iter().position(|x| *x == w).unwrap_or(0) as f64;
    let mut svg = String::new();
    for w in &workers {
        let _ = write!(svg, "<text x=\"5\" y=\"{}\">{w}</text>", y(w) + 5.0);
    }
    let mut open: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    for e in &report.events {
        let (Some(op), phase) = (e.op, e.phase) else {
            continue;
        };
        match (op, phase) {
            (Op::Acquire, Some(Phase::Ok)) => {
                open.insert((e.worker.as_str(), e.owner.as_str()), e.t);
            }
            (Op::Release, Some(Phase::Invoke)) | (Op::Lost, _) => {
                if let Some(start) = open.remove(&(e.worker.as_str(), e.owner.as_str())) {
                    let _ = write!(
                        svg,
                        "<rect x=\"{:.1}\" y=\"{}\" width=\"{:.1}\" height=\"14\" fill=\"#7aa7e0\"><title>{} fence {}</title></rect>",
                        x(start),
                        y(&e.worker) - 7.0,
                        (x(e.t) - x(start)).max(0.5),
                        esc(&e.owner),
                        e.fence.unwrap_or(0)
                    );
                }
                if op == Op::Lost {
                    let _ = write!(
                        svg,
                        "<circle cx=\"{:.1}\" cy=\"{}\" r=\"4\" fill=\"#f4a300\"><title>lost: {}</title></circle>",
                        x(e.t),
                        y(&e.worker),
                        esc(&e.detail)
                    );
                }
            }
            (Op::Write, Some(Phase::Ok)) => {
                let _ = write!(
                    svg,
                    "<circle cx=\"{:.1}\" cy=\"{}\" r=\"3\" fill=\"#2a9d3a\"><title>write #{} fence {}</title></circle>",
                    x(e.t),
                    y(&e.worker),
                    e.seq.unwrap_or(0),
                    e.fence.unwrap_or(0)
                );
            }
            (Op::Write, Some(Phase::Fail)) if e.detail.starts_with("rejected") => {
                let _ = write!(
                    svg,
                    "<circle cx=\"{:.1}\" cy=\"{}\" r=\"5\" fill=\"#d62828\"><title>{}</title></circle>",
                    x(e.t),
                    y(&e.worker),
                    esc(&e.detail)
                );
            }
            (Op::Fault, _) => {
                let ty = if e.key.starts_with('w') {
                    y(&e.key)
                } else {
                    20.0
                };
                let _ = write!(
                    svg,
                    "<line x1=\"{0:.1}\" x2=\"{0:.1}\" y1=\"{1}\" y2=\"{2}\" stroke=\"#555\"><title>{3} {4}</title></line>",
                    x(e.t),
                    ty - 12.0,
                    ty + 12.0,
                    esc(&e.key),
                    esc(&e.detail)
                );
            }
            _ => {}
        }
    }
    let height = 60.0 + lane_h * workers.len() as f64;
    let violations: String = report
        .violations
        .iter()
        .map(|v| format!("<li>{}</li>", esc(&v.to_string())))
        .collect();
    format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>{t}</title><style>body{{font-family:system-ui,sans-serif;margin:1.5em}} pre{{background:#f4f4f4;padding:1em}}</style></head><body><h1>{t}</h1>\
<p>Bars: lease held; green: accepted write; red: write rejected by the guard; orange: lost signal; grey ticks: faults (top row: store and proxy).</p>\
<svg width=\"{w}\" height=\"{height}\">{svg}</svg><h2>Summary</h2><pre>{table}</pre><h2>Violations</h2><ul>{violations}</ul></body></html>\n",
        t = esc(title),
        w = left + width + 20.0,
        table = esc(&table(report)),
    )
}
