//! `leasehold demo`: the paused-worker story, on the embedded SQLite store, made visible.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use leasehold::sqlite::{SqliteConfig, SqliteStore, Synchronous, guard};
use leasehold::{Fence, GuardDecision, LeaseClient, LeaseConfig, ResourceName};
use sqlx::SqlitePool;

use crate::failure::Failure;

pub(crate) const HELP: &str = "\
Two workers share one lease on the embedded SQLite store and issue invoices numbered from
a shared counter. Worker A takes the lease, reads the next invoice number and freezes (a
GC pause) past its TTL. The lease expires; worker B takes it, issues the invoice and moves
the counter on. A wakes up and writes the invoice it prepared: the guard sees A's old
fence and rejects the write. With --unfenced the guard is off and A's write lands: two
invoices with one number.

--html FILE draws the story as a timeline with a legend: leases held, A's pause, the
writes (the stale one rejected, or drawn as CORRUPTION), and where A learns it lost the
lease. Fences show their last digits; hover for the full value.

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
    /// The lease TTL of the story (100ms to 24h).
    #[arg(long, default_value = "1s", value_parser = parse_demo_ttl)]
    ttl: Duration,
}

/// The demo's `--ttl`: 100ms to 24h. Each store call of the story gets half the TTL
/// (see [`demo`]); below 100 ms, that is too little for SQLite on a busy machine, and the
/// story would end in a timeout instead of being told.
fn parse_demo_ttl(s: &str) -> Result<Duration, String> {
    crate::parse_in(
        s,
        (Duration::from_millis(100), "100ms"),
        (leasehold::config::MAX_TTL, "24h"),
    )
}

const RESOURCE: &str = "demo:invoices";

/// The longest B may take to get the expired lease and write, and so the longest A's
/// pause waits past `freeze` for B's write: generous, for a starved machine.
const B_BOUND: Duration = Duration::from_secs(60);

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

/// One thing that happened in the story, as the timeline draws it.
#[derive(Debug, Clone)]
struct Event {
    /// Milliseconds since the story began.
    ms: f64,
    worker: &'static str,
    kind: Kind,
    fence: u64,
    /// The invoice number a write (accepted or rejected) carried.
    invoice: Option<i64>,
    text: String,
}

#[derive(Clone)]
struct Timeline {
    start: Instant,
    events: Arc<Mutex<Vec<Event>>>,
}

impl Timeline {
    fn record(&self, worker: &'static str, kind: Kind, fence: Fence, text: String) {
        self.record_write(worker, kind, fence, None, text);
    }

    /// Records an event; `invoice` is the number a write carried.
    fn record_write(
        &self,
        worker: &'static str,
        kind: Kind,
        fence: Fence,
        invoice: Option<i64>,
        text: String,
    ) {
        let ms = self.start.elapsed().as_secs_f64() * 1000.0;
        println!("{:>8.0} ms  {worker}  {text}", ms);
        self.events.lock().unwrap().push(Event {
            ms,
            worker,
            kind,
            fence: fence.get(),
            invoice,
            text,
        });
    }
}

async fn next_number(pool: &SqlitePool) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT next FROM demo_counter WHERE name = 'invoice'")
        .fetch_one(pool)
        .await
}

/// Waits (at most [`B_BOUND`]) until every connection of `pool` is back in it, idle.
///
/// A store call that timed out on a starved machine (and was retried) drops its
/// connection in the middle of a transaction; the pool rolls it back in a task on the
/// runtime of the caller. Worker A's runtime is about to freeze: that task must run
/// first, or the connection would keep SQLite's write lock through A's pause and B could
/// never take the lease.
async fn settle(pool: &SqlitePool) {
    let until = Instant::now() + B_BOUND;
    while pool.num_idle() < pool.size() as usize && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
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
    // Store calls bounded by half the TTL, not the default sixth (167 ms for the default
    // 1 s): on a starved machine (a CI runner, two cores under a parallel test run) a
    // SQLite call can take longer than that, and the story would end in a timeout. Renewals
    // come every quarter TTL so that a renewal still fits in the TTL. An acquire whose
    // reply timed out is retried (with the same owner) many times rather than twice.
    let config = LeaseConfig::builder(args.ttl)
        .renew_interval(args.ttl / 4)
        .op_timeout(args.ttl / 2)
        .ambiguous_retries(20)
        .build()
        .map_err(|e| Failure::Usage(format!("invalid --ttl: {e}")))?;
    run(args, config).await.map_err(Failure::Internal)
}

