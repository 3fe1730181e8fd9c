//! The harness of leasehold's comparison benchmark (`benches/compare.rs`), written once
//! for every store's section.
//!
//! * [`uncontended`]: every [`Side`] of a comparison runs in the same process, in
//!   **interleaved slices** (side A, side B, side C, then again, the order rotated each
//!   slice), so that background load hits every side alike. Each task acquires and
//!   releases its own key in a loop. A side's throughput is the median over its slices,
//!   and a ratio ([`Level::ratio`]) is the median over slices of the two sides'
//!   throughputs **in the same slice**.
//! * [`contended`]: every [`Contender`] takes turns on one key per slice (the contenders
//!   interleaved the same way), holds it for a fixed time and releases it; the tally gives
//!   the five contended figures of [`ContendedStats`]: utilisation, hand-off p50, wait
//!   p99, turns per task, store calls per acquisition.
//! * [`Section`]: what a section compared and how, its figures, printed as a table
//!   ([`Section::print`]) or as JSON ([`Section::to_json`]).
//! * [`parse`]: the command line, `pgbench`'s report, Redis's `INFO commandstats`.
#![forbid(unsafe_code)]

pub mod parse;

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A boxed, sendable future.
pub type BoxFut<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// The result of one benchmark operation; the error is its message.
pub type Res<T> = Result<T, String>;

/// One acquire + release pair on the given key.
pub type PairFn = Arc<dyn Fn(Arc<str>) -> BoxFut<Res<()>> + Send + Sync>;

/// A rate measured by something outside this process (such as `pgbench`) over about the
/// given duration: operations per second.
pub type RateFn = Arc<dyn Fn(Duration) -> BoxFut<Res<f64>> + Send + Sync>;

/// What a [`Side`] runs in a slice.
#[derive(Clone)]
pub enum Work {
    /// Acquire + release pairs, `tasks` concurrent loops, each on its own key.
    Pairs(PairFn),
    /// An external rate, measured once per slice whatever the level's task count.
    Rate(RateFn),
}

/// One side of an uncontended comparison.
#[derive(Clone)]
pub struct Side {
    /// Its short name (a column of the table, a key in the JSON).
    pub name: &'static str,
    /// What it runs.
    pub work: Work,
}

impl fmt::Debug for Work {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Work::Pairs(_) => "Pairs",
            Work::Rate(_) => "Rate",
        })
    }
}

impl fmt::Debug for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Side").field("name", &self.name).finish()
    }
}

