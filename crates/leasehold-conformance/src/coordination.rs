//! Cases for what is built on the lease: the fenced records of [`Store::put_record`](leasehold_core::Store::put_record),
//! leader election and semaphores (issue 17). Part of [`CASES`](crate::CASES): every
//! backend runs them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_core::{
    AcquireAnyOutcome, AcquireOutcome, CheckedAcquire, Error, Fence, Key, MAX_RECORD_LEN,
    OwnerToken, Record, RecordCheck,
};
use tokio::time::Instant;

use crate::Fixture;
use crate::watching::{granted, noticed};

fn key(name: &str) -> Key {
    Key::new(format!("conformance:{name}")).expect("valid key")
}

/// `put_record` writes only with a higher fence (or when absent), returns what is stored,
/// and keeps records apart from leases.
pub async fn records_are_fenced_writes(fx: &Fixture) {
    let store = &fx.store;
    let k = key(&format!("record-{}", OwnerToken::random()));
    let get = || async { store.get_record(&k).await.expect("get_record") };
    let k2 = &k;
    let put = |fence: u64, value: &'static [u8]| async move {
        store
            .put_record(k2, Fence(fence), value)
            .await
            .expect("put_record")
    };
    let rec = |fence: u64, value: &[u8]| Record {
        fence: Fence(fence),
        value: value.to_vec(),
    };
    assert_eq!(get().await, None, "a record nobody wrote is absent");
    // Set-if-absent with fence 0, as a semaphore stores its permit count.
    assert_eq!(put(0, b"3").await, rec(0, b"3"), "absent: written");
    assert_eq!(
        put(0, b"4").await,
        rec(0, b"3"),
        "same fence: kept, not overwritten"
    );
    assert_eq!(
        put(7, b"seven").await,
        rec(7, b"seven"),
        "higher fence: written"
    );
    assert_eq!(
        put(5, b"five").await,
        rec(7, b"seven"),
        "lower fence: refused"
    );
    assert_eq!(
        put(7, b"again").await,
        rec(7, b"seven"),
        "equal fence: refused"
    );
    assert_eq!(
        get().await,
        Some(rec(7, b"seven")),
        "get returns the stored record"
    );
    // The largest fence and a value of any bytes (not UTF-8, with NUL) up to the limit.
    let big: Vec<u8> = (0..MAX_RECORD_LEN).map(|i| (i % 256) as u8).collect();
    let stored = store
        .put_record(&k, Fence(u64::MAX >> 1), &big)
        .await
        .expect("put_record of MAX_RECORD_LEN bytes");
    assert_eq!(
        stored,
        Record {
            fence: Fence(u64::MAX >> 1),
            value: big.clone()
        },
        "big value"
    );
    assert_eq!(
        store
            .get_record(&k)
            .await
            .expect("get_record")
            .map(|r| r.value),
        Some(big),
        "a value is stored byte for byte"
    );
    // An empty value is a value.
    let e = key(&format!("record-empty-{}", OwnerToken::random()));
    let stored = store
        .put_record(&e, Fence(1), b"")
        .await
        .expect("put empty");
    assert_eq!(stored, rec(1, b""), "empty value");
    // Records and leases are separate: a lease on the record's key sees no lease there.
    assert_eq!(
        store.inspect(&k).await.expect("inspect"),
        None,
        "a record is not a lease"
    );
}

/// Awaits every contender; if any failed, panics with every distinct failure (the first
/// to be joined need not be the first to have failed).
async fn join_contenders(tasks: Vec<tokio::task::JoinHandle<()>>) {
    let mut failures = Vec::new();
    for t in tasks {
        if let Err(e) = t.await {
            let msg = match e.try_into_panic() {
                Ok(p) => p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "a panic".into()),
                Err(e) => e.to_string(),
            };
            if !failures.contains(&msg) {
                failures.push(msg);
            }
        }
    }
    assert!(
        failures.is_empty(),
        "contenders failed: {}",
        failures.join(" | ")
    );
}

