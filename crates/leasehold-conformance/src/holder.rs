//! The holder process: a separate OS process that holds a lease, so that a case can
//! freeze it (`SIGSTOP`) or kill it (`kill -9`) on its own.
//!
//! The process is the test binary run again with only the test that spawns it selected
//! (libtest names a test's thread after the test) and the settings in the environment;
//! that test's first act is [`run_if_child`], which plays the holder instead of running
//! the test body. No test exists only to be a holder. It opens the store from the fixture's URL, says `READY`, waits for a
//! `go` file, acquires the lease through a [`LeaseClient`] (whose heartbeat renews it),
//! says `HELD <fence> <owner>`, then watches the lease (saying `LOST <reason>` if it is
//! lost) until a `done` file appears; it then says `STATUS …`, releases, and says
//! `RELEASED <held>`. Every line it says starts with `@lhc `. Each time a `probe` file
//! appears it removes it and says `PROBE valid=<bool> lost=<reason> wall=<unix s>`: the
//! lease as its holder sees it, and the holder's wall clock.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Fence, Key, LeaseClient, LeaseConfig, OwnerToken, Store};
use leasehold_testkit::WorkerProcess;
use tokio::time::{Instant, sleep};

/// The variable that makes a test act as the holder process.
pub const CHILD_ENV: &str = "LEASEHOLD_CONFORMANCE_HOLDER";

const URL_ENV: &str = "LEASEHOLD_CONFORMANCE_URL";
const KEY_ENV: &str = "LEASEHOLD_CONFORMANCE_KEY";
const TTL_ENV: &str = "LEASEHOLD_CONFORMANCE_TTL_MS";
const DIR_ENV: &str = "LEASEHOLD_CONFORMANCE_DIR";
const PREFIX: &str = "@lhc ";

fn say(line: impl std::fmt::Display) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{PREFIX}{line}");
    let _ = out.flush();
}

/// In a holder process (the variable [`CHILD_ENV`] is set): opens the store with `open`
/// from the fixture's URL, plays the holder until the test is done with it, and ends the
/// process. In a test process: returns `false` at once. The suites' generated tests call it first; a hand-written test that runs a case
/// needing a holder process must too.
pub async fn run_if_child<F, Fut>(open: F) -> bool
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = Arc<dyn Store>>,
{
    if std::env::var_os(CHILD_ENV).is_none() {
        return false;
    }
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    let url = var(URL_ENV);
    let key = Key::new(var(KEY_ENV)).expect("holder key");
    let ttl = Duration::from_millis(var(TTL_ENV).parse().expect("holder ttl"));
    let dir = PathBuf::from(var(DIR_ENV));
    let store = open(url).await;
    hold(store, key, ttl, &dir).await;
    // The holder's work is done: end the process here, whatever the test would do next.
    std::process::exit(0)
}

async fn hold(store: Arc<dyn Store>, key: Key, ttl: Duration, dir: &Path) {
    let client = LeaseClient::new(store.clone(), LeaseConfig::new(ttl).expect("holder ttl"));
    // Connect before the test starts the clock.
    if let Err(e) = store.inspect(&key).await {
        say(format!("ERROR inspect {e}"));
        return;
    }
    say("READY");
    while !dir.join("go").exists() {
        sleep(Duration::from_millis(2)).await;
    }
    let lease = match client.try_acquire(&key).await {
        Ok(lease) => lease,
        Err(e) => {
            say(format!("ERROR acquire {e}"));
            return;
        }
    };
    say(format!(
        "HELD {} {}",
        lease.fence().get(),
        lease.owner().to_hex()
    ));
    let mut lost_said = false;
    let probe = dir.join("probe");
    let answer_probe = || {
        if probe.exists() {
            let _ = std::fs::remove_file(&probe);
            say(format!(
                "PROBE valid={} lost={:?} wall={}",
                lease.is_valid(),
                lease.lost_reason(),
                wall_secs()
            ));
        }
    };
    loop {
        // A probe is answered before anything else the holder does when it runs again
        // (after a freeze: its first question).
        answer_probe();
        if !lost_said && let Some(reason) = lease.lost_reason() {
            // A freeze may have stopped the holder between the check above and this one
            // (the question was asked while it was frozen): the question still comes
            // first. The lease was lost during the freeze (it could not be before this
            // read), so this check runs after the resume and sees the question.
            answer_probe();
            say(format!("LOST {reason:?}"));
            lost_said = true;
        }
        if dir.join("done").exists() {
            break;
        }
        sleep(Duration::from_millis(10)).await;
    }
    say(format!(
        "STATUS valid={} lost={:?}",
        lease.is_valid(),
        lease.lost_reason()
    ));
    match lease.release().await {
        Ok(held) => say(format!("RELEASED {held}")),
        Err(e) => say(format!("ERROR release {e}")),
    }
}

