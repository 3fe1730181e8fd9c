//! The invariants C1–C10 of `docs/faults.md`, and C11 (the semaphore's bound), checked over a
//! recorded history.
//!
//! Times are `CLOCK_MONOTONIC` nanoseconds. What each event's time means (before or after
//! the act it records) is in [`history`](crate::history); every rule below only draws a
//! conclusion that those meanings make certain.
//!
//! # Windows, deadlines, lost observations
//!
//! A holder's *window* on a key belongs to one owner token. It starts at the acquire's
//! `ok` and ends at its *end*: the earliest of
//! - its *deadline* `D`: the `valid_until` of the acquire, raised by each renewal the
//!   client accepted (`renew ok`) before the window's first lost observation or release;
//!   the deadline *in force at* `t` counts only the renewals recorded by `t`. Every
//!   recorded deadline is at or after the client's real one (the worker reads its clock
//!   after the client did), so "at or after `D`" implies "at or after the real deadline";
//! - its first *lost observation*: a `lost` event, or a `check` or write probe that
//!   answered lost;
//! - its release's `invoke`.
//!
//! An incarnation is *frozen* from each `sigstop` against it until the next `sigcont` (or
//! for ever). Its *running-time due* for a deadline `D` is the instant at which it has run
//! (not frozen) for `lost_slack` after `D`.
//!
//! # The rules, exactly as checked
//!
//! | rule | flags | exemption (and its justification) |
//! | --- | --- | --- |
//! | C1 | an audit row, in `seq` (commit) order, with a lower fence than an earlier row of the same resource | none (docs/faults.md, "History checker": "Always") |
//! | C2 | one fence of one key recorded with two owners, by any of: acquire replies, the store's inspections, audit rows, worker events | `lossy_store` (docs/faults.md rows 10–11 admit fence reuse; C1 still holds) |
//! | C3 | two windows of different owners on one key that overlap | `lossy_store` (rows 10, 11, 13); `restart_loses_leases` and a store restart at `r` with `a.start ≤ r ≤ b.start` (rows 9–10: a store without persistence forgets the first holder's lease while it still runs) |
//! | C4a | a window whose deadline `D` passed while held (no lost observation or release before `D`) without a lost observation by its running-time due | the incarnation was killed by the due (a dead process fires nothing); the holder released it by the due (docs/design.md §4.6: a lease its holder released never reports lost); the history ends before the due |
//! | C4b | a `check` or write probe answering *not lost* at or after its window's deadline, or after the window's `lost` event was recorded. This is the "first act after resume" rule: a process frozen past its deadline must get *lost* from its first question after the `sigcont` | a probe at or after the holder's release invoke (docs/design.md §4.6: a lease its holder released never reports lost) |
//! | C4c | a write invoked at or after its window's deadline with no lost observation at or before it (its own probe counts) | none |
//! | C5 | a write invoked at or after its window's end, accepted (`ok`, or `unknown` with its owner's row in the audit) | accepted only while no write with a higher fence on that resource had been acknowledged (`write ok`) before it started: the guard compares fences (docs/design.md §6) and cannot know that a window ended until a newer holder's write is in |
//! | C6a | a renewal sent (`renew invoke`) with no validity left (`remaining_ns` 0), or after its lost signal fired (the observer's `lost` flag, or a `lost` event recorded at or before the send), or at or after the deadline in force | none |
//! | C6b | a renewal accepted by the client (`renew ok`) with no validity left or with the lost signal already fired | none |
//! | C6c | a renewal the store answered *renewed* (`renew ok`, or `renew fail` `refused`) or a release it answered *released* (`release ok`) sent at or after another owner's later grant of the key was recorded | none |
//! | C7a | an acknowledged write (`write ok`) whose `seq` is missing from the audit | none |
//! | C7b | a counter that differs from its number of audit rows (a lost update) | none |
//! | C8a | one owner token recorded with two fences, by any of: acquire replies, the store's inspections, audit rows, worker events | a later, higher fence first seen at least a TTL after an earlier one that no acquire returned (docs/design.md §4.11, ambiguous replies: a retry with the same owner "returns the lease already granted or grants it fresh"; a grant the caller never got is never renewed, so it has expired a TTL after it was first seen); with `failover_forgets_unacknowledged` (Sentinel, `min_replicas`), also a later, higher fence with a store fault between the two sightings, after an earlier one no acquire returned (a grant the replica did not acknowledge is answered ambiguously, and the fail-over forgets it); with `inspect_sees_candidates` (Redlock), also a later, higher fence after an earlier one that only inspections saw, each while an acquire call of the owner was in flight: the call that returned the owner, or, for an owner that no call returned, a call on the key that returned no lease (between an acquire's two rounds the nodes hold candidate fences, and an inspection takes the highest of the nodes that answered it; a call that fails leaves them until they expire); on any store, also a later, higher fence after an earlier one no acquire returned, when another owner was seen holding the key between the two sightings with a fence between the two (the store had ended the earlier grant: ZooKeeper drops a waiter's reservation a second after its owner's last call) |
//! | C8b | the final inspection (`inspect` `final`, after every worker is gone and the bound has passed) shows a lease | none |
//! | C9 | a `kill9` of an incarnation inside one of its windows with no window of that key starting within `takeover_bound` after it, the bound moved on by the time store faults (restart, fail-over) take within it | the harness's `end-kill` (nobody is left to take over); the history ends before the bound |
//! | C10 | a window's first lost observation that no fault on its own incarnation or path explains | a fault explains it when it is a freeze of that incarnation, a proxy fault on its slot's own proxy (until `proxy-pass`), or a store restart (until `store-back`), that started at or before the observation and ended no more than `fault_reach` before it: a lease whose renewals a fault broke or delayed is lost by its deadline, within a TTL of the last renewal sent before the fault ended |
//! | C11 | with [`CheckConfig::permits`] = N: more than N windows of different leases on the slot keys of one semaphore (`NAME#<i>`, any `i`, grouped by `NAME`) in force at one instant (counted at each window's start: the windows started at or before it and not yet ended, itself included) | C3's, and no broader: with `lossy_store` it is not checked (as C3); with `restart_loses_leases`, an earlier window is not counted against a later one when a store restart `r` has `earlier.start ≤ r ≤ later.start` (the pair C3 exempts); the later window always counts |
//!
//! C10's fault-free counterpart is the fault-free run, which must show no lost
//! observation and no rejected write at all.
//!
//! Every rule also fires on a history a real run recorded: the control runs of
//! `leasehold-chaos`'s `tests/runs.rs`, each with a deliberately broken part (its `broken` module; C1 and C5:
//! the runs without the guard; C11: the overcommitted semaphore). Every rule can be
//! provoked that way, so none is exempt from having one.
//!
//! # What the rules cannot see
//!
//! - A write invoked before its window ended and committed after it: the audit has no
//!   commit instant, so C5 cannot judge it; C1 flags it only if a newer fence's write
//!   committed first.
//! - A grant no acquire call returned (an orphan after an ambiguous reply), unless it is
//!   still in the store at the final inspection (C8b) or carries a fence another owner
//!   holds (C2).
//! - The library's renewals are seen through its observer, stamped when the observer is
//!   called: C6 trusts that the request goes out after `Sent` and that `remaining` and
//!   `lost` were read at the event.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use crate::history::{AuditRow, Event, FaultKind, FinalState, MemberRole, Op, Phase, slot_of};