/// One holder counted in `count` until dropped (also when its task panics, so one failed
/// assertion does not show as a second holder in the tasks after it).
struct Inside<'a>(&'a AtomicUsize);

impl<'a> Inside<'a> {
    /// Counts one more holder; returns how many there were before.
    fn enter(count: &'a AtomicUsize) -> (usize, Self) {
        (count.fetch_add(1, Ordering::SeqCst), Self(count))
    }
}

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// 32 contenders campaign at once: never two leaders at a time (checked while each one
/// leads, not only at the end), each leader reads itself as the leader with its value,
/// and terms rise in the order leaders were elected.
///
/// "At a time" is what the holders *believe*: when one is elected, every earlier leader
/// whose task has not yet stepped down must already have stopped believing it leads (its
/// validity deadline comes before the store's expiry, so it has passed by the time the
/// store could grant the next term). Counting tasks instead would take a leader whose
/// lease ran out under load — before its task got to its next line — for a second leader.
pub async fn one_leader_at_a_time_and_terms_rise(fx: &Fixture) {
    let name = format!("election-{}", OwnerToken::random());
    let client = fx.client();
    let election = client.election(key(&name)).expect("valid election name");
    // The leaders whose tasks have not stepped down yet (weak: a task that panicked drops
    // its leadership, whose lease then ends, instead of leaving it held by this list).
    let leading: Arc<Mutex<Vec<std::sync::Weak<leasehold_core::Leadership>>>> = Arc::default();
    let terms = Arc::new(Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let (election, leading, terms) = (election.clone(), leading.clone(), terms.clone());
            tokio::spawn(async move {
                let value = format!("contender-{i}");
                let me = Arc::new(
                    election
                        .campaign(value.clone(), Duration::from_secs(240))
                        .await
                        .unwrap_or_else(|e| panic!("campaign {i}: {e}")),
                );
                {
                    let mut inside = leading.lock().unwrap_or_else(|e| e.into_inner());
                    for other in inside.iter().filter_map(std::sync::Weak::upgrade) {
                        assert!(
                            !other.is_leader(),
                            "two leaders at once: term {} still leads while term {} was elected",
                            other.term(),
                            me.term()
                        );
                    }
                    inside.push(Arc::downgrade(&me));
                }
                terms.lock().unwrap().push(me.term());
                let seen = election.leader().await.expect("leader()");
                let seen = seen.expect("a leader is seen while one leads");
                // Read while it led: a leader whose lease ran out meanwhile may see the next.
                if me.is_leader() {
                    assert_eq!(
                        (seen.term, seen.value),
                        (me.term(), Some(value.into_bytes())),
                        "leader() reads the current leader's term and value"
                    );
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
                leading.lock().unwrap().retain(|l| {
                    l.strong_count() > 0 && !std::ptr::eq(l.as_ptr(), Arc::as_ptr(&me))
                });
                let me = Arc::try_unwrap(me).unwrap_or_else(|_| panic!("one handle left"));
                // A release lost to a timeout under load leaves the lease to expire.
                match me.resign().await {
                    Ok(released) => assert!(released, "resign releases the lease"),
                    Err(e) if e.is_retryable() => {}
                    Err(e) => panic!("resign: {e}"),
                }
            })
        })
        .collect();
    join_contenders(tasks).await;
    let terms = terms.lock().unwrap().clone();
    assert_eq!(terms.len(), 32);
    assert!(
        terms.windows(2).all(|w| w[0] < w[1]),
        "terms must rise with every leader: {terms:?}"
    );
    assert_eq!(
        election.leader().await.expect("leader()"),
        None,
        "nobody leads at the end"
    );
}

