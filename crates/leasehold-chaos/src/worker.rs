//! A worker process: loops acquire → read-modify-write through the guard → release, and
//! records every event.

use std::fs::File;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::postgres::sqlx::{self, PgPool, postgres::PgPoolOptions};
use leasehold::{
    GuardDecision, LeaseClient, LeaseConfig, LeaseObserver, RenewalEvent, RenewalPhase, Store,
};
use rand::Rng;

use crate::broken::{self, Broken};
use crate::history::{Event, Op, Phase};
use crate::mono::{instant_ns, mono_ns};

/// What a worker needs to know.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerSpec {
    /// Its incarnation in the history (`w2#1`).
    #[arg(long)]
    pub name: String,
    /// The lease store's URL.
    #[arg(long)]
    pub lease_url: String,
    /// The PostgreSQL holding the protected data and the guard.
    #[arg(long)]
    pub pg_url: String,
    /// The lease key (also the protected resource); with [`permits`](Self::permits), the
    /// semaphore's name (the resource is then the slot key of each permit).
    #[arg(long)]
    pub key: String,
    /// Semaphore mode: take a permit of the semaphore `key` with this many permits
    /// instead of the lease `key`.
    #[arg(long)]
    pub permits: Option<u32>,
    /// Semaphore mode, deliberately broken (the checker's C11 control): skip the
    /// semaphore and take the lease of a slot key `key#0` … `key#N` (N+1 slots), each
    /// worker its own (its number modulo N+1).
    #[arg(long)]
    pub overcommit: bool,
    /// The lease TTL.
    #[arg(long, value_parser = crate::parse_duration)]
    pub ttl: Duration,
    /// Skip the guard (the control run).
    #[arg(long)]
    pub unfenced: bool,
    /// Where to append the events.
    #[arg(long)]
    pub events: std::path::PathBuf,
    /// (the checker's control runs, test builds only) a deliberately broken part
    /// ([`Broken`]).
    #[arg(long, hide = true, value_enum)]
    pub broken: Option<Broken>,
}

/// Appends events as JSON lines, one `write` per line.
#[derive(Clone)]
pub struct Recorder {
    file: Arc<Mutex<File>>,
    worker: String,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("worker", &self.worker)
            .finish()
    }
}

impl Recorder {
    /// A recorder appending to `path`.
    ///
    /// # Errors
    /// When the file cannot be opened.
    pub fn open(path: &std::path::Path, worker: &str) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(Self {
            file: Arc::new(Mutex::new(file)),
            worker: worker.to_owned(),
        })
    }

    /// Records `e` (its `t` and `worker` are filled in when zero/empty).
    pub fn record(&self, mut e: Event) {
        if e.t == 0 {
            e.t = mono_ns();
        }
        if e.worker.is_empty() {
            e.worker = self.worker.clone();
        }
        let mut line = serde_json::to_string(&e).expect("serializable");
        line.push('\n');
        let mut f = self.file.lock().unwrap_or_else(|p| p.into_inner());
        let _ = f.write_all(line.as_bytes());
    }
}

fn event(op: Op, phase: Phase, key: &str, owner: &str) -> Event {
    Event {
        op: Some(op),
        phase: Some(phase),
        key: key.into(),
        owner: owner.into(),
        ..Default::default()
    }
}

/// Creates the protected data's tables (idempotent).
///
/// # Errors
/// Database errors, as text.
pub async fn prepare_data(pool: &PgPool, key: &str) -> Result<(), String> {
    leasehold::postgres::guard::migrate(pool)
        .await
        .map_err(|e| e.to_string())?;
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS chaos_counter (resource text PRIMARY KEY, value bigint NOT NULL);
         CREATE TABLE IF NOT EXISTS chaos_audit (seq bigserial PRIMARY KEY, resource text NOT NULL, fence bigint NOT NULL, owner text NOT NULL);",
    )
    .execute(pool)
    .await
    .map_err(|e| e.to_string())?;
    sqlx::query("INSERT INTO chaos_counter VALUES ($1, 0) ON CONFLICT DO NOTHING")
        .bind(key)
        .execute(pool)
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}