async fn run(args: DemoArgs, config: LeaseConfig) -> Result<ExitCode, String> {
    let dir = tempfile::tempdir().map_err(|e| format!("cannot make a temporary directory: {e}"))?;
    // A throwaway database in a temporary directory: no commit needs to survive a power
    // loss, and a commit that waits for no fsync keeps the story's timing (and a release
    // on a loaded machine) far inside its bounds.
    let store = SqliteStore::connect(
        SqliteConfig::new(dir.path().join("demo.db")).synchronous(Synchronous::Normal),
    )
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
        "leasehold demo ({}): lease TTL {:?}, worker A freezes for at least {:?}\n",
        if fenced { "fenced" } else { "UNFENCED" },
        args.ttl,
        freeze
    );

    // Worker A runs on its own thread and runtime, so freezing the thread freezes all of A.
    let (acquired_tx, acquired_rx) = tokio::sync::oneshot::channel::<Result<(), String>>();
    // B's write is done (or B gave up: the sender is dropped). A's pause lasts at least
    // `freeze` and until then, so the story is the same on a loaded machine, where B may
    // take longer than the pause to get the expired lease.
    let (b_wrote_tx, b_wrote_rx) = std::sync::mpsc::channel::<()>();
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
                settle(&pool).await;
                timeline.record("A", Kind::Frozen, fence, format!("prepares invoice #{number} … and freezes (GC pause)"));
                let _ = acquired_tx.send(Ok(()));
                std::thread::sleep(freeze);
                let _ = b_wrote_rx.recv_timeout(B_BOUND);
                let lost = lease.lost_reason();
                timeline.record("A", Kind::Resumed, fence, "wakes up".into());
                if let Some(reason) = lost {
                    timeline.record("A", Kind::Lost, fence, format!("its lost signal had fired: {reason}"));
                }
                // A careless (or already mid-write) worker writes anyway.
                match issue(&pool, fenced, "A", number, fence).await? {
                    GuardDecision::Accepted { .. } => timeline.record_write(
                        "A",
                        Kind::Accepted,
                        fence,
                        Some(number),
                        format!("writes invoice #{number} with fence {fence}: ACCEPTED"),
                    ),
                    GuardDecision::Rejected { current } => timeline.record_write(
                        "A",
                        Kind::Rejected,
                        fence,
                        Some(number),
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
        .acquire(RESOURCE, (args.ttl * 10).max(B_BOUND))
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
        GuardDecision::Accepted { .. } => timeline.record_write(
            "B",
            Kind::Accepted,
            fence,
            Some(number),
            format!("writes invoice #{number} with fence {fence}: ACCEPTED"),
        ),
        GuardDecision::Rejected { current } => timeline.record_write(
            "B",
            Kind::Rejected,
            fence,
            Some(number),
            format!("write rejected (fence {current}): unexpected"),
        ),
    }
    let _ = b_wrote_tx.send(());
    tokio::time::sleep(freeze).await;
    // A release that fails (a store call timing out on a starved machine) leaves the
    // lease to expire after its TTL; the story has been told by then.
    let released = match lease.release().await {
        Ok(still) => format!("releases: still held = {still}"),
        Err(e) => format!("release failed ({e}); the lease expires after its TTL"),
    };
    timeline.record("B", Kind::Released, fence, released);
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

/// The picture's size, and its plot's left edge and width, in SVG units.
const SVG_WIDTH: f64 = 940.0;
const SVG_HEIGHT: f64 = 340.0;
const LEFT: f64 = 80.0;
const PLOT_WIDTH: f64 = 820.0;
/// The lanes' heights, the time axis's and the legend's first row's.
const LANE_A: f64 = 90.0;
const LANE_B: f64 = 190.0;
const AXIS_Y: f64 = 262.0;
const LEGEND_Y: f64 = 305.0;
/// A 12px label's advance per character: an upper bound for the system-ui fonts, so a
/// label's box ([`Label::bbox`]) holds the drawn text.
const CHAR_WIDTH: f64 = 7.0;
/// The most ticks on the time axis.
const MAX_TICKS: u64 = 8;

/// What a mark on the timeline stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// A write accepted, carrying an invoice number not issued before.
    Accepted,
    /// A write the guard rejected: its fence was stale.
    Rejected,
    /// The worker learns that its lease was lost.
    Lost,
    /// A write accepted whose invoice number was issued already: the corruption.
    Corrupting,
}

impl Role {
    const ALL: [Self; 4] = [Self::Accepted, Self::Rejected, Self::Lost, Self::Corrupting];

    /// Its CSS class and `data-role`.
    fn class(self) -> &'static str {
        match self {
            Self::Accepted => "ok",
            Self::Rejected => "rejected",
            Self::Lost => "lost",
            Self::Corrupting => "corrupt",
        }
    }

    /// What the legend says of it.
    fn meaning(self) -> &'static str {
        match self {
            Self::Accepted => "write accepted",
            Self::Rejected => "stale write rejected by the guard",
            Self::Lost => "worker learns: lease lost",
            Self::Corrupting => "stale write accepted: data corrupted",
        }
    }

    /// Its SVG shape, centred on (`cx`, `cy`) within radius `r`.
    fn shape(self, cx: f64, cy: f64, r: f64) -> String {
        let class = self.class();
        match self {
            Self::Accepted => {
                format!("<circle cx=\"{cx:.1}\" cy=\"{cy:.1}\" r=\"{r}\" class=\"{class}\"/>")
            }
            // A "no entry" sign: the guard stopped the write.
            Self::Rejected => {
                let d = r * 0.6;
                format!(
                    "<circle cx=\"{cx:.1}\" cy=\"{cy:.1}\" r=\"{r}\" class=\"{class}\"/><path d=\"M{:.1} {:.1}L{:.1} {:.1}M{:.1} {:.1}L{:.1} {:.1}\" class=\"cross\"/>",
                    cx - d,
                    cy - d,
                    cx + d,
                    cy + d,
                    cx - d,
                    cy + d,
                    cx + d,
                    cy - d
                )
            }
            Self::Lost => format!(
                "<polygon points=\"{:.1},{:.1} {:.1},{:.1} {:.1},{:.1} {:.1},{:.1}\" class=\"{class}\"/>",
                cx,
                cy - r,
                cx + r,
                cy,
                cx,
                cy + r,
                cx - r,
                cy
            ),
            // An eight-pointed burst.
            Self::Corrupting => {
                let points: Vec<String> = (0..16)
                    .map(|i| {
                        let radius = if i % 2 == 0 { r } else { r * 0.45 };
                        let angle = std::f64::consts::PI / 8.0 * f64::from(i);
                        format!(
                            "{:.1},{:.1}",
                            cx + radius * angle.sin(),
                            cy - radius * angle.cos()
                        )
                    })
                    .collect();
                format!(
                    "<polygon points=\"{}\" class=\"{class}\"/>",
                    points.join(" ")
                )
            }
        }
    }
}

