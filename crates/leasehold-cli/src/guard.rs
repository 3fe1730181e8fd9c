//! The guard: a tiny process that kills the command's process group when `leasehold run`
//! can no longer do it itself (killed, frozen, stopped).
//!
//! `leasehold run` starts it (this same binary, first argument [`SUBCOMMAND`]) before
//! the command, in its own session, with its standard input reading a pipe whose write end
//! only `leasehold run` holds (close-on-exec, so the command does not inherit it). Over
//! that pipe come lines:
//!
//! - `pgid N`: the process group to guard;
//! - `deadline NS`: the lease's validity deadline, as absolute `CLOCK_BOOTTIME`
//!   nanoseconds (a clock that also counts time the host spent suspended), sent after the
//!   start and whenever a renewal moves it;
//! - `done`: the group is gone; exit.
//!
//! The guard sends SIGKILL to the group when the last deadline passes without a newer one
//! (the supervisor is frozen, stopped or too slow to renew), and at once when the pipe
//! reaches its end without `done` (the supervisor died). It needs no runtime: one `poll`
//! loop, which waits for the deadline on a `CLOCK_BOOTTIME` timer set at the absolute
//! deadline, so a host suspend counts against it (the lease's own clock, see
//! `leasehold::clock`, counts the same time) and it fires at the resume if the deadline
//! passed meanwhile. If the guard and `leasehold run` are both frozen, nothing on this
//! host stops the command: the fence is the protection then.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsFd;
use std::process::{Child, ChildStdout, Command, ExitCode, Stdio};
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, Signal, killpg};
use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{
    ClockId as TimerClock, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags,
};
use nix::time::{ClockId, clock_gettime};
use nix::unistd::Pid;

/// The first argument that makes `leasehold` the guard (checked before the command line
/// is parsed, so no help or completion lists it).
pub(crate) const SUBCOMMAND: &str = "__guard";

/// How long `leasehold run` waits for a new guard to say it is ready.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// `CLOCK_BOOTTIME` now, in nanoseconds (`CLOCK_MONOTONIC` if that is missing).
pub(crate) fn boottime_ns() -> i128 {
    clock_gettime(ClockId::CLOCK_BOOTTIME)
        .or_else(|_| clock_gettime(ClockId::CLOCK_MONOTONIC))
        .map(|t| i128::from(t.tv_sec()) * 1_000_000_000 + i128::from(t.tv_nsec()))
        .unwrap_or(0)
}

/// `leasehold run`'s handle on its guard.
#[derive(Debug)]
pub(crate) struct Guard {
    child: Child,
    pipe: std::io::PipeWriter,
    /// Whether a message could not be written (the guard is gone or not reading).
    warned: bool,
}

impl Guard {
    /// Starts the guard and waits until it is in place (its own session, terminal signals
    /// blocked).
    pub(crate) fn start() -> Result<Self, String> {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find leasehold: {e}"))?;
        let (reader, writer) = std::io::pipe().map_err(|e| format!("cannot make a pipe: {e}"))?;
        // A guard that stops reading must never block leasehold: writes fail instead.
        fcntl(&writer, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))
            .map_err(|e| format!("cannot make the pipe non-blocking: {e}"))?;
        let mut child = Command::new(exe)
            .arg(SUBCOMMAND)
            .stdin(Stdio::from(reader))
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start it: {e}"))?;
        let ready = child
            .stdout
            .take()
            .ok_or_else(|| "no pipe from it".to_owned())
            .and_then(wait_ready);
        if let Err(e) = ready {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
        Ok(Self {
            child,
            pipe: writer,
            warned: false,
        })
    }

