//! The summary table and the HTML timeline of a run.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::checker::Violation;
use crate::history::{Event, FinalState, Op, Phase};
use crate::schedule::{PlanKind, PlannedFault};

/// What a run found.
#[derive(Debug)]
pub struct Report {
    /// Every event, sorted by time.
    pub events: Vec<Event>,
    /// What the protected storage holds.
    pub state: FinalState,
    /// Broken invariants.
    pub violations: Vec<Violation>,
    /// The schedule drawn from the seed.
    pub schedule: Vec<PlannedFault>,
    /// Planned faults that fired, by kind (the stale write counts once its frozen worker
    /// was woken after another holder's write).
    pub fired: BTreeMap<PlanKind, u64>,
    /// What the injector noted that is not an event (a missed freeze, a late fault).
    pub notes: Vec<String>,
}

/// Key of [`summary`]: acquisitions granted (`acquire ok`).
pub const ACQUISITIONS: &str = "acquisitions";
/// Key of [`summary`]: audit rows (writes the protected storage accepted).
pub const WRITES_ACCEPTED: &str = "writes accepted (audit rows)";
/// Key of [`summary`]: writes the guard rejected.
pub const WRITES_REJECTED: &str = "writes rejected by the guard";
/// Key of [`summary`]: writes that failed otherwise (rolled back, connection lost).
pub const WRITES_FAILED: &str = "writes failed otherwise";
/// Key of [`summary`]: `lost` events (the lost signal resolved).
pub const LOST_SIGNALS: &str = "lost signals";
/// Key of [`summary`]: checks and write probes that answered lost.
pub const LOST_OBSERVATIONS: &str = "checks answering lost";
/// Key of [`summary`]: renewals sent by the library.
pub const RENEWALS_SENT: &str = "renewals sent";
/// Key of [`summary`]: renewals the client accepted.
pub const RENEWALS_ACCEPTED: &str = "renewals accepted";
/// Key of [`summary`]: renewals the store renewed but the client refused (too late).
pub const RENEWALS_REFUSED: &str = "renewals refused (late)";
/// Key of [`summary`]: inspections of the store by the harness.
pub const INSPECTIONS: &str = "store inspections";

/// Counts worth a line each (keys: the constants of this module).
pub fn summary(report: &Report) -> BTreeMap<String, u64> {
    let mut m: BTreeMap<String, u64> = [
        ACQUISITIONS,
        WRITES_ACCEPTED,
        WRITES_REJECTED,
        WRITES_FAILED,
        LOST_SIGNALS,
        LOST_OBSERVATIONS,
        RENEWALS_SENT,
        RENEWALS_ACCEPTED,
        RENEWALS_REFUSED,
        INSPECTIONS,
    ]
    .into_iter()
    .map(|k| (k.to_owned(), 0))
    .collect();
    let mut bump = |k: &str| *m.entry(k.to_owned()).or_default() += 1;
    for e in &report.events {
        match (e.op, e.phase) {
            (Some(Op::Acquire), Some(Phase::Ok)) => bump(ACQUISITIONS),
            (Some(Op::Write), Some(Phase::Fail)) if e.detail.starts_with("rejected") => {
                bump(WRITES_REJECTED)
            }
            (Some(Op::Write), Some(Phase::Fail | Phase::Unknown)) => bump(WRITES_FAILED),
            (Some(Op::Lost), _) => bump(LOST_SIGNALS),
            (Some(Op::Check), _) | (Some(Op::Write), Some(Phase::Invoke))
                if e.lost == Some(true) =>
            {
                bump(LOST_OBSERVATIONS)
            }
            (Some(Op::Renew), Some(Phase::Invoke)) => bump(RENEWALS_SENT),
            (Some(Op::Renew), Some(Phase::Ok)) => bump(RENEWALS_ACCEPTED),
            (Some(Op::Renew), Some(Phase::Fail)) if e.detail == "refused" => bump(RENEWALS_REFUSED),
            (Some(Op::Inspect), _) => bump(INSPECTIONS),
            _ => {}
        }
    }
    m.insert(WRITES_ACCEPTED.into(), report.state.audit.len() as u64);
    m
}

/// The human table.
pub fn table(report: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{:<40} {:>8}", "operations", "count");
    for (k, v) in summary(report) {
        let _ = writeln!(s, "  {k:<38} {v:>8}");
    }
    let _ = writeln!(s, "{:<40} {:>8}", "faults (planned / fired)", "");
    let mut planned: BTreeMap<PlanKind, u64> = BTreeMap::new();
    for f in &report.schedule {
        *planned.entry(f.kind).or_default() += 1;
    }
    for (k, n) in &planned {
        let fired = report.fired.get(k).copied().unwrap_or(0);
        let _ = writeln!(s, "  {:<38} {n:>3} / {fired:>3}", k.as_str());
    }
    let mut by_rule: BTreeMap<&str, u64> = BTreeMap::new();
    for v in &report.violations {
        *by_rule.entry(v.rule).or_default() += 1;
    }
    let _ = writeln!(s, "{:<40} {:>8}", "violations", report.violations.len());
    for (k, v) in by_rule {
        let _ = writeln!(s, "  {k:<38} {v:>8}");
    }
    for v in report.violations.iter().take(10) {
        let _ = writeln!(s, "  - {v}");
    }
    for n in &report.notes {
        let _ = writeln!(s, "note: {n}");
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
        .filter(|e| e.worker.starts_with('w') && e.worker.contains('#'))
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
                let ty = if workers.contains(&e.key.as_str()) {
                    y(&e.key)
                } else {
                    20.0
                };
                let _ = write!(
                    svg,
                    "<line x1=\"{0:.1}\" x2=\"{0:.1}\" y1=\"{1}\" y2=\"{2}\" stroke=\"#555\"><title>{3} {4} {5}</title></line>",
                    x(e.t),
                    ty - 12.0,
                    ty + 12.0,
                    esc(&e.key),
                    e.fault.map_or("", |k| k.as_str()),
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
