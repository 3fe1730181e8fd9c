//! C5: no write started after its window ended is accepted once a newer fence's write was
//! acknowledged.

use crate::history::*;
use leasehold_checker::{Event, FinalState, Op, Phase};

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