enum WriteOutcome {
    Accepted(u64),
    Rejected(u64),
    Failed(String),
    Unknown(String),
}

/// One protected write: guard check (unless unfenced), read-modify-write of the counter
/// with a pause in the middle, an audit row; all in one transaction.
async fn protected_write(
    pool: &PgPool,
    spec: &WorkerSpec,
    key: &str,
    owner: &str,
    fence: leasehold::Fence,
) -> WriteOutcome {
    let mut tx = match pool.begin().await {
        Ok(tx) => tx,
        Err(e) => return WriteOutcome::Failed(e.to_string()),
    };
    // A writer blocked behind a frozen one gives up instead of queueing forever.
    let timeout_ms = (spec.ttl.as_millis() / 2).max(100);
    if let Err(e) = sqlx::query("SELECT set_config('lock_timeout', $1, true)")
        .bind(format!("{timeout_ms}ms"))
        .execute(&mut *tx)
        .await
    {
        return WriteOutcome::Failed(e.to_string());
    }
    if !spec.unfenced {
        let resource = match leasehold::ResourceName::new(key) {
            Ok(r) => r,
            Err(e) => return WriteOutcome::Failed(e.to_string()),
        };
        match leasehold::postgres::guard::check_and_advance(&mut tx, &resource, fence).await {
            Ok(GuardDecision::Accepted { .. }) => {}
            Ok(GuardDecision::Rejected { current }) => {
                return WriteOutcome::Rejected(current.get());
            }
            Err(e) => return WriteOutcome::Failed(e.to_string()),
        }
    }
    let read: Result<i64, _> =
        sqlx::query_scalar("SELECT value FROM chaos_counter WHERE resource = $1")
            .bind(key)
            .fetch_one(&mut *tx)
            .await;
    let value = match read {
        Ok(v) => v,
        Err(e) => return WriteOutcome::Failed(e.to_string()),
    };
    let pause = rand::rng().random_range(0..10);
    tokio::time::sleep(Duration::from_millis(pause)).await;
    // Broken (lost update): the increment is skipped on every even audit row; the row is
    // numbered after the update, so the next value of the sequence decides.
    let skip = spec.broken == Some(Broken::LostUpdate)
        && sqlx::query_scalar::<_, i64>(
            "SELECT last_value + CASE WHEN is_called THEN 1 ELSE 0 END FROM chaos_audit_seq_seq",
        )
        .fetch_one(&mut *tx)
        .await
        .is_ok_and(|next| next % 2 == 0);
    let update = sqlx::query("UPDATE chaos_counter SET value = $2 WHERE resource = $1")
        .bind(key)
        .bind(if skip { value } else { value + 1 })
        .execute(&mut *tx)
        .await;
    if let Err(e) = update {
        return WriteOutcome::Failed(e.to_string());
    }
    let seq: Result<i64, _> = sqlx::query_scalar(
        "INSERT INTO chaos_audit (resource, fence, owner) VALUES ($1, $2, $3) RETURNING seq",
    )
    .bind(key)
    .bind(fence.get() as i64)
    .bind(owner)
    .fetch_one(&mut *tx)
    .await;
    let seq = match seq {
        Ok(s) => s as u64,
        Err(e) => return WriteOutcome::Failed(e.to_string()),
    };
    if spec.broken == Some(Broken::AckBeforeCommit) {
        // Broken: the write is acknowledged, and its transaction rolled back.
        let _ = tx.rollback().await;
        return WriteOutcome::Accepted(seq);
    }
    match tx.commit().await {
        Ok(()) => WriteOutcome::Accepted(seq),
        Err(e) => WriteOutcome::Unknown(e.to_string()),
    }
}

/// Records the library's own renewals (send and answer) through its observer hook.
#[derive(Debug)]
struct RenewalRecorder(Recorder);