/// 32 contenders on a semaphore of 3 permits: never more than 3 holders at once and never
/// two on one slot (checked while each holds), fences per slot rise, and a caller asking
/// for another number of permits is refused.
pub async fn semaphore_admits_at_most_n_holders(fx: &Fixture) {
    const N: u32 = 3;
    let name = format!("semaphore-{}", OwnerToken::random());
    let client = fx.client();
    let sem = client.semaphore(key(&name), N).expect("valid semaphore");
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let per_slot: Arc<Vec<AtomicUsize>> = Arc::new((0..N).map(|_| AtomicUsize::new(0)).collect());
    let fences = Arc::new(Mutex::new(vec![Vec::new(); N as usize]));
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let (sem, inside, most, per_slot, fences) = (
                sem.clone(),
                inside.clone(),
                most.clone(),
                per_slot.clone(),
                fences.clone(),
            );
            tokio::spawn(async move {
                let p = sem
                    .acquire(Duration::from_secs(240))
                    .await
                    .unwrap_or_else(|e| panic!("permit {i}: {e}"));
                let slot = p.slot() as usize;
                let (on_slot, _slot) = Inside::enter(&per_slot[slot]);
                assert_eq!(on_slot, 0, "two holders on slot {slot} at once");
                let (others, _inside) = Inside::enter(&inside);
                let now = others + 1;
                most.fetch_max(now, Ordering::SeqCst);
                assert!(now <= N as usize, "{now} holders of a semaphore of {N}");
                fences.lock().unwrap()[slot].push(p.fence());
                // Longer than a read-then-write race window of a few tens of milliseconds.
                tokio::time::sleep(Duration::from_millis(30)).await;
                assert!(p.lease().is_valid(), "permit lost while held");
                drop((_inside, _slot));
                // A release lost to a timeout under load leaves the lease to expire.
                match p.release().await {
                    Ok(released) => assert!(released, "release frees the slot"),
                    Err(e) if e.is_retryable() => {}
                    Err(e) => panic!("release: {e}"),
                }
            })
        })
        .collect();
    join_contenders(tasks).await;
    assert!(
        most.load(Ordering::SeqCst) >= 2,
        "contenders never overlapped"
    );
    for (slot, f) in fences.lock().unwrap().iter().enumerate() {
        assert!(
            f.windows(2).all(|w| w[0] < w[1]),
            "fences of slot {slot} must rise: {f:?}"
        );
    }
    let err = client
        .semaphore(key(&name), N + 1)
        .expect("valid semaphore")
        .try_acquire()
        .await
        .expect_err("another number of permits must be refused");
    assert!(
        matches!(err, Error::PermitsMismatch { stored: N, .. }),
        "another N: {err}"
    );
    assert!(sem.holders().await.expect("holders").is_empty());
}

/// A holder that stops without giving its permit back (abandoned: not renewed, not
/// released, as a crashed process) blocks its slot until the lease's TTL has run out,
/// never before; then the permit is taken again with a higher fence.
pub async fn lost_permit_returns_after_its_ttl_only(fx: &Fixture) {
    let name = format!("permit-{}", OwnerToken::random());
    let cfg = fx.config();
    let client = fx.client();
    let sem = client.semaphore(key(&name), 1).expect("valid semaphore");
    let sent = Instant::now();
    let p = sem.try_acquire().await.expect("the free permit");
    let fence = p.fence();
    p.into_lease().abandon();
    match sem.try_acquire().await {
        Err(Error::WaitTimeout { .. }) => {}
        Ok(p) => panic!(
            "an abandoned permit was granted again at once (fence {})",
            p.fence()
        ),
        Err(e) => panic!("try_acquire of a held permit: {e}"),
    }
    let again = sem
        .acquire(fx.ttl * 3 + Duration::from_secs(2))
        .await
        .unwrap_or_else(|e| panic!("the abandoned permit never came back: {e}"));
    let taken = Instant::now();
    let earliest = sent + fx.ttl.mul_f64(1.0 - cfg.drift_factor());
    assert!(
        taken >= earliest,
        "the abandoned permit came back {:?} before its TTL ran out",
        earliest - taken
    );
    assert!(
        again.fence() > fence,
        "the next fence of the slot must be higher"
    );
    assert!(again.release().await.expect("release"));
}