/// Bounds and allowances of one check.
#[derive(Debug, Clone)]
pub struct CheckConfig {
    /// The lease TTL.
    pub ttl_ns: u64,
    /// C4a: how long, in the incarnation's running time after its deadline, its lost
    /// signal may take to be observed (the watchdog thread's and the watcher task's
    /// scheduling delay on a loaded host).
    pub lost_slack_ns: u64,
    /// C9: a takeover must happen within this bound after the holder is killed.
    pub takeover_bound_ns: u64,
    /// C10: how long after a fault ended it may still explain a lost signal.
    pub fault_reach_ns: u64,
    /// C2/C3 relaxed: the failure model admits fence reuse and overlapping windows (docs/faults.md
    /// rows 10, 11, 13). C1 is never relaxed.
    pub lossy_store: bool,
    /// A store restart loses the leases it held (Redis without persistence, docs/faults.md rows
    /// 9–10): C3 is relaxed for a pair of windows with a restart between their starts,
    /// and C11 likewise.
    pub restart_loses_leases: bool,
    /// A fail-over forgets a grant the replicas did not acknowledge (Sentinel with
    /// `min_replicas`: such a grant was answered ambiguously, never returned): C8a admits
    /// the same owner's later, higher fence when a store fault spans the time between
    /// the two sightings.
    pub failover_forgets_unacknowledged: bool,
    /// The store's inspection may read a grant between the rounds of a two-round acquire
    /// (Redlock: round one records each node's candidate fence, round two the highest of
    /// them): C8a admits the same owner's higher fence after an earlier one that only
    /// inspections saw, all of them while an acquire call of that owner was in flight
    /// (from its invoke to its reply). The call is the one that returned the owner; for an
    /// owner no call returned (the library draws an owner per call and records none on
    /// failure), a call on the key that returned no lease (from its invoke to its failure,
    /// to its worker's kill, or to the end of the history). The owner never held the
    /// earlier fence.
    pub inspect_sees_candidates: bool,
    /// A store restart or fail-over gives every lease a fresh TTL when the store is back
    /// (etcd's new leader renews every lease by its TTL plus an election timeout; a
    /// restarted ZooKeeper server gives every session it restores a fresh timeout): a
    /// killed holder's lease
    /// then lives on a TTL after the store's return, so C9's takeover bound starts again
    /// there (as if the holder had been killed at that moment), besides moving on by the
    /// fault's length. Not for a `restart-store` that kills a follower
    /// ([`Event::member`] [`MemberRole::Follower`]): a follower's kill changes no leader
    /// and renews nothing.
    pub restart_renews_leases: bool,
    /// C11: the keys are the slots of semaphores of this many permits (`NAME#<i>`); at
    /// most this many windows on the slots of one `NAME` may be in force at once. `None`
    /// (a lease run): C11 is not checked.
    pub permits: Option<u32>,
}

impl CheckConfig {
    /// Defaults for a TTL: lost slack TTL/4, takeover bound 3×TTL, fault reach 1×TTL.
    pub fn for_ttl_ns(ttl_ns: u64) -> Self {
        Self {
            ttl_ns,
            lost_slack_ns: ttl_ns / 4,
            takeover_bound_ns: ttl_ns * 3,
            fault_reach_ns: ttl_ns,
            lossy_store: false,
            restart_loses_leases: false,
            failover_forgets_unacknowledged: false,
            inspect_sees_candidates: false,
            restart_renews_leases: false,
            permits: None,
        }
    }
}

/// One broken invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// `"C1"` … `"C11"`.
    pub invariant: &'static str,
    /// The rule of the invariant that flagged it (`"C4a"`, …; the invariant itself when
    /// it has one rule).
    pub rule: &'static str,
    /// What was seen.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.invariant, self.rule, self.detail)
    }
}

