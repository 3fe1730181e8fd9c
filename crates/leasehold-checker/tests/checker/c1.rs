//! C1: audit rows, in commit (`seq`) order, never go back in fence per resource.

use crate::history::*;
use leasehold_checker::check;

#[test]
fn c1_lower_fence_committed_after_a_higher_one() {
    let (h, _) = clean();
    let s = state(vec![row(1, 2, "B"), row(2, 1, "A")]);
    assert_rules(&h, &s, &cfg(), &["C1"]);
}

#[test]
fn c1_equal_fences_pass() {
    let (h, _) = clean();
    let s = state(vec![row(1, 1, "A"), row(2, 1, "A"), row(3, 2, "B")]);
    assert_rules(&h, &s, &cfg(), &[]);
}

#[test]
fn c1_rows_are_taken_in_seq_order_not_listed_order() {
    let (h, _) = clean();
    let s = state(vec![row(2, 2, "B"), row(1, 1, "A")]);
    assert_rules(&h, &s, &cfg(), &[]);
}

#[test]
fn c1_a_flagged_row_does_not_lower_the_mark() {
    // 2, then 1 (flagged), then 1 again: still below 2, flagged too.
    let (h, _) = clean();
    let s = state(vec![row(1, 2, "B"), row(2, 1, "A"), row(3, 1, "A")]);
    let v = check(&h, &s, &cfg());
    assert_eq!(v.iter().filter(|v| v.rule == "C1").count(), 2, "{v:#?}");
}

#[test]
fn c1_resources_are_independent() {
    let (h, _) = clean();
    let mut other = row(3, 1, "A");
    other.resource = "job:other".into();
    let mut s = state(vec![row(1, 1, "A"), row(2, 2, "B"), other]);
    s.counters.push(("job:other".into(), 1));
    s.counters[0].1 = 2;
    assert_rules(&h, &s, &cfg(), &[]);
}