/// Six writers race on one record, each with 25 fences interleaved with the others' (1..=150
/// in all), half of them going up and half down: every write is answered with a record at least as
/// high as its own fence, whose value is the one written with that fence (fence and value
/// are kept together), and the highest fence is what stays.
pub async fn racing_record_writes_keep_the_highest_fence(fx: &Fixture) {
    let k = key(&format!("record-race-{}", OwnerToken::random()));
    let tasks: Vec<_> = (0..6u64)
        .map(|w| {
            let (store, k) = (fx.store.clone(), k.clone());
            tokio::spawn(async move {
                for i in 0..25u64 {
                    // Odd writers go down, so lower fences keep arriving after higher ones.
                    let step = if w % 2 == 1 { 24 - i } else { i };
                    let fence = 1 + step * 6 + (w * 7 + step * 5) % 6;
                    let value = fence.to_string();
                    // A store that gives up under contention (`Busy`) is asked again.
                    let got = loop {
                        match store.put_record(&k, Fence(fence), value.as_bytes()).await {
                            Ok(r) => break r,
                            Err(e) if e.is_retryable() => {
                                tokio::time::sleep(Duration::from_millis(5)).await;
                            }
                            Err(e) => panic!("put_record {fence}: {e}"),
                        }
                    };
                    assert!(
                        got.fence >= Fence(fence),
                        "a racing write was answered with a lower record: {got:?} for fence {fence}"
                    );
                    assert_eq!(
                        got.value,
                        got.fence.get().to_string().into_bytes(),
                        "a record's value is not the one written with its fence"
                    );
                }
            })
        })
        .collect();
    join_contenders(tasks).await;
    let last = fx.store.get_record(&k).await.expect("get_record");
    assert_eq!(
        last.map(|r| r.fence),
        Some(Fence(150)),
        "the highest fence of racing writes must be what stays"
    );
}

/// The store's watcher ([`WatchStore::watch`](leasehold_core::WatchStore::watch)) notices
/// a grant, a release, a break and a record write, each within
/// [`NOTICE_WITHIN`](crate::watching::NOTICE_WITHIN), and a watcher joins no queue: the
/// lease released while it watches goes to whoever acquires next. A store without a
/// watcher has nothing to check here (`capabilities_are_honest` checks that its fixture
/// expects none).
pub async fn watch_notices_grants_releases_and_record_writes(fx: &Fixture) {
    let store = &fx.store;
    let k = key(&format!("watch-{}", OwnerToken::random()));
    let Some(watcher) = store.watcher() else {
        return;
    };
    let mut changes = watcher.watch(&k).await.expect("watch");
    let (a, b) = (OwnerToken::random(), OwnerToken::random());
    let ttl = fx.ttl * 20;
    granted(store.as_ref(), &k, &a, ttl).await;
    noticed(&mut changes, "a grant").await;
    store.release(&k, &a).await.expect("release");
    noticed(&mut changes, "a release").await;
    // The watcher is in no queue: the released lease goes to the next caller at once.
    granted(store.as_ref(), &k, &b, ttl).await;
    noticed(&mut changes, "the next grant").await;
    store
        .put_record(&k, Fence(1), b"leader")
        .await
        .expect("put_record");
    noticed(&mut changes, "a record write").await;
    store.break_lease(&k).await.expect("break");
    noticed(&mut changes, "a break").await;
}

