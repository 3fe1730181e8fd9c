//! The invariants C1–C10 of `FAULTS.md`, checked over a recorded history.
//!
//! Times are `CLOCK_MONOTONIC` nanoseconds. A holder's *window* on a key runs from its
//! acquire's success to the earliest of its last validity deadline, its lost signal and its
//! release call.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use crate::history::{AuditRow, Event, FinalState, Op, Phase};

/// Bounds and allowances of one check.
#[derive(Debug, Clone)]
pub struct CheckConfig {
    /// The lease TTL.
    pub ttl_ns: u64,
    /// How late after a deadline a lost signal may fire in a process that was not paused
    /// (scheduling delay).
    pub lost_slack_ns: u64,
    /// C9: a takeover must happen within this bound after the holder is killed.
    pub takeover_bound_ns: u64,
    /// C10: a lost signal needs a fault within this long before it.
    pub quiet_ns: u64,
    /// C2/C3 relaxed: the failure model admits fence reuse and overlapping windows (FAULTS
    /// rows 10, 11, 13). C1 is never relaxed.
    pub lossy_store: bool,
    /// A store restart loses the leases it held (Redis without persistence, FAULTS rows
    /// 9–10): C3 is relaxed for a window during which the store restarted. C1 still holds.
    pub restart_loses_leases: bool,
}

impl CheckConfig {
    /// Defaults for a TTL: lost slack TTL/4, takeover bound 3×TTL, quiet period 3×TTL.
    pub fn for_ttl_ns(ttl_ns: u64) -> Self {
        Self {
            ttl_ns,
            lost_slack_ns: ttl_ns / 4,
            takeover_bound_ns: ttl_ns * 3,
            quiet_ns: ttl_ns * 3,
            lossy_store: false,
            restart_loses_leases: false,
        }
    }
}

/// One broken invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// `"C1"` … `"C10"`.
    pub invariant: &'static str,
    /// What was seen.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.invariant, self.detail)
    }
}

/// A holder's window on a key.
#[derive(Debug, Clone)]
struct Window {
    key: String,
    owner: String,
    worker: String,
    fence: u64,
    start: u64,
    deadline: u64,
    lost_at: Option<u64>,
    released_at: Option<u64>,
}

impl Window {
    fn end(&self) -> u64 {
        let mut end = self.deadline;
        if let Some(l) = self.lost_at {
            end = end.min(l);
        }
        if let Some(r) = self.released_at {
            end = end.min(r);
        }
        end
    }
}

/// Pause intervals per worker from `sigstop`/`sigcont` faults.
fn pauses(events: &[Event]) -> HashMap<String, Vec<(u64, u64)>> {
    let mut open: HashMap<String, u64> = HashMap::new();
    let mut out: HashMap<String, Vec<(u64, u64)>> = HashMap::new();
    for e in events.iter().filter(|e| e.op == Some(Op::Fault)) {
        let target = e.key.clone();
        match e.detail.split_whitespace().next() {
            Some("sigstop") => {
                open.insert(target, e.t);
            }
            Some("sigcont") | Some("kill9") => {
                if let Some(start) = open.remove(&target) {
                    out.entry(target).or_default().push((start, e.t));
                }
            }
            _ => {}
        }
    }
    for (target, start) in open {
        out.entry(target).or_default().push((start, u64::MAX));
    }
    out
}