/// A rectangle: left, top, right, bottom (for the tests' overlap checks).
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq)]
struct Rect {
    x0: f64,
    y0: f64,
    x1: f64,
    y1: f64,
}

#[cfg(test)]
impl Rect {
    fn overlaps(&self, other: &Rect) -> bool {
        self.x0 < other.x1 && other.x0 < self.x1 && self.y0 < other.y1 && other.y0 < self.y1
    }
}

/// A 12px text label, placed by the left end of its baseline.
#[derive(Debug, Clone, PartialEq)]
struct Label {
    x: f64,
    y: f64,
    text: String,
}

impl Label {
    /// A label of `text` centred under or over `cx`, kept inside the picture.
    fn centred(cx: f64, y: f64, text: String) -> Self {
        let width = Self::width_of(&text);
        Self {
            x: (cx - width / 2.0).clamp(2.0, SVG_WIDTH - width - 2.0),
            y,
            text,
        }
    }

    /// A label of `text` starting at `x`, moved left if it would leave the picture.
    fn starting(x: f64, y: f64, text: String) -> Self {
        let width = Self::width_of(&text);
        Self {
            x: x.clamp(2.0, SVG_WIDTH - width - 2.0),
            y,
            text,
        }
    }

    fn width_of(text: &str) -> f64 {
        CHAR_WIDTH * text.chars().count() as f64
    }

    /// The box its text fits in.
    #[cfg(test)]
    fn bbox(&self) -> Rect {
        Rect {
            x0: self.x,
            y0: self.y - 12.0,
            x1: self.x + Self::width_of(&self.text),
            y1: self.y + 4.0,
        }
    }

    fn svg(&self, class: &str) -> String {
        format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" class=\"{class}\">{}</text>",
            self.x,
            self.y,
            esc(&self.text)
        )
    }
}

/// A mark: a shape of `role` centred on (`cx`, `cy`) within radius `r`, its label, and
/// what hovering over it shows.
#[derive(Debug, Clone, PartialEq)]
struct Mark {
    role: Role,
    worker: &'static str,
    cx: f64,
    cy: f64,
    r: f64,
    label: Label,
    title: String,
}

#[cfg(test)]
impl Mark {
    fn bbox(&self) -> Rect {
        Rect {
            x0: self.cx - self.r,
            y0: self.cy - self.r,
            x1: self.cx + self.r,
            y1: self.cy + self.r,
        }
    }
}

/// A bar: a lease held (`held`) or a worker frozen (`frozen`).
#[derive(Debug, Clone, PartialEq)]
struct Bar {
    class: &'static str,
    x: f64,
    y: f64,
    width: f64,
    height: f64,
    title: String,
}

/// A fence as the picture shows it: its last digits (see [`fence_digits`]), the full
/// value on hover.
#[derive(Debug, Clone, PartialEq)]
struct FenceTag {
    label: Label,
    full: u64,
}

/// A tick on the time axis, every [`tick_step`] from 0.
#[derive(Debug, Clone, PartialEq)]
struct Tick {
    ms: u64,
    x: f64,
    label: String,
}

