//! Ten coupons, several workers, one of them frozen mid-claim (issue 17 item 4).
//!
//! A promotion has ten coupons. Worker processes claim them for incoming requests; a claim
//! reads the number of coupons issued so far, and if it is below ten, writes
//! `issued = read + 1` and the coupon. Two workers that both read `issued = 9` would both
//! issue the tenth: an overrun. Requests are delivered more than once (a retry, a
//! redelivery after a crash), and a request must never get two coupons.
//!
//! With leasehold each claim runs under the lease `coupons:<promo>`; the read stamps the
//! guard with the lease's fence, and the write checks the fence and records the request id
//! in the idempotency table in the same transaction as the coupon. One worker is frozen
//! (SIGSTOP) after it read `issued = 9` and before its write, for longer than the lease's
//! TTL: its lease expires, another worker takes it (higher fence) and issues the tenth
//! coupon. When the frozen worker is resumed (SIGCONT), its late write is rejected by the
//! guard; it retries under a new lease and finds the promotion sold out. Exactly ten
//! coupons, no request counted twice; the run exits non-zero otherwise.
//!
//! With `--unfenced` the same workers use no lease, no guard and no idempotency record
//! (a plain read, then a write, and a read-side "does this request have a coupon?"
//! check): the frozen worker writes `issued = 9 → 10` after another worker already issued
//! the tenth, so at least eleven coupons go out.
//!
//! ```text
//! cargo run -p leasehold --example coupons --features sqlite [-- --unfenced]
//! cargo run -p leasehold --example coupons --features sqlite,postgres,redis -- \
//!     --lease-url 'redis://127.0.0.1/' --data-url 'postgres://app@127.0.0.1/app'
//! ```
//!
//! Without URLs the lease lives in the embedded SQLite store and the coupons, guard and
//! idempotency tables in another SQLite file, both in a temporary directory. `--lease-url`
//! takes any store this build enables (`sqlite://`, `postgres://…?leasehold_migrate=true`,
//! `redis://`, …); `--data-url postgres://…` (feature `postgres`) puts the coupons, guard
//! and idempotency record in PostgreSQL. Redis only ever holds the lease. Each run uses a
//! new promotion name, so runs on a shared database never see each other's coupons.
//!
//! The workers are this same binary, started with the hidden `--worker` flag; the last
//! line the run prints is machine-readable:
//! `summary mode=fenced coupons=10 issued=10 counter=10 double_counted=0 duplicates=… rejected_stale_writes=1 sold_out=…`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use leasehold::sqlite::sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use leasehold::sqlite::sqlx::{self, Connection, SqlitePool};
use leasehold::{
    Fence, GuardDecision, Idempotency, LeaseClient, LeaseConfig, ResourceName, StoreError,
    StoreErrorKind,
};
use nix::sys::signal::{Signal, kill, raise};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long a worker waits for the lease before giving up.
const ACQUIRE_WAIT: Duration = Duration::from_secs(60);
/// How many times a claim is retried after a retryable store error or a rejection.
const MAX_RETRIES: u32 = 20;
/// How long the coordinator waits for the other workers before it resumes the frozen one
/// anyway (they should need a few seconds).
const OTHERS_CAP: Duration = Duration::from_secs(90);

// ---------------------------------------------------------------------------------------
// Command line
// ---------------------------------------------------------------------------------------

/// The options of the coordinator and of a worker.
#[derive(Debug, Clone)]
struct Args {
    unfenced: bool,
    lease_url: Option<String>,
    data_url: Option<String>,
    coupons: i64,
    workers: usize,
    ttl: Duration,
    // Worker only.
    worker: Option<usize>,
    promo: String,
    requests: Vec<String>,
    freeze_at: Option<i64>,
    dir: PathBuf,
}

