//! `leasehold run`: hold a lease while a command runs.
//!
//! The command runs in its own process group. `leasehold run` reaps it itself
//! (`waitpid` with `WUNTRACED | WCONTINUED`, woken by SIGCHLD), so it sees the command stop
//! as well as exit; it is a child subreaper, so the orphans of the command's group come
//! back to it; and it releases the lease only once no process of that group is left. A
//! [guard process](crate::guard) kills the group if `leasehold run` dies or is frozen past
//! the lease's validity deadline.

use std::ffi::OsString;
use std::fs::File;
use std::os::unix::process::CommandExt;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;
use leasehold::{HoldEnd, Lease, LeaseClient, LeaseConfig, LostReason, LostSignal};
use nix::errno::Errno;
use nix::sys::signal::{SigSet, Signal, kill, killpg};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, getpgrp, getpid, getppid, getsid, tcgetpgrp, tcsetpgrp};
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::{Instant, sleep, sleep_until};

use crate::admin::connect;
use crate::failure::Failure;
use crate::guard::Guard;
use crate::health::HealthFile;
use crate::run_json::Facts;
use crate::{exit, parse_grace, parse_max_hold, parse_ttl, parse_wait};

pub(crate) const HELP: &str = "\
The command runs in its own process group with LEASEHOLD_KEY, LEASEHOLD_FENCE,
LEASEHOLD_OWNER and LEASEHOLD_VALID_UNTIL (Unix ms, at start) in its environment; pass
LEASEHOLD_FENCE with every write so the storage can reject a stale holder.
LEASEHOLD_HEALTH_FILE names a file of one line that follows the lease's health: `held`;
`at_risk <validity deadline, Unix ms>` from a failed renewal until one is confirmed (the
lease is still held: finish the unit of work in hand, start no new one); `lost
<reason>` once lost (the command is then stopped as below). --at-risk-signal SIG sends
SIG to the command's group at each change between held and at risk. With
--permits N, LEASEHOLD_KEY is the permit's slot lease (KEY#SLOT: guard writes with it,
the fence is per slot) and LEASEHOLD_PERMIT_SLOT its number.

`leasehold run --key NAME` is also a campaigner of the election NAME: while the command
runs, `leasehold leader NAME` shows it as the leader (with no value).

Right before the command starts, the lease is looked at again: a lease lost by then (or
with less than --grace left) never gets a command started (exit 72). While it runs the
lease is renewed. When the lease is lost (the store no longer lists this owner, renewals
failed, --max-hold was reached), or the store has not confirmed it with less than --grace
of validity left, the command's process group gets SIGTERM, and SIGKILL when --grace runs
out or at the latest at the lease's validity deadline (at once if leasehold only sees the
loss after that deadline, e.g. after it was frozen). SIGINT, SIGTERM, SIGHUP, SIGQUIT and
SIGTSTP sent to leasehold are passed on to the group (after a SIGTSTP that does not come
from its terminal, leasehold then stops too, alone, until it is sent SIGCONT). The lease is released once the command and every
process left in its group are gone (they get SIGKILL when the command exits), never
before; if they cannot be confirmed gone, the lease is left to expire in the store. A
command whose end leasehold sees only after the lease was lost or its validity deadline
passed (leasehold was frozen, stopped or starved meanwhile) may have run on without the
lease: that is exit 71, never the command's own status.

