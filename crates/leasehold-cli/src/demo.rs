//! `leasehold demo`: the paused-worker story, on the embedded SQLite store, made visible.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use leasehold::sqlite::{SqliteConfig, SqliteStore, guard};
use leasehold::{Fence, GuardDecision, LeaseClient, LeaseConfig, ResourceName};
use sqlx::SqlitePool;

use crate::failure::Failure;
use crate::parse_ttl;

pub(crate) const HELP: &str = "\
Two workers share one lease on the embedded SQLite store and issue invoices numbered from
a shared counter. Worker A takes the lease, reads the next invoice number and freezes (a
GC pause) past its TTL. The lease expires; worker B takes it, issues the invoice and moves
the counter on. A wakes up and writes the invoice it prepared: the guard sees A's old
fence and rejects the write. With --unfenced the guard is off and A's write lands: two
invoices with one number.

Exit status:
  0   the story ran (whatever its verdict)
  64  bad usage (flags, --ttl)
  69  the embedded store or the --html file failed

Examples:
  leasehold demo
  leasehold demo --unfenced --html timeline.html";

/// Arguments of `leasehold demo`.
#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Run the same story without the guard, to see the data corrupted.
    #[arg(long)]
    unfenced: bool,
    /// Write a timeline picture (HTML with SVG) to this file.
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
    /// The lease TTL of the story.
    #[arg(long, default_value = "1s", value_parser = parse_ttl)]
    ttl: Duration,
}

const RESOURCE: &str = "demo:invoices";

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Acquired,
    Frozen,
    Resumed,
    Lost,
    Accepted,
    Rejected,
    Released,
}

#[derive(Debug, Clone)]
struct Event {
    ms: f64,
    worker: &'static str,
    kind: Kind,
    fence: u64,
    text: String,
}

#[derive(Clone)]
struct Timeline {
    start: Instant,
    events: Arc<Mutex<Vec<Event>>>,
}

impl Timeline {
    fn record(&self, worker: &'static str, kind: Kind, fence: Fence, text: String) {
        let ms = self.start.elapsed().as_secs_f64() * 1000.0;
        println!("{:>8.0} ms  {worker}  {text}", ms);
        self.events.lock().unwrap().push(Event {
            ms,
            worker,
            kind,
            fence: fence.get(),
            text,
        });
    }
}

async fn next_number(pool: &SqlitePool) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT next FROM demo_counter WHERE name = 'invoice'")
        .fetch_one(pool)
        .await
}

/// Issues invoice `number` with `fence`: through the guard, or not. Returns whether the
/// write was accepted.
async fn issue(
    pool: &SqlitePool,
    fenced: bool,
    worker: &str,
    number: i64,
    fence: Fence,
) -> Result<GuardDecision, String> {
    let mut tx = pool.begin().await.map_err(|e| e.to_string())?;
    let decision = if fenced {
        let resource = ResourceName::new(RESOURCE).map_err(|e| e.to_string())?;
        guard::check_and_advance(&mut tx, &resource, fence)
            .await
            .map_err(|e| e.to_string())?
    } else {
        GuardDecision::Accepted { previous: None }
    };
    if decision.is_accepted() {
        sqlx::query("INSERT INTO demo_invoices (number, writer, fence) VALUES (?1, ?2, ?3)")
            .bind(number)
            .bind(worker)
            .bind(fence.get() as i64)
            .execute(&mut *tx)
            .await
            .map_err(|e| e.to_string())?;
        sqlx::query("UPDATE demo_counter SET next = ?1 WHERE name = 'invoice'")
            .bind(number + 1)
            .execute(&mut *tx)
            .await
            .map_err(|e| e.to_string())?;
        tx.commit().await.map_err(|e| e.to_string())?;
    }
    Ok(decision)
}

pub(crate) async fn demo(args: DemoArgs) -> Result<ExitCode, Failure> {
    let config =
        LeaseConfig::new(args.ttl).map_err(|e| Failure::Usage(format!("invalid --ttl: {e}")))?;
    run(args, config).await.map_err(Failure::Internal)
}

