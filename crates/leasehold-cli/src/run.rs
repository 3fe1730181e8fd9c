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
use leasehold::{Lease, LeaseClient, LeaseConfig};
use nix::errno::Errno;
use nix::sys::signal::{SigSet, Signal, killpg};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, getpgrp, getppid, getsid, tcgetpgrp, tcsetpgrp};
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::{Instant, sleep, sleep_until};

use crate::admin::connect;
use crate::failure::Failure;
use crate::guard::Guard;
use crate::run_json::Facts;
use crate::{exit, parse_grace, parse_max_hold, parse_ttl, parse_wait};

pub(crate) const HELP: &str = "\
The command runs in its own process group with LEASEHOLD_KEY, LEASEHOLD_FENCE,
LEASEHOLD_OWNER and LEASEHOLD_VALID_UNTIL (Unix ms, at start) in its environment; pass
LEASEHOLD_FENCE with every write so the storage can reject a stale holder. With
--permits N, LEASEHOLD_KEY is the permit's slot lease (KEY#SLOT: guard writes with it,
the fence is per slot) and LEASEHOLD_PERMIT_SLOT its number.

`leasehold run --key NAME` is also a campaigner of the election NAME: while the command
runs, `leasehold leader NAME` shows it as the leader (with no value).

While it runs the lease is renewed. When the lease is lost (the store no longer lists
this owner, renewals failed, --max-hold was reached), or the store has not confirmed it
with less than --grace of validity left, the command's process group gets SIGTERM, and
SIGKILL when --grace runs out or at the latest at the lease's validity deadline (at once
if leasehold only sees the loss after that deadline, e.g. after it was frozen). SIGINT,
SIGTERM, SIGHUP, SIGQUIT and SIGTSTP sent to leasehold are passed on to the group. The
lease is released once the command and every process left in its group are gone (they get
SIGKILL when the command exits), never before; if they cannot be confirmed gone, the lease
is left to expire in the store.

In a terminal, leasehold behaves like a shell running a job: when it is in the
foreground it hands the terminal to the command's group, so the command can read it and
Ctrl-C, Ctrl-\\ and Ctrl-Z reach the command. Ctrl-Z stops the command, then leasehold and
its process group, so the shell sees the job stopped; the lease is NOT renewed while the
job is stopped. On fg, leasehold checks the lease first: if it was lost or its validity
deadline passed, the command is killed and leasehold exits 70; otherwise the command gets
the terminal back and continues. Not in the foreground of a terminal: the terminal is
left alone.

A guard process (leasehold itself, in its own session) watches the command: if leasehold
is killed, the command's whole process group is killed at once; if leasehold is frozen or
stopped, the group is killed at the lease's validity deadline, before the lease can expire
in the store. If leasehold and its guard are both frozen, nothing on this host can stop
the command: the fence (LEASEHOLD_FENCE) is what keeps its writes safe then.