In a terminal, leasehold behaves like a shell running a job: when it is in the
foreground it hands the terminal to the command's group, so the command can read it and
Ctrl-C, Ctrl-\\ and Ctrl-Z reach the command. Ctrl-Z stops the command, then leasehold and
its process group, so the shell sees the job stopped; the lease is NOT renewed while the
job is stopped. On fg, leasehold checks the lease first: if it was lost or its validity
deadline passed, the command is killed and leasehold exits 70; otherwise the command gets
the terminal back and continues. Not in the foreground of a terminal: the terminal is
left alone, and a command that reaches for it stays stopped until the job is brought to
the foreground. A command stopped any other way (kill -STOP, a debugger, a container
pause, a cgroup freezer) stops nothing else: leasehold goes on renewing the lease, and
its caller (a script, the script's other processes) goes on running; the command stays
stopped until whatever stopped it continues it.

A guard process (leasehold itself, in its own session) watches the command: if leasehold
is killed, the command's whole process group is killed at once; if leasehold is frozen or
stopped, the group is killed at the lease's validity deadline, before the lease can expire
in the store. It waits for that deadline on CLOCK_BOOTTIME, which counts a host suspend.
If leasehold and its guard are both frozen, nothing on this host can stop the command:
the fence (LEASEHOLD_FENCE) is what keeps its writes safe then.

Exit status: the command's own (128+N if killed by signal N), or
  64  bad usage (flags, key, durations; a bad store URL: scheme, host, port or
      parameters; memory://; an unusable --store-password-file; a --grace that is not
      below half the TTL the store granted)
  69  store error (unreachable, refused credentials, no such database, no privilege, an
      unusable SQLite file, missing tables, no answer)
  70  lease lost while the command ran (it was stopped)
  71  the command ended, but leasehold saw its end only after the lease was lost or its
      validity deadline passed: it may have run on without the lease; check its work
      (with --json, \"command_exit_code\" is its own status)
  72  the lease was lost (or had less than --grace left) before the command could
      start; it was not started
  75  not acquired: held by another owner past --wait, or at once with --no-wait
      (change with --conflict-exit-code, like flock -E)
  126 the command (or its guard process) could not be started
A status of leasehold's own comes with one line on standard error. The command's status
can be any of these too: with --json, \"outcome\" tells them apart (\"completed\": the
command's own).

Examples:
  leasehold run --key nightly-invoices -- ./invoices.sh
  leasehold run --key report --ttl 30s --wait 10m --max-hold 2h -- python report.py
  leasehold run --key once --no-wait --conflict-exit-code 0 -- ./only-one-may-run.sh
  leasehold run --key exports --permits 3 -- ./export.sh   # at most 3 at a time";

/// How long leasehold waits, after the last SIGKILL, for every process of the command's
/// group to be gone; past it, the lease is left to expire instead of being released.
const GROUP_GONE_TIMEOUT: Duration = Duration::from_secs(10);

/// Arguments of `leasehold run`.
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// The lease key (the name of the protected resource).
    #[arg(long, short)]
    key: String,
    /// Lease TTL: how long the lease outlives a crashed holder.
    #[arg(long, default_value = "10s", value_parser = parse_ttl)]
    ttl: Duration,
    /// How long to wait for a held lease (0 to 365d; 0 tries once).
    #[arg(long, default_value = "30s", value_parser = parse_wait, conflicts_with = "no_wait")]
    wait: Duration,
    /// Fail at once if the lease is held.
    #[arg(long)]
    no_wait: bool,
    /// Run at most N copies across all machines (1 to 1024): take one of the N permits of
    /// the semaphore KEY (slot leases KEY#0 … KEY#<N-1>) instead of the lease KEY. Every
    /// caller of one KEY must give the same N.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    permits: Option<u32>,
    /// Stop the command after this long, however healthy the lease (bounded renewal; up to
    /// 365d).
    #[arg(long, value_parser = parse_max_hold)]
    max_hold: Option<Duration>,
    /// Time between SIGTERM and SIGKILL (default: TTL/5; below TTL/2), never past the
    /// lease's validity deadline. The command also gets SIGTERM when the store has not
    /// confirmed the lease with this much validity left. The TTL is the one the store
    /// granted, which can be less than --ttl (ZooKeeper: at most its session timeout).
    #[arg(long, value_parser = parse_grace)]
    grace: Option<Duration>,
    /// Send this signal (e.g. USR1) to the command's process group each time the lease
    /// goes at risk (a renewal failed; it is still held until its deadline) and each time
    /// it is held again (a renewal was confirmed). LEASEHOLD_HEALTH_FILE says which.
    #[arg(long, value_parser = crate::health::parse_signal, value_name = "SIGNAL")]
    at_risk_signal: Option<Signal>,
    /// Keep the lease until this long after it was granted, even when the command ends
    /// sooner (ShedLock's lockAtLeastFor), so that a copy on another machine whose timer
    /// fires a little later does not run the job again. Where the store can keep a lease
    /// for a set time (Redis not through Sentinel, PostgreSQL and MariaDB/MySQL lease
    /// tables, SQLite) leasehold sets it and exits at once; elsewhere (etcd, ZooKeeper,
    /// advisory locks, GET_LOCK, Redlock, Sentinel) it stays, holding the lease, until
    /// then, and says so.
    #[arg(long, value_parser = parse_max_hold, value_name = "DURATION")]
    hold_at_least: Option<Duration>,
    /// Exit status when the lease is not acquired (default 75).
    #[arg(long, default_value_t = exit::NOT_ACQUIRED)]
    conflict_exit_code: u8,
    /// When done, print one line of JSON on standard output, after the command's own
    /// output: {"key","outcome","exit_code","command_exit_code","fence","owner","held_ms",
    /// "released","left_until_ms","error"}.
    #[arg(long)]
    json: bool,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

/// A failure before `run` could start (the store URL or the password file): with
/// `--json`, its object is printed all the same, so a script always finds one.
pub(crate) fn failed_early(args: &RunArgs, failure: Failure) -> Failure {
    if !args.json {
        return failure;
    }
    let result: Result<u8, Failure> = Err(failure);
    Facts::new(&args.key).print(&result);
    match result {
        Err(failure) => failure,
        Ok(_) => unreachable!("made as an error"),
    }
}

pub(crate) async fn run(url: &str, args: RunArgs) -> Result<ExitCode, Failure> {
    let mut facts = Facts::new(&args.key);
    // Before the --json object is printed, which carries the error too.
    let result = hold(url, &args, &mut facts)
        .await
        .map_err(|f| crate::migrate::explain_missing_schema(url, f));
    if args.json {
        facts.print(&result);
    }
    result.map(ExitCode::from)
}

/// Acquires the lease, runs the command under it, releases it: the command's status.
async fn hold(url: &str, args: &RunArgs, facts: &mut Facts) -> Result<u8, Failure> {
    let mut builder = LeaseConfig::builder(args.ttl);
    if let Some(max_hold) = args.max_hold {
        builder = builder.max_hold(max_hold);
    }
    let config = builder
        .build()
        .map_err(|e| Failure::Usage(format!("invalid lease settings: {e}")))?;
    // Checked against the asked TTL first, to fail before connecting; the store may grant
    // less, so it is checked again against the granted TTL once acquired.
    grace_for(args.grace, args.ttl, args.ttl).map_err(Failure::Usage)?;
    let key =
        leasehold::Key::new(&args.key).map_err(|e| Failure::Usage(format!("invalid key: {e}")))?;
    let store = connect(url).await?;
    let client = LeaseClient::new(store, config);
    let mut slot = None;
    let acquired = match args.permits {
        None if args.no_wait => client.try_acquire(&key).await,
        None => client.acquire(&key, args.wait).await,
        Some(permits) => {
            let semaphore = client
                .semaphore(&key, permits)
                .map_err(|e| Failure::Usage(e.to_string()))?;
            let wait = if args.no_wait {
                Duration::ZERO
            } else {
                args.wait
            };
            semaphore.acquire(wait).await.map(|permit| {
                slot = Some(permit.slot());
                permit.into_lease()
            })
        }
    };
    let lease = acquired.map_err(|e| Failure::from_lease(e, args.conflict_exit_code))?;
    let lease = crate::kind::checked(&client, lease, args.permits).await?;
    tracing::info!(%key, fence = lease.fence().get(), owner = %lease.owner(), ttl = ?lease.ttl(), "lease acquired");
    facts.acquired(lease.fence().get(), lease.owner().to_hex());
    let grace = match grace_for(args.grace, args.ttl, lease.ttl()) {
        Ok(g) => g,
        Err(e) => {
            // The command never started: the lease goes back at once.
            let released = lease.release().await.unwrap_or(false);
            facts.ended(released);
            return Err(Failure::Usage(e));
        }
    };
    let outcome = supervise(&lease, slot, args, grace).await;
    if !outcome.group_gone {
        // Releasing (or dropping, which releases) could let the next holder in while a
        // process of the command may still act: leave the lease to expire in the store.
        lease.abandon();
        facts.ended(false);
        return outcome.status;
    }
    let released = match args.hold_at_least {
        Some(min) => end_after(lease, min, facts).await,
        None => match lease.release().await {
            Ok(true) => {
                tracing::info!(%key, "lease released");
                true
            }
            Ok(false) => {
                tracing::warn!(%key, "lease was no longer held at release");
                false
            }
            Err(e) => {
                tracing::warn!(%key, error = %e, "release failed; the lease expires after its TTL");
                false
            }
        },
    };
    facts.ended(released);
    outcome.status
}

/// `--hold-at-least`: ends the hold, but not before `min` after the grant. Returns whether
/// the lease was released (not when it is left in the store to expire).
async fn end_after(lease: Lease, min: Duration, facts: &mut Facts) -> bool {
    let key = lease.key().clone();
    if let Some(left) = lease.held_in_process_for(min) {
        tracing::warn!(
            %key,
            left_ms = left.as_millis() as u64,
            "--hold-at-least: this store keeps no lease after its holder stops renewing it, so leasehold stays, holding the lease, until the minimum hold has passed"
        );
    }
    match lease.release_after(min).await {
        Ok(HoldEnd::Released) => {
            tracing::info!(%key, "lease released");
            true
        }
        Ok(HoldEnd::LeftToExpire { until }) => {
            facts.left_until(unix_ms_at(until));
            tracing::info!(%key, left_ms = until.saturating_duration_since(Instant::now()).as_millis() as u64, "lease left in the store until --hold-at-least has passed");
            false
        }
        Ok(_) => {
            tracing::warn!(%key, "lease was no longer held at release");
            false
        }
        Err(e) => {
            tracing::warn!(%key, error = %e, "the lease could not be kept for --hold-at-least; it expires after its TTL");
            false
        }
    }
}

/// The grace period: `--grace`, or a fifth of the TTL the store granted (which may be less
/// than the TTL asked: ZooKeeper grants at most its session timeout); it must be below half
/// of the granted TTL, or the command would be told to stop as soon as it started.
fn grace_for(
    grace: Option<Duration>,
    asked: Duration,
    granted: Duration,
) -> Result<Duration, String> {
    let Some(grace) = grace else {
        return Ok(granted / 5);
    };
    if grace < granted / 2 {
        Ok(grace)
    } else if granted == asked {
        Err(format!(
            "--grace {grace:?} must be below half the TTL ({asked:?})"
        ))
    } else {
        Err(format!(
            "--grace {grace:?} must be below half the TTL the store granted: it granted \
             {granted:?} of the {asked:?} asked with --ttl; lower --grace below {:?}, or use \
             a store (or store settings, e.g. ZooKeeper's session_timeout) that grants the \
             TTL asked",
            granted / 2
        ))
    }
}

fn unix_ms_at(deadline: Instant) -> u128 {
    #[allow(clippy::disallowed_methods)] // LEASEHOLD_VALID_UNTIL: a display, not a deadline
    let now_wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    (now_wall + deadline.saturating_duration_since(Instant::now())).as_millis()
}

/// Blocks SIGTTOU, before the runtime starts so that every thread inherits it: leasehold
/// can then take the terminal back from the command's group (`tcsetpgrp`) and write to it
/// from the background, as a shell does. The command starts with an empty signal mask
/// (the standard library resets it).
pub(crate) fn block_sigttou() {
    let mut set = SigSet::empty();
    set.add(Signal::SIGTTOU);
    let _ = set.thread_block();
}

/// What leasehold has to do with the command.
struct Outcome {
    /// The command's exit status to pass on, or why leasehold failed.
    status: Result<u8, Failure>,
    /// Whether no process of the command's group is left, so the lease may be released.
    group_gone: bool,
}

/// Runs the command and watches the lease.
async fn supervise(lease: &Lease, slot: Option<u32>, args: &RunArgs, grace: Duration) -> Outcome {
    let Some((program, rest)) = args.command.split_first() else {
        return Outcome {
            status: Err(Failure::Usage("no command given".into())),
            group_gone: true,
        };
    };
    let mut cmd = std::process::Command::new(program);
    cmd.args(rest)
        .process_group(0)
        .env("LEASEHOLD_KEY", lease.key().as_str())
        .env("LEASEHOLD_FENCE", lease.fence().to_string())
        .env("LEASEHOLD_OWNER", lease.owner().to_hex())
        .env(
            "LEASEHOLD_VALID_UNTIL",
            unix_ms_at(lease.valid_until()).to_string(),
        );
    if let Some(slot) = slot {
        cmd.env("LEASEHOLD_PERMIT_SLOT", slot.to_string());
    }
    let mut health = match HealthFile::create(args.at_risk_signal) {
        Ok(h) => h,
        Err(e) => {
            return Outcome {
                status: Err(Failure::CannotExecute(format!(
                    "cannot make the health file ({e}); the command was not started"
                ))),
                group_gone: true,
            };
        }
    };
    cmd.env("LEASEHOLD_HEALTH_FILE", health.path());
    let mut changes = lease.health_changes();
    // Handlers first, so that no SIGCHLD and no signal to pass on is missed.
    let mut signals = match Signals::install() {
        Ok(s) => s,
        Err(e) => {
            return Outcome {
                status: Err(Failure::Internal(format!(
                    "cannot install signal handlers: {e}"
                ))),
                group_gone: true,
            };
        }
    };
    // Orphans of the command's group come back to us, to be reaped (and waited for).
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        tracing::warn!(error = %e, "cannot become a child subreaper");
    }
    let mut guard = match Guard::start() {
        Ok(g) => g,
        Err(e) => {
            return Outcome {
                status: Err(Failure::CannotExecute(format!(
                    "cannot start the guard process ({e}); the command was not started"
                ))),
                group_gone: true,
            };
        }
    };
    // Starting the guard can take seconds (and leasehold may have been frozen meanwhile):
    // the lease is looked at again right before the command starts.
    if let Err(failure) = check_before_start(lease, grace) {
        guard.done();
        return Outcome {
            status: Err(failure),
            group_gone: true,
        };
    }
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            guard.done();
            return Outcome {
                status: Err(Failure::CannotExecute(format!(
                    "cannot run {}: {e}",
                    program.to_string_lossy()
                ))),
                group_gone: true,
            };
        }
    };
    // The command leads its own group. Its `Child` is dropped: we reap it with waitpid.
    let pgid = Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
    drop(child);
    guard.watch(pgid);
    let mut deadline_sent = lease.valid_until();
    guard.deadline(lease);
    let terminal = Terminal::open();
    if let Some(t) = &terminal {
        t.hand_to(pgid);
    }
    let mut job = Job {
        pgid,
        guard: guard.pid(),
        lost: lease.lost(),
        end: None,
        lost_when_ended: None,
        stopped: None,
        new_stop: false,
    };
    let lost = lease.lost();
    let poll_every = (lease.ttl() / 20).clamp(Duration::from_millis(5), Duration::from_millis(100));
    let mut stopping: Option<Stopping> = None;
    let mut forwarded_tstp = false;
    loop {
        job.reap();
        if job.end.is_some() {
            break;
        }
        if let Some(sig) = job.take_new_stop() {
            let forwarded = sig == Signal::SIGTSTP && std::mem::take(&mut forwarded_tstp);
            let action =
                what_to_do_with_a_stop(sig, stopping.is_some(), forwarded, terminal.as_ref(), pgid);
            tracing::debug!(?sig, ?action, "the command stopped");
            let stop_target = match action {
                StopAction::Continue => {
                    tracing::debug!(?sig, "continuing the stopped command");
                    job.signal(Signal::SIGCONT);
                    continue;
                }
                StopAction::LeaveStopped => {
                    tracing::info!(
                        signal = ?sig,
                        "the command was stopped from outside (not by this job's terminal); it stays stopped until something continues it, and the lease is still renewed meanwhile"
                    );
                    continue;
                }
                StopAction::WaitForTerminal => {
                    tracing::info!(
                        signal = ?sig,
                        "the command reached for the terminal from the background; it stays stopped until this job is in the foreground"
                    );
                    continue;
                }
                // A job-control stop (Ctrl-Z while this job is in the terminal's
                // foreground): our whole process group stops too (the rest of a pipeline, a
                // calling script), as the terminal would have stopped it, so that the shell
                // sees the job stopped.
                StopAction::StopTheJob => Pid::from_raw(-getpgrp().as_raw()),
                StopAction::StopLeasehold => getpid(),
            };
            // The lease is not renewed meanwhile; the guard still kills the command at the
            // validity deadline.
            if let Some(t) = &terminal {
                t.take_back(pgid);
            }
            // We stop with it, in the call or just after; the SIGCONT that ends the stop
            // (fg, bg, kill -CONT) is what we wait for.
            signals.drain_sigcont();
            if kill(stop_target, Signal::SIGSTOP).is_ok() {
                let _ = signals.cont.recv().await;
            }
            job.reap();
            if job.end.is_some() {
                break;
            }
            if let Some(why) = why_stop(lease, grace) {
                stopping = begin_stop(&mut job, lease, grace, &why);
                continue;
            }
            // fg gave us the terminal: the command gets it before it continues.
            if let Some(t) = &terminal {
                t.hand_to(pgid);
            }
            job.signal(Signal::SIGCONT);
            continue;
        }
        // A job started in the background and brought to the foreground since: the
        // command gets the terminal, and continues if it stopped reaching for it.
        if terminal.as_ref().is_some_and(|t| t.hand_to(pgid))
            && matches!(job.stopped, Some(Signal::SIGTTIN | Signal::SIGTTOU))
        {
            job.signal(Signal::SIGCONT);
        }
        if lease.valid_until() != deadline_sent && guard.deadline(lease) {
            deadline_sent = lease.valid_until();
        }
        if let Some(sig) = health.update(lease, unix_ms_at)
            && stopping.is_none()
        {
            job.signal(sig);
        }
        if stopping.is_none()
            && let Some(why) = why_stop(lease, grace)
        {
            stopping = begin_stop(&mut job, lease, grace, &why);
            continue;
        }
        let stop_at = lease
            .valid_until()
            .checked_sub(grace)
            .unwrap_or_else(Instant::now);
        let kill_at = stopping.as_ref().filter(|s| !s.killed).map(|s| s.kill_at);
        tokio::select! {
            _ = signals.child.recv() => {}
            _ = changes.next(), if stopping.is_none() => {}
            reason = lost.wait(), if stopping.is_none() => {
                stopping = begin_stop(&mut job, lease, grace, &StopWhy::Lost(describe_loss(reason)));
            }
            () = sleep_until(stop_at), if stopping.is_none() => {}
            () = sleep_until(kill_at.unwrap_or_else(Instant::now)), if kill_at.is_some() => {
                tracing::warn!("the command did not stop within the grace period; killing it");
                job.signal(Signal::SIGKILL);
                if let Some(s) = &mut stopping {
                    s.killed = true;
                }
            }
            () = sleep(poll_every) => {}
            _ = signals.int.recv() => job.signal(Signal::SIGINT),
            _ = signals.term.recv() => job.signal(Signal::SIGTERM),
            _ = signals.hup.recv() => job.signal(Signal::SIGHUP),
            _ = signals.quit.recv() => job.signal(Signal::SIGQUIT),
            _ = signals.tstp.recv() => {
                forwarded_tstp = true;
                job.signal(Signal::SIGTSTP);
            }
        }
    }
    // Whatever the command left in its group goes too, and the lease stays until all of it
    // is gone.
    job.signal(Signal::SIGKILL);
    let group_gone = job.wait_gone(&mut signals.child).await;
    if let Some(t) = &terminal {
        t.take_back(pgid);
    }
    if group_gone {
        guard.done();
    } else {
        // Dropping the guard's pipe makes it kill the group once more as we exit.
        tracing::warn!(
            "processes of the command's group are still there after SIGKILL; the lease is left to expire in the store"
        );
    }
    let end = job.end.unwrap_or(End::Signal(Signal::SIGKILL));
    Outcome {
        status: verdict(end, job.lost_when_ended, stopping),
        group_gone,
    }
}

