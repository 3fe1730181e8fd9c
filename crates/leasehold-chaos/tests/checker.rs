//! The checker must be able to fail: each invariant is fed a history that breaks it, and
//! a clean history passes.

use leasehold_chaos::{AuditRow, CheckConfig, Event, FinalState, Op, Phase, check};

const MS: u64 = 1_000_000;
const TTL: u64 = 1000 * MS;

fn ev(t: u64, worker: &str, op: Op, phase: Phase, owner: &str) -> Event {
    Event {
        t,
        worker: worker.into(),
        op: Some(op),
        phase: Some(phase),
        key: "job:k".into(),
        owner: owner.into(),
        ..Default::default()
    }
}

fn acquired(t: u64, worker: &str, owner: &str, fence: u64) -> Vec<Event> {
    vec![
        ev(t.saturating_sub(MS), worker, Op::Acquire, Phase::Invoke, ""),
        Event {
            fence: Some(fence),
            valid_until: Some(t + TTL - 20 * MS),
            ..ev(t, worker, Op::Acquire, Phase::Ok, owner)
        },
    ]
}

fn renewed(t: u64, worker: &str, owner: &str) -> Event {
    Event {
        valid_until: Some(t + TTL - 20 * MS),
        ..ev(t, worker, Op::Renew, Phase::Ok, owner)
    }
}

fn write(t: u64, worker: &str, owner: &str, fence: u64, seq: u64) -> Vec<Event> {
    vec![
        Event {
            fence: Some(fence),
            ..ev(t, worker, Op::Write, Phase::Invoke, owner)
        },
        Event {
            fence: Some(fence),
            seq: Some(seq),
            ..ev(t + MS, worker, Op::Write, Phase::Ok, owner)
        },
    ]
}

fn released(t: u64, worker: &str, owner: &str) -> Vec<Event> {
    vec![
        ev(t, worker, Op::Release, Phase::Invoke, owner),
        ev(t + MS, worker, Op::Release, Phase::Ok, owner),
    ]
}

fn fault(t: u64, target: &str, detail: &str) -> Event {
    Event {
        t,
        worker: "injector".into(),
        op: Some(Op::Fault),
        key: target.into(),
        detail: detail.into(),
        ..Default::default()
    }
}

fn row(seq: u64, fence: u64, owner: &str) -> AuditRow {
    AuditRow {
        seq,
        resource: "job:k".into(),
        fence,
        owner: owner.into(),
    }
}

fn cfg() -> CheckConfig {
    CheckConfig::for_ttl_ns(TTL)
}

/// A clean hand-off: A holds, writes, releases; B acquires, writes, releases.
fn clean() -> (Vec<Event>, FinalState) {
    let mut h = Vec::new();
    h.extend(acquired(10 * MS, "a", "A", 1));
    h.extend(write(20 * MS, "a", "A", 1, 1));
    h.push(renewed(300 * MS, "a", "A"));
    h.extend(released(400 * MS, "a", "A"));
    h.extend(acquired(410 * MS, "b", "B", 2));
    h.extend(write(420 * MS, "b", "B", 2, 2));
    h.extend(released(500 * MS, "b", "B"));
    let state = FinalState {
        audit: vec![row(1, 1, "A"), row(2, 2, "B")],
        counters: vec![("job:k".into(), 2)],
    };
    (h, state)
}

fn invariants(h: &[Event], s: &FinalState, c: &CheckConfig) -> Vec<&'static str> {
    let mut v: Vec<_> = check(h, s, c).into_iter().map(|v| v.invariant).collect();
    v.sort();
    v.dedup();
    v
}

#[test]
fn clean_history_passes() {
    let (h, s) = clean();
    assert_eq!(check(&h, &s, &cfg()), vec![]);
}

#[test]
fn paused_holder_rejected_by_the_guard_passes() {
    // A acquires and is frozen past its TTL; B takes over and writes; A resumes, its lost
    // signal fires, its write is rejected.
    let mut h = acquired(10 * MS, "a", "A", 1);
    h.push(fault(100 * MS, "a", "sigstop"));
    h.extend(acquired(1100 * MS, "b", "B", 2));
    h.extend(write(1110 * MS, "b", "B", 2, 1));
    h.push(fault(1600 * MS, "a", "sigcont"));
    h.push(Event {
        fence: Some(1),
        detail: "expired".into(),
        ..ev(1601 * MS, "a", Op::Lost, Phase::Ok, "A")
    });
    h.extend(released(1700 * MS, "b", "B"));
    let s = FinalState {
        audit: vec![row(1, 2, "B")],
        counters: vec![("job:k".into(), 1)],
    };
    assert_eq!(check(&h, &s, &cfg()), vec![]);
}