async fn run(args: DemoArgs, config: LeaseConfig) -> Result<ExitCode, String> {
    let dir = tempfile::tempdir().map_err(|e| format!("cannot make a temporary directory: {e}"))?;
    let store = SqliteStore::connect(SqliteConfig::new(dir.path().join("demo.db")))
        .await
        .map_err(|e| e.to_string())?;
    let pool = store.pool().clone();
    sqlx::raw_sql(
        "CREATE TABLE demo_invoices (number INTEGER NOT NULL, writer TEXT NOT NULL, fence INTEGER NOT NULL);
         CREATE TABLE demo_counter (name TEXT PRIMARY KEY, next INTEGER NOT NULL);
         INSERT INTO demo_counter VALUES ('invoice', 1);",
    )
    .execute(&pool)
    .await
    .map_err(|e| e.to_string())?;
    let store: Arc<dyn leasehold::Store> = Arc::new(store);
    let fenced = !args.unfenced;
    let timeline = Timeline {
        start: Instant::now(),
        events: Arc::default(),
    };
    let freeze = args.ttl * 5 / 2;
    println!(
        "leasehold demo ({}): lease TTL {:?}, worker A freezes for {:?}\n",
        if fenced { "fenced" } else { "UNFENCED" },
        args.ttl,
        freeze
    );

    // Worker A runs on its own thread and runtime, so freezing the thread freezes all of A.
    let (acquired_tx, acquired_rx) = tokio::sync::oneshot::channel::<Result<(), String>>();
    let worker_a = {
        let (store, config, pool, timeline) = (
            store.clone(),
            config.clone(),
            pool.clone(),
            timeline.clone(),
        );
        std::thread::spawn(move || -> Result<(), String> {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async move {
                let client = LeaseClient::new(store, config);
                let lease = match client.try_acquire(RESOURCE).await {
                    Ok(l) => l,
                    Err(e) => {
                        let _ = acquired_tx.send(Err(e.to_string()));
                        return Ok(());
                    }
                };
                let fence = lease.fence();
                timeline.record("A", Kind::Acquired, fence, format!("acquires the lease, fence {fence}"));
                let number = next_number(&pool).await.map_err(|e| e.to_string())?;
                timeline.record("A", Kind::Frozen, fence, format!("prepares invoice #{number} … and freezes (GC pause)"));
                let _ = acquired_tx.send(Ok(()));
                std::thread::sleep(freeze);
                let lost = lease.lost_reason();
                timeline.record("A", Kind::Resumed, fence, "wakes up".into());
                if let Some(reason) = lost {
                    timeline.record("A", Kind::Lost, fence, format!("its lost signal had fired: {reason}"));
                }
                // A careless (or already mid-write) worker writes anyway.
                match issue(&pool, fenced, "A", number, fence).await? {
                    GuardDecision::Accepted { .. } => timeline.record(
                        "A",
                        Kind::Accepted,
                        fence,
                        format!("writes invoice #{number} with fence {fence}: ACCEPTED"),
                    ),
                    GuardDecision::Rejected { current } => timeline.record(
                        "A",
                        Kind::Rejected,
                        fence,
                        format!("writes invoice #{number} with fence {fence}: REJECTED by the guard (fence {current} already accepted)"),
                    ),
                }
                let still = lease.release().await.unwrap_or(false);
                timeline.record("A", Kind::Released, fence, format!("releases: still held = {still}"));
                Ok(())
            })
        })
    };

    acquired_rx
        .await
        .map_err(|_| "worker A failed".to_string())??;
    let client = LeaseClient::new(store.clone(), config.clone());
    let lease = client
        .acquire(RESOURCE, args.ttl * 10)
        .await
        .map_err(|e| e.to_string())?;
    let fence = lease.fence();
    timeline.record(
        "B",
        Kind::Acquired,
        fence,
        format!("acquires the lease after A's expired, fence {fence}"),
    );
    let number = next_number(&pool).await.map_err(|e| e.to_string())?;
    match issue(&pool, fenced, "B", number, fence).await? {
        GuardDecision::Accepted { .. } => timeline.record(
            "B",
            Kind::Accepted,
            fence,
            format!("writes invoice #{number} with fence {fence}: ACCEPTED"),
        ),
        GuardDecision::Rejected { current } => timeline.record(
            "B",
            Kind::Rejected,
            fence,
            format!("write rejected (fence {current}): unexpected"),
        ),
    }
    tokio::time::sleep(freeze).await;
    let still = lease.release().await.map_err(|e| e.to_string())?;
    timeline.record(
        "B",
        Kind::Released,
        fence,
        format!("releases: still held = {still}"),
    );
    tokio::task::spawn_blocking(move || worker_a.join())
        .await
        .map_err(|e| e.to_string())?
        .map_err(|_| "worker A panicked".to_string())??;

    let rows: Vec<(i64, String, i64)> =
        sqlx::query_as("SELECT number, writer, fence FROM demo_invoices ORDER BY rowid")
            .fetch_all(&pool)
            .await
            .map_err(|e| e.to_string())?;
    println!("\ninvoices:");
    for (n, w, f) in &rows {
        println!("  #{n}  by {w}  fence {f}");
    }
    let mut numbers: Vec<i64> = rows.iter().map(|r| r.0).collect();
    numbers.sort_unstable();
    let duplicated = numbers.windows(2).any(|w| w[0] == w[1]);
    let verdict = if duplicated {
        "CORRUPTED: two invoices carry the same number — A's stale write landed after B's"
    } else {
        "consistent: every invoice number issued once — the guard rejected A's stale write"
    };
    println!("\n{verdict}");
    if let Some(path) = &args.html {
        let events = timeline.events.lock().unwrap().clone();
        let html = render_html(&events, fenced, verdict, args.ttl);
        std::fs::write(path, html).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        println!("timeline written to {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A self-contained HTML page with an SVG timeline: one lane per worker, holding and
/// frozen periods as bars, writes as dots (green accepted, red rejected).
fn render_html(events: &[Event], fenced: bool, verdict: &str, ttl: Duration) -> String {
    let end = events.iter().map(|e| e.ms).fold(0.0, f64::max).max(1.0) * 1.05;
    let (left, width) = (80.0, 820.0);
    let x = |ms: f64| left + ms / end * width;
    let lane = |w: &str| if w == "A" { 70.0 } else { 170.0 };
    let at = |w: &str, k: Kind| {
        events
            .iter()
            .find(|e| e.worker == w && e.kind == k)
            .map(|e| e.ms)
    };
    let mut svg = String::new();
    for w in ["A", "B"] {
        let y = lane(w);
        svg += &format!("<text x=\"20\" y=\"{}\" class=\"lane\">{w}</text>", y + 5.0);
        svg += &format!(
            "<line x1=\"{left}\" x2=\"{}\" y1=\"{y}\" y2=\"{y}\" class=\"axis\"/>",
            left + width
        );
        if let Some(start) = at(w, Kind::Acquired) {
            let fence = events.iter().find(|e| e.worker == w).map_or(0, |e| e.fence);
            // A believed it held the lease until its deadline (about one TTL); B until release.
            let stop = if w == "A" {
                start + ttl.as_secs_f64() * 1000.0
            } else {
                at(w, Kind::Released).unwrap_or(end)
            };
            svg += &format!(
                "<rect x=\"{:.1}\" y=\"{}\" width=\"{:.1}\" height=\"24\" class=\"held\"><title>lease held, fence {fence}</title></rect>",
                x(start),
                y - 12.0,
                (x(stop) - x(start)).max(1.0)
            );
            svg += &format!(
                "<text x=\"{:.1}\" y=\"{}\" class=\"label\">fence {fence}</text>",
                x(start) + 4.0,
                y - 18.0
            );
        }
        if let (Some(a), Some(b)) = (at(w, Kind::Frozen), at(w, Kind::Resumed)) {
            svg += &format!(
                "<rect x=\"{:.1}\" y=\"{}\" width=\"{:.1}\" height=\"8\" class=\"frozen\"><title>process frozen</title></rect>",
                x(a),
                y + 14.0,
                x(b) - x(a)
            );
            svg += &format!(
                "<text x=\"{:.1}\" y=\"{}\" class=\"label\">A frozen: no code runs, no renewals</text>",
                x(a) + 4.0,
                y + 36.0
            );
        }
        for e in events.iter().filter(|e| e.worker == w) {
            let (class, label) = match e.kind {
                Kind::Accepted => ("ok", "write accepted"),
                Kind::Rejected => ("rejected", "write rejected"),
                Kind::Lost => ("lost", "A learns: lost"),
                _ => continue,
            };
            svg += &format!(
                "<circle cx=\"{:.1}\" cy=\"{y}\" r=\"8\" class=\"{class}\"><title>{}</title></circle><text x=\"{:.1}\" y=\"{}\" class=\"label\">{label}</text>",
                x(e.ms),
                esc(&e.text),
                x(e.ms) - 30.0,
                y + 46.0 - if class == "lost" { 64.0 } else { 0.0 }
            );
        }
    }
    if let Some(start) = at("A", Kind::Acquired) {
        let t = x(start + ttl.as_secs_f64() * 1000.0);
        svg += &format!(
            "<line x1=\"{t:.1}\" x2=\"{t:.1}\" y1=\"35\" y2=\"225\" class=\"deadline\"/><text x=\"{:.1}\" y=\"30\" class=\"label\">A's lease expires in the store</text>",
            t - 60.0
        );
    }
    for i in 0..=5 {
        let ms = end / 5.0 * f64::from(i);
        svg += &format!(
            "<text x=\"{:.1}\" y=\"250\" class=\"tick\">{:.1} s</text>",
            x(ms) - 10.0,
            ms / 1000.0
        );
    }
    let rows: String = events
        .iter()
        .map(|e| {
            format!(
                "<tr><td>{:.0} ms</td><td>{}</td><td>{}</td></tr>",
                e.ms,
                e.worker,
                esc(&e.text)
            )
        })
        .collect();
    format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>leasehold demo</title><style>
body{{font-family:system-ui,sans-serif;margin:2em;color:#222}} .lane{{font-weight:bold;font-size:20px}}
.axis{{stroke:#999}} .held{{fill:#7aa7e0}} .frozen{{fill:#888}} .deadline{{stroke:#d62828;stroke-dasharray:4 3}} .ok{{fill:#2a9d3a}}
.rejected{{fill:#d62828}} .lost{{fill:#f4a300}} .label{{font-size:12px}} .tick{{font-size:11px;fill:#666}}
td{{padding:2px 10px;white-space:nowrap}} .verdict{{font-size:18px;font-weight:bold;color:{}}}
</style></head><body><h1>leasehold demo — {}</h1>
<svg width=\"940\" height=\"270\" viewBox=\"0 0 940 270\">{svg}</svg>
<p class=\"verdict\">{}</p><table>{rows}</table></body></html>\n",
        if fenced { "#2a9d3a" } else { "#d62828" },
        if fenced { "fenced writes" } else { "unfenced writes" },
        esc(verdict)
    )
}