/// Refuses to start the command under a lease that is lost, past its validity deadline,
/// or with less than `grace` of validity left (it would be told to stop at once).
fn check_before_start(lease: &Lease, grace: Duration) -> Result<(), Failure> {
    match why_stop(lease, grace) {
        Some(why) => Err(Failure::LostBeforeStart(why.to_string())),
        None => Ok(()),
    }
}

/// What `run` reports once the command has ended: `end` is how it ended, `lost` how the
/// lease had been lost when that end was seen (`None`: still valid then), `stopping`
/// whether leasehold was stopping it.
fn verdict(end: End, lost: Option<LostReason>, stopping: Option<Stopping>) -> Result<u8, Failure> {
    match (stopping, lost) {
        (Some(s), _) => Err(Failure::LeaseLost(s.why.detail())),
        // The guard kills the group with SIGKILL at the deadline while leasehold is
        // stopped or frozen.
        (None, Some(_)) if end == End::Signal(Signal::SIGKILL) => Err(Failure::LeaseLost(
            "its validity deadline passed while leasehold was stopped or frozen; \
             the guard process killed the command"
                .into(),
        )),
        // It ended on its own, but leasehold saw that only after the lease was lost: it may
        // have ended before the loss, or run on without the lease. Nobody can vouch for it.
        (None, Some(reason)) => Err(Failure::CompletedAfterLoss {
            status: end.code(),
            why: describe_loss(reason),
        }),
        (None, None) => Ok(end.code()),
    }
}