fn windows(events: &[Event]) -> Vec<Window> {
    let mut out: Vec<Window> = Vec::new();
    let mut index: HashMap<(String, String), usize> = HashMap::new();
    for e in events {
        let k = (e.key.clone(), e.owner.clone());
        match (e.op, e.phase) {
            (Some(Op::Acquire), Some(Phase::Ok)) => {
                index.insert(k, out.len());
                out.push(Window {
                    key: e.key.clone(),
                    owner: e.owner.clone(),
                    worker: e.worker.clone(),
                    fence: e.fence.unwrap_or(0),
                    start: e.t,
                    deadline: e.valid_until.unwrap_or(e.t),
                    lost_at: None,
                    released_at: None,
                });
            }
            (Some(Op::Renew), Some(Phase::Ok)) => {
                if let Some(&i) = index.get(&k) {
                    let w = &mut out[i];
                    if w.lost_at.is_none() && w.released_at.is_none() {
                        w.deadline = w.deadline.max(e.valid_until.unwrap_or(0));
                    }
                }
            }
            (Some(Op::Lost), _) => {
                if let Some(&i) = index.get(&k) {
                    out[i].lost_at.get_or_insert(e.t);
                }
            }
            (Some(Op::Release), Some(Phase::Invoke)) => {
                if let Some(&i) = index.get(&k) {
                    out[i].released_at.get_or_insert(e.t);
                }
            }
            _ => {}
        }
    }
    out
}