Exit status: the command's own (128+N if killed by signal N), or
  64  bad usage (flags, key, durations, a store URL that cannot be opened as given:
      scheme, host, port, parameters or credentials; memory://)
  69  store error (unreachable, authentication, permissions)
  70  lease lost while the command ran (it was stopped)
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
    /// confirmed the lease with this much validity left.
    #[arg(long, value_parser = parse_grace)]
    grace: Option<Duration>,
    /// Exit status when the lease is not acquired (default 75).
    #[arg(long, default_value_t = exit::NOT_ACQUIRED)]
    conflict_exit_code: u8,
    /// When done, print one line of JSON on standard output, after the command's own
    /// output: {"key","outcome","exit_code","fence","owner","held_ms","released","error"}.
    #[arg(long)]
    json: bool,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<OsString>,
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
    let grace = args.grace.unwrap_or(args.ttl / 5);
    if grace >= args.ttl / 2 {
        return Err(Failure::Usage(format!(
            "--grace {grace:?} must be below half the TTL"
        )));
    }
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
    tracing::info!(%key, fence = lease.fence().get(), owner = %lease.owner(), "lease acquired");
    facts.acquired(lease.fence().get(), lease.owner().to_hex());
    let outcome = supervise(&lease, slot, args, grace).await;
    if !outcome.group_gone {
        // Releasing (or dropping, which releases) could let the next holder in while a
        // process of the command may still act: leave the lease to expire in the store.
        lease.abandon();
        facts.ended(false);
        return outcome.status;
    }
    let released = match lease.release().await {
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
    };
    facts.ended(released);
    outcome.status
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
    guard.deadline(lease.remaining());
    let terminal = Terminal::open();
    if let Some(t) = &terminal {
        t.hand_to(pgid);
    }
    let mut job = Job {
        pgid,
        guard: guard.pid(),
        end: None,
        stopped: None,
    };
    let lost = lease.lost();
    let poll_every = (lease.ttl() / 20).clamp(Duration::from_millis(5), Duration::from_millis(100));
    let mut stopping: Option<Stopping> = None;
    loop {
        job.reap();
        if job.end.is_some() {
            break;
        }
        if let Some(sig) = job.stopped.take() {
            let has_terminal = terminal
                .as_ref()
                .is_some_and(|t| t.hand_to(pgid) || t.foreground() == Some(pgid));
            let touched_terminal_early =
                matches!(sig, Signal::SIGTTIN | Signal::SIGTTOU) && has_terminal;
            if stopping.is_some() || touched_terminal_early || !job_control_above() {
                // It reached for the terminal just before it was handed over, or it is being
                // stopped for good, or nothing above us could ever continue a stopped job:
                // let it run.
                tracing::debug!(
                    ?sig,
                    touched_terminal_early,
                    "continuing the stopped command"
                );
                job.signal(Signal::SIGCONT);
                continue;
            }
            // A job-control stop (Ctrl-Z, or the terminal used from the background): our
            // whole process group stops too (the rest of a pipeline, a calling script), as
            // the terminal would have stopped it, so that the shell sees the job stopped.
            // The lease is not renewed meanwhile; the guard still kills the command at the
            // validity deadline.
            if let Some(t) = &terminal {
                t.take_back(pgid);
            }
            // We stop with it, in the call or just after; the SIGCONT that ends the stop
            // (fg, bg) is what we wait for.
            signals.drain_sigcont();
            if killpg(getpgrp(), Signal::SIGSTOP).is_ok() {
                let _ = signals.cont.recv().await;
            }
            job.reap();
            if job.end.is_some() {
                break;
            }
            if let Some(why) = why_stop(lease, grace) {
                stopping = Some(begin_stop(&job, lease, grace, &why));
                continue;
            }
            // fg gave us the terminal: the command gets it before it continues.
            if let Some(t) = &terminal {
                t.hand_to(pgid);
            }
            job.signal(Signal::SIGCONT);
            continue;
        }
        // A job started in the background and brought to the foreground since.
        if let Some(t) = &terminal {
            t.hand_to(pgid);
        }
        if lease.valid_until() != deadline_sent && guard.deadline(lease.remaining()) {
            deadline_sent = lease.valid_until();
        }
        if stopping.is_none()
            && let Some(why) = why_stop(lease, grace)
        {
            stopping = Some(begin_stop(&job, lease, grace, &why));
        }
        let stop_at = lease
            .valid_until()
            .checked_sub(grace)
            .unwrap_or_else(Instant::now);
        let kill_at = stopping.as_ref().filter(|s| !s.killed).map(|s| s.kill_at);
        tokio::select! {
            _ = signals.child.recv() => {}
            reason = lost.wait(), if stopping.is_none() => {
                stopping = Some(begin_stop(&job, lease, grace, &format!("lease lost ({reason})")));
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
            _ = signals.tstp.recv() => job.signal(Signal::SIGTSTP),
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
    let killed_by_guard =
        stopping.is_none() && end == End::Signal(Signal::SIGKILL) && !lease.is_valid();
    let status = match stopping {
        Some(s) => Err(Failure::LeaseLost(s.why)),
        None if killed_by_guard => Err(Failure::LeaseLost(
            "its validity deadline passed while leasehold was stopped or frozen; \
             the guard process killed the command"
                .into(),
        )),
        None => Ok(end.code()),
    };
    Outcome { status, group_gone }
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
    why: String,
    /// When SIGKILL follows SIGTERM.
    kill_at: Instant,
    /// Whether SIGKILL was sent.
    killed: bool,
}

/// Why the command must stop now, if it must.
fn why_stop(lease: &Lease, grace: Duration) -> Option<String> {
    if let Some(reason) = lease.lost_reason() {
        return Some(format!("lease lost ({reason})"));
    }
    let left = lease.remaining();
    if left.is_zero() {
        Some("lease lost (the validity deadline passed without a renewal)".to_owned())
    } else if left <= grace {
        Some(format!(
            "the store has not confirmed the lease with {grace:?} left"
        ))
    } else {
        None
    }
}

/// SIGTERM now and SIGKILL after the grace, never past the validity deadline; SIGKILL at
/// once when that deadline has passed already (or there is no grace).
fn begin_stop(job: &Job, lease: &Lease, grace: Duration, why: &str) -> Stopping {
    let now = Instant::now();
    let deadline = lease.valid_until();
    if deadline <= now || grace.is_zero() {
        tracing::warn!("{why}; killing the command");
        job.signal(Signal::SIGKILL);
        Stopping {
            why: why.to_owned(),
            kill_at: now,
            killed: true,
        }
    } else {
        tracing::warn!("{why}; stopping the command");
        job.signal(Signal::SIGTERM);
        // A stopped process acts on SIGTERM only once continued.
        job.signal(Signal::SIGCONT);
        Stopping {
            why: why.to_owned(),
            kill_at: deadline.min(now + grace),
            killed: false,
        }
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
    end: Option<End>,
    stopped: Option<Signal>,
}

impl Job {
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
                    self.end = Some(End::Code(code));
                }
                Ok(WaitStatus::Signaled(pid, sig, _)) if pid == self.pgid => {
                    self.end = Some(End::Signal(sig));
                }
                Ok(WaitStatus::Stopped(pid, sig)) if pid == self.pgid => self.stopped = Some(sig),
                Ok(WaitStatus::Continued(pid)) if pid == self.pgid => self.stopped = None,
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