const USAGE: &str = "usage: coupons [--unfenced] [--lease-url URL] [--data-url postgres://…] \
                     [--coupons N] [--workers N] [--ttl-ms MS]";

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        unfenced: false,
        lease_url: None,
        data_url: None,
        coupons: 10,
        workers: 4,
        ttl: Duration::from_secs(1),
        worker: None,
        promo: String::new(),
        requests: Vec::new(),
        freeze_at: None,
        dir: PathBuf::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))
        };
        let number = |v: String| -> Result<u64, String> {
            v.parse::<u64>()
                .map_err(|_| format!("{flag}: `{v}` is not a number"))
        };
        match flag.as_str() {
            "--unfenced" => args.unfenced = true,
            "--lease-url" => args.lease_url = Some(value()?),
            "--data-url" => args.data_url = Some(value()?),
            "--coupons" => {
                args.coupons = i64::try_from(number(value()?)?)
                    .ok()
                    .filter(|n| (1..=1000).contains(n))
                    .ok_or("--coupons: 1 to 1000")?;
            }
            "--workers" => {
                args.workers = usize::try_from(number(value()?)?)
                    .ok()
                    .filter(|n| (2..=16).contains(n))
                    .ok_or("--workers: 2 to 16")?;
            }
            "--ttl-ms" => {
                let ms = number(value()?)?;
                if !(100..=60_000).contains(&ms) {
                    return Err("--ttl-ms: 100 to 60000".into());
                }
                args.ttl = Duration::from_millis(ms);
            }
            // Hidden: set by the coordinator for the worker processes it starts.
            "--worker" => {
                args.worker = Some(usize::try_from(number(value()?)?).map_err(|e| e.to_string())?)
            }
            "--promo" => args.promo = value()?,
            "--dir" => args.dir = PathBuf::from(value()?),
            "--requests" => {
                args.requests = value()?
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect()
            }
            "--freeze-at" => {
                args.freeze_at = Some(i64::try_from(number(value()?)?).map_err(|e| e.to_string())?)
            }
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument `{other}`\n{USAGE}")),
        }
    }
    Ok(args)
}

// ---------------------------------------------------------------------------------------
// The protected data: coupons, the guard and the idempotency record, in SQLite or
// PostgreSQL
// ---------------------------------------------------------------------------------------

/// The database holding the coupons (and the guard and idempotency tables beside them).
#[derive(Debug, Clone)]
enum Data {
    Sqlite(SqlitePool),
    #[cfg(feature = "postgres")]
    Postgres(leasehold::postgres::sqlx::PgPool),
}

/// What a claim's read step saw.
#[derive(Debug, Clone, Copy)]
enum Read {
    /// The number of coupons issued so far, and (unfenced only) whether this request
    /// already has one.
    Seen { issued: i64, has_coupon: bool },
    /// Fenced only: the guard holds a higher fence; this worker's lease is gone.
    Rejected { current: Fence },
}

/// How a claim ended.
#[derive(Debug, Clone, Copy)]
enum Outcome {
    /// Coupon number `n` was issued to the request.
    Issued(i64),
    /// The request was answered before (it has a coupon, or was told "sold out").
    Duplicate,
    /// No coupon left.
    SoldOut,
    /// The guard rejected the write: a higher fence was accepted meanwhile.
    Rejected { current: Fence },
}

/// The final state of one promotion.
#[derive(Debug, Clone, Copy)]
struct Totals {
    /// Coupon rows: the coupons actually handed out.
    issued: i64,
    /// The `issued` counter of the promotion row.
    counter: i64,
    /// Requests holding more than one coupon.
    double_counted: i64,
}

fn sqlite_err(e: sqlx::Error) -> StoreError {
    leasehold::sqlite::store_error(e)
}

#[cfg(feature = "postgres")]
fn pg_err(e: leasehold::postgres::sqlx::Error) -> StoreError {
    leasehold::postgres::store_error(e)
}

fn fence_i64(fence: Fence) -> Result<i64, StoreError> {
    i64::try_from(fence.get()).map_err(|_| {
        StoreError::new(
            StoreErrorKind::InvalidInput,
            "coupons",
            format!("fence {fence} does not fit a signed 64-bit column"),
        )
    })
}

const SQLITE_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS coupon_promos (
    promo  TEXT PRIMARY KEY,
    total  INTEGER NOT NULL,
    issued INTEGER NOT NULL
);
-- No unique constraint on purpose: the unfenced run must be able to show its overrun.
CREATE TABLE IF NOT EXISTS coupons (
    promo      TEXT NOT NULL,
    number     INTEGER NOT NULL,
    request_id TEXT NOT NULL,
    worker     INTEGER NOT NULL,
    fence      INTEGER
);
CREATE INDEX IF NOT EXISTS coupons_request ON coupons (promo, request_id);
";

