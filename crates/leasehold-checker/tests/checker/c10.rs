//! C10: a lost signal needs a fault on that incarnation, its own path or the store, within
//! its reach before.

use crate::history::*;
use leasehold_checker::{Event, FaultKind, FinalState, check};

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
