//! C2: a fence of a key belongs to one owner, as acquire replies, the store's inspections,
//! the audit and the workers saw it (exempt on a lossy store).

use crate::history::*;
use leasehold_checker::CheckConfig;

#[test]
fn c2_one_fence_granted_to_two_owners() {
    let (mut h, _) = clean();
    for e in &mut h {
        if e.owner == "B" && e.fence == Some(2) {
            e.fence = Some(1);
        }
    }
    let s = state(vec![row(1, 1, "A"), row(2, 1, "B")]);
    assert_eq!(found(&h, &s, &cfg()), vec!["C2"]);
}

#[test]
fn c2_the_store_recorded_a_fence_for_another_owner() {
    let (mut h, s) = clean();
    h.push(inspect(450 * MS, "X", Some(2), ""));
    assert_rules(&h, &s, &cfg(), &["C2"]);
}

#[test]
fn c2_the_audit_recorded_a_fence_for_another_owner() {
    let (h, _) = clean();
    let s = state(vec![row(1, 1, "A"), row(2, 2, "B"), row(3, 2, "X")]);
    assert_rules(&h, &s, &cfg(), &["C2"]);
}

#[test]
fn c2_and_c3_exempt_on_a_lossy_store_but_c1_is_not() {
    // B is granted A's fence while A holds; an unknown owner's lower fence lands last.
    let mut h = two_holders(400 * MS, 100 * MS);
    for e in &mut h {
        if e.fence.is_some() {
            e.fence = Some(2);
        }
    }
    let s = state(vec![row(1, 2, "B"), row(2, 1, "X")]);
    assert_rules(&h, &s, &cfg(), &["C1", "C2", "C3"]);
    let lossy = CheckConfig {
        lossy_store: true,
        ..cfg()
    };
    assert_rules(&h, &s, &lossy, &["C1"]);
}