/// [`acquire_any`](leasehold_core::acquire_any) (the store's batch, or the one-by-one
/// default on a store without one), as a semaphore takes a permit: it grants the first free key in the order given and never a key another owner
/// holds; it returns the key the owner holds already (same fence) rather than a free one
/// before it, so the owner holds one key at most; with every key held it answers `Held`
/// with the shortest remaining TTL (when the store reports one); each key's fence rises
/// with every grant; and contenders racing over the same keys get one key each.
pub async fn acquire_any_takes_the_owners_key_or_the_first_free_one(fx: &Fixture) {
    let store = &fx.store;
    let name = format!("any-{}", OwnerToken::random());
    let keys: Vec<Key> = (0..4).map(|i| key(&format!("{name}#{i}"))).collect();
    let ttl = fx.ttl;
    let (me, other) = (OwnerToken::random(), OwnerToken::random());
    let acquire = |k: usize, owner: OwnerToken| {
        let k = keys[k].clone();
        async move {
            match store.acquire(&k, &owner, ttl).await.expect("acquire") {
                AcquireOutcome::Acquired { fence, .. } => fence,
                held => panic!("setup: {k} is not free: {held:?}"),
            }
        }
    };
    let holder = |k: usize| {
        let k = keys[k].clone();
        async move { store.inspect(&k).await.expect("inspect").map(|i| i.owner) }
    };
    let other_fence = acquire(0, other).await;
    let got = leasehold_core::acquire_any(&**store, &keys, &me, ttl)
        .await
        .expect("acquire_any");
    let AcquireAnyOutcome::Acquired { index, fence, .. } = got else {
        panic!("acquire_any with free keys answered {got:?}");
    };
    assert_eq!(
        index, 1,
        "acquire_any must grant the first free key in order (key 0 is held)"
    );
    assert_eq!(
        holder(0).await,
        Some(other),
        "acquire_any took a key another owner holds"
    );
    assert_eq!(holder(1).await, Some(me));
    assert_eq!((holder(2).await, holder(3).await), (None, None));
    // Key 0 is free again; the owner's key 1 comes before it.
    store.release(&keys[0], &other).await.expect("release");
    let again = leasehold_core::acquire_any(&**store, &keys, &me, ttl)
        .await
        .expect("acquire_any");
    assert!(
        matches!(again, AcquireAnyOutcome::Acquired { index: 1, fence: f, .. } if f == fence),
        "acquire_any must return the key the owner holds, with its fence: {again:?} (held: key 1, fence {fence})"
    );
    assert_eq!(
        holder(0).await,
        None,
        "acquire_any left the owner holding two keys"
    );
    // Every key held: `Held`, with the shortest remaining TTL when reported.
    let newer = acquire(0, other).await;
    assert!(newer > other_fence, "the fence of key 0 must rise");
    acquire(2, other).await;
    let short = OwnerToken::random();
    match store
        .acquire(&keys[3], &short, ttl / 2)
        .await
        .expect("acquire")
    {
        AcquireOutcome::Acquired { .. } => {}
        held => panic!("setup: key 3 is not free: {held:?}"),
    }
    let third = OwnerToken::random();
    match leasehold_core::acquire_any(&**store, &keys, &third, ttl)
        .await
        .expect("acquire_any")
    {
        AcquireAnyOutcome::Held { remaining } => {
            if store.capabilities().reports_remaining {
                let r = remaining.expect("the store claims to report the remaining TTL");
                assert!(
                    r <= ttl / 2,
                    "acquire_any must report the shortest remaining TTL: {r:?} > {:?}",
                    ttl / 2
                );
            }
        }
        granted => panic!("acquire_any took a key another owner holds: {granted:?}"),
    }
    // The owner's key freed: taken again with a higher fence.
    store.release(&keys[1], &me).await.expect("release");
    match leasehold_core::acquire_any(&**store, &keys, &third, ttl)
        .await
        .expect("acquire_any")
    {
        AcquireAnyOutcome::Acquired {
            index: 1, fence: f, ..
        } => assert!(
            f > fence,
            "the fence of a key granted by acquire_any must rise: {f} after {fence}"
        ),
        got => panic!("the one free key must be granted: {got:?}"),
    }
    for (k, owner) in [(0, other), (1, third), (2, other), (3, short)] {
        let _ = store.release(&keys[k], &owner).await;
    }
    // Eight contenders race over three free keys: one key each, at most three granted.
    let race: Vec<Key> = (0..3).map(|i| key(&format!("{name}-race#{i}"))).collect();
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (store, race) = (store.clone(), race.clone());
            tokio::spawn(async move {
                let owner = OwnerToken::random();
                loop {
                    match leasehold_core::acquire_any(&*store, &race, &owner, ttl).await {
                        Ok(AcquireAnyOutcome::Acquired { index, .. }) => {
                            return Some((index, owner));
                        }
                        Ok(_) => return None,
                        // A store that gives up under contention (`Busy`) is asked again.
                        Err(e) if e.is_retryable() && !e.is_ambiguous() => {
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        Err(e) => panic!("acquire_any: {e}"),
                    }
                }
            })
        })
        .collect();
    let mut granted = Vec::new();
    for t in tasks {
        if let Some(g) = t.await.expect("contender") {
            granted.push(g);
        }
    }
    let mut indexes: Vec<usize> = granted.iter().map(|(i, _)| *i).collect();
    indexes.sort_unstable();
    indexes.dedup();
    assert_eq!(
        indexes.len(),
        granted.len(),
        "two owners were granted one key at once by acquire_any: {granted:?}"
    );
    assert_eq!(
        granted.len(),
        3,
        "three free keys, three grants: {granted:?}"
    );
    for (i, owner) in granted {
        assert_eq!(
            store
                .inspect(&race[i])
                .await
                .expect("inspect")
                .map(|l| l.owner),
            Some(owner),
            "two owners were granted one key at once by acquire_any"
        );
        let _ = store.release(&race[i], &owner).await;
    }
}

