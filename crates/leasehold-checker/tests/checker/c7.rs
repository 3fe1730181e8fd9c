//! C7: acknowledged writes are in the audit (C7a), and no update is lost (C7b).

use crate::history::*;
use leasehold_checker::{Event, Op, Phase};

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