/// A lost reason, as `run` words it.
fn describe_loss(reason: LostReason) -> String {
    match reason {
        LostReason::Expired => "its validity deadline passed without a renewal".to_owned(),
        other => other.to_string(),
    }
}

/// What to do when the command stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StopAction {
    /// Continue it at once.
    Continue,
    /// Stop this job (leasehold's own process group) as the terminal would have.
    StopTheJob,
    /// Stop leasehold itself (only its own process), which was sent SIGTSTP.
    StopLeasehold,
    /// Leave it stopped: whoever stopped it continues it.
    LeaveStopped,
    /// Leave it stopped until this job is in the terminal's foreground.
    WaitForTerminal,
}

/// Terminal job control acts only on the terminal's stop signals (SIGTSTP, SIGTTIN,
/// SIGTTOU), and only while this job (leasehold's process group, or the command's group it
/// handed the terminal to) is the terminal's foreground group. Any other stop — SIGSTOP
/// from a debugger, a container pause, a cgroup freezer, a SIGTSTP sent to the command from
/// outside the terminal — stops nothing else: leasehold's process group may be a whole
/// script and its other background processes, not a job anyone would continue.
/// `forwarded_tstp`: leasehold passed on a SIGTSTP it was sent itself.
fn what_to_do_with_a_stop(
    sig: Signal,
    stopping: bool,
    forwarded_tstp: bool,
    terminal: Option<&Terminal>,
    pgid: Pid,
) -> StopAction {
    if stopping {
        // Being stopped for good: it must run to act on SIGTERM.
        return StopAction::Continue;
    }
    let in_front = || {
        terminal
            .and_then(Terminal::foreground)
            .is_some_and(|fg| fg == getpgrp() || fg == pgid)
    };
    match sig {
        Signal::SIGTTIN | Signal::SIGTTOU if terminal.is_some() => {
            if terminal.is_some_and(|t| t.hand_to(pgid)) || in_front() {
                // It reached for the terminal just before it was handed over.
                StopAction::Continue
            } else {
                StopAction::WaitForTerminal
            }
        }
        Signal::SIGTSTP if in_front() => {
            if job_control_above() {
                StopAction::StopTheJob
            } else {
                // Nothing above us could ever continue a stopped job: let it run.
                StopAction::Continue
            }
        }
        // `kill -TSTP` of leasehold itself, passed on: the command stopped, and so does
        // leasehold (only leasehold), until it is sent SIGCONT.
        Signal::SIGTSTP if forwarded_tstp => StopAction::StopLeasehold,
        _ => StopAction::LeaveStopped,
    }
}