impl Side {
    /// A side that runs `pair(key)` in a loop in each task.
    pub fn pairs<F, Fut>(name: &'static str, pair: F) -> Self
    where
        F: Fn(Arc<str>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Res<()>> + Send + 'static,
    {
        Self {
            name,
            work: Work::Pairs(Arc::new(move |key| Box::pin(pair(key)))),
        }
    }

    /// A side whose rate is measured by `rate(duration)` once per slice.
    pub fn rate<F, Fut>(name: &'static str, rate: F) -> Self
    where
        F: Fn(Duration) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Res<f64>> + Send + 'static,
    {
        Self {
            name,
            work: Work::Rate(Arc::new(move |d| Box::pin(rate(d)))),
        }
    }
}

/// How long each part of a run lasts.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Slices per level (uncontended) and per contender (contended).
    pub slices: usize,
    /// One side's share of an uncontended slice.
    pub slice: Duration,
    /// Each side's warm-up at each level before its slices (connections, scripts, pools).
    pub warmup: Duration,
    /// One contender's share of a contended slice.
    pub contended_slice: Duration,
    /// Contending tasks.
    pub contenders: usize,
    /// How long a contender holds the key before releasing it.
    pub hold: Duration,
}

impl Plan {
    /// The full run.
    pub fn full() -> Self {
        Self {
            slices: 8,
            slice: Duration::from_millis(500),
            warmup: Duration::from_millis(300),
            contended_slice: Duration::from_secs(1),
            contenders: 16,
            hold: Duration::from_millis(1),
        }
    }

    /// A smoke run: a few short slices.
    pub fn quick() -> Self {
        Self {
            slices: 3,
            slice: Duration::from_millis(100),
            warmup: Duration::from_millis(50),
            contended_slice: Duration::from_millis(300),
            contenders: 16,
            hold: Duration::from_millis(1),
        }
    }
}

/// The median of `v` (NaN when empty).
pub fn median(v: &[f64]) -> f64 {
    let mut v: Vec<f64> = v.iter().copied().filter(|x| !x.is_nan()).collect();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The nearest-rank percentile `p` (0..=1) of sorted `v`.
pub fn percentile(sorted: &[Duration], p: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Errors of one side or contender: how many, and the first message.
#[derive(Debug, Clone, Default)]
pub struct Errors {
    /// How many operations failed.
    pub count: u64,
    /// The first failure's message.
    pub first: Option<String>,
}

impl Errors {
    fn add(&mut self, e: String) {
        self.count += 1;
        self.first.get_or_insert(e);
    }

    fn merge(&mut self, o: Errors) {
        self.count += o.count;
        if self.first.is_none() {
            self.first = o.first;
        }
    }
}

/// One side's figures at one level.
#[derive(Debug, Clone)]
pub struct SideStats {
    /// The side's name.
    pub name: &'static str,
    /// Its throughput in each slice, in slice order.
    pub per_slice: Vec<f64>,
    /// Pairs completed over all slices.
    pub pairs: u64,
    /// Latency of one pair, over every pair of every slice.
    pub p50: Option<Duration>,
    /// Latency of one pair, over every pair of every slice.
    pub p99: Option<Duration>,
    /// Failed pairs.
    pub errors: Errors,
    /// This process's CPU time (user + system, every thread) over the side's slices: the
    /// client's, since every server runs as a process of its own and the sides' slices
    /// never overlap. `None` for a [`Work::Rate`] side (its client is another process)
    /// and where the process's CPU clock cannot be read.
    pub cpu: Option<Duration>,
    /// The server's CPU time over the side's slices, where the section reads it
    /// ([`uncontended_with_server`]): what the side's pairs cost the server.
    pub server_cpu: Option<Duration>,
}

impl SideStats {
    /// The median over slices of its throughput.
    pub fn per_sec(&self) -> f64 {
        median(&self.per_slice)
    }

    /// The client's CPU time per pair over every slice ([`cpu`](Self::cpu) ÷
    /// [`pairs`](Self::pairs)).
    pub fn cpu_per_pair(&self) -> Option<Duration> {
        let pairs = u32::try_from(self.pairs).ok().filter(|&p| p > 0)?;
        Some(self.cpu? / pairs)
    }

    /// The server's CPU time per pair over every slice ([`server_cpu`](Self::server_cpu)
    /// ÷ [`pairs`](Self::pairs)).
    pub fn server_cpu_per_pair(&self) -> Option<Duration> {
        let pairs = u32::try_from(self.pairs).ok().filter(|&p| p > 0)?;
        Some(self.server_cpu? / pairs)
    }
}

/// Reads a server's CPU time so far (user + system), for [`uncontended_with_server`].
pub type ServerCpuFn = Arc<dyn Fn() -> BoxFut<Res<Duration>> + Send + Sync>;

/// This process's CPU time so far, user and system, of all its threads
/// (`CLOCK_PROCESS_CPUTIME_ID`, nanoseconds).
#[cfg(target_os = "linux")]
pub fn process_cpu() -> Option<Duration> {
    use nix::time::{ClockId, clock_gettime};
    clock_gettime(ClockId::CLOCK_PROCESS_CPUTIME_ID)
        .ok()
        .map(Duration::from)
}

/// This process's CPU time so far: not read on this system.
#[cfg(not(target_os = "linux"))]
pub fn process_cpu() -> Option<Duration> {
    None
}

/// Every side's figures at one task count.
#[derive(Debug, Clone)]
pub struct Level {
    /// Concurrent tasks.
    pub tasks: usize,
    /// One entry per side, in the order given.
    pub sides: Vec<SideStats>,
}

impl Level {
    /// The side called `name`.
    pub fn side(&self, name: &str) -> Option<&SideStats> {
        self.sides.iter().find(|s| s.name == name)
    }

    /// `num`'s client CPU per pair ÷ `den`'s, over all their slices at this level.
    pub fn cpu_ratio(&self, num: &str, den: &str) -> f64 {
        let per_pair = |name| {
            self.side(name)
                .and_then(SideStats::cpu_per_pair)
                .map_or(f64::NAN, |d| d.as_secs_f64())
        };
        per_pair(num) / per_pair(den)
    }

    /// The median over slices of `num`'s throughput ÷ `den`'s in the same slice.
    pub fn ratio(&self, num: &str, den: &str) -> f64 {
        match (self.side(num), self.side(den)) {
            (Some(n), Some(d)) => {
                let r: Vec<f64> = n
                    .per_slice
                    .iter()
                    .zip(&d.per_slice)
                    .map(|(a, b)| a / b)
                    .filter(|r| r.is_finite())
                    .collect();
                median(&r)
            }
            _ => f64::NAN,
        }
    }
}

/// One slice of pairs: `tasks` loops until `dur` has passed; throughput, latencies.
async fn pair_slice(
    pair: &PairFn,
    keys: &[Arc<str>],
    dur: Duration,
) -> (f64, Vec<Duration>, Errors) {
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let handles: Vec<_> = keys
        .iter()
        .map(|key| {
            let (pair, key, stop) = (pair.clone(), key.clone(), stop.clone());
            tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut errors = Errors::default();
                while !stop.load(Ordering::Relaxed) {
                    let t0 = Instant::now();
                    match pair(key.clone()).await {
                        Ok(()) => lat.push(t0.elapsed()),
                        Err(e) => {
                            errors.add(e);
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                    }
                }
                (lat, errors)
            })
        })
        .collect();
    tokio::time::sleep(dur).await;
    stop.store(true, Ordering::Relaxed);
    let mut lat = Vec::new();
    let mut errors = Errors::default();
    for h in handles {
        match h.await {
            Ok((l, e)) => {
                lat.extend(l);
                errors.merge(e);
            }
            Err(e) => errors.add(format!("task failed: {e}")),
        }
    }
    let rate = lat.len() as f64 / started.elapsed().as_secs_f64();
    (rate, lat, errors)
}

/// Runs every side at `tasks` concurrent tasks in `plan.slices` interleaved slices (the
/// order rotated each slice), after a warm-up of each.
pub async fn uncontended(sides: &[Side], tasks: usize, plan: &Plan) -> Level {
    uncontended_with_server(sides, tasks, plan, None).await
}

/// [`uncontended`], with the server's CPU time read by `server` before and after each
/// side's slice (outside the timed slice) into [`SideStats::server_cpu`]: every side
/// must talk to that one server, and nothing else may.
pub async fn uncontended_with_server(
    sides: &[Side],
    tasks: usize,
    plan: &Plan,
    server: Option<&ServerCpuFn>,
) -> Level {
    let keys: Vec<Vec<Arc<str>>> = (0..sides.len())
        .map(|s| {
            (0..tasks)
                .map(|t| Arc::from(format!("bench:s{s}:t{t}")))
                .collect()
        })
        .collect();
    for (side, keys) in sides.iter().zip(&keys) {
        if let Work::Pairs(pair) = &side.work {
            pair_slice(pair, keys, plan.warmup).await;
        }
    }
    let mut lat: Vec<Vec<Duration>> = vec![Vec::new(); sides.len()];
    let mut stats: Vec<SideStats> = sides
        .iter()
        .map(|s| SideStats {
            name: s.name,
            per_slice: Vec::new(),
            pairs: 0,
            p50: None,
            p99: None,
            errors: Errors::default(),
            cpu: match s.work {
                Work::Pairs(_) => process_cpu().map(|_| Duration::ZERO),
                Work::Rate(_) => None,
            },
            server_cpu: server.map(|_| Duration::ZERO),
        })
        .collect();
    for slice in 0..plan.slices {
        for j in 0..sides.len() {
            let i = (j + slice) % sides.len();
            let (rate, l, errors) = match &sides[i].work {
                Work::Pairs(pair) => {
                    let server0 = match server {
                        Some(read) => read().await.ok(),
                        None => None,
                    };
                    let cpu0 = process_cpu();
                    let res = pair_slice(pair, &keys[i], plan.slice).await;
                    if let (Some(total), Some(c0), Some(c1)) =
                        (&mut stats[i].cpu, cpu0, process_cpu())
                    {
                        *total += c1.saturating_sub(c0);
                    }
                    if let (Some(read), Some(s0)) = (server, server0) {
                        match (read().await, &mut stats[i].server_cpu) {
                            (Ok(s1), Some(total)) => *total += s1.saturating_sub(s0),
                            _ => stats[i].server_cpu = None,
                        }
                    } else {
                        stats[i].server_cpu = None;
                    }
                    res
                }
                Work::Rate(rate) => match rate(plan.slice).await {
                    Ok(r) => (r, Vec::new(), Errors::default()),
                    Err(e) => {
                        let mut errors = Errors::default();
                        errors.add(e);
                        (f64::NAN, Vec::new(), errors)
                    }
                },
            };
            stats[i].per_slice.push(rate);
            stats[i].pairs += l.len() as u64;
            stats[i].errors.merge(errors);
            lat[i].extend(l);
        }
    }
    for (s, mut l) in stats.iter_mut().zip(lat) {
        l.sort_unstable();
        s.p50 = percentile(&l, 0.50);
        s.p99 = percentile(&l, 0.99);
    }
    Level {
        tasks,
        sides: stats,
    }
}

/// Releases a lock that a [`Contender`] acquired.
pub type Release = Box<dyn FnOnce() -> BoxFut<Res<()>> + Send>;

/// Acquires the given key, waiting as long as it takes; returns its release.
pub type AcquireFn = Arc<dyn Fn(Arc<str>) -> BoxFut<Res<Release>> + Send + Sync>;

/// A counter's reading: named parts and their counts.
pub type Parts = Vec<(String, u64)>;

/// Reads a store-side counter of calls (a server statistic, or a count kept by the
/// contender itself), as named parts (Redis: one per command) whose sum is the total.
#[derive(Clone)]
pub struct Counter {
    read: Arc<dyn Fn() -> BoxFut<Res<Parts>> + Send + Sync>,
    /// Calls that one reading itself adds to the next reading.
    pub overhead: u64,
    /// What it counts (e.g. "server commands").
    pub unit: &'static str,
}

impl fmt::Debug for Counter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Counter")
            .field("unit", &self.unit)
            .field("overhead", &self.overhead)
            .finish()
    }
}

impl Counter {
    /// A counter of `unit` read by `read` as one total, each reading adding `overhead`
    /// to the next.
    pub fn new<F, Fut>(unit: &'static str, overhead: u64, read: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Res<u64>> + Send + 'static,
    {
        let read = Arc::new(read);
        Self {
            read: Arc::new(move || {
                let read = read.clone();
                Box::pin(async move { Ok(vec![(unit.to_owned(), read().await?)]) })
            }),
            overhead,
            unit,
        }
    }

    /// A counter of `unit` read by `read` as named parts; its readings must not count
    /// themselves (leave their own part out).
    pub fn by_part<F, Fut>(unit: &'static str, read: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Res<Parts>> + Send + 'static,
    {
        Self {
            read: Arc::new(move || Box::pin(read())),
            overhead: 0,
            unit,
        }
    }

    /// Reads it: its parts.
    pub async fn read(&self) -> Res<Parts> {
        (self.read)().await
    }
}

/// Boxes a release.
pub fn release<F, Fut>(f: F) -> Release
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = Res<()>> + Send + 'static,
{
    Box::new(move || Box::pin(f()))
}

/// One contender of a contended comparison.
#[derive(Clone)]
pub struct Contender {
    /// Its short name.
    pub name: &'static str,
    /// Acquire with a wait.
    pub acquire: AcquireFn,
    /// Its store calls.
    pub calls: Counter,
}

impl fmt::Debug for Contender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Contender")
            .field("name", &self.name)
            .finish()
    }
}

impl Contender {
    /// A contender that acquires with `acquire(key)` and counts its calls with `calls`.
    pub fn new<F, Fut>(name: &'static str, calls: Counter, acquire: F) -> Self
    where
        F: Fn(Arc<str>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Res<Release>> + Send + 'static,
    {
        Self {
            name,
            acquire: Arc::new(move |key| Box::pin(acquire(key))),
            calls,
        }
    }
}

/// Who holds the key and who let it go last, as the contenders report it.
#[derive(Debug, Default)]
struct Board {
    holder: Option<usize>,
    last_release: Option<(Instant, usize)>,
    overlaps: u64,
}

impl Board {
    /// `task` got the key at `at`: the hand-off from another task's release, if any.
    fn acquired(&mut self, task: usize, at: Instant) -> Option<Duration> {
        if self.holder.is_some() {
            self.overlaps += 1;
        }
        self.holder = Some(task);
        self.last_release
            .filter(|(_, who)| *who != task)
            .map(|(r, _)| at.saturating_duration_since(r))
    }

    /// `task` starts releasing the key at `at`.
    fn releasing(&mut self, task: usize, at: Instant) {
        if self.holder == Some(task) {
            self.holder = None;
        }
        self.last_release = Some((at, task));
    }
}

/// One contended task's tally.
#[derive(Debug, Default)]
struct TaskTally {
    turns: u64,
    all_turns: u64,
    held: Duration,
    waits: Vec<Duration>,
    handoffs: Vec<Duration>,
    errors: Errors,
}

/// A contender's figures over all its slices.
#[derive(Debug, Clone)]
pub struct ContendedStats {
    /// The contender's name.
    pub name: &'static str,
    /// Wall time of its slices (the measured windows).
    pub wall: Duration,
    /// Time the key was held by some task within the windows: from an acquire returning
    /// to the holder starting its release.
    pub held: Duration,
    /// Acquisitions that returned within the windows.
    pub turns: u64,
    /// Every acquisition, including those of the drain after a window closed.
    pub all_turns: u64,
    /// Turns of each task, summed over slices.
    pub turns_per_task: Vec<u64>,
    /// Sorted: from one task starting its release to another task's acquire returning.
    pub handoffs: Vec<Duration>,
    /// Sorted: from calling acquire to its return.
    pub waits: Vec<Duration>,
    /// Store calls over the slices (counter delta), if the counter could be read.
    pub calls: Option<u64>,
    /// The same by part (Redis: by command), where the counter has parts.
    pub calls_by: BTreeMap<String, u64>,
    /// What the calls are (e.g. "server commands").
    pub calls_unit: String,
    /// Acquisitions that returned while another task still held the key (must be 0).
    pub overlaps: u64,
    /// Failed acquisitions or releases, or tasks that did not drain.
    pub errors: Errors,
}

impl ContendedStats {
    /// Fraction of wall time the key was held.
    pub fn utilisation(&self) -> f64 {
        self.held.as_secs_f64() / self.wall.as_secs_f64()
    }

    /// Median hand-off to another task.
    pub fn handoff_p50(&self) -> Option<Duration> {
        percentile(&self.handoffs, 0.50)
    }

    /// 99th percentile of the wait for the key.
    pub fn wait_p99(&self) -> Option<Duration> {
        percentile(&self.waits, 0.99)
    }

    /// Fewest and most turns of one task.
    pub fn turns_range(&self) -> (u64, u64) {
        let min = self.turns_per_task.iter().copied().min().unwrap_or(0);
        let max = self.turns_per_task.iter().copied().max().unwrap_or(0);
        (min, max)
    }

    /// Store calls per acquisition (every acquisition, the drain's included: its calls
    /// are in the counter too).
    pub fn calls_per_acquisition(&self) -> Option<f64> {
        self.calls
            .filter(|_| self.all_turns > 0)
            .map(|c| c as f64 / self.all_turns as f64)
    }

    /// Calls per acquisition of each part, most first (empty for a counter of one part).
    pub fn calls_by_acquisition(&self) -> Vec<(&str, f64)> {
        if self.calls_by.len() < 2 || self.all_turns == 0 {
            return Vec::new();
        }
        let mut v: Vec<(&str, f64)> = self
            .calls_by
            .iter()
            .map(|(k, n)| (k.as_str(), *n as f64 / self.all_turns as f64))
            .filter(|(_, x)| *x >= 0.05)
            .collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1));
        v
    }