/// The holder's wall clock, in whole seconds since 1970: the probe shows that a stepped
/// wall clock reached it.
#[allow(clippy::disallowed_methods)] // shows the (possibly faked) wall clock, decides nothing
pub(crate) fn wall_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// What a holder answered to a probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Probe {
    /// `Lease::is_valid`.
    pub(crate) valid: bool,
    /// `Lease::lost_reason`, as `Debug` (`None`, `Some(Expired)`).
    pub(crate) lost: String,
    /// The holder's wall clock, unix seconds.
    pub(crate) wall: i64,
}

/// The test side of a holder process. Dropping it kills the process.
pub(crate) struct Holder {
    worker: WorkerProcess,
    dir: tempfile::TempDir,
}

impl Holder {
    /// Starts a holder process for `key` with `ttl` on the store at `url`, and waits until
    /// it has connected.
    pub(crate) async fn spawn(url: &str, key: &Key, ttl: Duration) -> Self {
        Self::spawn_with(url, key, ttl, |_| {}).await
    }

    /// [`spawn`](Self::spawn), with `setup` applied to the holder's command first (to run
    /// it under a fake wall clock, say).
    pub(crate) async fn spawn_with(
        url: &str,
        key: &Key,
        ttl: Duration,
        setup: impl FnOnce(&mut Command),
    ) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("leasehold-conformance-holder-")
            .tempdir()
            .expect("temporary directory");
        // libtest runs each test on a thread named after it; the case runs on that thread
        // (the runtime's `block_on`), so this is the test to run again as the holder.
        let test = std::thread::current()
            .name()
            .filter(|n| *n != "main")
            .map(str::to_owned)
            .expect("a holder process is spawned from the test's own thread");
        let mut cmd = Command::new(std::env::current_exe().expect("the test binary"));
        cmd.args([
            test.as_str(),
            "--exact",
            // The test may be one of a suite marked `ignore` (a heavier tier).
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
            "-q",
        ])
        .env(CHILD_ENV, "1")
        .env(URL_ENV, url)
        .env(KEY_ENV, key.as_str())
        .env(TTL_ENV, ttl.as_millis().to_string())
        .env(DIR_ENV, dir.path());
        setup(&mut cmd);
        let holder = Self {
            worker: WorkerProcess::spawn(cmd),
            dir,
        };
        holder.expect_line("READY", Duration::from_secs(60)).await;
        holder
    }

    /// Waits for the line starting with `word`, failing on an `ERROR` line, an exit or
    /// after `within`. Returns the words after it.
    async fn expect_line(&self, word: &str, within: Duration) -> Vec<String> {
        let wanted = format!("{PREFIX}{word}");
        let error = format!("{PREFIX}ERROR");
        let found = tokio::task::block_in_place(|| {
            self.worker
                .wait_for_line(|l| l.contains(&wanted) || l.contains(&error), within)
        });
        match found {
            Some(line) if !line.contains(&error) => {
                let at = line.find(&wanted).expect("matched");
                line[at + wanted.len()..]
                    .split_whitespace()
                    .map(str::to_owned)
                    .collect()
            }
            other => panic!(
                "holder process: no `{word}` line within {within:?} (got {other:?}); its \
                 output: {:#?}. A fixture that declares other_processes must be run by \
                 a suite given `holder = open`, or its test must call run_if_child first.",
                self.worker.lines()
            ),
        }
    }

    /// Lets the holder acquire; returns a time just before it could send its acquire.
    pub(crate) fn go(&self) -> Instant {
        let at = Instant::now();
        std::fs::write(self.dir.path().join("go"), b"go").expect("write the go file");
        at
    }

    /// Waits until the holder holds the lease; its fence and owner.
    pub(crate) async fn held(&self) -> (Fence, OwnerToken) {
        let words = self.expect_line("HELD", Duration::from_secs(30)).await;
        let fence = Fence(words[0].parse().expect("fence"));
        let owner: OwnerToken = words[1].parse().expect("owner");
        (fence, owner)
    }

    /// Asks the holder how it sees its lease (a `probe` file), without waiting for the
    /// answer: a frozen holder answers when it runs again, before anything else.
    pub(crate) fn ask(&self) {
        let tmp = self.dir.path().join("probe.tmp");
        std::fs::write(&tmp, b"probe").expect("write the probe file");
        std::fs::rename(&tmp, self.dir.path().join("probe")).expect("place the probe file");
    }

    /// The answers to probes so far, in order.
    pub(crate) fn probes(&self) -> Vec<Probe> {
        self.lines()
            .iter()
            .filter_map(|l| l.strip_prefix("PROBE "))
            .map(|rest| {
                let field = |name: &str| {
                    rest.split(' ')
                        .find_map(|w| w.strip_prefix(name))
                        .unwrap_or_else(|| panic!("a probe answer without {name}: {rest}"))
                };
                Probe {
                    valid: field("valid=") == "true",
                    lost: field("lost=").to_owned(),
                    wall: field("wall=").parse().expect("wall seconds"),
                }
            })
            .collect()
    }

    /// Asks (as [`ask`](Self::ask)) and waits up to `within` for the answer.
    pub(crate) async fn probe(&self, within: Duration) -> Probe {
        let before = self.probes().len();
        self.ask();
        let deadline = Instant::now() + within;
        loop {
            if let Some(p) = self.probes().get(before) {
                return p.clone();
            }
            assert!(
                Instant::now() < deadline,
                "holder process: no answer to a probe within {within:?}: {:#?}",
                self.lines()
            );
            sleep(Duration::from_millis(10)).await;
        }
    }

    /// Every line the holder said so far, without the prefix.
    pub(crate) fn lines(&self) -> Vec<String> {
        self.worker
            .lines()
            .into_iter()
            .filter_map(|l| l.find(PREFIX).map(|at| l[at + PREFIX.len()..].to_owned()))
            .collect()
    }

    /// Freezes the holder (`SIGSTOP`); returns once it is stopped.
    pub(crate) fn pause(&self) {
        tokio::task::block_in_place(|| self.worker.pause());
    }

    /// Continues the holder (`SIGCONT`).
    pub(crate) fn resume(&self) {
        self.worker.resume();
    }

    /// Kills the holder with `SIGKILL` and waits for it.
    pub(crate) fn kill(&self) {
        tokio::task::block_in_place(|| self.worker.kill());
    }

    /// Tells the holder to stop; returns its `STATUS` words, its `RELEASED` word, and
    /// every line it said.
    pub(crate) async fn finish(&self) -> (Vec<String>, String, Vec<String>) {
        std::fs::write(self.dir.path().join("done"), b"done").expect("write the done file");
        let status = self.expect_line("STATUS", Duration::from_secs(30)).await;
        let released = self.expect_line("RELEASED", Duration::from_secs(30)).await;
        (status, released.join(" "), self.lines())
    }
}