/// The signals leasehold handles while the command runs.
struct Signals {
    child: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
    tstp: tokio::signal::unix::Signal,
    cont: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> std::io::Result<Self> {
        Ok(Self {
            child: signal(SignalKind::child())?,
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
            quit: signal(SignalKind::quit())?,
            tstp: signal(SignalKind::from_raw(Signal::SIGTSTP as i32))?,
            cont: signal(SignalKind::from_raw(Signal::SIGCONT as i32))?,
        })
    }

    /// Forgets the SIGCONTs received so far.
    fn drain_sigcont(&mut self) {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        while let std::task::Poll::Ready(Some(())) = self.cont.poll_recv(&mut cx) {}
    }
}

/// How the command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Code(i32),
    Signal(Signal),
}

impl End {
    fn code(self) -> u8 {
        match self {
            Self::Code(c) => u8::try_from(c & 0xff).unwrap_or(u8::MAX),
            Self::Signal(s) => 128u8.saturating_add(u8::try_from(s as i32).unwrap_or(u8::MAX)),
        }
    }
}

/// Stopping the command because the lease is lost (or about to be).
struct Stopping {
    /// Why the command is being stopped.
    why: StopWhy,
    /// When SIGKILL follows SIGTERM.
    kill_at: Instant,
    /// Whether SIGKILL was sent.
    killed: bool,
}