#[cfg(feature = "postgres")]
const PG_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS coupon_promos (
    promo  text PRIMARY KEY,
    total  bigint NOT NULL,
    issued bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS coupons (
    promo      text NOT NULL,
    number     bigint NOT NULL,
    request_id text NOT NULL,
    worker     bigint NOT NULL,
    fence      bigint
);
CREATE INDEX IF NOT EXISTS coupons_request ON coupons (promo, request_id);
";

impl Data {
    /// Connects to `--data-url`, or to `coupons.db` in `dir`.
    async fn connect(url: Option<&str>, dir: &Path) -> Result<Self, BoxError> {
        match url {
            None => {
                let options = SqliteConnectOptions::new()
                    .filename(dir.join("coupons.db"))
                    .create_if_missing(true)
                    .journal_mode(SqliteJournalMode::Wal)
                    .busy_timeout(Duration::from_secs(10));
                let pool = SqlitePoolOptions::new()
                    .max_connections(2)
                    .connect_with(options)
                    .await
                    .map_err(sqlite_err)?;
                Ok(Self::Sqlite(pool))
            }
            #[cfg(feature = "postgres")]
            Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                let pool = leasehold::postgres::sqlx::postgres::PgPoolOptions::new()
                    .max_connections(2)
                    .connect(url)
                    .await
                    .map_err(pg_err)?;
                Ok(Self::Postgres(pool))
            }
            Some(_) => Err(
                "--data-url takes a postgres:// URL (with the `postgres` feature); without it \
                 the coupons live in a temporary SQLite file"
                    .into(),
            ),
        }
    }

    /// Creates the tables (coupons, guard, idempotency) and the promotion row.
    async fn setup(&self, promo: &str, total: i64) -> Result<(), StoreError> {
        match self {
            Self::Sqlite(pool) => {
                leasehold::sqlite::guard::migrate(pool).await?;
                sqlx::raw_sql(SQLITE_SCHEMA)
                    .execute(pool)
                    .await
                    .map_err(sqlite_err)?;
                sqlx::query("INSERT INTO coupon_promos (promo, total, issued) VALUES (?1, ?2, 0)")
                    .bind(promo)
                    .bind(total)
                    .execute(pool)
                    .await
                    .map_err(sqlite_err)?;
            }
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) => {
                use leasehold::postgres::sqlx;
                leasehold::postgres::guard::migrate(pool).await?;
                sqlx::raw_sql(PG_SCHEMA)
                    .execute(pool)
                    .await
                    .map_err(pg_err)?;
                sqlx::query("INSERT INTO coupon_promos (promo, total, issued) VALUES ($1, $2, 0)")
                    .bind(promo)
                    .bind(total)
                    .execute(pool)
                    .await
                    .map_err(pg_err)?;
            }
        }
        Ok(())
    }

    /// The read step of a claim. Fenced (`guard` is `Some`): in one transaction, stamp
    /// the guard with the lease's fence (so that the write of any older holder is
    /// rejected from now on) and read the counter. Unfenced: read the counter and whether
    /// the request already has a coupon, with plain statements.
    async fn read(
        &self,
        promo: &str,
        request: &str,
        guard: Option<(&ResourceName, Fence)>,
    ) -> Result<Read, StoreError> {
        match self {
            Self::Sqlite(pool) => {
                let mut conn = pool.acquire().await.map_err(sqlite_err)?;
                if let Some((resource, fence)) = guard {
                    // BEGIN IMMEDIATE: the write lock first, so nothing changes between
                    // the guard check and the read.
                    let mut tx = conn
                        .begin_with("BEGIN IMMEDIATE")
                        .await
                        .map_err(sqlite_err)?;
                    let decision =
                        leasehold::sqlite::guard::check_and_advance(&mut tx, resource, fence)
                            .await?;
                    if let GuardDecision::Rejected { current } = decision {
                        tx.rollback().await.map_err(sqlite_err)?;
                        return Ok(Read::Rejected { current });
                    }
                    let issued: i64 =
                        sqlx::query_scalar("SELECT issued FROM coupon_promos WHERE promo = ?1")
                            .bind(promo)
                            .fetch_one(&mut *tx)
                            .await
                            .map_err(sqlite_err)?;
                    tx.commit().await.map_err(sqlite_err)?;
                    Ok(Read::Seen {
                        issued,
                        has_coupon: false,
                    })
                } else {
                    let issued: i64 =
                        sqlx::query_scalar("SELECT issued FROM coupon_promos WHERE promo = ?1")
                            .bind(promo)
                            .fetch_one(&mut *conn)
                            .await
                            .map_err(sqlite_err)?;
                    let has_coupon: bool = sqlx::query_scalar(
                        "SELECT EXISTS (SELECT 1 FROM coupons WHERE promo = ?1 AND request_id = ?2)",
                    )
                    .bind(promo)
                    .bind(request)
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(sqlite_err)?;
                    Ok(Read::Seen { issued, has_coupon })
                }
            }
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) => {
                use leasehold::postgres::sqlx;
                if let Some((resource, fence)) = guard {
                    // READ COMMITTED: the guard row stays locked until the commit, and the
                    // read sees every transaction committed before it.
                    let mut tx = pool.begin().await.map_err(pg_err)?;
                    let decision =
                        leasehold::postgres::guard::check_and_advance(&mut tx, resource, fence)
                            .await?;
                    if let GuardDecision::Rejected { current } = decision {
                        tx.rollback().await.map_err(pg_err)?;
                        return Ok(Read::Rejected { current });
                    }
                    let issued: i64 =
                        sqlx::query_scalar("SELECT issued FROM coupon_promos WHERE promo = $1")
                            .bind(promo)
                            .fetch_one(&mut *tx)
                            .await
                            .map_err(pg_err)?;
                    tx.commit().await.map_err(pg_err)?;
                    Ok(Read::Seen {
                        issued,
                        has_coupon: false,
                    })
                } else {
                    let issued: i64 =
                        sqlx::query_scalar("SELECT issued FROM coupon_promos WHERE promo = $1")
                            .bind(promo)
                            .fetch_one(pool)
                            .await
                            .map_err(pg_err)?;
                    let has_coupon: bool = sqlx::query_scalar(
                        "SELECT EXISTS (SELECT 1 FROM coupons WHERE promo = $1 AND request_id = $2)",
                    )
                    .bind(promo)
                    .bind(request)
                    .fetch_one(pool)
                    .await
                    .map_err(pg_err)?;
                    Ok(Read::Seen { issued, has_coupon })
                }
            }
        }
    }

    /// The write step of a claim, from the counter value the read step saw. Fenced
    /// (`guard` is `Some`): in one transaction, check the fence, record the request id
    /// (answered once: a coupon or "sold out"), then write. Unfenced: just write.
    async fn write(
        &self,
        promo: &str,
        request: &Claim<'_>,
        read_issued: i64,
        total: i64,
        guard: Option<(&ResourceName, Fence)>,
    ) -> Result<Outcome, StoreError> {
        let number = read_issued.checked_add(1).ok_or_else(|| {
            StoreError::new(StoreErrorKind::Corrupt, "coupons", "counter overflow")
        })?;
        let worker = i64::try_from(request.worker).unwrap_or(i64::MAX);
        let fence = guard.map(|(_, f)| fence_i64(f)).transpose()?;
        match self {
            Self::Sqlite(pool) => {
                use leasehold::sqlite::guard;
                let mut conn = pool.acquire().await.map_err(sqlite_err)?;
                let mut tx = conn
                    .begin_with("BEGIN IMMEDIATE")
                    .await
                    .map_err(sqlite_err)?;
                if let Some((resource, fence)) = guard {
                    if let GuardDecision::Rejected { current } =
                        guard::check_and_advance(&mut tx, resource, fence).await?
                    {
                        tx.rollback().await.map_err(sqlite_err)?;
                        return Ok(Outcome::Rejected { current });
                    }
                    if guard::record_once(&mut tx, &request.job).await? == Idempotency::AlreadyDone
                    {
                        tx.rollback().await.map_err(sqlite_err)?;
                        return Ok(Outcome::Duplicate);
                    }
                    if read_issued >= total {
                        // The answer "sold out" is recorded too: a redelivery is a duplicate.
                        tx.commit().await.map_err(sqlite_err)?;
                        return Ok(Outcome::SoldOut);
                    }
                }
                sqlx::query("UPDATE coupon_promos SET issued = ?2 WHERE promo = ?1")
                    .bind(promo)
                    .bind(number)
                    .execute(&mut *tx)
                    .await
                    .map_err(sqlite_err)?;
                sqlx::query(
                    "INSERT INTO coupons (promo, number, request_id, worker, fence) VALUES (?1, ?2, ?3, ?4, ?5)",
                )
                .bind(promo)
                .bind(number)
                .bind(request.id)
                .bind(worker)
                .bind(fence)
                .execute(&mut *tx)
                .await
                .map_err(sqlite_err)?;
                tx.commit().await.map_err(sqlite_err)?;
            }
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) => {
                use leasehold::postgres::{guard, sqlx};
                let mut tx = pool.begin().await.map_err(pg_err)?;
                if let Some((resource, fence)) = guard {
                    if let GuardDecision::Rejected { current } =
                        guard::check_and_advance(&mut tx, resource, fence).await?
                    {
                        tx.rollback().await.map_err(pg_err)?;
                        return Ok(Outcome::Rejected { current });
                    }
                    if guard::record_once(&mut tx, &request.job).await? == Idempotency::AlreadyDone
                    {
                        tx.rollback().await.map_err(pg_err)?;
                        return Ok(Outcome::Duplicate);
                    }
                    if read_issued >= total {
                        tx.commit().await.map_err(pg_err)?;
                        return Ok(Outcome::SoldOut);
                    }
                }
                sqlx::query("UPDATE coupon_promos SET issued = $2 WHERE promo = $1")
                    .bind(promo)
                    .bind(number)
                    .execute(&mut *tx)
                    .await
                    .map_err(pg_err)?;
                sqlx::query(
                    "INSERT INTO coupons (promo, number, request_id, worker, fence) VALUES ($1, $2, $3, $4, $5)",
                )
                .bind(promo)
                .bind(number)
                .bind(request.id)
                .bind(worker)
                .bind(fence)
                .execute(&mut *tx)
                .await
                .map_err(pg_err)?;
                tx.commit().await.map_err(pg_err)?;
            }
        }
        Ok(Outcome::Issued(number))
    }

    /// What the promotion ended with.
    async fn totals(&self, promo: &str) -> Result<Totals, StoreError> {
        let (issued, counter, double_counted): (i64, i64, i64) = match self {
            Self::Sqlite(pool) => {
                let issued = sqlx::query_scalar("SELECT count(*) FROM coupons WHERE promo = ?1")
                    .bind(promo)
                    .fetch_one(pool)
                    .await
                    .map_err(sqlite_err)?;
                let counter =
                    sqlx::query_scalar("SELECT issued FROM coupon_promos WHERE promo = ?1")
                        .bind(promo)
                        .fetch_one(pool)
                        .await
                        .map_err(sqlite_err)?;
                let double = sqlx::query_scalar(
                    "SELECT count(*) FROM (SELECT request_id FROM coupons WHERE promo = ?1 \
                     GROUP BY request_id HAVING count(*) > 1)",
                )
                .bind(promo)
                .fetch_one(pool)
                .await
                .map_err(sqlite_err)?;
                (issued, counter, double)
            }
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) => {
                use leasehold::postgres::sqlx;
                let issued = sqlx::query_scalar("SELECT count(*) FROM coupons WHERE promo = $1")
                    .bind(promo)
                    .fetch_one(pool)
                    .await
                    .map_err(pg_err)?;
                let counter =
                    sqlx::query_scalar("SELECT issued FROM coupon_promos WHERE promo = $1")
                        .bind(promo)
                        .fetch_one(pool)
                        .await
                        .map_err(pg_err)?;
                let double = sqlx::query_scalar(
                    "SELECT count(*) FROM (SELECT request_id FROM coupons WHERE promo = $1 \
                     GROUP BY request_id HAVING count(*) > 1) AS d",
                )
                .bind(promo)
                .fetch_one(pool)
                .await
                .map_err(pg_err)?;
                (issued, counter, double)
            }
        };
        Ok(Totals {
            issued,
            counter,
            double_counted,
        })
    }
}

