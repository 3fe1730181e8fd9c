//! C3: windows of different owners on one key do not overlap (exempt on a lossy store,
//! and across a store restart between the starts when restarts lose leases).

use crate::history::*;
use leasehold_checker::{CheckConfig, FaultKind, FinalState};

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
