//! C9: a holder killed with `kill -9` is taken over within the bound, moved on by the
//! time store faults take within it.

use crate::history::*;
use leasehold_checker::{CheckConfig, Event, FaultKind, FinalState, MemberRole, Op};

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

/// A grant the store made to a waiter that never recorded it (a fault of its own kept
/// the answer from it) is a takeover when the harness's inspection sees it within the
/// bound: another owner, a higher fence. The killed holder still seen, a free key, the
/// same owner under a higher fence or a reading after the bound are not.
#[test]
fn c9_a_takeover_seen_only_by_the_harness_counts() {
    let none = FinalState::default();
    let k = 100 * MS;
    let seen = |t: u64, owner: &str, fence: Option<u64>| {
        let mut h = crash(FaultKind::Kill9, k, None, 10_000 * MS);
        h.insert(h.len() - 1, inspect(t, owner, fence, ""));
        h
    };
    assert_rules(&seen(k + BOUND, "B", Some(2)), &none, &cfg(), &[]);
    assert_rules(&seen(k + BOUND + 1, "B", Some(2)), &none, &cfg(), &["C9"]);
    assert_rules(&seen(k + MS, "A", Some(1)), &none, &cfg(), &["C9"]);
    assert_rules(&seen(k + MS, "", None), &none, &cfg(), &["C9"]);
    assert_rules(&seen(k + MS, "", Some(3)), &none, &cfg(), &["C9"]);
    // (Another owner under the killed holder's fence is C2's, too.)
    assert_rules(&seen(k + MS, "B", Some(1)), &none, &cfg(), &["C2", "C9"]);
    assert_rules(&seen(k - MS, "B", Some(2)), &none, &cfg(), &["C9"]);
    let same_owner = found(&seen(k + MS, "A", Some(3)), &none, &cfg());
    assert!(same_owner.contains(&"C9"), "{same_owner:?}");
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
    // One starting at the very end of the bound is not within it: it moves nothing.
    let at_the_end = [(k + BOUND, k + BOUND + ten)];
    assert_rules(
        &with_faults(k + BOUND + 1, &at_the_end),
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

/// etcd and ZooKeeper: a restart or leader change gives every lease a fresh TTL when the
/// store is back, so the bound starts again there; a follower's kill renews nothing.
#[test]
fn c9_a_store_that_renews_leases_on_restart_starts_the_bound_again_when_it_is_back() {
    let none = FinalState::default();
    let k = 100 * MS;
    let (s, e) = (k + 2 * TTL + TTL / 2, k + 2 * TTL + TTL / 2 + 100 * MS);
    let with_restart = |takeover: u64, member: Option<MemberRole>| {
        let mut h = crash(FaultKind::Kill9, k, Some(takeover), 60_000 * MS);
        let mut restart = fault(s, "store", FaultKind::RestartStore);
        restart.member = member;
        // The detail says nothing the checker reads.
        restart.detail = "member 2 (follower) kill -9 and start again".into();
        h.push(restart);
        h.push(fault(e, "store", FaultKind::StoreBack));
        h
    };
    let renews = CheckConfig {
        restart_renews_leases: true,
        ..cfg()
    };
    let leader = Some(MemberRole::Leader);
    // Renewing: the bound is the store's return plus the whole bound.
    assert_rules(&with_restart(e + BOUND, leader), &none, &renews, &[]);
    assert_rules(
        &with_restart(e + BOUND + 1, leader),
        &none,
        &renews,
        &["C9"],
    );
    assert_rules(&with_restart(e + BOUND, None), &none, &renews, &[]);
    // Not renewing, or a follower killed: only moved on by the restart's length.
    let moved = k + BOUND + (e - s);
    assert_rules(&with_restart(moved, leader), &none, &cfg(), &[]);
    assert_rules(&with_restart(moved + 1, leader), &none, &cfg(), &["C9"]);
    let follower = Some(MemberRole::Follower);
    assert_rules(&with_restart(moved, follower), &none, &renews, &[]);
    assert_rules(&with_restart(moved + 1, follower), &none, &renews, &["C9"]);
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