fn violation(invariant: &'static str, rule: &'static str, detail: String) -> Violation {
    Violation {
        invariant,
        rule,
        detail,
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
    /// `(recorded at, deadline from then on)`, in time order; the first is the acquire's.
    steps: Vec<(u64, u64)>,
    /// The first `lost` event.
    lost_event: Option<u64>,
    /// The first lost observation (a `lost` event, a check or probe answering lost).
    lost_seen: Option<u64>,
    released_at: Option<u64>,
}

impl Window {
    /// The final deadline.
    fn deadline(&self) -> u64 {
        self.steps.last().map_or(self.start, |s| s.1)
    }

    /// The deadline in force at `t` (renewals recorded by `t`).
    fn deadline_at(&self, t: u64) -> u64 {
        self.steps
            .iter()
            .take_while(|s| s.0 <= t)
            .last()
            .map_or(self.start, |s| s.1)
    }

    fn end(&self) -> u64 {
        let mut end = self.deadline();
        if let Some(l) = self.lost_seen {
            end = end.min(l);
        }
        if let Some(r) = self.released_at {
            end = end.min(r);
        }
        end
    }
}

/// Whether `e` observed its lease lost: a `lost` event, or a check or write probe that
/// answered lost.
fn observes_lost(e: &Event) -> bool {
    match e.op {
        Some(Op::Lost) => true,
        Some(Op::Check) => e.lost == Some(true),
        Some(Op::Write) => e.phase == Some(Phase::Invoke) && e.lost == Some(true),
        _ => false,
    }
}

fn windows(events: &[Event]) -> Vec<Window> {
    let mut out: Vec<Window> = Vec::new();
    let mut index: HashMap<(&str, &str), usize> = HashMap::new();
    for e in events {
        let k = (e.key.as_str(), e.owner.as_str());
        if e.op == Some(Op::Acquire) && e.phase == Some(Phase::Ok) {
            index.insert(k, out.len());
            out.push(Window {
                key: e.key.clone(),
                owner: e.owner.clone(),
                worker: e.worker.clone(),
                fence: e.fence.unwrap_or(0),
                start: e.t,
                steps: vec![(e.t, e.valid_until.unwrap_or(e.t))],
                lost_event: None,
                lost_seen: None,
                released_at: None,
            });
            continue;
        }
        let Some(&i) = index.get(&k) else { continue };
        let w = &mut out[i];
        if observes_lost(e) {
            w.lost_seen.get_or_insert(e.t);
        }
        match (e.op, e.phase) {
            (Some(Op::Renew), Some(Phase::Ok))
                if w.lost_seen.is_none() && w.released_at.is_none() =>
            {
                let until = e.valid_until.unwrap_or(0).max(w.deadline());
                w.steps.push((e.t, until));
            }
            (Some(Op::Lost), _) => {
                w.lost_event.get_or_insert(e.t);
            }
            (Some(Op::Release), Some(Phase::Invoke)) => {
                w.released_at.get_or_insert(e.t);
            }
            _ => {}
        }
    }
    out
}

/// Per incarnation: frozen intervals `(sigstop, sigcont)` (`u64::MAX`: never resumed),
/// in time order.
fn freezes(events: &[Event]) -> HashMap<&str, Vec<(u64, u64)>> {
    let mut open: HashMap<&str, u64> = HashMap::new();
    let mut out: HashMap<&str, Vec<(u64, u64)>> = HashMap::new();
    for e in events.iter().filter(|e| e.op == Some(Op::Fault)) {
        match e.fault {
            Some(FaultKind::Sigstop) => {
                open.entry(e.key.as_str()).or_insert(e.t);
            }
            Some(FaultKind::Sigcont) => {
                if let Some(start) = open.remove(e.key.as_str()) {
                    out.entry(e.key.as_str()).or_default().push((start, e.t));
                }
            }
            _ => {}
        }
    }
    for (target, start) in open {
        out.entry(target).or_default().push((start, u64::MAX));
    }
    for v in out.values_mut() {
        v.sort_unstable();
    }
    out
}

/// The instant at which a process with these freezes has run for `run` ns after `from`.
fn after_running(freezes: &[(u64, u64)], from: u64, run: u64) -> u64 {
    let mut t = from;
    let mut left = run;
    for &(s, c) in freezes {
        if s > t {
            let gap = s - t;
            if gap >= left {
                return t + left;
            }
            left -= gap;
        }
        t = t.max(c);
    }
    t.saturating_add(left)
}

/// Intervals during which a fault was in effect, per target.
fn fault_spans(
    events: &[Event],
    start: fn(FaultKind) -> bool,
    end: fn(FaultKind) -> bool,
) -> Vec<(&str, u64, u64)> {
    let mut open: HashMap<&str, u64> = HashMap::new();
    let mut out = Vec::new();
    for e in events.iter().filter(|e| e.op == Some(Op::Fault)) {
        let Some(kind) = e.fault else { continue };
        if start(kind) {
            open.entry(e.key.as_str()).or_insert(e.t);
        } else if end(kind)
            && let Some(s) = open.remove(e.key.as_str())
        {
            out.push((e.key.as_str(), s, e.t));
        }
    }
    out.extend(open.into_iter().map(|(k, s)| (k, s, u64::MAX)));
    out
}

/// The store faults (a restart or fail-over, `restart-store` until `store-back`).
fn store_spans(events: &[Event]) -> Vec<(&str, u64, u64)> {
    fault_spans(
        events,
        |k| k == FaultKind::RestartStore,
        |k| k == FaultKind::StoreBack,
    )
}

/// Checks every invariant; returns the violations (empty = the history is fine).
pub fn check(events: &[Event], state: &FinalState, cfg: &CheckConfig) -> Vec<Violation> {
    let mut events = events.to_vec();
    events.sort_by_key(|e| e.t);
    let events = &events[..];
    let mut v = Vec::new();
    let windows = windows(events);
    let window_of = |key: &str, owner: &str| {
        windows
            .iter()
            .rev()
            .find(|w| w.key == key && w.owner == owner)
    };
    let run_end = events.last().map_or(0, |e| e.t);
    let mut audit: Vec<&AuditRow> = state.audit.iter().collect();
    audit.sort_by_key(|r| r.seq);

    c1(&audit, &mut v);
    if !cfg.lossy_store {
        c2(events, &audit, &mut v);
        c3(events, &windows, cfg, &mut v);
        if let Some(n) = cfg.permits {
            c11(events, &windows, n, cfg, &mut v);
        }
    }
    c4(events, &windows, cfg, run_end, &mut v);

    // C5: a write started after its window ended is not accepted once a newer holder's
    // write had been acknowledged.
    for (i, e) in events.iter().enumerate() {
        if e.op != Some(Op::Write) || e.phase != Some(Phase::Invoke) {
            continue;
        }
        let Some(w) = window_of(&e.key, &e.owner) else {
            continue;
        };
        if e.t < w.end() {
            continue;
        }
        let fence = e.fence.unwrap_or(w.fence);
        // The first reply after the invoke (the invoke itself is skipped by its phase).
        let outcome = events[i..].iter().find(|o| {
            o.op == Some(Op::Write)
                && o.owner == e.owner
                && o.key == e.key
                && o.phase != Some(Phase::Invoke)
        });
        let accepted = match outcome.and_then(|o| o.phase) {
            Some(Phase::Ok) => true,
            Some(Phase::Unknown) => audit
                .iter()
                .any(|r| r.owner == e.owner && r.resource == e.key),
            _ => false,
        };
        let newer = events.iter().find(|o| {
            o.t <= e.t
                && o.op == Some(Op::Write)
                && o.phase == Some(Phase::Ok)
                && o.key == e.key
                && o.fence.is_some_and(|f| f > fence)
        });
        if accepted && let Some(newer) = newer {
            v.push(violation(
                "C5",
                "C5",
                format!(
                    "{}: {} started a write with fence {fence} {} ns after its window ended, after a write with fence {} was acknowledged, and it was accepted",
                    e.key,
                    e.worker,
                    e.t - w.end(),
                    newer.fence.unwrap_or(0)
                ),
            ));
        }
    }

    c6(events, &windows, &mut v);
    c7(events, state, &mut v);
    c8(events, &audit, cfg, &mut v);
    c9(events, &windows, cfg, run_end, &mut v);
    c10(events, &windows, cfg, &mut v);
    v
}

/// C1: accepted writes, in commit order, never go back in fence per resource.
fn c1(audit: &[&AuditRow], v: &mut Vec<Violation>) {
    let mut highest: HashMap<&str, &AuditRow> = HashMap::new();
    for row in audit {
        if let Some(prev) = highest.get(row.resource.as_str())
            && row.fence < prev.fence
        {
            v.push(violation(
                "C1",
                "C1",
                format!(
                    "{}: write #{} with fence {} committed after write #{} with fence {}",
                    row.resource, row.seq, row.fence, prev.seq, prev.fence
                ),
            ));
            continue;
        }
        highest.insert(row.resource.as_str(), row);
    }
}

/// One sighting of an owner with a fence: when (`u64::MAX` for the audit, which has no
/// time), whether an acquire returned it to a worker, and where it was seen.
struct Seen<'a> {
    key: &'a str,
    owner: &'a str,
    fence: u64,
    t: u64,
    returned: bool,
    /// Seen by an inspection of the store.
    inspected: bool,
    what: String,
}