/// Checks every invariant; returns the violations (empty = the history is fine).
pub fn check(events: &[Event], state: &FinalState, cfg: &CheckConfig) -> Vec<Violation> {
    let mut events = events.to_vec();
    events.sort_by_key(|e| e.t);
    let mut v = Vec::new();
    let windows = windows(&events);
    let pauses = pauses(&events);
    let paused_at = |worker: &str, t: u64| {
        pauses
            .get(worker)
            .is_some_and(|ps| ps.iter().any(|&(a, b)| a <= t && t <= b))
    };
    let run_end = events.last().map_or(0, |e| e.t);

    // C1: accepted writes, in commit order, never go back in fence per resource.
    let mut audit: Vec<&AuditRow> = state.audit.iter().collect();
    audit.sort_by_key(|r| r.seq);
    let mut highest: HashMap<&str, &AuditRow> = HashMap::new();
    for row in &audit {
        if let Some(prev) = highest.get(row.resource.as_str())
            && row.fence < prev.fence
        {
            v.push(Violation {
                invariant: "C1",
                detail: format!(
                    "{}: write #{} with fence {} committed after write #{} with fence {}",
                    row.resource, row.seq, row.fence, prev.seq, prev.fence
                ),
            });
            continue;
        }
        highest.insert(row.resource.as_str(), row);
    }

    // C2: a fence is issued to one owner only.
    if !cfg.lossy_store {
        let mut issued: BTreeMap<(&str, u64), &str> = BTreeMap::new();
        for w in &windows {
            match issued.get(&(w.key.as_str(), w.fence)) {
                Some(&o) if o != w.owner => v.push(Violation {
                    invariant: "C2",
                    detail: format!("{}: fence {} issued to {o} and {}", w.key, w.fence, w.owner),
                }),
                _ => {
                    issued.insert((w.key.as_str(), w.fence), w.owner.as_str());
                }
            }
        }
    }

    let restarts: Vec<u64> = events
        .iter()
        .filter(|e| e.op == Some(Op::Fault) && e.detail.starts_with("restart-store"))
        .map(|e| e.t)
        .collect();
    // C3: windows of different owners do not overlap.
    if !cfg.lossy_store {
        let mut by_key: HashMap<&str, Vec<&Window>> = HashMap::new();
        for w in &windows {
            by_key.entry(w.key.as_str()).or_default().push(w);
        }
        for ws in by_key.values_mut() {
            ws.sort_by_key(|w| w.start);
            for (i, a) in ws.iter().enumerate() {
                for b in &ws[i + 1..] {
                    if b.start >= a.end() {
                        break;
                    }
                    let restarted = cfg.restart_loses_leases
                        && restarts.iter().any(|&t| a.start <= t && t <= b.start);
                    if a.owner != b.owner && !restarted {
                        v.push(Violation {
                            invariant: "C3",
                            detail: format!(
                                "{}: {} (fence {}) held until {} but {} (fence {}) acquired at {}",
                                a.key,
                                a.worker,
                                a.fence,
                                a.end(),
                                b.worker,
                                b.fence,
                                b.start
                            ),
                        });
                    }
                }
            }
        }
    }

    let window_of = |key: &str, owner: &str| {
        windows
            .iter()
            .rev()
            .find(|w| w.key == key && w.owner == owner)
    };

    // C4: the lost signal fires by the window's end (or when a paused process resumes), and
    // no write starts after the window ended.
    for w in &windows {
        if w.released_at.is_some_and(|r| r <= w.deadline) {
            continue;
        }
        let due = w.deadline.saturating_add(cfg.lost_slack_ns);
        match w.lost_at {
            Some(l) if l <= due || paused_at(&w.worker, w.deadline) => {}
            Some(l) => v.push(Violation {
                invariant: "C4",
                detail: format!(
                    "{}: {} lost signal fired {} ns after its deadline",
                    w.key,
                    w.worker,
                    l - w.deadline
                ),
            }),
            None if run_end > due
                && !paused_at(&w.worker, w.deadline)
                && !killed(&events, &w.worker, w.deadline) =>
            {
                v.push(Violation {
                    invariant: "C4",
                    detail: format!(
                        "{}: {} passed its deadline without a lost signal",
                        w.key, w.worker
                    ),
                })
            }
            None => {}
        }
    }
    for e in events
        .iter()
        .filter(|e| e.op == Some(Op::Write) && e.phase == Some(Phase::Invoke))
    {
        if let Some(w) = window_of(&e.key, &e.owner)
            && e.t > w.end()
            && !paused_at(&e.worker, e.t.saturating_sub(cfg.lost_slack_ns))
        {
            v.push(Violation {
                invariant: "C4",
                detail: format!(
                    "{}: {} started a write {} ns after its window ended",
                    e.key,
                    e.worker,
                    e.t - w.end()
                ),
            });
        }
    }

    // C5: a write that started after its window ended is never accepted after a newer
    // grant's write.
    let seq_of_fence: Vec<(u64, &str, u64)> = audit
        .iter()
        .map(|r| (r.seq, r.resource.as_str(), r.fence))
        .collect();
    for e in events
        .iter()
        .filter(|e| e.op == Some(Op::Write) && e.phase == Some(Phase::Ok))
    {
        let (Some(seq), Some(fence)) = (e.seq, e.fence) else {
            continue;
        };
        let newer_before = seq_of_fence
            .iter()
            .any(|&(s, r, f)| r == e.key && s < seq && f > fence);
        if newer_before {
            v.push(Violation {
                invariant: "C5",
                detail: format!(
                    "{}: {} write #{seq} with fence {fence} accepted after a newer holder's write",
                    e.key, e.worker
                ),
            });
        }
    }

    // C6: stale calls never extend or remove another owner's lease. A call may take effect
    // anywhere between its invoke and its reply, so it is stale only if another owner had
    // acquired the key before the call was even sent.
    for e in &events {
        if !matches!(e.op, Some(Op::Renew) | Some(Op::Release)) || e.phase != Some(Phase::Ok) {
            continue;
        }
        let sent = events
            .iter()
            .filter(|i| {
                i.op == e.op
                    && i.phase == Some(Phase::Invoke)
                    && i.owner == e.owner
                    && i.key == e.key
                    && i.t <= e.t
            })
            .map(|i| i.t)
            .max()
            .unwrap_or(e.t);
        let latest = windows
            .iter()
            .filter(|w| w.key == e.key && w.start <= sent)
            .max_by_key(|w| w.start);
        if let Some(latest) = latest
            && latest.owner != e.owner
            && window_of(&e.key, &e.owner).is_some_and(|own| {
                own.fence < latest.fence
                    && !(cfg.restart_loses_leases
                        && restarts
                            .iter()
                            .any(|&t| own.start <= t && t <= latest.start))
            })
        {
            v.push(Violation {
                invariant: "C6",
                detail: format!(
                    "{}: {} {:?} succeeded while {} (fence {}) held the lease",
                    e.key,
                    e.worker,
                    e.op.unwrap_or(Op::Renew),
                    latest.worker,
                    latest.fence
                ),
            });
        }
    }

    // C7: nothing acknowledged is lost.
    for e in events
        .iter()
        .filter(|e| e.op == Some(Op::Write) && e.phase == Some(Phase::Ok))
    {
        if let Some(seq) = e.seq
            && !state.audit.iter().any(|r| r.seq == seq)
        {
            v.push(Violation {
                invariant: "C7",
                detail: format!(
                    "{}: acknowledged write #{seq} by {} is missing",
                    e.key, e.worker
                ),
            });
        }
    }
    for (resource, value) in &state.counters {
        let rows = state
            .audit
            .iter()
            .filter(|r| &r.resource == resource)
            .count() as u64;
        if *value != rows {
            v.push(Violation {
                invariant: "C7",
                detail: format!(
                    "{resource}: counter is {value} after {rows} accepted increments (lost updates)"
                ),
            });
        }
    }

    // C8: one lease per acquire call; nothing left over at the end.
    let mut open_calls: HashMap<&str, u32> = HashMap::new();
    for e in events.iter().filter(|e| e.op == Some(Op::Acquire)) {
        match e.phase {
            Some(Phase::Invoke) => {
                open_calls.insert(e.worker.as_str(), 0);
            }
            Some(Phase::Ok) => {
                let n = open_calls.entry(e.worker.as_str()).or_insert(0);
                *n += 1;
                if *n > 1 {
                    v.push(Violation {
                        invariant: "C8",
                        detail: format!(
                            "{}: one acquire call of {} returned {n} leases",
                            e.key, e.worker
                        ),
                    });
                }
            }
            _ => {}
        }
    }
    for e in events
        .iter()
        .filter(|e| e.op == Some(Op::Inspect) && e.phase == Some(Phase::Ok))
    {
        if !e.owner.is_empty() {
            v.push(Violation {
                invariant: "C8",
                detail: format!("{}: lease of {} left over after the run", e.key, e.owner),
            });
        }
    }

    // C9: after a holder is killed, another takes over within the bound.
    let crashes = events.iter().filter(|e| {
        e.op == Some(Op::Fault) && e.detail.starts_with("kill9") && !e.detail.contains("end-of-run")
    });
    for f in crashes {
        let victim = &f.key;
        let held: Vec<&Window> = windows
            .iter()
            .filter(|w| &w.worker == victim && w.start <= f.t && f.t < w.end())
            .collect();
        for w in held {
            let bound = f.t.saturating_add(cfg.takeover_bound_ns);
            if run_end <= bound {
                continue;
            }
            let taken = windows
                .iter()
                .any(|o| o.key == w.key && o.start > f.t && o.start <= bound);
            if !taken {
                v.push(Violation {
                    invariant: "C9",
                    detail: format!(
                        "{}: nobody took over within the bound after {} was killed",
                        w.key, victim
                    ),
                });
            }
        }
    }

    // C10: no lost signal without a fault shortly before.
    let faults: Vec<u64> = events
        .iter()
        .filter(|e| e.op == Some(Op::Fault))
        .map(|e| e.t)
        .collect();
    for e in events.iter().filter(|e| e.op == Some(Op::Lost)) {
        let from = e.t.saturating_sub(cfg.quiet_ns);
        if !faults.iter().any(|&t| from <= t && t <= e.t) {
            v.push(Violation {
                invariant: "C10",
                detail: format!(
                    "{}: {} lost its lease ({}) with no fault before it",
                    e.key, e.worker, e.detail
                ),
            });
        }
    }
    v
}

fn killed(events: &[Event], worker: &str, before: u64) -> bool {
    events.iter().any(|e| {
        e.op == Some(Op::Fault) && e.key == worker && e.detail.starts_with("kill9") && e.t <= before
    })
}
