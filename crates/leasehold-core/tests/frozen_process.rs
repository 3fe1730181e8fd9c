//! Issue 10.3 with a real frozen process: a worker holds a lease, is stopped with SIGSTOP
//! past its validity deadline, and resumed with SIGCONT. Its first act on resume is to ask
//! `LostSignal::is_lost()`: the answer must be `true`.
//!
//! The worker keeps every background helper out of the way, so only the on-the-spot clock
//! check can give the right answer: the watchdog thread is off and the worker's (single
//! threaded) runtime is blocked by its own loop, so the renewal scheduler never runs.
//!
//! The worker is this same test binary, started again with an environment variable.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_core::memory::MemoryStore;
use leasehold_core::{LeaseClient, LeaseConfig};

const WORKER: &str = "LEASEHOLD_FROZEN_WORKER";
const TEST: &str = "a_frozen_worker_hears_lost_first_thing_on_resume";

/// The worker: acquire a 1 s lease, then every 5 ms print `tick <before ns> <after ns>
/// <is_lost>` (times since the worker started, read just before and just after asking),
/// for 4 s.
fn worker() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let cfg = LeaseConfig::builder(Duration::from_secs(1))
            .watchdog_thread(false)
            .build()
            .unwrap();
        let client = LeaseClient::new(Arc::new(MemoryStore::new()), cfg);
        let lease = client.try_acquire("job:frozen").await.unwrap();
        let lost = lease.lost();
        let t0 = Instant::now();
        println!("acquired");
        // Blocks the runtime on purpose: nothing async runs from here on.
        while t0.elapsed() < Duration::from_secs(4) {
            let before = t0.elapsed().as_nanos();
            let is_lost = lost.is_lost();
            let after = t0.elapsed().as_nanos();
            println!("tick {before} {after} {is_lost}");
            std::thread::sleep(Duration::from_millis(5));
        }
        std::mem::forget(lease);
    });
}

fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid}");
}

#[test]
fn a_frozen_worker_hears_lost_first_thing_on_resume() {
    if std::env::var_os(WORKER).is_some() {
        return worker();
    }
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(WORKER, "1")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let started = loop {
        let line = lines.next().expect("worker output").unwrap();
        if line.ends_with("acquired") {
            break Instant::now();
        }
    };
    let reader = std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<_>>());
    std::thread::sleep(Duration::from_millis(300));
    signal(pid, "-STOP");
    // Frozen for 2 s: well past the 0.985 s validity window.
    std::thread::sleep(Duration::from_secs(2));
    signal(pid, "-CONT");
    let status = child.wait().unwrap();
    assert!(status.success(), "worker failed: {status}");
    assert!(started.elapsed() >= Duration::from_secs(2));
    let ticks: Vec<(u128, u128, bool)> = reader
        .join()
        .unwrap()
        .iter()
        .filter_map(|l| {
            let mut f = l.strip_prefix("tick ")?.split(' ');
            Some((
                f.next()?.parse().ok()?,
                f.next()?.parse().ok()?,
                f.next()?.parse().ok()?,
            ))
        })
        .collect();
    let gap = Duration::from_secs(1).as_nanos();
    // The first tick whose question was asked entirely after the freeze: its `before`
    // is more than a second after the previous tick's `after`.
    let resumed = ticks
        .windows(2)
        .position(|w| w[1].0 > w[0].1 + gap)
        .map(|i| i + 1)
        .expect("no freeze seen in the ticks");
    assert!(
        ticks[..resumed - 1].iter().all(|t| !t.2),
        "lost before the freeze: {:?}",
        &ticks[..resumed]
    );
    assert!(
        ticks[resumed].2,
        "first question after resuming answered not lost: {:?}",
        &ticks[resumed.saturating_sub(2)..(resumed + 3).min(ticks.len())]
    );
    assert!(ticks[resumed..].iter().all(|t| t.2));
}