/// What a legend entry shows before its words.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Swatch {
    Bar(&'static str),
    Line(&'static str),
    Mark(Role),
}

/// A legend entry: its swatch at (`x`, `label.y`), its words after it.
#[derive(Debug, Clone, PartialEq)]
struct LegendEntry {
    swatch: Swatch,
    x: f64,
    label: Label,
}

/// The timeline picture as data: every position the SVG draws, so that tests can check
/// the picture (no overlaps, round ticks, a legend) without reading pixels.
#[derive(Debug, Clone, PartialEq)]
struct Layout {
    /// The time at the plot's right edge.
    end_ms: f64,
    bars: Vec<Bar>,
    fences: Vec<FenceTag>,
    marks: Vec<Mark>,
    /// Dashed links from a write to the later write that issued its number again:
    /// (x1, y1, x2, y2, what hovering says).
    duplicates: Vec<(f64, f64, f64, f64, String)>,
    /// The line where A's lease expires in the store, and its label.
    deadline: Option<(f64, Label)>,
    /// Words on the picture that belong to no mark ("A frozen: …").
    notes: Vec<Label>,
    ticks: Vec<Tick>,
    legend: Vec<LegendEntry>,
}

/// The time axis's step, in ms: a round value (1, 2, 2.5 or 5 times a power of ten) that
/// puts at most [`MAX_TICKS`] ticks on `0..=end_ms`.
fn tick_step(end_ms: f64) -> u64 {
    let mut power = 1u64;
    loop {
        // 2.5 ms is no whole number of ms: 2.5 from 25 ms on.
        let quarter = (power >= 10).then(|| power / 10 * 25);
        for step in [Some(power), Some(power * 2), quarter, Some(power * 5)]
            .into_iter()
            .flatten()
        {
            // Ticks at 0, step, 2 step, …: one more than the whole steps in end_ms.
            let whole_steps = (end_ms / step as f64).floor() as u64;
            if whole_steps < MAX_TICKS {
                return step;
            }
        }
        power = power.saturating_mul(10);
    }
}

/// A tick's words: seconds ("0 s", "0.5 s", "1 s", "2.5 s"), or ms under a 100 ms step.
fn tick_label(ms: u64, step: u64) -> String {
    if step < 100 {
        format!("{ms} ms")
    } else {
        // Whole ms, so the shortest decimal is at most three places.
        format!("{} s", ms as f64 / 1000.0)
    }
}

/// How many last digits show the fences: as few as keep them apart and in order (the
/// digits before are the same in every fence), at least 2; all of them when the fences
/// differ in length.
fn fence_digits(fences: &[u64]) -> usize {
    let texts: Vec<String> = fences.iter().map(u64::to_string).collect();
    let Some(first) = texts.first() else {
        return 0;
    };
    if texts.iter().any(|t| t.len() != first.len()) {
        return first
            .len()
            .max(texts.iter().map(String::len).max().unwrap_or(0));
    }
    let common = (0..first.len())
        .take_while(|&i| texts.iter().all(|t| t.as_bytes()[i] == first.as_bytes()[i]))
        .count();
    (first.len() - common).max(2).min(first.len())
}

/// `fence`'s last `digits` digits, `…` before them when some are left out.
fn short_fence(fence: u64, digits: usize) -> String {
    let text = fence.to_string();
    if digits >= text.len() {
        text
    } else {
        format!("…{}", &text[text.len() - digits..])
    }
}

/// Lays the story's `events` out: lanes for A and B, leases held and A's pause as bars,
/// writes and A's learning of the loss as marks, A's expiry as a line, round ticks, a
/// legend.
fn layout(events: &[Event], ttl: Duration) -> Layout {
    let mut events = events.to_vec();
    events.sort_by(|a, b| a.ms.total_cmp(&b.ms));
    let end_ms = events.iter().map(|e| e.ms).fold(0.0, f64::max).max(1.0) * 1.05;
    let x = |ms: f64| LEFT + ms / end_ms * PLOT_WIDTH;
    let lane = |w: &str| if w == "A" { LANE_A } else { LANE_B };
    let at = |w: &str, k: Kind| {
        events
            .iter()
            .find(|e| e.worker == w && e.kind == k)
            .map(|e| e.ms)
    };
    let ttl_ms = ttl.as_secs_f64() * 1000.0;
    let acquired: Vec<&Event> = events.iter().filter(|e| e.kind == Kind::Acquired).collect();
    let digits = fence_digits(&acquired.iter().map(|e| e.fence).collect::<Vec<_>>());

    let mut bars = Vec::new();
    let mut fences = Vec::new();
    let mut notes = Vec::new();
    for e in &acquired {
        let y = lane(e.worker);
        // A believed it held the lease until its deadline (about one TTL); B until release.
        let stop = if e.worker == "A" {
            e.ms + ttl_ms
        } else {
            at(e.worker, Kind::Released).unwrap_or(end_ms)
        };
        bars.push(Bar {
            class: "held",
            x: x(e.ms),
            y: y - 12.0,
            width: (x(stop) - x(e.ms)).max(1.0),
            height: 24.0,
            title: format!("{} holds the lease, fence {}", e.worker, e.fence),
        });
        // Over the bar's start; ending at it when there is room on its left, so that
        // nothing drawn from the bar's start up to the right (a duplicate's link) runs
        // through it.
        let text = format!("fence {}", short_fence(e.fence, digits));
        let width = Label::width_of(&text);
        let left_of = x(e.ms) - 6.0 - width;
        fences.push(FenceTag {
            label: Label {
                x: if left_of >= LEFT {
                    left_of
                } else {
                    x(e.ms) + 4.0
                },
                y: y - 18.0,
                text,
            },
            full: e.fence,
        });
    }
    for w in ["A", "B"] {
        if let (Some(a), Some(b)) = (at(w, Kind::Frozen), at(w, Kind::Resumed)) {
            let y = lane(w);
            bars.push(Bar {
                class: "frozen",
                x: x(a),
                y: y + 14.0,
                width: x(b) - x(a),
                height: 8.0,
                title: format!("{w} frozen"),
            });
            notes.push(Label {
                x: x(a) + 4.0,
                y: y + 36.0,
                text: format!("{w} frozen: no code runs, no renewals"),
            });
        }
    }

    let mut marks: Vec<Mark> = Vec::new();
    let mut duplicates = Vec::new();
    // Invoice numbers issued so far, and where their write is drawn.
    let mut issued: Vec<(i64, f64, f64)> = Vec::new();
    for e in &events {
        let (cx, y) = (x(e.ms), lane(e.worker));
        let mark = match (e.kind, e.invoice) {
            (Kind::Accepted, Some(n)) => {
                if let Some(&(_, x1, y1)) = issued.iter().find(|(m, ..)| *m == n) {
                    duplicates.push((x1, y1, cx, y, format!("both invoices carry #{n}")));
                    Mark {
                        role: Role::Corrupting,
                        worker: e.worker,
                        cx,
                        cy: y,
                        r: 11.0,
                        // Starting under the burst and running right, clear of the
                        // link that comes in from the earlier write on the left.
                        label: Label::starting(
                            cx - 12.0,
                            y + 56.0,
                            format!("CORRUPTION: invoice #{n} issued twice"),
                        ),
                        title: e.text.clone(),
                    }
                } else {
                    issued.push((n, cx, y));
                    Mark {
                        role: Role::Accepted,
                        worker: e.worker,
                        cx,
                        cy: y,
                        r: 8.0,
                        label: Label::centred(cx, y + 56.0, "write accepted".into()),
                        title: e.text.clone(),
                    }
                }
            }
            (Kind::Rejected, _) => Mark {
                role: Role::Rejected,
                worker: e.worker,
                cx,
                cy: y,
                r: 8.0,
                label: Label::centred(cx, y + 56.0, "stale write rejected".into()),
                title: e.text.clone(),
            },
            // Above the lane, so the write that follows at once stays in sight; its words
            // on the right of it (on the left near the edge).
            (Kind::Lost, _) => {
                let text = format!("{} learns: lost", e.worker);
                let width = Label::width_of(&text);
                let lx = if cx + 12.0 + width <= SVG_WIDTH {
                    cx + 12.0
                } else {
                    cx - 12.0 - width
                };
                Mark {
                    role: Role::Lost,
                    worker: e.worker,
                    cx,
                    cy: y - 38.0,
                    r: 7.0,
                    label: Label {
                        x: lx,
                        y: y - 34.0,
                        text,
                    },
                    title: e.text.clone(),
                }
            }
            _ => continue,
        };
        marks.push(mark);
    }

    let deadline = at("A", Kind::Acquired).map(|start| {
        let t = x(start + ttl_ms);
        (
            t,
            Label::centred(t, 40.0, "A's lease expires in the store".into()),
        )
    });

    let step = tick_step(end_ms);
    let ticks = (0..)
        .map(|k| k * step)
        .take_while(|&ms| ms as f64 <= end_ms)
        .map(|ms| Tick {
            ms,
            x: x(ms as f64),
            label: tick_label(ms, step),
        })
        .collect();

    let mut swatches = vec![
        (Swatch::Bar("held"), "lease held (believed held, for A)"),
        (Swatch::Bar("frozen"), "worker frozen"),
        (Swatch::Line("deadline"), "A's lease expires"),
    ];
    for role in Role::ALL {
        if marks.iter().any(|m| m.role == role) {
            swatches.push((Swatch::Mark(role), role.meaning()));
        }
    }
    let mut legend = Vec::new();
    let (mut lx, mut ly) = (LEFT, LEGEND_Y);
    for (swatch, text) in swatches {
        let width = 22.0 + Label::width_of(text);
        if lx + width > SVG_WIDTH {
            lx = LEFT;
            ly += 20.0;
        }
        legend.push(LegendEntry {
            swatch,
            x: lx,
            label: Label {
                x: lx + 22.0,
                y: ly,
                text: text.to_owned(),
            },
        });
        lx += width + 18.0;
    }

    Layout {
        end_ms,
        bars,
        fences,
        marks,
        duplicates,
        deadline,
        notes,
        ticks,
        legend,
    }
}

/// The SVG of a [`Layout`]. Marks, ticks and legend entries carry their coordinates as
/// `data-` attributes too, so a test can check the picture from the file.
fn render_svg(layout: &Layout) -> String {
    let mut svg = String::new();
    for (w, y) in [("A", LANE_A), ("B", LANE_B)] {
        svg += &format!(
            "<text x=\"20\" y=\"{}\" class=\"lane\">{w}</text><line x1=\"{LEFT}\" x2=\"{}\" y1=\"{y}\" y2=\"{y}\" class=\"axis\"/>",
            y + 5.0,
            LEFT + PLOT_WIDTH
        );
    }
    for b in &layout.bars {
        svg += &format!(
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{}\" class=\"{}\"><title>{}</title></rect>",
            b.x,
            b.y,
            b.width,
            b.height,
            b.class,
            esc(&b.title)
        );
    }
    for f in &layout.fences {
        svg += &format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" class=\"label fence\" data-fence=\"{}\">{}<title>fence {}</title></text>",
            f.label.x,
            f.label.y,
            f.full,
            esc(&f.label.text),
            f.full
        );
    }
    for n in &layout.notes {
        svg += &n.svg("label");
    }
    if let Some((t, label)) = &layout.deadline {
        svg += &format!(
            "<line x1=\"{t:.1}\" x2=\"{t:.1}\" y1=\"45\" y2=\"{}\" class=\"deadline\"/>{}",
            AXIS_Y - 12.0,
            label.svg("label")
        );
    }
    for (x1, y1, x2, y2, title) in &layout.duplicates {
        svg += &format!(
            "<line x1=\"{x1:.1}\" y1=\"{y1:.1}\" x2=\"{x2:.1}\" y2=\"{y2:.1}\" class=\"dup\"><title>{}</title></line>",
            esc(title)
        );
    }
    for m in &layout.marks {
        svg += &format!(
            "<g class=\"mark\" data-role=\"{}\" data-worker=\"{}\" data-cx=\"{:.1}\" data-cy=\"{:.1}\" data-r=\"{}\"><title>{}</title>{}{}</g>",
            m.role.class(),
            m.worker,
            m.cx,
            m.cy,
            m.r,
            esc(&m.title),
            m.role.shape(m.cx, m.cy, m.r),
            m.label.svg(if m.role == Role::Corrupting {
                "label corrupt-label"
            } else {
                "label"
            })
        );
    }
    svg += &format!(
        "<line x1=\"{LEFT}\" x2=\"{}\" y1=\"{AXIS_Y}\" y2=\"{AXIS_Y}\" class=\"axis\"/>",
        LEFT + PLOT_WIDTH
    );
    for t in &layout.ticks {
        svg += &format!(
            "<line x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{AXIS_Y}\" y2=\"{}\" class=\"axis\"/><text x=\"{x:.1}\" y=\"{}\" class=\"tick\" data-ms=\"{}\">{}</text>",
            AXIS_Y + 5.0,
            AXIS_Y + 18.0,
            t.ms,
            esc(&t.label),
            x = t.x
        );
    }
    svg += "<g class=\"legend\">";
    for entry in &layout.legend {
        let (x, y) = (entry.x, entry.label.y - 4.0);
        let swatch = match entry.swatch {
            Swatch::Bar(class) => format!(
                "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"16\" height=\"10\" class=\"{class}\"/>",
                y - 5.0
            ),
            Swatch::Line(class) => format!(
                "<line x1=\"{:.1}\" x2=\"{:.1}\" y1=\"{:.1}\" y2=\"{:.1}\" class=\"{class}\"/>",
                x + 8.0,
                x + 8.0,
                y - 8.0,
                y + 8.0
            ),
            Swatch::Mark(role) => role.shape(x + 8.0, y, 6.0),
        };
        let role = match entry.swatch {
            Swatch::Bar(c) | Swatch::Line(c) => c,
            Swatch::Mark(r) => r.class(),
        };
        svg += &format!(
            "<g class=\"legend-entry\" data-role=\"{role}\">{swatch}{}</g>",
            entry.label.svg("label")
        );
    }
    svg += "</g>";
    svg
}