impl LeaseObserver for RenewalRecorder {
    fn renewal(&self, r: &RenewalEvent<'_>) {
        let t = mono_ns();
        let remaining = r.remaining.as_nanos() as u64;
        let (phase, detail) = match r.phase {
            RenewalPhase::Sent => (Phase::Invoke, "sent"),
            RenewalPhase::Accepted => (Phase::Ok, "accepted"),
            RenewalPhase::Refused => (Phase::Fail, "refused"),
            RenewalPhase::NotOwner => (Phase::Fail, "not_owner"),
            _ => (Phase::Unknown, "failed"),
        };
        let mut ev = event(Op::Renew, phase, r.key.as_str(), &r.owner.to_hex());
        ev.t = t;
        ev.fence = Some(r.fence.get());
        ev.remaining_ns = Some(remaining);
        ev.lost = Some(r.lost);
        if phase == Phase::Ok {
            ev.valid_until = Some(t + remaining);
        }
        ev.detail = detail.into();
        self.0.record(ev);
    }
}

/// Asks the lease whether it is lost, on the spot; returns `(t, answer)` where `t` was
/// read before asking. `ignore` (broken): answers "not lost" without asking.
fn probe(lease: &leasehold::Lease, ignore: bool) -> (u64, bool) {
    let t = mono_ns();
    (t, !ignore && lease.lost().is_lost())
}

/// Broken ([`Broken::ZombieHeartbeat`]): renews every TTL/3 whatever the validity left or
/// the lost signal say, and accepts every "renewed" (its store answers that always),
/// recording its sends and answers as the library's observer records its own.
#[allow(clippy::too_many_arguments)]
async fn zombie_heartbeat(
    rec: Recorder,
    store: Arc<dyn Store>,
    key: leasehold::Key,
    owner: leasehold::OwnerToken,
    fence: leasehold::Fence,
    mut valid_until: u64,
    lost: leasehold::LostSignal,
    ttl: Duration,
) {
    let hex = owner.to_hex();
    loop {
        tokio::time::sleep(ttl / 3).await;
        let t = mono_ns();
        let remaining = valid_until.saturating_sub(t);
        let was_lost = lost.is_lost();
        let mut ev = event(Op::Renew, Phase::Invoke, key.as_str(), &hex);
        ev.t = t;
        ev.fence = Some(fence.get());
        ev.remaining_ns = Some(remaining);
        ev.lost = Some(was_lost);
        ev.detail = "sent".into();
        rec.record(ev);
        let outcome = store.renew(&key, &owner, ttl).await;
        let mut ev = event(Op::Renew, Phase::Ok, key.as_str(), &hex);
        ev.fence = Some(fence.get());
        ev.remaining_ns = Some(remaining);
        ev.lost = Some(was_lost);
        match outcome {
            Ok(_) => {
                let now = mono_ns();
                valid_until = t + ttl.as_nanos() as u64;
                ev.t = now;
                ev.valid_until = Some(valid_until);
                ev.detail = "accepted".into();
            }
            Err(e) => {
                ev.phase = Some(Phase::Unknown);
                ev.detail = e.to_string();
            }
        }
        rec.record(ev);
    }
}

/// Takes the round's lease: the lease `key`, or in semaphore mode a permit's slot lease
/// (or, overcommitting, one of N+1 slot leases: see [`overcommit_slot`]).
async fn take(
    client: &LeaseClient,
    semaphore: Option<&leasehold::Semaphore>,
    spec: &WorkerSpec,
) -> Result<leasehold::Lease, leasehold::Error> {
    let wait = spec.ttl * 5;
    match (semaphore, spec.permits) {
        (Some(sem), _) => Ok(sem.acquire(wait).await?.into_lease()),
        (None, Some(n)) => {
            let slot =
                overcommit_slot(&spec.name, n).unwrap_or_else(|| rand::rng().random_range(0..=n));
            client.acquire(format!("{}#{slot}", spec.key), wait).await
        }
        (None, None) => client.acquire(&spec.key, wait).await,
    }
}

