//! The checker must be able to fail: every rule of every invariant is fed a history that
//! breaks it, every exemption is probed just inside (passes) and just outside (flagged),
//! and clean histories pass. Each test asserts the exact set of rules flagged, so a rule
//! that fires for the wrong reason fails the test too.
//!
//! The standard holder: `a#0` acquires at 10 ms with a TTL of 1 s and a validity deadline
//! `D` = 990 ms; lost slack TTL/4, so its due is 1240 ms while it runs.

use leasehold_chaos::checker::rules;
use leasehold_chaos::{AuditRow, CheckConfig, Event, FaultKind, FinalState, Op, Phase, check};

const MS: u64 = 1_000_000;
const TTL: u64 = 1000 * MS;
const KEY: &str = "job:k";
/// `a#0`'s deadline when it acquires at 10 ms.
const D: u64 = 990 * MS;
/// `a#0`'s due for its lost signal while it runs.
const DUE: u64 = D + TTL / 4;

fn ev(t: u64, worker: &str, op: Op, phase: Phase, owner: &str) -> Event {
    Event {
        t,
        worker: worker.into(),
        op: Some(op),
        phase: Some(phase),
        key: KEY.into(),
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

/// A renewal the library sent at `t`, with `remaining` validity.
fn sent(t: u64, worker: &str, owner: &str, fence: u64, remaining: u64) -> Event {
    Event {
        fence: Some(fence),
        remaining_ns: Some(remaining),
        lost: Some(false),
        detail: "sent".into(),
        ..ev(t, worker, Op::Renew, Phase::Invoke, owner)
    }
}

/// A renewal the client accepted at `t`, extending the deadline to `t + remaining`.
fn accepted(t: u64, worker: &str, owner: &str, fence: u64, remaining: u64) -> Event {
    Event {
        fence: Some(fence),
        remaining_ns: Some(remaining),
        valid_until: Some(t + remaining),
        lost: Some(false),
        detail: "accepted".into(),
        ..ev(t, worker, Op::Renew, Phase::Ok, owner)
    }
}

/// A whole renewal: sent at `t`, accepted 1 ms later with a deadline of `t + 980 ms`.
fn renewed(t: u64, worker: &str, owner: &str, fence: u64) -> Vec<Event> {
    vec![
        sent(t, worker, owner, fence, 500 * MS),
        accepted(t + MS, worker, owner, fence, TTL - 21 * MS),
    ]
}

fn check_ev(t: u64, worker: &str, owner: &str, fence: u64, lost: bool) -> Event {
    Event {
        fence: Some(fence),
        lost: Some(lost),
        ..ev(t, worker, Op::Check, Phase::Ok, owner)
    }
}

/// A write probed at `t` (answer `lost`) and accepted 1 ms later as audit row `seq`.
fn write(t: u64, worker: &str, owner: &str, fence: u64, seq: u64, lost: bool) -> Vec<Event> {
    vec![
        Event {
            fence: Some(fence),
            lost: Some(lost),
            ..ev(t, worker, Op::Write, Phase::Invoke, owner)
        },
        Event {
            fence: Some(fence),
            seq: Some(seq),
            ..ev(t + MS, worker, Op::Write, Phase::Ok, owner)
        },
    ]
}

/// A write probed at `t` and rejected by the guard 1 ms later.
fn write_rejected(t: u64, worker: &str, owner: &str, fence: u64, lost: bool) -> Vec<Event> {
    vec![
        Event {
            fence: Some(fence),
            lost: Some(lost),
            ..ev(t, worker, Op::Write, Phase::Invoke, owner)
        },
        Event {
            fence: Some(fence),
            detail: "rejected: fence 9 accepted".into(),
            ..ev(t + MS, worker, Op::Write, Phase::Fail, owner)
        },
    ]
}

fn released(t: u64, worker: &str, owner: &str) -> Vec<Event> {
    vec![
        ev(t, worker, Op::Release, Phase::Invoke, owner),
        ev(t + MS, worker, Op::Release, Phase::Ok, owner),
    ]
}

/// A release invoked at `t` and answered "not owner" 1 ms later.
fn refused_release(t: u64, worker: &str, owner: &str) -> Vec<Event> {
    vec![
        ev(t, worker, Op::Release, Phase::Invoke, owner),
        Event {
            detail: "not owner".into(),
            ..ev(t + MS, worker, Op::Release, Phase::Fail, owner)
        },
    ]
}

fn lost(t: u64, worker: &str, owner: &str, fence: u64) -> Event {
    Event {
        fence: Some(fence),
        detail: "expired".into(),
        ..ev(t, worker, Op::Lost, Phase::Ok, owner)
    }
}

fn fault(t: u64, target: &str, kind: FaultKind) -> Event {
    Event {
        t,
        worker: "injector".into(),
        op: Some(Op::Fault),
        key: target.into(),
        fault: Some(kind),
        ..Default::default()
    }
}

fn inspect(t: u64, owner: &str, fence: Option<u64>, detail: &str) -> Event {
    Event {
        t,
        worker: "harness".into(),
        op: Some(Op::Inspect),
        phase: Some(Phase::Ok),
        key: KEY.into(),
        owner: owner.into(),
        fence,
        detail: detail.into(),
        ..Default::default()
    }
}

/// The history's last event, at `t` (so that dues before it are checked).
fn end_at(t: u64) -> Event {
    inspect(t, "", None, "")
}

fn row(seq: u64, fence: u64, owner: &str) -> AuditRow {
    AuditRow {
        seq,
        resource: KEY.into(),
        fence,
        owner: owner.into(),
    }
}

fn state(rows: Vec<AuditRow>) -> FinalState {
    let n = rows.len() as u64;
    FinalState {
        audit: rows,
        counters: vec![(KEY.into(), n)],
    }
}

fn cfg() -> CheckConfig {
    CheckConfig::for_ttl_ns(TTL)
}

fn found(h: &[Event], s: &FinalState, c: &CheckConfig) -> Vec<&'static str> {
    rules(&check(h, s, c)).into_iter().collect()
}

#[track_caller]
fn assert_rules(h: &[Event], s: &FinalState, c: &CheckConfig, want: &[&str]) {
    let v = check(h, s, c);
    let got: Vec<&str> = rules(&v).into_iter().collect();
    assert_eq!(got, want, "{v:#?}");
}

/// A clean hand-off: A holds (renews once, checks, writes), releases; B acquires, writes,
/// releases; the store is inspected along the way and empty at the end.
fn clean() -> (Vec<Event>, FinalState) {
    let mut h = Vec::new();
    h.extend(acquired(10 * MS, "a#0", "A", 1));
    h.push(inspect(15 * MS, "A", Some(1), ""));
    h.extend(renewed(300 * MS, "a#0", "A", 1));
    h.push(check_ev(350 * MS, "a#0", "A", 1, false));
    h.extend(write(360 * MS, "a#0", "A", 1, 1, false));
    h.extend(released(400 * MS, "a#0", "A"));
    h.extend(acquired(410 * MS, "b#0", "B", 2));
    h.push(check_ev(415 * MS, "b#0", "B", 2, false));
    h.extend(write(420 * MS, "b#0", "B", 2, 2, false));
    h.extend(released(500 * MS, "b#0", "B"));
    h.push(inspect(5000 * MS, "", None, "final"));
    (h, state(vec![row(1, 1, "A"), row(2, 2, "B")]))
}

/// `a#0` holds until its deadline with a proxy fault on its path (so C10 is quiet about
/// its lost signal) and the history runs on to 5 s.
fn holder_until_deadline() -> Vec<Event> {
    let mut h = acquired(10 * MS, "a#0", "A", 1);
    h.push(fault(500 * MS, "a", FaultKind::ProxyBlackhole));
    h.push(fault(600 * MS, "a", FaultKind::ProxyPass));
    h.push(end_at(5000 * MS));
    h
}

/// The stale-write script: A checks, is frozen before its write past its deadline, B
/// takes over and writes, A wakes, probes (lost), writes.
fn stale_write(accepted_stale: bool) -> (Vec<Event>, FinalState) {
    let mut h = acquired(10 * MS, "a#0", "A", 1);
    h.push(check_ev(100 * MS, "a#0", "A", 1, false));
    h.push(fault(110 * MS, "a#0", FaultKind::Sigstop));
    h.extend(acquired(1100 * MS, "b#0", "B", 2));
    h.extend(write(1110 * MS, "b#0", "B", 2, 1, false));
    h.push(fault(1600 * MS, "a#0", FaultKind::Sigcont));
    h.push(lost(1601 * MS, "a#0", "A", 1));
    let s = if accepted_stale {
        h.extend(write(1602 * MS, "a#0", "A", 1, 2, true));
        state(vec![row(1, 2, "B"), row(2, 1, "A")])
    } else {
        h.extend(write_rejected(1602 * MS, "a#0", "A", 1, true));
        state(vec![row(1, 2, "B")])
    };
    h.extend(refused_release(1700 * MS, "a#0", "A"));
    h.extend(released(1800 * MS, "b#0", "B"));
    h.push(inspect(6000 * MS, "", None, "final"));
    (h, s)
}

// ---------------------------------------------------------------- clean histories

#[test]
fn clean_history_passes() {
    let (h, s) = clean();
    assert_eq!(check(&h, &s, &cfg()), vec![]);
}

#[test]
fn stale_write_rejected_by_the_guard_passes() {
    let (h, s) = stale_write(false);
    assert_eq!(check(&h, &s, &cfg()), vec![]);
}

#[test]
fn stale_write_accepted_without_the_guard_is_c1_and_c5() {
    let (h, s) = stale_write(true);
    assert_rules(&h, &s, &cfg(), &["C1", "C5"]);
}

#[test]
fn history_round_trips_through_json_lines() {
    let (mut h, _) = clean();
    h.push(fault(9 * MS, "a#0", FaultKind::ProxyDropReplies));
    let text: String = h
        .iter()
        .map(|e| serde_json::to_string(e).unwrap() + "\n")
        .collect();
    assert_eq!(leasehold_chaos::parse_lines(&text).unwrap(), h);
    assert!(text.contains("\"fault\":\"proxy-drop-replies\""));
    assert!(leasehold_chaos::parse_lines("{not json}").is_err());
}

#[test]
fn violation_display_names_invariant_and_rule() {
    let (h, s) = stale_write(true);
    let v = check(&h, &s, &cfg());
    let shown: Vec<String> = v.iter().map(|v| v.to_string()).collect();
    assert!(
        shown.iter().any(|s| s.starts_with("C5 (C5): ")),
        "{shown:?}"
    );
}

// ---------------------------------------------------------------- C1

#[test]
fn c1_lower_fence_committed_after_a_higher_one() {
    let (h, _) = clean();
    let s = state(vec![row(1, 2, "B"), row(2, 1, "A")]);
    assert_rules(&h, &s, &cfg(), &["C1"]);
}

#[test]
fn c1_equal_fences_pass() {
    let (h, _) = clean();
    let s = state(vec![row(1, 1, "A"), row(2, 1, "A"), row(3, 2, "B")]);
    assert_rules(&h, &s, &cfg(), &[]);
}

#[test]
fn c1_rows_are_taken_in_seq_order_not_listed_order() {
    let (h, _) = clean();
    let s = state(vec![row(2, 2, "B"), row(1, 1, "A")]);
    assert_rules(&h, &s, &cfg(), &[]);
}

#[test]
fn c1_a_flagged_row_does_not_lower_the_mark() {
    // 2, then 1 (flagged), then 1 again: still below 2, flagged too.
    let (h, _) = clean();
    let s = state(vec![row(1, 2, "B"), row(2, 1, "A"), row(3, 1, "A")]);
    let v = check(&h, &s, &cfg());
    assert_eq!(v.iter().filter(|v| v.rule == "C1").count(), 2, "{v:#?}");
}

#[test]
fn c1_resources_are_independent() {
    let (h, _) = clean();
    let mut other = row(3, 1, "A");
    other.resource = "job:other".into();
    let mut s = state(vec![row(1, 1, "A"), row(2, 2, "B"), other]);
    s.counters.push(("job:other".into(), 1));
    s.counters[0].1 = 2;
    assert_rules(&h, &s, &cfg(), &[]);
}

// ---------------------------------------------------------------- C2

#[test]
fn c2_one_fence_granted_to_two_owners() {
    let (mut h, _) = clean();
    for e in &mut h {
        if e.owner == "B" && e.fence == Some(2) {
            e.fence = Some(1);
        }
    }
    let s = state(vec![row(1, 1, "A"), row(2, 1, "B")]);
    assert_eq!(found(&h, &s, &cfg()), vec!["C2"]);
}

#[test]
fn c2_the_store_recorded_a_fence_for_another_owner() {
    let (mut h, s) = clean();
    h.push(inspect(450 * MS, "X", Some(2), ""));
    assert_rules(&h, &s, &cfg(), &["C2"]);
}

#[test]
fn c2_the_audit_recorded_a_fence_for_another_owner() {
    let (h, _) = clean();
    let s = state(vec![row(1, 1, "A"), row(2, 2, "B"), row(3, 2, "X")]);
    assert_rules(&h, &s, &cfg(), &["C2"]);
}

#[test]
fn c2_and_c3_exempt_on_a_lossy_store_but_c1_is_not() {
    // B is granted A's fence while A holds; an unknown owner's lower fence lands last.
    let mut h = two_holders(400 * MS, 100 * MS);
    for e in &mut h {
        if e.fence.is_some() {
            e.fence = Some(2);
        }
    }
    let s = state(vec![row(1, 2, "B"), row(2, 1, "X")]);
    assert_rules(&h, &s, &cfg(), &["C1", "C2", "C3"]);
    let lossy = CheckConfig {
        lossy_store: true,
        ..cfg()
    };
    assert_rules(&h, &s, &lossy, &["C1"]);
}

// ---------------------------------------------------------------- C3

/// A holds from 10 ms until it sees its lease lost at `a_end` (a reset on its path
/// before), and releases later (answered "not owner"); B acquires at `b_start`.
fn two_holders(a_end: u64, b_start: u64) -> Vec<Event> {
    let mut h = acquired(10 * MS, "a#0", "A", 1);
    h.push(fault(5 * MS, "a", FaultKind::ProxyReset));
    h.push(fault(6 * MS, "a", FaultKind::ProxyPass));
    h.push(check_ev(a_end, "a#0", "A", 1, true));
    h.extend(refused_release(600 * MS, "a#0", "A"));
    h.extend(acquired(b_start, "b#0", "B", 2));
    h.extend(released(b_start + 100 * MS, "b#0", "B"));
    h
}

#[test]
fn c3_overlapping_windows() {
    assert_rules(
        &two_holders(400 * MS, 399 * MS),
        &FinalState::default(),
        &cfg(),
        &["C3"],
    );
}

#[test]
fn c3_back_to_back_windows_pass() {
    // A's window ends at its first lost observation: B may start there.
    assert_rules(
        &two_holders(400 * MS, 400 * MS),
        &FinalState::default(),
        &cfg(),
        &[],
    );
}

#[test]
fn c3_a_window_ends_at_its_deadline() {
    // A never releases: its window ends at D.
    let mut h = acquired(10 * MS, "a#0", "A", 1);
    h.push(fault(500 * MS, "a#0", FaultKind::Sigstop));
    h.extend(acquired(D, "b#0", "B", 2));
    h.extend(released(D + 100 * MS, "b#0", "B"));
    assert_rules(&h, &FinalState::default(), &cfg(), &[]);
    let mut h2 = acquired(10 * MS, "a#0", "A", 1);
    h2.push(fault(500 * MS, "a#0", FaultKind::Sigstop));
    h2.extend(acquired(D - 1, "b#0", "B", 2));
    h2.extend(released(D + 100 * MS, "b#0", "B"));
    assert_rules(&h2, &FinalState::default(), &cfg(), &["C3"]);
}

#[test]
fn c3_the_same_owner_twice_is_not_an_overlap() {
    // An ambiguous acquire answered twice with the same lease.
    let mut h = acquired(10 * MS, "a#0", "A", 1);
    h.extend(acquired(20 * MS, "a#0", "A", 1));
    h.extend(released(400 * MS, "a#0", "A"));
    assert_rules(&h, &FinalState::default(), &cfg(), &[]);
}

#[test]
fn c3_overlap_with_a_store_restart_between_the_starts_is_exempt_only_when_restarts_lose_leases() {
    let at = |t: u64| {
        let mut h = two_holders(400 * MS, 200 * MS);
        h.push(fault(t, "store", FaultKind::RestartStore));
        h.push(fault(t + MS / 2, "store", FaultKind::StoreBack));
        h
    };
    let restarts = CheckConfig {
        restart_loses_leases: true,
        ..cfg()
    };
    let none = FinalState::default();
    // Just inside: at A's start, at B's start.
    assert_rules(&at(10 * MS), &none, &restarts, &[]);
    assert_rules(&at(200 * MS), &none, &restarts, &[]);
    // Just outside: before A's start, after B's start.
    assert_rules(&at(10 * MS - 1), &none, &restarts, &["C3"]);
    assert_rules(&at(200 * MS + 1), &none, &restarts, &["C3"]);
    // A store that keeps its leases over a restart gets no exemption.
    assert_rules(&at(100 * MS), &none, &cfg(), &["C3"]);
}

// ---------------------------------------------------------------- C4a

#[test]
fn c4a_lost_observed_at_the_due_passes_one_ns_later_is_flagged() {
    let mut h = holder_until_deadline();
    h.push(lost(DUE, "a#0", "A", 1));
    assert_rules(&h, &FinalState::default(), &cfg(), &[]);
    let mut h = holder_until_deadline();
    h.push(lost(DUE + 1, "a#0", "A", 1));
    assert_rules(&h, &FinalState::default(), &cfg(), &["C4a"]);
}

#[test]
fn c4a_lost_never_observed() {
    assert_rules(
        &holder_until_deadline(),
        &FinalState::default(),
        &cfg(),
        &["C4a"],
    );
}

#[test]
fn c4a_a_check_or_a_write_probe_answering_lost_is_an_observation() {
    let mut h = holder_until_deadline();
    h.push(check_ev(DUE, "a#0", "A", 1, true));
    assert_rules(&h, &FinalState::default(), &cfg(), &[]);
    let mut h = holder_until_deadline();
    h.extend(write_rejected(DUE, "a#0", "A", 1, true));
    assert_rules(&h, &FinalState::default(), &cfg(), &[]);
    // A check answering not lost is no observation (and is C4b).
    let mut h = holder_until_deadline();
    h.push(check_ev(DUE, "a#0", "A", 1, false));
    assert_rules(&h, &FinalState::default(), &cfg(), &["C4a", "C4b"]);
}

#[test]
fn c4a_a_renewal_moves_the_deadline() {
    let mut h = holder_until_deadline();
    h.extend(renewed(300 * MS, "a#0", "A", 1));
    // New deadline 301 + 979 = 1280 ms; due 1530 ms.
    h.push(lost(1530 * MS, "a#0", "A", 1));
    assert_rules(&h, &FinalState::default(), &cfg(), &[]);
    let mut h = holder_until_deadline();
    h.extend(renewed(300 * MS, "a#0", "A", 1));
    h.push(lost(1530 * MS + 1, "a#0", "A", 1));
    assert_rules(&h, &FinalState::default(), &cfg(), &["C4a"]);
}

#[test]
fn c4a_a_freeze_across_the_deadline_moves_the_due_by_its_length() {
    // Frozen from 900 ms (before D) to 3000 ms: 90 ms of slack were used before D... no:
    // the slack runs only after D, so the due is 3000 + 250 ms.
    let frozen = |l: u64| {
        let mut h = holder_until_deadline();
        h.push(fault(900 * MS, "a#0", FaultKind::Sigstop));
        h.push(fault(3000 * MS, "a#0", FaultKind::Sigcont));
        h.push(lost(l, "a#0", "A", 1));
        h
    };
    assert_rules(&frozen(3250 * MS), &FinalState::default(), &cfg(), &[]);
    assert_rules(
        &frozen(3250 * MS + 1),
        &FinalState::default(),
        &cfg(),
        &["C4a"],
    );
}

#[test]
fn c4a_a_freeze_starting_after_the_deadline_counts_the_slack_used_before_it() {
    // Runs 100 ms after D, frozen 1090–2000 ms, then 150 ms more: due 2150 ms.
    let frozen = |l: u64| {
        let mut h = holder_until_deadline();
        h.push(fault(D + 100 * MS, "a#0", FaultKind::Sigstop));
        h.push(fault(2000 * MS, "a#0", FaultKind::Sigcont));
        h.push(lost(l, "a#0", "A", 1));
        h
    };
    assert_rules(&frozen(2150 * MS), &FinalState::default(), &cfg(), &[]);
    assert_rules(
        &frozen(2150 * MS + 1),
        &FinalState::default(),
        &cfg(),
        &["C4a"],
    );
}

#[test]
fn c4a_a_freeze_starting_at_the_due_does_not_move_it() {
    let mut h = holder_until_deadline();
    h.push(fault(DUE, "a#0", FaultKind::Sigstop));
    h.push(fault(3000 * MS, "a#0", FaultKind::Sigcont));
    h.push(lost(DUE + 1, "a#0", "A", 1));
    assert_rules(&h, &FinalState::default(), &cfg(), &["C4a"]);
    // ... and the due is still D + slack, not earlier.
    let mut h = holder_until_deadline();
    h.push(fault(DUE, "a#0", FaultKind::Sigstop));
    h.push(fault(3000 * MS, "a#0", FaultKind::Sigcont));
    h.push(lost(DUE, "a#0", "A", 1));
    assert_rules(&h, &FinalState::default(), &cfg(), &[]);
}

#[test]
fn c4a_freezes_before_the_deadline_or_of_other_processes_do_not_move_it() {
    let mut h = holder_until_deadline();
    h.push(fault(100 * MS, "a#0", FaultKind::Sigstop));
    h.push(fault(200 * MS, "a#0", FaultKind::Sigcont));
    h.push(fault(D, "b#0", FaultKind::Sigstop));
    h.push(fault(3000 * MS, "b#0", FaultKind::Sigcont));
    // A former incarnation of the same slot is another process.
    h.push(fault(D, "a#1", FaultKind::Sigstop));
    h.push(fault(3000 * MS, "a#1", FaultKind::Sigcont));
    h.push(lost(DUE + 1, "a#0", "A", 1));
    assert_rules(&h, &FinalState::default(), &cfg(), &["C4a"]);
}

#[test]
fn c4a_with_no_slack_a_freeze_at_the_deadline_still_moves_the_due() {
    let no_slack = CheckConfig {
        lost_slack_ns: 0,
        ..cfg()
    };
    let frozen = |l: u64| {
        let mut h = holder_until_deadline();
        h.push(fault(D, "a#0", FaultKind::Sigstop));
        h.push(fault(2000 * MS, "a#0", FaultKind::Sigcont));
        h.push(lost(l, "a#0", "A", 1));
        h
    };
    assert_rules(&frozen(2000 * MS), &FinalState::default(), &no_slack, &[]);
    assert_rules(
        &frozen(2000 * MS + 1),
        &FinalState::default(),
        &no_slack,
        &["C4a"],
    );
}

#[test]
fn c4a_frozen_and_never_resumed_is_not_due() {
    let mut h = holder_until_deadline();
    h.push(fault(900 * MS, "a#0", FaultKind::Sigstop));
    assert_rules(&h, &FinalState::default(), &cfg(), &[]);
}

#[test]
fn c4a_killed_by_the_due_is_exempt_one_ns_later_is_not() {
    for (kind, t, want) in [
        (FaultKind::Kill9, DUE, vec![]),
        (FaultKind::Kill9, DUE + 1, vec!["C4a"]),
        (FaultKind::EndKill, DUE, vec![]),
        (FaultKind::EndKill, DUE + 1, vec!["C4a"]),
    ] {
        let mut h = holder_until_deadline();
        h.push(fault(t, "a#0", kind));
        // Keep C9 quiet: someone takes over.
        h.extend(acquired(DUE + 500 * MS, "b#0", "B", 2));
        h.extend(released(DUE + 600 * MS, "b#0", "B"));
        assert_rules(&h, &FinalState::default(), &cfg(), &want);
    }
}

#[test]
fn c4a_a_kill_of_another_incarnation_exempts_nothing() {
    // `a#0` was killed earlier and respawned as `a#1`; `a#1`'s window is not exempt.
    let mut h = vec![fault(5 * MS, "a#0", FaultKind::Kill9)];
    for e in holder_until_deadline() {
        h.push(Event {
            worker: if e.worker == "a#0" {
                "a#1".into()
            } else {
                e.worker
            },
            ..e
        });
    }
    assert_rules(&h, &FinalState::default(), &cfg(), &["C4a"]);
    // The same window with its own incarnation killed by the due is exempt.
    h.push(fault(DUE, "a#1", FaultKind::Kill9));
    assert_rules(&h, &FinalState::default(), &cfg(), &[]);
}

#[test]
fn c4a_released_by_the_due_is_exempt_one_ns_later_is_not() {
    let mut h = holder_until_deadline();
    h.extend(released(DUE, "a#0", "A"));
    assert_rules(&h, &FinalState::default(), &cfg(), &[]);
    let mut h = holder_until_deadline();
    h.extend(released(DUE + 1, "a#0", "A"));
    assert_rules(&h, &FinalState::default(), &cfg(), &["C4a"]);
}

#[test]
fn c4a_a_history_ending_before_the_due_is_exempt_at_the_due_it_is_not() {
    let mut h = acquired(10 * MS, "a#0", "A", 1);
    h.push(end_at(DUE - 1));
    assert_rules(&h, &FinalState::default(), &cfg(), &[]);
    let mut h = acquired(10 * MS, "a#0", "A", 1);
    h.push(end_at(DUE));
    assert_rules(&h, &FinalState::default(), &cfg(), &["C4a"]);
}

// ---------------------------------------------------------------- C4b

#[test]
fn c4b_a_check_answering_not_lost_at_the_deadline() {
    let mut h = holder_until_deadline();
    h.push(check_ev(D - 1, "a#0", "A", 1, false));
    h.push(lost(D + MS, "a#0", "A", 1));
    assert_rules(&h, &FinalState::default(), &cfg(), &[]);
    let mut h = holder_until_deadline();
    h.push(check_ev(D, "a#0", "A", 1, false));
    h.push(lost(D + MS, "a#0", "A", 1));
    assert_rules(&h, &FinalState::default(), &cfg(), &["C4b"]);
}

#[test]
fn c4b_the_first_check_after_a_resume_past_the_deadline_must_answer_lost() {
    // The stale-write script, but the library answers "not lost" on resume.
    let (mut h, s) = stale_write(false);
    h.retain(|e| e.op != Some(Op::Lost));
    for e in &mut h {
        if e.owner == "A" && e.op == Some(Op::Write) && e.phase == Some(Phase::Invoke) {
            e.lost = Some(false);
        }
    }
    assert_rules(&h, &s, &cfg(), &["C4b", "C4c"]);
}

#[test]
fn c4b_a_check_answering_not_lost_after_the_lost_event() {
    let mut h = holder_until_deadline();
    h.push(lost(700 * MS, "a#0", "A", 1));
    h.push(check_ev(700 * MS, "a#0", "A", 1, false));
    assert_rules(&h, &FinalState::default(), &cfg(), &[]);
    let mut h = holder_until_deadline();
    h.push(lost(700 * MS, "a#0", "A", 1));
    h.push(check_ev(700 * MS + 1, "a#0", "A", 1, false));
    assert_rules(&h, &FinalState::default(), &cfg(), &["C4b"]);
}

#[test]
fn c4b_a_released_lease_is_exempt_from_its_release_on() {
    let probe_after_release = |r: u64| {
        let mut h = holder_until_deadline();
        h.push(ev(r, "a#0", Op::Release, Phase::Invoke, "A"));
        h.push(check_ev(D + MS, "a#0", "A", 1, false));
        h
    };
    assert_rules(
        &probe_after_release(D + MS),
        &FinalState::default(),
        &cfg(),
        &[],
    );
    assert_rules(
        &probe_after_release(D + MS + 1),
        &FinalState::default(),
        &cfg(),
        &["C4b"],
    );
}

#[test]
fn c4b_c4c_a_renewal_after_the_lease_was_seen_lost_or_released_does_not_extend_it() {
    // Seen lost at 700 ms, then a renewal accepted (to 1700 ms): a check after D answering
    // not lost is still judged against D.
    let mut h = holder_until_deadline();
    h.push(check_ev(700 * MS, "a#0", "A", 1, true));
    h.push(accepted(800 * MS, "a#0", "A", 1, 900 * MS));
    h.push(check_ev(D + MS, "a#0", "A", 1, false));
    assert_rules(&h, &FinalState::default(), &cfg(), &["C4b"]);
    // Released at 700 ms, then a renewal accepted: a write after D with no lost
    // observation is still after the deadline.
    let mut h = holder_until_deadline();
    h.push(ev(700 * MS, "a#0", Op::Release, Phase::Invoke, "A"));
    h.push(accepted(800 * MS, "a#0", "A", 1, 900 * MS));
    h.push(Event {
        fence: Some(1),
        ..ev(D + MS, "a#0", Op::Write, Phase::Invoke, "A")
    });
    assert_rules(&h, &FinalState::default(), &cfg(), &["C4c"]);
}

// ---------------------------------------------------------------- C4c

#[test]
fn c4c_a_write_started_after_the_deadline_before_any_lost_observation() {
    // A write with no probe answer (an older worker) at D: nothing had observed lost.
    let unprobed = |t: u64, lost_at: Option<u64>| {
        let mut h = holder_until_deadline();
        if let Some(l) = lost_at {
            h.push(lost(l, "a#0", "A", 1));
        }
        h.push(Event {
            fence: Some(1),
            ..ev(t, "a#0", Op::Write, Phase::Invoke, "A")
        });
        h.push(Event {
            fence: Some(1),
            detail: "rejected".into(),
            ..ev(t + MS, "a#0", Op::Write, Phase::Fail, "A")
        });
        h
    };
    let none = FinalState::default();
    assert_rules(&unprobed(D, Some(D + 1)), &none, &cfg(), &["C4c"]);
    assert_rules(&unprobed(D, Some(D)), &none, &cfg(), &[]);
    assert_rules(&unprobed(D - 1, Some(D + 1)), &none, &cfg(), &[]);
    // Its own probe answering lost is the observation.
    let mut h = holder_until_deadline();
    h.extend(write_rejected(D, "a#0", "A", 1, true));
    assert_rules(&h, &none, &cfg(), &[]);
}

// ---------------------------------------------------------------- C5

/// A's window ends at its release at 400 ms (answered "not owner"); B acquires at
/// `b_start` and its write is acknowledged at `b_ack`; A starts a write at `a_write`
/// (probe: not lost, as a released lease answers), with `outcome`.
fn c5_history(a_write: u64, b_start: u64, b_ack: u64, outcome: Phase) -> Vec<Event> {
    let mut h = acquired(10 * MS, "a#0", "A", 1);
    h.push(check_ev(100 * MS, "a#0", "A", 1, false));
    h.extend(refused_release(400 * MS, "a#0", "A"));
    h.extend(acquired(b_start, "b#0", "B", 2));
    h.push(Event {
        fence: Some(2),
        lost: Some(false),
        ..ev(b_ack - MS, "b#0", Op::Write, Phase::Invoke, "B")
    });
    h.push(Event {
        fence: Some(2),
        seq: Some(1),
        ..ev(b_ack, "b#0", Op::Write, Phase::Ok, "B")
    });
    h.push(Event {
        fence: Some(1),
        lost: Some(false),
        ..ev(a_write, "a#0", Op::Write, Phase::Invoke, "A")
    });
    h.push(Event {
        fence: Some(1),
        seq: (outcome == Phase::Ok).then_some(2),
        ..ev(a_write + MS, "a#0", Op::Write, outcome, "A")
    });
    h.extend(released(900 * MS, "b#0", "B"));
    h
}

fn c5_state(accepted: bool) -> FinalState {
    // The audit is listed so that C1 stays quiet: C5 is judged on the history alone.
    if accepted {
        state(vec![row(1, 1, "A"), row(2, 2, "B")])
    } else {
        state(vec![row(1, 2, "B")])
    }
}

#[test]
fn c5_a_write_started_after_the_window_and_after_a_newer_ack_is_accepted() {
    let h = c5_history(500 * MS, 410 * MS, 450 * MS, Phase::Ok);
    // A's write after its release also answers "not lost" (the lease is released): no C4b.
    assert_rules(&h, &c5_state(true), &cfg(), &["C5"]);
}

#[test]
fn c5_rejected_or_failed_passes() {
    assert_rules(
        &c5_history(500 * MS, 410 * MS, 450 * MS, Phase::Fail),
        &c5_state(false),
        &cfg(),
        &[],
    );
}

#[test]
fn c5_outcome_unknown_counts_as_accepted_when_the_audit_has_its_owner() {
    let h = c5_history(500 * MS, 410 * MS, 450 * MS, Phase::Unknown);
    assert_rules(&h, &c5_state(true), &cfg(), &["C5"]);
    assert_rules(&h, &c5_state(false), &cfg(), &[]);
}

#[test]
fn c5_exempt_while_no_newer_write_was_acknowledged_before_it_started() {
    // Newer ack at the very instant the stale write starts: flagged; 1 ns later: exempt.
    assert_rules(
        &c5_history(500 * MS, 410 * MS, 500 * MS, Phase::Ok),
        &c5_state(true),
        &cfg(),
        &["C5"],
    );
    assert_rules(
        &c5_history(500 * MS, 410 * MS, 500 * MS + 1, Phase::Ok),
        &c5_state(true),
        &cfg(),
        &[],
    );
}

#[test]
fn c5_a_write_started_at_the_window_end_is_after_it_one_ns_before_is_not() {
    // A's window ends at its release (400 ms).
    assert_rules(
        &c5_history(400 * MS, 300 * MS, 390 * MS, Phase::Ok),
        &c5_state(true),
        &cfg(),
        &["C3", "C5"],
    );
    assert_rules(
        &c5_history(400 * MS - 1, 300 * MS, 390 * MS, Phase::Ok),
        &c5_state(true),
        &cfg(),
        &["C3"],
    );
}

#[test]
fn c5_a_newer_write_must_have_a_higher_fence_on_the_same_resource() {
    let mut h = c5_history(500 * MS, 410 * MS, 450 * MS, Phase::Ok);
    for e in &mut h {
        if e.owner == "B" && e.op == Some(Op::Write) {
            e.key = "job:other".into();
        }
    }
    assert_rules(&h, &c5_state(true), &cfg(), &[]);
    let mut h = c5_history(500 * MS, 410 * MS, 450 * MS, Phase::Ok);
    for e in &mut h {
        if e.owner == "B" && e.op == Some(Op::Write) {
            e.fence = Some(1);
        }
    }
    // (B's write under fence 1 is also C2 and C8a: recorded with A's fence.)
    assert_rules(&h, &c5_state(true), &cfg(), &["C2", "C8a"]);
}

// ---------------------------------------------------------------- C6a

/// A holder with a renewal sent at `t` (remaining `rem`, lost flag `lost_flag`).
fn renewal_sent_at(t: u64, rem: u64, lost_flag: bool) -> Vec<Event> {
    let mut h = acquired(10 * MS, "a#0", "A", 1);
    h.push(Event {
        lost: Some(lost_flag),
        ..sent(t, "a#0", "A", 1, rem)
    });
    h.extend(released(D - 10 * MS, "a#0", "A"));
    h
}

#[test]
fn c6a_a_renewal_sent_with_no_validity_left() {
    let none = FinalState::default();
    assert_rules(&renewal_sent_at(300 * MS, 1, false), &none, &cfg(), &[]);
    assert_rules(
        &renewal_sent_at(300 * MS, 0, false),
        &none,
        &cfg(),
        &["C6a"],
    );
}

#[test]
fn c6a_a_renewal_sent_after_the_lost_signal_fired() {
    assert_rules(
        &renewal_sent_at(300 * MS, 500 * MS, true),
        &FinalState::default(),
        &cfg(),
        &["C6a"],
    );
    // After the lost event (recorded at the same instant or before the send).
    let at = |l: u64| {
        let mut h = renewal_sent_at(300 * MS, 500 * MS, false);
        h.push(fault(100 * MS, "a", FaultKind::ProxyReset));
        h.push(lost(l, "a#0", "A", 1));
        h
    };
    assert_rules(&at(300 * MS), &FinalState::default(), &cfg(), &["C6a"]);
    assert_rules(&at(300 * MS + 1), &FinalState::default(), &cfg(), &[]);
}

#[test]
fn c6a_a_renewal_sent_at_the_deadline_in_force() {
    let at = |t: u64| {
        let mut h = acquired(10 * MS, "a#0", "A", 1);
        h.push(sent(t, "a#0", "A", 1, 5 * MS));
        h.push(fault(500 * MS, "a", FaultKind::ProxyBlackhole));
        h.push(lost(D + MS, "a#0", "A", 1));
        h.push(end_at(5000 * MS));
        h
    };
    assert_rules(&at(D - 1), &FinalState::default(), &cfg(), &[]);
    assert_rules(&at(D), &FinalState::default(), &cfg(), &["C6a"]);
}

#[test]
fn c6a_the_deadline_in_force_counts_renewals_recorded_by_the_send_only() {
    // A renewal accepted at D (new deadline D + 900 ms): a send at D is in time; a send
    // at D - 1 ns... is before D anyway. A send at D + 1 ms before the acceptance is
    // recorded is late.
    let with = |accept_at: u64, send_at: u64| {
        let mut h = acquired(10 * MS, "a#0", "A", 1);
        h.push(accepted(accept_at, "a#0", "A", 1, 900 * MS));
        h.push(sent(send_at, "a#0", "A", 1, 5 * MS));
        h.extend(released(1500 * MS, "a#0", "A"));
        h
    };
    let none = FinalState::default();
    assert_rules(&with(D, D), &none, &cfg(), &[]);
    assert_rules(&with(D + MS, D + MS / 2), &none, &cfg(), &["C6a"]);
}

// ---------------------------------------------------------------- C6b

#[test]
fn c6b_a_renewal_accepted_after_the_lost_signal_or_with_no_validity() {
    let with = |rem: u64, lost_flag: bool| {
        let mut h = acquired(10 * MS, "a#0", "A", 1);
        h.push(sent(300 * MS, "a#0", "A", 1, 500 * MS));
        h.push(Event {
            lost: Some(lost_flag),
            ..accepted(301 * MS, "a#0", "A", 1, rem)
        });
        h.extend(released(400 * MS, "a#0", "A"));
        h
    };
    let none = FinalState::default();
    assert_rules(&with(900 * MS, false), &none, &cfg(), &[]);
    assert_rules(&with(900 * MS, true), &none, &cfg(), &["C6b"]);
    assert_rules(&with(0, false), &none, &cfg(), &["C6b"]);
}

// ---------------------------------------------------------------- C6c

/// A holds from 10 ms and sees its lease lost at 300 ms (a reset on its path before);
/// B acquires at 400 ms; A's stale call is sent at `sent_at` and answered at 450 ms with
/// `answer`.
fn stale_call(op: Op, sent_at: u64, answer: Phase, detail: &str) -> Vec<Event> {
    let mut h = acquired(10 * MS, "a#0", "A", 1);
    h.push(fault(200 * MS, "a", FaultKind::ProxyReset));
    h.push(check_ev(300 * MS, "a#0", "A", 1, true));
    h.extend(acquired(400 * MS, "b#0", "B", 2));
    let mut invoke = ev(sent_at, "a#0", op, Phase::Invoke, "A");
    let mut reply = ev(450 * MS, "a#0", op, answer, "A");
    if op == Op::Renew {
        invoke = Event {
            remaining_ns: Some(MS),
            lost: Some(false),
            fence: Some(1),
            ..invoke
        };
        reply = Event {
            remaining_ns: Some(MS),
            lost: Some(false),
            fence: Some(1),
            ..reply
        };
    }
    reply.detail = detail.into();
    h.push(invoke);
    h.push(reply);
    h.extend(released(500 * MS, "b#0", "B"));
    h
}

#[test]
fn c6c_a_release_sent_after_another_owners_grant_succeeded() {
    let none = FinalState::default();
    assert_rules(
        &stale_call(Op::Release, 400 * MS, Phase::Ok, ""),
        &none,
        &cfg(),
        &["C6c"],
    );
    assert_rules(
        &stale_call(Op::Release, 400 * MS - 1, Phase::Ok, ""),
        &none,
        &cfg(),
        &[],
    );
    assert_rules(
        &stale_call(Op::Release, 420 * MS, Phase::Fail, "not owner"),
        &none,
        &cfg(),
        &[],
    );
}

#[test]
fn c6c_a_renewal_sent_after_another_owners_grant_was_renewed() {
    let none = FinalState::default();
    // Accepted by the client (and sent after the holder released: not C6a, whose
    // deadline is still ahead).
    assert_rules(
        &stale_call(Op::Renew, 420 * MS, Phase::Ok, "accepted"),
        &none,
        &cfg(),
        &["C6c"],
    );
    // Renewed by the store, refused by the client: the store still said yes.
    assert_rules(
        &stale_call(Op::Renew, 420 * MS, Phase::Fail, "refused"),
        &none,
        &cfg(),
        &["C6c"],
    );
    assert_rules(
        &stale_call(Op::Renew, 420 * MS, Phase::Fail, "not_owner"),
        &none,
        &cfg(),
        &[],
    );
    assert_rules(
        &stale_call(Op::Renew, 420 * MS, Phase::Unknown, "failed"),
        &none,
        &cfg(),
        &[],
    );
    assert_rules(
        &stale_call(Op::Renew, 399 * MS, Phase::Ok, "accepted"),
        &none,
        &cfg(),
        &[],
    );
}

#[test]
fn c6c_an_older_grant_is_no_takeover() {
    // B held before A; A's release after B's grant is A's own.
    let mut h = acquired(10 * MS, "b#0", "B", 1);
    h.extend(released(100 * MS, "b#0", "B"));
    h.extend(acquired(200 * MS, "a#0", "A", 2));
    h.extend(released(300 * MS, "a#0", "A"));
    assert_rules(&h, &FinalState::default(), &cfg(), &[]);
}

#[test]
fn c6c_a_reply_without_its_send_counts_from_the_reply() {
    let mut h = stale_call(Op::Release, 420 * MS, Phase::Ok, "");
    h.retain(|e| !(e.owner == "A" && e.t == 420 * MS));
    assert_rules(&h, &FinalState::default(), &cfg(), &["C6c"]);
}

#[test]
fn c6c_the_send_is_the_callers_own_invoke() {
    // A's release is sent at 399 ms, before B's grant; B releases in between (410 ms);
    // A's reply comes at 450 ms. B's release is not A's send.
    let mut h = acquired(10 * MS, "a#0", "A", 1);
    h.push(ev(399 * MS, "a#0", Op::Release, Phase::Invoke, "A"));
    h.extend(acquired(400 * MS, "b#0", "B", 2));
    h.extend(released(410 * MS, "b#0", "B"));
    h.push(ev(450 * MS, "a#0", Op::Release, Phase::Ok, "A"));
    assert_rules(&h, &FinalState::default(), &cfg(), &[]);
}

#[test]
fn c6c_a_grant_at_the_same_instant_as_the_callers_own_is_no_later_grant() {
    // Both granted at 10 ms (C3 says so); A's release after that is not stale.
    let mut h = acquired(10 * MS, "a#0", "A", 1);
    h.extend(acquired(10 * MS, "b#0", "B", 2));
    h.extend(released(300 * MS, "a#0", "A"));
    h.extend(released(400 * MS, "b#0", "B"));
    assert_rules(&h, &FinalState::default(), &cfg(), &["C3"]);
}

// ---------------------------------------------------------------- C7

#[test]
fn c7a_an_acknowledged_write_is_missing() {
    let (h, _) = clean();
    let mut s = state(vec![row(1, 1, "A")]);
    s.counters[0].1 = 1;
    assert_rules(&h, &s, &cfg(), &["C7a"]);
}

#[test]
fn c7a_only_acknowledged_writes_must_be_in_the_audit() {
    // A write that got a sequence number but was rolled back (rejected) is not there.
    let (mut h, s) = clean();
    h.push(Event {
        fence: Some(2),
        seq: Some(9),
        detail: "rolled back".into(),
        ..ev(450 * MS, "b#0", Op::Write, Phase::Fail, "B")
    });
    assert_rules(&h, &s, &cfg(), &[]);
}

#[test]
fn c7b_a_lost_update() {
    let (h, mut s) = clean();
    s.counters = vec![(KEY.into(), 1)];
    assert_rules(&h, &s, &cfg(), &["C7b"]);
}

// ---------------------------------------------------------------- C8

#[test]
fn c8a_one_owner_recorded_with_two_fences() {
    // By the store's own record.
    let (mut h, s) = clean();
    h.push(inspect(200 * MS, "A", Some(7), ""));
    assert_rules(&h, &s, &cfg(), &["C8a"]);
    // By the audit.
    let (h, _) = clean();
    let s = state(vec![row(1, 1, "A"), row(2, 2, "B"), row(3, 3, "B")]);
    assert_rules(&h, &s, &cfg(), &["C8a"]);
}

/// The store records owner O with fence 5 at 10 ms and 500 ms (the acquire's reply was
/// lost; `returned`: an acquire did return it at 20 ms, released at 30 ms); O's retry is
/// granted fence `f2` at `f2_at`.
fn regranted(f2_at: u64, f2: u64, returned: bool) -> Vec<Event> {
    let mut h = vec![ev(5 * MS, "a#0", Op::Acquire, Phase::Invoke, "")];
    h.push(inspect(10 * MS, "O", Some(5), ""));
    if returned {
        h.push(Event {
            fence: Some(5),
            valid_until: Some(900 * MS),
            ..ev(20 * MS, "a#0", Op::Acquire, Phase::Ok, "O")
        });
        h.extend(released(30 * MS, "a#0", "O"));
    }
    h.push(inspect(500 * MS, "O", Some(5), ""));
    h.extend(acquired(f2_at, "a#0", "O", f2));
    h.extend(released(f2_at + 100 * MS, "a#0", "O"));
    h
}

#[test]
fn c8a_a_fresh_grant_to_the_same_owner_is_exempt_only_a_ttl_after_an_unreturned_one() {
    let none = FinalState::default();
    // A TTL after the first sighting (not the last): the unreturned grant had expired.
    assert_rules(&regranted(10 * MS + TTL, 9, false), &none, &cfg(), &[]);
    assert_rules(
        &regranted(10 * MS + TTL - 1, 9, false),
        &none,
        &cfg(),
        &["C8a"],
    );
    // The earlier grant was returned to a worker (and renewable): no exemption.
    assert_rules(
        &regranted(10 * MS + 3 * TTL, 9, true),
        &none,
        &cfg(),
        &["C8a"],
    );
    // A fresh grant has a higher fence.
    assert_rules(&regranted(10 * MS + TTL, 4, false), &none, &cfg(), &["C8a"]);
}

/// `regranted`, with a store fault (a fail-over) from `from` to `to` inserted.
fn regranted_across(f2_at: u64, returned: bool, from: u64, to: u64) -> Vec<Event> {
    let mut h = regranted(f2_at, 9, returned);
    h.push(fault(from, "store", FaultKind::RestartStore));
    h.push(fault(to, "store", FaultKind::StoreBack));
    h
}

#[test]
fn c8a_a_failover_that_forgot_an_unreturned_grant_is_exempt_only_when_configured_and_between() {
    let none = FinalState::default();
    let sentinel = CheckConfig {
        failover_forgets_unacknowledged: true,
        ..cfg()
    };
    // Re-granted 300 ms after the last sighting (well within a TTL of the first).
    let f2_at = 800 * MS;
    // A fail-over between the two sightings (first at 10 ms, second at f2_at).
    assert_rules(
        &regranted_across(f2_at, false, 600 * MS, 700 * MS),
        &none,
        &sentinel,
        &[],
    );
    // Touching either end still counts: it spans the time between them.
    assert_rules(
        &regranted_across(f2_at, false, f2_at, f2_at + MS),
        &none,
        &sentinel,
        &[],
    );
    assert_rules(
        &regranted_across(f2_at, false, 0, 10 * MS),
        &none,
        &sentinel,
        &[],
    );
    // Just outside: after the second sighting, or over before the first.
    assert_rules(
        &regranted_across(f2_at, false, f2_at + 1, f2_at + MS),
        &none,
        &sentinel,
        &["C8a"],
    );
    assert_rules(
        &regranted_across(f2_at, false, 0, 10 * MS - 1),
        &none,
        &sentinel,
        &["C8a"],
    );
    // The earlier grant was returned (the caller holds and renews it): no exemption.
    assert_rules(
        &regranted_across(f2_at, true, 600 * MS, 700 * MS),
        &none,
        &sentinel,
        &["C8a"],
    );
    // A store that does not forget unacknowledged grants gets no exemption.
    assert_rules(
        &regranted_across(f2_at, false, 600 * MS, 700 * MS),
        &none,
        &cfg(),
        &["C8a"],
    );
}

#[test]
fn c8b_a_lease_left_over_after_the_run() {
    let (mut h, s) = clean();
    h.push(inspect(6000 * MS, "B", Some(2), "final"));
    assert_rules(&h, &s, &cfg(), &["C8b"]);
    // An inspection during the run that sees a holder is no leftover.
    let (mut h, s) = clean();
    h.push(inspect(450 * MS, "B", Some(2), ""));
    assert_rules(&h, &s, &cfg(), &[]);
}

// ---------------------------------------------------------------- C9

/// A holds from 10 ms; `kind` at `kill_at`; B takes over at `takeover` (if any); the
/// history ends at `end`.
fn crash(kind: FaultKind, kill_at: u64, takeover: Option<u64>, end: u64) -> Vec<Event> {
    let mut h = acquired(10 * MS, "a#0", "A", 1);
    h.push(fault(kill_at, "a#0", kind));
    if let Some(t) = takeover {
        h.extend(acquired(t, "b#0", "B", 2));
        h.extend(released(t + MS, "b#0", "B"));
    }
    h.push(end_at(end));
    h
}

const BOUND: u64 = 3 * TTL;

#[test]
fn c9_no_takeover_after_a_crash() {
    let none = FinalState::default();
    let k = 100 * MS;
    assert_rules(
        &crash(FaultKind::Kill9, k, None, 10_000 * MS),
        &none,
        &cfg(),
        &["C9"],
    );
    assert_rules(
        &crash(FaultKind::Kill9, k, Some(k + BOUND), 10_000 * MS),
        &none,
        &cfg(),
        &[],
    );
    assert_rules(
        &crash(FaultKind::Kill9, k, Some(k + BOUND + 1), 10_000 * MS),
        &none,
        &cfg(),
        &["C9"],
    );
    // A window starting at the kill itself is no takeover.
    assert_rules(
        &crash(FaultKind::Kill9, k, Some(k), 10_000 * MS),
        &none,
        &cfg(),
        &["C3", "C9"],
    );
}

#[test]
fn c9_exempt_when_the_history_ends_before_the_bound() {
    let none = FinalState::default();
    let k = 100 * MS;
    assert_rules(
        &crash(FaultKind::Kill9, k, None, k + BOUND - 1),
        &none,
        &cfg(),
        &[],
    );
    assert_rules(
        &crash(FaultKind::Kill9, k, None, k + BOUND),
        &none,
        &cfg(),
        &["C9"],
    );
}

#[test]
fn c9_store_faults_within_the_wait_move_the_bound_by_their_length() {
    let none = FinalState::default();
    let k = 100 * MS;
    let with_faults = |takeover: u64, spans: &[(u64, u64)]| {
        let mut h = crash(FaultKind::Kill9, k, Some(takeover), 60_000 * MS);
        for &(s, e) in spans {
            h.push(fault(s, "store", FaultKind::RestartStore));
            h.push(fault(e, "store", FaultKind::StoreBack));
        }
        h
    };
    let ten = 10_000 * MS;
    // One 10 s fail-over inside the wait: 10 s more.
    let one = [(k + TTL, k + TTL + ten)];
    assert_rules(&with_faults(k + BOUND + ten, &one), &none, &cfg(), &[]);
    assert_rules(
        &with_faults(k + BOUND + ten + 1, &one),
        &none,
        &cfg(),
        &["C9"],
    );
    // A second one that starts inside the moved bound (not the first) counts too.
    let second = k + TTL + ten + TTL; // after the first ends, before k + BOUND + ten
    let two = [(k + TTL, k + TTL + ten), (second, second + ten)];
    assert_rules(&with_faults(k + BOUND + 2 * ten, &two), &none, &cfg(), &[]);
    assert_rules(
        &with_faults(k + BOUND + 2 * ten + 1, &two),
        &none,
        &cfg(),
        &["C9"],
    );
    // A fault that began before the kill counts only from the kill.
    let before = [(k - 50 * MS, k + 5_000 * MS)];
    assert_rules(
        &with_faults(k + BOUND + 5_000 * MS, &before),
        &none,
        &cfg(),
        &[],
    );
    assert_rules(
        &with_faults(k + BOUND + 5_000 * MS + 1, &before),
        &none,
        &cfg(),
        &["C9"],
    );
    // One over before the kill, or starting after the bound, moves nothing.
    let outside = [(k - 80 * MS, k - 20 * MS), (k + BOUND + 1, k + BOUND + ten)];
    assert_rules(
        &with_faults(k + BOUND + 1, &outside),
        &none,
        &cfg(),
        &["C9"],
    );
}

#[test]
fn c9_the_end_of_run_kill_is_exempt() {
    let h = crash(FaultKind::EndKill, 100 * MS, None, 10_000 * MS);
    assert_rules(&h, &FinalState::default(), &cfg(), &[]);
}

#[test]
fn c9_only_a_kill_inside_a_window_of_that_incarnation_counts() {
    let none = FinalState::default();
    // Killed at its window's start: inside.
    assert_rules(
        &crash(FaultKind::Kill9, 10 * MS, None, 10_000 * MS),
        &none,
        &cfg(),
        &["C9"],
    );
    // Killed at its deadline (its window's end): outside.
    let mut h = crash(FaultKind::Kill9, D, None, 10_000 * MS);
    h.push(fault(500 * MS, "a#0", FaultKind::Sigstop));
    assert_rules(&h, &none, &cfg(), &[]);
    // Another incarnation of the slot killed: not this holder.
    let mut h = crash(FaultKind::Kill9, 100 * MS, None, 10_000 * MS);
    for e in &mut h {
        if e.op == Some(Op::Fault) {
            e.key = "a#1".into();
        }
    }
    h.extend(released(200 * MS, "a#0", "A"));
    assert_rules(&h, &none, &cfg(), &[]);
}

// ---------------------------------------------------------------- C10

/// A holds from 10 ms; its lease is lost at `l`, observed by a lost event; `faults`.
fn lost_with(l: u64, faults: Vec<Event>) -> Vec<Event> {
    let mut h = acquired(10 * MS, "a#0", "A", 1);
    h.extend(faults);
    h.push(lost(l, "a#0", "A", 1));
    h.push(end_at(10_000 * MS));
    h
}

#[test]
fn c10_lost_with_no_fault() {
    assert_rules(
        &lost_with(500 * MS, vec![]),
        &FinalState::default(),
        &cfg(),
        &["C10"],
    );
    // Observed by a check only, it is still a lost signal.
    let mut h = acquired(10 * MS, "a#0", "A", 1);
    h.push(check_ev(500 * MS, "a#0", "A", 1, true));
    h.extend(released(510 * MS, "a#0", "A"));
    assert_rules(&h, &FinalState::default(), &cfg(), &["C10"]);
}

#[test]
fn c10_names_the_lost_reason_or_the_check_that_saw_it() {
    let detail = |h: &[Event]| {
        check(h, &FinalState::default(), &cfg())
            .into_iter()
            .find(|v| v.rule == "C10")
            .map(|v| v.detail)
            .unwrap_or_default()
    };
    let d = detail(&lost_with(500 * MS, vec![]));
    assert!(d.contains("(fence 1, expired)"), "{d}");
    let mut h = acquired(10 * MS, "a#0", "A", 1);
    h.push(check_ev(500 * MS, "a#0", "A", 1, true));
    h.extend(released(510 * MS, "a#0", "A"));
    let d = detail(&h);
    assert!(d.contains("(fence 1, observed by a check)"), "{d}");
}

#[test]
fn c10_a_freeze_of_the_same_incarnation_explains_it_within_its_reach() {
    let none = FinalState::default();
    let freeze = |who: &str| {
        vec![
            fault(100 * MS, who, FaultKind::Sigstop),
            fault(200 * MS, who, FaultKind::Sigcont),
        ]
    };
    assert_rules(&lost_with(100 * MS, freeze("a#0")), &none, &cfg(), &[]);
    assert_rules(
        &lost_with(200 * MS + TTL, freeze("a#0")),
        &none,
        &cfg(),
        &[],
    );
    assert_rules(
        &lost_with(200 * MS + TTL + 1, freeze("a#0")),
        &none,
        &cfg(),
        &["C10"],
    );
    assert_rules(
        &lost_with(100 * MS - 1, freeze("a#0")),
        &none,
        &cfg(),
        &["C10"],
    );
    // Another worker, or another incarnation of the same slot: no explanation.
    assert_rules(&lost_with(150 * MS, freeze("b#0")), &none, &cfg(), &["C10"]);
    assert_rules(&lost_with(150 * MS, freeze("a#1")), &none, &cfg(), &["C10"]);
    // Frozen and never resumed: explains everything after.
    let open = vec![fault(100 * MS, "a#0", FaultKind::Sigstop)];
    assert_rules(&lost_with(5000 * MS, open), &none, &cfg(), &[]);
}

#[test]
fn c10_a_proxy_fault_on_its_own_path_explains_it_within_its_reach() {
    let none = FinalState::default();
    for kind in [
        FaultKind::ProxyDelay,
        FaultKind::ProxyDropReplies,
        FaultKind::ProxyBlackhole,
        FaultKind::ProxyReset,
    ] {
        let path = |slot: &str| {
            vec![
                fault(100 * MS, slot, kind),
                fault(200 * MS, slot, FaultKind::ProxyPass),
            ]
        };
        assert_rules(&lost_with(100 * MS, path("a")), &none, &cfg(), &[]);
        assert_rules(&lost_with(200 * MS + TTL, path("a")), &none, &cfg(), &[]);
        assert_rules(
            &lost_with(200 * MS + TTL + 1, path("a")),
            &none,
            &cfg(),
            &["C10"],
        );
        assert_rules(&lost_with(100 * MS - 1, path("a")), &none, &cfg(), &["C10"]);
        assert_rules(&lost_with(150 * MS, path("b")), &none, &cfg(), &["C10"]);
    }
    // A fault still on at the end explains everything after its start.
    let open = vec![fault(100 * MS, "a", FaultKind::ProxyBlackhole)];
    assert_rules(&lost_with(900 * MS, open), &none, &cfg(), &[]);
    // A pass with no fault before it explains nothing.
    let pass = vec![fault(100 * MS, "a", FaultKind::ProxyPass)];
    assert_rules(&lost_with(150 * MS, pass), &none, &cfg(), &["C10"]);
}

#[test]
fn c10_a_store_restart_explains_it_within_its_reach() {
    let none = FinalState::default();
    let restart = || {
        vec![
            fault(100 * MS, "store", FaultKind::RestartStore),
            fault(200 * MS, "store", FaultKind::StoreBack),
        ]
    };
    assert_rules(&lost_with(100 * MS, restart()), &none, &cfg(), &[]);
    assert_rules(&lost_with(200 * MS + TTL, restart()), &none, &cfg(), &[]);
    assert_rules(
        &lost_with(200 * MS + TTL + 1, restart()),
        &none,
        &cfg(),
        &["C10"],
    );
    assert_rules(&lost_with(100 * MS - 1, restart()), &none, &cfg(), &["C10"]);
    // A kill of the worker, or a kill of another, explains no lost signal.
    let kill = vec![fault(100 * MS, "b#0", FaultKind::Kill9)];
    assert_rules(&lost_with(150 * MS, kill), &none, &cfg(), &["C10"]);
}

// ---------------------------------------------------------------- C11

/// The events `h` on `key` instead of the standard key.
fn keyed(key: &str, h: Vec<Event>) -> Vec<Event> {
    h.into_iter()
        .map(|e| Event {
            key: key.into(),
            ..e
        })
        .collect()
}

/// A permit's window on slot key `key`: acquired at `start`, released at `end`.
fn permit(key: &str, worker: &str, owner: &str, start: u64, end: u64) -> Vec<Event> {
    let mut h = acquired(start, worker, owner, 1);
    h.extend(released(end, worker, owner));
    keyed(key, h)
}

/// C11 with `n` permits.
fn sem_cfg(n: u32) -> CheckConfig {
    CheckConfig {
        permits: Some(n),
        ..cfg()
    }
}

/// A on `s#0` from 10 ms, B on `s#1` from 20 ms, both until 400 ms; C on `s#2` from
/// `c_start` to 500 ms.
fn three_permits(c_start: u64) -> Vec<Event> {
    let mut h = permit("s#0", "a#0", "A", 10 * MS, 400 * MS);
    h.extend(permit("s#1", "b#0", "B", 20 * MS, 400 * MS));
    h.extend(permit("s#2", "c#0", "C", c_start, 500 * MS));
    h
}

#[test]
fn c11_n_plus_one_windows_in_force_at_once() {
    let none = FinalState::default();
    assert_rules(&three_permits(30 * MS), &none, &sem_cfg(2), &["C11"]);
    // Each slot key on its own is fine: C3 sees nothing.
    assert_rules(&three_permits(30 * MS), &none, &cfg(), &[]);
}

#[test]
fn c11_n_windows_pass() {
    let none = FinalState::default();
    assert_rules(&three_permits(30 * MS), &none, &sem_cfg(3), &[]);
    // The third starts as the first two end (their release invokes): never three at once.
    assert_rules(&three_permits(400 * MS), &none, &sem_cfg(2), &[]);
    // One nanosecond earlier it is.
    assert_rules(&three_permits(400 * MS - 1), &none, &sem_cfg(2), &["C11"]);
}

#[test]
fn c11_a_window_ends_at_its_first_lost_observation() {
    // A sees its lease lost at 300 ms (a reset on its path before): C may start there,
    // though A releases only at 400 ms.
    let with_lost = |c_start: u64| {
        let mut h = three_permits(c_start);
        h.push(fault(5 * MS, "a", FaultKind::ProxyReset));
        h.push(fault(6 * MS, "a", FaultKind::ProxyPass));
        h.extend(keyed("s#0", vec![check_ev(300 * MS, "a#0", "A", 1, true)]));
        h
    };
    let none = FinalState::default();
    assert_rules(&with_lost(300 * MS), &none, &sem_cfg(2), &[]);
    assert_rules(&with_lost(300 * MS - 1), &none, &sem_cfg(2), &["C11"]);
}

#[test]
fn c11_semaphores_are_counted_apart_and_other_keys_are_not_slots() {
    let mut h = permit("s#0", "a#0", "A", 10 * MS, 400 * MS);
    h.extend(permit("s#1", "b#0", "B", 20 * MS, 400 * MS));
    h.extend(permit("t#0", "c#0", "C", 30 * MS, 400 * MS));
    h.extend(permit("s#x", "d#0", "D", 40 * MS, 400 * MS));
    h.extend(permit("s", "e#0", "E", 50 * MS, 400 * MS));
    h.extend(permit("#1", "f#0", "F", 60 * MS, 400 * MS));
    h.extend(permit("s#", "h#0", "H", 65 * MS, 400 * MS));
    assert_rules(&h, &FinalState::default(), &sem_cfg(2), &[]);
    // A slot key past N (a caller with another N) still counts against NAME's bound.
    h.extend(permit("s#7", "g#0", "G", 70 * MS, 400 * MS));
    assert_rules(&h, &FinalState::default(), &sem_cfg(2), &["C11"]);
}

#[test]
fn c11_the_same_lease_twice_is_one_holder() {
    // An ambiguous acquire answered twice with the same lease of `s#1`.
    let mut h = permit("s#0", "a#0", "A", 10 * MS, 400 * MS);
    h.extend(keyed("s#1", acquired(20 * MS, "b#0", "B", 1)));
    h.extend(permit("s#1", "b#0", "B", 30 * MS, 400 * MS));
    assert_rules(&h, &FinalState::default(), &sem_cfg(2), &[]);
}

#[test]
fn c11_is_not_checked_without_permits_or_on_a_lossy_store() {
    let lossy = CheckConfig {
        lossy_store: true,
        ..sem_cfg(2)
    };
    assert_rules(&three_permits(30 * MS), &FinalState::default(), &lossy, &[]);
}

#[test]
fn c11_a_store_restart_between_the_starts_is_exempt_only_when_restarts_lose_leases() {
    let at = |t: u64| {
        let mut h = three_permits(30 * MS);
        h.push(fault(t, "store", FaultKind::RestartStore));
        h.push(fault(t + MS / 2, "store", FaultKind::StoreBack));
        h
    };
    let restarts = CheckConfig {
        restart_loses_leases: true,
        ..sem_cfg(2)
    };
    let none = FinalState::default();
    // Just inside: at A's start (A not counted against C), at C's start (neither A nor B).
    assert_rules(&at(10 * MS), &none, &restarts, &[]);
    assert_rules(&at(30 * MS), &none, &restarts, &[]);
    // Between A's and B's starts: A is not counted, B is: two in force, C passes.
    assert_rules(&at(15 * MS), &none, &restarts, &[]);
    // Just outside: before A's start, after C's start.
    assert_rules(&at(10 * MS - 1), &none, &restarts, &["C11"]);
    assert_rules(&at(30 * MS + 1), &none, &restarts, &["C11"]);
    // A store that keeps its leases over a restart gets no exemption.
    assert_rules(&at(20 * MS), &none, &sem_cfg(2), &["C11"]);
}

#[test]
fn c11_a_restart_does_not_hide_an_overlap_of_windows_started_after_it() {
    // A restart at 15 ms exempts A against C (A started before it), but D starts on
    // `s#0` at 300 ms after A's release, with B and C (both started after the restart)
    // still in force: three at once that no restart explains.
    let restarts = CheckConfig {
        restart_loses_leases: true,
        ..sem_cfg(2)
    };
    let mut h = permit("s#0", "a#0", "A", 10 * MS, 250 * MS);
    h.extend(permit("s#1", "b#0", "B", 20 * MS, 400 * MS));
    h.extend(permit("s#2", "c#0", "C", 30 * MS, 400 * MS));
    h.push(fault(15 * MS, "store", FaultKind::RestartStore));
    h.push(fault(16 * MS, "store", FaultKind::StoreBack));
    let none = FinalState::default();
    assert_rules(&h, &none, &restarts, &[]);
    h.extend(keyed("s#0", {
        let mut d = acquired(300 * MS, "d#0", "D", 2);
        d.extend(released(350 * MS, "d#0", "D"));
        d
    }));
    let v = check(&h, &none, &restarts);
    assert_eq!(rules(&v).into_iter().collect::<Vec<_>>(), ["C11"], "{v:#?}");
    assert_eq!(v.len(), 1, "only D's start is over the bound: {v:#?}");
    assert!(v[0].detail.contains("d#0 on s#0"), "{}", v[0].detail);
}

#[test]
fn c11_two_holders_of_one_slot_count_twice() {
    // A broken slot (C3) is also one holder too many for the semaphore: A and C on
    // `s#0` at once (A's release then answered "not owner"), B on `s#1`.
    let mut h = acquired(10 * MS, "a#0", "A", 1);
    h.extend(refused_release(400 * MS, "a#0", "A"));
    let mut h = keyed("s#0", h);
    h.extend(permit("s#1", "b#0", "B", 20 * MS, 400 * MS));
    h.extend(keyed("s#0", {
        let mut c = acquired(30 * MS, "c#0", "C", 2);
        c.extend(released(500 * MS, "c#0", "C"));
        c
    }));
    assert_rules(&h, &FinalState::default(), &sem_cfg(2), &["C11", "C3"]);
    assert_rules(&h, &FinalState::default(), &sem_cfg(3), &["C3"]);
}
