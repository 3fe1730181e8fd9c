//! Clean histories pass, a stale write the guard rejects passes and one it accepts is
//! flagged, histories round-trip through JSON lines, and a violation names its rule.

use crate::history::*;
use leasehold_checker::{FaultKind, check};

#[test]
fn clean_history_passes() {
    let (h, s) = clean();
    assert_eq!(check(&h, &s, &cfg()), vec![]);
}

#[test]
fn stale_write_rejected_by_the_guard_passes() {
    let (h, s) = stale_write(false);
    assert_eq!(check(&h, &s, &cfg()), vec![]);
}

#[test]
fn stale_write_accepted_without_the_guard_is_c1_and_c5() {
    let (h, s) = stale_write(true);
    assert_rules(&h, &s, &cfg(), &["C1", "C5"]);
}

#[test]
fn history_round_trips_through_json_lines() {
    let (mut h, _) = clean();
    h.push(fault(9 * MS, "a#0", FaultKind::ProxyDropReplies));
    let text: String = h
        .iter()
        .map(|e| serde_json::to_string(e).unwrap() + "\n")
        .collect();
    assert_eq!(leasehold_checker::parse_lines(&text).unwrap(), h);
    assert!(text.contains("\"fault\":\"proxy-drop-replies\""));
    assert!(leasehold_checker::parse_lines("{not json}").is_err());
}

#[test]
fn violation_display_names_invariant_and_rule() {
    let (h, s) = stale_write(true);
    let v = check(&h, &s, &cfg());
    let shown: Vec<String> = v.iter().map(|v| v.to_string()).collect();
    assert!(
        shown.iter().any(|s| s.starts_with("C5 (C5): ")),
        "{shown:?}"
    );
}
