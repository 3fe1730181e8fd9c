//! Property tests of the pure parts: key rules, token encoding, backoff bounds and the
//! configuration rules.

use std::time::Duration;

use leasehold::{Backoff, Key, LeaseConfig, MAX_KEY_LEN, OwnerToken};
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

    #[test]
    fn a_valid_configuration_always_leaves_room_to_renew(
        ttl_ms in 0u64..(2 * 24 * 3600 * 1000),
        renew_ms in proptest::option::of(0u64..100_000),
        op_ms in proptest::option::of(0u64..100_000),
        drift in -0.1f64..0.6,
    ) {
        let mut b = LeaseConfig::builder(Duration::from_millis(ttl_ms)).drift_factor(drift);
        if let Some(r) = renew_ms {
            b = b.renew_interval(Duration::from_millis(r));
        }
        if let Some(o) = op_ms {
            b = b.op_timeout(Duration::from_millis(o));
        }
        if let Ok(c) = b.build() {
            let ttl = c.ttl();
            let spent = c.op_timeout() + c.renew_interval() + ttl.mul_f64(c.drift_factor()) + c.margin();
            prop_assert!(spent < ttl);
            prop_assert!(c.validity(ttl) < ttl);
            prop_assert!(c.validity(ttl) > c.renew_interval());
        }
    }
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
        use leasehold::memory::MemoryStore;
        use leasehold::{LeaseClient, OwnerToken, Store};
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
                Err(leasehold::Error::WaitTimeout { .. }) => {
                    prop_assert!(wait <= Duration::from_millis(250), "gave up within {wait:?}");
                }
                Err(e) => prop_assert!(false, "unexpected error {e}"),
            }
            Ok(())
        })?;
    }
}
