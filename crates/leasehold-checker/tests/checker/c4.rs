//! C4: the lost signal. C4a: observed within the running-time due after the deadline
//! (a freeze moves it by its length); C4b: every check or write probe at or after the
//! deadline answers lost (the first act after a resume); C4c: no write starts after the
//! deadline before lost was observed.

use crate::history::*;
use leasehold_checker::{CheckConfig, Event, FaultKind, FinalState, Op, Phase};

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
