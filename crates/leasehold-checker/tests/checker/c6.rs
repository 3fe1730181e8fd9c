//! C6: renewals. C6a: none sent with no validity left, after lost or at the deadline in
//! force; C6b: none accepted after lost or with no validity; C6c: a stale renew or release
//! sent after another owner's later grant never succeeds.

use crate::history::*;
use leasehold_checker::{Event, FaultKind, FinalState, Op, Phase};

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
