//! Property tests of the pure parts: key rules, token encoding, backoff bounds and the
//! configuration rules.

use std::time::Duration;

use leasehold_core::{Backoff, Key, LeaseConfig, MAX_KEY_LEN, OwnerToken};
use proptest::prelude::*;

proptest! {
    #[test]
    fn key_rules_hold_for_any_string(s in ".{0,600}") {
        let valid = !s.is_empty() && s.len() <= MAX_KEY_LEN && !s.chars().any(char::is_control);
        match Key::new(&s) {
            Ok(k) => {
                prop_assert!(valid);
                prop_assert_eq!(k.as_str(), s.as_str());
                let rt = k.resource_type();
                prop_assert!(!rt.contains(':'));
                let prefixed = s.starts_with(&format!("{}:", rt));
                prop_assert!(rt == "none" || prefixed);
            }
            Err(_) => prop_assert!(!valid),
        }
    }

    #[test]
    fn owner_tokens_round_trip(bytes in any::<[u8; 16]>()) {
        let t = OwnerToken::from_bytes(bytes);
        prop_assert_eq!(t.to_hex().parse::<OwnerToken>().unwrap(), t);
        prop_assert_eq!(t.to_hex().len(), 32);
    }

    #[test]
    fn backoff_delays_stay_under_a_growing_capped_ceiling(
        base_ms in 1u64..10_000,
        extra_ms in 0u64..100_000,
        attempt in 0u32..200,
        seed in any::<u64>(),
    ) {
        use rand::SeedableRng;
        let base = Duration::from_millis(base_ms);
        let cap = base + Duration::from_millis(extra_ms);
        let b = Backoff::new(base, cap).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        prop_assert!(b.delay(attempt, &mut rng) <= b.ceiling(attempt));
        prop_assert!(b.ceiling(attempt) <= cap);
        prop_assert!(b.ceiling(attempt) <= b.ceiling(attempt.saturating_add(1)));
        prop_assert!(b.ceiling(0) == base);
    }

    /// Any mix of values, valid or not: `build` accepts exactly the configurations the
    /// rules allow (an oracle, so a `build` that refused everything fails here), and what
    /// it accepts leaves room to renew.
    #[test]
    fn a_configuration_builds_exactly_when_it_leaves_room_to_renew(
        (ttl, renew, op, drift) in mixed_configuration(),
    ) {
        let built = build(ttl, renew, op, drift);
        prop_assert_eq!(built.is_ok(), allowed(ttl, renew, op, drift), "{:?}", built);
        if let Ok(c) = built {
            prop_assert!(leaves_room_to_renew(&c));
        }
    }

    /// Issue 24.2: a grant of any TTL, on any configuration that builds. A grant of the
    /// TTL asked or more always fits (and keeps the configured timings); a shorter grant
    /// gets the configured renew interval and operation timeout scaled by granted / asked
    /// (never longer than configured), and is accepted exactly when they leave room to
    /// renew it: then its first renewal comes before its deadline.
    #[test]
    fn a_grant_is_accepted_exactly_when_the_scaled_timings_fit(
        (ttl, renew, op, drift) in mixed_configuration(),
        share in 0.0f64..1.2,
        raw in any_duration(),
        pick_raw in any::<bool>(),
    ) {
        let Ok(c) = build(ttl, renew, op, drift) else { return Ok(()) };
        // A share of the TTL asked (most of the interesting cases), or any duration.
        let granted = if pick_raw { raw } else { c.ttl().mul_f64(share) };
        prop_assert!(c.check_grant(c.ttl()).is_ok());
        let g = granted.min(c.ttl());
        let (ri, ot) = (c.renew_interval_for(granted), c.op_timeout_for(granted));
        prop_assert!(ri <= c.renew_interval() && ot <= c.op_timeout());
        if granted >= c.ttl() {
            prop_assert_eq!((ri, ot), (c.renew_interval(), c.op_timeout()));
        }
        let fits = g >= leasehold_core::config::MIN_TTL
            && !ri.is_zero()
            && !ot.is_zero()
            && ot + ri + g.mul_f64(c.drift_factor()) + c.margin() < g;
        let checked = c.check_grant(granted);
        prop_assert_eq!(checked.is_ok(), fits, "{:?}", checked);
        if fits {
            prop_assert!(ri < c.validity(g), "renewal {:?} after the deadline {:?}", ri, c.validity(g));
        }
    }

    /// Configurations valid by construction (every value within its range, the budget
    /// split so that `op + renew + drift × ttl + margin < ttl`) always build.
    #[test]
    fn a_valid_configuration_always_builds_and_leaves_room_to_renew(
        ttl_ms in 10u64..=(24 * 3600 * 1000),
        drift in 0.0f64..0.45,
        renew_share in 0.01f64..0.6,
        op_share in 0.01f64..0.35,
        default_renew in any::<bool>(),
    ) {
        let ttl = Duration::from_millis(ttl_ms);
        let margin = Duration::from_millis(5).min(ttl / 20);
        // What is left once drift and margin are taken, with room for rounding.
        let budget = ttl.saturating_sub(ttl.mul_f64(drift)).saturating_sub(margin).mul_f64(0.98);
        let op = budget.mul_f64(op_share).max(Duration::from_nanos(1));
        let renew = if default_renew && ttl / 3 + op < budget {
            None
        } else {
            Some(budget.mul_f64(renew_share).max(Duration::from_nanos(1)))
        };
        let built = build(ttl, renew, Some(op), drift);
        prop_assert!(built.is_ok(), "refused: {:?}", built);
        prop_assert!(leaves_room_to_renew(&built.unwrap()));
    }
}