/// One delivery of a request to a worker.
#[derive(Debug)]
struct Claim<'a> {
    id: &'a str,
    /// The idempotency record's job id: `coupon:<promo>:<request id>`.
    job: ResourceName,
    worker: usize,
}

// ---------------------------------------------------------------------------------------
// Worker process
// ---------------------------------------------------------------------------------------

/// What a worker did, printed as its `result` line.
#[derive(Debug, Default)]
struct Counts {
    issued: u32,
    duplicates: u32,
    sold_out: u32,
    rejected: u32,
}

/// The lease of a fenced worker.
struct Fenced {
    client: LeaseClient,
    key: String,
    resource: ResourceName,
}

async fn worker(args: Args, me: usize) -> Result<(), BoxError> {
    let data = Data::connect(args.data_url.as_deref(), &args.dir).await?;
    let fenced = if args.unfenced {
        None
    } else {
        let url = args
            .lease_url
            .clone()
            .ok_or("the worker needs --lease-url")?;
        let store = leasehold::open(&url).await?;
        let client = LeaseClient::new(store, LeaseConfig::new(args.ttl)?);
        let key = format!("coupons:{}", args.promo);
        let resource = ResourceName::new(&key)?;
        Some(Fenced {
            client,
            key,
            resource,
        })
    };
    let mut counts = Counts::default();
    let mut freeze_at = args.freeze_at;
    for request in &args.requests {
        let claim = Claim {
            id: request,
            job: ResourceName::new(format!("coupon:{}:{request}", args.promo))?,
            worker: me,
        };
        let mut retries = 0;
        loop {
            let res = claim_once(&args, &data, fenced.as_ref(), &claim, &mut freeze_at).await;
            let outcome = match res {
                Ok(o) => o,
                Err(e) if retries < MAX_RETRIES && retryable(&*e) => {
                    // In a fenced run a retry is safe even after an ambiguous commit: the
                    // idempotency record tells whether the first attempt went through.
                    retries += 1;
                    println!("{request}: retrying after `{e}`");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            match outcome {
                Outcome::Issued(n) => {
                    counts.issued += 1;
                    println!("{request}: issued coupon #{n}");
                }
                Outcome::Duplicate => {
                    counts.duplicates += 1;
                    println!("{request}: delivered again, already answered: skipped");
                }
                Outcome::SoldOut => {
                    counts.sold_out += 1;
                    println!("{request}: sold out");
                }
                Outcome::Rejected { current } => {
                    counts.rejected += 1;
                    retries += 1;
                    if retries > MAX_RETRIES {
                        return Err(format!("{request}: rejected {retries} times").into());
                    }
                    println!(
                        "{request}: stale write REJECTED by the guard (fence {current} already accepted); retrying under a new lease"
                    );
                    continue;
                }
            }
            break;
        }
    }
    println!(
        "result issued={} duplicates={} sold_out={} rejected={}",
        counts.issued, counts.duplicates, counts.sold_out, counts.rejected
    );
    Ok(())
}

fn retryable(e: &(dyn std::error::Error + 'static)) -> bool {
    if let Some(e) = e.downcast_ref::<StoreError>() {
        return e.is_retryable();
    }
    if let Some(leasehold::Error::Store(e)) = e.downcast_ref::<leasehold::Error>() {
        return e.is_retryable();
    }
    false
}

/// One attempt at a claim: acquire (fenced), read, maybe freeze, write, release.
async fn claim_once(
    args: &Args,
    data: &Data,
    fenced: Option<&Fenced>,
    claim: &Claim<'_>,
    freeze_at: &mut Option<i64>,
) -> Result<Outcome, BoxError> {
    let lease = match fenced {
        Some(f) => Some(f.client.acquire(f.key.as_str(), ACQUIRE_WAIT).await?),
        None => None,
    };
    let guard = fenced
        .zip(lease.as_ref())
        .map(|(f, l)| (&f.resource, l.fence()));
    let res = async {
        let issued = match data.read(&args.promo, claim.id, guard).await? {
            Read::Rejected { current } => return Ok(Outcome::Rejected { current }),
            Read::Seen {
                has_coupon: true, ..
            } => return Ok(Outcome::Duplicate),
            Read::Seen { issued, .. } if args.unfenced && issued >= args.coupons => {
                return Ok(Outcome::SoldOut);
            }
            Read::Seen { issued, .. } => issued,
        };
        if *freeze_at == Some(issued) {
            *freeze_at = None;
            // The whole process stops here, lease renewal included, until the coordinator
            // sends SIGCONT (well past the lease's TTL).
            println!(
                "frozen {}: read issued={issued}{}, stopping itself (SIGSTOP) before the write",
                claim.id,
                guard.map_or(String::new(), |(_, f)| format!(" under fence {f}"))
            );
            raise(Signal::SIGSTOP)?;
            println!(
                "resumed {}: writing issued={issued} -> {} now",
                claim.id,
                issued + 1
            );
        }
        // A careful worker would also run this under `Lease::run`, which stops it once the
        // lease is known lost; after a freeze that knowledge may come too late, and the
        // guard is what turns the late write away.
        Ok::<_, BoxError>(
            data.write(&args.promo, claim, issued, args.coupons, guard)
                .await?,
        )
    }
    .await;
    if let Some(lease) = lease {
        // Ok(false): it had expired or been taken over (after the freeze).
        let _ = lease.release().await;
    }
    res
}

// ---------------------------------------------------------------------------------------
// Coordinator
// ---------------------------------------------------------------------------------------

/// A started worker: its lines come in on the shared channel.
struct Worker {
    child: Child,
    pid: Pid,
}

/// A line printed by worker `.0`.
type Line = (usize, String);

fn spawn_worker(
    exe: &Path,
    args: &Args,
    dir: &Path,
    me: usize,
    requests: &[String],
    freeze_at: Option<i64>,
    lines: &mpsc::UnboundedSender<Line>,
) -> Result<Worker, BoxError> {
    let mut cmd = Command::new(exe);
    cmd.arg("--dir")
        .arg(dir)
        .args(["--worker", &me.to_string(), "--promo", &args.promo])
        .args(["--coupons", &args.coupons.to_string()])
        .args(["--ttl-ms", &args.ttl.as_millis().to_string()])
        .args(["--requests", &requests.join(",")])
        .stdout(Stdio::piped())
        .kill_on_drop(true);
    if args.unfenced {
        cmd.arg("--unfenced");
    }
    if let Some(url) = &args.lease_url {
        cmd.args(["--lease-url", url]);
    }
    if let Some(url) = &args.data_url {
        cmd.args(["--data-url", url]);
    }
    if let Some(n) = freeze_at {
        cmd.args(["--freeze-at", &n.to_string()]);
    }
    let mut child = cmd.spawn()?;
    let pid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw)
        .ok_or("worker exited at once")?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let lines = lines.clone();
    tokio::spawn(async move {
        let mut reader = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = reader.next_line().await {
            println!("  [worker {me}] {line}");
            if lines.send((me, line)).is_err() {
                break;
            }
        }
    });
    Ok(Worker { child, pid })
}

/// Whether `pid` is stopped (Linux: state `T` in `/proc/PID/stat`).
fn is_stopped(pid: Pid) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next())
        })
        .is_some_and(|state| state == 'T')
}