/// [`acquire_any_checked`](leasehold_core::acquire_any_checked) (the store's batch, or the
/// two-call default on a store without one), as a semaphore takes a permit behind its
/// number of permits: an absent record is written (at fence 0) and the acquire goes ahead;
/// a record holding the value lets it go ahead; a record holding another value refuses the
/// call, which answers the stored record, takes no key and leaves the record as it was.
pub async fn acquire_any_checked_takes_nothing_behind_another_value(fx: &Fixture) {
    let store = &fx.store;
    let ttl = fx.ttl;
    let name = format!("checked-{}", OwnerToken::random());
    let keys: Vec<Key> = (0..3).map(|i| key(&format!("{name}#{i}"))).collect();
    let record = key(&format!("semaphore/{name}"));
    let check = RecordCheck {
        key: &record,
        value: b"3",
    };
    let me = OwnerToken::random();
    let fence = match leasehold_core::acquire_any_checked(&**store, &keys, &me, ttl, check)
        .await
        .expect("acquire_any_checked")
    {
        CheckedAcquire::Passed(AcquireAnyOutcome::Acquired {
            index: 0, fence, ..
        }) => fence,
        got => panic!("acquire_any_checked with no record must write it and acquire: {got:?}"),
    };
    let stored = |what: &'static str| {
        let record = record.clone();
        async move {
            let r = store.get_record(&record).await.expect("get_record");
            assert_eq!(
                r.map(|r| (r.fence, r.value)),
                Some((Fence(0), b"3".to_vec())),
                "{what}"
            );
        }
    };
    stored("acquire_any_checked must write an absent record at fence 0").await;
    match leasehold_core::acquire_any_checked(&**store, &keys, &me, ttl, check)
        .await
        .expect("acquire_any_checked")
    {
        CheckedAcquire::Passed(AcquireAnyOutcome::Acquired {
            index: 0, fence: f, ..
        }) if f == fence => {}
        got => panic!(
            "acquire_any_checked behind the same value must answer as acquire_any (the owner's key, fence {fence}): {got:?}"
        ),
    }
    let other = OwnerToken::random();
    let wrong = RecordCheck {
        key: &record,
        value: b"4",
    };
    match leasehold_core::acquire_any_checked(&**store, &keys, &other, ttl, wrong)
        .await
        .expect("acquire_any_checked")
    {
        CheckedAcquire::Refused(r) => assert_eq!(
            r.value,
            b"3".to_vec(),
            "a refused acquire_any_checked must answer the stored record"
        ),
        got => panic!(
            "acquire_any_checked must refuse a record holding another value, and take nothing: {got:?}"
        ),
    }
    for k in &keys[1..] {
        assert_eq!(
            store.inspect(k).await.expect("inspect"),
            None,
            "acquire_any_checked took a key behind a refused check"
        );
    }
    stored("a refused acquire_any_checked changed the record").await;
    store.release(&keys[0], &me).await.expect("release");
}