/// Every `(key, owner, fence)` the history and the audit record.
fn grants<'a>(events: &'a [Event], audit: &[&'a AuditRow]) -> Vec<Seen<'a>> {
    let mut out = Vec::new();
    for e in events {
        if let (Some(fence), false) = (e.fence, e.owner.is_empty()) {
            let op =
                e.op.map_or("?".to_owned(), |o| format!("{o:?}").to_lowercase());
            out.push(Seen {
                key: e.key.as_str(),
                owner: e.owner.as_str(),
                fence,
                t: e.t,
                returned: e.op == Some(Op::Acquire) && e.phase == Some(Phase::Ok),
                inspected: e.op == Some(Op::Inspect),
                what: format!("{op} by {}", e.worker),
            });
        }
    }
    for r in audit {
        out.push(Seen {
            key: r.resource.as_str(),
            owner: r.owner.as_str(),
            fence: r.fence,
            t: u64::MAX,
            returned: false,
            inspected: false,
            what: format!("audit row #{}", r.seq),
        });
    }
    out
}

/// C2: a fence of a key belongs to one owner.
fn c2(events: &[Event], audit: &[&AuditRow], v: &mut Vec<Violation>) {
    let mut owners: BTreeMap<(&str, u64), BTreeMap<&str, String>> = BTreeMap::new();
    for g in grants(events, audit) {
        owners
            .entry((g.key, g.fence))
            .or_default()
            .entry(g.owner)
            .or_insert(g.what);
    }
    for ((key, fence), by) in owners {
        if by.len() > 1 {
            let list: Vec<String> = by.iter().map(|(o, s)| format!("{o} ({s})")).collect();
            v.push(violation(
                "C2",
                "C2",
                format!("{key}: fence {fence} recorded for {}", list.join(" and ")),
            ));
        }
    }
}

/// The instants of the store restarts.
fn restarts(events: &[Event]) -> Vec<u64> {
    events
        .iter()
        .filter(|e| e.op == Some(Op::Fault) && e.fault == Some(FaultKind::RestartStore))
        .map(|e| e.t)
        .collect()
}

/// C3's exemption for a pair of overlapping windows, `a` started at or before `b`: the
/// store loses leases on a restart and one happened between their starts (it may have
/// forgotten `a` when it granted `b`).
fn restart_between(cfg: &CheckConfig, restarts: &[u64], a: &Window, b: &Window) -> bool {
    cfg.restart_loses_leases && restarts.iter().any(|&t| a.start <= t && t <= b.start)
}

/// C3: windows of different owners on one key do not overlap.
fn c3(events: &[Event], windows: &[Window], cfg: &CheckConfig, v: &mut Vec<Violation>) {
    let restarts = restarts(events);
    let mut by_key: BTreeMap<&str, Vec<&Window>> = BTreeMap::new();
    for w in windows {
        by_key.entry(w.key.as_str()).or_default().push(w);
    }
    for ws in by_key.values_mut() {
        ws.sort_by_key(|w| w.start);
        // Each window against every window that started before it (or with it).
        for (j, b) in ws.iter().enumerate() {
            for a in &ws[..j] {
                if a.owner == b.owner || b.start >= a.end() {
                    continue;
                }
                if !restart_between(cfg, &restarts, a, b) {
                    v.push(violation(
                        "C3",
                        "C3",
                        format!(
                            "{}: {} (fence {}) held until {} but {} (fence {}) acquired at {}",
                            a.key,
                            a.worker,
                            a.fence,
                            a.end(),
                            b.worker,
                            b.fence,
                            b.start
                        ),
                    ));
                }
            }
        }
    }
}

/// The semaphore a slot key belongs to: `NAME` for `NAME#<digits>`.
fn semaphore_of(key: &str) -> Option<&str> {
    let (name, slot) = key.rsplit_once('#')?;
    (!name.is_empty() && !slot.is_empty() && slot.bytes().all(|b| b.is_ascii_digit()))
        .then_some(name)
}

/// C11: at no instant are more than `n` windows on the slots of one semaphore in force.
///
/// The number in force only rises at a window's start, so it is counted there: window
/// `b` with every window `a` started at or before it (and listed before it) that has not
/// ended by `b.start`. As in C3, an `a` of the same lease (key and owner) is not another
/// holder, and an `a` with a store restart between the starts is not counted when
/// restarts lose leases.
fn c11(events: &[Event], windows: &[Window], n: u32, cfg: &CheckConfig, v: &mut Vec<Violation>) {
    let restarts = restarts(events);
    let mut by_name: BTreeMap<&str, Vec<&Window>> = BTreeMap::new();
    for w in windows {
        if let Some(name) = semaphore_of(&w.key) {
            by_name.entry(name).or_default().push(w);
        }
    }
    let bound = usize::try_from(n).unwrap_or(usize::MAX);
    for (name, ws) in &mut by_name {
        ws.sort_by_key(|w| w.start);
        for (j, b) in ws.iter().enumerate() {
            let mut live: Vec<&Window> = ws[..j]
                .iter()
                .copied()
                .filter(|a| b.start < a.end())
                .filter(|a| !(a.key == b.key && a.owner == b.owner))
                .filter(|a| !restart_between(cfg, &restarts, a, b))
                .collect();
            live.push(b);
            if live.len() > bound {
                let list: Vec<String> = live
                    .iter()
                    .map(|w| format!("{} on {} (fence {})", w.worker, w.key, w.fence))
                    .collect();
                v.push(violation(
                    "C11",
                    "C11",
                    format!(
                        "{name}: {} windows in force at {} with {n} permits: {}",
                        live.len(),
                        b.start,
                        list.join(", ")
                    ),
                ));
            }
        }
    }
}

/// C4: the lost signal is observed by the deadline (in running time), every question
/// asked after it answers lost, and no write starts after it before that.
fn c4(
    events: &[Event],
    windows: &[Window],
    cfg: &CheckConfig,
    run_end: u64,
    v: &mut Vec<Violation>,
) {
    let freezes = freezes(events);
    let no_freezes = Vec::new();
    let killed_by = |worker: &str, t: u64| {
        events.iter().any(|e| {
            e.op == Some(Op::Fault)
                && matches!(e.fault, Some(FaultKind::Kill9 | FaultKind::EndKill))
                && e.key == worker
                && e.t <= t
        })
    };
    // C4a.
    for w in windows {
        // A window that ended before its deadline (lost or released) passes below: its
        // observation or release is before the due.
        let d = w.deadline();
        let fr = freezes.get(w.worker.as_str()).unwrap_or(&no_freezes);
        let due = after_running(fr, d, cfg.lost_slack_ns);
        if w.lost_seen.is_some_and(|l| l <= due)
            || w.released_at.is_some_and(|r| r <= due)
            || killed_by(&w.worker, due)
            || run_end < due
        {
            continue;
        }
        let when = match w.lost_seen {
            Some(l) => format!("{} ns after its due", l - due),
            None => "never".to_owned(),
        };
        v.push(violation(
            "C4",
            "C4a",
            format!(
                "{}: {} (fence {}) passed its deadline; its lost signal was observed {when}",
                w.key, w.worker, w.fence
            ),
        ));
    }
    let window_of = |key: &str, owner: &str| {
        windows
            .iter()
            .rev()
            .find(|w| w.key == key && w.owner == owner)
    };
    for e in events {
        let probe = match (e.op, e.phase) {
            (Some(Op::Check), _) => "check",
            (Some(Op::Write), Some(Phase::Invoke)) => "write probe",
            _ => continue,
        };
        let Some(w) = window_of(&e.key, &e.owner) else {
            continue;
        };
        // C4b.
        if e.lost == Some(false) && w.released_at.is_none_or(|r| r > e.t) {
            let d = w.deadline();
            if e.t >= d {
                v.push(violation(
                    "C4",
                    "C4b",
                    format!(
                        "{}: {} {probe} answered not lost {} ns after its deadline",
                        e.key,
                        e.worker,
                        e.t - d
                    ),
                ));
            } else if let Some(l) = w.lost_event.filter(|&l| e.t > l) {
                v.push(violation(
                    "C4",
                    "C4b",
                    format!(
                        "{}: {} {probe} answered not lost {} ns after its lost signal fired",
                        e.key,
                        e.worker,
                        e.t - l
                    ),
                ));
            }
        }
        // C4c.
        if probe == "write probe" && e.t >= w.deadline() && w.lost_seen.is_none_or(|l| l > e.t) {
            v.push(violation(
                "C4",
                "C4c",
                format!(
                    "{}: {} started a write {} ns after its deadline before observing its lost signal",
                    e.key,
                    e.worker,
                    e.t - w.deadline()
                ),
            ));
        }
    }
}

/// C6: the library's renewals stop at the deadline and the lost signal, and stale calls
/// never extend or remove another owner's lease.
fn c6(events: &[Event], windows: &[Window], v: &mut Vec<Violation>) {
    let window_of = |key: &str, owner: &str| {
        windows
            .iter()
            .rev()
            .find(|w| w.key == key && w.owner == owner)
    };
    for (i, e) in events.iter().enumerate() {
        let Some(w) = window_of(&e.key, &e.owner) else {
            continue;
        };
        match (e.op, e.phase) {
            // C6a.
            (Some(Op::Renew), Some(Phase::Invoke)) => {
                let d = w.deadline_at(e.t);
                let why = if e.remaining_ns == Some(0) {
                    Some("with no validity left".to_owned())
                } else if e.lost == Some(true) {
                    Some("after its lost signal fired".to_owned())
                } else if let Some(l) = w.lost_event.filter(|&l| l <= e.t) {
                    Some(format!("{} ns after its lost event", e.t - l))
                } else if e.t >= d {
                    Some(format!("{} ns after its deadline", e.t - d))
                } else {
                    None
                };
                if let Some(why) = why {
                    v.push(violation(
                        "C6",
                        "C6a",
                        format!("{}: {} sent a renewal {why}", e.key, e.worker),
                    ));
                }
            }
            // C6b.
            (Some(Op::Renew), Some(Phase::Ok))
                if e.remaining_ns == Some(0) || e.lost == Some(true) =>
            {
                v.push(violation(
                    "C6",
                    "C6b",
                    format!(
                        "{}: {} accepted a renewal {}",
                        e.key,
                        e.worker,
                        if e.lost == Some(true) {
                            "after its lost signal fired"
                        } else {
                            "with no validity left"
                        }
                    ),
                ));
            }
            _ => {}
        }
        // C6c.
        let said_yes = match (e.op, e.phase) {
            (Some(Op::Renew), Some(Phase::Ok)) => true,
            (Some(Op::Renew), Some(Phase::Fail)) => e.detail == "refused",
            (Some(Op::Release), Some(Phase::Ok)) => true,
            _ => false,
        };
        if !said_yes {
            continue;
        }
        let sent = events[..i]
            .iter()
            .rev()
            .find(|s| {
                s.op == e.op
                    && s.phase == Some(Phase::Invoke)
                    && s.owner == e.owner
                    && s.key == e.key
            })
            .map_or(e.t, |s| s.t);
        if let Some(newer) = windows
            .iter()
            .find(|o| o.key == e.key && o.owner != e.owner && o.start > w.start && o.start <= sent)
        {
            v.push(violation(
                "C6",
                "C6c",
                format!(
                    "{}: {}'s {:?} sent after {} (fence {}) acquired the key was answered yes",
                    e.key,
                    e.worker,
                    e.op.unwrap_or(Op::Renew),
                    newer.worker,
                    newer.fence
                ),
            ));
        }
    }
}

/// C7: nothing acknowledged is lost.
fn c7(events: &[Event], state: &FinalState, v: &mut Vec<Violation>) {
    for e in events
        .iter()
        .filter(|e| e.op == Some(Op::Write) && e.phase == Some(Phase::Ok))
    {
        if let Some(seq) = e.seq
            && !state.audit.iter().any(|r| r.seq == seq)
        {
            v.push(violation(
                "C7",
                "C7a",
                format!(
                    "{}: acknowledged write #{seq} by {} is missing",
                    e.key, e.worker
                ),
            ));
        }
    }
    for (resource, value) in &state.counters {
        let rows = state
            .audit
            .iter()
            .filter(|r| &r.resource == resource)
            .count() as u64;
        if *value != rows {
            v.push(violation(
                "C7",
                "C7b",
                format!(
                    "{resource}: counter is {value} after {rows} accepted increments (lost updates)"
                ),
            ));
        }
    }
}

/// One fence of one owner, as first seen.
struct Fenced {
    first: u64,
    /// The last sighting.
    last: u64,
    fence: u64,
    returned: bool,
    /// Every sighting was an inspection of the store.
    inspected_only: bool,
    what: String,
}

/// The acquire calls, from each call's invoke (the worker's last acquire invoke before its
/// end) to its end.
#[derive(Default)]
struct AcquireSpans<'a> {
    /// The calls that returned a lease, by key and owner.
    returned: BTreeMap<(&'a str, &'a str), Vec<(u64, u64)>>,
    /// The calls that returned none, by the key invoked (a semaphore's name in semaphore
    /// mode): ended by a failure, by the kill of the worker's incarnation, or never (to the
    /// end of the history). Their owner is not recorded: the library draws it per call.
    unreturned: BTreeMap<&'a str, Vec<(u64, u64)>>,
}