#[test]
fn c1_lower_fence_after_higher() {
    let (h, mut s) = clean();
    s.audit = vec![row(1, 2, "B"), row(2, 1, "A")];
    assert!(invariants(&h, &s, &cfg()).contains(&"C1"));
}

#[test]
fn c2_fence_issued_twice() {
    let (mut h, s) = clean();
    for e in &mut h {
        if e.owner == "B" && e.fence == Some(2) {
            e.fence = Some(1);
        }
    }
    let found = invariants(&h, &s, &cfg());
    assert!(found.contains(&"C2"), "{found:?}");
    let lossy = CheckConfig {
        lossy_store: true,
        ..cfg()
    };
    assert!(!invariants(&h, &s, &lossy).contains(&"C2"));
}

#[test]
fn c3_overlapping_windows() {
    let (mut h, s) = clean();
    // B acquires while A's window is still open (A releases only at 400 ms).
    for e in &mut h {
        if e.owner == "B" && e.op == Some(Op::Acquire) {
            e.t -= 200 * MS;
        }
    }
    assert!(invariants(&h, &s, &cfg()).contains(&"C3"));
}

#[test]
fn c4_lost_fired_late_without_a_pause() {
    let mut h = acquired(10 * MS, "a", "A", 1);
    h.push(Event {
        detail: "expired".into(),
        ..ev(3000 * MS, "a", Op::Lost, Phase::Ok, "A")
    });
    h.push(fault(2999 * MS, "store", "restart-store"));
    let s = FinalState::default();
    assert!(invariants(&h, &s, &cfg()).contains(&"C4"));
}

#[test]
fn c4_write_started_after_the_window() {
    let mut h = acquired(10 * MS, "a", "A", 1);
    h.push(fault(900 * MS, "store", "proxy blackhole"));
    h.push(Event {
        detail: "store_unavailable".into(),
        ..ev(950 * MS, "a", Op::Lost, Phase::Ok, "A")
    });
    h.push(Event {
        fence: Some(1),
        ..ev(2000 * MS, "a", Op::Write, Phase::Invoke, "A")
    });
    h.push(Event {
        fence: Some(1),
        ..ev(2001 * MS, "a", Op::Write, Phase::Fail, "A")
    });
    assert!(invariants(&h, &FinalState::default(), &cfg()).contains(&"C4"));
}

#[test]
fn c5_stale_write_accepted_after_a_newer_one() {
    let mut h = acquired(10 * MS, "a", "A", 1);
    h.push(fault(100 * MS, "a", "sigstop"));
    h.extend(acquired(1100 * MS, "b", "B", 2));
    h.extend(write(1110 * MS, "b", "B", 2, 1));
    h.push(fault(1600 * MS, "a", "sigcont"));
    h.extend(write(1601 * MS, "a", "A", 1, 2)); // accepted: no guard
    let s = FinalState {
        audit: vec![row(1, 2, "B"), row(2, 1, "A")],
        counters: vec![("job:k".into(), 2)],
    };
    let found = invariants(&h, &s, &cfg());
    assert!(found.contains(&"C5") && found.contains(&"C1"), "{found:?}");
}

#[test]
fn c6_stale_release_succeeded() {
    let (mut h, s) = clean();
    // A sends a release after B acquired, and it succeeds.
    h.push(ev(445 * MS, "a", Op::Release, Phase::Invoke, "A"));
    h.push(ev(450 * MS, "a", Op::Release, Phase::Ok, "A"));
    assert!(invariants(&h, &s, &cfg()).contains(&"C6"));
}

#[test]
fn c7_acknowledged_write_missing_and_lost_update() {
    let (h, mut s) = clean();
    s.audit.pop();
    let found = invariants(&h, &s, &cfg());
    assert!(found.contains(&"C7"), "{found:?}");
    let (h, mut s) = clean();
    s.counters = vec![("job:k".into(), 1)];
    assert!(invariants(&h, &s, &cfg()).contains(&"C7"));
}