/// The slot an overcommitting worker takes every round: its number modulo N+1 (`w1` →
/// `#1`, `w3` → `#0` with two permits, …), so that with at least N+1 workers every slot
/// has its own holders and all N+1 are held at once for most of the run, whatever the
/// machine's load (random slots could pile onto one and leave C11's control silent).
/// `None` for a name that is not `w<number>…`.
fn overcommit_slot(name: &str, permits: u32) -> Option<u32> {
    let digits: String = name
        .strip_prefix('w')?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    Some(digits.parse::<u32>().ok()? % permits.checked_add(1)?)
}

/// Runs the worker loop until the process is killed.
///
/// Each round: acquire (print `ACQUIRED <fence> <key>`, the key being the lease's: the
/// slot key in semaphore mode); some work; a validity check (`check` event); if valid,
/// print `PREPARING <fence> <key>` and wait a moment (the injector's stale write freezes
/// the worker here), print `WRITING <fence> <key>`, probe `is_lost()` and record it with
/// the write's `invoke`, write through the guard regardless of the probe (the write is
/// under way: the phantom write only the guard can stop), print `WROTE <fence> <key>`
/// once it is acknowledged; print `RELEASING <fence> <key>` and release; pause a moment
/// so that the others get their turn. Every event of the round names the lease's key,
/// which is also the protected resource.
///
/// # Errors
/// Set-up failures (store, database, event file), as text.
pub async fn run(spec: WorkerSpec, registry: leasehold::store::Registry) -> Result<(), String> {
    broken::allowed(spec.broken)?;
    let rec = Recorder::open(&spec.events, &spec.name).map_err(|e| e.to_string())?;
    let honest: Arc<dyn Store> = registry
        .open(&spec.lease_url)
        .await
        .map_err(|e| e.to_string())?;
    let zombie_store = broken::yes_renewals(Arc::clone(&honest));
    let store = broken::wrap_store(honest, spec.broken);
    let ignore_lost = spec.broken == Some(Broken::IgnoreLost);
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(spec.ttl * 2)
        .connect(&spec.pg_url)
        .await
        .map_err(|e| e.to_string())?;
    let config = LeaseConfig::new(spec.ttl).map_err(|e| e.to_string())?;
    let client = LeaseClient::builder(store, config)
        .observer(Arc::new(RenewalRecorder(rec.clone())))
        .build();
    let semaphore = match spec.permits {
        Some(n) if !spec.overcommit => Some(
            client
                .semaphore(spec.key.as_str(), n)
                .map_err(|e| e.to_string())?,
        ),
        _ => None,
    };
    println!("READY {}", spec.name);
    loop {
        // In semaphore mode the slot is known only once a permit is granted: the
        // invoke and a failure name the semaphore.
        rec.record(event(Op::Acquire, Phase::Invoke, &spec.key, ""));
        let lease = match take(&client, semaphore.as_ref(), &spec).await {
            Ok(l) => l,
            Err(e) => {
                let mut ev = event(Op::Acquire, Phase::Fail, &spec.key, "");
                ev.detail = e.to_string();
                rec.record(ev);
                tokio::time::sleep(spec.ttl / 4).await;
                continue;
            }
        };
        let key = lease.key().as_str().to_owned();
        let owner = lease.owner().to_hex();
        let fence = lease.fence();
        let mut ev = event(Op::Acquire, Phase::Ok, &key, &owner);
        ev.fence = Some(fence.get());
        ev.ttl_ms = Some(spec.ttl.as_millis() as u64);
        ev.valid_until = Some(instant_ns(lease.valid_until()));
        rec.record(ev);
        println!("ACQUIRED {} {key}", fence.get());
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        let zombie = (spec.broken == Some(Broken::ZombieHeartbeat)).then(|| {
            tokio::spawn(zombie_heartbeat(
                rec.clone(),
                Arc::clone(&zombie_store),
                lease.key().clone(),
                *lease.owner(),
                fence,
                instant_ns(lease.valid_until()),
                lease.lost(),
                spec.ttl,
            ))
        });
        let watcher = {
            let (rec, lost, key, owner) = (rec.clone(), lease.lost(), key.clone(), owner.clone());
            tokio::spawn(async move {
                if ignore_lost {
                    // Broken: nobody watches the lost signal.
                    let _ = done_rx.await;
                    return;
                }
                // Lost first: a signal that fired before the release is still recorded.
                tokio::select! {
                    biased;
                    reason = lost.wait() => {
                        let mut ev = event(Op::Lost, Phase::Ok, &key, &owner);
                        ev.fence = Some(fence.get());
                        ev.detail = reason.as_str().to_owned();
                        rec.record(ev);
                    }
                    _ = done_rx => {}
                }
            })
        };
        // Some work under the lease.
        let work = rand::rng().random_range(0..spec.ttl.as_millis() as u64);
        tokio::time::sleep(Duration::from_millis(work)).await;
        let (t, lost) = probe(&lease, ignore_lost);
        let mut ev = event(Op::Check, Phase::Ok, &key, &owner);
        ev.t = t;
        ev.fence = Some(fence.get());
        ev.lost = Some(lost);
        rec.record(ev);
        if !lost {
            // The injector may freeze us right here, between the check and the write:
            // the phantom write that only the guard can stop.
            println!("PREPARING {} {key}", fence.get());
            let window = rand::rng().random_range(100..200);
            tokio::time::sleep(Duration::from_millis(window)).await;
            println!("WRITING {} {key}", fence.get());
            let (t, lost) = probe(&lease, ignore_lost);
            let mut ev = event(Op::Write, Phase::Invoke, &key, &owner);
            ev.t = t;
            ev.fence = Some(fence.get());
            ev.lost = Some(lost);
            rec.record(ev);
            let mut ev = event(Op::Write, Phase::Ok, &key, &owner);
            ev.fence = Some(fence.get());
            let acknowledged = match protected_write(&pool, &spec, &key, &owner, fence).await {
                WriteOutcome::Accepted(seq) => {
                    ev.seq = Some(seq);
                    true
                }
                WriteOutcome::Rejected(current) => {
                    ev.phase = Some(Phase::Fail);
                    ev.detail = format!("rejected: fence {current} accepted");
                    false
                }
                WriteOutcome::Failed(e) => {
                    ev.phase = Some(Phase::Fail);
                    ev.detail = e;
                    false
                }
                WriteOutcome::Unknown(e) => {
                    ev.phase = Some(Phase::Unknown);
                    ev.detail = e;
                    false
                }
            };
            rec.record(ev);
            if acknowledged {
                println!("WROTE {} {key}", fence.get());
            }
            if ignore_lost {
                // Broken: it goes on working as if it held the lease.
                tokio::time::sleep(spec.ttl).await;
            }
        }
        println!("RELEASING {} {key}", fence.get());
        rec.record(event(Op::Release, Phase::Invoke, &key, &owner));
        let mut ev = event(Op::Release, Phase::Ok, &key, &owner);
        match lease.release().await {
            Ok(true) => {}
            Ok(false) => {
                ev.phase = Some(Phase::Fail);
                ev.detail = "not owner".into();
            }
            Err(e) => {
                ev.phase = Some(Phase::Unknown);
                ev.detail = e.to_string();
            }
        }
        rec.record(ev);
        if let Some(z) = zombie {
            z.abort();
        }
        let _ = done_tx.send(());
        let _ = watcher.await;
        // Let the others in now and then (a holder that loops at once wins most races).
        let pause = rand::rng().random_range(0..spec.ttl.as_millis() as u64 / 8);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::overcommit_slot;

    #[test]
    fn overcommitting_workers_cover_every_slot() {
        let slots: Vec<_> = ["w1#0", "w2#3", "w3#1", "w4#0"]
            .iter()
            .map(|n| overcommit_slot(n, 2))
            .collect();
        assert_eq!(slots, [Some(1), Some(2), Some(0), Some(1)]);
        assert_eq!(overcommit_slot("x1#0", 2), None);
        assert_eq!(overcommit_slot("w#0", 2), None);
        assert_eq!(overcommit_slot("w7", u32::MAX - 1), Some(7));
        assert_eq!(overcommit_slot("w7", u32::MAX), None);
    }
}
