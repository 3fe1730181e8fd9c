//! `leasehold run`: hold a lease while a command runs.

use std::ffi::OsString;
use std::process::{ExitCode, ExitStatus};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;
use leasehold::{Error, Lease, LeaseClient, LeaseConfig};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::{Instant, sleep_until};

use crate::admin::{connect, store_failure};
use crate::{exit, fail, parse_grace, parse_max_hold, parse_ttl, parse_wait};

pub(crate) const HELP: &str = "\
The command runs in its own process group with LEASEHOLD_KEY, LEASEHOLD_FENCE,
LEASEHOLD_OWNER and LEASEHOLD_VALID_UNTIL (Unix ms, at start) in its environment; pass
LEASEHOLD_FENCE with every write so the storage can reject a stale holder.

While it runs the lease is renewed. When the lease is lost, or the store cannot confirm it
with less than --grace of validity left, the command gets SIGTERM at once and SIGKILL when
the grace runs out, before the lease can expire in the store. SIGINT, SIGTERM and SIGHUP
are forwarded to it. The lease is released when it exits.

Exit status: the command's own (128+N if killed by signal N), or
  64  bad usage (flags, key, durations, a store URL that cannot be opened as given:
      scheme, host, port, parameters or credentials)
  69  store error (unreachable, authentication, permissions)
  70  lease lost while the command ran (it was stopped)
  75  not acquired: held by another owner past --wait, or at once with --no-wait
      (change with --conflict-exit-code, like flock -E)
  126 the command could not be started

Examples:
  leasehold run --key nightly-invoices -- ./invoices.sh
  leasehold run --key report --ttl 30s --wait 10m --max-hold 2h -- python report.py
  leasehold run --key once --no-wait --conflict-exit-code 0 -- ./only-one-may-run.sh";

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
    /// Stop the command after this long, however healthy the lease (bounded renewal; up to
    /// 365d).
    #[arg(long, value_parser = parse_max_hold)]
    max_hold: Option<Duration>,
    /// Time between SIGTERM and SIGKILL (default: TTL/5). Must be below TTL/2.
    #[arg(long, value_parser = parse_grace)]
    grace: Option<Duration>,
    /// Exit status when the lease is not acquired (default 75).
    #[arg(long, default_value_t = exit::NOT_ACQUIRED)]
    conflict_exit_code: u8,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

fn unix_ms_at(deadline: Instant) -> u128 {
    let now_wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    (now_wall + deadline.saturating_duration_since(Instant::now())).as_millis()
}

fn status_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(sig)) => 128u8.saturating_add(sig as u8),
        _ => exit::STORE,
    }
}

fn signal_group(pgid: Pid, sig: Signal) {
    if let Err(e) = killpg(pgid, sig) {
        tracing::debug!(?sig, error = %e, "signal to the command's process group");
    }
}

pub(crate) async fn run(url: &str, args: RunArgs) -> ExitCode {
    let mut builder = LeaseConfig::builder(args.ttl);
    if let Some(max_hold) = args.max_hold {
        builder = builder.max_hold(max_hold);
    }
    let config = match builder.build() {
        Ok(c) => c,
        Err(e) => return fail(exit::USAGE, format_args!("invalid lease settings: {e}")),
    };
    let grace = args.grace.unwrap_or(args.ttl / 5);
    if grace >= args.ttl / 2 {
        return fail(
            exit::USAGE,
            format_args!("--grace {grace:?} must be below half the TTL"),
        );
    }
    let key = match leasehold::Key::new(&args.key) {
        Ok(k) => k,
        Err(e) => return fail(exit::USAGE, format_args!("invalid key: {e}")),
    };
    let store = match connect(url).await {
        Ok(s) => s,
        Err(code) => return code,
    };
    let client = LeaseClient::new(store, config);
    let acquired = if args.no_wait {
        client.try_acquire(&key).await
    } else {
        client.acquire(&key, args.wait).await
    };
    let lease = match acquired {
        Ok(lease) => lease,
        Err(e @ (Error::Contended { .. } | Error::WaitTimeout { .. })) => {
            return fail(args.conflict_exit_code, e);
        }
        Err(Error::Store(e)) => return store_failure(&e),
        Err(e) => return fail(exit::STORE, e),
    };
    tracing::info!(%key, fence = lease.fence().get(), owner = %lease.owner(), "lease acquired");
    let code = supervise(&lease, &args, grace).await;
    match lease.release().await {
        Ok(true) => tracing::info!(%key, "lease released"),
        Ok(false) => tracing::warn!(%key, "lease was no longer held at release"),
        Err(e) => {
            tracing::warn!(%key, error = %e, "release failed; the lease expires after its TTL")
        }
    }
    ExitCode::from(code)
}