impl AcquireSpans<'_> {
    /// Whether every sighting of `a` (`key`, `owner`) lies within one acquire call of that
    /// owner: one that returned a lease to `owner`, or, when `owner` was never returned by
    /// any call (`owner_returned` false), one on the key that returned no lease.
    fn in_flight(&self, key: &str, owner: &str, owner_returned: bool, a: &Fenced) -> bool {
        let within =
            |s: &Vec<(u64, u64)>| s.iter().any(|&(from, to)| from <= a.first && a.last <= to);
        if self.returned.get(&(key, owner)).is_some_and(within) {
            return true;
        }
        !owner_returned
            && self.unreturned.iter().any(|(invoked, s)| {
                (key == *invoked
                    || key
                        .strip_prefix(*invoked)
                        .is_some_and(|slot| slot.starts_with('#')))
                    && within(s)
            })
    }
}

fn acquire_spans(events: &[Event]) -> AcquireSpans<'_> {
    let mut spans = AcquireSpans::default();
    let mut invoked: BTreeMap<&str, (&str, u64)> = BTreeMap::new();
    for e in events {
        match (e.op, e.phase) {
            (Some(Op::Acquire), Some(Phase::Invoke)) => {
                invoked.insert(e.worker.as_str(), (e.key.as_str(), e.t));
            }
            (Some(Op::Acquire), Some(Phase::Ok)) => {
                let from = invoked
                    .remove(e.worker.as_str())
                    .map_or(e.t, |(_, from)| from);
                spans
                    .returned
                    .entry((e.key.as_str(), e.owner.as_str()))
                    .or_default()
                    .push((from, e.t));
            }
            (Some(Op::Acquire), Some(Phase::Fail | Phase::Unknown)) => {
                if let Some((key, from)) = invoked.remove(e.worker.as_str()) {
                    spans.unreturned.entry(key).or_default().push((from, e.t));
                }
            }
            (Some(Op::Fault), _)
                if matches!(e.fault, Some(FaultKind::Kill9 | FaultKind::EndKill)) =>
            {
                if let Some((key, from)) = invoked.remove(e.key.as_str()) {
                    spans.unreturned.entry(key).or_default().push((from, e.t));
                }
            }
            _ => {}
        }
    }
    for (key, from) in invoked.into_values() {
        spans
            .unreturned
            .entry(key)
            .or_default()
            .push((from, u64::MAX));
    }
    spans
}