    /// The guard's process id.
    pub(crate) fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).unwrap_or(i32::MAX))
    }

    /// Sends one line. Lines are far below `PIPE_BUF`, so a write is all or nothing.
    fn send(&mut self, line: &str) -> bool {
        match nix::unistd::write(self.pipe.as_fd(), line.as_bytes()) {
            Ok(n) if n == line.len() => true,
            res => {
                if !self.warned {
                    self.warned = true;
                    let why = res
                        .err()
                        .map_or("short write".to_owned(), |e| e.to_string());
                    tracing::warn!(error = %why, "cannot reach the guard process; if leasehold dies now, its command may run on until the fence stops it");
                }
                false
            }
        }
    }

    /// The process group to kill.
    pub(crate) fn watch(&mut self, pgid: Pid) -> bool {
        self.send(&format!("pgid {pgid}\n"))
    }

    /// The lease's validity deadline, as `CLOCK_BOOTTIME`.
    ///
    /// The clock is read *before* the lease's time left (on the lease's clock, which
    /// counts suspended time too): if leasehold is frozen or the host suspended between
    /// the two reads, the deadline sent comes out early by that much, never late.
    pub(crate) fn deadline(&mut self, lease: &leasehold::Lease) -> bool {
        let now = boottime_ns();
        let remaining = lease.remaining();
        let at = now.saturating_add(i128::try_from(remaining.as_nanos()).unwrap_or(i128::MAX));
        self.send(&format!("deadline {at}\n"))
    }

    /// The group is gone: the guard may exit. Waits a little for it to do so.
    pub(crate) fn done(mut self) {
        self.send("done\n");
        drop(self.pipe);
        for _ in 0..100 {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Waits (bounded) for the guard's "ready" line.
fn wait_ready(out: ChildStdout) -> Result<(), String> {
    let mut fds = [PollFd::new(out.as_fd(), PollFlags::POLLIN)];
    let timeout = PollTimeout::try_from(READY_TIMEOUT).unwrap_or(PollTimeout::MAX);
    match poll(&mut fds, timeout) {
        Ok(0) => return Err("it did not answer".to_owned()),
        Ok(_) => {}
        Err(e) => return Err(format!("cannot wait for it: {e}")),
    }
    let mut line = String::new();
    BufReader::new(out)
        .read_line(&mut line)
        .map_err(|e| format!("cannot read from it: {e}"))?;
    if line.trim_end() == "ready" {
        Ok(())
    } else {
        Err("it exited before it was ready".to_owned())
    }
}

/// The guard process's main.
pub(crate) fn main() -> ExitCode {
    // Terminal and job-control signals must not stop or kill it; after `setsid` no
    // terminal sends it any, and blocking covers the moments before.
    let mut blocked = SigSet::empty();
    for sig in [
        Signal::SIGHUP,
        Signal::SIGINT,
        Signal::SIGQUIT,
        Signal::SIGTSTP,
        Signal::SIGTTIN,
        Signal::SIGTTOU,
    ] {
        blocked.add(sig);
    }
    let _ = blocked.thread_block();
    let _ = nix::unistd::setsid();
    let _ = std::env::set_current_dir("/");
    {
        let mut out = std::io::stdout().lock();
        if writeln!(out, "ready").and_then(|()| out.flush()).is_err() {
            return ExitCode::FAILURE;
        }
    }
    watch(std::io::stdin().as_fd());
    ExitCode::SUCCESS
}

/// The guard's alarm: a timer on `CLOCK_BOOTTIME` set at the absolute deadline. The
/// kernel counts time the host spent suspended against it and fires it at the resume if
/// the deadline passed meanwhile, whereas a `poll` timeout runs on `CLOCK_MONOTONIC`,
/// which stops during a suspend.
struct Alarm(TimerFd);

impl Alarm {
    /// `None` where the kernel has no `CLOCK_BOOTTIME` timers (before Linux 3.15): the
    /// guard then re-reads the clock at least every [`FALLBACK_RECHECK_MS`].
    fn new() -> Option<Self> {
        TimerFd::new(
            TimerClock::CLOCK_BOOTTIME,
            TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
        )
        .ok()
        .map(Self)
    }

    /// Fires at `at` (absolute `CLOCK_BOOTTIME` nanoseconds). Whether it is set.
    fn set(&self, at: i128) -> bool {
        let at = at.max(1);
        let secs = i64::try_from(at / 1_000_000_000).unwrap_or(i64::MAX);
        let nanos = i64::try_from(at % 1_000_000_000).unwrap_or(0);
        self.0
            .set(
                Expiration::OneShot(TimeSpec::new(secs, nanos)),
                TimerSetTimeFlags::TFD_TIMER_ABSTIME,
            )
            .is_ok()
    }

    fn unset(&self) {
        let _ = self.0.unset();
    }

    /// Reads the expirations, if any (the timer is non-blocking).
    fn drain(&self) {
        let _ = nix::unistd::read(self.0.as_fd(), &mut [0u8; 8]);
    }
}

/// Without a [`Alarm`], the longest the guard waits before it reads the clock again: a
/// suspend can delay the kill by up to this much.
const FALLBACK_RECHECK_MS: i128 = 1_000;

/// The guard's loop, until `done` or the end of its input.
fn watch(input: std::os::fd::BorrowedFd<'_>) {
    let alarm = Alarm::new();
    let mut pgid: Option<Pid> = None;
    let mut deadline: Option<i128> = None;
    let mut killed = false;
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = [0u8; 512];
    let kill = |pgid: Option<Pid>| {
        if let Some(g) = pgid {
            let _ = killpg(g, Signal::SIGKILL);
        }
    };
    loop {
        let mut timeout = PollTimeout::NONE;
        if let (Some(_), Some(at), false) = (pgid, deadline, killed) {
            let left = at - boottime_ns();
            if left <= 0 {
                kill(pgid);
                killed = true;
                if let Some(a) = &alarm {
                    a.unset();
                }
                continue;
            }
            if !alarm.as_ref().is_some_and(|a| a.set(at)) {
                // Round up, so as never to wake before the deadline.
                let ms = ((left + 999_999) / 1_000_000).min(FALLBACK_RECHECK_MS);
                timeout = PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX);
            }
        }
        let mut fds = vec![PollFd::new(input, PollFlags::POLLIN)];
        if let Some(a) = &alarm {
            fds.push(PollFd::new(a.0.as_fd(), PollFlags::POLLIN));
        }
        match poll(&mut fds, timeout) {
            Ok(0) | Err(Errno::EINTR) => continue,
            Ok(_) => {}
            Err(_) => {
                // Cannot watch any more: fail closed.
                if !killed {
                    kill(pgid);
                }
                return;
            }
        }
        let input_ready = fds[0].any().unwrap_or(true);
        if let Some(a) = &alarm {
            a.drain();
        }
        if !input_ready {
            // The alarm: the loop's top compares the deadline with the clock.
            continue;
        }
        let n = match nix::unistd::read(input, &mut buf) {
            Ok(n) => n,
            Err(Errno::EINTR | Errno::EAGAIN) => continue,
            Err(_) => 0,
        };
        if n == 0 {
            // leasehold is gone without saying done: its command must not run on.
            if !killed {
                kill(pgid);
            }
            return;
        }
        pending.extend_from_slice(&buf[..n]);
        while let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let mut words = line.split_whitespace();
            match (words.next(), words.next().map(str::parse::<i128>)) {
                (Some("done"), _) => return,
                (Some("pgid"), Some(Ok(g))) if g > 1 => {
                    pgid = i32::try_from(g).ok().map(Pid::from_raw);
                }
                (Some("deadline"), Some(Ok(at))) => deadline = Some(at),
                _ => {}
            }
        }
    }
}