    /// Mean time a turn held the key.
    pub fn mean_hold(&self) -> Option<Duration> {
        (self.turns > 0).then(|| self.held / self.turns as u32)
    }
}

/// How long the tasks still waiting when a window closes may take to get their turn.
const DRAIN_LIMIT: Duration = Duration::from_secs(60);

/// One contended slice of one contender on `key`.
async fn contended_slice(
    c: &Contender,
    key: Arc<str>,
    plan: &Plan,
) -> (Vec<TaskTally>, u64, Errors) {
    let board = Arc::new(Mutex::new(Board::default()));
    let start = Instant::now();
    let stop_at = start + plan.contended_slice;
    let handles: Vec<_> = (0..plan.contenders)
        .map(|task| {
            let (acquire, key, board, hold) =
                (c.acquire.clone(), key.clone(), board.clone(), plan.hold);
            tokio::spawn(async move {
                let mut t = TaskTally::default();
                while Instant::now() < stop_at {
                    let t0 = Instant::now();
                    let rel = match acquire(key.clone()).await {
                        Ok(rel) => rel,
                        Err(e) => {
                            t.errors.add(format!("acquire: {e}"));
                            tokio::time::sleep(Duration::from_millis(1)).await;
                            continue;
                        }
                    };
                    let got = Instant::now();
                    let handoff = board
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .acquired(task, got);
                    t.all_turns += 1;
                    let counted = got < stop_at;
                    if counted {
                        t.turns += 1;
                        t.waits.push(got - t0);
                        t.handoffs.extend(handoff);
                        hold_for(hold).await;
                    }
                    let r = Instant::now();
                    if counted {
                        t.held += r.min(stop_at) - got;
                    }
                    board
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .releasing(task, r);
                    if let Err(e) = rel().await {
                        t.errors.add(format!("release: {e}"));
                    }
                }
                t
            })
        })
        .collect();
    let mut errors = Errors::default();
    let mut tallies = Vec::with_capacity(handles.len());
    let drain_until = tokio::time::Instant::from_std(stop_at + DRAIN_LIMIT);
    for mut h in handles {
        match tokio::time::timeout_at(drain_until, &mut h).await {
            Ok(Ok(t)) => tallies.push(t),
            Ok(Err(e)) => {
                errors.add(format!("task failed: {e}"));
                tallies.push(TaskTally::default());
            }
            Err(_) => {
                h.abort();
                errors.add(format!(
                    "a task still waited {DRAIN_LIMIT:?} after the window closed"
                ));
                tallies.push(TaskTally::default());
            }
        }
    }
    let overlaps = board.lock().unwrap_or_else(|p| p.into_inner()).overlaps;
    if overlaps > 0 {
        errors.add(format!(
            "{overlaps} acquisitions while another task held the key"
        ));
    }
    (tallies, overlaps, errors)
}

/// Runs every contender in `plan.slices` interleaved slices (the order rotated each
/// slice), each slice on a fresh key.
pub async fn contended(contenders: &[Contender], plan: &Plan) -> Vec<ContendedStats> {
    let mut stats: Vec<ContendedStats> = contenders
        .iter()
        .map(|c| ContendedStats {
            name: c.name,
            wall: Duration::ZERO,
            held: Duration::ZERO,
            turns: 0,
            all_turns: 0,
            turns_per_task: vec![0; plan.contenders],
            handoffs: Vec::new(),
            waits: Vec::new(),
            calls: Some(0),
            calls_by: BTreeMap::new(),
            calls_unit: c.calls.unit.to_owned(),
            overlaps: 0,
            errors: Errors::default(),
        })
        .collect();
    for slice in 0..plan.slices {
        for j in 0..contenders.len() {
            let i = (j + slice) % contenders.len();
            let c = &contenders[i];
            let key: Arc<str> = Arc::from(format!("bench:hot:c{i}:s{slice}"));
            let before = c.calls.read().await;
            let (tallies, overlaps, errors) = contended_slice(c, key, plan).await;
            let after = c.calls.read().await;
            let s = &mut stats[i];
            s.calls = match (s.calls, before, after) {
                (Some(sum), Ok(b), Ok(a)) => {
                    let before: BTreeMap<String, u64> = b.into_iter().collect();
                    let mut delta = 0;
                    for (part, n) in a {
                        let d = n.saturating_sub(before.get(&part).copied().unwrap_or(0));
                        delta += d;
                        *s.calls_by.entry(part).or_default() += d;
                    }
                    Some(sum + delta.saturating_sub(c.calls.overhead))
                }
                (_, Err(e), _) | (_, _, Err(e)) => {
                    s.errors.add(format!("counter: {e}"));
                    None
                }
                (None, ..) => None,
            };
            s.wall += plan.contended_slice;
            s.overlaps += overlaps;
            s.errors.merge(errors);
            for (task, t) in tallies.into_iter().enumerate() {
                s.turns += t.turns;
                s.all_turns += t.all_turns;
                s.turns_per_task[task] += t.turns;
                s.held += t.held;
                s.waits.extend(t.waits);
                s.handoffs.extend(t.handoffs);
                s.errors.merge(t.errors);
            }
        }
    }
    for s in &mut stats {
        s.waits.sort_unstable();
        s.handoffs.sort_unstable();
    }
    stats
}

/// A ratio a section reports at each level: `num` ÷ `den`, and what it means.
#[derive(Debug, Clone)]
pub struct Ratio {
    /// The numerator side.
    pub num: &'static str,
    /// The denominator side.
    pub den: &'static str,
    /// One line: what the ratio means.
    pub meaning: String,
}

/// One store's section of the report.
#[derive(Debug, Clone, Default)]
pub struct Section {
    /// Its short name (`redis`, `postgres`, `mysql`, `sqlite`).
    pub name: &'static str,
    /// Its header: the server and its settings.
    pub title: String,
    /// What is compared and how (one line each).
    pub about: Vec<String>,
    /// Each side or contender and what exactly it runs.
    pub legend: Vec<(&'static str, String)>,
    /// The uncontended levels.
    pub levels: Vec<Level>,
    /// The ratios reported at each level.
    pub ratios: Vec<Ratio>,
    /// What the contended comparison does.
    pub contended_about: Vec<String>,
    /// The contended figures.
    pub contended: Vec<ContendedStats>,
    /// Why the section could not run, if it could not.
    pub failed: Option<String>,
}

fn us(d: Option<Duration>) -> String {
    d.map_or_else(|| "-".into(), |d| format!("{:.0}", d.as_secs_f64() * 1e6))
}

fn num(x: f64) -> String {
    if !x.is_finite() {
        return "-".into();
    }
    let s = format!("{:.0}", x.round());
    // Thin groups of three digits for big numbers.
    let (neg, digits) = s.strip_prefix('-').map_or((false, &s[..]), |d| (true, d));
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(' ');
        }
        out.push(ch);
    }
    if neg { format!("-{out}") } else { out }
}