/// Why the command must stop. Kept apart from its wording so that a message that says
/// "lease lost" itself ([`Failure::LeaseLost`]) gets the bare reason, never
/// "lease lost (lease lost (…))".
#[derive(Debug, Clone, PartialEq, Eq)]
enum StopWhy {
    /// The lease is lost; how, as [`describe_loss`] words it.
    Lost(String),
    /// Still valid, but unconfirmed with no more than the grace left.
    Unconfirmed(Duration),
}

impl StopWhy {
    /// The reason alone, for a message that already says the lease was lost.
    fn detail(&self) -> String {
        match self {
            Self::Lost(reason) => reason.clone(),
            Self::Unconfirmed(_) => self.to_string(),
        }
    }
}

impl std::fmt::Display for StopWhy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Lost(reason) => write!(f, "lease lost ({reason})"),
            Self::Unconfirmed(grace) => write!(
                f,
                "the store has not confirmed the lease with {grace:?} left"
            ),
        }
    }
}

/// Why the command must stop now, if it must.
fn why_stop(lease: &Lease, grace: Duration) -> Option<StopWhy> {
    if let Some(reason) = lease.lost_reason() {
        return Some(StopWhy::Lost(describe_loss(reason)));
    }
    let left = lease.remaining();
    if left.is_zero() {
        Some(StopWhy::Lost(describe_loss(LostReason::Expired)))
    } else if left <= grace {
        Some(StopWhy::Unconfirmed(grace))
    } else {
        None
    }
}

/// SIGTERM now and SIGKILL after the grace, never past the validity deadline; SIGKILL at
/// once when that deadline has passed already (or there is no grace). Nothing if the
/// command has ended already (reaped first, so that an end that was there to be seen is
/// reported as an end, not as a stop).
fn begin_stop(job: &mut Job, lease: &Lease, grace: Duration, why: &StopWhy) -> Option<Stopping> {
    job.reap();
    if job.end.is_some() {
        return None;
    }
    let now = Instant::now();
    let deadline = lease.valid_until();
    if deadline <= now || grace.is_zero() {
        tracing::warn!("{why}; killing the command");
        job.signal(Signal::SIGKILL);
        Some(Stopping {
            why: why.clone(),
            kill_at: now,
            killed: true,
        })
    } else {
        tracing::warn!("{why}; stopping the command");
        job.signal(Signal::SIGTERM);
        // A stopped process acts on SIGTERM only once continued.
        job.signal(Signal::SIGCONT);
        Some(Stopping {
            why: why.clone(),
            kill_at: deadline.min(now + grace),
            killed: false,
        })
    }
}

/// Whether something above us (a job-control shell) could see our job stop and continue
/// it: our parent is in our session. Not so for a session leader, or once our shell is
/// gone (the parent is then init or a subreaper elsewhere): a stopped job would stay
/// stopped.
fn job_control_above() -> bool {
    getsid(Some(getppid())).ok() == getsid(None).ok()
}

/// The command's process group, and what became of its leader.
struct Job {
    pgid: Pid,
    guard: Pid,
    /// The lease's lost signal, read when the command's end is seen.
    lost: LostSignal,
    end: Option<End>,
    /// How the lease had been lost when the command's end was seen (`None`: it was still
    /// valid then, so the command ended under the lease).
    lost_when_ended: Option<LostReason>,
    /// The signal that stopped the command, while it is stopped.
    stopped: Option<Signal>,
    /// A stop not yet handled.
    new_stop: bool,
}

impl Job {
    /// The signal of a stop not handled yet.
    fn take_new_stop(&mut self) -> Option<Signal> {
        if std::mem::take(&mut self.new_stop) {
            self.stopped
        } else {
            None
        }
    }