/// The arguments of the first property: TTLs from zero to two days (half of them above
/// the longest), optional renew intervals and timeouts up to 100 s, drift -0.1..0.6.
fn mixed_configuration()
-> impl Strategy<Value = (Duration, Option<Duration>, Option<Duration>, f64)> {
    (
        (0u64..(2 * 24 * 3600 * 1000)).prop_map(Duration::from_millis),
        proptest::option::of((0u64..100_000).prop_map(Duration::from_millis)),
        proptest::option::of((0u64..100_000).prop_map(Duration::from_millis)),
        -0.1f64..0.6,
    )
}

fn build(
    ttl: Duration,
    renew: Option<Duration>,
    op: Option<Duration>,
    drift: f64,
) -> Result<LeaseConfig, leasehold_core::ConfigError> {
    let mut b = LeaseConfig::builder(ttl).drift_factor(drift);
    if let Some(r) = renew {
        b = b.renew_interval(r);
    }
    if let Some(o) = op {
        b = b.op_timeout(o);
    }
    b.build()
}

/// The rules of `LeaseConfigBuilder::build` for these four settings, written out again.
fn allowed(ttl: Duration, renew: Option<Duration>, op: Option<Duration>, drift: f64) -> bool {
    use leasehold_core::config::{MAX_TTL, MIN_TTL};
    if !(MIN_TTL..=MAX_TTL).contains(&ttl) || !(0.0..0.5).contains(&drift) {
        return false;
    }
    let renew = renew.unwrap_or(ttl / 3);
    let op = op.unwrap_or_else(|| (ttl / 6).min(Duration::from_secs(5)));
    let margin = Duration::from_millis(5).min(ttl / 20);
    !renew.is_zero()
        && renew < ttl
        && !op.is_zero()
        && op + renew + ttl.mul_f64(drift) + margin < ttl
}

fn leaves_room_to_renew(c: &LeaseConfig) -> bool {
    let ttl = c.ttl();
    let spent = c.op_timeout() + c.renew_interval() + ttl.mul_f64(c.drift_factor()) + c.margin();
    spent < ttl && c.validity(ttl) < ttl && c.validity(ttl) > c.renew_interval()
}

