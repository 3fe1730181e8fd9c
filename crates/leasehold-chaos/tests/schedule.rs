//! The fault schedule follows from the seed alone.

use std::collections::BTreeSet;
use std::time::Duration;

use leasehold_chaos::schedule::{FaultSet, HOLDER, NEXT_WRITER, PlanKind, plan, plan_kinds};

const TTL: Duration = Duration::from_secs(2);
const RUN: Duration = Duration::from_secs(20);

#[test]
fn the_same_seed_gives_the_same_schedule() {
    for seed in [0, 1, 11, 12, u64::MAX] {
        assert_eq!(
            plan(seed, FaultSet::All, 4, RUN, TTL),
            plan(seed, FaultSet::All, 4, RUN, TTL)
        );
    }
}

#[test]
fn different_seeds_give_different_schedules() {
    let schedules: BTreeSet<String> = (0..50)
        .map(|seed| format!("{:?}", plan(seed, FaultSet::All, 4, RUN, TTL)))
        .collect();
    assert_eq!(schedules.len(), 50);
}

#[test]
fn every_kind_is_planned_for_every_seed() {
    // 18 s: the bounded runs of `scripts/test`.
    for (seed, run) in (0..2000).flat_map(|s| [(s, RUN), (s, Duration::from_secs(18))]) {
        let p = plan(seed, FaultSet::All, 4, run, TTL);
        let kinds: BTreeSet<PlanKind> = p.iter().map(|f| f.kind).collect();
        assert!(kinds.contains(&PlanKind::StaleWrite), "seed {seed}: {p:?}");
        for k in PlanKind::RANDOM {
            assert!(kinds.contains(&k), "seed {seed}: {k:?} missing in {p:?}");
        }
    }
}

#[test]
fn planned_faults_fit_the_run_and_never_share_a_target() {
    let ttl = TTL.as_millis() as u64;
    for seed in 0..500 {
        let p = plan(seed, FaultSet::All, 4, RUN, TTL);
        assert!(
            p.windows(2).all(|w| w[0].offset_ms <= w[1].offset_ms),
            "{p:?}"
        );
        for f in &p {
            assert!(
                f.offset_ms < RUN.as_millis() as u64 - ttl,
                "seed {seed}: {f:?}"
            );
            match f.kind {
                PlanKind::StaleWrite => assert_eq!(f.target, NEXT_WRITER),
                PlanKind::RestartStore => assert_eq!(f.target, "store"),
                PlanKind::Kill9 => {
                    assert_eq!(f.target, HOLDER);
                    assert!(f.offset_ms + ttl * 5 / 2 <= RUN.as_millis() as u64, "{f:?}")
                }
                _ => assert!(f.target.starts_with('w') || f.target == HOLDER, "{f:?}"),
            }
        }
        // On one slot, or on the holder, a fault starts only after the previous one
        // ended plus TTL/2.
        for a in &p {
            for b in p
                .iter()
                .filter(|b| b.offset_ms > a.offset_ms && b.target == a.target)
            {
                if a.target.starts_with('w')
                    || (a.target == HOLDER
                        && a.kind != PlanKind::Kill9
                        && b.kind != PlanKind::Kill9)
                {
                    assert!(
                        b.offset_ms >= a.offset_ms + a.hold_ms + ttl / 2,
                        "seed {seed}: {a:?} {b:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn both_the_holder_and_fixed_slots_are_targets() {
    let targets: BTreeSet<String> = (0..20)
        .flat_map(|seed| plan(seed, FaultSet::All, 4, RUN, TTL))
        .filter(|f| f.kind == PlanKind::Sigstop || f.kind == PlanKind::ProxyBlackhole)
        .map(|f| {
            if f.target == HOLDER {
                f.target
            } else {
                "slot".into()
            }
        })
        .collect();
    assert_eq!(
        targets,
        BTreeSet::from([HOLDER.to_owned(), "slot".to_owned()])
    );
}

#[test]
fn control_and_fault_free_schedules() {
    let p = plan(3, FaultSet::StaleWrite, 4, RUN, TTL);
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].kind, PlanKind::StaleWrite);
    assert_eq!(p[0].offset_ms, 1000);
    assert!(plan(3, FaultSet::None, 4, RUN, TTL).is_empty());
}

#[test]
fn the_schedule_is_recorded_as_json() {
    let p = plan(7, FaultSet::All, 4, RUN, TTL);
    let text = serde_json::to_string(&p).unwrap();
    assert!(text.contains("\"kind\":\"stale-write\""), "{text}");
    let back: Vec<leasehold_chaos::schedule::PlannedFault> = serde_json::from_str(&text).unwrap();
    assert_eq!(back, p);
}

/// A store on which some kinds cannot fire (Sentinel: no proxy faults) gets a schedule
/// drawn from its kinds only, each of them planned; with every kind, `plan_kinds` is
/// `plan` (existing seeds keep their schedules).
#[test]
fn a_store_with_fewer_kinds_gets_only_those() {
    let kinds = [PlanKind::Sigstop, PlanKind::Kill9, PlanKind::RestartStore];
    for seed in 0..50 {
        assert_eq!(
            plan_kinds(seed, FaultSet::All, 4, RUN, TTL, &PlanKind::RANDOM),
            plan(seed, FaultSet::All, 4, RUN, TTL)
        );
        let p = plan_kinds(seed, FaultSet::All, 4, RUN, TTL, &kinds);
        let got: BTreeSet<PlanKind> = p.iter().map(|f| f.kind).collect();
        let want: BTreeSet<PlanKind> = kinds
            .iter()
            .copied()
            .chain([PlanKind::StaleWrite])
            .collect();
        assert_eq!(got, want, "seed {seed}: {p:?}");
    }
}
