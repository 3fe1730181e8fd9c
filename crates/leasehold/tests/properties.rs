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