/// A name is one kind of resource (see `leasehold_core::kind`). On each pairing, in both
/// orders, the second kind is refused with [`Error::KindMismatch`] naming the first, and
/// holds or marks nothing: a lease (checked, as `leasehold run --key` does) or a campaign
/// beside a semaphore's permits; a semaphore beside a held lease (and, once that lease is
/// free, the name is free for the semaphore: a lease marks nothing); a semaphore beside a
/// leader, and after it resigned. A lease and an election on one name are one kind: they
/// exclude each other through the one lease, in both orders. Then first uses of fresh
/// names by a semaphore and a lease (or a campaign) started together: never both hold.
///
/// What must succeed is asked with a wait, and store calls that answer a retryable error
/// under load are asked again: the case is about which kind gets the name, not about
/// first-try latency.
pub async fn a_name_is_one_kind_of_resource(fx: &Fixture) {
    use leasehold_core::ResourceKind::{Election, Lease, Semaphore};
    const WAIT: Duration = Duration::from_secs(30);
    let run = OwnerToken::random();
    let store = &fx.store;
    let client = fx.client();
    let name = |what: &str| key(&format!("kind-{what}-{run}"));
    let refused = |err: Error, found, asked| match err {
        Error::KindMismatch {
            found: f, asked: a, ..
        } if f == found && a == asked => {}
        e => panic!("expected a refusal of a {asked} on a {found}'s name, got: {e}"),
    };
    let record = |prefix: &str, name: &Key| key(&format!("{prefix}/{name}"));
    // A read asked again while it answers a retryable error (a timeout under load).
    async fn read<T, F: Future<Output = Result<T, E>>, E: std::fmt::Display>(
        what: &str,
        retryable: impl Fn(&E) -> bool,
        mut call: impl FnMut() -> F,
    ) -> T {
        let until = Instant::now() + WAIT;
        loop {
            match call().await {
                Ok(v) => return v,
                Err(e) if retryable(&e) && Instant::now() < until => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("{what}: {e}"),
            }
        }
    }
    let held = async |k: &Key| {
        read(
            "inspect",
            |e: &leasehold_core::StoreError| e.is_retryable(),
            || store.inspect(k),
        )
        .await
        .is_some()
    };
    // Not held now, or soon: a release lost to a timeout under load is retried in the
    // background, and the lease expires after its TTL at the latest; a lease still held
    // past that is kept by someone.
    let gone = async |k: &Key, what: &str| {
        let until = Instant::now() + fx.ttl * 2 + Duration::from_secs(1);
        while held(k).await {
            assert!(Instant::now() < until, "{what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let get = async |k: &Key| {
        read(
            "get_record",
            |e: &leasehold_core::StoreError| e.is_retryable(),
            || store.get_record(k),
        )
        .await
    };
    let slots_held = async |sem: &leasehold_core::Semaphore| {
        read("holders", |e: &Error| e.is_retryable(), || sem.holders())
            .await
            .len()
    };
    // A release lost to a timeout under load leaves the lease to expire.
    let released = |r: Result<bool, Error>| match r {
        Ok(_) => {}
        Err(e) if e.is_retryable() => {}
        Err(e) => panic!("release: {e}"),
    };

    // A semaphore first.
    let sem_name = name("semaphore");
    let sem = client.semaphore(sem_name.clone(), 2).expect("valid");
    let permit = sem.acquire(WAIT).await.expect("a permit of a fresh name");
    let lease = client
        .acquire(sem_name.clone(), WAIT)
        .await
        .expect("the plain acquire checks nothing");
    let err = client
        .check_lease_kind(lease)
        .await
        .expect_err("a lease beside a semaphore's permits must be refused");
    refused(err, Semaphore, Lease);
    gone(&sem_name, "a refused lease must be released").await;
    let err = client
        .election(sem_name.clone())
        .expect("valid")
        .campaign("v", WAIT)
        .await
        .expect_err("a campaign beside a semaphore's permits must be refused");
    refused(err, Semaphore, Election);
    gone(&sem_name, "a refused campaign must release the lease").await;
    assert_eq!(
        get(&record("election", &sem_name)).await,
        None,
        "a refused campaign must publish nothing"
    );
    released(permit.release().await);

    // A lease first.
    let lease_name = name("lease");
    let lease = client
        .acquire(lease_name.clone(), WAIT)
        .await
        .expect("lease");
    let lease = client
        .check_lease_kind(lease)
        .await
        .expect("a lease on a fresh name passes the check");
    let sem = client.semaphore(lease_name.clone(), 2).expect("valid");
    let err = sem
        .acquire(WAIT)
        .await
        .expect_err("a permit beside a held lease must be refused");
    refused(err, Lease, Semaphore);
    assert_eq!(slots_held(&sem).await, 0, "a refused permit holds no slot");
    assert_eq!(
        get(&record("semaphore", &lease_name)).await,
        None,
        "a refused semaphore must not mark a lease's name as its own"
    );
    released(lease.release().await);
    gone(&lease_name, "a released lease must be gone").await;
    let permit = sem
        .acquire(WAIT)
        .await
        .expect("a released lease leaves no mark: a semaphore may take the name");
    released(permit.release().await);

    // An election first.
    let election_name = name("election");
    let election = client.election(election_name.clone()).expect("valid");
    let leader = election.campaign("v", WAIT).await.expect("campaign");
    let sem = client.semaphore(election_name.clone(), 2).expect("valid");
    let err = sem
        .acquire(WAIT)
        .await
        .expect_err("a permit beside a leader must be refused");
    refused(err, Election, Semaphore);
    released(leader.resign().await);
    let err = sem
        .acquire(WAIT)
        .await
        .expect_err("a permit on an election's name must be refused without a leader too");
    refused(err, Election, Semaphore);
    assert_eq!(slots_held(&sem).await, 0, "a refused permit holds no slot");

    // A lease and an election: one kind, one lease.
    let shared = name("shared");
    let election = client.election(shared.clone()).expect("valid");
    let lease = client.acquire(shared.clone(), WAIT).await.expect("lease");
    let lease = client
        .check_lease_kind(lease)
        .await
        .expect("a lease passes");
    match election.campaign("v", Duration::from_millis(200)).await {
        Err(Error::WaitTimeout { .. }) => {}
        Err(e) if e.is_retryable() => {}
        other => panic!("a campaign must wait while a lease holds its name: {other:?}"),
    }
    let seen = read("leader", |e: &Error| e.is_retryable(), || election.leader()).await;
    assert_eq!(
        seen.map(|l| l.term),
        Some(lease.fence()),
        "the lease's holder is the leader"
    );
    released(lease.release().await);
    let leader = election.campaign("v", WAIT).await.expect("campaign");
    match client.try_acquire(shared.clone()).await {
        Err(Error::Contended { .. }) => {}
        Err(e) if e.is_retryable() => {}
        other => panic!("a lease must be refused while a leader holds its name: {other:?}"),
    }
    released(leader.resign().await);

    // Racing first uses of fresh names: never both held. Each outcome is kept (a grant
    // stays held) until both are in.
    for round in 0..8 {
        let fresh = name(&format!("race-{round}"));
        let sem = client.semaphore(fresh.clone(), 2).expect("valid");
        let (p, other) = if round % 2 == 0 {
            let lease = async {
                let lease = client.try_acquire(fresh.clone()).await?;
                client.check_lease_kind(lease).await
            };
            let (p, l) = tokio::join!(sem.try_acquire(), lease);
            let l = l.map(|l| Box::new(l) as Box<dyn std::any::Any + Send>);
            (p, l)
        } else {
            let election = client.election(fresh.clone()).expect("valid");
            let (p, e) = tokio::join!(sem.try_acquire(), election.campaign("v", Duration::ZERO));
            (p, e.map(|e| Box::new(e) as Box<dyn std::any::Any + Send>))
        };
        for r in [p.as_ref().err(), other.as_ref().err()]
            .into_iter()
            .flatten()
        {
            assert!(
                matches!(r, Error::KindMismatch { .. }) || r.is_retryable(),
                "round {round}: {r}"
            );
        }
        assert!(
            p.is_err() || other.is_err(),
            "round {round}: a semaphore and a lease (or leader) both hold `{fresh}`"
        );
    }
}