/// The request lists. Worker 0 (the one that freezes) answers requests 1 to 9 on its own,
/// with one delivered twice in a row, then freezes on request 10 after it read
/// `issued = 9`. The others start then; each first gets a redelivery of one of worker 0's
/// requests, then the same new requests in the same order (so each of them is delivered
/// several times, concurrently), then some of its own.
fn request_lists(coupons: i64, workers: usize) -> Vec<Vec<String>> {
    let id = |n: i64| format!("req-{n:03}");
    let mut first: Vec<String> = (1..coupons).map(id).collect();
    if coupons > 3 {
        first.insert(3, id(3)); // delivered twice in a row
    }
    first.push(id(coupons)); // the claim it freezes in
    first.push(id(1)); // a late redelivery
    let mut lists = vec![first];
    for w in 1..workers {
        let redelivered = i64::try_from(w).unwrap_or(1).min(coupons - 1).max(1);
        let mut list = vec![id(redelivered)];
        list.extend((coupons + 1..=coupons + 8).map(id));
        list.extend((0..4).map(|k| format!("req-w{w}-{k}")));
        lists.push(list);
    }
    lists
}

async fn coordinate(mut args: Args) -> Result<ExitCode, BoxError> {
    let tmp = tempfile::Builder::new().prefix("coupons-").tempdir()?;
    let dir = tmp.path().to_path_buf();
    // A new promotion each run (the temporary directory's random name), so that runs on
    // a shared database never see each other's coupons, guard row or records.
    let unique = dir
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("coupons-"))
        .unwrap_or("run")
        .to_owned();
    args.promo = format!("spring-{}-{unique}", std::process::id());
    let mode = if args.unfenced { "unfenced" } else { "fenced" };
    let data = Data::connect(args.data_url.as_deref(), &dir).await?;
    data.setup(&args.promo, args.coupons).await?;
    if args.unfenced {
        args.lease_url = None;
    } else {
        let url = args
            .lease_url
            .get_or_insert_with(|| format!("sqlite://{}", dir.join("leases.db").display()))
            .clone();
        // Opened once here so that the workers find the store ready (the SQLite store
        // creates its tables on open).
        drop(leasehold::open(&url).await?);
    }
    println!(
        "coupons ({mode}): promotion {} with {} coupons, {} workers, lease TTL {:?}; lease: {}; data: {}",
        args.promo,
        args.coupons,
        args.workers,
        args.ttl,
        if args.unfenced {
            "none".into()
        } else {
            redact(args.lease_url.as_deref().unwrap_or_default())
        },
        args.data_url
            .as_deref()
            .map_or_else(|| "SQLite (temporary file)".into(), redact)
    );

    let exe = std::env::current_exe()?;
    let lists = request_lists(args.coupons, args.workers);
    let (tx, mut rx) = mpsc::unbounded_channel::<Line>();
    let mut results: HashMap<usize, String> = HashMap::new();

    // Worker 0 first: it freezes after it read `issued = coupons - 1`.
    let mut victim = spawn_worker(&exe, &args, &dir, 0, &lists[0], Some(args.coupons - 1), &tx)?;
    let freeze_deadline = tokio::time::sleep(Duration::from_secs(60));
    tokio::pin!(freeze_deadline);
    let frozen_line = loop {
        tokio::select! {
            Some((_, line)) = rx.recv() => {
                if line.starts_with("frozen ") {
                    break line;
                }
            }
            status = victim.child.wait() => {
                return Err(format!("worker 0 ended before its freeze point ({})", status?).into());
            }
            () = &mut freeze_deadline => {
                return Err("worker 0 did not reach its freeze point within 60 s".into());
            }
        }
    };
    let frozen_at = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !is_stopped(victim.pid) {
        if Instant::now() > deadline {
            return Err("worker 0 said it froze but is not stopped".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!("worker 0 is stopped ({frozen_line}); starting the others");

    let mut others = Vec::new();
    for (w, list) in lists.iter().enumerate().skip(1) {
        others.push(spawn_worker(&exe, &args, &dir, w, list, None, &tx)?);
    }
    drop(tx);
    // Resume worker 0 once the others are done (and never before three TTLs).
    let others_done = async {
        let mut ok = true;
        for o in &mut others {
            ok &= o.child.wait().await.map(|s| s.success()).unwrap_or(false);
        }
        ok
    };
    let mut others_ok = None;
    tokio::pin!(others_done);
    let cap = tokio::time::sleep(OTHERS_CAP);
    tokio::pin!(cap);
    loop {
        tokio::select! {
            ok = &mut others_done, if others_ok.is_none() => others_ok = Some(ok),
            Some((w, line)) = rx.recv() => {
                if let Some(r) = line.strip_prefix("result ") {
                    results.insert(w, r.to_owned());
                }
            }
            () = &mut cap => {
                println!("the other workers are still running after {OTHERS_CAP:?}: resuming worker 0 anyway");
                break;
            }
        }
        if others_ok.is_some() {
            break;
        }
    }
    let min_freeze = args.ttl * 3;
    tokio::time::sleep(min_freeze.saturating_sub(frozen_at.elapsed())).await;
    println!(
        "resuming worker 0 (SIGCONT) after {:.1} s frozen ({})",
        frozen_at.elapsed().as_secs_f64(),
        if args.unfenced {
            "no lease".to_owned()
        } else {
            format!("lease TTL {:?}", args.ttl)
        }
    );
    kill(victim.pid, Signal::SIGCONT)?;
    let victim_ok = victim.child.wait().await?.success();
    // Wait for the others too if the cap fired.
    let others_ok = match others_ok {
        Some(ok) => ok,
        None => others_done.await,
    };
    while let Some((w, line)) = rx.recv().await {
        if let Some(r) = line.strip_prefix("result ") {
            results.insert(w, r.to_owned());
        }
    }

    let totals = data.totals(&args.promo).await?;
    let sum = |field: &str| -> u64 {
        results
            .values()
            .flat_map(|r| r.split_whitespace())
            .filter_map(|kv| kv.split_once('='))
            .filter(|(k, _)| *k == field)
            .filter_map(|(_, v)| v.parse::<u64>().ok())
            .sum()
    };
    println!();
    println!(
        "coupons issued: {} of {} (counter says {})",
        totals.issued, args.coupons, totals.counter
    );
    println!(
        "requests holding more than one coupon: {}",
        totals.double_counted
    );
    println!(
        "duplicate deliveries skipped: {}; sold-out answers: {}",
        sum("duplicates"),
        sum("sold_out")
    );
    println!("stale writes rejected by the guard: {}", sum("rejected"));
    let overran = totals.issued > args.coupons || totals.counter != totals.issued;
    let workers_ok = victim_ok && others_ok && results.len() == args.workers;
    if !workers_ok {
        println!("a worker failed (see its output above)");
    }
    match (args.unfenced, overran || totals.double_counted > 0) {
        (false, false) => println!("fenced: exactly as many coupons as there are, none twice"),
        (false, true) => println!("fenced: OVERRUN or double count: this is a bug"),
        (true, true) => println!("unfenced: the overrun the lease and the guard prevent"),
        (true, false) => println!("unfenced: no overrun this time"),
    }
    println!(
        "summary mode={mode} coupons={} issued={} counter={} double_counted={} duplicates={} rejected_stale_writes={} sold_out={}",
        args.coupons,
        totals.issued,
        totals.counter,
        totals.double_counted,
        sum("duplicates"),
        sum("rejected"),
        sum("sold_out")
    );
    let fenced_bad =
        !args.unfenced && (overran || totals.double_counted > 0 || totals.issued != args.coupons);
    Ok(if fenced_bad || !workers_ok {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// `url` without its password, for printing.
fn redact(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => match rest.split_once('@') {
            Some((userinfo, host)) => {
                let user = userinfo.split(':').next().unwrap_or_default();
                format!("{scheme}://{user}@{host}")
            }
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(msg) => {
            eprintln!("{msg}");
            return ExitCode::from(2);
        }
    };
    let runtime = match args.worker {
        // A worker runs on one thread: a SIGSTOP catches it between two steps of a task.
        Some(_) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        None => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build(),
    };
    let runtime = match runtime {
        Ok(r) => r,
        Err(e) => {
            eprintln!("coupons: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let res = match args.worker {
        Some(me) => runtime
            .block_on(worker(args, me))
            .map(|()| ExitCode::SUCCESS),
        None => runtime.block_on(coordinate(args)),
    };
    match res {
        Ok(code) => code,
        Err(e) => {
            eprintln!("coupons: {e}");
            ExitCode::FAILURE
        }
    }
}
