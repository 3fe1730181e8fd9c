//! Faults of the holder's own process and host, run on every store by
//! [`conformance_suite!`](crate::conformance_suite) (the store's server is not touched):
//!
//! - docs/faults.md row 1: the holder process frozen past its validity window;
//! - row 14: the holder's wall clock jumping;
//! - row 33: the holder's host suspended past its deadline.
//!
//! The first two need a holder process ([`Fixture::other_processes`]); on a store only this
//! process can open they check nothing (the in-memory store, which has no row). Each case
//! is tagged with the fault it injects ([`Fixture::proves`]).

use std::time::Duration;

use leasehold_core::clock::SUSPEND_CHECK;
use leasehold_core::{Error, Key, LostReason};
use leasehold_testkit::FakeWallClock;
use tokio::time::{Instant, sleep, timeout};

use crate::holder::{Holder, wall_secs};
use crate::proof::Fault;
use crate::{Fixture, OtherProcesses};

fn key(name: &str) -> Key {
    Key::new(format!("conformance:{name}")).expect("valid key")
}

/// The URL a holder process opens, or `None` (after checking the declaration) on a store
/// only this process can open.
fn holder_url(fx: &Fixture, case: &str) -> Option<String> {
    match &fx.processes {
        OtherProcesses::Url(url) => Some(url.clone()),
        OtherProcesses::ThisProcessOnly => None,
        OtherProcesses::Undeclared => panic!(
            "{case}: the fixture must declare whether another process can open its store \
             (Fixture::other_processes or Fixture::this_process_only)"
        ),
    }
}

/// docs/faults.md row 1: a holder process frozen (`SIGSTOP`) past its validity window.
///
/// While it is frozen, on a store that expires leases by itself (or ends an idle session
/// after the TTL) the lease is taken over after its TTL, never before, with a higher
/// fence; a session-bound store may keep the frozen holder's session, and so its lock,
/// until the holder acts (`GET_LOCK`). Asked while frozen,
/// its first answer after the resume (before anything else it does) is *lost*; it never
/// says *valid* again; its release leaves the new holder's lease intact; afterwards the
/// next grant's fence is higher than the frozen holder's.
pub async fn row_01_holder_frozen_past_its_deadline_hears_lost_first_on_resume(fx: &Fixture) {
    let _proof = fx.proves(Fault::ProcessPause);
    let Some(url) = holder_url(fx, "row 1") else {
        return;
    };
    let caps = fx.store.capabilities();
    let cfg = fx.config();
    let k = key("frozen-past-deadline");
    let holder = Holder::spawn(&url, &k, fx.ttl).await;
    let sent_after = holder.go();
    let (old_fence, old_owner) = holder.held().await;
    holder.pause();
    let paused_at = Instant::now();
    let contender = fx.client();
    // A store that expires leases by itself (or ends an idle session, as PostgreSQL's
    // advisory store does after the TTL) lets a contender in after the TTL, never before;
    // `GET_LOCK` keeps the frozen holder's session, and so its lock, until it acts.
    let wait = fx.ttl * 3 + Duration::from_secs(2);
    let taken = match contender.acquire(&k, wait).await {
        Ok(lease) => {
            let expires_at_least = sent_after + fx.ttl.mul_f64(1.0 - cfg.drift_factor());
            assert!(
                Instant::now() >= expires_at_least,
                "frozen past its deadline: taken over before its TTL ran out"
            );
            assert!(
                lease.fence() > old_fence,
                "frozen past its deadline: the next fence {} must be above the frozen \
                 holder's {old_fence}",
                lease.fence()
            );
            Some(lease)
        }
        Err(Error::WaitTimeout { .. }) if caps.session_bound => None,
        Err(e) => panic!(
            "frozen past its deadline: not taken over within {wait:?} of the freeze (TTL \
             {:?}): {e}",
            fx.ttl
        ),
    };
    // Past the frozen holder's deadline, whatever it renewed before the freeze: its last
    // renewal was sent before the freeze, so its deadline is at most a window after it.
    let past = paused_at + cfg.validity(fx.ttl) + fx.ttl / 5;
    tokio::time::sleep_until(past.max(Instant::now())).await;
    holder.ask();
    let lines_before = holder.lines().len();
    holder.resume();
    let first = holder.probe(Duration::from_secs(30)).await;
    let after: Vec<String> = holder.lines().into_iter().skip(lines_before).collect();
    assert!(
        after.first().is_some_and(|l| l.starts_with("PROBE ")),
        "frozen past its deadline: the holder's first act on resume must be the question: \
         {after:?}"
    );
    assert!(
        !first.valid && first.lost != "None",
        "frozen past its deadline: its first answer after the resume must be lost, got \
         {first:?}"
    );
    let (status, released, lines) = holder.finish().await;
    assert!(
        status.first().is_some_and(|s| s == "valid=false"),
        "frozen past its deadline: it must never be valid again: {status:?}"
    );
    assert!(
        lines
            .iter()
            .filter_map(|l| l.strip_prefix("PROBE "))
            .all(|p| p.starts_with("valid=false")),
        "frozen past its deadline: a probe said valid after the resume: {lines:?}"
    );
    match taken {
        Some(lease) => {
            assert_eq!(
                released, "false",
                "frozen past its deadline: the frozen holder's release must say it no longer \
                 held the lease"
            );
            assert!(
                lease.is_valid(),
                "frozen past its deadline: the old holder's release ended the new lease"
            );
            let info = fx.store.inspect(&k).await.expect("inspect");
            assert_eq!(
                info.map(|i| (i.owner, i.fence)),
                Some((*lease.owner(), lease.fence())),
                "frozen past its deadline: the new holder's lease must be intact"
            );
            assert!(lease.release().await.expect("release"));
        }
        None => {
            // The session-bound store's lock is free once the frozen holder let go.
            let lease = contender
                .acquire(&k, fx.ttl * 3 + Duration::from_secs(2))
                .await
                .expect("frozen past its deadline: free once its holder let go");
            assert!(
                lease.fence() > old_fence,
                "frozen past its deadline: the next fence {} must be above {old_fence}",
                lease.fence()
            );
            assert_ne!(*lease.owner(), old_owner);
            assert!(lease.release().await.expect("release"));
        }
    }
}