fn fixed(x: f64, prec: usize) -> String {
    if x.is_finite() {
        format!("{x:.prec$}")
    } else {
        "-".into()
    }
}

impl Section {
    /// The section as text: header, the uncontended table and its ratios, the contended
    /// table.
    pub fn print(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(o, "== {} ==", self.title);
        if let Some(e) = &self.failed {
            let _ = writeln!(o, "   NOT RUN: {e}");
            return o;
        }
        for line in &self.about {
            let _ = writeln!(o, "   {line}");
        }
        let w = self.legend.iter().map(|(n, _)| n.len()).max().unwrap_or(4);
        // The first column: the sides' and contenders' names, the ratios' labels.
        let w1 = self
            .ratios
            .iter()
            .map(|r| r.num.chars().count() + r.den.chars().count() + 3)
            .chain([w, 20])
            .max()
            .unwrap_or(20);
        for (name, what) in &self.legend {
            let _ = writeln!(o, "   {name:<w$} = {what}");
        }
        if !self.levels.is_empty() {
            let col = 22;
            let _ = write!(o, "\n   {:<w$}", "pairs/s (p50/p99 µs)", w = w1);
            for l in &self.levels {
                let _ = write!(
                    o,
                    "{:>col$}",
                    format!("{} task{}", l.tasks, plural(l.tasks))
                );
            }
            o.push('\n');
            for (i, s) in self.levels[0].sides.iter().enumerate() {
                let _ = write!(o, "   {:<w$}", s.name, w = w1);
                for l in &self.levels {
                    let s = &l.sides[i];
                    let cell = if s.p50.is_some() {
                        format!("{} ({}/{})", num(s.per_sec()), us(s.p50), us(s.p99))
                    } else {
                        num(s.per_sec())
                    };
                    let _ = write!(o, "{cell:>col$}");
                }
                o.push('\n');
            }
            // One row per ratio, each level's `value` of it.
            let ratio_rows = |o: &mut String, value: &dyn Fn(&Level, &Ratio) -> f64| {
                for r in &self.ratios {
                    let label = format!("{} ÷ {}", r.num, r.den);
                    let _ = write!(o, "   {label:<w$}", w = w1);
                    for l in &self.levels {
                        let _ = write!(o, "{:>col$}", fixed(value(l, r), 3));
                    }
                    o.push('\n');
                }
            };
            ratio_rows(&mut o, &|l, r| l.ratio(r.num, r.den));
            for r in &self.ratios {
                let _ = writeln!(o, "   ({} ÷ {}: {})", r.num, r.den, r.meaning);
            }
            // One row per side of a per-pair figure in µs, when any side has it.
            let per_pair_rows =
                |o: &mut String, title: &str, us: &dyn Fn(&SideStats) -> Option<Duration>| {
                    let shown = |s: &SideStats| us(s).map(|d| d.as_secs_f64() * 1e6);
                    if !self
                        .levels
                        .iter()
                        .flat_map(|l| &l.sides)
                        .any(|s| shown(s).is_some())
                    {
                        return false;
                    }
                    let _ = writeln!(o, "\n   {title:<w$}", w = w1);
                    for (i, s) in self.levels[0].sides.iter().enumerate() {
                        let _ = write!(o, "   {:<w$}", s.name, w = w1);
                        for l in &self.levels {
                            let cell =
                                shown(&l.sides[i]).map_or_else(|| "-".into(), |x| fixed(x, 2));
                            let _ = write!(o, "{cell:>col$}");
                        }
                        o.push('\n');
                    }
                    true
                };
            if per_pair_rows(&mut o, "client CPU µs/pair", &SideStats::cpu_per_pair) {
                ratio_rows(&mut o, &|l, r| l.cpu_ratio(r.num, r.den));
                let _ = writeln!(
                    o,
                    "   (this process's CPU time, user + system, over a side's slices ÷ its \
                     pairs: the client's; the CPU ratios are num's CPU per pair ÷ den's)"
                );
            }
            if per_pair_rows(
                &mut o,
                "server CPU µs/pair",
                &SideStats::server_cpu_per_pair,
            ) {
                let _ = writeln!(
                    o,
                    "   (the server process's CPU time, user + system, over a side's slices ÷ \
                     its pairs)"
                );
            }
            for l in &self.levels {
                for s in &l.sides {
                    if s.errors.count > 0 {
                        let _ = writeln!(
                            o,
                            "   ! {} at {} tasks: {} errors, first: {}",
                            s.name,
                            l.tasks,
                            s.errors.count,
                            s.errors.first.as_deref().unwrap_or("?")
                        );
                    }
                }
            }
        }
        if !self.contended.is_empty() {
            o.push('\n');
            for line in &self.contended_about {
                let _ = writeln!(o, "   {line}");
            }
            let _ = writeln!(
                o,
                "   {:<w$} {:>6} {:>5} {:>6} {:>8} {:>9} {:>11} {:>10}  calls are",
                "contended",
                "turns",
                "hold",
                "util",
                "hand-off",
                "wait p99",
                "turns/task",
                "calls/acq",
                w = w1
            );
            let _ = writeln!(
                o,
                "   {:<w$} {:>6} {:>5} {:>6} {:>8} {:>9} {:>11} {:>10}",
                "",
                "",
                "ms",
                "",
                "p50 µs",
                "ms",
                "min–max",
                "",
                w = w1
            );
            for c in &self.contended {
                let (lo, hi) = c.turns_range();
                let _ = writeln!(
                    o,
                    "   {:<w$} {:>6} {:>5} {:>6} {:>8} {:>9} {:>11} {:>10}  {}",
                    c.name,
                    c.turns,
                    c.mean_hold()
                        .map_or_else(|| "-".into(), |d| fixed(d.as_secs_f64() * 1e3, 2)),
                    fixed(c.utilisation(), 3),
                    us(c.handoff_p50()),
                    c.wait_p99()
                        .map_or_else(|| "-".into(), |d| fixed(d.as_secs_f64() * 1e3, 1)),
                    format!("{lo}–{hi}"),
                    c.calls_per_acquisition()
                        .map_or_else(|| "-".into(), |x| fixed(x, 1)),
                    c.calls_unit,
                    w = w1
                );
            }
            for c in &self.contended {
                let parts = c.calls_by_acquisition();
                if !parts.is_empty() {
                    let parts: Vec<String> = parts
                        .iter()
                        .map(|(k, x)| format!("{k} {}", fixed(*x, 1)))
                        .collect();
                    let _ = writeln!(o, "   ({} calls/acq: {})", c.name, parts.join(", "));
                }
            }
            for c in &self.contended {
                if c.errors.count > 0 {
                    let _ = writeln!(
                        o,
                        "   ! {}: {} errors, first: {}",
                        c.name,
                        c.errors.count,
                        c.errors.first.as_deref().unwrap_or("?")
                    );
                }
            }
        }
        o
    }