/// C8: one owner token, one fence; nothing left over at the end.
fn c8(events: &[Event], audit: &[&AuditRow], cfg: &CheckConfig, v: &mut Vec<Violation>) {
    let store = store_spans(events);
    let spans = acquire_spans(events);
    // Per owner and fence: first sighting, whether an acquire returned it, where seen.
    let mut fences: BTreeMap<(&str, &str), BTreeMap<u64, Fenced>> = BTreeMap::new();
    // Every sighting of a holder with its fence, by key: (when, owner, fence). Audit rows
    // have no time of their own and are left out.
    let sightings = grants(events, audit);
    let mut held_by: BTreeMap<&str, Vec<(u64, &str, u64)>> = BTreeMap::new();
    for g in sightings.iter().filter(|g| g.t != u64::MAX) {
        held_by
            .entry(g.key)
            .or_default()
            .push((g.t, g.owner, g.fence));
    }
    for g in sightings {
        let f = fences
            .entry((g.key, g.owner))
            .or_default()
            .entry(g.fence)
            .or_insert(Fenced {
                first: g.t,
                last: g.t,
                fence: g.fence,
                returned: false,
                inspected_only: true,
                what: g.what,
            });
        f.first = f.first.min(g.t);
        f.last = f.last.max(g.t);
        f.returned |= g.returned;
        f.inspected_only &= g.inspected;
    }
    for ((key, owner), by) in fences {
        let mut seen: Vec<Fenced> = by.into_values().collect();
        seen.sort_by_key(|f| (f.first, f.fence));
        // A fresh grant after an ambiguous reply: the earlier grant was never returned to
        // the caller (so nobody renewed it) and had expired (a TTL after it was first
        // seen) when the later, higher one was.
        // Or (`failover_forgets_unacknowledged`) a fail-over between the two sightings
        // forgot the earlier, unreturned grant.
        let forgotten = |a: &Fenced, b: &Fenced| {
            cfg.failover_forgets_unacknowledged
                && store.iter().any(|&(_, s, e)| s <= b.first && a.first <= e)
        };
        // Or (`inspect_sees_candidates`) the earlier fence was a candidate that only
        // inspections saw, while an acquire call of this owner was in flight (one that
        // returned this owner, or, for an owner no call returned, one that returned none).
        let owner_returned = seen.iter().any(|f| f.returned);
        let candidate = |a: &Fenced| {
            cfg.inspect_sees_candidates
                && a.inspected_only
                && spans.in_flight(key, owner, owner_returned, a)
        };
        // Or another owner was seen holding the key after the earlier sighting and before
        // the later one, with a fence between the two: the store had given the key to
        // someone else, so the earlier grant (a waiter's reservation the store dropped when
        // its owner made no call, a grant deleted unclaimed) had ended, and the later one
        // is a fresh grant. Any store: a key held by another owner in between is the
        // store's own word that the earlier one was over.
        let taken_between = |a: &Fenced, b: &Fenced| {
            held_by.get(key).is_some_and(|others| {
                others.iter().any(|&(t, o, f)| {
                    o != owner && a.fence < f && f < b.fence && a.last <= t && t <= b.first
                })
            })
        };
        let fresh = |a: &Fenced, b: &Fenced| {
            !a.returned
                && b.fence > a.fence
                && (b.first >= a.first.saturating_add(cfg.ttl_ns)
                    || forgotten(a, b)
                    || candidate(a)
                    || taken_between(a, b))
        };
        if seen.windows(2).any(|p| !fresh(&p[0], &p[1])) {
            let list: Vec<String> = seen
                .iter()
                .map(|f| format!("{} ({})", f.fence, f.what))
                .collect();
            v.push(violation(
                "C8",
                "C8a",
                format!(
                    "{key}: owner {owner} recorded with fences {}",
                    list.join(" and ")
                ),
            ));
        }
    }
    for e in events
        .iter()
        .filter(|e| e.op == Some(Op::Inspect) && e.phase == Some(Phase::Ok) && e.detail == "final")
    {
        if !e.owner.is_empty() {
            v.push(violation(
                "C8",
                "C8b",
                format!("{}: lease of {} left over after the run", e.key, e.owner),
            ));
        }
    }
}