#[test]
fn c8_two_leases_from_one_call_and_leftovers() {
    let (mut h, s) = clean();
    h.push(Event {
        fence: Some(3),
        valid_until: Some(600 * MS),
        ..ev(510 * MS, "b", Op::Acquire, Phase::Ok, "B2")
    });
    assert!(invariants(&h, &s, &cfg()).contains(&"C8"));
    let (mut h, s) = clean();
    h.push(Event {
        t: 5000 * MS,
        worker: "harness".into(),
        op: Some(Op::Inspect),
        phase: Some(Phase::Ok),
        key: "job:k".into(),
        owner: "B".into(),
        ..Default::default()
    });
    assert!(invariants(&h, &s, &cfg()).contains(&"C8"));
}

#[test]
fn c9_no_takeover_after_a_crash() {
    let mut h = acquired(10 * MS, "a", "A", 1);
    h.push(fault(100 * MS, "a", "kill9"));
    h.push(ev(200 * MS, "b", Op::Acquire, Phase::Invoke, ""));
    h.push(Event {
        t: 10_000 * MS,
        worker: "harness".into(),
        op: Some(Op::Inspect),
        phase: Some(Phase::Ok),
        key: "job:k".into(),
        ..Default::default()
    });
    assert!(invariants(&h, &FinalState::default(), &cfg()).contains(&"C9"));
    // With a takeover in time it passes.
    h.extend(acquired(1200 * MS, "b", "B", 2));
    h.extend(released(1300 * MS, "b", "B"));
    assert!(!invariants(&h, &FinalState::default(), &cfg()).contains(&"C9"));
}

#[test]
fn c10_lost_without_a_fault() {
    let (mut h, s) = clean();
    h.push(Event {
        detail: "not_owner".into(),
        ..ev(350 * MS, "a", Op::Lost, Phase::Ok, "A")
    });
    assert!(invariants(&h, &s, &cfg()).contains(&"C10"));
}

#[test]
fn history_round_trips_through_json_lines() {
    let (h, _) = clean();
    let text: String = h
        .iter()
        .map(|e| serde_json::to_string(e).unwrap() + "\n")
        .collect();
    assert_eq!(leasehold_chaos::parse_lines(&text).unwrap(), h);
    assert!(leasehold_chaos::parse_lines("{not json}").is_err());
}

#[test]
fn c6_release_sent_before_the_takeover_is_fine() {
    // A's release is sent before B acquires, but its reply arrives after: not stale.
    let mut h = acquired(10 * MS, "a", "A", 1);
    h.push(ev(400 * MS, "a", Op::Release, Phase::Invoke, "A"));
    h.extend(acquired(405 * MS, "b", "B", 2));
    h.push(ev(410 * MS, "a", Op::Release, Phase::Ok, "A"));
    h.extend(released(500 * MS, "b", "B"));
    let v = check(&h, &FinalState::default(), &cfg());
    assert!(!v.iter().any(|v| v.invariant == "C6"), "{v:?}");
}

#[test]
fn c3_overlap_after_a_store_restart_is_allowed_only_when_restarts_lose_leases() {
    let mut h = acquired(10 * MS, "a", "A", 1);
    h.push(fault(100 * MS, "store", "restart-store"));
    h.extend(acquired(200 * MS, "b", "B", 2));
    h.extend(released(300 * MS, "b", "B"));
    h.extend(released(400 * MS, "a", "A"));
    assert!(invariants(&h, &FinalState::default(), &cfg()).contains(&"C3"));
    let lossy = CheckConfig {
        restart_loses_leases: true,
        ..cfg()
    };
    assert!(!invariants(&h, &FinalState::default(), &lossy).contains(&"C3"));
}

#[test]
fn c9_ignores_the_end_of_run_kill() {
    let mut h = acquired(10 * MS, "a", "A", 1);
    h.push(fault(100 * MS, "a", "kill9 end-of-run"));
    h.push(Event {
        t: 10_000 * MS,
        worker: "harness".into(),
        op: Some(Op::Inspect),
        phase: Some(Phase::Ok),
        key: "job:k".into(),
        ..Default::default()
    });
    assert!(!invariants(&h, &FinalState::default(), &cfg()).contains(&"C9"));
}