/// Runs the command and watches the lease; returns the exit status to report.
async fn supervise(lease: &Lease, args: &RunArgs, grace: Duration) -> u8 {
    let (program, rest) = args.command.split_first().expect("clap requires a command");
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(rest)
        .process_group(0)
        .env("LEASEHOLD_KEY", lease.key().as_str())
        .env("LEASEHOLD_FENCE", lease.fence().to_string())
        .env("LEASEHOLD_OWNER", lease.owner().to_hex())
        .env(
            "LEASEHOLD_VALID_UNTIL",
            unix_ms_at(lease.valid_until()).to_string(),
        );
    // Handlers first, so a signal that arrives as soon as the command starts is forwarded.
    let (Ok(mut sigint), Ok(mut sigterm), Ok(mut sighup)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        eprintln!("leasehold: cannot install signal handlers");
        return exit::STORE;
    };
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("leasehold: cannot run {}: {e}", program.to_string_lossy());
            return exit::CANNOT_EXECUTE;
        }
    };
    let pgid = Pid::from_raw(child.id().map(|id| id as i32).unwrap_or(0));
    let lost = lease.lost();
    // Once stopping: when to send SIGKILL.
    let mut kill_at: Option<Instant> = None;
    let mut killed = false;
    let mut stopped_for: Option<String> = None;
    let status = loop {
        let stop_at = lease
            .valid_until()
            .checked_sub(grace)
            .unwrap_or_else(Instant::now);
        tokio::select! {
            status = child.wait() => break status,
            reason = lost.wait(), if stopped_for.is_none() => {
                eprintln!("leasehold: lease lost ({reason}); stopping the command");
                signal_group(pgid, Signal::SIGTERM);
                // Kill by the validity deadline if there is still time, else after grace.
                let now = Instant::now();
                let deadline = lease.valid_until();
                kill_at = Some(if deadline > now { deadline.min(now + grace) } else { now + grace });
                stopped_for = Some(reason.to_string());
            }
            () = sleep_until(stop_at), if stopped_for.is_none() => {
                if lease.remaining() <= grace && lease.lost_reason().is_none() {
                    eprintln!("leasehold: the store has not confirmed the lease with {grace:?} left; stopping the command");
                    signal_group(pgid, Signal::SIGTERM);
                    kill_at = Some(lease.valid_until());
                    stopped_for = Some("unconfirmed".into());
                }
            }
            () = sleep_until(kill_at.unwrap_or_else(Instant::now)), if kill_at.is_some() && !killed => {
                eprintln!("leasehold: the command did not stop within the grace period; killing it");
                signal_group(pgid, Signal::SIGKILL);
                killed = true;
            }
            _ = sigint.recv() => signal_group(pgid, Signal::SIGINT),
            _ = sigterm.recv() => signal_group(pgid, Signal::SIGTERM),
            _ = sighup.recv() => signal_group(pgid, Signal::SIGHUP),
        }
    };
    // Anything the command left in its group goes too.
    signal_group(pgid, Signal::SIGKILL);
    match status {
        Ok(_) if stopped_for.is_some() => exit::LEASE_LOST,
        Ok(status) => status_code(status),
        Err(e) => {
            eprintln!("leasehold: lost track of the command: {e}");
            exit::STORE
        }
    }
}