/// The instant by which a kill at `t` must have been taken over: `t + bound`, moved on by
/// the time store faults take within it (no store grants anything while it restarts or
/// fails over), counting each fault that starts before the moving end. With `renews` (the
/// store gives every lease a fresh TTL when it is back), also no sooner than `bound` after
/// each such fault that renews (`(start, end, renews)`).
fn takeover_bound(t: u64, bound: u64, store: &[(u64, u64, bool)]) -> u64 {
    let mut end = t.saturating_add(bound);
    let mut counted = vec![false; store.len()];
    loop {
        let mut moved = false;
        for (i, &(s, e, renews)) in store.iter().enumerate() {
            if !counted[i] && s < end && e > t {
                counted[i] = true;
                end = end.saturating_add(e - s.max(t));
                if renews {
                    end = end.max(e.saturating_add(bound));
                }
                moved = true;
            }
        }
        if !moved {
            return end;
        }
    }
}

/// C9: after a holder is killed, another takes over within the bound (a worker records
/// the grant, or the harness's inspection of the store sees another owner with a higher
/// fence).
fn c9(
    events: &[Event],
    windows: &[Window],
    cfg: &CheckConfig,
    run_end: u64,
    v: &mut Vec<Violation>,
) {
    let store: Vec<(u64, u64, bool)> = store_spans(events)
        .into_iter()
        .map(|(_, s, e)| {
            let follower = events.iter().any(|x| {
                x.t == s
                    && x.fault == Some(FaultKind::RestartStore)
                    && x.member == Some(MemberRole::Follower)
            });
            (s, e, cfg.restart_renews_leases && !follower)
        })
        .collect();
    for f in events
        .iter()
        .filter(|e| e.op == Some(Op::Fault) && e.fault == Some(FaultKind::Kill9))
    {
        let bound = takeover_bound(f.t, cfg.takeover_bound_ns, &store);
        if run_end < bound {
            continue;
        }
        for w in windows
            .iter()
            .filter(|w| w.worker == f.key && w.start <= f.t && f.t < w.end())
        {
            // Taken over: another worker's window starts within the bound, or the
            // harness's own reading of the store finds another owner holding the key
            // with a higher fence (a grant to a waiter that a fault of its own kept from
            // hearing it: the store let the killed holder's lease go all the same).
            let taken = windows
                .iter()
                .any(|o| o.key == w.key && o.start > f.t && o.start <= bound)
                || events.iter().any(|e| {
                    e.op == Some(Op::Inspect)
                        && e.phase == Some(Phase::Ok)
                        && e.key == w.key
                        && e.t > f.t
                        && e.t <= bound
                        && !e.owner.is_empty()
                        && e.owner != w.owner
                        && e.fence.is_some_and(|fence| fence > w.fence)
                });
            if !taken {
                v.push(violation(
                    "C9",
                    "C9",
                    format!(
                        "{}: nobody took over within {} ms after {} was killed",
                        w.key,
                        cfg.takeover_bound_ns / 1_000_000,
                        f.key
                    ),
                ));
            }
        }
    }
}