/// A self-contained HTML page: the SVG timeline (see [`layout`]) with its legend, the
/// verdict, and every event as a table row.
fn render_html(events: &[Event], fenced: bool, verdict: &str, ttl: Duration) -> String {
    let svg = render_svg(&layout(events, ttl));
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
.axis{{stroke:#999}} .held{{fill:#7aa7e0}} .frozen{{fill:#888}} .deadline{{stroke:#d62828;stroke-dasharray:4 3}}
.ok{{fill:#2a9d3a}} .rejected{{fill:#fff;stroke:#d62828;stroke-width:2.5}} .cross{{stroke:#d62828;stroke-width:2.5}}
.lost{{fill:#f4a300}} .corrupt{{fill:#6a0dad;stroke:#000;stroke-width:1}} .dup{{stroke:#6a0dad;stroke-width:2;stroke-dasharray:6 4}}
.label{{font-size:12px}} .corrupt-label{{font-weight:bold;fill:#6a0dad}} .tick{{font-size:11px;fill:#666;text-anchor:middle}}
td{{padding:2px 10px;white-space:nowrap}} .verdict{{font-size:18px;font-weight:bold;color:{}}}
</style></head><body><h1>leasehold demo — {}</h1>
<svg width=\"{SVG_WIDTH}\" height=\"{SVG_HEIGHT}\" viewBox=\"0 0 {SVG_WIDTH} {SVG_HEIGHT}\" role=\"img\" aria-label=\"timeline of the demo\">{svg}</svg>
<p class=\"verdict\">{}</p><table>{rows}</table></body></html>\n",
        if fenced { "#2a9d3a" } else { "#d62828" },
        if fenced { "fenced writes" } else { "unfenced writes" },
        esc(verdict)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const FENCE_A: u64 = 1_796_334_754_202_461;
    const FENCE_B: u64 = 1_796_334_755_118_817;

    fn event(ms: f64, worker: &'static str, kind: Kind, invoice: Option<i64>) -> Event {
        Event {
            ms,
            worker,
            kind,
            fence: if worker == "A" { FENCE_A } else { FENCE_B },
            invoice,
            text: format!("{worker} {kind:?}"),
        }
    }

    /// The story as `run` records it: A learns of the loss and writes in the same
    /// millisecond (the marker must not hide under the write).
    fn story(fenced: bool) -> Vec<Event> {
        let a_write = if fenced {
            Kind::Rejected
        } else {
            Kind::Accepted
        };
        vec![
            event(0.4, "A", Kind::Acquired, None),
            event(1.0, "A", Kind::Frozen, None),
            event(1003.0, "B", Kind::Acquired, None),
            event(1010.0, "B", Kind::Accepted, Some(1)),
            event(2503.0, "A", Kind::Resumed, None),
            event(2503.2, "A", Kind::Lost, None),
            event(2503.9, "A", a_write, Some(1)),
            event(2510.0, "A", Kind::Released, None),
            event(3512.0, "B", Kind::Released, None),
        ]
    }

    fn both() -> [(bool, Layout); 2] {
        [true, false].map(|fenced| (fenced, layout(&story(fenced), Duration::from_secs(1))))
    }

    fn inside(r: &Rect) -> bool {
        r.x0 >= 0.0 && r.y0 >= 0.0 && r.x1 <= SVG_WIDTH && r.y1 <= SVG_HEIGHT
    }

    #[test]
    fn the_legend_names_everything_drawn() {
        for (fenced, l) in both() {
            let has = |s: Swatch| l.legend.iter().any(|e| e.swatch == s);
            assert!(
                has(Swatch::Bar("held")) && has(Swatch::Bar("frozen")),
                "{fenced}"
            );
            assert!(has(Swatch::Line("deadline")), "{fenced}");
            for m in &l.marks {
                assert!(
                    has(Swatch::Mark(m.role)),
                    "{fenced}: {:?} not in the legend",
                    m.role
                );
            }
            // Nothing in the legend that is not drawn.
            for e in &l.legend {
                if let Swatch::Mark(role) = e.swatch {
                    assert!(l.marks.iter().any(|m| m.role == role), "{role:?}");
                }
            }
            for (i, a) in l.legend.iter().enumerate() {
                assert!(inside(&a.label.bbox()), "{:?}", a.label);
                assert!(a.label.bbox().y0 > AXIS_Y + 18.0, "below the tick labels");
                for b in &l.legend[i + 1..] {
                    assert!(!a.label.bbox().overlaps(&b.label.bbox()), "{a:?} {b:?}");
                }
            }
        }
    }

    /// The lost marker (and every other mark and label) is clear of every other mark
    /// and label, though A learns of the loss and writes in the same millisecond.
    #[test]
    fn no_mark_or_label_hides_another() {
        for (fenced, l) in both() {
            let lost = l.marks.iter().find(|m| m.role == Role::Lost).unwrap();
            let write = l
                .marks
                .iter()
                .find(|m| m.worker == "A" && m.role != Role::Lost)
                .unwrap();
            assert!((lost.cx - write.cx).abs() < 1.0, "the same moment");
            let distance = (lost.cx - write.cx).hypot(lost.cy - write.cy);
            assert!(distance > lost.r + write.r, "{fenced}: {distance}");

            let mut boxes: Vec<(String, Rect)> = Vec::new();
            for m in &l.marks {
                boxes.push((format!("{:?} mark", m.role), m.bbox()));
                boxes.push((format!("{:?} label", m.role), m.label.bbox()));
            }
            for f in &l.fences {
                boxes.push((f.label.text.clone(), f.label.bbox()));
            }
            for n in &l.notes {
                boxes.push((n.text.clone(), n.bbox()));
            }
            if let Some((_, label)) = &l.deadline {
                boxes.push((label.text.clone(), label.bbox()));
            }
            for (i, (a, ra)) in boxes.iter().enumerate() {
                assert!(inside(ra), "{fenced}: {a} leaves the picture: {ra:?}");
                for (b, rb) in &boxes[i + 1..] {
                    assert!(!ra.overlaps(rb), "{fenced}: {a} {ra:?} overlaps {b} {rb:?}");
                }
            }
            // The dashed link of a repeated number crosses no words.
            for &(x1, y1, x2, y2, _) in &l.duplicates {
                for k in 1..100 {
                    let t = f64::from(k) / 100.0;
                    let (x, y) = (x1 + (x2 - x1) * t, y1 + (y2 - y1) * t);
                    for (name, r) in boxes.iter().filter(|(n, _)| !n.ends_with("mark")) {
                        let hit = x > r.x0 && x < r.x1 && y > r.y0 && y < r.y1;
                        assert!(!hit, "{fenced}: the link crosses {name}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_unfenced_corrupting_write_is_drawn_as_corruption() {
        let [(_, fenced), (_, unfenced)] = both();
        let roles = |l: &Layout| {
            l.marks
                .iter()
                .map(|m| (m.worker, m.role))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            roles(&fenced),
            [
                ("B", Role::Accepted),
                ("A", Role::Lost),
                ("A", Role::Rejected)
            ]
        );
        assert!(fenced.duplicates.is_empty());
        assert_eq!(
            roles(&unfenced),
            [
                ("B", Role::Accepted),
                ("A", Role::Lost),
                ("A", Role::Corrupting)
            ]
        );
        let corrupt = &unfenced.marks[2];
        assert!(
            corrupt.label.text.contains("CORRUPTION: invoice #1"),
            "{corrupt:?}"
        );
        // Linked to the write it repeats.
        let b = &unfenced.marks[0];
        assert_eq!(unfenced.duplicates.len(), 1);
        let (x1, y1, x2, y2, _) = unfenced.duplicates[0];
        assert_eq!((x1, y1, x2, y2), (b.cx, b.cy, corrupt.cx, corrupt.cy));
        let svg = render_svg(&unfenced);
        assert!(svg.contains("data-role=\"corrupt\""), "{svg}");
        assert!(!render_svg(&fenced).contains("data-role=\"corrupt\""));
        // A distinct shape and colour.
        assert_ne!(
            Role::Corrupting
                .shape(0.0, 0.0, 5.0)
                .split_whitespace()
                .next(),
            Role::Accepted
                .shape(0.0, 0.0, 5.0)
                .split_whitespace()
                .next()
        );
        assert_ne!(Role::Corrupting.class(), Role::Accepted.class());
    }

    /// Ticks every round step (1, 2, 2.5 or 5 × 10^k ms) from 0, evenly spaced, at most
    /// [`MAX_TICKS`], labelled with their value.
    #[test]
    fn ticks_are_round_and_evenly_spaced() {
        for end_ms in [1.05, 26.0, 450.0, 1000.0, 3687.6, 9000.0, 26_250.0, 2.6e8] {
            let step = tick_step(end_ms);
            let mantissa = {
                let mut m = step;
                while m.is_multiple_of(10) {
                    m /= 10;
                }
                m
            };
            assert!([1, 2, 5, 25].contains(&mantissa), "{end_ms}: step {step}");
            let events = [
                event(0.0, "A", Kind::Acquired, None),
                event(end_ms / 1.05, "B", Kind::Released, None),
            ];
            let l = layout(&events, Duration::from_millis(10));
            assert!(
                l.ticks.len() >= 2 && l.ticks.len() as u64 <= MAX_TICKS,
                "{end_ms}: {:?}",
                l.ticks
            );
            assert_eq!(l.ticks[0].ms, 0);
            let dx = l.ticks[1].x - l.ticks[0].x;
            for pair in l.ticks.windows(2) {
                assert_eq!(pair[1].ms - pair[0].ms, step, "{end_ms}");
                assert!(
                    (pair[1].x - pair[0].x - dx).abs() < 1e-6,
                    "{end_ms}: uneven"
                );
            }
            for t in &l.ticks {
                let value = if let Some(s) = t.label.strip_suffix(" s") {
                    s.parse::<f64>().unwrap() * 1000.0
                } else {
                    t.label.strip_suffix(" ms").unwrap().parse::<f64>().unwrap()
                };
                assert!((value - t.ms as f64).abs() < 1e-6, "{t:?}");
                assert!(t.x >= LEFT && t.x <= LEFT + PLOT_WIDTH, "{t:?}");
            }
        }
        let l = layout(&story(true), Duration::from_secs(1));
        let labels: Vec<&str> = l.ticks.iter().map(|t| t.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "0 s", "0.5 s", "1 s", "1.5 s", "2 s", "2.5 s", "3 s", "3.5 s"
            ]
        );
    }

    /// Fences show their last digits, as few as keep them apart and in order, with the
    /// full value on hover.
    #[test]
    fn fences_show_their_last_digits_and_the_full_value_on_hover() {
        assert_eq!(fence_digits(&[FENCE_A, FENCE_B]), 7);
        assert_eq!(fence_digits(&[123_456, 123_999]), 3);
        assert_eq!(fence_digits(&[123_456, 123_457]), 2);
        assert_eq!(fence_digits(&[5, 7]), 1);
        assert_eq!(fence_digits(&[99, 100]), 3);
        assert_eq!(short_fence(FENCE_A, 7), "…4202461");
        assert_eq!(short_fence(42, 7), "42");
        let l = layout(&story(true), Duration::from_secs(1));
        let tags: Vec<(&str, u64)> = l
            .fences
            .iter()
            .map(|f| (f.label.text.as_str(), f.full))
            .collect();
        assert_eq!(
            tags,
            [("fence …4202461", FENCE_A), ("fence …5118817", FENCE_B)]
        );
        let svg = render_svg(&l);
        for full in [FENCE_A, FENCE_B] {
            assert!(
                svg.contains(&format!("<title>fence {full}</title>")),
                "{svg}"
            );
        }
    }

    #[test]
    fn the_page_carries_the_picture_and_the_events() {
        let page = render_html(&story(false), false, "CORRUPTED", Duration::from_secs(1));
        assert!(page.contains("<g class=\"legend\">"));
        assert!(page.contains("data-role=\"lost\""));
        assert!(page.contains("<td>A</td><td>A Lost</td>"), "{page}");
    }
}