/// docs/faults.md row 14: the holder's wall clock jumps an hour forward, an hour back, a
/// month forward and back to true, in its own process (libfaketime, only
/// `CLOCK_REALTIME` faked). Nothing changes: each jump reaches the holder (its probe shows
/// its wall clock), its lease stays valid, a contender is refused for two TTLs after each
/// jump, the store shows the same owner and fence throughout, the holder never hears
/// lost and still holds the lease at its release; the next fence is higher.
pub async fn row_14_holder_wall_clock_jumps_change_nothing(fx: &Fixture) {
    let _proof = fx.proves(Fault::ClockJump);
    let Some(url) = holder_url(fx, "row 14") else {
        return;
    };
    let k = key("wall-clock-jump");
    let clock = FakeWallClock::new();
    let holder = Holder::spawn_with(&url, &k, fx.ttl, |cmd| clock.apply(cmd)).await;
    holder.go();
    let (fence, owner) = holder.held().await;
    let contender = fx.client();
    let mut refused = 0;
    for (offset, secs) in [
        ("+1h", 3600),
        ("-1h", -3600),
        ("+30d", 30 * 86_400),
        ("+0", 0),
    ] {
        clock.set(offset);
        let seen = Instant::now();
        loop {
            let p = holder.probe(Duration::from_secs(30)).await;
            assert!(
                p.valid && p.lost == "None",
                "wall clock {offset}: the holder's lease is not valid: {p:?}"
            );
            if (p.wall - wall_secs() - secs).abs() < 60 {
                break;
            }
            assert!(
                seen.elapsed() < FakeWallClock::PICKUP * 10,
                "wall clock {offset}: the jump never reached the holder: {p:?}"
            );
            sleep(Duration::from_millis(100)).await;
        }
        let until = Instant::now() + fx.ttl * 2;
        while Instant::now() < until {
            match contender.try_acquire(&k).await {
                Err(Error::Contended { .. }) => refused += 1,
                Ok(lease) => panic!(
                    "wall clock {offset}: a contender got the lease after the holder's jump \
                     (fence {} after {fence})",
                    lease.fence()
                ),
                Err(e) => panic!("wall clock {offset}: try_acquire failed: {e}"),
            }
            let info = fx.store.inspect(&k).await.expect("inspect");
            assert_eq!(
                info.map(|i| (i.owner, i.fence)),
                Some((owner, fence)),
                "wall clock {offset}: the store must show the same holder and fence"
            );
            sleep(fx.ttl / 10).await;
        }
    }
    assert!(refused >= 20, "the contender asked only {refused} times");
    let (status, released, lines) = holder.finish().await;
    assert!(
        !lines.iter().any(|l| l.starts_with("LOST")),
        "wall clock: the holder heard lost: {lines:?}"
    );
    assert_eq!(status, ["valid=true", "lost=None"], "wall clock: {lines:?}");
    assert_eq!(
        released, "true",
        "wall clock: the lease was gone at its release"
    );
    let next = contender
        .acquire(&k, fx.ttl * 3)
        .await
        .expect("wall clock: free after the release");
    assert!(
        next.fence() > fence,
        "wall clock: the next fence must be higher"
    );
    assert!(next.release().await.expect("release"));
}