    /// Records the command's end, and whether the lease was still valid when it was seen
    /// (read after `waitpid` reported it: the end came before this look at the clock).
    fn ended(&mut self, end: End) {
        self.end = Some(end);
        self.lost_when_ended = self.lost.reason();
    }

    fn signal(&self, sig: Signal) {
        if let Err(e) = killpg(self.pgid, sig) {
            tracing::debug!(?sig, error = %e, "signal to the command's process group");
        }
    }

    /// Reaps every child that changed state: the command (exit, stop, continue), the
    /// guard, and orphans of the command's group (we are their subreaper).
    fn reap(&mut self) {
        let flags = WaitPidFlag::WNOHANG | WaitPidFlag::WUNTRACED | WaitPidFlag::WCONTINUED;
        loop {
            match waitpid(None, Some(flags)) {
                Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return,
                Err(Errno::EINTR) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "waitpid");
                    return;
                }
                Ok(WaitStatus::Exited(pid, code)) if pid == self.pgid => {
                    self.ended(End::Code(code));
                }
                Ok(WaitStatus::Signaled(pid, sig, _)) if pid == self.pgid => {
                    self.ended(End::Signal(sig));
                }
                Ok(WaitStatus::Stopped(pid, sig)) if pid == self.pgid => {
                    self.stopped = Some(sig);
                    self.new_stop = true;
                }
                Ok(WaitStatus::Continued(pid)) if pid == self.pgid => {
                    self.stopped = None;
                    self.new_stop = false;
                }
                Ok(WaitStatus::Exited(pid, _) | WaitStatus::Signaled(pid, _, _))
                    if pid == self.guard =>
                {
                    tracing::warn!(
                        "the guard process is gone; if leasehold dies now, its command may run on until the fence stops it"
                    );
                }
                Ok(_) => {}
            }
        }
    }

    /// Waits (bounded) until no process of the group is left, reaping what comes back to
    /// us. A zombie still counts: it is gone once reaped.
    async fn wait_gone(&mut self, sigchld: &mut tokio::signal::unix::Signal) -> bool {
        let until = Instant::now() + GROUP_GONE_TIMEOUT;
        loop {
            self.reap();
            if killpg(self.pgid, None) == Err(Errno::ESRCH) {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            tokio::select! {
                _ = sigchld.recv() => {}
                () = sleep(Duration::from_millis(10)) => {}
            }
        }
    }
}

/// Our controlling terminal, if we have one.
struct Terminal(File);

impl Terminal {
    fn open() -> Option<Self> {
        File::options()
            .read(true)
            .write(true)
            .open("/dev/tty")
            .ok()
            .map(Self)
    }

    fn foreground(&self) -> Option<Pid> {
        tcgetpgrp(&self.0).ok()
    }

    /// When our own group is in the terminal's foreground (a shell ran us there, or `fg`),
    /// hands the terminal to the command's group, as a shell does with a job.
    fn hand_to(&self, pgid: Pid) -> bool {
        self.foreground() == Some(getpgrp()) && tcsetpgrp(&self.0, pgid).is_ok()
    }

