//! C11: semaphore mode: at no instant are more than N windows on the slot keys of one
//! semaphore in force (exempt exactly as C3).

use crate::history::*;
use leasehold_checker::checker::rules;
use leasehold_checker::{CheckConfig, Event, FaultKind, FinalState, check};

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
