//! C8: an owner token belongs to one fence (C8a, with its exemptions for a fresh grant
//! after an unreturned one), and nothing is left in the store after the run (C8b).

use crate::history::*;
use leasehold_checker::{CheckConfig, Event, FaultKind, FinalState, Op, Phase};

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

/// Owner O's acquire call runs from 100 ms to 600 ms and returns fence 9; an inspection
/// at `seen_at` saw O with fence `candidate`.
fn candidate_seen(seen_at: u64, candidate: u64) -> Vec<Event> {
    let mut h = vec![ev(100 * MS, "a#0", Op::Acquire, Phase::Invoke, "")];
    h.push(inspect(seen_at, "O", Some(candidate), ""));
    h.push(Event {
        fence: Some(9),
        valid_until: Some(600 * MS + TTL - 20 * MS),
        ..ev(600 * MS, "a#0", Op::Acquire, Phase::Ok, "O")
    });
    h.extend(released(700 * MS, "a#0", "O"));
    h.sort_by_key(|e| e.t);
    h
}

#[test]
fn c8a_a_candidate_fence_seen_mid_acquire_is_exempt_only_when_configured_and_in_flight() {
    let none = FinalState::default();
    let redlock = CheckConfig {
        inspect_sees_candidates: true,
        ..cfg()
    };
    // Seen between the call's invoke and its reply, lower than the fence returned.
    assert_rules(&candidate_seen(300 * MS, 5), &none, &redlock, &[]);
    assert_rules(&candidate_seen(100 * MS, 5), &none, &redlock, &[]);
    // A store that shows no candidates gets no exemption.
    assert_rules(&candidate_seen(300 * MS, 5), &none, &cfg(), &["C8a"]);
    // Not lower than the fence returned.
    assert_rules(&candidate_seen(300 * MS, 10), &none, &redlock, &["C8a"]);
    // Before the call was invoked.
    assert_rules(&candidate_seen(100 * MS - 1, 5), &none, &redlock, &["C8a"]);
    // Seen again after the call returned (the owner holds fence 9 then).
    let mut h = candidate_seen(300 * MS, 5);
    h.push(inspect(650 * MS, "O", Some(5), ""));
    h.sort_by_key(|e| e.t);
    assert_rules(&h, &none, &redlock, &["C8a"]);
    // Seen by something other than an inspection (an audit row with the lower fence).
    let s = state(vec![row(1, 5, "O")]);
    assert_rules(&candidate_seen(300 * MS, 5), &s, &redlock, &["C8a"]);
}

/// Worker `a#0`'s acquire call on `invoked` runs from 100 ms and `end`s at 600 ms without
/// a lease; inspections see owner O (never returned) on `seen_key` with fence 5 at
/// `first_at` and fence 9 at 400 ms.
fn candidates_of_an_unreturned_call(
    invoked: &str,
    seen_key: &str,
    first_at: u64,
    end: Option<Event>,
) -> Vec<Event> {
    let on = |e: Event| Event {
        key: seen_key.into(),
        ..e
    };
    let mut h = vec![Event {
        key: invoked.into(),
        ..ev(100 * MS, "a#0", Op::Acquire, Phase::Invoke, "")
    }];
    h.push(on(inspect(first_at, "O", Some(5), "")));
    h.push(on(inspect(400 * MS, "O", Some(9), "")));
    h.extend(end);
    h.push(end_at(900 * MS));
    h.sort_by_key(|e| e.t);
    h
}

fn failed_at(t: u64, invoked: &str) -> Option<Event> {
    Some(Event {
        key: invoked.into(),
        ..ev(t, "a#0", Op::Acquire, Phase::Fail, "")
    })
}