    /// The section as JSON.
    pub fn to_json(&self) -> Json {
        let dur = |d: Option<Duration>| d.map(|d| round4(d.as_secs_f64() * 1e6));
        let errors = |e: &Errors| json!({"count": e.count, "first": e.first});
        let ratios = |l: &Level| -> Vec<Json> {
            let ratio = |r: &Ratio| json!({"num": r.num, "den": r.den, "ratio": round4(l.ratio(r.num, r.den)), "cpu_ratio": round4(l.cpu_ratio(r.num, r.den))});
            self.ratios.iter().map(ratio).collect()
        };
        let side = |s: &SideStats| {
            json!({
                "name": s.name,
                "per_sec": round4(s.per_sec()),
                "per_slice": s.per_slice.iter().map(|x| round4(*x)).collect::<Vec<_>>(),
                "pairs": s.pairs,
                "p50_us": dur(s.p50),
                "p99_us": dur(s.p99),
                "errors": errors(&s.errors),
                "cpu_us_per_pair": s.cpu_per_pair().map(|d| round4(d.as_secs_f64() * 1e6)),
                "server_cpu_us_per_pair": s.server_cpu_per_pair().map(|d| round4(d.as_secs_f64() * 1e6)),
            })
        };
        let levels = self.levels.iter().map(|l| {
            json!({"tasks": l.tasks, "sides": l.sides.iter().map(side).collect::<Vec<_>>(), "ratios": ratios(l)})
        });
        let contended = self.contended.iter().map(|c| {
            let (lo, hi) = c.turns_range();
            let by_part: serde_json::Map<String, Json> = c
                .calls_by_acquisition()
                .into_iter()
                .map(|(k, x)| (k.to_owned(), round4(x)))
                .collect();
            json!({
                "name": c.name,
                "wall_s": round4(c.wall.as_secs_f64()),
                "turns": c.turns,
                "utilisation": round4(c.utilisation()),
                "handoff_p50_us": dur(c.handoff_p50()),
                "wait_p99_us": dur(c.wait_p99()),
                "mean_hold_us": dur(c.mean_hold()),
                "turns_per_task_min": lo,
                "turns_per_task_max": hi,
                "calls_per_acquisition": c.calls_per_acquisition().map(round4),
                "calls_per_acquisition_by_part": by_part,
                "calls_unit": c.calls_unit,
                "overlaps": c.overlaps,
                "errors": errors(&c.errors),
            })
        });
        let meanings: Vec<Json> = (self.ratios.iter())
            .map(|r| json!({"num": r.num, "den": r.den, "meaning": r.meaning}))
            .collect();
        json!({
            "name": self.name,
            "title": self.title,
            "failed": self.failed,
            "about": self.about,
            "legend": self.legend.iter().cloned().collect::<BTreeMap<_, _>>(),
            "ratio_meanings": meanings,
            "uncontended": levels.collect::<Vec<_>>(),
            "contended_about": self.contended_about,
            "contended": contended.collect::<Vec<_>>(),
        })
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// The JSON the report is written in (`serde_json`'s value; objects' keys sorted).
pub use serde_json::{Value as Json, json};

/// `x` rounded to 4 decimals past the point, for readability (NaN and infinities: `null`).
pub fn round4(x: f64) -> Json {
    Json::from((x * 1e4).round() / 1e4)
}

/// Holds for `d` as the issue's "hold 1 ms" means it: a thread's `sleep` (nanosleep, within
/// about 0.1 ms here) on the blocking pool, since a tokio sleep rounds up to the next
/// millisecond tick and would hold about twice as long, flattering every contender's
/// utilisation and lengthening its waits alike.
async fn hold_for(d: Duration) {
    if tokio::task::spawn_blocking(move || std::thread::sleep(d))
        .await
        .is_err()
    {
        tokio::time::sleep(d).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_percentile() {
        assert!(median(&[]).is_nan());
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[f64::NAN, 1.0]), 1.0);
        let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&v, 0.5), Some(Duration::from_millis(50)));
        assert_eq!(percentile(&v, 0.99), Some(Duration::from_millis(99)));
        assert_eq!(percentile(&v, 1.0), Some(Duration::from_millis(100)));
        assert_eq!(percentile(&v[..1], 0.99), Some(Duration::from_millis(1)));
        assert_eq!(percentile(&[], 0.5), None);
    }

    #[test]
    fn ratio_is_the_median_of_same_slice_ratios() {
        let side = |name, per_slice: Vec<f64>| SideStats {
            name,
            per_slice,
            pairs: 0,
            p50: None,
            p99: None,
            errors: Errors::default(),
            cpu: None,
            server_cpu: None,
        };
        // A load burst in slice 2 hits both sides: the paired ratio is unaffected.
        let l = Level {
            tasks: 1,
            sides: vec![
                side("a", vec![50.0, 10.0, 50.0]),
                side("b", vec![100.0, 20.0, 100.0]),
            ],
        };
        assert_eq!(l.ratio("a", "b"), 0.5);
        assert!(l.ratio("a", "missing").is_nan());
    }

    #[test]
    fn board_counts_handoffs_to_other_tasks_only_and_overlaps() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut b = Board::default();
        assert_eq!(b.acquired(0, t0), None);
        b.releasing(0, t0 + ms(1));
        // The same task again: not a hand-off.
        assert_eq!(b.acquired(0, t0 + ms(2)), None);
        b.releasing(0, t0 + ms(3));
        assert_eq!(b.acquired(1, t0 + ms(5)), Some(ms(2)));
        assert_eq!(b.overlaps, 0);
        assert_eq!(b.acquired(2, t0 + ms(6)), Some(ms(3)));
        assert_eq!(b.overlaps, 1);
    }

    #[test]
    fn json_numbers_are_rounded_and_nan_is_null() {
        let j = json!({"n": round4(f64::NAN), "x": round4(0.123456)});
        assert_eq!(j.to_string(), r#"{"n":null,"x":0.1235}"#);
    }

    #[test]
    fn numbers_are_grouped() {
        assert_eq!(num(1234567.4), "1 234 567");
        assert_eq!(num(999.0), "999");
        assert_eq!(num(f64::NAN), "-");
    }

    /// A server's CPU, read around each side's slice, is charged to that side's pairs: here
    /// a "server" that spends 10 µs per pair of one side and 30 µs per pair of the other.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn server_cpu_is_charged_to_the_side_whose_slice_spent_it() {
        use std::sync::atomic::{AtomicU64, Ordering};
        let plan = Plan {
            slices: 2,
            slice: Duration::from_millis(20),
            warmup: Duration::from_millis(5),
            contended_slice: Duration::from_millis(50),
            contenders: 4,
            hold: Duration::from_millis(1),
        };
        let spent = Arc::new(AtomicU64::new(0));
        let costing = |name, us: u64| {
            let spent = spent.clone();
            Side::pairs(name, move |_key| {
                let spent = spent.clone();
                async move {
                    spent.fetch_add(us, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    Ok(())
                }
            })
        };
        let read: ServerCpuFn = {
            let spent = spent.clone();
            Arc::new(move || {
                let us = spent.load(Ordering::SeqCst);
                Box::pin(async move { Ok(Duration::from_micros(us)) })
            })
        };
        let sides = [costing("cheap", 10), costing("dear", 30)];
        let level = uncontended_with_server(&sides, 2, &plan, Some(&read)).await;
        let per_pair = |n| level.side(n).unwrap().server_cpu_per_pair();
        // (Pairs cut off at the end of a slice may have spent without being counted.)
        let cheap = per_pair("cheap").expect("read").as_secs_f64() * 1e6;
        let dear = per_pair("dear").expect("read").as_secs_f64() * 1e6;
        assert!((10.0..10.5).contains(&cheap), "{cheap}");
        assert!((30.0..31.5).contains(&dear), "{dear}");
        // Without a reader, nothing is charged.
        let level = uncontended(&sides, 1, &plan).await;
        assert_eq!(level.side("cheap").unwrap().server_cpu, None);
    }

    /// The whole harness against an in-process lock: a smoke test that takes well under a
    /// second.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn harness_runs_against_an_in_process_lock() {
        let plan = Plan {
            slices: 2,
            slice: Duration::from_millis(20),
            warmup: Duration::from_millis(5),
            contended_slice: Duration::from_millis(50),
            contenders: 4,
            hold: Duration::from_millis(1),
        };
        // Every real pair waits for the network; these must yield too, or they would
        // keep the workers from the timer that ends the slice.
        let fast = Side::pairs("fast", |_key| async {
            tokio::task::yield_now().await;
            Ok(())
        });
        let slow = Side::pairs("slow", |_key| async {
            tokio::time::sleep(Duration::from_millis(1)).await;
            Ok(())
        });
        let ext = Side::rate("ext", |_d| async { Ok(1000.0) });
        let level = uncontended(&[fast, slow, ext], 2, &plan).await;
        assert_eq!(level.side("slow").unwrap().per_slice.len(), 2);
        assert!(level.ratio("fast", "slow") > 1.0);
        assert!(level.ratio("slow", "ext") > 0.0);
        // The client's CPU is measured for the sides whose pairs run here, not for a rate.
        assert!(level.side("fast").unwrap().cpu_per_pair().is_some());
        assert!(level.side("ext").unwrap().cpu.is_none());
        assert!(level.cpu_ratio("fast", "slow").is_finite());

        let lock = Arc::new(tokio::sync::Mutex::new(()));
        let calls = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counter = {
            let calls = calls.clone();
            Counter::new("calls", 0, move || {
                let calls = calls.clone();
                async move { Ok(calls.load(Ordering::Relaxed)) }
            })
        };
        let c = Contender::new("mutex", counter, move |_key| {
            let (lock, calls) = (lock.clone(), calls.clone());
            async move {
                calls.fetch_add(1, Ordering::Relaxed);
                let guard = lock.lock_owned().await;
                Ok(release(move || async move {
                    drop(guard);
                    Ok(())
                }))
            }
        });
        let stats = contended(&[c], &plan).await;
        let s = &stats[0];
        assert_eq!(s.errors.count, 0, "{:?}", s.errors.first);
        assert!(s.turns > 0);
        assert!(s.utilisation() > 0.1 && s.utilisation() <= 1.0);
        assert_eq!(s.calls_per_acquisition(), Some(1.0));
        assert!(s.handoff_p50().is_some());
        let text = Section {
            name: "t",
            title: "t".into(),
            levels: vec![level],
            contended: stats,
            ..Section::default()
        };
        assert!(text.print().contains("mutex"));
        assert!(text.to_json().to_string().starts_with('{'));
    }
}