/// The first property cannot pass on refusals alone: over a fixed sample of its inputs, a
/// good share builds and a good share is refused.
#[test]
fn the_mixed_configurations_are_neither_all_accepted_nor_all_refused() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::deterministic_rng(RngAlgorithm::ChaCha),
    );
    let strategy = mixed_configuration();
    let (mut accepted, total) = (0, 2000);
    for _ in 0..total {
        let (ttl, renew, op, drift) = strategy.new_tree(&mut runner).unwrap().current();
        if build(ttl, renew, op, drift).is_ok() {
            accepted += 1;
        }
    }
    assert!(
        (total / 10..=total * 9 / 10).contains(&accepted),
        "{accepted} of {total} built"
    );
}

/// Durations from zero to `Duration::MAX`, with the edges and powers of two weighted in.
fn any_duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::from_nanos(1)),
        Just(Duration::MAX),
        Just(Duration::from_secs(u64::MAX)),
        (0u32..64).prop_map(|p| Duration::from_secs(1u64 << p)),
        (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        (0u64..120_000).prop_map(Duration::from_millis),
    ]
}

fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Issue 10.4: no duration makes the library panic. A configuration either builds or
    /// is refused with an error; whatever builds can acquire, renew and release; any wait
    /// is accepted (`Duration::MAX` waits as long as it takes).
    #[test]
    fn no_duration_panics(
        ttl in any_duration(),
        renew in proptest::option::of(any_duration()),
        op in proptest::option::of(any_duration()),
        margin in proptest::option::of(any_duration()),
        max_hold in proptest::option::of(any_duration()),
        wait in any_duration(),
        base in any_duration(),
        cap in any_duration(),
    ) {
        use std::sync::Arc;
        use leasehold_core::memory::MemoryStore;
        use leasehold_core::{LeaseClient, OwnerToken, Store};
        use rand::SeedableRng;

        if let Ok(b) = Backoff::new(base, cap) {
            let mut rng = rand::rngs::StdRng::seed_from_u64(1);
            for attempt in [0, 1, 63, 64, u32::MAX] {
                prop_assert!(b.delay(attempt, &mut rng) <= b.ceiling(attempt));
            }
        }
        let mut b = LeaseConfig::builder(ttl).watchdog_thread(false);
        if let Some(d) = renew { b = b.renew_interval(d); }
        if let Some(d) = op { b = b.op_timeout(d); }
        if let Some(d) = margin { b = b.margin(d); }
        if let Some(d) = max_hold { b = b.max_hold(d); }
        // A configuration that is refused is fine; a panic is not.
        let cfg = b.build().or_else(|_| {
            let mut b = LeaseConfig::builder(Duration::from_secs(3)).watchdog_thread(false);
            if let Some(d) = max_hold.filter(|d| !d.is_zero()) { b = b.max_hold(d); }
            b.build()
        });
        let cfg = cfg.unwrap();
        paused_runtime().block_on(async move {
            let store = MemoryStore::new();
            let key = Key::new("job:durations").unwrap();
            // Another owner holds the key for 200 ms, never renewed.
            store.acquire(&key, &OwnerToken::random(), Duration::from_millis(200)).await.unwrap();
            let client = LeaseClient::new(Arc::new(store.clone()), cfg);
            match client.acquire(&key, wait).await {
                Ok(lease) => {
                    prop_assert!(wait >= Duration::from_millis(150), "acquired after waiting {wait:?}");
                    tokio::time::sleep(Duration::from_secs(10)).await;
                    let _ = lease.release().await;
                }
                Err(leasehold_core::Error::WaitTimeout { .. }) => {
                    prop_assert!(wait <= Duration::from_millis(250), "gave up within {wait:?}");
                }
                Err(e) => prop_assert!(false, "unexpected error {e}"),
            }
            Ok(())
        })?;
    }
}