/// docs/faults.md row 33: the holder's host is suspended past its deadline, injected where
/// the process reads `CLOCK_BOOTTIME` ([`crate::suspend_host`]): the clock a lease is timed
/// on moves on while `CLOCK_MONOTONIC`, and every timer, stand still, as after a real
/// resume. The holder is this process, on the real clock ([`SystemClock`]).
///
/// Nothing tells the library: its background tasks notice within [`SUSPEND_CHECK`] and
/// fire the lost signal (`Expired`); every question says lost; nothing is renewed after
/// the suspend: a store that expires leases by itself lets a contender in once the TTL of
/// the last renewal before the suspend has run out (a store on this host's boot clock —
/// SQLite — at once), with a higher fence, while the lost holder still has its handle; a
/// session-bound store keeps the lock until the holder lets go.
///
/// [`SystemClock`]: leasehold_core::clock::SystemClock
pub async fn row_33_host_suspend_past_the_deadline_loses_the_lease(fx: &Fixture) {
    let _proof = fx.proves(Fault::HostSuspend);
    let caps = fx.store.capabilities();
    let cfg = fx.config();
    let client = fx.client();
    let k = key("host-suspend");
    let lease = client.try_acquire(&k).await.expect("setup: acquire");
    sleep(cfg.renew_interval() * 3 / 2).await; // at least one renewal
    assert!(lease.is_valid(), "setup: valid before the suspend");
    let token = lease.lost_token();
    crate::suspend_host(fx.ttl * 2);
    let suspended_at = Instant::now();
    timeout(
        SUSPEND_CHECK + Duration::from_millis(500),
        token.cancelled(),
    )
    .await
    .unwrap_or_else(|_| {
        panic!(
            "host suspend: the lost signal did not fire within {SUSPEND_CHECK:?} (and a \
                 margin) of the resume"
        )
    });
    assert!(!lease.is_valid(), "host suspend: valid after the suspend");
    assert!(lease.remaining().is_zero(), "host suspend: time left");
    assert_eq!(
        lease.lost_reason(),
        Some(LostReason::Expired),
        "host suspend: lost for the wrong reason"
    );
    let old = lease.fence();
    if caps.session_bound {
        let info = fx.store.inspect(&k).await.expect("inspect");
        assert_eq!(
            info.map(|i| i.owner),
            Some(*lease.owner()),
            "host suspend: a session-bound store keeps the lost holder's lock until it lets go"
        );
        let _ = lease.release().await;
    } else {
        // No renewal after the suspend: the lease runs out on the store by itself, a TTL
        // after the last renewal sent before it (this host's boot clock jumped with it on
        // SQLite: at once).
        let wait = fx.ttl * 2 + Duration::from_secs(2);
        let next = client.acquire(&k, wait).await.unwrap_or_else(|e| {
            panic!(
                "host suspend: not taken over within {wait:?}: the lost holder renewed, or the \
                 store ignores expiry: {e}"
            )
        });
        assert!(
            suspended_at.elapsed() <= fx.ttl + Duration::from_secs(2),
            "host suspend: taken over {:?} after the suspend: the lease was renewed after it",
            suspended_at.elapsed()
        );
        assert!(
            next.fence() > old,
            "host suspend: the next fence {} must be above {old}",
            next.fence()
        );
        assert!(
            !lease.release().await.expect("release"),
            "host suspend: the lost holder's release must not end the new lease"
        );
        assert!(next.release().await.expect("release"));
        return;
    }
    let next = client
        .acquire(&k, fx.ttl * 3)
        .await
        .expect("host suspend: free once the lost holder let go");
    assert!(
        next.fence() > old,
        "host suspend: the next fence must be higher"
    );
    assert!(next.release().await.expect("release"));
}