    /// Takes the terminal back from the command's group, if it has it.
    fn take_back(&self, pgid: Pid) {
        if self.foreground() == Some(pgid) {
            let _ = tcsetpgrp(&self.0, getpgrp());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use leasehold::clock::ManualClock;
    use leasehold::memory::MemoryStore;

    use super::*;

    const S: Duration = Duration::from_secs(1);

    /// A client on the in-memory store whose lease clock a test can move as a host suspend
    /// (or a freeze of `run`) would, with no timer firing.
    fn client(ttl: Duration) -> (LeaseClient, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::new());
        let config = LeaseConfig::builder(ttl)
            .watchdog_thread(false)
            .build()
            .unwrap();
        let client = LeaseClient::builder(Arc::new(MemoryStore::new()), config)
            .clock(clock.clone())
            .build();
        (client, clock)
    }

    #[test]
    fn grace_is_a_fifth_of_the_granted_ttl_and_must_fit_below_half_of_it() {
        let ms = Duration::from_millis;
        // Default: a fifth of what the store granted, not of what was asked.
        assert_eq!(grace_for(None, 30 * S, 30 * S), Ok(6 * S));
        assert_eq!(grace_for(None, 30 * S, 4 * S), Ok(ms(800)));
        assert_eq!(grace_for(Some(S), 30 * S, 4 * S), Ok(S));
        assert_eq!(
            grace_for(Some(Duration::ZERO), 30 * S, 4 * S),
            Ok(Duration::ZERO)
        );
        // Too long for the TTL asked.
        let e = grace_for(Some(15 * S), 30 * S, 30 * S).unwrap_err();
        assert!(e.contains("--grace 15s") && e.contains("30s"), "{e}");
        // Fits the TTL asked, not the one granted: both named.
        let e = grace_for(Some(2 * S), 30 * S, 4 * S).unwrap_err();
        assert!(
            e.contains("--grace 2s") && e.contains("granted 4s") && e.contains("30s asked"),
            "{e}"
        );
    }

    /// Item 7: `Guard::start` can take seconds, and `run` can be frozen meanwhile: a lease
    /// lost by then — or with less than the grace left — never gets a command started.
    #[tokio::test(start_paused = true)]
    async fn no_command_starts_under_a_lease_lost_while_the_guard_started() {
        let (client, clock) = client(10 * S);
        let grace = 2 * S;
        let lease = client.try_acquire("job:late-start").await.unwrap();
        assert!(check_before_start(&lease, grace).is_ok());
        // Renewed on paused time: still fine much later.
        tokio::time::sleep(25 * S).await;
        assert!(check_before_start(&lease, grace).is_ok());
        // Less than the grace left (frozen for most of the validity window).
        clock.suspend(lease.remaining() - S);
        let e = check_before_start(&lease, grace).unwrap_err();
        assert_eq!(e.code(), exit::LOST_BEFORE_START, "{e}");
        assert!(e.to_string().contains("not started"), "{e}");
        // Past the deadline: lost.
        clock.suspend(2 * S);
        assert!(!lease.is_valid());
        let e = check_before_start(&lease, grace).unwrap_err();
        assert_eq!(e.code(), exit::LOST_BEFORE_START, "{e}");
        assert!(e.to_string().contains("lease lost"), "{e}");
    }

    /// Item 8 on paused time: a command whose end is seen while the lease is valid passes
    /// its status through; seen after the deadline, it is `completed_after_loss` (71), with
    /// the command's status kept; a SIGKILL seen after the deadline is the guard's (70);
    /// a command leasehold was stopping is `lease_lost` (70).
    #[tokio::test(start_paused = true)]
    async fn an_end_seen_after_the_deadline_is_completed_after_loss() {
        let (client, clock) = client(3 * S);
        let lease = client.try_acquire("job:late-end").await.unwrap();
        let lost = lease.lost();
        tokio::time::sleep(10 * S).await;
        assert!(lease.is_valid(), "renewed on paused time");
        assert_eq!(verdict(End::Code(3), lost.reason(), None).unwrap(), 3);
        // Frozen (or suspended) past the deadline: no timer fired, the clock moved.
        clock.suspend(4 * S);
        let seen = lost.reason();
        assert_eq!(seen, Some(LostReason::Expired));
        let e = verdict(End::Code(3), seen, None).unwrap_err();
        assert_eq!(e.code(), exit::COMPLETED_AFTER_LOSS, "{e}");
        assert!(
            matches!(e, Failure::CompletedAfterLoss { status: 3, .. }),
            "{e:?}"
        );
        assert!(e.to_string().contains("check its work"), "{e}");
        let e = verdict(End::Signal(Signal::SIGTERM), seen, None).unwrap_err();
        assert!(
            matches!(e, Failure::CompletedAfterLoss { status: 143, .. }),
            "{e:?}"
        );
        let e = verdict(End::Signal(Signal::SIGKILL), seen, None).unwrap_err();
        assert_eq!(e.code(), exit::LEASE_LOST, "{e}");
        let stopping = Stopping {
            why: StopWhy::Lost(describe_loss(LostReason::NotOwner)),
            kill_at: Instant::now(),
            killed: false,
        };
        let e = verdict(End::Code(0), None, Some(stopping)).unwrap_err();
        assert_eq!(e.code(), exit::LEASE_LOST, "{e}");
        // Said once: "lease lost while the command ran (the store no longer lists …)".
        assert_eq!(e.to_string().matches("lease lost").count(), 1, "{e}");
        assert!(e.to_string().contains("no longer lists"), "{e}");
    }

    /// Issue 27 item 5: no message says the same words twice ("lease lost (lease lost
    /// (…))"), whichever way the lease was lost and whichever failure reports it.
    #[test]
    fn no_message_stutters() {
        let mut whys: Vec<StopWhy> = [
            LostReason::NotOwner,
            LostReason::RenewFailed { attempts: 3 },
            LostReason::Expired,
            LostReason::MaxHoldExceeded,
            LostReason::StoreUnavailable,
            LostReason::Shutdown,
            LostReason::SessionEnded,
        ]
        .into_iter()
        .map(|r| StopWhy::Lost(describe_loss(r)))
        .collect();
        whys.push(StopWhy::Unconfirmed(2 * S));
        for why in whys {
            let stopped = verdict(
                End::Code(0),
                None,
                Some(Stopping {
                    why: why.clone(),
                    kill_at: Instant::now(),
                    killed: false,
                }),
            )
            .unwrap_err()
            .to_string();
            let before = Failure::LostBeforeStart(why.to_string()).to_string();
            for message in [stopped, before, format!("{why}; stopping the command")] {
                assert!(
                    message.matches("lease lost").count() <= 1
                        && !message.contains("lost (lost")
                        && !message.contains("((")
                        && !message.contains("))"),
                    "{message}"
                );
            }
        }
        for reason in [LostReason::Expired, LostReason::NotOwner] {
            let after = verdict(End::Code(0), Some(reason), None)
                .unwrap_err()
                .to_string();
            assert_eq!(after.matches("lost").count(), 1, "{after}");
        }
    }

    /// Item 10: without this job in a terminal's foreground, a stop of the command stops
    /// nothing else; a SIGTSTP leasehold itself was sent and passed on stops leasehold alone.
    #[test]
    fn a_stop_from_outside_stops_nothing_else() {
        let pgid = Pid::from_raw(i32::MAX);
        for sig in [
            Signal::SIGSTOP,
            Signal::SIGTSTP,
            Signal::SIGTTIN,
            Signal::SIGTTOU,
        ] {
            assert_eq!(
                what_to_do_with_a_stop(sig, false, false, None, pgid),
                StopAction::LeaveStopped,
                "{sig:?}"
            );
            assert_eq!(
                what_to_do_with_a_stop(sig, true, false, None, pgid),
                StopAction::Continue,
                "{sig:?} while it is being stopped for good"
            );
        }
        assert_eq!(
            what_to_do_with_a_stop(Signal::SIGTSTP, false, true, None, pgid),
            StopAction::StopLeasehold
        );
        assert_eq!(
            what_to_do_with_a_stop(Signal::SIGSTOP, false, true, None, pgid),
            StopAction::LeaveStopped
        );
    }
}