/// C10: every lost signal has a fault on its own incarnation or path shortly before.
fn c10(events: &[Event], windows: &[Window], cfg: &CheckConfig, v: &mut Vec<Violation>) {
    let freezes = freezes(events);
    let proxy = fault_spans(events, FaultKind::is_proxy_fault, |k| {
        k == FaultKind::ProxyPass
    });
    let store = store_spans(events);
    let near = |l: u64, (s, e): (u64, u64)| s <= l && l <= e.saturating_add(cfg.fault_reach_ns);
    for w in windows {
        let Some(l) = w.lost_seen else { continue };
        let frozen = freezes
            .get(w.worker.as_str())
            .is_some_and(|fs| fs.iter().any(|&f| near(l, f)));
        let path = proxy
            .iter()
            .any(|&(target, s, e)| target == slot_of(&w.worker) && near(l, (s, e)));
        let restarted = store
            .iter()
            .any(|&(target, s, e)| target == "store" && near(l, (s, e)));
        if !(frozen || path || restarted) {
            let reason = events
                .iter()
                .find(|e| e.op == Some(Op::Lost) && e.owner == w.owner)
                .map_or("observed by a check", |e| e.detail.as_str());
            v.push(violation(
                "C10",
                "C10",
                format!(
                    "{}: {} lost its lease (fence {}, {reason}) with no fault on its process or path before it",
                    w.key, w.worker, w.fence
                ),
            ));
        }
    }
}

/// The distinct invariant rules in `violations`, sorted.
pub fn rules(violations: &[Violation]) -> BTreeSet<&'static str> {
    violations.iter().map(|v| v.rule).collect()
}