#[test]
fn c8a_candidates_seen_during_a_call_that_returned_none_are_exempt_only_for_an_unreturned_owner() {
    let none = FinalState::default();
    let redlock = CheckConfig {
        inspect_sees_candidates: true,
        ..cfg()
    };
    let fails = failed_at(600 * MS, KEY);
    let h = candidates_of_an_unreturned_call(KEY, KEY, 200 * MS, fails.clone());
    assert_rules(&h, &none, &redlock, &[]);
    // A store that shows no candidates gets no exemption.
    assert_rules(&h, &none, &cfg(), &["C8a"]);
    // The lower fence seen before the call was invoked, or after it failed.
    let before = candidates_of_an_unreturned_call(KEY, KEY, 100 * MS - 1, fails.clone());
    assert_rules(&before, &none, &redlock, &["C8a"]);
    let after = candidates_of_an_unreturned_call(KEY, KEY, 650 * MS, failed_at(300 * MS, KEY));
    assert_rules(&after, &none, &redlock, &["C8a"]);
    // A call on another key.
    let other = candidates_of_an_unreturned_call("job:other", KEY, 200 * MS, fails.clone());
    assert_rules(&other, &none, &redlock, &["C8a"]);
    // A semaphore's call covers its slots, and only its own.
    let slot =
        candidates_of_an_unreturned_call("sem", "sem#1", 200 * MS, failed_at(600 * MS, "sem"));
    assert_rules(&slot, &none, &redlock, &[]);
    let near =
        candidates_of_an_unreturned_call("sem", "semx#1", 200 * MS, failed_at(600 * MS, "sem"));
    assert_rules(&near, &none, &redlock, &["C8a"]);
    // A call cut by its worker's kill ends there; one never ended runs to the end.
    let killed = Some(fault(600 * MS, "a#0", FaultKind::Kill9));
    assert_rules(
        &candidates_of_an_unreturned_call(KEY, KEY, 200 * MS, killed),
        &none,
        &redlock,
        &[],
    );
    let killed_early = Some(fault(150 * MS, "a#0", FaultKind::Kill9));
    assert_rules(
        &candidates_of_an_unreturned_call(KEY, KEY, 200 * MS, killed_early),
        &none,
        &redlock,
        &["C8a"],
    );
    assert_rules(
        &candidates_of_an_unreturned_call(KEY, KEY, 200 * MS, None),
        &none,
        &redlock,
        &[],
    );
    // An owner that a call returned is held to that call: a failed call of another
    // worker covers none of its sightings.
    let mut returned = h.clone();
    returned.extend(acquired(500 * MS, "b#0", "O", 9));
    returned.extend(released(550 * MS, "b#0", "O"));
    returned.sort_by_key(|e| e.t);
    assert_rules(&returned, &none, &redlock, &["C8a"]);
}

/// Owner O is seen holding with fence 5 by inspections only (a waiter's reservation, at
/// 200 and 300 ms); `between` (if any) is another owner's grant `(at, fence)`; O is granted
/// fence 9 at 700 ms, less than a TTL after the first sighting.
fn reserved_then_regranted(between: Option<(u64, u64)>, o_returned: bool) -> Vec<Event> {
    let mut h = vec![ev(100 * MS, "a#0", Op::Acquire, Phase::Invoke, "")];
    if o_returned {
        h.push(Event {
            fence: Some(5),
            valid_until: Some(900 * MS),
            ..ev(150 * MS, "a#0", Op::Acquire, Phase::Ok, "O")
        });
        h.extend(released(320 * MS, "a#0", "O"));
    }
    h.push(inspect(200 * MS, "O", Some(5), ""));
    h.push(inspect(300 * MS, "O", Some(5), ""));
    if let Some((at, fence)) = between {
        h.extend(acquired(at, "b#0", "P", fence));
        h.extend(released(at + 50 * MS, "b#0", "P"));
    }
    h.extend(acquired(700 * MS, "a#0", "O", 9));
    h.extend(released(800 * MS, "a#0", "O"));
    h.push(end_at(2000 * MS));
    h.sort_by_key(|e| e.t);
    h
}

#[test]
fn c8a_a_regrant_after_another_owner_held_the_key_in_between_is_exempt_only_then() {
    let none = FinalState::default();
    // Another owner held the key between the two sightings, with a fence between them.
    assert_rules(
        &reserved_then_regranted(Some((400 * MS, 6)), false),
        &none,
        &cfg(),
        &[],
    );
    // Nobody in between.
    assert_rules(
        &reserved_then_regranted(None, false),
        &none,
        &cfg(),
        &["C8a"],
    );
    // The other owner's grant after O's later one (fence above both).
    assert_rules(
        &reserved_then_regranted(Some((900 * MS, 10)), false),
        &none,
        &cfg(),
        &["C8a"],
    );
    // O's earlier fence had been returned to it: no exemption.
    assert_rules(
        &reserved_then_regranted(Some((400 * MS, 6)), true),
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
