//! The history-building helpers every rule's tests share: one event or call of each kind,
//! the standard holder, and the histories more than one rule is tested on.
//!
//! The standard holder: `a#0` acquires at 10 ms with a TTL of 1 s and a validity deadline
//! `D` = 990 ms; lost slack TTL/4, so its due is 1240 ms while it runs.

use leasehold_checker::checker::rules;
use leasehold_checker::{AuditRow, CheckConfig, Event, FaultKind, FinalState, Op, Phase, check};

pub const MS: u64 = 1_000_000;
pub const TTL: u64 = 1000 * MS;
pub const KEY: &str = "job:k";
/// `a#0`'s deadline when it acquires at 10 ms.
pub const D: u64 = 990 * MS;
/// `a#0`'s due for its lost signal while it runs.
pub const DUE: u64 = D + TTL / 4;

pub fn ev(t: u64, worker: &str, op: Op, phase: Phase, owner: &str) -> Event {
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

pub fn acquired(t: u64, worker: &str, owner: &str, fence: u64) -> Vec<Event> {
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
pub fn sent(t: u64, worker: &str, owner: &str, fence: u64, remaining: u64) -> Event {
    Event {
        fence: Some(fence),
        remaining_ns: Some(remaining),
        lost: Some(false),
        detail: "sent".into(),
        ..ev(t, worker, Op::Renew, Phase::Invoke, owner)
    }
}

/// A renewal the client accepted at `t`, extending the deadline to `t + remaining`.
pub fn accepted(t: u64, worker: &str, owner: &str, fence: u64, remaining: u64) -> Event {
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
pub fn renewed(t: u64, worker: &str, owner: &str, fence: u64) -> Vec<Event> {
    vec![
        sent(t, worker, owner, fence, 500 * MS),
        accepted(t + MS, worker, owner, fence, TTL - 21 * MS),
    ]
}

pub fn check_ev(t: u64, worker: &str, owner: &str, fence: u64, lost: bool) -> Event {
    Event {
        fence: Some(fence),
        lost: Some(lost),
        ..ev(t, worker, Op::Check, Phase::Ok, owner)
    }
}

/// A write probed at `t` (answer `lost`) and accepted 1 ms later as audit row `seq`.
pub fn write(t: u64, worker: &str, owner: &str, fence: u64, seq: u64, lost: bool) -> Vec<Event> {
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
pub fn write_rejected(t: u64, worker: &str, owner: &str, fence: u64, lost: bool) -> Vec<Event> {
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

pub fn released(t: u64, worker: &str, owner: &str) -> Vec<Event> {
    vec![
        ev(t, worker, Op::Release, Phase::Invoke, owner),
        ev(t + MS, worker, Op::Release, Phase::Ok, owner),
    ]
}

/// A release invoked at `t` and answered "not owner" 1 ms later.
pub fn refused_release(t: u64, worker: &str, owner: &str) -> Vec<Event> {
    vec![
        ev(t, worker, Op::Release, Phase::Invoke, owner),
        Event {
            detail: "not owner".into(),
            ..ev(t + MS, worker, Op::Release, Phase::Fail, owner)
        },
    ]
}

pub fn lost(t: u64, worker: &str, owner: &str, fence: u64) -> Event {
    Event {
        fence: Some(fence),
        detail: "expired".into(),
        ..ev(t, worker, Op::Lost, Phase::Ok, owner)
    }
}

pub fn fault(t: u64, target: &str, kind: FaultKind) -> Event {
    Event {
        t,
        worker: "injector".into(),
        op: Some(Op::Fault),
        key: target.into(),
        fault: Some(kind),
        ..Default::default()
    }
}

pub fn inspect(t: u64, owner: &str, fence: Option<u64>, detail: &str) -> Event {
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
pub fn end_at(t: u64) -> Event {
    inspect(t, "", None, "")
}

pub fn row(seq: u64, fence: u64, owner: &str) -> AuditRow {
    AuditRow {
        seq,
        resource: KEY.into(),
        fence,
        owner: owner.into(),
    }
}

pub fn state(rows: Vec<AuditRow>) -> FinalState {
    let n = rows.len() as u64;
    FinalState {
        audit: rows,
        counters: vec![(KEY.into(), n)],
    }
}

pub fn cfg() -> CheckConfig {
    CheckConfig::for_ttl_ns(TTL)
}

pub fn found(h: &[Event], s: &FinalState, c: &CheckConfig) -> Vec<&'static str> {
    rules(&check(h, s, c)).into_iter().collect()
}

#[track_caller]
pub fn assert_rules(h: &[Event], s: &FinalState, c: &CheckConfig, want: &[&str]) {
    let v = check(h, s, c);
    let got: Vec<&str> = rules(&v).into_iter().collect();
    assert_eq!(got, want, "{v:#?}");
}

/// A clean hand-off: A holds (renews once, checks, writes), releases; B acquires, writes,
/// releases; the store is inspected along the way and empty at the end.
pub fn clean() -> (Vec<Event>, FinalState) {
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
pub fn holder_until_deadline() -> Vec<Event> {
    let mut h = acquired(10 * MS, "a#0", "A", 1);
    h.push(fault(500 * MS, "a", FaultKind::ProxyBlackhole));
    h.push(fault(600 * MS, "a", FaultKind::ProxyPass));
    h.push(end_at(5000 * MS));
    h
}

/// The stale-write script: A checks, is frozen before its write past its deadline, B
/// takes over and writes, A wakes, probes (lost), writes.
pub fn stale_write(accepted_stale: bool) -> (Vec<Event>, FinalState) {
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

/// A holds from 10 ms until it sees its lease lost at `a_end` (a reset on its path
/// before), and releases later (answered "not owner"); B acquires at `b_start`.
pub fn two_holders(a_end: u64, b_start: u64) -> Vec<Event> {
    let mut h = acquired(10 * MS, "a#0", "A", 1);
    h.push(fault(5 * MS, "a", FaultKind::ProxyReset));
    h.push(fault(6 * MS, "a", FaultKind::ProxyPass));
    h.push(check_ev(a_end, "a#0", "A", 1, true));
    h.extend(refused_release(600 * MS, "a#0", "A"));
    h.extend(acquired(b_start, "b#0", "B", 2));
    h.extend(released(b_start + 100 * MS, "b#0", "B"));
    h
}
